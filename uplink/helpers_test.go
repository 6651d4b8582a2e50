package uplink

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/uplink/internal/synthetic"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

const testGateway = "gw-t"

// testLogger discards unless EDGEAGENT_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("EDGEAGENT_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// openDB opens a real state database in a temporary directory and checks its
// consistency when the test ends.
func openDB(t testing.TB) *bolt.DB {
	t.Helper()
	return openDBAt(t, filepath.Join(t.TempDir(), "state.db"))
}

func openDBAt(t testing.TB, path string) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("open state db: %v", err)
	}
	if err := db.Update(Init); err != nil {
		t.Fatalf("init: %v", err)
	}
	t.Cleanup(func() {
		if err := db.View(func(tx *bolt.Tx) error {
			for err := range tx.Check() {
				return err
			}
			return nil
		}); err != nil {
			t.Errorf("state db inconsistent: %v", err)
		}
		if err := db.Close(); err != nil {
			t.Errorf("close state db: %v", err)
		}
	})
	return db
}

// row is one outbox row to append.
type row struct {
	kind      outbox.Kind
	emittedAt int64
	data      []byte
}

// fixture is what a window stage would have emitted, in outbox order:
// aggregates window after window, revisions of earlier windows (late data),
// alerts, and local rows the uplink must leave alone.
type fixture struct {
	rows   []row
	aggs   int // aggregate rows, revisions included
	alerts int
	locals int
}

func makeFixture(t testing.TB, devices, windows int) fixture {
	t.Helper()
	g := synthetic.New(testGateway, devices, 42)
	var fx fixture
	add := func(kind outbox.Kind, at int64, data []byte) {
		fx.rows = append(fx.rows, row{kind, at, data})
		switch kind {
		case outbox.KindAggregate:
			fx.aggs++
		case outbox.KindAlert:
			fx.alerts++
		case outbox.KindLocal:
			fx.locals++
		}
	}
	perWindow := devices * len(g.Metrics)
	var prev []wire.Aggregate
	for w := 0; w < windows; w++ {
		cur := g.Take(perWindow)
		emitted := cur[0].End + 5_000
		for i := range cur {
			add(outbox.KindAggregate, emitted, mustEncode(t, &cur[i]))
			if i%97 == 0 {
				add(outbox.KindLocal, emitted, []byte(fmt.Sprintf("local %d/%d", w, i)))
			}
		}
		// Late data revises every seventh window of the previous minute.
		for i := 0; i < len(prev); i += 7 {
			r := prev[i]
			r.Rev++
			r.Count++
			r.Sum = wire.F(*r.Sum + *r.Last)
			r.Mean = wire.F(*r.Sum / float64(r.Count))
			r.Key = wire.AggregateKey(testGateway, r.Device, r.Metric, r.Start, r.Rev)
			add(outbox.KindAggregate, emitted, mustEncode(t, &r))
		}
		if w%2 == 1 {
			a := wire.Alert{Rule: "hot", Device: cur[0].Device, Metric: cur[0].Metric, Start: cur[0].Start,
				State: "fired", Severity: "warning", Value: *cur[0].Max,
				Key: fmt.Sprintf("%s/hot/%s/%d/fired", testGateway, cur[0].Device, cur[0].Start)}
			raw, err := wire.EncodeAlert(&a)
			if err != nil {
				t.Fatal(err)
			}
			add(outbox.KindAlert, emitted, raw)
		}
		prev = cur
	}
	return fx
}

func mustEncode(t testing.TB, a *wire.Aggregate) []byte {
	t.Helper()
	raw, err := wire.EncodeAggregate(a)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// fill appends rows to the outbox, chunk rows a transaction, as the window
// stage commits them.
func fill(t testing.TB, db *bolt.DB, rows []row, chunk int) {
	t.Helper()
	for len(rows) > 0 {
		n := min(chunk, len(rows))
		if err := db.Update(func(tx *bolt.Tx) error {
			for _, r := range rows[:n] {
				if _, err := outbox.Append(tx, r.kind, r.emittedAt, r.data); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatalf("fill outbox: %v", err)
		}
		rows = rows[n:]
	}
}

// windowID is what a receiver upserts on.
type windowID struct {
	gateway, device, metric string
	start                   int64
}

// truth is the final state a correct receiver must reach: per window the
// highest revision, and every alert.
type truth struct {
	windows map[windowID]wire.Aggregate
	alerts  map[string]wire.Alert
	locals  []string
}

func (fx fixture) truth(t testing.TB) truth {
	t.Helper()
	tr := truth{windows: map[windowID]wire.Aggregate{}, alerts: map[string]wire.Alert{}}
	for _, r := range fx.rows {
		switch r.kind {
		case outbox.KindAggregate:
			var a wire.Aggregate
			if err := wire.DecodeAggregate(r.data, &a); err != nil {
				t.Fatal(err)
			}
			id := windowID{testGateway, a.Device, a.Metric, a.Start}
			if old, ok := tr.windows[id]; !ok || a.Rev > old.Rev {
				tr.windows[id] = a
			}
		case outbox.KindAlert:
			var a wire.Alert
			if err := wire.DecodeAlert(r.data, &a); err != nil {
				t.Fatal(err)
			}
			tr.alerts[a.Key] = a
		case outbox.KindLocal:
			tr.locals = append(tr.locals, string(r.data))
		}
	}
	return tr
}

// receiver is a cloud backend following the documented rule: upsert on
// (gateway, device, metric, start), keep the highest rev.
type receiver struct {
	windows map[windowID]wire.Aggregate
	alerts  map[string]wire.Alert
	// batches counts bodies per batch id; aggregates counts deliveries per
	// aggregate key, duplicates included.
	batches    map[string]int
	aggregates map[string]int
}

func newReceiver() *receiver {
	return &receiver{windows: map[windowID]wire.Aggregate{}, alerts: map[string]wire.Alert{},
		batches: map[string]int{}, aggregates: map[string]int{}}
}

func (r *receiver) take(t testing.TB, b *wire.Batch) {
	t.Helper()
	if b.Gateway != testGateway || b.V != wire.Version {
		t.Fatalf("batch %s: gateway %q version %d", b.Batch, b.Gateway, b.V)
	}
	r.batches[b.Batch]++
	for _, a := range b.Aggregates {
		r.aggregates[a.Key]++
		id := windowID{b.Gateway, a.Device, a.Metric, a.Start}
		if old, ok := r.windows[id]; !ok || a.Rev > old.Rev {
			r.windows[id] = a
		}
	}
	for _, a := range b.Alerts {
		r.alerts[a.Key] = a
	}
}

// check compares the receiver's state with the truth: every window exactly
// once with the values of its highest revision, and every alert.
func (r *receiver) check(t testing.TB, tr truth) {
	t.Helper()
	if len(r.windows) != len(tr.windows) {
		t.Errorf("receiver holds %d windows, want %d", len(r.windows), len(tr.windows))
	}
	bad := 0
	for id, want := range tr.windows {
		got, ok := r.windows[id]
		if !ok || !reflect.DeepEqual(got, want) {
			if bad++; bad <= 3 {
				t.Errorf("window %+v:\n got %+v (present %v)\nwant %+v", id, got, ok, want)
			}
		}
	}
	if !reflect.DeepEqual(r.alerts, tr.alerts) {
		t.Errorf("receiver holds %d alerts, want %d", len(r.alerts), len(tr.alerts))
	}
}

// duplicateBatches lists batch ids that arrived more than once.
func (r *receiver) duplicateBatches() []string {
	var d []string
	for id, n := range r.batches {
		if n > 1 {
			d = append(d, id)
		}
	}
	sort.Strings(d)
	return d
}

// checkOutboxLeft asserts the uplink left exactly the local rows, and no
// sealed batch, behind.
func checkOutboxLeft(t testing.TB, db *bolt.DB, tr truth) {
	t.Helper()
	var locals []string
	var bl Backlog
	if err := db.View(func(tx *bolt.Tx) error {
		rows, err := outbox.Read(tx, 0, 1<<30)
		if err != nil {
			return err
		}
		for _, e := range rows {
			if e.Kind != outbox.KindLocal {
				return fmt.Errorf("row %d of kind %d left in the outbox", e.Seq, e.Kind)
			}
			locals = append(locals, string(e.Data))
		}
		bl, err = ReadBacklog(tx)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(locals, tr.locals) {
		t.Errorf("outbox holds %d local rows, want the %d appended", len(locals), len(tr.locals))
	}
	if bl.Batches != 0 || bl.Bytes != 0 {
		t.Errorf("sealed backlog left: %+v", bl)
	}
}

// drained reports, from one consistent view, that no uplink row and no
// sealed batch is left.
func drained(t testing.TB, db *bolt.DB) bool {
	t.Helper()
	done := false
	if err := db.View(func(tx *bolt.Tx) error {
		rows, err := outbox.Read(tx, 0, 1<<30)
		if err != nil {
			return err
		}
		for _, e := range rows {
			if e.Kind != outbox.KindLocal {
				return nil
			}
		}
		bl, err := ReadBacklog(tx)
		done = bl.Batches == 0
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return done
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond) // polling the condition
	}
}

// started is an Uplink running in the background until the test ends.
type started struct {
	*Uplink
	runErr chan error
}

// startUplink runs an uplink until the test ends; hooks adjust it before Run.
func startUplink(t testing.TB, db *bolt.DB, cfg Config, hooks ...func(*Uplink)) *started {
	t.Helper()
	if cfg.Gateway == "" {
		cfg.Gateway = testGateway
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	u, err := New(db, cfg)
	if err != nil {
		t.Fatalf("new uplink: %v", err)
	}
	for _, h := range hooks {
		h(u)
	}
	s := &started{Uplink: u, runErr: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.runErr <- u.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		if err := u.Close(); err != nil {
			t.Errorf("close uplink: %v", err)
		}
		wg.Wait()
		if err := <-s.runErr; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	return s
}

// waitDelivered waits until every aggregate and alert of fx is acknowledged.
func (s *started) waitDelivered(t testing.TB, fx fixture, d time.Duration) {
	t.Helper()
	waitFor(t, d, fmt.Sprintf("%d aggregates and %d alerts acknowledged", fx.aggs, fx.alerts), func() bool {
		st := s.Stats()
		return st.AggregatesSent == uint64(fx.aggs) && st.AlertsSent == uint64(fx.alerts) && st.SealedBatches == 0
	})
	st := s.Stats()
	if st.AggregatesSent != uint64(fx.aggs) {
		t.Fatalf("acknowledged %d aggregates, want %d", st.AggregatesSent, fx.aggs)
	}
}

// waitAckTimeout waits until a batch's ack has failed to come.
func (s *started) waitAckTimeout(t *testing.T) {
	t.Helper()
	waitFor(t, 10*time.Second, "an ack timeout", func() bool { return s.Stats().AckTimeouts > 0 })
}
