package truth_test

import (
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/internal/topic"
	"github.com/edgeagent/edgeagent/testrig/scenario"
	"github.com/edgeagent/edgeagent/testrig/sim"
	"github.com/edgeagent/edgeagent/testrig/truth"
	"github.com/edgeagent/edgeagent/uplink/wire"
	"github.com/edgeagent/edgeagent/window"
)

// The truth is a second implementation of the window semantics; these
// tests hold it against the first, the agent's own window stage, fed the
// very messages the simulator plans (through a real Bronze log and state
// database) — every stock scenario's misbehaviours included.

func TestTruthMatchesWindowStage(t *testing.T) {
	for _, name := range scenario.Names() {
		t.Run(name, func(t *testing.T) {
			sc, err := scenario.Lookup(name)
			if err != nil {
				t.Fatal(err)
			}
			checkAgainstStage(t, sc.WithShort())
		})
	}
}

// TestTruthHoppingWindows covers slide < size, where a reading lands in
// several windows and may be late for some of them only.
func TestTruthHoppingWindows(t *testing.T) {
	sc, err := scenario.Parse("hopping", []byte(`
name: hopping
seed: 11
duration: 6s
speed: 120
devices:
  - {prefix: h, count: 6, format: json, interval: 10s, metrics: [temperature]}
misbehaviour:
  late: {within: 10%, beyond: 5%}
  out_of_order: {readings: 10%}
  duplicates: {readings: 10%}
agent:
  window: {size: 3m, slide: 1m, watermark_delay: 20s, allowed_lateness: 2m}
`))
	if err != nil {
		t.Fatal(err)
	}
	exp := checkAgainstStage(t, sc)
	if exp.Late == 0 || exp.Duplicates == 0 {
		t.Fatalf("the scenario exercised nothing: late %d, duplicates %d", exp.Late, exp.Duplicates)
	}
}

// TestTruthZeroLateness covers allowed_lateness 0: everything behind the
// watermark is late.
func TestTruthZeroLateness(t *testing.T) {
	sc, err := scenario.Parse("strict", []byte(`
name: strict
seed: 12
duration: 5s
speed: 120
devices:
  - {prefix: s, count: 5, format: cbor, interval: 7s, metrics: [a, b]}
misbehaviour:
  out_of_order: {readings: 30%}
  late: {beyond: 10%}
agent:
  window: {size: 30s, watermark_delay: 4s, zero_lateness: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	if exp := checkAgainstStage(t, sc); exp.Late == 0 {
		t.Fatal("the scenario exercised no late reading")
	}
}

// TestComputeByHand checks the rules on a sequence worked out on paper,
// independently of the window stage.
func TestComputeByHand(t *testing.T) {
	const t0 = 1_700_000_040_000 // a minute boundary
	rd := func(id string, sec int64, v float64) sim.Message {
		return sim.Message{Kind: sim.KindReading, Reading: &sim.Reading{ID: id, TS: t0 + sec*1000, Metrics: []sim.Metric{{Name: "x", Value: v}}}}
	}
	retry := func(m sim.Message) sim.Message { m.Retry = true; return m }
	plan := &sim.Plan{Devices: []sim.Device{
		{Name: "d", Messages: []sim.Message{
			rd("a", 5, 1),        // [0,60)
			rd("b", 70, 2),       // [60,120); horizon 70-10-60 = 0; watermark 60 passes [0,60)
			retry(rd("a", 5, 1)), // duplicate: its window ends at 60 > horizon 0
			rd("c", 50, 3),       // [0,60) again: merged, a revision
			{Kind: sim.KindMalformed, Note: "x"},
			rd("d", 200, 4),      // [180,240); horizon 130
			rd("e", 100, 5),      // [60,120) ends at 120 <= 130: late
			retry(rd("a", 5, 1)), // no longer a duplicate (60 <= 130): late
		}},
		{Name: "n", Messages: []sim.Message{
			{Kind: sim.KindReading, Reading: &sim.Reading{PTime: true, Metrics: []sim.Metric{{Name: "level", Value: 7}}}},
			{Kind: sim.KindReading, Reading: &sim.Reading{PTime: true, Metrics: []sim.Metric{{Name: "level", Value: -2}}}},
		}},
	}}
	exp := truth.Compute(plan, nil, nil, truth.Settings{Size: time.Minute, WatermarkDelay: 10 * time.Second, AllowedLateness: time.Minute})
	want := map[truth.Key]truth.Window{
		{Device: "d", Metric: "x", Start: t0}:           {Count: 2, Sum: 4, Min: 1, Max: 3, First: 1, Last: 3},
		{Device: "d", Metric: "x", Start: t0 + 60_000}:  {Count: 1, Sum: 2, Min: 2, Max: 2, First: 2, Last: 2},
		{Device: "d", Metric: "x", Start: t0 + 180_000}: {Count: 1, Sum: 4, Min: 4, Max: 4, First: 4, Last: 4},
	}
	if len(exp.Windows) != len(want) {
		t.Fatalf("%d windows, want %d", len(exp.Windows), len(want))
	}
	for k, w := range want {
		g := exp.Windows[k]
		if g == nil || g.Count != w.Count || g.Sum != w.Sum || g.Min != w.Min || g.Max != w.Max || g.First != w.First || g.Last != w.Last {
			t.Errorf("window %v: got %+v, want %+v", k, g, w)
		}
	}
	if exp.Late != 2 || exp.LateReadings != 2 || exp.Duplicates != 1 || exp.Dead != 1 || exp.Revisable != 1 {
		t.Errorf("late %d (%d readings), duplicates %d, dead %d, revisable %d; want 2 (2), 1, 1, 1",
			exp.Late, exp.LateReadings, exp.Duplicates, exp.Dead, exp.Revisable)
	}
	if exp.Messages != 10 || exp.Readings != 7 {
		t.Errorf("messages %d readings %d, want 10 and 7", exp.Messages, exp.Readings)
	}
	s := exp.PTime[truth.SeriesKey{Device: "n", Metric: "level"}]
	if s == nil || s.Count != 2 || s.Sum != 5 || s.Min != -2 || s.Max != 7 {
		t.Errorf("ptime series: %+v, want count 2 sum 5 min -2 max 7", s)
	}
	// Only what was sent counts: the first two messages of d.
	part := truth.Compute(plan, []int{2, 0}, nil, truth.Settings{Size: time.Minute, WatermarkDelay: 10 * time.Second, AllowedLateness: time.Minute})
	if len(part.Windows) != 2 || part.Messages != 2 || len(part.PTime) != 0 {
		t.Errorf("sent prefix: %d windows, %d messages, %d series; want 2, 2, 0", len(part.Windows), part.Messages, len(part.PTime))
	}
}

// checkAgainstStage runs the plan through the window stage and compares
// its final, upserted output and its counters with the truth.
func checkAgainstStage(t *testing.T, sc *scenario.Scenario) *truth.Expected {
	t.Helper()
	start := time.Now()
	plan, err := sim.NewPlan(sc, start)
	if err != nil {
		t.Fatal(err)
	}
	exp := truth.Compute(plan, nil, nil, truth.Settings{
		Size: sc.Agent.Window.Size, Slide: sc.Agent.Window.Slide,
		WatermarkDelay: sc.Agent.Window.WatermarkDelay, AllowedLateness: sc.Agent.Window.AllowedLateness,
	})
	dir := t.TempDir()
	bronze, err := buffer.Open(filepath.Join(dir, "bronze.db"), buffer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bronze.Close() })
	recs := records(plan, start, int(sc.Agent.MaxPayloadBytes))
	// Ticks after the last message let idle devices close their windows.
	last := recs[len(recs)-1].ReceivedAt
	for i := 1; i <= 3; i++ {
		recs = append(recs, buffer.Record{Kind: buffer.KindTick, ReceivedAt: last + int64(i)*int64(sc.Agent.Window.IdleTimeout)})
	}
	for i := 0; i < len(recs); i += 1000 {
		if err := bronze.Append(recs[i:min(i+1000, len(recs))]); err != nil {
			t.Fatal(err)
		}
	}
	db, err := bolt.Open(filepath.Join(dir, "state.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	var subs []window.Subscription
	for _, s := range []struct{ tmpl, format string }{
		{sim.TopicJSON, window.FormatJSON}, {sim.TopicCBOR, window.FormatCBOR}, {sim.TopicNumber, window.FormatNumber},
	} {
		tm, err := topic.Parse(s.tmpl)
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, window.Subscription{Template: tm, Format: s.format})
	}
	w := sc.Agent.Window
	stage, err := window.New(db, bronze, window.Config{
		Gateway: "truth-gw", Subscriptions: subs, EventID: "id", EventTime: "ts", TimeFormat: window.TimeAuto,
		MaxFutureSkew: sc.Agent.MaxFutureSkew, MaxPastSkew: sc.Agent.MaxPastSkew,
		Size: w.Size, Slide: w.Slide, WatermarkDelay: w.WatermarkDelay, AllowedLateness: w.AllowedLateness,
		IdleTimeout: w.IdleTimeout, Aggregates: w.Aggregates, MaxDevices: 100000, DeviceExpiry: 24 * time.Hour,
		TriggerInterval: sc.Agent.TriggerInterval, MaxRecordsPerBatch: 500,
		// A state checkpoint with every batch, so emitted windows are
		// evicted from memory and late data reads them back from disk.
		CheckpointInterval: time.Nanosecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := stage.RunOnce(); err != nil {
		t.Fatal(err)
	}
	got := map[truth.Key]wire.Aggregate{}
	err = db.View(func(tx *bolt.Tx) error {
		entries, err := outbox.Read(tx, 0, math.MaxInt)
		if err != nil {
			return err
		}
		for _, en := range entries {
			var a wire.Aggregate
			if err := wire.DecodeAggregate(en.Data, &a); err != nil {
				return err
			}
			k := truth.Key{Device: a.Device, Metric: a.Metric, Start: a.Start}
			if old, ok := got[k]; !ok || a.Rev > old.Rev {
				got[k] = a
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ptime := map[truth.SeriesKey]*truth.Series{}
	ptimeDev := map[string]bool{}
	for k := range exp.PTime {
		ptimeDev[k.Device] = true
	}
	var bad []string
	for k, a := range got {
		if ptimeDev[k.Device] {
			sk := truth.SeriesKey{Device: k.Device, Metric: k.Metric}
			s := ptime[sk]
			if s == nil {
				s = &truth.Series{Min: *a.Min, Max: *a.Max}
				ptime[sk] = s
			}
			s.Count += a.Count
			s.Sum += *a.Sum
			s.Min, s.Max = math.Min(s.Min, *a.Min), math.Max(s.Max, *a.Max)
			if !a.ProcTime {
				bad = append(bad, "ptime flag missing on "+k.Device)
			}
			continue
		}
		want := exp.Windows[k]
		if want == nil {
			bad = append(bad, "extra "+a.Key)
			continue
		}
		if d := diff(&a, want); d != "" {
			bad = append(bad, a.Key+": "+d)
		}
	}
	for k := range exp.Windows {
		if _, ok := got[k]; !ok {
			bad = append(bad, "missing "+k.Device+"/"+k.Metric)
		}
	}
	for k, want := range exp.PTime {
		g := ptime[k]
		if g == nil || g.Count != want.Count || g.Min != want.Min || g.Max != want.Max || math.Abs(g.Sum-want.Sum) > 1e-9*math.Abs(want.Sum) {
			bad = append(bad, "ptime series "+k.Device+"/"+k.Metric+" differs")
		}
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		t.Fatalf("%d differences between the truth and the window stage, first: %v", len(bad), bad[:min(10, len(bad))])
	}
	st := stage.Stats()
	var dead uint64
	for _, n := range st.DeadLetters {
		dead += n
	}
	if st.Late != exp.Late || st.Duplicates != exp.Duplicates || dead != exp.Dead {
		t.Fatalf("counters: stage late %d duplicates %d dead %d; truth late %d duplicates %d dead %d (%v)",
			st.Late, st.Duplicates, dead, exp.Late, exp.Duplicates, exp.Dead, st.DeadLetters)
	}
	// The tables row by row: which reading was late with what value, and
	// which message was dead-lettered with what reason code.
	var lateRows map[truth.LateRow]int
	var deadRows map[truth.DeadRow]int
	err = db.View(func(tx *bolt.Tx) error {
		lateRows, deadRows, err = truth.ReadTables(tx, math.MaxInt)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(lateRows, exp.LateRows) {
		t.Fatalf("late rows differ from the truth's:\n%s", rowDiff(lateRows, exp.LateRows))
	}
	if !maps.Equal(deadRows, exp.DeadRows) {
		t.Fatalf("dead-letter rows differ from the truth's:\n%s", rowDiff(deadRows, exp.DeadRows))
	}
	if len(exp.Windows) == 0 {
		t.Fatal("the plan produced no windows")
	}
	t.Logf("%d windows, %d ptime series, late %d, duplicates %d, dead %d, revisable %d — identical",
		len(exp.Windows), len(exp.PTime), exp.Late, exp.Duplicates, exp.Dead, exp.Revisable)
	return exp
}

// records lays the plan out as ingest would: devices interleaved by send
// time, each in its own order, stamped with a received-at; oversized
// payloads become rejected records.
func records(plan *sim.Plan, start time.Time, maxPayload int) []buffer.Record {
	type item struct {
		at       time.Duration
		dev, idx int
	}
	var items []item
	for d := range plan.Devices {
		for i, m := range plan.Devices[d].Messages {
			items = append(items, item{m.SendAt, d, i})
		}
	}
	slices.SortStableFunc(items, func(a, b item) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return a.dev - b.dev
	})
	recs := make([]buffer.Record, 0, len(items))
	var last int64
	for _, it := range items {
		m := plan.Devices[it.dev].Messages[it.idx]
		ts := max(start.Add(it.at).UnixNano(), last+1000)
		last = ts
		r := buffer.Record{Kind: buffer.KindMessage, ReceivedAt: ts, Topic: m.Topic, QoS: 1, Payload: m.Payload}
		if len(m.Payload) > maxPayload {
			r.Kind, r.Reason, r.Payload = buffer.KindRejected, "payload_too_large", m.Payload[:256]
		}
		recs = append(recs, r)
	}
	return recs
}

func diff(a *wire.Aggregate, w *truth.Window) string {
	switch {
	case a.Count != w.Count:
		return "count"
	case a.ProcTime:
		return "ptime"
	case !near(*a.Sum, w.Sum), !near(*a.Mean, w.Mean()):
		return "sum/mean"
	case *a.Min != w.Min, *a.Max != w.Max:
		return "min/max"
	case *a.First != w.First, *a.Last != w.Last:
		return "first/last"
	}
	return ""
}

func near(a, b float64) bool {
	return a == b || math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b))
}

// Transitions by hand: `for` counts windows in a row, hysteresis keeps an
// alert firing inside the band, a default clear_when is when's negation,
// and a rule watches only its devices and metric.
func TestTransitionsByHand(t *testing.T) {
	e := &truth.Expected{Windows: map[truth.Key]*truth.Window{}}
	put := func(dev, metric string, means ...float64) {
		for i, m := range means {
			e.Windows[truth.Key{Device: dev, Metric: metric, Start: int64(i) * 60_000}] = &truth.Window{Count: 2, Sum: 2 * m, Min: m - 1, Max: m + 1, First: m, Last: m}
		}
	}
	put("p1", "pressure", 69, 71, 72, 69.8, 69.4, 71, 69.9, 71, 71.5)
	put("p1", "temperature", 90, 90, 90)    // another metric
	put("q1", "pressure", 90, 90, 90, 90)   // outside the glob
	put("p2", "pressure", 70.5, 72.6, 71.0) // max 71.5, 73.6, 72.0
	rules := []scenario.AlertRule{
		{Name: "over", Metric: "pressure", Devices: "p*", When: "mean > 70", For: 2, ClearWhen: "mean < 69.5"},
		{Name: "peak", Metric: "pressure", Devices: "p2", When: "max > 72.5", For: 1},
	}
	got := e.Transitions(rules)
	want := []truth.Transition{
		{Rule: "over", Device: "p1", Start: 2 * 60_000, State: "fired"},
		{Rule: "over", Device: "p1", Start: 4 * 60_000, State: "cleared"},
		{Rule: "over", Device: "p1", Start: 8 * 60_000, State: "fired"},
		{Rule: "over", Device: "p2", Start: 1 * 60_000, State: "fired"},
		{Rule: "peak", Device: "p2", Start: 1 * 60_000, State: "fired"},
		{Rule: "peak", Device: "p2", Start: 2 * 60_000, State: "cleared"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("transitions\n got %v\nwant %v", got, want)
	}
}

// rowDiff lists up to ten rows whose counts differ between got and want.
func rowDiff[K comparable](got, want map[K]int) string {
	var out []string
	for k, n := range want {
		if got[k] != n {
			out = append(out, fmt.Sprintf("%+v: %d in the table, truth %d", k, got[k], n))
		}
	}
	for k, n := range got {
		if _, ok := want[k]; !ok {
			out = append(out, fmt.Sprintf("%+v: %d in the table, truth 0", k, n))
		}
	}
	slices.Sort(out)
	return strings.Join(out[:min(10, len(out))], "\n")
}
