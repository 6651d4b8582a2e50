package verify

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeagent/edgeagent/testrig/servers"
	"github.com/edgeagent/edgeagent/testrig/truth"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

const (
	gw      = "gw"
	stream  = "EDGE"
	subject = "edge.gw.aggregates"
)

var all = []string{"count", "sum", "min", "max", "mean", "first", "last"}

func startNATS(t *testing.T) *servers.NATS {
	t.Helper()
	n, err := servers.StartNATS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := servers.CreateStream(ctx, n.URL(), stream, []string{subject}); err != nil {
		t.Fatal(err)
	}
	return n
}

func startVerifier(t *testing.T, url string) *Verifier {
	t.Helper()
	v, err := Start(context.Background(), Config{URL: url, Stream: stream, Subject: subject})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	return v
}

// publish sends one batch the way the agent does: CBOR, zstd, Nats-Msg-Id.
func publish(t *testing.T, url, id string, aggs ...wire.Aggregate) {
	t.Helper()
	body, err := wire.EncodeBatch(&wire.Batch{V: wire.Version, Gateway: gw, Batch: id, Aggregates: aggs}, wire.EncodingZstd)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg(subject)
	msg.Data = body
	msg.Header.Set("Content-Type", wire.ContentType)
	msg.Header.Set("Content-Encoding", wire.EncodingZstd)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// No Nats-Msg-Id here: the test wants resends to reach the stream, as
	// they do after the duplicate window.
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
}

func agg(dev, metric string, start int64, rev uint32, vals ...float64) wire.Aggregate {
	a := wire.Aggregate{Device: dev, Metric: metric, Start: start, End: start + 60_000, Rev: rev,
		Key: wire.AggregateKey(gw, dev, metric, start, rev)}
	sum, mn, mx := 0.0, vals[0], vals[0]
	for _, v := range vals {
		sum += v
		mn, mx = min(mn, v), max(mx, v)
	}
	a.Count = uint64(len(vals))
	a.Sum, a.Min, a.Max, a.Mean = wire.F(sum), wire.F(mn), wire.F(mx), wire.F(sum/float64(len(vals)))
	a.First, a.Last = wire.F(vals[0]), wire.F(vals[len(vals)-1])
	return a
}

func window(vals ...float64) *truth.Window {
	a := agg("x", "x", 0, 1, vals...)
	return &truth.Window{Count: a.Count, Sum: *a.Sum, Min: *a.Min, Max: *a.Max, First: *a.First, Last: *a.Last}
}

// drain waits until the verifier has everything the server holds.
func drain(t *testing.T, v *Verifier) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := v.WaitDrained(ctx); err != nil {
		t.Fatal(err)
	}
}

// publishedAndDrained waits until the verifier has received n messages,
// then drains it. The drain alone is not enough right after a publish:
// mochi acknowledges a QoS1 PUBLISH before it routes it, so the verifier's
// own marker, on another connection, can overtake a batch whose PUBACK the
// publisher already has (a CI run saw 0 of 1 windows so).
func publishedAndDrained(t *testing.T, v *Verifier, n uint64) {
	t.Helper()
	waitProgress(t, v, n, "messages", func(p Progress) uint64 { return p.Messages })
	drain(t, v)
}

func waitAggregates(t *testing.T, v *Verifier, n uint64) {
	t.Helper()
	waitProgress(t, v, n, "aggregates", func(p Progress) uint64 { return p.Aggregates })
}

// waitProgress polls until count of the verifier's progress reaches n.
func waitProgress(t *testing.T, v *Verifier, n uint64, what string, count func(Progress) uint64) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for count(v.Progress()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("verifier saw %d %s, want %d (last error %q)", count(v.Progress()), what, n, v.LastError())
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
}

// TestCompare feeds the verifier a correct window, a revised one, a wrong
// one, a duplicate delivery and an extra, over a real JetStream stream.
func TestCompare(t *testing.T) {
	n := startNATS(t)
	v := startVerifier(t, n.URL())
	exp := &truth.Expected{Windows: map[truth.Key]*truth.Window{
		{Device: "a", Metric: "t", Start: 0}:      window(1, 2),
		{Device: "a", Metric: "t", Start: 60_000}: window(3, 4, 5),
		{Device: "b", Metric: "t", Start: 0}:      window(7),
		{Device: "c", Metric: "t", Start: 0}:      window(9),
	}, PTime: map[truth.SeriesKey]*truth.Series{}}
	publish(t, n.URL(), "b1",
		agg("a", "t", 0, 1, 1, 2),
		agg("a", "t", 60_000, 1, 3, 4), // first emission, revised below
		agg("b", "t", 0, 1, 8),         // wrong value
		agg("z", "t", 0, 1, 1),         // not expected
	)
	publish(t, n.URL(), "b2", agg("a", "t", 60_000, 2, 3, 4, 5))
	publish(t, n.URL(), "b2", agg("a", "t", 60_000, 2, 3, 4, 5)) // a resend past the duplicate window
	waitAggregates(t, v, 6)
	r := v.Compare(exp, CompareOptions{Gateway: gw, Aggregates: all})
	w := r.Windows
	if w.Expected != 4 || w.Correct != 2 || w.Wrong != 1 || w.Missing != 1 || w.Extra != 1 || w.Revised != 1 {
		t.Fatalf("windows %+v, want 4 expected, 2 correct, 1 wrong, 1 missing, 1 extra, 1 revised", w)
	}
	if r.Delivery.DuplicateAggregates != 1 || r.Delivery.DuplicateBatches != 1 || r.Delivery.Messages != 3 {
		t.Fatalf("delivery %+v, want 3 messages, 1 duplicate aggregate and batch", r.Delivery)
	}
	if r.OK() || r.Complete() {
		t.Fatal("a wrong and a missing window must fail the comparison")
	}
	text := strings.Join(r.Problems, "\n")
	for _, want := range []string{"wrong b/t", "missing c/t", "extra z/t"} {
		if !strings.Contains(text, want) {
			t.Errorf("problems do not mention %q:\n%s", want, text)
		}
	}
}

// TestKeyConflict: an idempotency key that arrives again with another
// value is a failure with an example, not a harmless duplicate.
func TestKeyConflict(t *testing.T) {
	n := startNATS(t)
	v := startVerifier(t, n.URL())
	exp := &truth.Expected{Windows: map[truth.Key]*truth.Window{{Device: "a", Metric: "t", Start: 0}: window(1, 2)},
		PTime: map[truth.SeriesKey]*truth.Series{}}
	publish(t, n.URL(), "b1", agg("a", "t", 0, 1, 1, 2))
	publish(t, n.URL(), "b1", agg("a", "t", 0, 1, 1, 2)) // a resend: harmless
	publish(t, n.URL(), "b2", agg("a", "t", 0, 1, 1, 2, 3))
	waitAggregates(t, v, 3)
	r := v.Compare(exp, CompareOptions{Gateway: gw, Aggregates: all})
	if r.Delivery.KeyConflicts != 1 || r.Delivery.DuplicateAggregates != 1 {
		t.Fatalf("delivery %+v, want 1 key conflict and 1 duplicate aggregate", r.Delivery)
	}
	if r.OK() {
		t.Fatal("a key carrying two contents must fail the comparison")
	}
	text := strings.Join(r.Problems, "\n")
	if !strings.Contains(text, "key "+wire.AggregateKey(gw, "a", "t", 0, 1)+" arrived again with other contents") || !strings.Contains(text, "count 3 (earlier copy 2)") {
		t.Fatalf("problems do not describe the conflict:\n%s", text)
	}
}

// TestCompareTolerance: sums that differ in the last bits are equal, a
// real difference is not.
func TestCompareTolerance(t *testing.T) {
	a := agg("a", "t", 0, 1, 0.1, 0.2, 0.3)
	w := window(0.1, 0.2, 0.3)
	w.Sum = 0.6 // 0.1+0.2+0.3 is 0.6000000000000001
	if d := diffWindow(&a, w, CompareOptions{Aggregates: all, Tolerance: DefaultTolerance}); d != "" {
		t.Fatalf("last-bit difference reported: %s", d)
	}
	w.Sum = 0.61
	if d := diffWindow(&a, w, CompareOptions{Aggregates: all, Tolerance: DefaultTolerance}); !strings.Contains(d, "sum") {
		t.Fatalf("a real difference not reported: %q", d)
	}
	b := agg("a", "t", 0, 1, 1)
	b.Last = nil
	if d := diffWindow(&b, window(1), CompareOptions{Aggregates: all, Tolerance: DefaultTolerance}); d != "last absent" {
		t.Fatalf("a configured aggregate missing from the wire: %q", d)
	}
	if d := diffWindow(&b, window(1), CompareOptions{Aggregates: []string{"count", "sum"}, Tolerance: DefaultTolerance}); d != "min present, but not in window.aggregates" {
		t.Fatalf("an aggregate on the wire that is not configured: %q", d)
	}
}

// TestPTimeSeries compares processing-time windows as totals, exactly or
// at least once.
func TestPTimeSeries(t *testing.T) {
	n := startNATS(t)
	v := startVerifier(t, n.URL())
	p1, p2 := agg("n1", "level", 0, 1, 5, 6), agg("n1", "level", 60_000, 1, 7, 6)
	p1.ProcTime, p2.ProcTime = true, true
	publish(t, n.URL(), "p", p1, p2)
	publish(t, n.URL(), "e", agg("e1", "t", 0, 1, 1))
	waitAggregates(t, v, 3)
	if p := v.Progress(); p.Windows != 3 || p.PTimeWindows != 2 {
		t.Fatalf("progress: %d windows, %d of them ptime; want 3 and 2", p.Windows, p.PTimeWindows)
	}
	exp := &truth.Expected{Windows: map[truth.Key]*truth.Window{{Device: "e1", Metric: "t", Start: 0}: window(1)},
		PTime: map[truth.SeriesKey]*truth.Series{{Device: "n1", Metric: "level"}: {Count: 3, Sum: 18, Min: 5, Max: 7}}}
	r := v.Compare(exp, CompareOptions{Gateway: gw, Aggregates: all})
	if r.PTime.Wrong != 1 {
		t.Fatalf("exact: %+v, want the 4 readings of 3 expected to be wrong", r.PTime)
	}
	r = v.Compare(exp, CompareOptions{Gateway: gw, Aggregates: all, AtLeastOnce: true})
	if r.PTime.Correct != 1 || !r.OK() {
		t.Fatalf("at least once: %+v, want correct (a reading counted twice)", r.PTime)
	}
}

// TestVerifierSurvivesServerRestart restarts NATS between two batches; the
// consumer picks up after the last message it had.
func TestVerifierSurvivesServerRestart(t *testing.T) {
	n := startNATS(t)
	v := startVerifier(t, n.URL())
	publish(t, n.URL(), "r1", agg("a", "t", 0, 1, 1))
	waitAggregates(t, v, 1)
	if err := n.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	publish(t, n.URL(), "r2", agg("a", "t", 60_000, 1, 2))
	waitAggregates(t, v, 2)
	drain(t, v)
	if p := v.Progress(); p.Messages != 2 || p.DuplicateAggregates != 0 {
		t.Fatalf("progress %+v, want 2 messages and no duplicate", p)
	}
}

// TestCompareGeometry: every window must span the scenario's size on a
// multiple of its slide, and a processing-time series of sliding windows
// holds each reading size/slide times.
func TestCompareGeometry(t *testing.T) {
	n := startNATS(t)
	v := startVerifier(t, n.URL())
	// Sliding 1m/20s processing-time windows: readings 5 and 6, each in
	// three windows.
	var ptime []wire.Aggregate
	for i, vals := range [][]float64{{5}, {5, 6}, {5, 6}, {6}} {
		a := agg("n1", "level", int64(i)*20_000-40_000, 1, vals...)
		a.ProcTime = true
		ptime = append(ptime, a)
	}
	long := agg("e2", "t", 0, 1, 2)
	long.End = 600_000 // a ten-minute window where the scenario has one minute
	publish(t, n.URL(), "g", append(ptime, agg("e1", "t", 0, 1, 1), long)...)
	waitAggregates(t, v, 6)
	exp := &truth.Expected{Windows: map[truth.Key]*truth.Window{
		{Device: "e1", Metric: "t", Start: 0}: window(1),
		{Device: "e2", Metric: "t", Start: 0}: window(2),
	}, PTime: map[truth.SeriesKey]*truth.Series{{Device: "n1", Metric: "level"}: {Count: 2, Sum: 11, Min: 5, Max: 6}}}
	o := CompareOptions{Gateway: gw, Aggregates: all, Size: time.Minute, Slide: 20 * time.Second}
	r := v.Compare(exp, o)
	if r.Windows.Correct != 1 || r.Windows.Wrong != 1 || r.PTime.Correct != 1 {
		t.Fatalf("windows %+v, ptime %+v: want the ten-minute window wrong, the rest correct\n%s", r.Windows, r.PTime, strings.Join(r.Problems, "\n"))
	}
	if text := strings.Join(r.Problems, "\n"); !strings.Contains(text, "wrong e2/t") || !strings.Contains(text, "is 10m0s after the start, want 1m0s") {
		t.Fatalf("problems do not name the window's size:\n%s", text)
	}
	// As tumbling 20 s windows the same series holds each reading once
	// too often, and its windows are too long.
	o.Size = 20 * time.Second
	if r := v.Compare(exp, o); r.PTime.Wrong != 1 {
		t.Fatalf("tumbling: ptime %+v, want the series wrong", r.PTime)
	}
}

// A window holding more readings than the truth can never come right
// (revisions only add readings): waiting is over unless a reading may
// arrive twice.
func TestOvercountedSettles(t *testing.T) {
	n := startNATS(t)
	v := startVerifier(t, n.URL())
	publish(t, n.URL(), "o", agg("a", "t", 0, 1, 1, 2, 3))
	waitAggregates(t, v, 1)
	exp := &truth.Expected{Windows: map[truth.Key]*truth.Window{
		{Device: "a", Metric: "t", Start: 0}:      window(1, 2),
		{Device: "b", Metric: "t", Start: 60_000}: window(4),
	}, PTime: map[truth.SeriesKey]*truth.Series{}}
	o := CompareOptions{Gateway: gw, Aggregates: all}
	r := v.Compare(exp, o)
	if r.Windows.Overcounted != 1 || r.Complete() || !r.Settled(o) {
		t.Fatalf("windows %+v: want one overcounted window that settles the wait", r.Windows)
	}
	o.AtLeastOnce = true
	if r.Settled(o) {
		t.Fatal("at least once, an extra reading may be a redelivery: the wait must go on")
	}
	if r := v.Compare(&truth.Expected{Windows: map[truth.Key]*truth.Window{{Device: "a", Metric: "t", Start: 0}: window(1, 2, 3, 4)},
		PTime: map[truth.SeriesKey]*truth.Series{}}, CompareOptions{Gateway: gw, Aggregates: all}); r.Windows.Overcounted != 0 || r.Settled(CompareOptions{}) {
		t.Fatalf("a window short of readings may still be revised: %+v", r.Windows)
	}
}

// TestHeldVerifierReadsAfterRelease: a verifier started with Hold reads
// nothing, though another consumer has read what the stream holds, until
// Release; then it reads it all, stamped with the time the stream stored
// it, as a verifier that read it live was.
func TestHeldVerifierReadsAfterRelease(t *testing.T) {
	n := startNATS(t)
	held, err := Start(context.Background(), Config{URL: n.URL(), Stream: stream, Subject: subject, Hold: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { held.Close() })
	live := startVerifier(t, n.URL())

	a := agg("d1", "t", 0, 1, 1, 2)
	publish(t, n.URL(), "b1", a)
	publishedAndDrained(t, live, 1)
	if p := held.Progress(); p.Messages != 0 || p.Aggregates != 0 {
		t.Fatalf("held verifier consumed before its release: %+v", p)
	}

	released := time.Now()
	held.Release()
	held.Release() // a second call is harmless
	publishedAndDrained(t, held, 1)

	arrivedAt := func(v *Verifier) time.Time {
		t.Helper()
		v.mu.Lock()
		defer v.mu.Unlock()
		r := v.windows[WindowID{gw, "d1", "t", 0}]
		if r == nil || len(r.revs) != 1 {
			t.Fatalf("window d1/t/0: %+v, want one arrival", r)
		}
		return r.revs[0].at
	}
	heldAt, liveAt := arrivedAt(held), arrivedAt(live)
	if !heldAt.Before(released) {
		t.Errorf("held verifier stamped the arrival %v, after its release at %v: its read time, not the stream's", heldAt, released)
	}
	if !heldAt.Equal(liveAt) {
		t.Errorf("arrival stamped %v by the held verifier and %v by the live one; both should be the stream's", heldAt, liveAt)
	}
}
