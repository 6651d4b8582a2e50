package window

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/buffer"
)

// BenchmarkStateBeforeCheckpoint reports the heap the state of load mode
// holds at its largest, right before a checkpoint: 10,000 devices × 2
// metrics reading every 10 s of event time, 1-minute windows, 10 minutes
// of lateness, and a checkpoint every 7 minutes of event time (load
// mode's 10 s between checkpoints at 40 times the clock), so that the
// windows emitted since the last one wait for the next.
func BenchmarkStateBeforeCheckpoint(b *testing.B) {
	const devices, rounds, checkpointEvery = 10_000, 120, 42
	cfg := benchConfig(b)
	cfg.MaxDevices = devices
	cfg.AllowedLateness = 10 * time.Minute
	cfg = cfg.withDefaults()
	recs := make([]buffer.Record, 0, devices*rounds)
	for r := range rounds {
		at := t0.Add(time.Duration(r) * 10 * time.Second)
		for d := range devices {
			recs = append(recs, msg(fmt.Sprintf("sensors/dev%05d/telemetry", d),
				fmt.Sprintf(`{"id":"%d","ts":%d,"m0":%d.5,"m1":%d}`, r, at.UnixMilli(), 20+r%7, 40+d%9), at))
		}
	}
	var held uint64
	var windows int
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		e := newEngine(&cfg)
		e.load = func(dev, metric string, start int64) (*window, error) {
			return nil, fmt.Errorf("no late data in this stream")
		}
		e.loadDedup = func(dev string, end int64) ([]uint64, error) {
			return nil, fmt.Errorf("no retries of old readings in this stream")
		}
		for j := range recs {
			e.process(&recs[j])
			if j%devices == devices-1 {
				e.resetOutputs()
				if (j/devices+1)%checkpointEvery == 0 {
					e.resetDelta()
				}
			}
		}
		e.x, e.due = nil, nil
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(e)
		held, windows = after.HeapAlloc-before.HeapAlloc, e.nWindows
	}
	b.ReportMetric(float64(held)/(1<<20), "heap-MB")
	b.ReportMetric(float64(windows), "windows")
}

// BenchmarkIdleCloseOutputs reports the heap a batch's outputs hold when
// 10,000 devices × 2 metrics go idle at once (the end of the rig's load
// mode), all in one clock advance here (the engine closes idleCloseMax
// windows an advance): each emission waits in the batch until the commit
// writes it.
func BenchmarkIdleCloseOutputs(b *testing.B) {
	const devices, rounds = 10_000, 3
	// The whole fleet in one clock advance, to measure an emission (the
	// engine closes idleCloseMax windows an advance).
	defer func(was int) { idleCloseMax = was }(idleCloseMax)
	idleCloseMax = devices * 2
	cfg := benchConfig(b)
	cfg.MaxDevices = devices
	cfg.IdleTimeout = 30 * time.Second
	cfg = cfg.withDefaults()
	recs := make([]buffer.Record, 0, devices*rounds+1)
	var last time.Time
	for r := range rounds {
		last = t0.Add(time.Duration(r) * 10 * time.Second)
		for d := range devices {
			recs = append(recs, msg(fmt.Sprintf("sensors/dev%05d/telemetry", d),
				fmt.Sprintf(`{"id":"%d","ts":%d,"m0":%d.5,"m1":%d}`, r, last.UnixMilli(), 20+r%7, 40+d%9), last))
		}
	}
	idle := tick(last.Add(cfg.IdleTimeout + time.Second))
	// Sequence numbers past the engine's replay point (0): outputs are
	// collected, as in a Step.
	for i := range recs {
		recs[i].Seq = uint64(i + 1)
	}
	idle.Seq = uint64(len(recs) + 1)
	var held uint64
	var emitted int
	for range b.N {
		e := newEngine(&cfg)
		for j := range recs {
			e.process(&recs[j])
		}
		e.resetOutputs()
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		e.process(&idle)
		runtime.GC()
		runtime.ReadMemStats(&after)
		held, emitted = after.HeapAlloc-before.HeapAlloc, len(e.out)
		runtime.KeepAlive(e)
	}
	if emitted < devices*2 {
		b.Fatalf("%d emissions, want at least %d", emitted, devices*2)
	}
	b.ReportMetric(float64(held)/(1<<20), "heap-MB")
	b.ReportMetric(float64(held)/float64(emitted), "B/emission")
	b.ReportMetric(float64(emitted), "emissions")
}

// idleBatches returns a function that runs batch round on one engine: a
// reading of metrics metrics from each of devices devices at round's
// time, then a clock tick past their idle timeout, which emits every
// window (one tick closes them all, not a portion).
func idleBatches(t *testing.T, devices, metrics int) func(round int) *engine {
	cfg := testConfig(t)
	cfg.MaxDevices = devices
	cfg.IdleTimeout = 30 * time.Second
	cfg = cfg.withDefaults()
	was := idleCloseMax
	t.Cleanup(func() { idleCloseMax = was })
	idleCloseMax = 4 * devices
	e := newEngine(&cfg)
	var seq uint64
	process := func(r buffer.Record) {
		seq++
		r.Seq = seq
		e.process(&r)
	}
	return func(round int) *engine {
		at := t0.Add(time.Duration(round) * time.Hour)
		for d := range devices {
			body := fmt.Sprintf(`{"id":"%d","ts":%d,"m0":1.5`, round, at.UnixMilli())
			if metrics > 1 {
				body += fmt.Sprintf(`,"m1":%d`, d%9)
			}
			process(msg(fmt.Sprintf("sensors/dev%05d/telemetry", d), body+"}", at))
		}
		process(tick(at.Add(cfg.IdleTimeout + time.Second)))
		return e
	}
}

// A batch whose emissions outgrew the kept array makes its successor's
// array at once, a quarter larger, instead of growing one by appends
// (which allocated three to four times the array per batch in load mode).
func TestBatchOutputsAreSizedFromTheLastBatch(t *testing.T) {
	batch := idleBatches(t, 1_000, 2)
	e := batch(0)
	n := len(e.out)
	if n <= keptOutputs {
		t.Fatalf("%d emissions in the first batch, want more than the %d an array keeps", n, keptOutputs)
	}
	e.resetOutputs()
	if e.out != nil {
		t.Fatalf("an array of %d emissions was kept past the batch, more than the %d kept", cap(e.out), keptOutputs)
	}
	batch(1)
	if len(e.out) != n {
		t.Fatalf("%d emissions in the second batch, want %d as in the first", len(e.out), n)
	}
	if want := n + n/4; cap(e.out) != want {
		t.Fatalf("the second batch's array holds %d for %d emissions: want it made at once for %d, a quarter more than the first batch's", cap(e.out), n, want)
	}
}
