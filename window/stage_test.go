package window

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// telemetry builds a telemetry message for device dev with event time et,
// received at recv.
func telemetry(dev, id string, et, recv time.Time, v float64) buffer.Record {
	return msg("sensors/"+dev+"/telemetry", fmt.Sprintf(`{"id":%q,"ts":%d,"temp":%v}`, id, et.UnixMilli(), v), recv)
}

// stepper appends records to Bronze and steps the stage over them.
type stepper struct {
	t  *testing.T
	db *bolt.DB
	br *buffer.Bronze
	s  *Stage
}

func newStepper(t *testing.T, cfg Config) *stepper {
	db, br := openDB(t, "", true), openBronze(t, "")
	s, err := New(db, br, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &stepper{t, db, br, s}
}

// restart opens a new stage on the stepper's files with cfg, as a restart
// of the agent would.
func (p *stepper) restart(cfg Config) {
	p.t.Helper()
	s, err := New(p.db, p.br, cfg)
	if err != nil {
		p.t.Fatal(err)
	}
	p.s = s
}

// feed appends recs and processes them, returning the aggregates emitted.
func (p *stepper) feed(recs ...buffer.Record) []wire.Aggregate {
	p.t.Helper()
	before := len(readOutbox(p.t, p.db))
	appendAll(p.t, p.br, recs)
	for {
		res, err := p.s.Step()
		if err != nil {
			p.t.Fatal(err)
		}
		if res.Records == 0 {
			break
		}
	}
	return decodeOutbox(p.t, p.db)[before:]
}

func TestEmissionByWatermark(t *testing.T) {
	cfg := testConfig(t) // size 1m, delay 5s
	p := newStepper(t, cfg)
	w0 := t0 // window [12:00, 12:01)
	if got := p.feed(telemetry("d1", "1", w0.Add(10*time.Second), w0.Add(10*time.Second), 1),
		telemetry("d1", "2", w0.Add(50*time.Second), w0.Add(50*time.Second), 3)); len(got) != 0 {
		t.Fatalf("emitted before the watermark passed: %v", got)
	}
	// max event time 12:01:04.999 → watermark 12:00:59.999 < end
	if got := p.feed(telemetry("d1", "3", w0.Add(64999*time.Millisecond), w0.Add(65*time.Second), 5)); len(got) != 0 {
		t.Fatalf("emitted with the watermark 1ms before the end: %v", show(got[0]))
	}
	// the watermark reaches the end exactly: emitted now
	got := p.feed(telemetry("d1", "4", w0.Add(65*time.Second), w0.Add(65*time.Second), 7))
	if len(got) != 1 {
		t.Fatalf("emitted %d aggregates when the watermark reached the end, want 1", len(got))
	}
	a := got[0]
	if a.Start != w0.UnixMilli() || a.End != w0.Add(time.Minute).UnixMilli() || a.Rev != 1 || a.Count != 2 || *a.Sum != 4 ||
		*a.Min != 1 || *a.Max != 3 || *a.Mean != 2 || *a.First != 1 || *a.Last != 3 || a.ProcTime ||
		a.Key != wire.AggregateKey("gw1", "d1", "temp", w0.UnixMilli(), 1) {
		t.Errorf("aggregate %s key %s", show(a), a.Key)
	}
}

func TestIdleCloseAndRevisionsPerTick(t *testing.T) {
	cfg := testConfig(t) // idle 2m, lateness 30s, trigger 1s
	p := newStepper(t, cfg)
	w := t0
	p.feed(telemetry("d1", "1", w.Add(10*time.Second), w.Add(10*time.Second), 1))
	// silent for just under idle_timeout: nothing
	if got := p.feed(tick(w.Add(10*time.Second + cfg.IdleTimeout - time.Millisecond))); len(got) != 0 {
		t.Fatalf("idle-closed early: %v", show(got[0]))
	}
	got := p.feed(tick(w.Add(10*time.Second + cfg.IdleTimeout)))
	if len(got) != 1 || got[0].Rev != 1 || got[0].Count != 1 {
		t.Fatalf("idle close emitted %v", got)
	}
	// The device is back with two readings for the idle-closed window
	// (accepted: its watermark has not moved) within one tick interval:
	// no emission until the logged clock crosses a trigger boundary, then
	// exactly one revision.
	back := w.Add(3 * time.Minute).Add(100 * time.Millisecond)
	if got := p.feed(telemetry("d1", "2", w.Add(20*time.Second), back, 2),
		telemetry("d1", "3", w.Add(30*time.Second), back.Add(300*time.Millisecond), 4)); len(got) != 0 {
		t.Fatalf("revision emitted before the trigger boundary: %v", show(got[0]))
	}
	if st := p.s.Stats(); st.PendingRevisions != 1 {
		t.Errorf("pending revisions %d, want 1", st.PendingRevisions)
	}
	got = p.feed(tick(back.Add(time.Second)))
	if len(got) != 1 || got[0].Rev != 2 || got[0].Count != 3 || *got[0].Sum != 7 || *got[0].Last != 4 {
		t.Fatalf("revision: %v", got)
	}
	// the idle-closed window stays in state for more revisions until the
	// watermark passes end + lateness
	if st := p.s.Stats(); st.OpenWindows != 1 {
		t.Errorf("open windows %d, want 1 (kept for revisions)", st.OpenWindows)
	}
	p.feed(telemetry("d1", "4", w.Add(60*time.Second+35*time.Second), back.Add(2*time.Second), 0)) // wm = 12:01:30 = end + lateness
	if st := p.s.Stats(); st.OpenWindows != 1 {                                                    // only the new window [12:01, 12:02)
		t.Errorf("open windows %d after the watermark passed end+lateness, want 1", st.OpenWindows)
	}
	late := p.feed(telemetry("d1", "5", w.Add(40*time.Second), back.Add(3*time.Second), 9))
	if len(late) != 0 {
		t.Fatalf("a final window was revised: %v", late)
	}
	rows := readLate(t, p.db)
	if len(rows) != 1 || rows[0].Seq != 8 || rows[0].WindowStart != w.UnixMilli() || rows[0].Value != 9 ||
		rows[0].Watermark != w.Add(90*time.Second).UnixMilli() || rows[0].EventTime != w.Add(40*time.Second).UnixMilli() {
		t.Errorf("late rows %+v", rows)
	}
}

// TestIdleClosesAFleetInPortions: a clock advance closes at most about
// idleCloseMax windows of idle devices; the rest close at the next
// advance, and a device that speaks before its turn is not idle any more.
func TestIdleClosesAFleetInPortions(t *testing.T) {
	defer func(was int) { idleCloseMax = was }(idleCloseMax)
	idleCloseMax = 3
	cfg := testConfig(t) // idle 2m
	p := newStepper(t, cfg)
	for i := range 5 {
		at := t0.Add(time.Duration(i) * time.Millisecond)
		p.feed(telemetry(fmt.Sprintf("d%d", i+1), "1", t0.Add(10*time.Second), at, float64(i)))
	}
	devices := func(aggs []wire.Aggregate) (names []string) {
		for _, a := range aggs {
			names = append(names, a.Device)
		}
		return names
	}
	idle := t0.Add(time.Second + cfg.IdleTimeout)
	if got := devices(p.feed(tick(idle))); !slices.Equal(got, []string{"d1", "d2", "d3"}) {
		t.Fatalf("first advance past the idle timeout closed %v, want the three silent longest", got)
	}
	// d4 speaks before its turn (received at the same logged instant, so
	// no clock advance comes before its reading): its window stays open.
	if got := p.feed(telemetry("d4", "2", t0.Add(20*time.Second), idle, 10)); len(got) != 0 {
		t.Fatalf("d4's reading emitted %v", devices(got))
	}
	if got := devices(p.feed(tick(idle.Add(time.Second)))); !slices.Equal(got, []string{"d5"}) {
		t.Fatalf("second advance closed %v, want d5 (d4 is not idle any more)", got)
	}
	got := p.feed(tick(idle.Add(cfg.IdleTimeout)))
	if len(got) != 1 || got[0].Device != "d4" || got[0].Count != 2 || got[0].Rev != 1 {
		t.Fatalf("d4's idle close emitted %v, want its window once with both readings", devices(got))
	}
}

func TestDeviceExpiryAndCap(t *testing.T) {
	var logs captureLog
	cfg := testConfig(t)
	cfg.DeviceExpiry = time.Hour
	cfg.MaxDevices = 1
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	p := newStepper(t, cfg)
	p.feed(telemetry("d1", "1", t0, t0, 1))
	if got := p.feed(telemetry("d2", "1", t0, t0.Add(time.Second), 1)); len(got) != 0 {
		t.Fatal("second device accepted over max_devices")
	}
	p.feed(telemetry("d3", "1", t0, t0.Add(2*time.Second), 1))
	if n := strings.Count(logs.String(), "max_devices reached"); n != 1 {
		t.Errorf("cap logged %d times over two consecutive batches, want once:\n%s", n, logs.String())
	}
	p.feed(tick(t0.Add(time.Hour)))
	st := p.s.Stats()
	if st.Devices != 0 || st.DevicesExpired != 1 || st.OpenWindows != 0 || st.DedupEntries != 0 || st.Tombstones != 1 {
		t.Fatalf("after expiry: %+v", st)
	}
	// d2 now fits under the cap
	p.feed(telemetry("d2", "2", t0.Add(time.Hour), t0.Add(time.Hour+time.Second), 1))
	if st := p.s.Stats(); st.Devices != 1 || st.DeadLetters[CodeTooManyDevices] != 2 {
		t.Fatalf("d2 after expiry: devices %d, too-many counter %d", st.Devices, st.DeadLetters[CodeTooManyDevices])
	}
	// d1 returns with a reading for its emitted window: it is late (not a
	// rev 1 with other content), while a new window is fine once d2 expires.
	p.feed(tick(t0.Add(2*time.Hour + 2*time.Second)))
	got := p.feed(telemetry("d1", "9", t0.Add(30*time.Second), t0.Add(2*time.Hour+3*time.Second), 5))
	if len(got) != 0 {
		t.Fatalf("returning device re-emitted an old window: %v", show(got[0]))
	}
	if rows := readLate(t, p.db); len(rows) != 1 || rows[0].Device != "d1" {
		t.Fatalf("late rows %+v", rows)
	}
	for _, a := range upsert(t, decodeOutbox(t, p.db)) {
		if a.Device == "d1" && a.Count != 1 {
			t.Errorf("d1 window changed: %s", show(a))
		}
	}
}

func TestFingerprint(t *testing.T) {
	db, br := openDB(t, "", true), openBronze(t, "")
	cfg := testConfig(t)
	if _, err := New(db, br, cfg); err != nil {
		t.Fatal(err)
	}
	// compatible changes are accepted, the aggregates in another order too
	ok := cfg
	ok.Aggregates = slices.Clone(AllAggregates)
	slices.Reverse(ok.Aggregates)
	ok.AllowedLateness = time.Minute
	ok.WatermarkDelay = 0
	ok.IdleTimeout = 5 * time.Minute
	ok.Metrics = []string{"temp"}
	if _, err := New(db, br, ok); err != nil {
		t.Fatalf("compatible change refused: %v", err)
	}
	bad := cfg
	bad.Size = 5 * time.Minute
	bad.EventID = "msg_id"
	bad.Aggregates = []string{"max", "count"}
	bad.ConfigPath = "/etc/edgeagent/edgeagent.yaml"
	_, err := New(db, br, bad)
	if !errors.Is(err, ErrIncompatibleState) {
		t.Fatalf("New with a new window size = %v, want ErrIncompatibleState", err)
	}
	for _, want := range []string{"window.size changed from 1m0s to 5m0s", "window.slide changed from 1m0s to 5m0s",
		"readings.event_id changed from id to msg_id", "window.aggregates changed from count,sum,min,max,mean,first,last to count,max",
		"edgeagent reset-state -c /etc/edgeagent/edgeagent.yaml"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if err := ResetState(db); err != nil {
		t.Fatal(err)
	}
	if _, err := New(db, br, bad); err != nil {
		t.Fatalf("after reset-state: %v", err)
	}
}

// A state saved before window.aggregates was in the fingerprint opens
// with any aggregates, which are then stored: changing them later is
// refused like any other fingerprint change.
func TestFingerprintWithoutAggregatesAdoptsThem(t *testing.T) {
	db, br := openDB(t, "", true), openBronze(t, "")
	cfg := testConfig(t)
	if _, err := New(db, br, cfg); err != nil {
		t.Fatal(err)
	}
	older := slices.DeleteFunc(cfg.fingerprint(), func(it fingerprintItem) bool { return it.Key == "window.aggregates" })
	if err := db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyFingerprint, encodeFingerprint(older))
	}); err != nil {
		t.Fatal(err)
	}
	fewer := cfg
	fewer.Aggregates = []string{"count", "mean"}
	if _, err := New(db, br, fewer); err != nil {
		t.Fatalf("a state saved before aggregates counted refused them: %v", err)
	}
	if _, err := New(db, br, cfg); !errors.Is(err, ErrIncompatibleState) || !strings.Contains(err.Error(), "window.aggregates changed from count,mean to") {
		t.Fatalf("New with other aggregates after they were adopted = %v, want ErrIncompatibleState naming window.aggregates", err)
	}
}

// TestStateFormat: a state of format 1 is adopted and stored as the
// current format, which a build of format 1 refuses (it would ignore the
// tombstone floor and restart a dropped device's emitted windows at rev
// 1, a key with two contents: a review's downgrade); a newer format is
// refused, naming reset-state.
func TestStateFormat(t *testing.T) {
	db, br := openDB(t, "", true), openBronze(t, "")
	cfg := testConfig(t)
	if _, err := New(db, br, cfg); err != nil {
		t.Fatal(err)
	}
	store := func(format string) {
		t.Helper()
		items := cfg.fingerprint()
		for i := range items {
			if items[i].Key == "state format" {
				items[i].Value = format
			}
		}
		if err := db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket(bucketMeta).Put(keyFingerprint, encodeFingerprint(items))
		}); err != nil {
			t.Fatal(err)
		}
	}
	stored := func() string {
		t.Helper()
		var v string
		if err := db.View(func(tx *bolt.Tx) error {
			items, err := decodeFingerprint(tx.Bucket(bucketMeta).Get(keyFingerprint))
			for _, it := range items {
				if it.Key == "state format" {
					v = it.Value
				}
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, older := range adoptedFormats {
		store(older)
		if _, err := New(db, br, cfg); err != nil {
			t.Fatalf("a state of format %s was refused: %v", older, err)
		}
		if got := stored(); got != stateFormat {
			t.Fatalf("the state's format is %q after a start on format %s, want %q", got, older, stateFormat)
		}
	}
	store("99")
	if _, err := New(db, br, cfg); !errors.Is(err, ErrIncompatibleState) || !strings.Contains(err.Error(), "state format changed from 99 to "+stateFormat) || !strings.Contains(err.Error(), "reset-state") {
		t.Fatalf("New on a newer state format = %v, want ErrIncompatibleState naming the format and reset-state", err)
	}
}

func TestResetStateRebuilds(t *testing.T) {
	cfg := testConfig(t)
	recs := genStream(21, cfg, genOpts{devices: 6, duration: 20 * time.Minute, period: 10 * time.Second, dupRate: 0.1, noIDRate: 0.2, lateRate: 0.05})
	db, br := openDB(t, "", true), openBronze(t, "")
	appendAll(t, br, recs)
	s, err := New(db, br, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, s)
	first := decodeOutbox(t, db)
	var high uint32
	for _, a := range first {
		high = max(high, a.Rev)
	}
	if err := ResetState(db); err != nil {
		t.Fatal(err)
	}
	if n := len(readLate(t, db)); n != 0 {
		t.Errorf("%d late rows after reset", n)
	}
	if got := len(readOutbox(t, db)); got != len(first) {
		t.Fatalf("reset changed the outbox: %d entries, had %d", got, len(first))
	}
	cfg2 := cfg
	cfg2.Size = 2 * time.Minute
	s2, err := New(db, br, cfg2)
	if err != nil {
		t.Fatal(err)
	}
	if st := s2.Stats(); st.Offset != 0 || st.OpenWindows != 0 {
		t.Fatalf("state after reset: %+v", st)
	}
	runToEnd(t, s2)
	rebuilt := decodeOutbox(t, db)[len(first):]
	for _, a := range rebuilt {
		if a.Rev <= high {
			t.Fatalf("rebuilt %s has rev %d, not above the floor %d", a.Key, a.Rev, high)
		}
	}
	checkAgainstReference(t, cfg2, recs, rebuilt, readLate(t, db), s2.Stats().Duplicates)
}

func TestReplay(t *testing.T) {
	// Live config: unix_ms, so readings carrying RFC 3339 strings are dead letters.
	live := testConfig(t)
	live.TimeFormat = TimeUnixMs
	db, br := openDB(t, "", true), openBronze(t, "")
	var recs []buffer.Record
	for i := range 40 {
		recv := t0.Add(time.Duration(i) * 5 * time.Second)
		if i%4 == 3 {
			recs = append(recs, msg("sensors/d1/telemetry", fmt.Sprintf(`{"id":"%d","ts":%q,"temp":%d}`, i, recv.Format(time.RFC3339Nano), i), recv))
		} else {
			recs = append(recs, telemetry("d1", fmt.Sprint(i), recv, recv, float64(i)))
		}
		if i%10 == 0 {
			recs = append(recs, recs[len(recs)-1]) // a redelivery
		}
	}
	recs = append(recs, tick(t0.Add(10*time.Minute)))
	appendAll(t, br, recs)
	s, err := New(db, br, live)
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, s)
	if n := s.Stats().DeadLetters[CodeTimeType]; n != 10 {
		t.Fatalf("%d time_type dead letters, want 10", n)
	}
	var high uint32
	for _, a := range decodeOutbox(t, db) {
		high = max(high, a.Rev)
	}
	before := len(readOutbox(t, db))

	fixed := live
	fixed.TimeFormat = TimeAuto
	res, err := Replay(db, br, fixed, t0.Add(time.Minute), t0.Add(3*time.Minute))
	n := res.Windows
	if err != nil {
		t.Fatal(err)
	}
	replayed := decodeOutbox(t, db)[before:]
	if n != 2 || len(replayed) != 2 {
		t.Fatalf("replay returned %d and emitted %d, want 2 windows ([12:01, 12:02), [12:02, 12:03))", n, len(replayed))
	}
	for k, a := range replayed {
		start := t0.Add(time.Duration(k+1) * time.Minute)
		// readings i = 12k+12 .. 12k+23, every one counted once now
		var sum float64
		for i := 12*k + 12; i < 12*k+24; i++ {
			sum += float64(i)
		}
		if a.Start != start.UnixMilli() || a.Rev != high+1 || a.Count != 12 || *a.Sum != sum || *a.First != float64(12*k+12) || *a.Last != float64(12*k+23) {
			t.Errorf("replayed %s, want start %v rev %d count 12 sum %v", show(a), start, high+1, sum)
		}
	}
	// The live stage continues above the replay's revisions.
	s, err = New(db, br, live)
	if err != nil {
		t.Fatal(err)
	}
	appendAll(t, br, []buffer.Record{telemetry("d1", "late", t0.Add(3*time.Minute+20*time.Second), t0.Add(10*time.Minute+time.Second), 100),
		tick(t0.Add(10*time.Minute + 3*time.Second))})
	runToEnd(t, s)
	after := decodeOutbox(t, db)[before+2:]
	if len(after) != 1 || after[0].Rev != high+2 {
		t.Fatalf("live revision after replay: %v", after)
	}
	// The time format could change for the replay; the window geometry
	// cannot: two-minute windows would take the one-minute windows'
	// identities (start) at the receiver.
	wider := fixed
	wider.Size, wider.Slide = 2*time.Minute, 2*time.Minute
	if _, err := Replay(db, br, wider, t0, t0.Add(4*time.Minute)); !errors.Is(err, ErrIncompatibleState) || !strings.Contains(err.Error(), "window.size changed from 1m0s to 2m0s") {
		t.Errorf("replay with another window size: %v, want ErrIncompatibleState naming window.size", err)
	}
	if n := len(decodeOutbox(t, db)); n != before+3 {
		t.Errorf("the refused replay wrote %d outbox rows", n-before-3)
	}
}

type captureLog struct{ bytes.Buffer }

func TestOutboxBackpressure(t *testing.T) {
	var logs captureLog
	cfg := testConfig(t)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	cfg.OutboxMaxBytes = 100
	cfg.MaxRecordsPerBatch = 2
	p := newStepper(t, cfg)
	appendAll(t, p.br, []buffer.Record{
		telemetry("d1", "1", t0, t0, 1), telemetry("d1", "2", t0.Add(2*time.Minute), t0.Add(2*time.Minute), 2),
		telemetry("d1", "3", t0.Add(4*time.Minute), t0.Add(4*time.Minute), 3), telemetry("d1", "4", t0.Add(6*time.Minute), t0.Add(6*time.Minute), 4),
	})
	res, err := p.s.Step()
	if err != nil || res.Records != 2 || res.Emitted != 1 {
		t.Fatalf("first step %+v, %v", res, err)
	}
	for range 2 {
		res, err = p.s.Step()
		if err != nil || !res.Blocked || res.Records != 0 || res.Offset != 2 {
			t.Fatalf("step over the bound: %+v, %v", res, err)
		}
	}
	st := p.s.Stats()
	if !st.Blocked || st.BlockedTotal != 1 || st.Offset != 2 {
		t.Errorf("stats while blocked: blocked %v total %d offset %d", st.Blocked, st.BlockedTotal, st.Offset)
	}
	if n := strings.Count(logs.String(), "outbox full"); n != 1 {
		t.Errorf("logged %d times while blocked, want once:\n%s", n, logs.String())
	}
	if err := p.s.RunOnce(); !errors.Is(err, ErrBlocked) {
		t.Errorf("RunOnce while blocked = %v", err)
	}
	// the uplink drains the outbox
	err = p.db.Update(func(tx *bolt.Tx) error {
		es, err := outbox.Read(tx, 0, 100)
		if err != nil {
			return err
		}
		for _, e := range es {
			if err := outbox.Delete(tx, e.Seq); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	res, err = p.s.Step()
	if err != nil || res.Blocked || res.Records != 2 || res.Offset != 4 {
		t.Fatalf("step after draining: %+v, %v", res, err)
	}
	if st := p.s.Stats(); st.Blocked || !strings.Contains(logs.String(), "consuming Bronze again") {
		t.Errorf("not unblocked: %v\n%s", st.Blocked, logs.String())
	}
}

// The bound counts what the OutboxBytes hook reports (the agent's counts
// sealed, unacknowledged uplink batches too), not only the outbox rows.
func TestOutboxBackpressureCountsSealedBatches(t *testing.T) {
	cfg := testConfig(t)
	cfg.OutboxMaxBytes = 1000
	var sealed atomic.Uint64
	sealed.Store(1000)
	cfg.OutboxBytes = func(tx *bolt.Tx) (uint64, error) {
		st, err := outbox.ReadStats(tx)
		return st.Bytes + sealed.Load(), err
	}
	p := newStepper(t, cfg)
	appendAll(t, p.br, []buffer.Record{telemetry("d1", "1", t0, t0, 1)})
	if res, err := p.s.Step(); err != nil || !res.Blocked || res.Records != 0 {
		t.Fatalf("step with sealed batches at the bound: %+v, %v", res, err)
	}
	sealed.Store(0) // the uplink got its acks
	if res, err := p.s.Step(); err != nil || res.Blocked || res.Records != 1 {
		t.Fatalf("step after the acks: %+v, %v", res, err)
	}
}

func TestRunUntilCancelled(t *testing.T) {
	cfg := testConfig(t)
	cfg.TriggerInterval = 5 * time.Millisecond
	p := newStepper(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.s.Run(ctx) }()
	var recs []buffer.Record
	for i := range 1200 { // several full batches of 500
		at := t0.Add(time.Duration(i) * time.Second)
		recs = append(recs, telemetry("d1", fmt.Sprint(i), at, at, float64(i)))
	}
	appendAll(t, p.br, recs)
	waitFor(t, 10*time.Second, "Run to consume Bronze", func() bool { return p.s.Stats().Offset == 1200 })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if st := p.s.Stats(); st.Emitted != 19 || st.Batches < 3 || p.br.Checkpoint() != 1200 {
		t.Errorf("emitted %d windows in %d batches, checkpoint %d", st.Emitted, st.Batches, p.br.Checkpoint())
	}
}

type failingObserver struct {
	fail bool
	seen []string
}

func (o *failingObserver) Emitted(tx *bolt.Tx, a *wire.Aggregate, at int64) error {
	if tx == nil || !tx.Writable() {
		return errors.New("not inside the batch transaction")
	}
	if o.fail {
		return errors.New("alert engine unavailable")
	}
	o.seen = append(o.seen, a.Key)
	return nil
}

func TestObserverAndFailedCommit(t *testing.T) {
	obs := &failingObserver{fail: true}
	cfg := testConfig(t)
	cfg.Observer = obs
	p := newStepper(t, cfg)
	appendAll(t, p.br, []buffer.Record{telemetry("d1", "1", t0, t0, 1), telemetry("d1", "2", t0.Add(2*time.Minute), t0.Add(2*time.Minute), 2)})
	if _, err := p.s.Step(); err == nil || !strings.Contains(err.Error(), "alert engine unavailable") {
		t.Fatalf("step with a failing observer = %v", err)
	}
	if st := p.s.Stats(); st.Offset != 0 || len(readOutbox(t, p.db)) != 0 || p.br.Checkpoint() != 0 {
		t.Fatalf("failed batch left traces: offset %d", st.Offset)
	}
	obs.fail = false
	res, err := p.s.Step()
	if err != nil || res.Records != 2 || res.Emitted != 1 {
		t.Fatalf("retried step %+v, %v", res, err)
	}
	want := wire.AggregateKey("gw1", "d1", "temp", t0.UnixMilli(), 1)
	if len(obs.seen) != 1 || obs.seen[0] != want {
		t.Errorf("observer saw %v, want [%s]", obs.seen, want)
	}
}

func TestConfiguredAggregatesAndProcTime(t *testing.T) {
	cfg := testConfig(t)
	cfg.Aggregates = []string{"count", "max", "last"}
	cfg.IdleTimeout = time.Minute
	p := newStepper(t, cfg)
	got := p.feed(msg("raw/d9/pressure", "5", t0.Add(time.Second)), msg("raw/d9/pressure", "5", t0.Add(2*time.Second)),
		tick(t0.Add(2*time.Second+time.Minute)))
	if len(got) != 1 {
		t.Fatalf("emitted %v", got)
	}
	a := got[0]
	if a.Metric != "pressure" || a.Count != 2 || !a.ProcTime || a.Sum != nil || a.Min != nil || a.Mean != nil || a.First != nil || *a.Max != 5 || *a.Last != 5 {
		t.Errorf("aggregate %s", show(a))
	}
}

func TestStatsLag(t *testing.T) {
	cfg := testConfig(t)
	now := t0.Add(time.Hour)
	cfg.Clock = func() time.Time { return now }
	p := newStepper(t, cfg)
	p.feed(telemetry("d1", "1", t0.Add(10*time.Second), t0.Add(11*time.Second), 1))
	st := p.s.Stats()
	if !st.LatestEventTime.Equal(t0.Add(10*time.Second)) || st.Lag != time.Hour-10*time.Second || !st.LoggedClock.Equal(t0.Add(11*time.Second)) {
		t.Errorf("latest %v lag %v clock %v", st.LatestEventTime, st.Lag, st.LoggedClock)
	}
	if st.Records != 1 || st.Readings != 1 || st.Devices != 1 || st.OpenWindows != 1 || st.DedupEntries != 1 || st.StateBytes <= 0 || st.Batches != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		key   string
		tweak func(*Config)
	}{
		{"gateway_id", func(c *Config) { c.Gateway = "" }},
		{"subscriptions", func(c *Config) { c.Subscriptions = nil }},
		{"{device}", func(c *Config) { c.Subscriptions[0].Template = mustTemplate(t, "a/{metric}") }},
		{"format", func(c *Config) { c.Subscriptions[0].Format = "xml" }},
		{"readings.time_format", func(c *Config) { c.TimeFormat = "unix_us" }},
		{"window.size", func(c *Config) { c.Size = 1500 * time.Microsecond }},
		{"window.slide", func(c *Config) { c.Slide = 2 * time.Minute }},
		{"window.aggregates", func(c *Config) { c.Aggregates = []string{"median"} }},
		{"window.allowed_lateness", func(c *Config) { c.AllowedLateness = -time.Second }},
		{"window.device_expiry", func(c *Config) { c.DeviceExpiry = time.Minute }},
		{"readings.metrics", func(c *Config) { c.Metrics = []string{"ts"} }},
		{"processing.trigger_interval", func(c *Config) { c.TriggerInterval = time.Microsecond }},
	}
	for _, c := range cases {
		cfg := testConfig(t)
		c.tweak(&cfg)
		err := cfg.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.key) {
			t.Errorf("%s: Validate = %v", c.key, err)
		}
	}
	if err := testConfig(t).Validate(); err != nil {
		t.Errorf("valid config refused: %v", err)
	}
}

func TestCollectAroundOnlyCheckpointsLargeForTheHeap(t *testing.T) {
	const mb = 1 << 20
	for _, c := range []struct {
		rows int
		live uint64
		want bool
	}{
		{19_999, 1 * mb, false},    // small checkpoint: never
		{100_000, 27 * mb, true},   // load mode: the transient is about what is live
		{100_000, 200 * mb, false}, // a large heap barely moves for it
		{20_000, 0, true},          // no figure for the live heap: by rows alone
	} {
		if got := collectAround(c.rows, c.live); got != c.want {
			t.Errorf("collectAround(%d rows, %d MB live) = %v, want %v", c.rows, c.live/mb, got, c.want)
		}
	}
	runtime.GC()
	if heapLive() == 0 {
		t.Error("heapLive() = 0 after a collection")
	}
}

// Bronze full of records the stage has processed but not checkpointed: no
// new record can arrive to carry the checkpoint, so an idle Step writes it,
// and Bronze has room again.
func TestIdleStepCheckpointsForAFullBronze(t *testing.T) {
	db := openDB(t, "", true)
	br, err := buffer.Open(filepath.Join(t.TempDir(), "bronze.db"), buffer.Options{MaxBytes: 4 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { br.Close() })
	cfg := testConfig(t)
	cfg.CheckpointInterval = time.Hour // only a full Bronze makes it due
	s, err := New(db, br, cfg)
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	var sent int
	for ; ; sent++ {
		r := telemetry("d1", fmt.Sprint(sent), base.Add(time.Duration(sent)*time.Second), base, 1)
		if err := br.Append([]buffer.Record{r}); errors.Is(err, buffer.ErrFull) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Step(); err != nil {
			t.Fatal(err)
		}
	}
	if sent == 0 || !br.Full() || br.Checkpoint() == s.Stats().Offset {
		t.Fatalf("setup: %d appended, full %v, checkpoint %d, processed %d", sent, br.Full(), br.Checkpoint(), s.Stats().Offset)
	}
	res, err := s.Step()
	if err != nil || res.Records != 0 {
		t.Fatalf("idle step: %+v, %v", res, err)
	}
	if got, want := br.Checkpoint(), s.Stats().Offset; got != want {
		t.Fatalf("after an idle step with Bronze full: checkpoint %d, want the processed offset %d", got, want)
	}
	r := telemetry("d1", "after", base.Add(time.Hour), base, 1)
	if err := br.Append([]buffer.Record{r}); err != nil {
		t.Fatalf("append after the checkpoint: %v", err)
	}
}

// A failing batch (here the observer; a full disk in the field) does not
// stop Run: it is retried with backoff, shown in Stats, and the batch goes
// through once the cause is gone.
func TestRunRetriesFailedBatches(t *testing.T) {
	obs := &lockedFailingObserver{}
	obs.fail.Store(true)
	cfg := testConfig(t)
	cfg.TriggerInterval = 5 * time.Millisecond
	cfg.Observer = obs
	p := newStepper(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run returned %v", err)
		}
	}()
	appendAll(t, p.br, []buffer.Record{telemetry("d1", "1", t0, t0, 1), telemetry("d1", "2", t0.Add(2*time.Minute), t0.Add(2*time.Minute), 2)})
	waitFor(t, 10*time.Second, "failures retried and shown", func() bool {
		st := p.s.Stats()
		return st.Failing && st.Failures >= 2 && strings.Contains(st.LastError, "alert engine unavailable")
	})
	if st := p.s.Stats(); st.Offset != 0 {
		t.Fatalf("a failed batch moved the offset to %d", st.Offset)
	}
	obs.fail.Store(false)
	waitFor(t, 10*time.Second, "the batch through after recovery", func() bool {
		st := p.s.Stats()
		return !st.Failing && st.LastError == "" && st.Offset == 2 && len(readOutbox(t, p.db)) == 1
	})
}

type lockedFailingObserver struct{ fail atomic.Bool }

func (o *lockedFailingObserver) Emitted(*bolt.Tx, *wire.Aggregate, int64) error {
	if o.fail.Load() {
		return errors.New("alert engine unavailable")
	}
	return nil
}

// Committed is called after a committed batch that emitted something (the
// uplink reads the outbox at once), and not after one that did not.
func TestCommittedHook(t *testing.T) {
	var calls int
	cfg := testConfig(t)
	cfg.Committed = func() { calls++ }
	p := newStepper(t, cfg)
	p.feed(telemetry("d1", "1", t0, t0, 1))
	if calls != 0 {
		t.Fatalf("Committed called %d times for a batch that emitted nothing", calls)
	}
	if aggs := p.feed(telemetry("d1", "2", t0.Add(2*time.Minute), t0.Add(2*time.Minute), 2)); len(aggs) != 1 || calls != 1 {
		t.Fatalf("%d aggregates emitted, Committed called %d times; want 1 and 1", len(aggs), calls)
	}
}

// A failed batch whose rollback also fails leaves the engine holding the
// batch's uncommitted effects: nothing may build on them or checkpoint
// them until a reload succeeds, after which the batch is redone and its
// aggregate is emitted once.
func TestStaleStageAfterAFailedRollback(t *testing.T) {
	obs := &failingObserver{fail: true}
	cfg := testConfig(t)
	cfg.Observer = obs
	p := newStepper(t, cfg)
	var saved []byte
	setCounters := func(v []byte) {
		t.Helper()
		err := p.db.Update(func(tx *bolt.Tx) error {
			m := tx.Bucket(bucketMeta)
			if v == nil {
				return m.Delete(keyCounters)
			}
			return m.Put(keyCounters, v)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := p.db.View(func(tx *bolt.Tx) error {
		saved = bytes.Clone(tx.Bucket(bucketMeta).Get(keyCounters))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	setCounters([]byte{0xff}) // the reload after the failed commit fails
	appendAll(t, p.br, []buffer.Record{telemetry("d1", "1", t0, t0, 1), telemetry("d1", "2", t0.Add(2*time.Minute), t0.Add(2*time.Minute), 2)})
	if _, err := p.s.Step(); err == nil || !strings.Contains(err.Error(), "alert engine unavailable") {
		t.Fatalf("step with a failing observer = %v", err)
	}
	obs.fail = false
	if _, err := p.s.Step(); err == nil {
		t.Fatal("a step ran on a stage whose rollback failed")
	}
	if err := p.s.Checkpoint(); err == nil {
		t.Fatal("a stage whose rollback failed wrote a checkpoint")
	}
	if n := len(readOutbox(t, p.db)); n != 0 || p.br.Checkpoint() != 0 {
		t.Fatalf("stale stage left %d outbox rows, checkpoint %d", n, p.br.Checkpoint())
	}
	setCounters(saved) // the state database is readable again
	if aggs := p.feed(); len(aggs) != 1 || aggs[0].Count != 1 {
		t.Fatalf("after the reload: %d aggregates %+v, want the batch redone once", len(aggs), aggs)
	}
}

// TestLostStateContinuesAboveBronzesRevisionFloor: Bronze keeps the highest
// committed revision; a state database lost (or moved aside when damaged)
// and rebuilt from Bronze sends every window above it, where the cloud's
// upsert takes them, not at revision 1, where it would keep the old ones.
// The floor is durable when the commit that holds the revision is, with
// no append after it: an audit lost the state after a clean stop, with the
// floor last written by the append before the revision, and the rebuilt
// windows went out on keys already sent, with other contents.
func TestLostStateContinuesAboveBronzesRevisionFloor(t *testing.T) {
	cfg := testConfig(t)
	recs := genStream(22, cfg, genOpts{devices: 4, duration: 15 * time.Minute, period: 10 * time.Second, lateRate: 0.1})
	bronzePath := filepath.Join(t.TempDir(), "bronze.db")
	br := openBronze(t, bronzePath)
	appendAll(t, br, recs)
	db, _ := runFresh(t, br, cfg)
	high := maxRev(decodeOutbox(t, db))
	if high < 2 {
		t.Fatalf("the stream made no revisions (highest %d): the test needs some", high)
	}
	if got := br.RevisionFloor(); got != high {
		t.Fatalf("Bronze's floor is %d after the run, want the highest revision %d", got, high)
	}
	// No append after the run: a reopened log reads the floor back.
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	br = openBronze(t, bronzePath)
	if got := br.RevisionFloor(); got != high {
		t.Fatalf("reopened Bronze's floor is %d, want %d", got, high)
	}

	fresh, _ := runFresh(t, br, cfg) // state.db lost
	rebuilt := decodeOutbox(t, fresh)
	if len(rebuilt) == 0 {
		t.Fatal("nothing rebuilt")
	}
	for _, a := range rebuilt {
		if a.Rev <= high {
			t.Fatalf("rebuilt %s has rev %d, not above Bronze's floor %d", a.Key, a.Rev, high)
		}
	}
	// The rebuilt stage records its own higher revisions before sending
	// them, for the next loss.
	if got, want := br.RevisionFloor(), maxRev(rebuilt); got != want {
		t.Fatalf("Bronze's floor is %d after the rebuild, want its highest revision %d", got, want)
	}
}

// TestReplayAfterLostStateGoesAboveTheFloor: a replay run on a state.db
// lost and not yet rebuilt numbers its revisions above Bronze's floor, not
// from the empty state's (a review: they landed on keys already sent).
func TestReplayAfterLostStateGoesAboveTheFloor(t *testing.T) {
	cfg := testConfig(t)
	br := openBronze(t, "")
	appendAll(t, br, genStream(24, cfg, genOpts{devices: 3, duration: 15 * time.Minute, period: 10 * time.Second, lateRate: 0.1}))
	db, _ := runFresh(t, br, cfg)
	high := maxRev(decodeOutbox(t, db))
	if br.RevisionFloor() != high || high == 0 {
		t.Fatalf("Bronze's floor %d, the outbox's highest revision %d", br.RevisionFloor(), high)
	}
	fresh := openDB(t, "", true)
	res, err := Replay(fresh, br, cfg, t0, t0.Add(15*time.Minute))
	if err != nil || res.Windows == 0 {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	for _, a := range decodeOutbox(t, fresh) {
		if a.Rev <= high {
			t.Fatalf("replayed %s at rev %d, not above Bronze's floor %d", a.Key, a.Rev, high)
		}
	}
}

// TestReplaySkipsWindowsBronzeNoLongerHoldsWhole: after Bronze trimmed
// its oldest records, a replay over the whole range skips the windows that
// may have had readings in them, and every window it does replay carries
// what the live stage's last revision did (an audit: a replay sent a
// window with 6 of its 15 readings, which replaced the whole one at the
// receiver).
func TestReplaySkipsWindowsBronzeNoLongerHoldsWhole(t *testing.T) {
	cfg := testConfig(t)
	recs := genStream(25, cfg, genOpts{devices: 3, duration: 90 * time.Minute, period: 10 * time.Second})
	now := time.Unix(0, recs[0].ReceivedAt) // the log was opened when the first arrived
	br, err := buffer.Open(filepath.Join(t.TempDir(), "bronze.db"), buffer.Options{Retention: 45 * time.Minute, Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { br.Close() })
	appendAll(t, br, recs)
	now = time.Unix(0, recs[len(recs)-1].ReceivedAt)
	db, s := runFresh(t, br, cfg)
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if n, err := br.Trim(0); err != nil || n == 0 {
		t.Fatalf("trimmed %d records: %v", n, err)
	}
	live := map[string]wire.Aggregate{} // device/metric/start → its last revision
	for _, a := range decodeOutbox(t, db) {
		k := fmt.Sprintf("%s/%s/%d", a.Device, a.Metric, a.Start)
		if a.Rev > live[k].Rev {
			live[k] = a
		}
	}
	fresh := openDB(t, "", true)
	res, err := Replay(fresh, br, cfg, t0, t0.Add(2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if res.Partial == 0 || res.Windows == 0 || res.WholeFrom.IsZero() {
		t.Fatalf("replay %+v: want windows replayed and windows skipped", res)
	}
	for _, a := range decodeOutbox(t, fresh) {
		want := live[fmt.Sprintf("%s/%s/%d", a.Device, a.Metric, a.Start)]
		if a.Start < res.WholeFrom.UnixMilli() || a.Count != want.Count || *a.Sum != *want.Sum {
			t.Fatalf("replayed %s count %d sum %v; the live stage's last revision had count %d sum %v (whole from %v)",
				a.Key, a.Count, *a.Sum, want.Count, *want.Sum, res.WholeFrom)
		}
	}
}

// floorGate wraps Bronze so a test can hold the stage inside
// SetRevisionFloor when it raises the floor.
type floorGate struct {
	*buffer.Bronze
	entered chan uint32
	release chan struct{}
	once    sync.Once
}

func (f *floorGate) SetRevisionFloor(rev uint32) error {
	if rev > f.Bronze.RevisionFloor() {
		f.once.Do(func() {
			f.entered <- rev
			<-f.release
		})
	}
	return f.Bronze.SetRevisionFloor(rev)
}

// TestRowsAboveTheFloorWaitForIt: a commit that raises the highest
// revision holds Config.SendGate until Bronze has recorded it, so the
// uplink, which reads the outbox under the gate, never sends a row above
// Bronze's floor (a state lost right then would rebuild onto its key).
func TestRowsAboveTheFloorWaitForIt(t *testing.T) {
	cfg := testConfig(t)
	var gate sync.RWMutex
	cfg.SendGate = &gate
	br := &floorGate{Bronze: openBronze(t, ""), entered: make(chan uint32), release: make(chan struct{})}
	appendAll(t, br.Bronze, genStream(23, cfg, genOpts{devices: 2, duration: 10 * time.Minute, period: 10 * time.Second}))
	db := openDB(t, "", true)
	s, err := New(db, br, cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		for {
			res, err := s.Step()
			if err != nil || res.Records == 0 {
				done <- err
				return
			}
		}
	}()
	select {
	case rev := <-br.entered:
		if len(decodeOutbox(t, db)) == 0 {
			t.Fatal("the floor is raised before the rows are committed")
		}
		if gate.TryRLock() {
			t.Fatalf("the outbox can be read while Bronze's floor is %d, below revision %d", br.Bronze.RevisionFloor(), rev)
		}
	case err := <-done:
		t.Fatalf("the stage finished (%v) without raising the floor", err)
	}
	close(br.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !gate.TryRLock() {
		t.Fatal("the gate is still held after the floor was recorded")
	}
	gate.RUnlock()
	if got, want := br.Bronze.RevisionFloor(), maxRev(decodeOutbox(t, db)); got != want {
		t.Fatalf("Bronze's floor is %d, want the outbox's highest revision %d", got, want)
	}
}

// failingFloor fails its first fails writes of a raised floor, as a
// Bronze whose disk fails would.
type failingFloor struct {
	*buffer.Bronze
	fails int
}

func (f *failingFloor) SetRevisionFloor(rev uint32) error {
	if rev > f.Bronze.RevisionFloor() && f.fails > 0 {
		f.fails--
		return errors.New("bronze: injected write failure")
	}
	return f.Bronze.SetRevisionFloor(rev)
}

// TestFailedFloorWriteKeepsTheGateShut: when recording a raised revision
// in Bronze fails after the commit, the rows stay unreadable (the gate
// stays shut) until a later Step records it (a review: the gate opened
// with the floor unrecorded, and the rows could be sent).
func TestFailedFloorWriteKeepsTheGateShut(t *testing.T) {
	cfg := testConfig(t)
	var gate sync.RWMutex
	cfg.SendGate = &gate
	br := &failingFloor{Bronze: openBronze(t, ""), fails: 2}
	appendAll(t, br.Bronze, genStream(23, cfg, genOpts{devices: 2, duration: 10 * time.Minute, period: 10 * time.Second}))
	db := openDB(t, "", true)
	s, err := New(db, br, cfg)
	if err != nil {
		t.Fatal(err)
	}
	shut := 0
	for steps := 0; br.fails > 0 || shut == 0; steps++ {
		if steps > 1000 {
			t.Fatalf("no Step left rows above an unrecorded floor (%d failures left)", br.fails)
		}
		if _, err := s.Step(); err != nil {
			t.Fatal(err)
		}
		if br.Bronze.RevisionFloor() < maxRev(decodeOutbox(t, db)) {
			if gate.TryRLock() {
				t.Fatalf("the outbox can be read with Bronze's floor %d below its revision %d", br.Bronze.RevisionFloor(), maxRev(decodeOutbox(t, db)))
			}
			shut++
		}
	}
	if _, err := s.Step(); err != nil { // the retry succeeds
		t.Fatal(err)
	}
	if !gate.TryRLock() {
		t.Fatal("the gate is still shut after the floor was recorded")
	}
	gate.RUnlock()
	if got, want := br.Bronze.RevisionFloor(), maxRev(decodeOutbox(t, db)); got < want {
		t.Fatalf("Bronze's floor %d is below the outbox's highest revision %d", got, want)
	}
}

func maxRev(aggs []wire.Aggregate) uint32 {
	var m uint32
	for _, a := range aggs {
		m = max(m, a.Rev)
	}
	return m
}

// TestCrashThenChangedSettings: a crash after outputs were written, and a
// restart with changed settings (trigger interval, watermark delay). The
// catch-up replays under the new settings, which decide emissions the
// written outputs do not hold: every key must still carry one content,
// revisions must only grow in outbox order, and the last must hold every
// reading (found by an audit: rev 2 went out twice with two contents, or
// rev 1 after rev 2).
func TestCrashThenChangedSettings(t *testing.T) {
	base := testConfig(t)
	base.Size, base.Slide = 10*time.Second, 10*time.Second
	base.WatermarkDelay, base.AllowedLateness = 0, time.Minute
	base.IdleTimeout, base.DeviceExpiry = 10*time.Minute, time.Hour
	checkpointNever(&base)
	for _, tc := range []struct {
		name           string
		before, change func(*Config)
		written        int  // aggregates of the window written before the crash
		lateAfter      bool // one more late reading for it after the restart
		// stopMid: the restarted stage checkpoints one record into the
		// catch-up (a shutdown there) and a third one finishes it.
		stopMid bool
	}{
		{"trigger interval", func(*Config) {}, func(c *Config) { c.TriggerInterval = 10 * time.Second }, 2, true, false},
		{"watermark delay", func(*Config) {}, func(c *Config) { c.WatermarkDelay = 10 * time.Second }, 2, true, false},
		// The catch-up emits what the old settings had not, and nothing
		// later revises it: it must still go out, not be taken for written.
		{"shorter watermark delay", func(c *Config) { c.WatermarkDelay = 10 * time.Second }, func(c *Config) { c.WatermarkDelay = 0 }, 0, false, false},
		{"shorter watermark delay, stopped mid catch-up", func(c *Config) { c.WatermarkDelay = 10 * time.Second }, func(c *Config) { c.WatermarkDelay = 0 }, 0, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := base
			tc.before(&base)
			db, br := openDB(t, "", true), openBronze(t, "")
			at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
			s, err := New(db, br, base)
			if err != nil {
				t.Fatal(err)
			}
			// Rev 1 (count 1), then a late reading and a trigger boundary:
			// rev 2 (count 2) is written. No checkpoint after either.
			appendAll(t, br, []buffer.Record{
				telemetry("d1", "1", at(1), at(20), 10), telemetry("d1", "2", at(15), at(20.5), 20),
			})
			stepToEnd(t, s)
			appendAll(t, br, []buffer.Record{telemetry("d1", "3", at(2), at(21.2), 30), tick(at(22.1))})
			stepToEnd(t, s)
			if got := decodeOutbox(t, db); len(got) != tc.written || tc.written == 2 && (got[1].Rev != 2 || got[1].Count != 2) {
				t.Fatalf("before the crash the outbox holds %v, want %d aggregates of the window", got, tc.written)
			}
			// The crash: s is dropped unflushed. The restart runs changed
			// settings; one more late reading, then the clock runs on.
			changed := base
			tc.change(&changed)
			s2, err := New(db, br, changed)
			if err != nil {
				t.Fatal(err)
			}
			if tc.stopMid {
				one := changed
				one.MaxRecordsPerBatch = 1
				s1, err := New(db, br, one)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := s1.Step(); err != nil {
					t.Fatal(err)
				}
				if err := s1.Checkpoint(); err != nil { // the shutdown's
					t.Fatal(err)
				}
				if s2, err = New(db, br, changed); err != nil {
					t.Fatal(err)
				}
			}
			if tc.lateAfter {
				appendAll(t, br, []buffer.Record{telemetry("d1", "5", at(3), at(23), 50)})
			}
			appendAll(t, br, []buffer.Record{telemetry("d1", "6", at(40), at(24), 60)})
			for i := range 6 {
				appendAll(t, br, []buffer.Record{tick(at(30 + 10*float64(i)))})
			}
			stepToEnd(t, s2)
			if err := s2.Flush(); err != nil {
				t.Fatal(err)
			}
			contents := map[string]string{}
			var lastRev uint32
			var last wire.Aggregate
			for _, a := range decodeOutbox(t, db) {
				if a.Start != t0.UnixMilli() {
					continue
				}
				if c, ok := contents[a.Key]; ok && c != show(a) {
					t.Errorf("key %s carries two contents: %s and %s", a.Key, c, show(a))
				}
				contents[a.Key] = show(a)
				if a.Rev <= lastRev {
					t.Errorf("rev %d after rev %d: the cloud keeps the stale one", a.Rev, lastRev)
				}
				lastRev, last = a.Rev, a
			}
			wantCount, wantSum := uint64(2), 40.0
			if tc.lateAfter {
				wantCount, wantSum = 3, 90
			}
			if last.Count != wantCount || last.Sum == nil || *last.Sum != wantSum {
				t.Errorf("the last revision is %s, want count %d, sum %g", show(last), wantCount, wantSum)
			}
		})
	}
}

// A late row reports the device's watermark. The lateness horizon only
// grows, so after a restart with a longer allowed lateness a reading can
// be late against the old horizon: the row said that horizon plus the new
// lateness, a watermark the device never had (found by an audit).
func TestLateRowWatermarkAfterLatenessChange(t *testing.T) {
	cfg := testConfig(t)
	cfg.Size, cfg.Slide = 10*time.Second, 10*time.Second
	cfg.WatermarkDelay, cfg.AllowedLateness = 0, time.Minute
	db, br := openDB(t, "", true), openBronze(t, "")
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	s, err := New(db, br, cfg)
	if err != nil {
		t.Fatal(err)
	}
	appendAll(t, br, []buffer.Record{telemetry("d1", "1", at(100), at(100), 1)})
	runToEnd(t, s)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	longer := cfg
	longer.AllowedLateness = 10 * time.Minute
	s2, err := New(db, br, longer)
	if err != nil {
		t.Fatal(err)
	}
	// Window [30s, 40s) ended at the old horizon (100s − 1m): still final.
	appendAll(t, br, []buffer.Record{telemetry("d1", "2", at(35), at(101), 2)})
	runToEnd(t, s2)
	rows := readLate(t, db)
	if len(rows) != 1 || rows[0].WindowStart != at(30).UnixMilli() {
		t.Fatalf("late rows %+v, want one for the window at 30s", rows)
	}
	if got, want := time.UnixMilli(rows[0].Watermark).UTC(), at(100); !got.Equal(want) {
		t.Errorf("late row's watermark %v, want the device's %v", got, want)
	}
}

// A backlog of large messages is read in batches bounded by bytes
// (buffer.ReadMaxBytes), not whole, and RunOnce still goes to the end:
// a short read is not the end of Bronze.
func TestRunOnceReadsLargeRecordsInByteBoundedBatches(t *testing.T) {
	db, br := openDB(t, "", true), openBronze(t, "")
	pad := strings.Repeat("x", 1<<20)
	const n = 20
	for i := range n {
		at := t0.Add(time.Duration(i) * time.Second)
		appendAll(t, br, []buffer.Record{msg("sensors/d1/telemetry", fmt.Sprintf(`{"id":"%d","ts":%d,"temp":%d,"pad":%q}`, i, at.UnixMilli(), i, pad), at)})
	}
	cfg := testConfig(t)
	cfg.MaxRecordsPerBatch = 1000
	s, err := New(db, br, cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Step()
	if err != nil {
		t.Fatal(err)
	}
	if res.Records >= n || !res.More {
		t.Fatalf("the first batch read %d records of 1 MiB (more: %v), want a byte-bounded part and more to come", res.Records, res.More)
	}
	runToEnd(t, s)
	if got := s.Stats().Records; got != n {
		t.Fatalf("RunOnce processed %d records, want all %d", got, n)
	}
}

// After a crash, a restart with a longer allowed lateness replays the
// records after the last checkpoint: a reading the old lateness sent to
// the late table now lands in its window. Its old late row is deleted, so
// the reading is in one place, not in the window and the table.
func TestCrashThenLongerLatenessListsAReadingOnce(t *testing.T) {
	cfg := testConfig(t)
	cfg.Size, cfg.Slide = 10*time.Second, 10*time.Second
	cfg.WatermarkDelay, cfg.AllowedLateness = 0, 10*time.Second
	cfg.IdleTimeout, cfg.DeviceExpiry = 10*time.Minute, time.Hour
	checkpointNever(&cfg)
	db, br := openDB(t, "", true), openBronze(t, "")
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	s, err := New(db, br, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Window [0s, 10s) gets a reading, the watermark passes its end plus
	// the lateness (40s > 10s + 10s), and then a reading for it is late.
	appendAll(t, br, []buffer.Record{
		telemetry("d1", "1", at(1), at(50), 10), telemetry("d1", "2", at(40), at(50.1), 20),
		telemetry("d1", "3", at(2), at(50.2), 30),
	})
	stepToEnd(t, s)
	if rows := readLate(t, db); len(rows) != 1 || rows[0].Value != 30 {
		t.Fatalf("before the crash the late table holds %+v, want the reading of 30", rows)
	}
	// The crash: s is dropped unflushed, nothing was checkpointed. The
	// restart allows a minute of lateness: window [0s, 10s) is open again
	// during the catch-up (end 10s + 1m after the watermark 40s).
	longer := cfg
	longer.AllowedLateness = time.Minute
	s2, err := New(db, br, longer)
	if err != nil {
		t.Fatal(err)
	}
	appendAll(t, br, []buffer.Record{tick(at(51))})
	runToEnd(t, s2)
	if rows := readLate(t, db); len(rows) != 0 {
		t.Errorf("after the catch-up the late table holds %+v, want none: the reading is in its window", rows)
	}
	var last wire.Aggregate
	for _, a := range decodeOutbox(t, db) {
		if a.Device == "d1" && a.Start == t0.UnixMilli() && a.Rev > last.Rev {
			last = a
		}
	}
	if last.Count != 2 || last.Sum == nil || *last.Sum != 40 {
		t.Errorf("window [0s, 10s) of d1 ends as %s, want count 2, sum 40", show(last))
	}
	if st := s2.Stats(); st.LateRows != 0 {
		t.Errorf("the stage counts %d late rows, want 0", st.LateRows)
	}
}

// A Step reads its batch a slice at a time: the whole batch is processed
// in the one Step and its one commit, but the array the stage keeps
// between Steps holds a slice's records, not a batch's, whether the
// records come from Bronze's in-memory tail or from its file.
func TestStepReadsItsBatchASliceAtATime(t *testing.T) {
	const n = 3*readSlice + 5
	recs := make([]buffer.Record, 0, n)
	for i := range n {
		at := t0.Add(time.Duration(i) * time.Second)
		recs = append(recs, msg("sensors/d1/telemetry", fmt.Sprintf(`{"id":"%d","ts":%d,"temp":%d}`, i, at.UnixMilli(), i), at))
	}
	for _, fromFile := range []bool{false, true} {
		t.Run(map[bool]string{false: "tail", true: "file"}[fromFile], func(t *testing.T) {
			var br *buffer.Bronze
			if fromFile {
				// Reopened, Bronze has no in-memory tail: reads come
				// from the file.
				br = openBronze(t, writeBronze(t, t.TempDir(), slices.Clone(recs)))
			} else {
				br = openBronze(t, "")
				appendAll(t, br, slices.Clone(recs))
			}
			cfg := testConfig(t)
			cfg.MaxRecordsPerBatch = 2*readSlice + 3
			s, err := New(openDB(t, "", true), br, cfg)
			if err != nil {
				t.Fatal(err)
			}
			res, err := s.Step()
			if err != nil {
				t.Fatal(err)
			}
			if res.Records != cfg.MaxRecordsPerBatch || !res.More {
				t.Fatalf("first Step read %d records (more: %v), want the batch bound %d and more to come", res.Records, res.More, cfg.MaxRecordsPerBatch)
			}
			// A slice's array, give or take the allocator rounding it up
			// to its size class (1,102 records on 32-bit ARM).
			if c := cap(s.recs); c > readSlice+readSlice/8 {
				t.Errorf("the stage keeps an array of %d records between Steps, want about a slice's %d", c, readSlice)
			}
			if res, err = s.Step(); err != nil {
				t.Fatal(err)
			}
			if want := n - cfg.MaxRecordsPerBatch; res.Records != want || res.More {
				t.Fatalf("second Step read %d records (more: %v), want the %d left and no more", res.Records, res.More, want)
			}
			if got := s.Stats().Records; got != n {
				t.Fatalf("processed %d records, want %d", got, n)
			}
		})
	}
}

// releaseRecorder is Bronze noting each ReleaseThrough of the stage.
type releaseRecorder struct {
	*buffer.Bronze
	calls []uint64
}

func (r *releaseRecorder) ReleaseThrough(seq uint64) {
	r.calls = append(r.calls, seq)
	r.Bronze.ReleaseThrough(seq)
}

// The stage releases the records it read as it goes, slice by slice, but
// not a dead letter's until the commit has written it: the dead letter's
// topic is the record's. What it wrote is intact although Bronze reused
// the arenas released before it.
func TestStageReleasesRecordsButPendingDeadLetters(t *testing.T) {
	src := &releaseRecorder{Bronze: openBronze(t, "")}
	var recs []buffer.Record
	at := t0
	for i := range 2500 {
		r := msg(fmt.Sprintf("sensors/dev%03d/telemetry", i%100), fmt.Sprintf(`{"id":"%d","ts":%d,"m0":1}`, i, at.UnixMilli()), at)
		if i == 1999 {
			r.Topic = "nowhere/dev007/x" // matches no subscription: a dead letter
		}
		recs = append(recs, r)
	}
	appendAll(t, src.Bronze, recs)
	cfg := testConfig(t)
	cfg.MaxRecordsPerBatch = 3000 // one Step, three slices
	db := openDB(t, "", true)
	s, err := New(db, src, cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Step()
	if err != nil {
		t.Fatal(err)
	}
	if res.Records != 2500 || res.DeadLetters != 1 {
		t.Fatalf("step: %d records, %d dead letters; want 2500 and 1", res.Records, res.DeadLetters)
	}
	want := []uint64{1024, 1999, 1999, 2500} // after each slice, then after the commit
	if !slices.Equal(src.calls, want) {
		t.Fatalf("released through %v, want %v", src.calls, want)
	}
	// Reuse the released arenas, then read what the commit wrote.
	appendAll(t, src.Bronze, recs)
	dead := readDead(t, db)
	if len(dead) != 1 || dead[0].Seq != 2000 || dead[0].Topic != "nowhere/dev007/x" {
		t.Fatalf("dead letters %+v, want one of seq 2000 on topic nowhere/dev007/x", dead)
	}
}

// After a failed commit the stage goes back to its checkpoint and reads
// the batch's records again: it first tells Bronze it holds none past the
// checkpoint, so Bronze stops counting the records it had released as
// free (their arenas would be reused as they leave the tail while the
// redone batch holds them).
func TestRollbackReleasesOnlyThroughTheCheckpoint(t *testing.T) {
	src := &releaseRecorder{Bronze: openBronze(t, "")}
	obs := &failingObserver{fail: true}
	cfg := testConfig(t)
	cfg.Observer = obs
	s, err := New(openDB(t, "", true), src, cfg)
	if err != nil {
		t.Fatal(err)
	}
	appendAll(t, src.Bronze, []buffer.Record{telemetry("d1", "1", t0, t0, 1), telemetry("d1", "2", t0.Add(2*time.Minute), t0.Add(2*time.Minute), 2)})
	if _, err := s.Step(); err == nil {
		t.Fatal("a step whose commit failed returned no error")
	}
	if want := []uint64{2, 0}; !slices.Equal(src.calls, want) {
		t.Fatalf("released through %v, want %v: the slice, then back to the checkpoint", src.calls, want)
	}
	obs.fail = false
	if res, err := s.Step(); err != nil || res.Records != 2 || res.Emitted != 1 {
		t.Fatalf("the redone batch: %+v, %v; want its 2 records and 1 aggregate", res, err)
	}
	if last := src.calls[len(src.calls)-1]; last != 2 {
		t.Fatalf("released through %d after the redone batch, want 2", last)
	}
}

// A batch ends after the slice whose records took its emissions to
// maxBatchEmissions: a fleet whose windows close together would otherwise
// hold every device's aggregates, and their outbox rows, until one commit.
// The next Step goes on where it stopped, and nothing is lost or doubled.
func TestBatchEndsAtTheEmissionBound(t *testing.T) {
	const devices = maxBatchEmissions + 2*readSlice
	cfg := testConfig(t) // size 1m, delay 5s
	cfg.MaxRecordsPerBatch = 2 * devices
	p := newStepper(t, cfg)
	opening := make([]buffer.Record, 0, devices)
	closing := make([]buffer.Record, 0, devices)
	for i := range devices {
		dev := fmt.Sprintf("d%05d", i)
		opening = append(opening, telemetry(dev, "1", t0.Add(10*time.Second), t0.Add(10*time.Second), float64(i)))
		// 70s: the device's watermark passes its first window's end.
		closing = append(closing, telemetry(dev, "2", t0.Add(70*time.Second), t0.Add(70*time.Second), 1))
	}
	if got := p.feed(opening...); len(got) != 0 {
		t.Fatalf("%d aggregates emitted before any watermark passed a window's end", len(got))
	}
	appendAll(t, p.br, closing)
	res, err := p.s.Step()
	if err != nil {
		t.Fatal(err)
	}
	if res.Emitted < maxBatchEmissions || res.Emitted >= maxBatchEmissions+readSlice || !res.More {
		t.Fatalf("first Step emitted %d aggregates from %d records (more: %v), want the batch to end after the slice that reached %d, with more to come",
			res.Emitted, res.Records, res.More, maxBatchEmissions)
	}
	first := res.Emitted
	if res, err = p.s.Step(); err != nil {
		t.Fatal(err)
	}
	if res.Emitted != devices-first || res.Records != devices-first {
		t.Fatalf("second Step emitted %d aggregates from %d records, want the %d left", res.Emitted, res.Records, devices-first)
	}
	got := upsert(t, decodeOutbox(t, p.db))
	if len(got) != devices {
		t.Fatalf("%d windows in the outbox, want one for each of the %d devices", len(got), devices)
	}
	for _, a := range got {
		if a.Rev != 1 || a.Count != 1 {
			t.Fatalf("aggregate %s, want revision 1 of one reading", show(a))
		}
	}
}

// Checkpoints are counted by what made them due: the interval on the
// stage's clock, a stop; none while neither holds, and none for a stop
// with nothing to write.
func TestCheckpointsCountedByReason(t *testing.T) {
	now := t0
	cfg := testConfig(t)
	cfg.Clock = func() time.Time { return now }
	cfg.CheckpointInterval = 10 * time.Second
	p := newStepper(t, cfg)
	want := map[string]uint64{"interval": 0, "delta": 0, "caught_up": 0, "bronze_full": 0, "stop": 0}
	check := func(when string) {
		t.Helper()
		if got := p.s.Stats().Checkpoints; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: checkpoints %v, want %v", when, got, want)
		}
	}
	p.feed(telemetry("d1", "1", t0, now, 1))
	check("a batch before the interval passed")
	now = now.Add(10 * time.Second)
	p.feed(telemetry("d1", "2", t0.Add(time.Second), now, 2))
	want["interval"] = 1
	check("a batch once the interval passed")
	now = now.Add(time.Second)
	p.feed(telemetry("d1", "3", t0.Add(2*time.Second), now, 3))
	check("a batch a second after the checkpoint")
	if err := p.s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	want["stop"] = 1
	check("Checkpoint with a batch not yet checkpointed")
	if err := p.s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	check("Checkpoint with nothing to write")
}
