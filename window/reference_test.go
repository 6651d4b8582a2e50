package window

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/internal/decsum"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// genOpts shapes a generated stream.
type genOpts struct {
	devices  int
	duration time.Duration // wall-clock span of the stream
	period   time.Duration // mean reporting period per device
	dupRate  float64       // producer retries / broker redeliveries
	noIDRate float64       // payloads without an id (content hash)
	lateRate float64       // readings delayed far beyond the lateness
	backlog  int           // devices that go offline for two hours and flush
	// grid, when set, truncates event times to it, so window boundaries
	// are hit exactly and first/last ties (same event time) are common.
	grid time.Duration
	// metrics, when set, adds one of that many metric names to each
	// reading: devices then hold many series, made and pruned over time.
	metrics int
}

// genStream simulates devices publishing JSON readings, with clock ticks,
// out-of-order event times within the watermark delay, late and very late
// readings, retries, and devices that buffer a two-hour backlog while idle
// and flush it at once.
func genStream(seed uint64, cfg Config, o genOpts) []buffer.Record {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	type dev struct {
		name      string
		n         int
		nextAt    time.Time
		sent      []string
		offFrom   time.Time
		offUntil  time.Time
		backlog   []string
		wasOnline bool
	}
	devs := make([]*dev, o.devices)
	for i := range devs {
		devs[i] = &dev{name: fmt.Sprintf("dev%03d", i), nextAt: t0.Add(time.Duration(rng.Int64N(int64(o.period))))}
	}
	for i := 0; i < o.backlog && i < len(devs); i++ {
		d := devs[i]
		d.offFrom = t0.Add(time.Duration(rng.Int64N(int64(o.duration / 4))))
		d.offUntil = d.offFrom.Add(2*time.Hour + time.Duration(rng.Int64N(int64(10*time.Minute))))
	}
	delay, late, size := cfg.WatermarkDelay, cfg.AllowedLateness, cfg.Size
	var recs []buffer.Record
	now := t0
	lastTick := now
	end := t0.Add(o.duration)
	for now.Before(end) {
		now = now.Add(time.Duration(rng.Int64N(int64(400 * time.Millisecond))))
		if now.Sub(lastTick) >= time.Second {
			recs = append(recs, tick(now))
			lastTick = now
		}
		for _, d := range devs {
			if now.Before(d.nextAt) {
				continue
			}
			d.nextAt = now.Add(o.period/2 + time.Duration(rng.Int64N(int64(o.period))))
			topicName := "sensors/" + d.name + "/telemetry"
			offline := !d.offFrom.IsZero() && !now.Before(d.offFrom) && now.Before(d.offUntil)
			// event time: mostly slightly in the past, out of order within the delay
			et := now.Add(-time.Duration(rng.Int64N(int64(delay) + 1)))
			switch r := rng.Float64(); {
			case r < o.lateRate:
				et = now.Add(-delay - late - size - time.Duration(rng.Int64N(int64(5*time.Minute))))
			case r < 2*o.lateRate:
				et = now.Add(-delay - time.Duration(rng.Int64N(int64(late+size))))
			}
			if o.grid > 0 {
				et = et.Truncate(o.grid)
			}
			d.n++
			var p string
			// Hundredths, as sensors report them: their float64 sums carry
			// rounding noise that the emitted sum and mean must not.
			temp := float64(rng.IntN(40000)-10000) / 100
			if rng.Float64() < o.noIDRate {
				p = fmt.Sprintf(`{"ts":%d,"temp":%v}`, et.UnixMilli(), temp)
			} else if rng.IntN(3) == 0 {
				p = fmt.Sprintf(`{"id":"%s-%d","ts":%d,"temp":%v}`, d.name, d.n, et.UnixMilli(), temp)
			} else {
				p = fmt.Sprintf(`{"id":"%s-%d","ts":%d,"temp":%v,"hum":%d}`, d.name, d.n, et.UnixMilli(), temp, rng.IntN(100))
			}
			if o.metrics > 0 {
				p = strings.TrimSuffix(p, "}") + fmt.Sprintf(`,"m%d":%d}`, rng.IntN(o.metrics), rng.IntN(1000))
			}
			if offline {
				d.backlog = append(d.backlog, p)
				continue
			}
			if len(d.backlog) > 0 { // back online: flush the backlog first
				for _, bp := range d.backlog {
					recs = append(recs, msg(topicName, bp, now))
					d.sent = append(d.sent, bp)
				}
				d.backlog = nil
			}
			recs = append(recs, msg(topicName, p, now))
			d.sent = append(d.sent, p)
			if rng.Float64() < o.dupRate && len(d.sent) > 0 {
				// a retry of a recent reading, or an old one
				k := len(d.sent) - 1 - rng.IntN(min(len(d.sent), 20))
				if rng.IntN(10) == 0 {
					k = rng.IntN(len(d.sent))
				}
				recs = append(recs, msg(topicName, d.sent[k], now))
			}
		}
	}
	// a final tick far enough ahead to idle-close every device and cross a
	// trigger boundary, so every window has been emitted.
	recs = append(recs, tick(now.Add(cfg.IdleTimeout+2*cfg.TriggerInterval)))
	return recs
}

type refWindow struct {
	count                      uint64
	sum, min, max, first, last float64
	firstT, lastT              int64
	firstSeq, lastSeq          uint64
}

// reference recomputes every window from the full list of readings under
// the documented rules, as directly as possible: a per-device watermark
// (max event time - delay), a reading accepted by a window while the
// window's end + lateness is after the watermark, deduplication on
// (device, id) while the first reading's last window is not final.
func reference(t *testing.T, cfg Config, recs []buffer.Record) (map[winID]*refWindow, []Late, int) {
	t.Helper()
	cfg = cfg.withDefaults()
	size, slide := cfg.Size.Milliseconds(), cfg.Slide.Milliseconds()
	delay, late := cfg.WatermarkDelay.Milliseconds(), cfg.AllowedLateness.Milliseconds()
	type devState struct {
		has  bool
		maxT int64
		seen map[string]int64
	}
	devs := map[string]*devState{}
	wins := map[winID]*refWindow{}
	var lates []Late
	dups := 0
	for _, r := range recs {
		if r.Kind != buffer.KindMessage {
			continue
		}
		dev := strings.Split(r.Topic, "/")[1]
		var m map[string]any
		if err := json.Unmarshal(r.Payload, &m); err != nil {
			t.Fatal(err)
		}
		ts := int64(m["ts"].(float64))
		id := r.Topic + "\x00" + string(r.Payload)
		if s, ok := m["id"].(string); ok {
			id = s
		}
		d := devs[dev]
		if d == nil {
			d = &devState{seen: map[string]int64{}}
			devs[dev] = d
		}
		wm := int64(-1 << 62)
		if d.has {
			wm = d.maxT - delay
		}
		if le, ok := d.seen[id]; ok && le+late > wm {
			dups++
			continue
		}
		accepted := false
		var names []string
		for k := range m {
			if k != "id" && k != "ts" {
				names = append(names, k)
			}
		}
		sort.Strings(names)
		lastStart := ts - ((ts%slide)+slide)%slide
		for _, name := range names {
			v := m[name].(float64)
			for s := lastStart; s+size > ts; s -= slide {
				if s+size+late <= wm {
					lates = append(lates, Late{Seq: r.Seq, Device: dev, Metric: name, EventTime: ts, WindowStart: s, Value: v, Watermark: wm})
					continue
				}
				accepted = true
				id := winID{dev, name, s}
				w := wins[id]
				if w == nil {
					w = &refWindow{min: v, max: v, first: v, last: v, firstT: ts, lastT: ts, firstSeq: r.Seq, lastSeq: r.Seq}
					wins[id] = w
				}
				w.count++
				w.sum += v
				w.min, w.max = min(w.min, v), max(w.max, v)
				if ts < w.firstT || ts == w.firstT && r.Seq < w.firstSeq {
					w.first, w.firstT, w.firstSeq = v, ts, r.Seq
				}
				if ts > w.lastT || ts == w.lastT && r.Seq > w.lastSeq {
					w.last, w.lastT, w.lastSeq = v, ts, r.Seq
				}
			}
		}
		if accepted {
			d.seen[id] = lastStart + size
		}
		if !d.has || ts > d.maxT {
			d.has, d.maxT = true, ts
		}
	}
	return wins, lates, dups
}

// checkAgainstReference compares the final revisions in the outbox and the
// late table with the reference.
func checkAgainstReference(t *testing.T, cfg Config, recs []buffer.Record, aggs []wire.Aggregate, lates []Late, dups uint64) {
	t.Helper()
	want, wantLate, wantDups := reference(t, cfg, recs)
	got := upsert(t, aggs)
	if len(got) != len(want) {
		t.Errorf("%d windows emitted, reference has %d", len(got), len(want))
	}
	bad := 0
	for id, w := range want {
		a, ok := got[id]
		sum, mean := decsum.Snap(w.sum, w.count, w.min, w.max)
		switch {
		case !ok:
			t.Errorf("window %v missing", id)
		case a.Count != w.count || *a.Sum != sum || *a.Min != w.min || *a.Max != w.max || *a.Mean != mean || *a.First != w.first || *a.Last != w.last || a.ProcTime:
			t.Errorf("window %v:\n got %s\nwant n=%d sum=%v min=%v max=%v mean=%v first=%v last=%v", id, show(a), w.count, sum, w.min, w.max, mean, w.first, w.last)
		case a.End != a.Start+cfg.Size.Milliseconds():
			t.Errorf("window %v end %d", id, a.End)
		default:
			continue
		}
		if bad++; bad > 10 {
			t.Fatal("too many mismatches")
		}
	}
	if uint64(wantDups) != dups {
		t.Errorf("duplicates %d, reference %d", dups, wantDups)
	}
	key := func(l Late) string {
		return fmt.Sprintf("%d/%s/%s/%d/%d/%v/%d", l.Seq, l.Device, l.Metric, l.EventTime, l.WindowStart, l.Value, l.Watermark)
	}
	var gk, wk []string
	for _, l := range lates {
		gk = append(gk, key(l))
	}
	for _, l := range wantLate {
		wk = append(wk, key(l))
	}
	sort.Strings(gk)
	sort.Strings(wk)
	if strings.Join(gk, "\n") != strings.Join(wk, "\n") {
		t.Errorf("late table differs from the reference: %d rows, want %d", len(gk), len(wk))
		for i := 0; i < len(gk) && i < len(wk) && i < 5; i++ {
			if gk[i] != wk[i] {
				t.Errorf("first difference: got %s want %s", gk[i], wk[i])
				break
			}
		}
	}
}

func TestAgainstReference(t *testing.T) {
	tumbling := func(t *testing.T) Config { return testConfig(t) }
	hopping := func(t *testing.T) Config {
		c := testConfig(t)
		c.Slide = 20 * time.Second
		return c
	}
	cases := []struct {
		name string
		cfg  func(*testing.T) Config
		seed uint64
		o    genOpts
	}{
		{"tumbling backlog", tumbling, 1, genOpts{devices: 12, duration: 150 * time.Minute, period: 40 * time.Second, dupRate: 0.08, noIDRate: 0.2, lateRate: 0.03, backlog: 3}},
		{"tumbling noisy", tumbling, 2, genOpts{devices: 20, duration: 40 * time.Minute, period: 10 * time.Second, dupRate: 0.2, noIDRate: 0.3, lateRate: 0.08}},
		{"hopping backlog", hopping, 3, genOpts{devices: 8, duration: 140 * time.Minute, period: 45 * time.Second, dupRate: 0.1, noIDRate: 0.2, lateRate: 0.04, backlog: 2}},
		{"many devices", tumbling, 4, genOpts{devices: 400, duration: 8 * time.Minute, period: 30 * time.Second, dupRate: 0.05, noIDRate: 0.1, lateRate: 0.02}},
		{"hopping noisy", hopping, 5, genOpts{devices: 15, duration: 30 * time.Minute, period: 8 * time.Second, dupRate: 0.15, noIDRate: 0.3, lateRate: 0.1}},
		{"tumbling coarse", tumbling, 6, genOpts{devices: 10, duration: 30 * time.Minute, period: 3 * time.Second, dupRate: 0.1, noIDRate: 0.2, lateRate: 0.1, grid: 5 * time.Second}},
		{"hopping coarse", hopping, 7, genOpts{devices: 10, duration: 30 * time.Minute, period: 3 * time.Second, dupRate: 0.1, noIDRate: 0.2, lateRate: 0.1, grid: 5 * time.Second}},
		// Past seriesIndexMin series a device: its series are found
		// through a map kept as series come and go.
		{"many metrics", hopping, 8, genOpts{devices: 3, duration: 60 * time.Minute, period: 2 * time.Second, dupRate: 0.1, noIDRate: 0.2, lateRate: 0.05, metrics: 150}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := c.cfg(t)
			recs := genStream(c.seed, cfg, c.o)
			db, br := openDB(t, "", true), openBronze(t, "")
			appendAll(t, br, recs)
			s, err := New(db, br, cfg)
			if err != nil {
				t.Fatal(err)
			}
			runToEnd(t, s)
			st := s.Stats()
			t.Logf("%d records, %d readings, %d emitted (%d revisions), %d late, %d duplicates, %d open windows left",
				st.Records, st.Readings, st.Emitted, st.Revisions, st.Late, st.Duplicates, st.OpenWindows)
			if st.Revisions == 0 || st.Late == 0 || st.Duplicates == 0 {
				t.Errorf("stream did not exercise revisions (%d), late (%d) and duplicates (%d)", st.Revisions, st.Late, st.Duplicates)
			}
			var dead uint64
			for _, n := range st.DeadLetters {
				dead += n
			}
			if dead != 0 {
				t.Errorf("%d dead letters in a clean stream: %v", dead, readDead(t, db)[:1])
			}
			checkAgainstReference(t, cfg, recs, decodeOutbox(t, db), readLate(t, db), st.Duplicates)
		})
	}
}
