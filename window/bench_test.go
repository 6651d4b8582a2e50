package window

import (
	"fmt"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/buffer"
)

// benchStream is devices reporting every 10 s, in order, a JSON payload
// with an id, a millisecond timestamp and two metrics, plus a tick a second.
func benchStream(devices, n int) []buffer.Record {
	recs := make([]buffer.Record, 0, n)
	perSec := devices / 10
	at := t0
	for i := 0; len(recs) < n; i++ {
		if i%perSec == 0 {
			at = at.Add(time.Second)
			recs = append(recs, tick(at))
		}
		d := i % devices
		recs = append(recs, msg(fmt.Sprintf("sensors/dev%05d/telemetry", d),
			fmt.Sprintf(`{"id":"r%d","ts":%d,"temp":%d.%d,"hum":%d}`, i, at.Add(-time.Duration(i%7)*time.Millisecond).UnixMilli(), 20+i%10, i%10, 40+i%30), at))
	}
	return recs
}

func benchConfig(b *testing.B) Config {
	cfg := testConfig(b)
	cfg.MaxRecordsPerBatch = 10_000
	return cfg
}

// BenchmarkStage measures parse + dedup + window in memory, one core.
func BenchmarkStage(b *testing.B) {
	cfg := benchConfig(b).withDefaults()
	recs := benchStream(1000, 200_000)
	var bytes int64
	for i := range recs {
		bytes += int64(len(recs[i].Payload))
	}
	b.ReportAllocs()
	b.ResetTimer()
	var e *engine
	for i := 0; i < b.N; i++ {
		j := i % len(recs)
		if j == 0 {
			b.StopTimer()
			e = newEngine(&cfg)
			b.StartTimer()
		}
		e.process(&recs[j])
		if e.c.Records%uint64(cfg.MaxRecordsPerBatch) == 0 {
			e.resetOutputs()
			e.resetDelta() // what a commit would do, minus bbolt
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(bytes)/float64(len(recs)), "payload-B")
}

// BenchmarkStageCommit measures the stage end to end: Bronze reads,
// processing and one fsync'd bbolt commit per batch of 10,000.
func BenchmarkStageCommit(b *testing.B) {
	const n = 200_000
	dir := b.TempDir()
	br, err := buffer.Open(filepath.Join(dir, "bronze.db"), buffer.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer br.Close()
	appendAll(b, br, benchStream(1000, n))
	cfg := benchConfig(b)
	b.ResetTimer()
	var batches uint64
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		db := openDB(b, filepath.Join(dir, fmt.Sprintf("state%d.db", i)), false)
		s, err := New(db, br, cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := s.RunOnce(); err != nil {
			b.Fatal(err)
		}
		batches += s.Stats().Batches
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(b.Elapsed().Seconds()*1000/float64(batches), "ms/batch")
}

// BenchmarkStateSize reports the heap held by 10,000 devices x 4 metrics of
// open windows (with six dedup entries per device).
func BenchmarkStateSize(b *testing.B) {
	const devices, metrics, perDevice = 10_000, 4, 6
	cfg := benchConfig(b)
	cfg.MaxDevices = devices
	cfg = cfg.withDefaults()
	var recs []buffer.Record
	for r := range perDevice {
		at := t0.Add(time.Duration(r) * 5 * time.Second)
		for d := range devices {
			recs = append(recs, msg(fmt.Sprintf("sensors/dev%05d/telemetry", d),
				fmt.Sprintf(`{"id":"%d","ts":%d,"m0":1,"m1":2,"m2":3,"m3":4}`, r, at.UnixMilli()), at))
		}
	}
	var heap, perWindow float64
	for i := 0; i < b.N; i++ {
		e, held := heldHeap(&cfg, recs, nil, nil)
		if e.nWindows != devices*metrics {
			b.Fatalf("%d open windows", e.nWindows)
		}
		heap = float64(held) / (1 << 20)
		perWindow = float64(held) / float64(e.nWindows)
	}
	b.ReportMetric(heap, "heap-MB")
	b.ReportMetric(perWindow, "bytes/window")
}

// heldHeap feeds recs to a fresh engine, set up by prepare, resetting its
// outputs and delta every 10,000 records as commits would, and returns it
// with the heap it holds after a collection; release drops what the
// measurement should leave out.
func heldHeap(cfg *Config, recs []buffer.Record, prepare, release func(*engine)) (*engine, uint64) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	e := newEngine(cfg)
	if prepare != nil {
		prepare(e)
	}
	for j := range recs {
		e.process(&recs[j])
		if j%10_000 == 0 {
			e.resetOutputs()
			e.resetDelta()
		}
	}
	e.resetOutputs()
	e.resetDelta()
	e.x = nil
	if release != nil {
		release(e)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(e)
	return e, after.HeapAlloc - before.HeapAlloc
}

// emittedStream is 10,000 devices reporting two metrics every 30 s for 13
// minutes: with 1-minute windows and 10 minutes of lateness each series
// ends with ten emitted windows kept for revisions and one open.
func emittedStream(devices int) []buffer.Record {
	var recs []buffer.Record
	for r := range 26 {
		at := t0.Add(time.Duration(r) * 30 * time.Second)
		for d := range devices {
			recs = append(recs, msg(fmt.Sprintf("sensors/dev%05d/telemetry", d),
				fmt.Sprintf(`{"id":"%d","ts":%d,"m0":%d,"m1":2}`, r, at.UnixMilli(), r), at))
		}
	}
	return recs
}

// BenchmarkEmittedState reports the heap held by 10,000 devices x 2
// metrics with 1-minute windows and 10 minutes of allowed lateness, the
// load where emitted windows waiting for late data dominate the state:
// "resident" keeps them in memory, "evicted" checkpoints (as a commit
// would, minus bbolt) and evicts them. bytes/window is the heap per window
// in state, open or emitted.
func BenchmarkEmittedState(b *testing.B) {
	const devices = 10_000
	cfg := benchConfig(b)
	cfg.MaxDevices = devices
	cfg.AllowedLateness = 10 * time.Minute
	cfg = cfg.withDefaults()
	recs := emittedStream(devices)
	for _, evict := range []bool{false, true} {
		name := "resident"
		if evict {
			name = "evicted"
		}
		b.Run(name, func(b *testing.B) {
			var heap, perWindow float64
			var windows int
			for i := 0; i < b.N; i++ {
				var prepare func(*engine)
				if evict {
					prepare = func(e *engine) {
						e.load = func(dev, metric string, start int64) (*window, error) {
							return nil, fmt.Errorf("no late data in this stream")
						}
						e.loadDedup = func(dev string, end int64) ([]uint64, error) {
							return nil, fmt.Errorf("no retries of old readings in this stream")
						}
					}
				}
				e, held := heldHeap(&cfg, recs, prepare, func(e *engine) { e.due = nil })
				if want := devices * 2 * 11; e.nWindows != want {
					b.Fatalf("%d windows in state, want %d", e.nWindows, want)
				}
				windows = e.nWindows
				heap = float64(held) / (1 << 20)
				perWindow = float64(held) / float64(e.nWindows)
			}
			b.ReportMetric(heap, "heap-MB")
			b.ReportMetric(perWindow, "bytes/window")
			b.ReportMetric(float64(windows), "windows")
		})
	}
}

// BenchmarkCheckpointLoad measures checkpoints of a load-mode state:
// 10,000 devices, a checkpoint (fsync'd, in chunks) after every batch of
// 10,000 records, so that most devices change between two.
func BenchmarkCheckpointLoad(b *testing.B) {
	const n = 300_000
	dir := b.TempDir()
	br := openBronze(b, filepath.Join(dir, "bronze.db"))
	appendAll(b, br, benchStream(10_000, n))
	cfg := benchConfig(b)
	cfg.MaxDevices = 20_000
	checkpointEveryBatch(&cfg)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		db := openDB(b, filepath.Join(dir, fmt.Sprintf("state%d.db", i)), false)
		s, err := New(db, br, cfg)
		if err != nil {
			b.Fatal(err)
		}
		runToEnd(b, s)
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "records/s")
}
