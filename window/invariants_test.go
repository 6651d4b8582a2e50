package window

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/uplink/wire"
)

// checkStateInvariants checks the engine's in-memory bookkeeping (its
// counters, parked windows against evicted starts, the dedup sets' groups,
// ids, fingerprints and index), and, when the last commit was a
// checkpoint, that the stored window and dedup rows are exactly what memory
// says is in state.
func checkStateInvariants(t *testing.T, s *Stage, checkpointed bool) {
	t.Helper()
	e := s.eng
	// The tables' counters are what the bounds evict by: a row they miss
	// is a row over the bound.
	if err := s.db.View(func(tx *bolt.Tx) error {
		late, dead := tx.Bucket(bucketLate).Stats().KeyN, tx.Bucket(bucketDead).Stats().KeyN
		if uint64(late) != e.c.LateRows || uint64(dead) != e.c.DeadRows {
			t.Fatalf("late rows %d, counted %d; dead-letter rows %d, counted %d", late, e.c.LateRows, dead, e.c.DeadRows)
		}
		if e.offset >= e.suppressThrough { // a catch-up's counts are behind its rows
			var deadTotal uint64
			for _, n := range e.c.Dead {
				deadTotal += n
			}
			if e.c.Late != e.c.LateRows+e.c.LateEvicted || deadTotal != e.c.DeadRows+e.c.DeadEvicted {
				t.Fatalf("%d late readings, %d rows + %d evicted; %d dead letters, %d rows + %d evicted",
					e.c.Late, e.c.LateRows, e.c.LateEvicted, deadTotal, e.c.DeadRows, e.c.DeadEvicted)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	nW, nEv, nPark, nDedup, nSer := 0, 0, 0, 0, 0
	mem := map[string]bool{}
	for _, d := range e.devices.all() {
		if e.devices.get(d.name) != d || d.dead {
			t.Fatalf("device %q: found %p for %p, dead %v", d.name, e.devices.get(d.name), d, d.dead)
		}
		for _, ser := range d.series {
			if ser.dev != d {
				t.Fatalf("series %s/%s of another device", d.name, ser.name)
			}
			if ser.id == 0 || int(ser.id) >= len(e.sers) || e.sers[ser.id] != ser {
				t.Fatalf("series %s/%s not registered at its id %d", d.name, ser.name, ser.id)
			}
			nSer++
			for _, w := range ser.windows {
				if w.dead || e.serOf(w) != ser {
					t.Fatalf("window %s/%s@%d dead %v", d.name, ser.name, w.start, w.dead)
				}
				if ser.evicted.has(w.start, e.slideMs) {
					t.Fatalf("window %s/%s@%d both in memory and evicted", d.name, ser.name, w.start)
				}
				mem[fmt.Sprintf("%s|%s|%d", d.name, ser.name, w.start)] = true
			}
			nW += len(ser.windows)
			nEv += ser.evicted.len()
			for _, st := range ser.evicted.starts(e.slideMs, nil) {
				mem[fmt.Sprintf("%s|%s|%d", d.name, ser.name, st)] = true
			}
			live := map[int64]bool{}
			e.parkArena.each(ser.parked, func(start int64, _ parkRef) {
				if live[start] {
					t.Fatalf("%s/%s: two live parked entries at %d", d.name, ser.name, start)
				}
				live[start] = true
				if !ser.evicted.has(start, e.slideMs) {
					t.Fatalf("%s/%s: parked %d not in evicted", d.name, ser.name, start)
				}
				nPark++
			})
		}
		nDedup += len(d.dedup.ids()) + len(d.dedup.coldFP())
		// dedup set consistency
		hot := 0
		for i, g := range d.dedup.groups() {
			hot += g.count()
			if i > 0 && d.dedup.groups()[i-1].end() >= g.end() {
				t.Fatalf("%s: hot groups out of order", d.name)
			}
		}
		if hot != len(d.dedup.ids()) {
			t.Fatalf("%s: hot ids %d, groups count %d", d.name, len(d.dedup.ids()), hot)
		}
		cold := 0
		for i, g := range d.dedup.cold() {
			cold += g.count()
			if i > 0 && d.dedup.cold()[i-1].end() >= g.end() {
				t.Fatalf("%s: cold groups out of order", d.name)
			}
			if _, ok := d.dedup.hotIDs(g.end()); ok {
				t.Fatalf("%s: group %d both hot and cold", d.name, g.end())
			}
		}
		if cold != len(d.dedup.coldFP()) {
			t.Fatalf("%s: cold fps %d, groups count %d", d.name, len(d.dedup.coldFP()), cold)
		}
		if len(d.dedup.coldFP()) >= coldBitsMin && d.dedup.coldBits() == nil {
			t.Fatalf("%s: %d cold fingerprints without coldBits", d.name, len(d.dedup.coldFP()))
		}
		if d.dedup.index != nil {
			// It counts the hot ids by their low 32 bits, no more.
			counts := map[uint32]uint32{}
			for _, id := range d.dedup.ids() {
				counts[uint32(id)]++
			}
			if !maps.Equal(counts, d.dedup.index) {
				t.Fatalf("%s: the index counts %d keys, the hot ids make %d", d.name, len(d.dedup.index), len(counts))
			}
		} else if len(d.dedup.ids()) > dedupIndexMin {
			t.Fatalf("%s: %d hot ids and no index", d.name, len(d.dedup.ids()))
		}
	}
	if nW+nEv != e.nWindows || nEv != e.nEvicted || nPark != e.nParked {
		t.Fatalf("counters: windows %d+%d evicted (nWindows %d, nEvicted %d), parked %d (nParked %d)",
			nW, nEv, e.nWindows, e.nEvicted, nPark, e.nParked)
	}
	// Every registered series belongs to a live device: a dropped
	// series' id is free again (e.sers[0] is none).
	if reg := len(e.sers) - 1 - len(e.freeSers); reg != nSer {
		t.Fatalf("%d series registered, devices hold %d", reg, nSer)
	}
	if nDedup != e.nDedup {
		t.Fatalf("nDedup %d, sets hold %d", e.nDedup, nDedup)
	}
	for i, w := range e.dirtyWins {
		if w == nil || !w.dirty || int(w.dirtyAt) != i {
			t.Fatalf("dirtyWins[%d] is %v, not a dirty window that knows its place", i, w)
		}
	}
	if !checkpointed {
		return
	}
	if e.deltaSize() != 0 || e.nParked != 0 {
		t.Fatalf("after a checkpoint: delta %d, parked %d", e.deltaSize(), e.nParked)
	}
	stored := map[string]bool{}
	storedDedup := map[string][]uint64{}
	// A final window's delete may wait in a group that still holds a
	// window in state (deferDeletes): such a row must be one a load
	// prunes again (emitted, nothing pending, past its device's horizon or
	// of an expired device), and no group may hold only those.
	groupLive := map[string]bool{}
	err := s.db.View(func(tx *bolt.Tx) error {
		gen := getU64(tx.Bucket(bucketMeta), keyGen)
		err := eachTimedEntry(tx.Bucket(bucketWindowGroups), gen, nil, func(start int64, en groupEntry) error {
			k := fmt.Sprintf("%s|%s|%d", en.dev, en.metric, start)
			if stored[k] {
				return fmt.Errorf("window %s stored twice", k)
			}
			group := fmt.Sprintf("%d|%d", start, shardOf(string(en.dev)))
			if mem[k] {
				groupLive[group] = true
				stored[k] = true
				return nil
			}
			groupLive[group] = groupLive[group] || false
			var w window
			if err := decodeWindow(en.payload, &w); err != nil {
				return err
			}
			d := e.devices.get(string(en.dev))
			if !w.emitted || w.pending || d != nil && start+e.sizeMs > d.finalBefore {
				stored[k] = true // reported below as a row not in state
			}
			return nil
		})
		for g, live := range groupLive {
			if !live {
				return fmt.Errorf("window group %s stored with no window in state", g)
			}
		}
		if err != nil {
			return err
		}
		return eachTimedEntry(tx.Bucket(bucketDedupGroups), gen, nil, func(end int64, en groupEntry) error {
			storedDedup[fmt.Sprintf("%s|%d", en.dev, end)] = decodeDedupIDs(en.payload)
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	var extra, missing []string
	for k := range stored {
		if !mem[k] {
			extra = append(extra, k)
		}
	}
	for k := range mem {
		if !stored[k] {
			missing = append(missing, k)
		}
	}
	sort.Strings(extra)
	sort.Strings(missing)
	if len(extra) > 0 || len(missing) > 0 {
		t.Fatalf("after a checkpoint: window rows not in state %v, windows in state without a row %v", firstFive(extra), firstFive(missing))
	}
	memDedup := map[string]bool{}
	for _, d := range e.devices.all() {
		for _, g := range d.dedup.groups() {
			k := fmt.Sprintf("%s|%d", d.name, g.end())
			memDedup[k] = true
			ids, _ := d.dedup.hotIDs(g.end())
			got := slices.Clone(storedDedup[k])
			want := slices.Clone(ids)
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("dedup group %s: stored %d ids, memory %d", k, len(got), len(want))
			}
		}
		for _, g := range d.dedup.cold() {
			k := fmt.Sprintf("%s|%d", d.name, g.end())
			memDedup[k] = true
			if len(storedDedup[k]) != g.count() {
				t.Fatalf("cold dedup group %s: stored %d ids, %d fingerprints", k, len(storedDedup[k]), g.count())
			}
		}
	}
	// A dropped dedup group's delete may wait as a final window's does:
	// the row must be one a load prunes or skips, and no group may hold
	// only those.
	pastCut := floorDiv(e.clock-e.pasNs, 1e6)
	dedupGroupLive := map[string]bool{}
	for k := range storedDedup {
		i := strings.LastIndexByte(k, '|')
		dev := k[:i]
		end, err := strconv.ParseInt(k[i+1:], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		group := fmt.Sprintf("%d|%d", end, shardOf(dev))
		if memDedup[k] {
			dedupGroupLive[group] = true
			continue
		}
		if _, seen := dedupGroupLive[group]; !seen {
			dedupGroupLive[group] = false // live only if another entry is
		}
		if d := e.devices.get(dev); d != nil && end > d.finalBefore && end > pastCut {
			t.Fatalf("dedup row %s stored but not in state", k)
		}
	}
	for g, live := range dedupGroupLive {
		if !live {
			t.Fatalf("dedup group %s stored with no group in state", g)
		}
	}
}

func firstFive(s []string) []string {
	if len(s) > 5 {
		return s[:5]
	}
	return s
}

// runChecked is runEvicting checking the state's invariants after every
// step, and the stored rows against memory after every checkpoint.
func runChecked(t *testing.T, bronzePath, statePath string, cfg Config, restart bool) []byte {
	t.Helper()
	return runEvicting(t, bronzePath, statePath, cfg, restart, func(s *Stage, checkpointed bool) {
		checkStateInvariants(t, s, checkpointed)
	}).out
}

// TestParkingKeepsStateConsistent: hopping windows, devices that expire
// and come back, a device fast enough that its dedup index comes and goes,
// backlogs and late data, run with checkpoints after every batch (with and
// without restarts) and without any: the state stays consistent after
// every step, and the outputs are byte for byte those of a run that keeps
// every window in memory.
func TestParkingKeepsStateConsistent(t *testing.T) {
	hopping := testConfig(t)
	hopping.Slide = 20 * time.Second
	hopping.AllowedLateness = 3 * time.Minute
	hopping.DeviceExpiry = 30 * time.Minute
	fast := testConfig(t) // many ids a device: the dedup index both ways
	fast.AllowedLateness = 10 * time.Minute
	fast.DeviceExpiry = 20 * time.Minute
	expiring := testConfig(t)
	expiring.DeviceExpiry = 10 * time.Minute
	expiring.IdleTimeout = time.Minute
	for _, tc := range firstUnderRace([]struct {
		name string
		cfg  Config
		o    genOpts
	}{
		{"hopping-expiry", hopping, genOpts{devices: 6, duration: 60 * time.Minute, period: 15 * time.Second, dupRate: 0.15, noIDRate: 0.1, lateRate: 0.1, backlog: 3, grid: time.Second}},
		{"fast", fast, genOpts{devices: 3, duration: 25 * time.Minute, period: 1 * time.Second, dupRate: 0.2, noIDRate: 0.05, lateRate: 0.1, backlog: 2}},
		{"expiring", expiring, genOpts{devices: 8, duration: 90 * time.Minute, period: 20 * time.Second, dupRate: 0.2, noIDRate: 0.1, lateRate: 0.1, backlog: 4, grid: 5 * time.Second}},
	}) {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			bronzePath := writeBronze(t, dir, genStream(99, tc.cfg, tc.o))
			cfg := tc.cfg
			checkpointNever(&cfg)
			var want []byte
			withoutParking(t, func() { want = runChecked(t, bronzePath, filepath.Join(dir, "resident.db"), cfg, false) })
			for _, batch := range []int{13, 300} {
				for _, restart := range []bool{false, true} {
					if restart == (batch == 13) {
						continue // a restart per small batch is slow; one of each is enough
					}
					cfg := tc.cfg
					cfg.MaxRecordsPerBatch = batch
					checkpointEveryBatch(&cfg)
					got := runChecked(t, bronzePath, filepath.Join(dir, fmt.Sprintf("e%d-%v.db", batch, restart)), cfg, restart)
					if !bytes.Equal(got, want) {
						t.Fatalf("batch %d restart %v: outputs differ\n%s", batch, restart, firstDiff(got, want))
					}
				}
				cfg := tc.cfg
				cfg.MaxRecordsPerBatch = batch
				checkpointNever(&cfg)
				got := runChecked(t, bronzePath, filepath.Join(dir, fmt.Sprintf("n%d.db", batch)), cfg, false)
				if !bytes.Equal(got, want) {
					t.Fatalf("batch %d parked, no checkpoint: outputs differ\n%s", batch, firstDiff(got, want))
				}
			}
		})
	}
}

// randomlyFailingObserver fails a commit at rate, so the stage goes back to
// its last checkpoint.
type randomlyFailingObserver struct {
	rng  *rand.Rand
	rate float64
}

func (o *randomlyFailingObserver) Emitted(tx *bolt.Tx, a *wire.Aggregate, at int64) error {
	if o.rng.Float64() < o.rate {
		return errors.New("injected failure")
	}
	return nil
}

// runPhases runs the stream in phases: each phase a config, steps with
// failing commits, a Flush at some offsets, and a crash (the stage dropped
// unflushed) between phases.
func runPhases(t *testing.T, bronzePath, statePath string, phases []Config, until []uint64, flushAt map[uint64]bool, failRate float64) []byte {
	t.Helper()
	br, err := openBronzeCopy(t, bronzePath)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	db := openDB(t, statePath, true)
	obs := &randomlyFailingObserver{rng: rand.New(rand.NewPCG(3, 4)), rate: failRate}
	var s *Stage
	for p, cfg := range phases {
		cfg.Observer = obs
		if s, err = New(db, br, cfg); err != nil {
			t.Fatal(err)
		}
		checkStateInvariants(t, s, false)
		for steps := 0; ; steps++ {
			if steps > 1_000_000 {
				t.Fatal("never finished")
			}
			if s.eng.offset >= until[p] {
				break
			}
			before := s.eng.offset
			res, err := s.Step()
			if err != nil {
				if strings.Contains(err.Error(), "injected failure") {
					continue
				}
				t.Fatal(err)
			}
			checkStateInvariants(t, s, false)
			if res.Records == 0 {
				break
			}
			for o := before + 1; o <= s.eng.offset; o++ {
				if flushAt[o] {
					obs.rate, failRate = 0, obs.rate
					if err := s.Flush(); err != nil {
						t.Fatal(err)
					}
					obs.rate = failRate
					checkStateInvariants(t, s, true)
					break
				}
			}
		}
	}
	obs.rate = 0
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	checkStateInvariants(t, s, true)
	out, _ := outputBytes(t, db)
	return out
}

// TestParkingThroughFailuresAndRestarts: commits that fail at random,
// Flush with revisions pending, and crashes followed by restarts under
// changed settings (a catch-up that defers what it emits), with and
// without checkpoints: consistent state after every step, and the outputs
// of a run that does not park.
func TestParkingThroughFailuresAndRestarts(t *testing.T) {
	base := testConfig(t)
	base.Slide = 20 * time.Second
	base.AllowedLateness = 3 * time.Minute
	base.DeviceExpiry = 30 * time.Minute
	dir := t.TempDir()
	recs := genStream(7, base, genOpts{devices: 6, duration: 100 * time.Minute, period: 15 * time.Second, dupRate: 0.15, noIDRate: 0.1, lateRate: 0.1, backlog: 3, grid: time.Second})
	bronzePath := writeBronze(t, dir, recs)
	n := uint64(len(recs))
	flushAt := map[uint64]bool{n / 7: true, n / 3: true, n / 2: true}
	changed := base
	changed.TriggerInterval = 10 * time.Second
	changed.WatermarkDelay = 2 * time.Second
	for _, tc := range firstUnderRace([]struct {
		name   string
		every  bool
		batch  int
		fail   float64
		phases []Config
		until  []uint64
	}{
		{"no-checkpoint-crash-changed", false, 37, 0.02, []Config{base, changed, changed}, []uint64{n / 4, 3 * n / 5, n + 10}},
		{"every-batch-crash-changed", true, 37, 0.02, []Config{base, changed, base}, []uint64{n / 4, 3 * n / 5, n + 10}},
		{"every-batch-small", true, 9, 0.01, []Config{base, changed}, []uint64{n / 2, n + 10}},
	}) {
		t.Run(tc.name, func(t *testing.T) {
			phases := slices.Clone(tc.phases)
			for i := range phases {
				phases[i].MaxRecordsPerBatch = tc.batch
				if tc.every {
					checkpointEveryBatch(&phases[i])
				} else {
					checkpointNever(&phases[i])
				}
			}
			fail := tc.fail
			var want []byte
			withoutParking(t, func() {
				want = runPhases(t, bronzePath, filepath.Join(dir, tc.name+"-ref.db"), phases, tc.until, flushAt, fail)
			})
			got := runPhases(t, bronzePath, filepath.Join(dir, tc.name+".db"), phases, tc.until, flushAt, fail)
			if !bytes.Equal(got, want) {
				t.Fatalf("outputs differ\n%s", firstDiff(got, want))
			}
		})
	}
}

// TestParkingOnAWideGrid: windows sliding a third of their size, lateness
// over 64 slides (the evicted starts' slice form), devices sharing group
// rows, idle closes and expiry, with a restart after every batch.
func TestParkingOnAWideGrid(t *testing.T) {
	withShards(t, 2)
	wide := testConfig(t)
	wide.Size, wide.Slide = 30*time.Second, 10*time.Second
	wide.AllowedLateness = 20 * time.Minute
	wide.DeviceExpiry = 15 * time.Minute
	wide.IdleTimeout = 40 * time.Second
	dir := t.TempDir()
	bronzePath := writeBronze(t, dir, genStream(5, wide, genOpts{devices: 5, duration: 45 * time.Minute, period: 4 * time.Second, dupRate: 0.2, noIDRate: 0.1, lateRate: 0.15, backlog: 3, grid: time.Second}))
	cfg := wide
	checkpointNever(&cfg)
	var want []byte
	withoutParking(t, func() { want = runChecked(t, bronzePath, filepath.Join(dir, "resident.db"), cfg, false) })
	for _, batch := range []int{40} {
		for _, restart := range []bool{true} {
			cfg := wide
			cfg.MaxRecordsPerBatch = batch
			checkpointEveryBatch(&cfg)
			got := runChecked(t, bronzePath, filepath.Join(dir, fmt.Sprintf("e%d-%v.db", batch, restart)), cfg, restart)
			if !bytes.Equal(got, want) {
				t.Fatalf("batch %d restart %v: outputs differ\n%s", batch, restart, firstDiff(got, want))
			}
		}
	}
}
