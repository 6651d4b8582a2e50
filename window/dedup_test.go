package window

import (
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
)

// TestDedupSetMatchesAMap drives a dedupSet the way the engine does —
// lookups, adds of ids not seen under ends after the horizon, a horizon
// that only grows, prunes, checkpoints that make old groups cold, restarts
// — against the plain map it replaced (id → the end it was last added
// under; it counts while that end is after the horizon). Cold groups are
// read from a map standing in for the state database, written as a
// checkpoint writes it. Small id spaces make repeats and stale copies
// common, and sets cross dedupIndexMin both ways.
func TestDedupSetMatchesAMap(t *testing.T) {
	// Both ways of looking up cold fingerprints must be exercised: a scan
	// of a few, and coldBits once there are coldBitsMin.
	coldScanned, coldBitsUsed := false, false
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		var s dedupSet
		ref := map[uint64]int64{}
		disk := map[int64][]uint64{}
		reads := 0
		fromDisk := func(end int64) []uint64 {
			ids, ok := disk[end]
			if !ok {
				t.Fatalf("seed %d: cold group %d has no row", seed, end)
			}
			reads++
			return slices.Clone(ids)
		}
		horizon := int64(-5)
		idSpace := uint64(50 + rng.IntN(2000))
		indexed, wentCold, warmed := false, false, false
		for step := range 20_000 {
			switch r := rng.IntN(100); {
			case r < 80:
				// Spread over all 64 bits, as event-id hashes are.
				id := rng.Uint64N(idSpace) * 0x9E3779B97F4A7C15
				end := horizon + 1 + rng.Int64N(12)
				want := false
				if le, ok := ref[id]; ok && le > horizon {
					want = true
				}
				got := s.seen(id, horizon) || s.coldCandidates(id, horizon, func(end int64) bool {
					return slices.Contains(fromDisk(end), id)
				})
				if got != want {
					t.Fatalf("seed %d step %d: seen(%d) = %v, want %v", seed, step, id, got, want)
				}
				if !want {
					if i, ok := s.coldAt(end); ok {
						s.warm(i, fromDisk(end))
						warmed = true
					}
					s.add(id, end)
					ref[id] = end
				}
			case r < 82:
				// The horizon moves; the engine prunes at once, the test
				// only sometimes, so groups past it are still looked at.
				horizon += rng.Int64N(3)
				if rng.IntN(3) == 0 {
					s.prune(horizon)
				}
			default:
				// What a checkpoint does between batches: write the dirty
				// groups and delete the dropped ones, make the groups up to
				// a watermark cold; half the time followed by a restart,
				// which loads the set from its rows.
				for _, end := range s.dropped() {
					delete(disk, end)
				}
				for _, g := range s.groups() {
					if g.isDirty() {
						ids, _ := s.hotIDs(g.end())
						disk[g.end()] = slices.Clone(ids)
					}
				}
				s.written()
				through := horizon + rng.Int64N(8)
				s.evict(through)
				if rng.IntN(2) == 0 {
					var r dedupSet
					for _, end := range slices.Sorted(maps.Keys(disk)) {
						if end <= through {
							r.loadCold(end, slices.Clone(disk[end]))
						} else {
							r.load(end, slices.Clone(disk[end]))
						}
					}
					s = r
				}
			}
			indexed = indexed || s.index != nil
			if s.index != nil {
				counts := map[uint32]uint32{}
				for _, id := range s.ids() {
					counts[uint32(id)]++
				}
				if !maps.Equal(counts, s.index) {
					t.Fatalf("seed %d step %d: the index counts %d keys, the hot ids make %d", seed, step, len(s.index), len(counts))
				}
			}
			wentCold = wentCold || len(s.cold()) > 0
			coldScanned = coldScanned || len(s.cold()) > 0 && s.coldBits() == nil
			coldBitsUsed = coldBitsUsed || s.coldBits() != nil
			live := 0
			for _, g := range s.groups() {
				live += g.count()
			}
			if live != len(s.ids()) {
				t.Fatalf("seed %d step %d: %d ids, hot groups count %d", seed, step, len(s.ids()), live)
			}
			words := 0
			for sec := range nSections {
				words += (int(s.n[sec])*sectionSize[sec] + 7) / 8
			}
			if words != len(s.buf) {
				t.Fatalf("seed %d step %d: the sections take %d words of a buffer of %d", seed, step, words, len(s.buf))
			}
			cold := 0
			for _, g := range s.cold() {
				cold += g.count()
			}
			if cold != len(s.coldFP()) {
				t.Fatalf("seed %d step %d: cold groups count %d ids, %d fingerprints", seed, step, cold, len(s.coldFP()))
			}
		}
		if idSpace > dedupIndexMin*2 && !indexed {
			t.Errorf("seed %d: %d ids never built the index", seed, idSpace)
		}
		if !wentCold || !warmed || reads == 0 {
			t.Errorf("seed %d: cold groups %v, warmed %v, %d reads: the cold path was not exercised", seed, wentCold, warmed, reads)
		}
	}
	if !coldScanned || !coldBitsUsed {
		t.Errorf("cold fingerprints scanned %v, through coldBits %v: one lookup path was never exercised", coldScanned, coldBitsUsed)
	}
}

func TestDedupSetDropsWholeGroupsInOrder(t *testing.T) {
	var s dedupSet
	for _, end := range []int64{30, 10, 20, 10} {
		if !s.add(uint64(end), end) && end != 10 {
			t.Errorf("add under a new end %d did not report a newly dirty group", end)
		}
	}
	if s.minEnd() != 10 || len(s.groups()) != 3 {
		t.Fatalf("groups %+v, want ends 10, 20, 30", s.groups())
	}
	s.written()
	groups, ids := s.prune(20)
	if groups != 2 || ids != 3 || len(s.ids()) != 1 || s.minEnd() != 30 {
		t.Fatalf("prune(20) dropped %d groups, %d ids; left %d ids, minEnd=%d", groups, ids, len(s.ids()), s.minEnd())
	}
	if len(s.dropped()) != 2 || s.dropped()[0] != 10 || s.dropped()[1] != 20 {
		t.Errorf("dropped ends %v, want [10 20] for the checkpoint to delete", s.dropped())
	}
	if s.seen(10, 20) || !s.seen(30, 20) {
		t.Error("after prune(20): id 10 still seen or id 30 lost")
	}
}

// loadModeSets is load mode's dedup shape: 10,000 devices, each holding 11
// groups of 6 ids (readings every 10 s, 1-minute windows, 10 minutes of
// lateness), with the groups ending at or before coldThrough cold as after
// a checkpoint; and 4096 new ids to look up.
func loadModeSets(coldThrough int64) (sets []dedupSet, probes []uint64) {
	rng := rand.New(rand.NewPCG(1, 2))
	sets = make([]dedupSet, 10_000)
	for d := range sets {
		for g := range int64(11) {
			for range 6 {
				sets[d].add(rng.Uint64(), g+1)
			}
		}
		sets[d].written()
		sets[d].evict(coldThrough)
	}
	probes = make([]uint64, 4096)
	for i := range probes {
		probes[i] = rng.Uint64()
	}
	return sets, probes
}

// BenchmarkDedupSeen looks up new ids (the common case) in load mode's
// sets, all hot. The devices are visited in turn, so their groups are
// mostly not in cache.
func BenchmarkDedupSeen(b *testing.B) {
	sets, probes := loadModeSets(0)
	b.ResetTimer()
	found := 0
	for i := range b.N {
		if sets[i%len(sets)].seen(probes[i%len(probes)], 0) {
			found++
		}
	}
	if found > b.N/100 {
		b.Fatalf("%d of %d random ids seen", found, b.N)
	}
}

// BenchmarkDedupSeenCold is BenchmarkDedupSeen with ten of each device's
// eleven groups cold, as after a checkpoint in load mode: a new id is
// looked up in the hot group and then in the cold fingerprints, and reads
// a group back only when a fingerprint matches by chance.
func BenchmarkDedupSeenCold(b *testing.B) {
	sets, probes := loadModeSets(10)
	reads := 0
	check := func(int64) bool { reads++; return false }
	b.ResetTimer()
	found := 0
	for i := range b.N {
		s, id := &sets[i%len(sets)], probes[i%len(probes)]
		if s.seen(id, 0) || s.coldCandidates(id, 0, check) {
			found++
		}
	}
	if found > 0 || reads > b.N/100+1 {
		b.Fatalf("%d of %d random ids seen, %d group reads", found, b.N, reads)
	}
	b.ReportMetric(float64(reads)/float64(b.N), "reads/lookup")
}

// BenchmarkDedupHeld reports the heap load mode's dedup sets hold, per
// device, at their largest: right before a checkpoint. Each of 10,000
// devices adds six ids a group end (readings every 10 s, 1-minute
// windows), groups go after 10 minutes of lateness, and a checkpoint
// every seven ends (load mode's 10 s between checkpoints at 40 times the
// clock) makes the groups its watermark passed cold.
func BenchmarkDedupHeld(b *testing.B) {
	const devices, lateness, checkpointEvery = 10_000, 10, 7
	var perDevice float64
	for range b.N {
		rng := rand.New(rand.NewPCG(1, 2))
		perDevice = float64(heapHeld(func() []dedupSet {
			sets := make([]dedupSet, devices)
			for end := int64(1); end <= 40; end++ {
				for d := range sets {
					s := &sets[d]
					s.prune(end - lateness - 1)
					for range 6 {
						s.add(rng.Uint64(), end)
					}
				}
				if end%checkpointEvery == 0 && end < 40 {
					for d := range sets {
						sets[d].written()
						sets[d].evict(end - 1)
					}
				}
			}
			return sets
		})) / devices
	}
	b.ReportMetric(perDevice, "bytes/device")
}

// heapHeld returns the heap what build returns holds.
func heapHeld[T any](build func() T) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	v := build()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(v)
	return after.HeapAlloc - before.HeapAlloc
}

// BenchmarkDedupHeldFast reports the heap per id of the sets of fast
// devices, past dedupIndexMin and all hot: BenchmarkAgentIngest's drain,
// 100 devices at ten readings a second each, within 10 minutes of
// lateness (3,000 ids a device; the index counts them by their low 32
// bits, about 13 bytes of map an id, on top of the 8 of the id itself).
func BenchmarkDedupHeldFast(b *testing.B) {
	const devices, perGroup, groups = 100, 600, 5
	var perID float64
	for range b.N {
		rng := rand.New(rand.NewPCG(1, 2))
		var sets []dedupSet
		perID = float64(heapHeld(func() []dedupSet {
			sets = make([]dedupSet, devices)
			for end := int64(1); end <= groups; end++ {
				for d := range sets {
					for range perGroup {
						sets[d].add(rng.Uint64(), end)
					}
				}
			}
			return sets
		})) / (devices * perGroup * groups)
		for d := range sets {
			if sets[d].index == nil {
				b.Fatalf("device %d: %d ids and no index", d, len(sets[d].ids()))
			}
		}
	}
	b.ReportMetric(perID, "bytes/id")
}

// TestDedupIndexCountsSharedBits: the index counts ids by their low 32
// bits, so two ids that share them, or one id held by a group that no
// longer counts and by a newer one, stay findable when a group holding
// one of them goes; and an id whose bits are counted is only seen if a
// group that counts holds it.
func TestDedupIndexCountsSharedBits(t *testing.T) {
	var s dedupSet
	for i := range uint64(dedupIndexMin + 10) {
		s.add(i<<40|0xABCD0000+i, 40) // filler that stays: bits distinct
	}
	a, b := uint64(0x1_0000_0001), uint64(0x2_0000_0001) // low bits equal
	s.add(a, 10)
	s.add(b, 20)
	s.add(a, 30) // a second copy, as after group 10 stopped counting
	if s.index == nil {
		t.Fatal("no index past dedupIndexMin ids")
	}
	if !s.seen(a, 0) || !s.seen(b, 0) {
		t.Fatal("ids added are not seen")
	}
	if s.seen(0x3_0000_0001, 0) {
		t.Fatal("an id that shares counted bits but was never added is seen")
	}
	if s.seen(b, 20) {
		t.Fatal("an id held only by a group that no longer counts is seen")
	}
	s.prune(10) // group 10 goes, with a's first copy
	if s.index == nil {
		t.Fatal("the index went with group 10")
	}
	if !s.seen(a, 10) || !s.seen(b, 10) {
		t.Fatalf("after group 10 went: a seen %v, b seen %v; both are held by groups that count", s.seen(a, 10), s.seen(b, 10))
	}
}
