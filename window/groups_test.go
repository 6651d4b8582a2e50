package window

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"
	"unsafe"

	bolt "go.etcd.io/bbolt"
)

// toRowPerEntry rewrites the state database's groups in the layout before
// them, a row per window (start | device | metric), dedup group (end |
// device) and device (name), and returns how many rows of each it wrote.
func toRowPerEntry(t *testing.T, db *bolt.DB) (rows map[string]int) {
	t.Helper()
	rows = map[string]int{}
	err := db.Update(func(tx *bolt.Tx) error {
		for _, l := range rowLayouts {
			old, err := tx.CreateBucket(l.old)
			if err != nil {
				return err
			}
			keyLen := timedKeyLen
			if bytes.Equal(l.groups, bucketDeviceGroups) {
				keyLen = deviceKeyLen
			}
			gen := getU64(tx.Bucket(bucketMeta), keyGen)
			err = eachGroup(tx.Bucket(l.groups), keyLen, gen, nil, func(k, v []byte) error {
				var key []byte
				if len(k) == timedKeyLen {
					at, _, err := parseGroupKey(k)
					if err != nil {
						return err
					}
					key = binary.BigEndian.AppendUint64(nil, orderedInt(at))
				}
				return eachEntry(v, func(en groupEntry) error {
					k := bytes.Clone(key)
					if k == nil {
						k = bytes.Clone(en.dev) // a device row
					} else {
						k = appendBytes(k, en.dev)
						k = append(k, en.metric...)
					}
					rows[string(l.old)]++
					return old.Put(k, bytes.Clone(en.payload))
				})
			})
			if err != nil {
				return err
			}
			if err := tx.DeleteBucket(l.groups); err != nil {
				return err
			}
			if _, err := tx.CreateBucket(l.groups); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// groupEntries counts the entries of each group bucket.
func groupEntries(t *testing.T, db *bolt.DB) map[string]int {
	t.Helper()
	n := map[string]int{}
	err := db.View(func(tx *bolt.Tx) error {
		for _, l := range rowLayouts {
			if tx.Bucket(l.old) != nil {
				t.Errorf("bucket %s of the old layout is still there", l.old)
			}
			err := tx.Bucket(l.groups).ForEach(func(_, v []byte) error {
				return eachEntry(v, func(groupEntry) error { n[string(l.old)]++; return nil })
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRowLayoutMigrates: a state database in the layout before groups (a
// row per window, dedup group and device), written halfway through a
// stream with evicted windows and cold dedup groups, opens into groups and
// the stage goes on to write byte for byte the outputs of a run that never
// changed layout.
func TestRowLayoutMigrates(t *testing.T) {
	withShards(t, 2) // several devices a group
	cfg := testConfig(t)
	cfg.AllowedLateness = 10 * time.Minute
	dir := t.TempDir()
	bronzePath := filepath.Join(dir, "bronze.db")
	br := openBronze(t, bronzePath)
	appendAll(t, br, genStream(33, cfg, genOpts{devices: 6, duration: 90 * time.Minute, period: 20 * time.Second,
		dupRate: 0.1, lateRate: 0.1, backlog: 1, grid: time.Second}))
	last := br.LastSeq()
	br.Close()

	ref := cfg
	checkpointNever(&ref)
	want := runEvicting(t, bronzePath, filepath.Join(dir, "reference.db"), ref, false)

	cfg.MaxRecordsPerBatch = 50
	checkpointEveryBatch(&cfg)
	br, err := openBronzeCopy(t, bronzePath)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	db := openDB(t, filepath.Join(dir, "state.db"), true)
	s, err := New(db, br, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for s.eng.offset < last/2 {
		if _, err := s.Step(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	evicted, cold := s.Stats().EvictedWindows, coldIDs(s.eng)
	rows := toRowPerEntry(t, db)
	for _, l := range rowLayouts {
		if rows[string(l.old)] == 0 {
			t.Fatalf("no rows in %s: the test exercises nothing", l.old)
		}
	}
	if evicted == 0 || cold == 0 {
		t.Fatalf("%d windows evicted, %d dedup ids cold at the switch: the test exercises nothing", evicted, cold)
	}

	if s, err = New(db, br, cfg); err != nil {
		t.Fatal(err)
	}
	if got := groupEntries(t, db); !maps.Equal(got, rows) {
		t.Fatalf("entries in groups after the migration %v, want the rows before it %v", got, rows)
	}
	runToEnd(t, s)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	got, _ := outputBytes(t, db)
	if !bytes.Equal(got, want.out) {
		t.Fatalf("outputs after the migration differ from the run without it\n%s", firstDiff(got, want.out))
	}
	t.Logf("rows migrated %v, with %d windows evicted and %d dedup ids cold", rows, evicted, cold)
}

// putChange and delChange are changes to the window entry (dev, metric).
func putChange(dev, metric string, w *window) rowChange {
	return rowChange{at: w.start, kind: putWindow, ref: unsafe.Pointer(&series{dev: &device{name: dev}, name: metric, windows: []*window{w}})}
}

func delChange(dev, metric string) rowChange {
	return rowChange{kind: delMigrated, ref: unsafe.Pointer(&winRef{dev: dev, metric: metric})}
}

// TestMergeGroup: the entries of a group row stay sorted by (device,
// metric) through puts, deletes and a delete followed by a put of one
// window in the same checkpoint.
func TestMergeGroup(t *testing.T) {
	w := func(count uint64) *window { return &window{count: count, sum: float64(count)} }
	var old []byte
	old = appendEntry(old, "a", "t", appendWindow(nil, w(1)))
	old = appendEntry(old, "c", "t", appendWindow(nil, w(2)))
	old = appendEntry(old, "c", "u", appendWindow(nil, w(3)))
	changes := []rowChange{
		delChange("a", "t"),       // delete
		putChange("b", "t", w(4)), // insert between
		putChange("c", "u", w(5)), // put ...
		delChange("c", "u"),       // ... and delete: the put wins
		putChange("d", "t", w(6)), // append
		delChange("e", "t"),       // delete of a window not stored
	}
	out, _, err := mergeGroup(nil, nil, old, changes, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	err = eachEntry(out, func(en groupEntry) error {
		var win window
		if err := decodeWindow(en.payload, &win); err != nil {
			return err
		}
		got = append(got, fmt.Sprintf("%s/%s=%d", en.dev, en.metric, win.count))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"b/t=4", "c/t=2", "c/u=5", "d/t=6"}
	if len(got) != len(want) {
		t.Fatalf("entries %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("entries %v, want %v", got, want)
		}
	}
	if _, _, err := mergeGroup(nil, nil, old[:len(old)-3], nil, nil); err == nil {
		t.Fatal("a truncated group row merged without an error")
	}
	// Merging into reused buffers allocates nothing: comparing a change
	// with a stored entry takes no copy of the entry's names.
	old = appendEntry(nil, "device-0001", "temperature", appendWindow(nil, w(1)))
	old = appendEntry(old, "device-0003", "temperature", appendWindow(nil, w(2)))
	changes = []rowChange{putChange("device-0002", "temperature", w(3)), putChange("device-0003", "temperature", w(4))}
	buf, scratch := out, []byte(nil)
	merge := func() {
		var err error
		if buf, scratch, err = mergeGroup(buf[:0], scratch, old, changes, nil); err != nil {
			t.Fatal(err)
		}
	}
	merge()
	if n := testing.AllocsPerRun(100, merge); n != 0 {
		t.Fatalf("%.1f allocations a merge into reused buffers, want 0", n)
	}
}

// FuzzGroupRow: any stored group row either reads as entries or fails with
// ErrCorruptState, never panics; a row that reads merges with no changes
// into the same entries; and a row in order merges with a put of each of
// its keys into a row of the same keys in the same order.
func FuzzGroupRow(f *testing.F) {
	var row []byte
	row = appendEntry(row, "d1", "t", appendWindow(nil, &window{count: 1}))
	row = appendEntry(row, "d2", "", []byte{1, 2, 3, 4, 5, 6, 7, 8})
	f.Add(row)
	f.Add(row[:len(row)-2])
	f.Add([]byte{0x80})
	f.Fuzz(func(t *testing.T, v []byte) {
		var keys []rowChange
		var entries [][3]string
		err := eachEntry(v, func(en groupEntry) error {
			keys = append(keys, delChange(string(en.dev), string(en.metric)))
			entries = append(entries, [3]string{string(en.dev), string(en.metric), string(en.payload)})
			return nil
		})
		if err != nil {
			if !errors.Is(err, ErrCorruptState) {
				t.Fatalf("error %v is not ErrCorruptState", err)
			}
			if _, _, merr := mergeGroup(nil, nil, v, nil, nil); merr == nil {
				t.Fatal("a row eachEntry refuses merged without an error")
			}
			return
		}
		// Equal entries, not bytes: a length may be stored as a longer
		// uvarint than the one merging writes.
		same, _, err := mergeGroup(nil, nil, v, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		var sameEntries [][3]string
		if err := eachEntry(same, func(en groupEntry) error {
			sameEntries = append(sameEntries, [3]string{string(en.dev), string(en.metric), string(en.payload)})
			return nil
		}); err != nil || !slices.Equal(sameEntries, entries) {
			t.Fatalf("merging no changes: entries %q (%v); want %q", sameEntries, err, entries)
		}
		for i := 1; i < len(keys); i++ {
			if compareChanges(keys[i-1], keys[i]) >= 0 {
				return // not a row a checkpoint writes: merging needs entries in order
			}
		}
		puts := make([]rowChange, len(keys))
		for i := range keys {
			puts[i] = putChange(entries[i][0], entries[i][1], &window{})
		}
		merged, _, err := mergeGroup(nil, nil, v, puts, nil)
		if err != nil {
			t.Fatal(err)
		}
		var got []rowChange
		if err := eachEntry(merged, func(en groupEntry) error {
			got = append(got, delChange(string(en.dev), string(en.metric)))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(got, keys, func(a, b rowChange) bool { return compareChanges(a, b) == 0 }) {
			t.Fatalf("entries after putting every key: %v, want %v", got, keys)
		}
	})
}

// TestResetStateDropsTheOldLayout: reset-state on a state database still in
// the row-per-entry layout drops those rows too, so the next start does
// not migrate state the reset was meant to discard.
func TestResetStateDropsTheOldLayout(t *testing.T) {
	cfg := testConfig(t)
	db, br := openDB(t, "", true), openBronze(t, "")
	appendAll(t, br, genStream(5, cfg, genOpts{devices: 3, duration: 10 * time.Minute, period: 10 * time.Second}))
	s, err := New(db, br, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, s)
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if rows := toRowPerEntry(t, db); rows[string(bucketWindows)] == 0 {
		t.Fatal("no window rows to reset: the test exercises nothing")
	}
	if err := ResetState(db); err != nil {
		t.Fatal(err)
	}
	s, err = New(db, br, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(windowRows(t, db)); n != 0 || s.eng.devices.len() != 0 {
		t.Fatalf("after reset-state: %d stored windows, %d devices in memory; want none", n, s.eng.devices.len())
	}
}

// TestWindowPortionsKeepStartsWhole: a checkpoint writes its window
// changes in portions of consecutive starts of at most windowPortion
// changes, or one start of its own with more; each start is in exactly
// one portion, so each group row is merged once; and it says how many the
// largest holds (the checkpoint's array is made that large).
func TestWindowPortionsKeepStartsWhole(t *testing.T) {
	defer func(was int) { windowPortion = was }(windowPortion)
	cfg := testConfig(t)
	e := newEngine(&cfg)
	perStart := map[int64]int{-20: 1, 10: 2, 20: 2, 30: 5, 40: 1}
	for _, start := range []int64{30, 10, 40, -20, 20} {
		for i := range perStart[start] {
			ser := e.addSeries(e.newDevice(fmt.Sprintf("d%d-%d", start, i)), []byte("m"))
			w := &window{ser: ser.id, start: start}
			ser.windows = append(ser.windows, w)
			e.markWin(w)
		}
	}
	for _, c := range []struct {
		portion int
		ends    []int64
	}{{3, []int64{10, 20, 30, 40}}, {5, []int64{20, 30, 40}}, {100, []int64{40}}} {
		windowPortion = c.portion
		ends, largest := windowPortions(e)
		if !slices.Equal(ends, c.ends) {
			t.Fatalf("portions of %d: ends %v, want %v", c.portion, ends, c.ends)
		}
		lo, seen, most := int64(math.MinInt64), map[int64]int{}, 0
		for _, hi := range ends {
			changes := windowChanges(nil, e, lo, hi)
			if len(changes) > c.portion && len(changes) != perStart[hi] {
				t.Fatalf("portions of %d: %d changes through %d", c.portion, len(changes), hi)
			}
			most = max(most, len(changes))
			for _, ch := range changes {
				seen[ch.at]++
			}
			lo = hi + 1
		}
		if !maps.Equal(seen, perStart) {
			t.Fatalf("portions of %d: changes by start %v, want %v", c.portion, seen, perStart)
		}
		if largest != most {
			t.Fatalf("portions of %d: the largest said to hold %d changes, the largest holds %d", c.portion, largest, most)
		}
	}
}

// sortByGroup orders changes as sort.Sort(byGroup) does, group by group,
// with the same changes in each group: for a checkpoint's few times (the
// buckets), for times around zero and noTimeKey, and past maxFlagStarts
// (the fallback).
func TestSortByGroupOrdersAsCompareGroups(t *testing.T) {
	rng := uint64(1)
	next := func(n int) int {
		rng = rng*6364136223846793005 + 1442695040888963407
		return int(rng>>33) % n
	}
	type entry struct {
		at    int64
		shard uint16
		id    parkRef // tells the changes apart
	}
	manyTimes := make([]int64, 100) // more times than the shards below
	for i := range manyTimes {
		manyTimes[i] = int64(i) * 60_000
	}
	for _, tc := range []struct {
		name   string
		n      int
		times  []int64
		shards uint32
	}{
		{"more times than shards", 2_000, manyTimes, 2},
		{"a portion's starts", 20_000, []int64{1_700_000_040_000, 1_700_000_100_000, 1_700_000_160_000, 1_700_000_220_000}, 0},
		{"dedup ends and devices", 5_000, []int64{noTimeKey, -60_000, 0, 60_000}, 0},
		{"one time", 3_000, []int64{noTimeKey}, 0},
		{"more times than buckets", 10_000, nil, 0},
		{"empty", 0, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.shards != 0 {
				old := groupShards
				groupShards = tc.shards
				t.Cleanup(func() { groupShards = old })
			}
			changes := make([]rowChange, tc.n)
			for i := range changes {
				at := int64(next(maxFlagStarts*4)) * 1000
				if tc.times != nil {
					at = tc.times[next(len(tc.times))]
				}
				changes[i] = rowChange{at: at, shard: uint16(next(int(groupShards))), parked: parkRef(i)}
			}
			want := slices.Clone(changes)
			sort.Sort(byGroup(want))
			sortByGroup(changes)
			groupOf := func(c []rowChange) map[[2]int64][]parkRef {
				m := map[[2]int64][]parkRef{}
				for _, x := range c {
					k := [2]int64{x.at, int64(x.shard)}
					m[k] = append(m[k], x.parked)
				}
				for _, ids := range m {
					slices.Sort(ids)
				}
				return m
			}
			for i := range changes {
				if compareGroups(changes[i], want[i]) != 0 {
					t.Fatalf("change %d of %d in group (%d, %d), want (%d, %d)", i, len(changes), changes[i].at, changes[i].shard, want[i].at, want[i].shard)
				}
			}
			got, exp := groupOf(changes), groupOf(want)
			if !maps.EqualFunc(got, exp, slices.Equal[[]parkRef]) {
				t.Fatal("a group holds other changes than sort.Sort's")
			}
		})
	}
}

// BenchmarkSortByGroup sorts a load-mode checkpoint's portion of window
// changes (16,384, four starts, every shard) against sort.Sort.
func BenchmarkSortByGroup(b *testing.B) {
	src := make([]rowChange, windowPortion)
	for i := range src {
		src[i] = rowChange{at: int64(i%4) * 60_000, shard: uint16(i * 7919 % int(groupShards))}
	}
	work := make([]rowChange, len(src))
	for _, bc := range []struct {
		name string
		sort func([]rowChange)
	}{{"buckets", sortByGroup}, {"sort.Sort", func(c []rowChange) { sort.Sort(byGroup(c)) }}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				copy(work, src)
				bc.sort(work)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(src)), "ns/change")
		})
	}
}
