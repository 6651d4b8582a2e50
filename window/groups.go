package window

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"
	"strings"
	"unsafe"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/internal/boltkv"
)

// The state is stored in groups: windows in one row per (window start,
// shard of the device name) holding every metric's window of the devices of
// that shard at that start; dedup ids in one row per (group end, shard);
// devices in one row per shard. A bbolt row costs far more than its bytes:
// in load mode (10,000 devices) a checkpoint wrote about 65,000 window
// rows, 28,000 dedup rows and 10,000 device rows, and bbolt spent several
// hundred bytes of heap on each (its inode in a leaf node that grows by
// append until the commit splits it, a cursor stack, a key copy, page
// buffers): the larger part of a checkpoint's CPU and of the agent's
// garbage. Grouped, the same checkpoint writes a few thousand rows of
// about a kilobyte.
//
// A checkpoint merges a group's changes into its stored row, which holds
// entries the engine no longer has in memory (evicted windows, cold dedup
// groups), so a changed group is read and rewritten whole. With
// groupShards shards a group of a 10,000-device fleet holds about ten
// devices, and a small fleet's group is one device's entries. Window and
// dedup keys lead with the time, as the row-per-entry layout did, so
// in-order data touches a few adjacent pages.
//
// Keys: time (8, order-preserving) | shard (2); devices: shard (2). A row
// is its entries sorted by (device, metric), each the device and metric
// (empty for dedup and devices) as length-prefixed strings and the payload
// as length-prefixed bytes: a window's encoding (appendWindow), a dedup
// group's ids (8 bytes each, ascending) or a device's (appendDevice).

// The group buckets; bucketWindows, bucketDedup and bucketDevices hold the
// layout before them (a row per entry), migrated at open.
var (
	bucketWindowGroups = []byte("window_groups")
	bucketDedupGroups  = []byte("window_dedup_groups")
	bucketDeviceGroups = []byte("window_device_groups")
)

// groupShards is part of the stored layout: changing it needs a
// migration. It is a variable only so tests can put several devices in a
// group.
var groupShards uint32 = 1024

// StatePageSize is the page size a new state database is made with
// (bbolt's PageSize; a file keeps the size it was made with). A
// checkpoint reads and rewrites thousands of group rows spread over the
// file, and bbolt's cost follows the pages it touches more than the bytes:
// each page read after a release is a page fault, each changed page a
// node to build, split and write. With 4 KiB pages a leaf held about two
// groups (both versions of each), a changed group cost a page of its own,
// and a group over about 2 KiB an overflow page: under sustained load
// (10,000 devices, 120 s) the checkpoints took 56 % of the agent's CPU,
// 18-22 s per million readings in all; with 32 KiB pages 11.8-12.7 s
// in the series beside them (16 KiB: 13.6-13.9, 64 KiB: 11.7-12.6), and
// 11.8-16.2 over eight runs of the session. The price is at a quiet
// gateway, where every commit writes its few pages whole: 74 % more bytes
// written (Bronze's pages stay 4 KiB). docs/performance.md, session 46.
const StatePageSize = 32 << 10

// shardOf is the FNV-1a hash of the device name modulo groupShards.
func shardOf(dev string) uint16 {
	h := uint32(2166136261)
	for i := 0; i < len(dev); i++ {
		h ^= uint32(dev[i])
		h *= 16777619
	}
	return uint16(h % groupShards)
}

// noTimeKey marks the groups keyed by shard alone (devices).
const noTimeKey = noTime

// The lengths of a group key: time-led (windows, dedup) and devices'.
const (
	timedKeyLen  = 10
	deviceKeyLen = 2
)

// groupBuckets are the group buckets by their index in a groupSweep.
var groupBuckets = [...]struct {
	name   []byte
	keyLen int
}{
	sweepWindows: {bucketWindowGroups, timedKeyLen},
	sweepDevices: {bucketDeviceGroups, deviceKeyLen},
	sweepDedup:   {bucketDedupGroups, timedKeyLen},
}

const (
	sweepWindows = iota
	sweepDevices
	sweepDedup
)

// groupSweep lists, per group bucket, the keys of group versions that no
// longer serve (see slotted).
type groupSweep [3][][]byte

func appendGroupKey(k []byte, at int64, shard uint16) []byte {
	if at != noTimeKey {
		k = binary.BigEndian.AppendUint64(k, orderedInt(at))
	}
	return binary.BigEndian.AppendUint16(k, shard)
}

// parseGroupKey parses a time-led group key.
func parseGroupKey(k []byte) (at int64, shard uint16, err error) {
	if len(k) != timedKeyLen {
		return 0, 0, fmt.Errorf("%w: group key %x", ErrCorruptState, k)
	}
	return fromOrdered(binary.BigEndian.Uint64(k)), binary.BigEndian.Uint16(k[8:]), nil
}

// eachTimedEntry calls fn with each entry of the current rows of the
// time-led group bucket b and its group's time, in key order (see
// eachGroup for committed and sweep).
func eachTimedEntry(b *bolt.Bucket, committed uint64, sweep *[][]byte, fn func(at int64, en groupEntry) error) error {
	return eachGroup(b, timedKeyLen, committed, sweep, func(k, v []byte) error {
		at, _, err := parseGroupKey(k)
		if err != nil {
			return err
		}
		return eachEntry(v, func(en groupEntry) error { return fn(at, en) })
	})
}

// groupEntry is one entry of a group row.
type groupEntry struct{ dev, metric, payload []byte }

// eachEntry calls fn with each entry of the group row v, in order.
func eachEntry(v []byte, fn func(groupEntry) error) error {
	d := decoder{b: v}
	for len(d.b) > 0 {
		en := groupEntry{dev: d.bytes(), metric: d.bytes(), payload: d.bytes()}
		if d.err != nil {
			return fmt.Errorf("%w: group row: %v", ErrCorruptState, d.err)
		}
		if err := fn(en); err != nil {
			return err
		}
	}
	return nil
}

// findEntry returns the payload of the entry (dev, metric) of the group row
// v, or nil.
func findEntry(v []byte, dev, metric string) ([]byte, error) {
	var payload []byte
	err := eachEntry(v, func(en groupEntry) error {
		if string(en.dev) == dev && string(en.metric) == metric {
			payload = en.payload
		}
		return nil
	})
	return payload, err
}

func appendEntry(b []byte, dev, metric string, payload []byte) []byte {
	b = appendString(b, dev)
	b = appendString(b, metric)
	return appendBytes(b, payload)
}

// winRef names a stored window by its names (a migration's delete).
type winRef struct {
	start       int64
	dev, metric string
}

// seriesStart names a window of a series the next checkpoint deletes: 16
// bytes where a winRef takes 40, and in load mode (10,000 devices) a
// checkpoint deletes up to 100,000 windows that passed their lateness.
type seriesStart struct {
	start int64
	ser   *series
}

// rowChange is one entry a checkpoint puts or deletes. It names its entry
// through ref rather than holding the names: a load-mode checkpoint has
// about 100,000 changes, and at 72 bytes each (two strings and three
// pointers) their array alone was 7 MB. ref is one pointer whose type
// the kind says, not an interface: 24 bytes a change instead of 32 (2.4
// MB instead of 3.2 held through a load-mode checkpoint, where the heap
// pacer's floor follows the live heap).
type rowChange struct {
	at     int64          // window start, dedup group end, or noTimeKey
	ref    unsafe.Pointer // see changeKind
	parked parkRef        // putParked's entry
	shard  uint16
	kind   changeKind
	wipe   bool // the change's group holds no window in state: its row goes whole
}

// changeKind says what a rowChange does, and what its ref is.
type changeKind uint8

const (
	putWindow   changeKind = iota // ref *series: its window at at, in memory
	putParked                     // ref *series: its window parked at at, in parked
	delWindow                     // ref *seriesStart
	delFinal                      // ref *seriesStart: a delete that may wait (engine.delFinal)
	delMigrated                   // ref *winRef: a migration's delete
	putDedup                      // ref *device: its group ending at at
	delDedup                      // ref *device
	putDevice                     // ref *device
	delDevice                     // ref *string: the device's name
)

func (c *rowChange) put() bool {
	return c.kind == putWindow || c.kind == putParked || c.kind == putDedup || c.kind == putDevice
}

// names returns the device and metric of the change's entry.
func (c *rowChange) names() (dev, metric string) {
	switch c.kind {
	case putWindow, putParked:
		r := (*series)(c.ref)
		return r.dev.name, r.name
	case delWindow, delFinal:
		r := (*seriesStart)(c.ref)
		return r.ser.dev.name, r.ser.name
	case delMigrated:
		r := (*winRef)(c.ref)
		return r.dev, r.metric
	case delDevice:
		return *(*string)(c.ref), ""
	}
	return (*device)(c.ref).name, ""
}

// dedupIDs returns the ids of the dedup group a putDedup change writes.
func (c *rowChange) dedupIDs() []uint64 {
	ids, ok := (*device)(c.ref).dedup.hotIDs(c.at)
	if !ok {
		panic(fmt.Sprintf("window: no dedup group ending at %d", c.at))
	}
	return ids
}

// maxSize bounds the change's entry.
func (c *rowChange) maxSize() int {
	dev, metric := c.names()
	n := 3*binary.MaxVarintLen32 + len(dev) + len(metric)
	switch c.kind {
	case putWindow, putParked:
		n += maxWindowBytes
	case putDedup:
		n += 8 * len(c.dedupIDs())
	case putDevice:
		n += maxDeviceBytes
	}
	return n
}

// appendEntry appends the change's entry (a put's); scratch holds its
// payload.
func (c *rowChange) appendEntry(b, scratch []byte, parked *parkArena) ([]byte, []byte) {
	switch c.kind {
	case putWindow:
		scratch = appendWindow(scratch[:0], (*series)(c.ref).find(c.at))
	case putParked:
		scratch = append(scratch[:0], parked.encoding(c.parked)...)
	case putDedup:
		scratch = scratch[:0]
		for _, id := range c.dedupIDs() {
			scratch = binary.BigEndian.AppendUint64(scratch, id)
		}
	default:
		scratch = appendDevice(scratch[:0], (*device)(c.ref))
	}
	dev, metric := c.names()
	return appendEntry(b, dev, metric, scratch), scratch
}

func compareChanges(a, b rowChange) int {
	if c := compareGroups(a, b); c != 0 {
		return c
	}
	return compareNames(a, b)
}

// compareGroups orders changes by their group's key alone.
func compareGroups(a, b rowChange) int {
	if c := cmp.Compare(a.at, b.at); c != 0 {
		return c
	}
	return cmp.Compare(a.shard, b.shard)
}

// byGroup sorts changes by compareGroups, and byName its changes by
// compareNames. byName is a struct behind a pointer so that writeGroups
// sorts group after group through one interface value: a slice converted
// to sort.Interface is an allocation a group.
type (
	byGroup []rowChange
	byName  struct{ s []rowChange }
)

func (s byGroup) Len() int           { return len(s) }
func (s byGroup) Less(i, j int) bool { return compareGroups(s[i], s[j]) < 0 }
func (s byGroup) Swap(i, j int)      { s[i], s[j] = s[j], s[i] }
func (s *byName) Len() int           { return len(s.s) }
func (s *byName) Less(i, j int) bool { return compareNames(s.s[i], s.s[j]) < 0 }
func (s *byName) Swap(i, j int)      { s.s[i], s.s[j] = s.s[j], s.s[i] }

// maxFlagStarts bounds the distinct times sortByGroup buckets by; past
// it (a backlog's hours of short windows in one checkpoint) the changes
// go through sort.Sort instead.
const maxFlagStarts = 256

// sortByGroup orders changes by compareGroups, in place. A checkpoint's
// changes have few distinct times (a portion's window starts, the dedup
// groups' ends, the devices' one noTimeKey) and groupShards shards, so
// they are bucketed instead of compared: by time, then each time's
// changes by shard, each an American flag sort (count, then swap every
// change into its bucket's next slot): 32 ns a change against 165 with
// sort.Sort (BenchmarkSortByGroup), whose sort was a quarter of a
// load-mode checkpoint's writes. The order within a group is left to the
// sort by name.
func sortByGroup(changes []rowChange) {
	var times []int64 // distinct, ascending
	for i := range changes {
		k, found := slices.BinarySearch(times, changes[i].at)
		if found {
			continue
		}
		if len(times) == maxFlagStarts {
			sort.Sort(byGroup(changes))
			return
		}
		times = slices.Insert(times, k, changes[i].at)
	}
	n := max(len(times), int(groupShards))
	cur, end := make([]int, n), make([]int, n)
	timeOf := func(c *rowChange) int {
		k, _ := slices.BinarySearch(times, c.at)
		return k
	}
	flagSort(changes, len(times), timeOf, cur, end)
	shardBucket := func(c *rowChange) int { return int(c.shard) }
	for i := 0; i < len(changes); {
		j := i + 1
		for j < len(changes) && changes[j].at == changes[i].at {
			j++
		}
		flagSort(changes[i:j], int(groupShards), shardBucket, cur, end)
		i = j
	}
}

// flagSort permutes c so that bucket, from 0 to n-1, ascends; cur and end
// are scratch of at least n entries.
func flagSort(c []rowChange, n int, bucket func(*rowChange) int, cur, end []int) {
	cur, end = cur[:n], end[:n]
	clear(end)
	for i := range c {
		end[bucket(&c[i])]++
	}
	at := 0
	for b := range end {
		cur[b] = at
		at += end[b]
		end[b] = at
	}
	for b := range n {
		for cur[b] < end[b] {
			to := bucket(&c[cur[b]])
			if to != b {
				c[cur[b]], c[cur[to]] = c[cur[to]], c[cur[b]]
			}
			cur[to]++
		}
	}
}

// compareNames orders the changes of one group as its entries.
func compareNames(a, b rowChange) int {
	devA, metricA := a.names()
	devB, metricB := b.names()
	return compareEntry(devA, metricA, devB, metricB)
}

// bytesView is b as a string without a copy, for a call that keeps
// neither while b is not written.
func bytesView(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// compareEntry is the order of the entries in a group row.
func compareEntry(devA, metricA, devB, metricB string) int {
	if c := strings.Compare(devA, devB); c != 0 {
		return c
	}
	return strings.Compare(metricA, metricB)
}

// windowPortion bounds the window changes a checkpoint holds at once: it
// writes them in portions of consecutive start times (a group is one
// start, so each is whole in one portion). In load mode a checkpoint has
// 60,000-80,000 window changes, and the heap pacer's floor follows the
// live heap while it holds them (see internal/heapgoal). A variable for
// tests.
var windowPortion = 16_384

// eachWindowChange calls fn with every window delete and put of the
// checkpoint whose start is within [lo, hi].
func eachWindowChange(e *engine, lo, hi int64, fn func(rowChange)) {
	for i := range e.delWins {
		if r := &e.delWins[i]; lo <= r.start && r.start <= hi {
			fn(rowChange{at: r.start, shard: r.ser.dev.shard, kind: delWindow, ref: unsafe.Pointer(r)})
		}
	}
	for i := range e.delFinal {
		if r := &e.delFinal[i]; lo <= r.start && r.start <= hi {
			fn(rowChange{at: r.start, shard: r.ser.dev.shard, kind: delFinal, ref: unsafe.Pointer(r)})
		}
	}
	for _, w := range e.dirtyWins {
		if !w.dead && lo <= w.start && w.start <= hi {
			ser := e.serOf(w)
			fn(rowChange{at: w.start, shard: ser.dev.shard, kind: putWindow, ref: unsafe.Pointer(ser)})
		}
	}
	for _, ser := range e.parkedSers {
		e.parkArena.each(ser.parked, func(start int64, ref parkRef) {
			if lo <= start && start <= hi {
				fn(rowChange{at: start, parked: ref, shard: ser.dev.shard, kind: putParked, ref: unsafe.Pointer(ser)})
			}
		})
	}
}

// windowPortions returns the start times that end the portions of window
// changes (see windowPortion), ascending: consecutive starts whose changes
// add up to at most windowPortion, or a start of its own with more; and
// the most changes one portion holds. Starts are on the slide grid, so a
// checkpoint has few distinct ones.
func windowPortions(e *engine) (ends []int64, largest int) {
	perStart := map[int64]int{}
	eachWindowChange(e, math.MinInt64, math.MaxInt64, func(c rowChange) { perStart[c.at]++ })
	// Sorted as uint64 with the sign bit flipped, which keeps their order:
	// that sort is in the binary already, an int64 one would add 4.5 KB
	// (the arm64 code budget).
	starts := make([]uint64, 0, len(perStart))
	for at := range perStart {
		starts = append(starts, uint64(at)^1<<63)
	}
	slices.Sort(starts)
	for i, n := 0, 0; i < len(starts); i++ {
		at := int64(starts[i] ^ 1<<63)
		n += perStart[at]
		if i+1 == len(starts) || n+perStart[int64(starts[i+1]^1<<63)] > windowPortion {
			ends, largest, n = append(ends, at), max(largest, n), 0
		}
	}
	return ends, largest
}

// windowChanges appends the checkpoint's window deletes and puts with a
// start within [lo, hi] to changes. It and its siblings append to the
// caller's array, so that one array serves the whole checkpoint.
func windowChanges(changes []rowChange, e *engine, lo, hi int64) []rowChange {
	eachWindowChange(e, lo, hi, func(c rowChange) { changes = append(changes, c) })
	return changes
}

// dedupChanges appends the changed and dropped dedup groups (one entry per
// device and last window end, holding its event-id hashes) to changes.
func dedupChanges(changes []rowChange, e *engine) []rowChange {
	changes = slices.Grow(changes, e.dedupRows)
	for _, d := range e.dedupDirty {
		for _, end := range d.dedup.dropped() {
			changes = append(changes, rowChange{at: end, shard: d.shard, kind: delDedup, ref: unsafe.Pointer(d)})
		}
		off, ids := 0, d.dedup.ids()
		for _, g := range d.dedup.groups() {
			if g.isDirty() {
				slices.Sort(ids[off : off+g.count()]) // in place: a group is a set
				changes = append(changes, rowChange{at: g.end(), shard: d.shard, kind: putDedup, ref: unsafe.Pointer(d)})
			}
			off += g.count()
		}
	}
	return changes
}

// deviceChanges appends the changed and deleted devices to changes.
func deviceChanges(changes []rowChange, e *engine) []rowChange {
	changes = slices.Grow(changes, len(e.delDevs)+len(e.dirtyDevs))
	for i := range e.delDevs {
		name := &e.delDevs[i]
		changes = append(changes, rowChange{at: noTimeKey, shard: shardOf(*name), kind: delDevice, ref: unsafe.Pointer(name)})
	}
	for _, d := range e.dirtyDevs {
		if !d.dead {
			changes = append(changes, rowChange{at: noTimeKey, shard: d.shard, kind: putDevice, ref: unsafe.Pointer(d)})
		}
	}
	return changes
}

// writeGroups merges changes into their group rows as new versions of
// generation gen (see slotted), through w's transactions. An entry both
// deleted and put in one checkpoint (an expired device that came back)
// ends put: the delete happened first. The keys of the versions that stop
// serving once gen commits (every version of a group it deletes) are
// appended to sweep.
func writeGroups(w *chunkWriter, bucket []byte, fill float64, changes []rowChange, gen, committed uint64, sweep *[][]byte, deferred func([]rowChange) []rowChange) error {
	// By group first, which reads no names (they are behind pointers),
	// then each group's few changes by name: a load-mode checkpoint's sort
	// took a fifth more CPU otherwise.
	sortByGroup(changes)
	if deferred != nil {
		changes = deferred(changes)
	}
	var key, scratch, target []byte
	names := new(byName)
	for i := 0; i < len(changes); {
		size := binary.MaxVarintLen64
		j := i
		for ; j < len(changes) && changes[j].at == changes[i].at && changes[j].shard == changes[i].shard; j++ {
			size += changes[j].maxSize()
		}
		names.s = changes[i:j]
		sort.Sort(names)
		key = appendGroupKey(key[:0], changes[i].at, changes[i].shard)
		c := w.cursor(bucket, fill)
		b := c.Bucket()
		g, err := seekGroup(c, key, committed)
		if err != nil {
			return err
		}
		old := g.row()
		v := w.ar.Room(len(old) + size)
		n := len(v)
		v = binary.AppendUvarint(v, gen)
		header := len(v)
		if !changes[i].wipe {
			v, scratch, err = mergeGroup(v, scratch, old, changes[i:j], w.parked)
			if err != nil {
				return fmt.Errorf("group %x: %w", key, err)
			}
		}
		i = j
		deleted := len(v) == header
		if deleted && old == nil {
			continue // nothing stored, nothing to store
		}
		// The new version goes to the slot the current one is not in; a
		// legacy row counts as slot 0. Superseded versions in neither go.
		slot := byte(0)
		if g.hasCur && g.cur.slot != 1 {
			slot = 1
		}
		target = slotted(target[:0], key, slot) // reused: Put copies it
		if deleted {
			// Once gen commits, no version of the group serves. (Keys are
			// copied before the writes below, which may move bbolt's.) The
			// deletion's own version goes last: a sweep may be cut between
			// its transactions, and until it is gone the group reads as
			// deleted, not as the row before.
			if g.hasCur {
				*sweep = append(*sweep, bytes.Clone(g.cur.key))
			}
			*sweep = append(*sweep, bytes.Clone(target))
		}
		for _, keys := range [...][][]byte{g.older, g.garbage} {
			for _, k := range keys {
				if !bytes.Equal(k, target) {
					if err := deleteKey(c, k); err != nil {
						return fmt.Errorf("delete group version %x: %w", k, err)
					}
				}
			}
		}
		if err := b.Put(target, w.ar.Cut(v)); err != nil {
			return fmt.Errorf("put group %x: %w", key, err)
		}
		if err := w.wrote(len(v) - n + len(target)); err != nil {
			return err
		}
	}
	return nil
}

// deferDeletes takes the groups out of changes (sorted by group) that
// would be rewritten only for deletes that may wait (delFinal, delDedup),
// while an entry in state is still in the group (held reports whether
// device d holds one at at); and marks the groups of deletes that no entry
// in state is in any longer to go whole (wipe).
//
// A final window, or a dedup group, leaves the state once its device's
// lateness horizon passes it, and the devices of a group (time, shard)
// pass it at different checkpoints when their event times are apart:
// under sustained load (10,000 devices, event times minutes apart) about
// three in ten of the groups a checkpoint rewrote were rewritten only for
// such deletes, each read, merged and written whole for a few entries.
// Left in the row, such an entry is harmless: nothing reads it while the
// agent runs, since no set in state names it, and a restart loads it and
// prunes it again (its device's horizon has passed it), or skips it (its
// device expired; or a dedup group max_past_skew has passed, which can
// hold no reading the agent takes). The group's row goes whole with the
// delete of its last entry in state. Deletes of windows whose rows may
// not be final (engine.delWins) are written as before.
func (e *engine) deferDeletes(changes []rowChange, held func(d *device, at int64) bool) []rowChange {
	// The distinct times of the delete-only groups, each with a bit per
	// shard: the group is delete-only, and the group holds an entry in
	// state.
	var times []int64
	var only, live [][]uint64
	words := (int(groupShards) + 63) / 64
	for i := 0; i < len(changes); {
		j, deletes := groupEnd(changes, i)
		if deletes {
			at, sh := changes[i].at, changes[i].shard
			if len(times) == 0 || times[len(times)-1] != at {
				times = append(times, at)
				only = append(only, make([]uint64, words))
				live = append(live, make([]uint64, words))
			}
			only[len(only)-1][sh/64] |= 1 << (sh % 64)
		}
		i = j
	}
	if len(times) == 0 {
		return changes
	}
	for _, d := range e.devices.slots {
		if d == nil {
			continue
		}
		word, bit := d.shard/64, uint64(1)<<(d.shard%64)
		for k, at := range times {
			if only[k][word]&bit != 0 && live[k][word]&bit == 0 && held(d, at) {
				live[k][word] |= bit
			}
		}
	}
	out := changes[:0]
	k := 0
	for i := 0; i < len(changes); {
		j, deletes := groupEnd(changes, i)
		if deletes {
			at, sh := changes[i].at, changes[i].shard
			for times[k] != at {
				k++
			}
			if live[k][sh/64]&(1<<(sh%64)) == 0 {
				for m := i; m < j; m++ {
					changes[m].wipe = true
				}
			} else if mayWait(changes[i:j]) {
				i = j
				continue
			}
		}
		out = append(out, changes[i:j]...)
		i = j
	}
	return out
}

// holdsWindow reports whether d has a window in state at start.
func (e *engine) holdsWindow(d *device, start int64) bool {
	for _, ser := range d.series {
		if w := ser.find(start); w != nil && !w.dead || ser.evicted.has(start, e.slideMs) {
			return true
		}
	}
	return false
}

// holdsDedup reports whether d has a dedup group, hot or cold, ending at
// end.
func holdsDedup(d *device, end int64) bool {
	if _, ok := d.dedup.hotIDs(end); ok {
		return true
	}
	_, ok := d.dedup.coldAt(end)
	return ok
}

// groupEnd returns the end of the group of changes starting at i, and
// whether all of them are deletes.
func groupEnd(changes []rowChange, i int) (int, bool) {
	deletes := true
	j := i
	for ; j < len(changes) && changes[j].at == changes[i].at && changes[j].shard == changes[i].shard; j++ {
		deletes = deletes && !changes[j].put()
	}
	return j, deletes
}

// mayWait reports whether every change is a delete that may wait.
func mayWait(changes []rowChange) bool {
	for _, c := range changes {
		if c.kind != delFinal && c.kind != delDedup {
			return false
		}
	}
	return true
}

// sweepGroups deletes the group versions listed by a committed
// checkpoint or a load (see eachGroup), in their order: a deleted group's
// older versions before the version that deletes it, so that wherever the
// transactions are cut, nothing changes what is loaded.
func sweepGroups(w *chunkWriter, bucket []byte, keys [][]byte) error {
	for _, k := range keys {
		if err := deleteKey(w.cursor(bucket, 0), k); err != nil {
			return fmt.Errorf("sweep group version %x: %w", k, err)
		}
		if err := w.wrote(len(k)); err != nil {
			return err
		}
	}
	return nil
}

// chunkWriter writes a checkpoint in transactions of about chunkBytes
// each (see slotted): it commits the current one and begins the next when
// that much was written, so a checkpoint holds at most about that many new
// rows, and bbolt the pages they dirty, in memory at once.
type chunkWriter struct {
	db      *bolt.DB
	log     *slog.Logger
	tx      *bolt.Tx
	ar      *boltkv.Arena // the current transaction's values
	written int
	chunks  int
	parked  *parkArena   // the engine's, which putParked changes point into
	cur     *bolt.Cursor // see cursor
	curName []byte
}

// chunkBytes bounds the rows one transaction of a checkpoint writes: a
// quarter MiB of rows, with the values' arena and bbolt's pages for them,
// is what a checkpoint adds to the heap at once. It is a variable only so
// tests can split small checkpoints.
var chunkBytes = 256 << 10

// chunkNodes bounds the pages one transaction of a checkpoint changes
// (bbolt's nodes). Its commit reads every changed page's old copy through
// the map, and the kernel's fault-around maps each with up to 15 cached
// neighbours: a checkpoint that sweeps expired groups deletes thousands of
// rows for a few bytes of keys each, and one such commit mapped 22 MiB of
// the state file at once (load mode, 10,000 devices). 16 pages keep a
// commit's pages near 1 MiB (a 32 KiB page and its neighbour in the
// fault-around's 64 KiB each). Sampled every 4 ms through a load run at
// 32, the state file held 1.9-2.3 MiB in each of the run's twelve highest
// samples of the resident set against 0.13 MiB in the median one: the
// checkpoint's commits set the peak. At 16 the peak fell by about 1 MiB,
// CPU within the runs' spread (docs/performance.md, session 55; sessions
// 40 and 46, at slower rates and noisier peaks, had found 16 no lower
// than 32, and dearer in CPU in two of three pairs: each commit also
// rewrites the branch pages above its leaves). With 64, load mode's runs
// at 33-45k msgs/s had 3.6-3.9 MiB of the state file mapped at their
// peaks. It is a variable only so tests can set it.
var chunkNodes int64 = 16

// afterChunk, if set (by tests), runs after each transaction of a
// checkpoint but its last commits; an error fails the checkpoint there.
var afterChunk func(chunk int) error

func (w *chunkWriter) begin() error {
	tx, err := w.db.Begin(true)
	if err != nil {
		return fmt.Errorf("begin state transaction: %w", err)
	}
	w.tx, w.written = tx, 0
	w.ar.Reset() // the last transaction ended
	w.chunks++
	return nil
}

// cursor returns a cursor on the current transaction's bucket name, its
// pages filled to fill if that is not 0. The cursor is the same until the
// transaction or the bucket changes: every use seeks afresh (a Put or a
// Delete may move the pages under it), and a cursor of its own per group
// grew a new search stack each time (with Bucket.Delete's: 28 % of
// BenchmarkCheckpointLoad's allocations).
func (w *chunkWriter) cursor(name []byte, fill float64) *bolt.Cursor {
	if w.cur == nil || w.cur.Bucket().Tx() != w.tx || !bytes.Equal(w.curName, name) {
		w.cur, w.curName = w.tx.Bucket(name).Cursor(), name
	}
	if fill != 0 {
		w.cur.Bucket().FillPercent = fill
	}
	return w.cur
}

// deleteKey deletes k, if present, from c's bucket through c, as
// Bucket.Delete does through a cursor it makes.
func deleteKey(c *bolt.Cursor, k []byte) error {
	if found, _ := c.Seek(k); !bytes.Equal(found, k) {
		return nil
	}
	return c.Delete()
}

// wrote counts n bytes written; past chunkBytes, or once the transaction
// changed chunkNodes pages, it commits the transaction and begins the
// next.
func (w *chunkWriter) wrote(n int) error {
	w.written += n
	if st := w.tx.Stats(); w.written < chunkBytes && st.GetNodeCount() < chunkNodes {
		return nil
	}
	if err := w.commit(); err != nil {
		return err
	}
	if afterChunk != nil {
		if err := afterChunk(w.chunks); err != nil {
			return err
		}
	}
	return w.begin()
}

func (w *chunkWriter) commit() error {
	tx := w.tx
	w.tx = nil
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit state transaction: %w", err)
	}
	w.release()
	return nil
}

// release takes the state file's pages out of the resident set (see
// boltkv.DropMapped), after each transaction. A transaction's reads fault
// in its rows' pages and, by the kernel's fault-around, up to 15 cached
// neighbours of each; chunkNodes bounds the pages it changes, and so the
// leaves it reads, to about 1 MiB mapped. Sessions 27-52 also released
// every 32 KiB of rows inside the transaction (with 4 KiB pages and no
// node bound, one transaction had mapped 13-16 MiB): under today's bounds
// that cost about 1 s of CPU per million readings in load mode, every
// release faulting the next rows' pages back, for no lower peak
// (docs/performance.md, session 53).
func (w *chunkWriter) release() { boltkv.ReleaseMapped(w.db, w.log) }

// abort rolls back the open transaction, if any.
func (w *chunkWriter) abort() {
	if w.tx != nil {
		_ = w.tx.Rollback() // its effects are dropped either way
		w.tx = nil
	}
}

// mergeGroup appends to out the entries of the stored row old with the
// sorted changes applied; scratch is for a payload's encoding.
func mergeGroup(out, scratch, old []byte, changes []rowChange, parked *parkArena) ([]byte, []byte, error) {
	d := decoder{b: old}
	var cur groupEntry
	next := func() bool {
		if len(d.b) == 0 {
			return false
		}
		cur = groupEntry{dev: d.bytes(), metric: d.bytes(), payload: d.bytes()}
		return d.err == nil
	}
	haveOld := next()
	for k := 0; k < len(changes) || haveOld; {
		if k < len(changes) {
			// The changes to one entry are k..m-1; a put wins over a delete.
			c, m := &changes[k], k+1
			dev, metric := c.names()
			for ; m < len(changes); m++ {
				if d, mt := changes[m].names(); d != dev || mt != metric {
					break
				}
				if !c.put() {
					c = &changes[m]
				}
			}
			order := -1
			if haveOld {
				// Views, not copies: compareEntry keeps neither, and the
				// copies were an allocation an entry (strings.Compare's
				// parameters leak).
				order = compareEntry(dev, metric, bytesView(cur.dev), bytesView(cur.metric))
			}
			if order <= 0 {
				if c.put() {
					out, scratch = c.appendEntry(out, scratch, parked)
				}
				k = m
				if order == 0 {
					haveOld = next()
				}
				continue
			}
		}
		out = appendEntry(out, string(cur.dev), string(cur.metric), cur.payload)
		haveOld = next()
	}
	if d.err != nil {
		return out, scratch, fmt.Errorf("%w: group row: %v", ErrCorruptState, d.err)
	}
	return out, scratch, nil
}

// rowLayout is a bucket of the layout before groups and how its keys
// read.
type rowLayout struct {
	old, groups []byte
	parse       func(k []byte) (at int64, dev, metric string, err error)
}

var rowLayouts = []rowLayout{
	{bucketWindows, bucketWindowGroups, parseWindowKey},
	{bucketDedup, bucketDedupGroups, func(k []byte) (int64, string, string, error) {
		if len(k) < 9 {
			return 0, "", "", fmt.Errorf("%w: dedup key %x", ErrCorruptState, k)
		}
		d := decoder{b: k[8:]}
		dev := d.bytes()
		if d.err != nil || len(d.b) != 0 {
			return 0, "", "", fmt.Errorf("%w: dedup key %x", ErrCorruptState, k)
		}
		return fromOrdered(binary.BigEndian.Uint64(k)), string(dev), "", nil
	}},
	{bucketDevices, bucketDeviceGroups, func(k []byte) (int64, string, string, error) {
		return noTimeKey, string(k), "", nil
	}},
}

// migrateRows moves the state of the layout before groups (a row per
// window, dedup group and device) into group rows and drops its buckets;
// the payloads are the same encodings.
func migrateRows(tx *bolt.Tx) error {
	for _, l := range rowLayouts {
		if err := migrateBucket(tx, l); err != nil {
			return fmt.Errorf("migrate %s to groups: %w", l.old, err)
		}
	}
	return nil
}

func migrateBucket(tx *bolt.Tx, l rowLayout) error {
	old := tx.Bucket(l.old)
	if old == nil {
		return nil
	}
	type row struct {
		rowChange
		v []byte
	}
	var rows []row
	err := old.ForEach(func(k, v []byte) error {
		at, dev, metric, err := l.parse(k)
		if err != nil {
			return err
		}
		key := rowChange{at: at, shard: shardOf(dev), kind: delMigrated, ref: unsafe.Pointer(&winRef{start: at, dev: dev, metric: metric})}
		rows = append(rows, row{key, bytes.Clone(v)})
		return nil
	})
	if err != nil {
		return err
	}
	// sort.Slice, not slices.SortFunc: this runs once per old database,
	// and a generic sort of another struct type is about 10 KB of the
	// binary, whose arm64 build is at its budget.
	sort.Slice(rows, func(i, j int) bool { return compareChanges(rows[i].rowChange, rows[j].rowChange) < 0 })
	groups := tx.Bucket(l.groups)
	var key, val []byte
	for i := 0; i < len(rows); {
		val = val[:0]
		j := i
		for ; j < len(rows) && rows[j].at == rows[i].at && rows[j].shard == rows[i].shard; j++ {
			dev, metric := rows[j].names()
			val = appendEntry(val, dev, metric, rows[j].v)
		}
		key = appendGroupKey(key[:0], rows[i].at, rows[i].shard)
		if err := groups.Put(key, bytes.Clone(val)); err != nil { // bbolt copies keys
			return fmt.Errorf("put group: %w", err)
		}
		i = j
	}
	if err := tx.DeleteBucket(l.old); err != nil {
		return fmt.Errorf("drop the old bucket: %w", err)
	}
	return nil
}

// Checkpoint generations. A checkpoint is written in several bbolt
// transactions (chunks), so that it never holds more than about
// chunkBytes of new rows and bbolt's dirty pages in memory at once;
// only its last transaction, with the offset, the batch's outputs and
// the generation number, makes it count. Until then its rows must not
// change what a restart loads: a group row is stored in one of two slots,
// key | slot (0 or 1), its value the uvarint generation of the checkpoint
// that wrote it, then the row. A group's current row is the version of the
// highest generation at or below the committed one (meta "gen"); a new
// version goes to the other slot, so the current one survives a crash
// until the generation commits. An empty row is a deletion: it stays until
// its generation commits and is then removed with the older slot (sweep).
// Versions above the committed generation are left by an interrupted
// checkpoint; loading lists them to sweep before the next one, which
// reuses that generation number.
//
// A key without a slot byte is a row of the layout before generations:
// generation 0, and slot 0's place, so it is replaced as slot 0 is.

// slotted appends k's slot key to dst.
func slotted(dst, k []byte, slot byte) []byte { return append(append(dst, k...), slot) }

// groupVersion is one stored version of a group row.
type groupVersion struct {
	key  []byte
	gen  uint64
	row  []byte
	slot int // 0, 1, or legacySlot
}

const legacySlot = -1

// parseVersion reads the version stored under key (a group key plus
// slot, or a legacy group key of length base).
func parseVersion(key, v []byte, base int) (groupVersion, error) {
	switch len(key) {
	case base:
		return groupVersion{key: key, row: v, slot: legacySlot}, nil
	case base + 1:
		gen, n := binary.Uvarint(v)
		if n <= 0 || key[base] > 1 {
			return groupVersion{}, fmt.Errorf("%w: group version %x", ErrCorruptState, key)
		}
		return groupVersion{key: key, gen: gen, row: v[n:], slot: int(key[base])}, nil
	}
	return groupVersion{}, fmt.Errorf("%w: group key %x", ErrCorruptState, key)
}

// groupVersions gathers the versions of one group: the current one, and
// the keys of the others.
type groupVersions struct {
	cur     groupVersion
	hasCur  bool
	garbage [][]byte // above the committed generation
	older   [][]byte // committed, superseded by cur
}

func (g *groupVersions) add(v groupVersion, committed uint64) {
	switch {
	case v.gen > committed:
		g.garbage = append(g.garbage, v.key)
	case !g.hasCur:
		g.cur, g.hasCur = v, true
	case v.gen > g.cur.gen:
		g.older = append(g.older, g.cur.key)
		g.cur = v
	default:
		g.older = append(g.older, v.key)
	}
}

// row returns the current row, nil if none or deleted.
func (g *groupVersions) row() []byte {
	if !g.hasCur || len(g.cur.row) == 0 {
		return nil
	}
	return g.cur.row
}

// readGroup returns the versions of the group keyed k.
func readGroup(b *bolt.Bucket, k []byte, committed uint64) (groupVersions, error) {
	return seekGroup(b.Cursor(), k, committed)
}

// seekGroup is readGroup through c, which it moves.
func seekGroup(c *bolt.Cursor, k []byte, committed uint64) (groupVersions, error) {
	key, v := c.Seek(k)
	g, _, _, err := versionsAt(c, key, v, k, committed)
	return g, err
}

// versionsAt gathers the versions of group from c's position (key, v) on,
// and returns the key and value after them.
func versionsAt(c *bolt.Cursor, key, v, group []byte, committed uint64) (groupVersions, []byte, []byte, error) {
	var g groupVersions
	for ; key != nil && bytes.HasPrefix(key, group); key, v = c.Next() {
		ver, err := parseVersion(key, v, len(group))
		if err != nil {
			return g, nil, nil, err
		}
		g.add(ver, committed)
	}
	return g, key, v, nil
}

// eachGroup calls fn with each group's key and current row, in key order,
// skipping deleted groups. With sweep set, it appends the keys that no
// longer serve (versions above the committed generation, and every version
// of a deleted group) to it, for sweepGroups.
func eachGroup(b *bolt.Bucket, base int, committed uint64, sweep *[][]byte, fn func(k, row []byte) error) error {
	c := b.Cursor()
	key, v := c.First()
	for key != nil {
		if len(key) < base {
			return fmt.Errorf("%w: group key %x", ErrCorruptState, key)
		}
		group := key[:base]
		g, nextKey, nextV, err := versionsAt(c, key, v, group, committed)
		if err != nil {
			return err
		}
		key, v = nextKey, nextV
		if sweep != nil {
			for _, k := range g.garbage {
				*sweep = append(*sweep, bytes.Clone(k))
			}
			if g.hasCur && len(g.cur.row) == 0 {
				// The deletion's own version last (see writeGroups).
				for _, k := range g.older {
					*sweep = append(*sweep, bytes.Clone(k))
				}
				*sweep = append(*sweep, bytes.Clone(g.cur.key))
			}
		}
		if row := g.row(); row != nil {
			if err := fn(group, row); err != nil {
				return err
			}
		}
	}
	return nil
}
