package window

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/testrig/logbuf"
)

// checkpointEveryBatch makes cfg checkpoint (and so evict) with every
// batch: its clock moves a second per call, past the interval each time.
func checkpointEveryBatch(cfg *Config) {
	now := t0
	cfg.Clock = func() time.Time { now = now.Add(time.Second); return now }
	cfg.CheckpointInterval = time.Millisecond
}

// checkpointNever makes cfg write no state checkpoint before Flush, so
// nothing is evicted while the stream runs.
func checkpointNever(cfg *Config) {
	cfg.Clock = func() time.Time { return t0 }
	cfg.CheckpointInterval = time.Hour
}

// withoutParking runs fn with emitted windows kept as windows (see
// parkEmitted), and parks them again after it, even if fn fails the test.
func withoutParking(t *testing.T, fn func()) {
	t.Helper()
	parkEmitted = false
	defer func() { parkEmitted = true }()
	fn()
}

// evictRun is what runEvicting saw.
type evictRun struct {
	out        []byte
	loads      uint64 // evicted windows read back
	maxEvicted int    // most windows evicted at once
	dedupLoads uint64 // cold dedup groups read back
	unparks    uint64 // parked windows read back
	maxCold    int    // most dedup ids cold at once
}

// coldIDs counts the dedup ids held only on disk.
func coldIDs(e *engine) int {
	n := 0
	for _, d := range e.devices.all() {
		n += len(d.dedup.coldFP())
	}
	return n
}

// runEvicting processes the Bronze at bronzePath into a fresh state DB with
// cfg, rebuilding the Stage from the database after every batch if
// restart is set. check, if given, is called once the Stage is built
// (with false), after every Step (with whether the Step's commit was a
// checkpoint) and after the final Flush (with true).
func runEvicting(t *testing.T, bronzePath, statePath string, cfg Config, restart bool, check ...func(s *Stage, checkpointed bool)) evictRun {
	t.Helper()
	br, err := openBronzeCopy(t, bronzePath)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	db := openDB(t, statePath, true)
	var run evictRun
	var s *Stage
	for {
		if s == nil || restart {
			if s != nil {
				run.loads += s.eng.loads
				run.dedupLoads += s.eng.dedupLoads
				run.unparks += s.eng.unparks
			}
			if s, err = New(db, br, cfg); err != nil {
				t.Fatal(err)
			}
			for _, c := range check {
				c(s, false)
			}
		}
		res, err := s.Step()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range check {
			c(s, s.checkpointOffset == s.eng.offset)
		}
		run.maxEvicted = max(run.maxEvicted, s.Stats().EvictedWindows)
		run.maxCold = max(run.maxCold, coldIDs(s.eng))
		if res.Records == 0 {
			break
		}
	}
	run.loads += s.eng.loads
	run.dedupLoads += s.eng.dedupLoads
	run.unparks += s.eng.unparks
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, c := range check {
		c(s, true)
	}
	run.out, _ = outputBytes(t, db)
	return run
}

// TestEvictionKeepsOutputs: a stage that checkpoints, and so evicts
// emitted windows, after every batch (and one that also restarts after
// every batch) writes byte for byte the outputs of one that keeps every
// window in memory, late data for evicted windows included.
func TestEvictionKeepsOutputs(t *testing.T) {
	tumbling := testConfig(t)
	longLate := testConfig(t)
	longLate.AllowedLateness = 10 * time.Minute
	hopping := testConfig(t)
	hopping.Slide = 20 * time.Second
	hopping.AllowedLateness = 3 * time.Minute
	// Evicted starts spanning more than 64 slides (startSet's slice).
	wide := testConfig(t)
	wide.Size, wide.Slide = 10*time.Second, 10*time.Second
	wide.AllowedLateness = 20 * time.Minute
	// everyRecord: also a checkpoint after every record (batches of one),
	// the slowest run, in two of the six cases.
	for _, tc := range firstUnderRace([]struct {
		name        string
		cfg         Config
		shards      uint32
		everyRecord bool
	}{{"hopping-groups-of-several-devices", hopping, 2, true}, {"tumbling", tumbling, 0, true}, {"lateness10m", longLate, 0, false},
		{"hopping", hopping, 0, false}, {"tumbling-groups-of-several-devices", tumbling, 2, false},
		{"lateness-of-120-slides", wide, 0, false}}) {
		t.Run(tc.name, func(t *testing.T) {
			if tc.shards > 0 {
				withShards(t, tc.shards)
			}
			dir := t.TempDir()
			bronzePath := writeBronze(t, dir, genStream(21, tc.cfg, genOpts{devices: 6, duration: 90 * time.Minute, period: 20 * time.Second,
				dupRate: 0.1, noIDRate: 0.2, lateRate: 0.1, backlog: 1, grid: time.Second}))

			cfg := tc.cfg
			checkpointNever(&cfg)
			var want evictRun
			withoutParking(t, func() { want = runEvicting(t, bronzePath, filepath.Join(dir, "resident.db"), cfg, false) })
			parked := runEvicting(t, bronzePath, filepath.Join(dir, "parked.db"), cfg, false)
			if parked.unparks == 0 || parked.loads != 0 {
				t.Fatalf("without a checkpoint: %d parked windows read back for late data, %d from disk; want some, none", parked.unparks, parked.loads)
			}
			if !bytes.Equal(parked.out, want.out) {
				t.Fatalf("parked without a checkpoint: outputs differ from the run without parking\n%s", firstDiff(parked.out, want.out))
			}
			if want.maxEvicted != 0 || want.maxCold != 0 {
				t.Fatalf("the reference run evicted %d windows, %d dedup ids", want.maxEvicted, want.maxCold)
			}
			type variant struct {
				batch   int
				restart bool
			}
			var variants []variant
			for _, batch := range []int{1, 13, 200} {
				for _, restart := range []bool{false, true} {
					if batch == 1 && (restart || !tc.everyRecord) {
						continue // a restart per record is slow and adds nothing over 13
					}
					variants = append(variants, variant{batch, restart})
				}
			}
			inParallel(t, len(variants), func(i int) string {
				return fmt.Sprintf("batch=%d/restart=%v", variants[i].batch, variants[i].restart)
			}, func(t *testing.T, i int) {
				batch, restart := variants[i].batch, variants[i].restart
				cfg := tc.cfg
				cfg.MaxRecordsPerBatch = batch
				checkpointEveryBatch(&cfg)
				got := runEvicting(t, bronzePath, filepath.Join(dir, fmt.Sprintf("evict%d-%v.db", batch, restart)), cfg, restart)
				if got.maxEvicted == 0 || got.loads == 0 || got.maxCold == 0 || got.dedupLoads == 0 {
					t.Fatalf("batch %d restart %v: %d windows evicted at most, %d read back, %d dedup ids cold, %d groups read back: the test exercises nothing",
						batch, restart, got.maxEvicted, got.loads, got.maxCold, got.dedupLoads)
				}
				if !bytes.Equal(got.out, want.out) {
					t.Fatalf("batch %d restart %v: outputs differ from the run without eviction\n%s", batch, restart, firstDiff(got.out, want.out))
				}
				t.Logf("batch %d restart %v: up to %d windows evicted, %d read back for late data; up to %d dedup ids cold, %d groups read back",
					batch, restart, got.maxEvicted, got.loads, got.maxCold, got.dedupLoads)
			})
		})
	}
}

// withShards puts the window groups of the test's state databases into n
// shards, so a group holds several devices.
func withShards(t *testing.T, n uint32) {
	old := groupShards
	groupShards = n
	t.Cleanup(func() { groupShards = old })
}

// windowRows lists the starts of the windows stored in the state
// database, one per window.
func windowRows(t *testing.T, db *bolt.DB) []int64 {
	t.Helper()
	var starts []int64
	err := db.View(func(tx *bolt.Tx) error {
		return eachTimedEntry(tx.Bucket(bucketWindowGroups), getU64(tx.Bucket(bucketMeta), keyGen), nil, func(start int64, _ groupEntry) error {
			starts = append(starts, start)
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return starts
}

// TestEvictedWindowLifecycle follows one window: emitted and evicted at
// the checkpoint, read back and revised by late data, evicted again, and
// its row deleted when the horizon passes; then a device whose windows are
// all evicted expires, leaving no rows and a tombstone that covers them.
func TestEvictedWindowLifecycle(t *testing.T) {
	cfg := testConfig(t) // size 1m, delay 5s, lateness 30s, trigger 1s
	cfg.DeviceExpiry = time.Hour
	checkpointEveryBatch(&cfg)
	p := newStepper(t, cfg)
	w0, w1 := t0.UnixMilli(), t0.Add(time.Minute).UnixMilli()
	check := func(when string, open, evicted int, rows ...int64) {
		t.Helper()
		st := p.s.Stats()
		if st.OpenWindows != open || st.EvictedWindows != evicted {
			t.Errorf("%s: %d windows in state, %d evicted; want %d, %d", when, st.OpenWindows, st.EvictedWindows, open, evicted)
		}
		if got := windowRows(t, p.db); fmt.Sprint(got) != fmt.Sprint(rows) {
			t.Errorf("%s: window rows %v, want %v", when, got, rows)
		}
	}

	p.feed(telemetry("d1", "1", t0.Add(10*time.Second), t0.Add(10*time.Second), 1))
	got := p.feed(telemetry("d1", "2", t0.Add(65*time.Second), t0.Add(65*time.Second), 5))
	if len(got) != 1 || got[0].Start != w0 || got[0].Rev != 1 {
		t.Fatalf("emitted %v", got)
	}
	check("after the first emission", 2, 1, w0, w1)

	// Late data within the lateness reads the window back; its revision
	// goes out at the next trigger boundary.
	recv := t0.Add(70 * time.Second).Add(100 * time.Millisecond)
	p.feed(telemetry("d1", "3", t0.Add(20*time.Second), recv, 2))
	if st := p.s.Stats(); st.PendingRevisions != 1 || p.s.eng.loads != 1 {
		t.Fatalf("after late data: %d pending, %d loads", st.PendingRevisions, p.s.eng.loads)
	}
	check("while the revision is pending", 2, 0, w0, w1)
	got = p.feed(tick(recv.Add(time.Second)))
	if len(got) != 1 || got[0].Rev != 2 || got[0].Count != 2 || *got[0].Sum != 3 || *got[0].First != 1 {
		t.Fatalf("revision %v", got)
	}
	check("after the revision", 2, 1, w0, w1)

	// The watermark passes end + lateness of w0: its row goes.
	got = p.feed(telemetry("d1", "4", t0.Add(95*time.Second), t0.Add(95*time.Second), 7))
	if len(got) != 0 {
		t.Fatalf("emitted %v", got)
	}
	check("after the horizon passed w0", 1, 0, w1)
	if late := p.feed(telemetry("d1", "5", t0.Add(30*time.Second), t0.Add(96*time.Second), 9)); len(late) != 0 {
		t.Fatalf("a pruned window was revised: %v", late)
	}
	if n := len(readLate(t, p.db)); n != 1 {
		t.Fatalf("%d late rows, want 1", n)
	}

	// Idle close emits w1, the checkpoint evicts it; the device then
	// expires and takes the evicted row with it.
	got = p.feed(tick(t0.Add(96*time.Second + cfg.IdleTimeout)))
	if len(got) != 1 || got[0].Start != w1 {
		t.Fatalf("idle close emitted %v", got)
	}
	check("after the idle close", 1, 1, w1)
	p.feed(tick(t0.Add(96*time.Second + cfg.DeviceExpiry)))
	check("after expiry", 0, 0)
	if st := p.s.Stats(); st.DevicesExpired != 1 || st.Tombstones != 1 {
		t.Fatalf("after expiry: %+v", st)
	}
	// The tombstone's horizon covers the evicted window: data for it is late.
	back := t0.Add(97*time.Second + cfg.DeviceExpiry)
	if got := p.feed(telemetry("d1", "6", t0.Add(90*time.Second), back, 1)); len(got) != 0 {
		t.Fatalf("an expired device's evicted window restarted: %v", got)
	}
	if n := len(readLate(t, p.db)); n != 2 {
		t.Fatalf("%d late rows, want 2", n)
	}
}

// TestLoadFailureReloads: a failed read of an evicted window fails the
// Step, and the stage goes back to its last checkpoint; the next Step
// redoes the batch and writes what an unfailed run would.
func TestLoadFailureReloads(t *testing.T) {
	cfg := testConfig(t)
	checkpointEveryBatch(&cfg)
	p := newStepper(t, cfg)
	p.feed(telemetry("d1", "1", t0.Add(10*time.Second), t0.Add(10*time.Second), 1),
		telemetry("d1", "2", t0.Add(65*time.Second), t0.Add(65*time.Second), 5))
	if st := p.s.Stats(); st.EvictedWindows != 1 {
		t.Fatalf("%d windows evicted, want 1", st.EvictedWindows)
	}
	before := outboxBytes(t, p.db)
	old, offset := p.s.eng, p.s.eng.offset

	errBoom := errors.New("boom")
	old.load = func(string, string, int64) (*window, error) { return nil, errBoom }
	recv := t0.Add(70 * time.Second).Add(100 * time.Millisecond)
	appendAll(t, p.br, []buffer.Record{
		telemetry("d1", "0", t0.Add(66*time.Second), recv, 3), // before the late one, in the same batch
		telemetry("d1", "3", t0.Add(20*time.Second), recv, 2),
		tick(recv.Add(time.Second)),
	})
	_, err := p.s.Step()
	if !errors.Is(err, errBoom) {
		t.Fatalf("step with a failing load: %v, want %v", err, errBoom)
	}
	t.Logf("step error: %v", err)
	if p.s.eng == old || p.s.eng.offset != offset || p.s.eng.loadErr != nil {
		t.Fatalf("state not reloaded: same engine %v, offset %d (want %d), load error %v",
			p.s.eng == old, p.s.eng.offset, offset, p.s.eng.loadErr)
	}
	if !bytes.Equal(outboxBytes(t, p.db), before) {
		t.Fatal("the failed step wrote to the outbox")
	}

	got := p.feed()
	if len(got) != 1 || got[0].Rev != 2 || got[0].Count != 2 || *got[0].Sum != 3 {
		t.Fatalf("after the failed step: %v", got)
	}
	if p.s.eng.loads != 1 {
		t.Fatalf("%d loads after the retry, want 1", p.s.eng.loads)
	}
}

// TestColdDedupGroups: once a checkpoint wrote the dedup group of readings
// whose windows were all emitted, its ids leave memory; a retry of such a
// reading is still found (read back from disk), a late reading for the
// group brings it back into memory, and a failed read fails the Step and
// reloads the state like a failed window load.
func TestColdDedupGroups(t *testing.T) {
	cfg := testConfig(t) // size 1m, delay 5s, lateness 30s
	checkpointEveryBatch(&cfg)
	p := newStepper(t, cfg)
	p.feed(telemetry("d1", "1", t0.Add(10*time.Second), t0.Add(10*time.Second), 1),
		telemetry("d1", "2", t0.Add(65*time.Second), t0.Add(65*time.Second), 5))
	if n := coldIDs(p.s.eng); n != 1 {
		t.Fatalf("%d dedup ids cold after w0 was emitted and checkpointed, want 1", n)
	}
	if st := p.s.Stats(); st.DedupEntries != 2 {
		t.Fatalf("%d dedup entries, want 2 (cold ones count)", st.DedupEntries)
	}

	old, offset := p.s.eng, p.s.eng.offset
	errBoom := errors.New("boom")
	old.loadDedup = func(string, int64) ([]uint64, error) { return nil, errBoom }
	recv := t0.Add(70 * time.Second)
	appendAll(t, p.br, []buffer.Record{telemetry("d1", "1", t0.Add(10*time.Second), recv, 1)})
	if _, err := p.s.Step(); !errors.Is(err, errBoom) {
		t.Fatalf("step with a failing dedup read: %v, want %v", err, errBoom)
	}
	if p.s.eng == old || p.s.eng.offset != offset {
		t.Fatalf("state not reloaded: same engine %v, offset %d (want %d)", p.s.eng == old, p.s.eng.offset, offset)
	}

	// The retry, redone: a duplicate, found on disk; nothing changes.
	if got := p.feed(tick(recv.Add(2 * time.Second))); len(got) != 0 {
		t.Fatalf("a retry of a cold reading emitted %v", got)
	}
	if st := p.s.Stats(); st.Duplicates != 1 || st.PendingRevisions != 0 || p.s.eng.dedupLoads != 1 {
		t.Fatalf("after the retry: %d duplicates, %d pending, %d dedup reads; want 1, 0, 1", st.Duplicates, st.PendingRevisions, p.s.eng.dedupLoads)
	}

	// A new late reading for w0 warms the group (a read) to add its id;
	// the batch's checkpoint writes it and makes it cold again, and the
	// reading's own retry is found on disk.
	recv = recv.Add(3 * time.Second)
	p.feed(telemetry("d1", "3", t0.Add(20*time.Second), recv, 2))
	if n := coldIDs(p.s.eng); n != 2 || p.s.eng.dedupLoads != 2 {
		t.Fatalf("after late data: %d ids cold, %d dedup reads; want 2, 2", n, p.s.eng.dedupLoads)
	}
	got := p.feed(telemetry("d1", "3", t0.Add(20*time.Second), recv.Add(10*time.Millisecond), 2), tick(recv.Add(2*time.Second)))
	if len(got) != 1 || got[0].Rev != 2 || got[0].Count != 2 || *got[0].Sum != 3 {
		t.Fatalf("revision %v, want rev 2 of count 2, sum 3", got)
	}
	if st := p.s.Stats(); st.Duplicates != 2 || p.s.eng.dedupLoads != 3 {
		t.Fatalf("%d duplicates, %d dedup reads; want 2, 3", st.Duplicates, p.s.eng.dedupLoads)
	}
}

// expireInWaves has devices d00–d15 send one reading each, at minute i
// of t0, in two waves of eight (max_devices 8 bounds the live ones), the
// second an hour later with readings that old, each wave then expiring.
// It returns the clock after them.
func expireInWaves(p *stepper, cfg Config) time.Time {
	now := t0
	for wave := range 2 {
		for i := wave * 8; i < wave*8+8; i++ {
			at := t0.Add(time.Duration(i) * time.Minute)
			if now.Before(at) {
				now = at
			}
			now = now.Add(time.Second)
			p.feed(telemetry(fmt.Sprintf("d%02d", i), "1", at.Add(10*time.Second), now, 1))
		}
		now = now.Add(cfg.DeviceExpiry + time.Second)
		p.feed(tick(now))
	}
	return now
}

// TestTombstonesKeptWithinMaxDevices: a fleet that keeps inventing device
// names holds at most max_devices tombstones. The oldest are dropped, and
// the newest horizon among them stays as a floor for devices not seen
// before (a dropped device may be one), across a restart, until
// max_past_skew passes it.
func TestTombstonesKeptWithinMaxDevices(t *testing.T) {
	cfg := testConfig(t) // size 1m, idle 2m
	cfg.MaxDevices = 8
	cfg.DeviceExpiry = time.Hour
	cfg.MaxPastSkew = 3 * time.Hour
	checkpointEveryBatch(&cfg)
	p := newStepper(t, cfg)
	minute := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Minute) }
	now := expireInWaves(p, cfg)
	// Each device's horizon is the end of its window, minute i+1. Past 8,
	// the oldest go down to 7 at a time: d00–d07 dropped, d08–d15 kept.
	st := p.s.Stats()
	if st.DevicesExpired != 16 || st.Tombstones != 8 || st.TombstonesDropped != 8 || !st.TombstoneFloor.Equal(minute(8)) {
		t.Fatalf("after 16 expiries: %d expired, %d tombstones, %d dropped, floor %v; want 16, 8, 8, %v",
			st.DevicesExpired, st.Tombstones, st.TombstonesDropped, st.TombstoneFloor, minute(8))
	}
	lateRows := func() int { return len(readLate(t, p.db)) }
	send := func(dev string, et time.Time) (emitted int) {
		now = now.Add(time.Second)
		return len(p.feed(telemetry(dev, "2", et, now, 9)))
	}
	// A dropped device's emitted window stays final; so do a new device's
	// windows ending by the floor, a kept tombstone's own, and none after.
	for i, c := range []struct {
		dev  string
		at   time.Time
		late bool
	}{
		{"d03", minute(3).Add(20 * time.Second), true},
		{"new1", minute(5).Add(20 * time.Second), true},
		{"d12", minute(12).Add(20 * time.Second), true},
		{"new2", minute(9).Add(20 * time.Second), false},
	} {
		before := lateRows()
		if n := send(c.dev, c.at); n != 0 {
			t.Fatalf("case %d: emitted %d aggregates", i, n)
		}
		if late := lateRows() - before; late != map[bool]int{true: 1, false: 0}[c.late] {
			t.Errorf("%s at %v: %d late rows, want late=%v", c.dev, c.at, late, c.late)
		}
	}
	if err := p.s.Checkpoint(); err != nil {
		t.Fatal(err)
	}

	// A restart keeps the floor; one with a lower bound drops more, and
	// says so.
	cfg.MaxDevices = 5
	logs := new(logbuf.Buffer)
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	p.restart(cfg)
	if !strings.Contains(logs.String(), "the oldest tombstones were dropped") || !strings.Contains(logs.String(), "dropped=2") {
		t.Errorf("the drop at the start was not logged:\n%s", logs)
	}
	st = p.s.Stats()
	// d12 came back: 7 tombstones, of which 5 are kept: d08 and d09 go,
	// and the floor is d09's horizon, minute 10.
	if st.Tombstones != 5 || st.TombstonesDropped != 8+2 || !st.TombstoneFloor.Equal(minute(10)) {
		t.Fatalf("after a restart with max_devices 5: %d tombstones, %d dropped, floor %v; want 5, 10, %v",
			st.Tombstones, st.TombstonesDropped, st.TombstoneFloor, minute(10))
	}
	before := lateRows()
	send("new3", minute(9).Add(5*time.Second))
	if lateRows() != before+1 {
		t.Errorf("a new device's window before the floor after the restart was not late")
	}

	// max_past_skew passes the floor: it goes, and stays gone.
	later := minute(20).Add(cfg.MaxPastSkew)
	p.feed(tick(later), tick(later.Add(2*time.Minute)))
	if err := p.s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if st := p.s.Stats(); !st.TombstoneFloor.IsZero() || st.Tombstones != 0 {
		t.Fatalf("past max_past_skew: floor %v, %d tombstones", st.TombstoneFloor, st.Tombstones)
	}
	p.restart(cfg)
	if !p.s.Stats().TombstoneFloor.IsZero() {
		t.Fatalf("the floor came back after a restart: %v", p.s.Stats().TombstoneFloor)
	}
}

// TestTableBoundsAcrossRestarts: the late table holds at most its bound
// however often the agent restarts. A checkpoint stored the table counters
// before its own batch's rows, and a restart read them back from there,
// so each restart counted a batch's rows short and the table grew past
// its bound by them (an audit's soak: 152 rows over). A state saved that
// way is counted afresh at the start.
func TestTableBoundsAcrossRestarts(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxLateRows = 5
	checkpointEveryBatch(&cfg)
	p := newStepper(t, cfg)
	rows := func() int { return len(readLate(t, p.db)) }
	at := t0.Add(10 * time.Minute)
	p.feed(telemetry("d1", "0", at, at, 1))
	for i := range 8 {
		at = at.Add(time.Second)
		// Each more than the lateness behind the device's watermark.
		p.feed(telemetry("d1", fmt.Sprint("late", i), t0.Add(time.Duration(i)*time.Second), at, 1))
		p.restart(cfg)
		if got, counted := rows(), p.s.Stats().LateRows; got > cfg.MaxLateRows || uint64(got) != counted {
			t.Fatalf("after restart %d: %d late rows, %d counted; bound %d", i+1, got, counted, cfg.MaxLateRows)
		}
	}
	// A state whose counters fell short: one row more than they say.
	if err := p.db.Update(func(tx *bolt.Tx) error {
		return putRow(tx.Bucket(bucketLate), appendLate(nil, &Late{Seq: 1, Device: "d0", Metric: "temp"}))
	}); err != nil {
		t.Fatal(err)
	}
	p.restart(cfg)
	if got := p.s.Stats().LateRows; got != 6 {
		t.Fatalf("a state with 6 late rows counted %d", got)
	}
	at = at.Add(time.Second)
	p.feed(telemetry("d1", "late9", t0, at, 1))
	if got := rows(); got != cfg.MaxLateRows {
		t.Fatalf("%d late rows after the next batch, want the bound %d", got, cfg.MaxLateRows)
	}
}

// TestTombstonesDroppedCountOnceThroughARollback: a failed commit goes
// back to the checkpoint and processes the batches since again, dropping
// the same tombstones again; the count is the state's, so it goes back
// with it (an audit: 220 counted for 116 dropped).
func TestTombstonesDroppedCountOnceThroughARollback(t *testing.T) {
	obs := &failingObserver{}
	cfg := testConfig(t)
	cfg.MaxDevices, cfg.DeviceExpiry, cfg.MaxPastSkew, cfg.Observer = 8, time.Hour, 3*time.Hour, obs
	checkpointNever(&cfg)
	p := newStepper(t, cfg)
	now := expireInWaves(p, cfg) // 16 expiries, 8 tombstones dropped
	if st := p.s.Stats(); st.TombstonesDropped != 8 {
		t.Fatalf("%d tombstones dropped, want 8", st.TombstonesDropped)
	}
	obs.fail = true // a batch that emits, whose commit fails
	et := now.Add(-time.Minute)
	appendAll(t, p.br, []buffer.Record{telemetry("x", "1", et, now.Add(time.Second), 1), telemetry("x", "2", et.Add(5*time.Minute), now.Add(2*time.Second), 1)})
	if _, err := p.s.Step(); err == nil {
		t.Fatal("the injected failure did not fail the Step")
	}
	obs.fail = false
	p.feed()
	if st := p.s.Stats(); st.TombstonesDropped != 8 {
		t.Fatalf("%d tombstones dropped after a rollback; 8 were", st.TombstonesDropped)
	}
}

// TestEvictedCountsThroughACatchUpUnderNewSettings: a restart after a
// crash, with a setting that decides outputs changed, deletes the late
// and dead-letter rows written since the checkpoint and writes them
// anew; what was evicted is counted once (an audit: 5 late readings, 2
// rows, 6 evicted).
func TestEvictedCountsThroughACatchUpUnderNewSettings(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxLateRows, cfg.MaxDeadLetterRows = 2, 2
	checkpointNever(&cfg)
	p := newStepper(t, cfg)
	at := t0.Add(10 * time.Minute)
	p.feed(telemetry("d1", "0", at, at, 1))
	for i := range 5 {
		at = at.Add(time.Second)
		p.feed(telemetry("d1", fmt.Sprint("late", i), t0.Add(time.Duration(i)*time.Second), at, 1),
			msg("sensors/d1/telemetry", fmt.Sprint("{bad", i), at))
	}
	cfg.WatermarkDelay = 2 * time.Second // the crash's restart, with another delay
	p.restart(cfg)
	p.feed()
	st := p.s.Stats()
	var dead uint64
	for _, n := range st.DeadLetters {
		dead += n
	}
	if st.Late != 5 || st.LateRows != 2 || st.LateEvicted != 3 || dead != 5 || st.DeadLetterRows != 2 || st.DeadLettersEvicted != 3 {
		t.Fatalf("late %d = %d rows + %d evicted, dead letters %d = %d rows + %d evicted; want 5 = 2 + 3 for both",
			st.Late, st.LateRows, st.LateEvicted, dead, st.DeadLetterRows, st.DeadLettersEvicted)
	}
}

// TestTombstoneDropsDoNotDependOnBatches: the bound counts only tombstones
// max_past_skew has not passed. Counting those pruneTombstones had not yet
// forgotten (it runs at the end of a Step, at most once a minute) made the
// floor, and so whether a new device's reading was late, depend on the
// batch size (a review).
func TestTombstoneDropsDoNotDependOnBatches(t *testing.T) {
	base := testConfig(t)
	base.MaxDevices = 8
	base.DeviceExpiry = time.Hour
	base.MaxPastSkew = 3 * time.Hour
	var recs []buffer.Record
	recs = append(recs, telemetry("old", "1", t0.Add(10*time.Second), t0.Add(11*time.Second), 1))
	recs = append(recs, tick(t0.Add(time.Hour+5*time.Minute))) // old expires: tombstone t0+1m
	T := t0.Add(3*time.Hour + 10*time.Minute)
	now := T
	for i := 1; i <= 8; i++ {
		at := T.Add(time.Duration(i) * time.Minute)
		now = at.Add(time.Second)
		recs = append(recs, telemetry(fmt.Sprintf("a%d", i), "1", at.Add(10*time.Second), now, 1))
	}
	now = now.Add(time.Hour + 5*time.Minute)
	recs = append(recs, tick(now)) // a1..a8 expire
	now = now.Add(time.Second)
	// a new device, a reading in a1's window (ending T+2m)
	recs = append(recs, telemetry("newdev", "1", T.Add(time.Minute+20*time.Second), now, 5))
	now = now.Add(10 * time.Minute)
	recs = append(recs, tick(now))

	for _, st := range outputsAlikeByBatch(t, recs, base, 1000, 1) {
		if st.TombstonesDropped != 0 {
			t.Errorf("%d tombstones dropped; one of nine had passed max_past_skew", st.TombstonesDropped)
		}
	}
}

// TestStaleTombstoneCountsAsNone: a device whose own tombstone has passed
// max_past_skew comes back while the tombstone floor is live: whether
// pruneTombstones had forgotten it yet (at the end of a Step, so at
// points that depend on batches) must not decide whether its reading is
// late (a review: 11 aggregates and no late row with one batch, 10 and a
// late row with batches of one).
func TestStaleTombstoneCountsAsNone(t *testing.T) {
	base := testConfig(t)
	base.MaxDevices = 8
	base.DeviceExpiry = time.Hour
	base.MaxPastSkew = 3 * time.Hour
	m := func(d time.Duration) time.Time { return t0.Add(d) }
	var recs []buffer.Record
	for i := 1; i <= 9; i++ {
		at := m(time.Duration(i)*time.Minute + 10*time.Second)
		rcv := at.Add(time.Second)
		if i > 5 {
			rcv = m(time.Hour + time.Duration(i+5)*time.Minute)
		}
		recs = append(recs, telemetry(fmt.Sprintf("a%d", i), "1", at, rcv, 1))
		if i == 5 {
			recs = append(recs, tick(m(time.Hour+10*time.Minute))) // a1..a5 expire
		}
	}
	recs = append(recs,
		telemetry("x", "1", m(10*time.Second), m(time.Hour+20*time.Minute), 1), // x's horizon t0+1m
		tick(m(2*time.Hour+17*time.Minute)),                                    // a6..a9 expire: a drop, the floor t0+3m
		tick(m(2*time.Hour+25*time.Minute)),                                    // x expires: its tombstone t0+1m
		tick(m(3*time.Hour+time.Minute+30*time.Second)),                        // the cut passes x's, not the floor
		telemetry("x", "2", m(2*time.Minute+30*time.Second), m(3*time.Hour+2*time.Minute), 5),
		tick(m(3*time.Hour+20*time.Minute)))
	if st := outputsAlikeByBatch(t, recs, base, 1000, 1); st[0].Late != 1 {
		t.Fatalf("%d late readings; x's reading is under the floor", st[0].Late)
	}
}

// outputsAlikeByBatch runs recs through a stage with cfg at each batch
// size, failing unless the outputs are the same byte for byte; it returns
// each run's final Stats.
func outputsAlikeByBatch(t *testing.T, recs []buffer.Record, cfg Config, batches ...int) []Stats {
	t.Helper()
	dir := t.TempDir()
	path := writeBronze(t, dir, recs)
	var outs [][]byte
	var stats []Stats
	for i, batch := range batches {
		br, err := openBronzeCopy(t, path)
		if err != nil {
			t.Fatal(err)
		}
		defer br.Close()
		db := openDB(t, filepath.Join(dir, fmt.Sprintf("s%d.db", i)), true)
		c := cfg
		c.MaxRecordsPerBatch = batch
		s, err := New(db, br, c)
		if err != nil {
			t.Fatal(err)
		}
		runToEnd(t, s)
		out, _ := outputBytes(t, db)
		outs = append(outs, out)
		stats = append(stats, s.Stats())
		if !bytes.Equal(out, outs[0]) {
			t.Fatalf("batch %d: outputs differ from batch %d's\n%s", batch, batches[0], firstDiff(out, outs[0]))
		}
	}
	return stats
}

// windowEntries lists the windows stored in the state database as
// device@start (seconds after t0), in key order.
func windowEntries(t *testing.T, db *bolt.DB) []string {
	return storedEntries(t, db, bucketWindowGroups)
}

// storedEntries lists the entries of the time-led group bucket as
// device@time (seconds after t0), in key order.
func storedEntries(t *testing.T, db *bolt.DB, bucket []byte) []string {
	t.Helper()
	var got []string
	err := db.View(func(tx *bolt.Tx) error {
		return eachTimedEntry(tx.Bucket(bucket), getU64(tx.Bucket(bucketMeta), keyGen), nil, func(at int64, en groupEntry) error {
			got = append(got, fmt.Sprintf("%s@%d", en.dev, (at-t0.UnixMilli())/1000))
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestFinalDeletesWaitForTheirGroup: three devices share a group row
// (one shard). A final window whose device's horizon passed it stays in
// the row while another device's window keeps the group, and is pruned
// again by a restart; a window dropped with changes the row does not
// hold is deleted at once; the last window in state takes the row whole.
// Emitted windows are parked (evicted at the next checkpoint) or, without
// parking, stay in memory until final: each is its own path to a delete.
func TestFinalDeletesWaitForTheirGroup(t *testing.T) {
	withShards(t, 1)
	t.Run("parked", finalDeletesWaitForTheirGroup)
	t.Run("in memory", func(t *testing.T) { withoutParking(t, func() { finalDeletesWaitForTheirGroup(t) }) })
}

func finalDeletesWaitForTheirGroup(t *testing.T) {
	cfg := testConfig(t) // size 1m, delay 5s, lateness 30s
	checkpointEveryBatch(&cfg)
	p := newStepper(t, cfg)
	check := func(when string, want ...string) {
		t.Helper()
		checkStateInvariants(t, p.s, true)
		if got := windowEntries(t, p.db); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: stored %v, want %v", when, got, want)
		}
	}
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	p.feed(telemetry("d1", "1", at(10), at(10), 1), telemetry("d2", "1", at(10), at(10), 2), telemetry("d3", "1", at(10), at(10), 3))
	check("all open", "d1@0", "d2@0", "d3@0")
	if got := p.feed(telemetry("d1", "2", at(65), at(65), 1)); len(got) != 1 {
		t.Fatalf("d1 emitted %v", got)
	}
	check("d1's first window emitted", "d1@0", "d2@0", "d3@0", "d1@60")

	// d1's horizon passes its first window, written emitted and clean:
	// the group keeps it, since d2 and d3 still have theirs.
	p.feed(telemetry("d1", "3", at(95), at(95), 1))
	check("d1's horizon passed", "d1@0", "d2@0", "d3@0", "d1@60")
	if st := p.s.Stats(); st.OpenWindows != 3 {
		t.Fatalf("%d windows in state, want 3", st.OpenWindows)
	}
	p.restart(cfg)
	if st := p.s.Stats(); st.OpenWindows != 3 {
		t.Fatalf("after a restart: %d windows in state, want 3 (the final row pruned again)", st.OpenWindows)
	}
	if got := p.feed(telemetry("d1", "4", at(20), at(96), 9)); len(got) != 0 {
		t.Fatalf("late data revised a window past the horizon: %v", got)
	}
	if n := len(readLate(t, p.db)); n != 1 {
		t.Fatalf("%d late rows, want 1", n)
	}

	// d2's window is emitted and dropped in one batch: its row says open,
	// so its delete is written at once, group or not.
	if got := p.feed(telemetry("d2", "2", at(95), at(95), 2)); len(got) != 1 {
		t.Fatalf("d2 emitted %v", got)
	}
	check("d2's window emitted and dropped", "d1@0", "d3@0", "d1@60", "d2@60")
	before := len(readOutbox(t, p.db))
	p.restart(cfg)
	if got := p.feed(tick(at(97))); len(got) != 0 {
		t.Fatalf("after a restart, emitted %v", got)
	}
	if n := len(readOutbox(t, p.db)); n != before {
		t.Fatalf("outbox %d entries after a restart, was %d", n, before)
	}

	// The last window in state in the group goes: the row goes whole,
	// d1's waiting delete with it.
	if got := p.feed(telemetry("d3", "2", at(95), at(98), 3)); len(got) != 1 {
		t.Fatalf("d3 emitted %v", got)
	}
	check("the group's last window dropped", "d1@60", "d2@60", "d3@60")
}

// TestExpiredDevicesFinalRowWaitsAndLoads: a device expires while the
// delete of one of its final windows waits in a group another device
// keeps; a restart loads the state without the expired device's window,
// and the row goes with the group's last window.
func TestExpiredDevicesFinalRowWaitsAndLoads(t *testing.T) {
	withShards(t, 1)
	cfg := testConfig(t) // size 1m, delay 5s, lateness 30s, idle 2m
	cfg.DeviceExpiry = 3 * time.Minute
	checkpointEveryBatch(&cfg)
	p := newStepper(t, cfg)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	p.feed(telemetry("d1", "1", at(10), at(10), 1), telemetry("d2", "1", at(10), at(10), 2))
	p.feed(telemetry("d1", "2", at(65), at(65), 1))
	p.feed(telemetry("d1", "3", at(95), at(95), 1))
	if got := windowEntries(t, p.db); fmt.Sprint(got) != "[d1@0 d2@0 d1@60]" {
		t.Fatalf("before the expiry: stored %v", got)
	}
	// d2 stays active with data for its open window; d1 falls silent
	// and expires.
	p.feed(telemetry("d2", "2", at(20), at(100), 2))
	p.feed(telemetry("d2", "3", at(25), at(200), 2))
	p.feed(telemetry("d2", "4", at(30), at(300), 2))
	if st := p.s.Stats(); st.DevicesExpired != 1 {
		t.Fatalf("%d devices expired, want 1", st.DevicesExpired)
	}
	checkStateInvariants(t, p.s, true)
	if got := windowEntries(t, p.db); fmt.Sprint(got) != "[d1@0 d2@0]" {
		t.Fatalf("after the expiry: stored %v, want d1's final window waiting beside d2's", got)
	}
	p.restart(cfg)
	if st := p.s.Stats(); st.OpenWindows != 1 || st.Devices != 1 {
		t.Fatalf("after a restart: %d windows, %d devices; want d2's one", st.OpenWindows, st.Devices)
	}
	checkStateInvariants(t, p.s, true)
	p.feed(telemetry("d2", "5", at(95), at(301), 2))
	checkStateInvariants(t, p.s, true)
	if got := windowEntries(t, p.db); fmt.Sprint(got) != "[d2@60]" {
		t.Fatalf("after the group's last window: stored %v", got)
	}
}

// TestDroppedDedupGroupsWaitForTheirRow: a device's dedup group that its
// horizon passed stays in a row another device keeps; the device
// expires, and comes back under the same name after max_past_skew with
// its event ids counting from the start again. A restart must not take
// the old life's ids for the new one's: a new reading with a reused id is
// not a duplicate, and the groups max_past_skew has passed go.
func TestDroppedDedupGroupsWaitForTheirRow(t *testing.T) {
	withShards(t, 1)
	cfg := testConfig(t) // size 1m, delay 5s, lateness 30s, idle 2m
	cfg.DeviceExpiry = 3 * time.Minute
	cfg.MaxPastSkew = 5 * time.Minute
	checkpointEveryBatch(&cfg)
	p := newStepper(t, cfg)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	check := func(when string, want ...string) {
		t.Helper()
		checkStateInvariants(t, p.s, true)
		if got := storedEntries(t, p.db, bucketDedupGroups); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: dedup rows %v, want %v", when, got, want)
		}
	}
	p.feed(telemetry("d1", "1", at(10), at(10), 1), telemetry("d2", "x", at(10), at(10), 2))
	p.feed(telemetry("d1", "2", at(65), at(65), 1))
	p.feed(telemetry("d1", "3", at(95), at(95), 1))
	check("d1's horizon passed its first group", "d1@60", "d2@60", "d1@120")

	// d2 stays, its horizon behind; d1 falls silent and expires: its
	// group at 120 goes with the row, the one at 60 waits beside d2's.
	p.feed(telemetry("d2", "y", at(20), at(100), 2))
	p.feed(telemetry("d2", "z", at(50), at(200), 2))
	p.feed(telemetry("d2", "w", at(50), at(340), 2))
	if st := p.s.Stats(); st.DevicesExpired != 1 {
		t.Fatalf("%d devices expired, want 1", st.DevicesExpired)
	}
	check("d1 expired", "d1@60", "d2@60")
	p.restart(cfg) // loads without d1's group: its device is gone
	checkStateInvariants(t, p.s, true)

	// d1 comes back after max_past_skew passed its tombstone, ids from 1.
	p.feed(telemetry("d1", "7", at(445), at(450), 1))
	check("d1 back", "d1@60", "d2@60", "d1@480")
	p.restart(cfg)
	p.feed(telemetry("d1", "1", at(446), at(451), 1))
	if st := p.s.Stats(); st.Duplicates != 0 {
		t.Fatalf("%d duplicates: the old life's id 1 was taken for the new one's", st.Duplicates)
	}
	// The restart dropped the groups max_past_skew had passed (d2's at
	// 60 too: no reading the agent takes can fall in it), and the row
	// went whole with d1's old group in it.
	check("after a restart", "d1@480")
}
