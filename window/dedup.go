package window

import (
	"cmp"
	"slices"
)

// dedupSet is one device's event-id hashes, grouped by the end of the
// reading's last window. A group counts while its end is after the
// device's lateness horizon (finalBefore) and is dropped whole once the
// horizon passes it, which is also the unit a checkpoint writes: one state
// row per group.
//
// The ids of every hot group sit in one slice, group after group, 8 bytes
// each, and the groups themselves are 12-byte headers: at 10,000 devices
// and 10 minutes of lateness the dedup sets are one of the largest parts
// of the stage's heap, and a slice per group cost its header and its
// growth slack on every group (BenchmarkDedupHeld: 1,424 bytes a device
// with a slice per group, 936 with 16-byte headers, 872 like this). A lookup scans the ids of the
// groups that still count, contiguous, which is cheaper than a map for
// the few dozen ids a device usually holds; a device past dedupIndexMin
// ids also keeps an index, so a fast device never scans thousands. The
// index counts the hot ids by their low 32 bits: a map to the id's group
// end took 26 bytes an id and a set of ids no less (Go pads a zero-size
// value), this about 13 (BenchmarkDedupHeldFast), and a backlog's drain
// at 100 devices held 300,000 ids, the largest part of the agent's heap.
// An id whose bits are counted is looked for in the groups, so the answer
// is exact: that is a retry, or one new id in 2^32 / (the set's ids).
//
// Groups whose readings' windows were all emitted go cold after the
// checkpoint that wrote them (see evict): their ids stay only in the state
// database, and memory keeps a 16-bit fingerprint of each. A fingerprint
// that matches makes the engine read the group's row and decide exactly;
// only a retry of an older reading matches for real, and a new id matches
// by chance about once in 65,536 / (cold ids of its device) lookups. In
// load mode (10,000 devices, 10 minutes of lateness) the ids' heap went
// from about 17 MB to about 3.
type dedupSet struct {
	groups []dedupGroup // hot groups, by end, ascending
	ids    []uint64     // the hot groups' ids, group after group
	index  map[uint32]uint32
	// cold are the groups held only on disk, by end, ascending; coldFP
	// their ids' fingerprints, group after group; coldBits, once there are
	// coldBitsMin fingerprints, a bit per fingerprint value (modulo its
	// length) that most lookups end at.
	cold     []dedupGroup
	coldFP   []uint16
	coldBits []uint64
	// dropped are the ends of groups removed since the last checkpoint
	// (their rows are deleted).
	dropped []int64
}

// dedupGroup is a group's header: its end and how many ids (hot) or
// fingerprints (cold) it holds. Twelve bytes, not the sixteen an int64
// field would align it to: load mode holds some 130,000 of them.
type dedupGroup struct {
	endLo, endHi uint32 // end, unix ms
	// nd is the count, with groupDirty set while the group changed since
	// the last checkpoint (hot groups only).
	nd uint32
}

const groupDirty = 1 << 31

func newGroup(end int64, n int) dedupGroup {
	return dedupGroup{endLo: uint32(end), endHi: uint32(uint64(end) >> 32), nd: uint32(n)}
}

func (g dedupGroup) end() int64    { return int64(uint64(g.endHi)<<32 | uint64(g.endLo)) }
func (g dedupGroup) count() int    { return int(g.nd &^ groupDirty) }
func (g dedupGroup) isDirty() bool { return g.nd&groupDirty != 0 }

// dedupIndexMin is the set size from which lookups go through a map.
const dedupIndexMin = 256

// coldBitsMin is the number of cold fingerprints from which lookups first
// consult coldBits: below it, scanning them costs less than the bits hold.
const coldBitsMin = 128

// seen reports whether id is held by a hot group that still counts; cold
// groups are asked through coldCandidates.
func (s *dedupSet) seen(id uint64, finalBefore int64) bool {
	if s.index != nil && s.index[uint32(id)] == 0 {
		return false
	}
	hi := len(s.ids)
	for i := len(s.groups) - 1; i >= 0 && s.groups[i].end() > finalBefore; i-- {
		lo := hi - s.groups[i].count()
		if slices.Contains(s.ids[lo:hi], id) {
			return true
		}
		hi = lo
	}
	return false
}

// add records id under the group of end and marks the group for the next
// checkpoint; it reports whether the group was clean before. A stale copy
// of id in a group that no longer counts stays there until that group is
// dropped: no lookup consults it.
func (s *dedupSet) add(id uint64, end int64) (newlyDirty bool) {
	i, off := len(s.groups), len(s.ids)
	for i > 0 && s.groups[i-1].end() > end {
		i--
		off -= s.groups[i].count()
	}
	if i == 0 || s.groups[i-1].end() != end {
		s.groups = insertSpare(s.groups, i, newGroup(end, 0))
	} else {
		i--
	}
	s.ids = openGap(s.ids, off, 1)
	s.ids[off] = id
	g := &s.groups[i]
	newlyDirty = !g.isDirty()
	g.nd = (g.nd + 1) | groupDirty
	s.remember(id)
	return newlyDirty
}

// load adds a stored group (rows come in key order: ascending ends).
func (s *dedupSet) load(end int64, ids []uint64) {
	s.groups = insertSpare(s.groups, len(s.groups), newGroup(end, len(ids)))
	s.ids = insertSpare(s.ids, len(s.ids), ids...)
	s.remember(ids...)
}

// remember makes ids just added to the hot groups findable through the
// index once the set is past dedupIndexMin (the index is built once, when
// the set crosses it, from every hot id, these included, and then kept
// up: counting these on top of a new index counted them twice).
func (s *dedupSet) remember(ids ...uint64) {
	switch {
	case s.index != nil:
		for _, id := range ids {
			s.index[uint32(id)]++
		}
	case len(s.ids) > dedupIndexMin:
		s.buildIndex()
	}
}

func (s *dedupSet) buildIndex() {
	s.index = make(map[uint32]uint32, len(s.ids))
	for _, id := range s.ids {
		s.index[uint32(id)]++
	}
}

// hotIDs returns the ids of the hot group of end, in place: a checkpoint
// sorts and writes them.
func (s *dedupSet) hotIDs(end int64) ([]uint64, bool) {
	off := 0
	for _, g := range s.groups {
		if g.end() == end {
			return s.ids[off : off+g.count()], true
		}
		off += g.count()
	}
	return nil, false
}

// minEnd is the end of the oldest group, hot or cold, or endless.
func (s *dedupSet) minEnd() int64 {
	m := int64(endless)
	if len(s.groups) > 0 {
		m = s.groups[0].end()
	}
	if len(s.cold) > 0 {
		m = min(m, s.cold[0].end())
	}
	return m
}

// coldCandidates calls check with the end of every cold group that still
// counts and holds id's fingerprint, newest first, until check returns
// true; it reports whether one did. check reads the group's ids and says
// whether id is among them.
func (s *dedupSet) coldCandidates(id uint64, finalBefore int64, check func(end int64) bool) bool {
	if len(s.cold) == 0 {
		return false
	}
	fp := fingerprint(id)
	if s.coldBits != nil {
		if w, bit := s.coldBit(fp); s.coldBits[w]&bit == 0 {
			return false
		}
	}
	hi := len(s.coldFP)
	for i := len(s.cold) - 1; i >= 0 && s.cold[i].end() > finalBefore; i-- {
		lo := hi - s.cold[i].count()
		if slices.Contains(s.coldFP[lo:hi], fp) && check(s.cold[i].end()) {
			return true
		}
		hi = lo
	}
	return false
}

// coldAt returns the index of the cold group of end.
func (s *dedupSet) coldAt(end int64) (int, bool) {
	return slices.BinarySearchFunc(s.cold, end, func(g dedupGroup, end int64) int { return cmp.Compare(g.end(), end) })
}

// warm makes cold group i hot again with its ids read back from disk, so
// that an id can be added to it.
func (s *dedupSet) warm(i int, ids []uint64) {
	end := s.cold[i].end()
	off := 0
	for _, g := range s.cold[:i] {
		off += g.count()
	}
	s.coldFP = slices.Delete(s.coldFP, off, off+s.cold[i].count())
	s.cold = slices.Delete(s.cold, i, i+1)
	s.rebuildColdBits()
	j, hot := len(s.groups), len(s.ids)
	for j > 0 && s.groups[j-1].end() > end {
		j--
		hot -= s.groups[j].count()
	}
	s.groups = insertSpare(s.groups, j, newGroup(end, len(ids)))
	s.ids = insertSpare(s.ids, hot, ids...)
	s.remember(ids...)
}

// evict makes the clean hot groups that end at or before through cold. It
// must run right after a checkpoint, when every clean group is on disk as
// it is; through is the device's watermark, so every window of their
// readings was emitted and new in-order readings never land in them.
func (s *dedupSet) evict(through int64) {
	k, ids := 0, 0
	for k < len(s.groups) && s.groups[k].end() <= through && !s.groups[k].isDirty() {
		n := s.groups[k].count()
		s.addCold(s.groups[k].end(), s.ids[ids:ids+n])
		ids += n
		k++
	}
	if k > 0 {
		s.dropHot(k, ids)
		s.rebuildColdBits()
	}
}

// loadCold adds a stored group as cold (rows come in key order).
func (s *dedupSet) loadCold(end int64, ids []uint64) {
	s.addCold(end, ids)
	if len(s.coldFP) < coldBitsMin {
		return
	}
	if len(s.coldBits) == 0 || 64*len(s.coldBits) < 8*len(s.coldFP) && len(s.coldBits) < 1024 {
		s.rebuildColdBits() // doubles its size: linear over a whole load
		return
	}
	for _, id := range ids {
		w, bit := s.coldBit(fingerprint(id))
		s.coldBits[w] |= bit
	}
}

// addCold adds a group to the cold ones, in end order: usually after them
// all, but a group warmed for late data goes back among them.
func (s *dedupSet) addCold(end int64, ids []uint64) {
	i, off := len(s.cold), len(s.coldFP)
	for i > 0 && s.cold[i-1].end() > end {
		i--
		off -= s.cold[i].count()
	}
	s.cold = insertSpare(s.cold, i, newGroup(end, len(ids)))
	s.coldFP = openGap(s.coldFP, off, len(ids))
	for j, id := range ids {
		s.coldFP[off+j] = fingerprint(id)
	}
}

// rebuildColdBits sizes coldBits to about eight bits a fingerprint and
// sets the bit of each, or drops it below coldBitsMin fingerprints.
func (s *dedupSet) rebuildColdBits() {
	if len(s.coldFP) == 0 {
		s.cold, s.coldFP, s.coldBits = nil, nil, nil
		return
	}
	if len(s.coldFP) < coldBitsMin {
		s.coldBits = nil
		return
	}
	words := 1
	for words*64 < 8*len(s.coldFP) && words < 1024 {
		words *= 2
	}
	if cap(s.coldBits) >= words && cap(s.coldBits) <= 2*words {
		s.coldBits = s.coldBits[:words]
		clear(s.coldBits)
	} else {
		s.coldBits = make([]uint64, words)
	}
	for _, fp := range s.coldFP {
		w, bit := s.coldBit(fp)
		s.coldBits[w] |= bit
	}
}

func (s *dedupSet) coldBit(fp uint16) (int, uint64) {
	b := int(fp) & (64*len(s.coldBits) - 1)
	return b >> 6, 1 << (b & 63)
}

// fingerprint is the 16 low bits of an id hash.
func fingerprint(id uint64) uint16 { return uint16(id) }

// prune drops the groups, hot and cold, that end at or before finalBefore
// and returns how many groups and ids went.
func (s *dedupSet) prune(finalBefore int64) (groups, ids int) {
	c, cids := 0, 0
	for c < len(s.cold) && s.cold[c].end() <= finalBefore {
		s.dropped = append(s.dropped, s.cold[c].end())
		cids += s.cold[c].count()
		c++
	}
	if c > 0 {
		s.cold = shrunk(slices.Delete(s.cold, 0, c))
		s.coldFP = shrunk(slices.Delete(s.coldFP, 0, cids))
		s.rebuildColdBits()
	}
	k, gone := 0, 0
	for k < len(s.groups) && s.groups[k].end() <= finalBefore {
		s.dropped = append(s.dropped, s.groups[k].end())
		gone += s.groups[k].count()
		k++
	}
	if k > 0 {
		s.dropHot(k, gone)
	}
	return c + k, cids + gone
}

// dropHot removes the first k hot groups, holding ids ids, from the hot
// set (prune deletes them, evict keeps them cold).
func (s *dedupSet) dropHot(k, ids int) {
	if s.index != nil {
		for _, id := range s.ids[:ids] {
			if s.index[uint32(id)]--; s.index[uint32(id)] == 0 {
				delete(s.index, uint32(id))
			}
		}
	}
	s.groups = shrunk(slices.Delete(s.groups, 0, k))
	s.ids = shrunk(slices.Delete(s.ids, 0, ids))
	if s.index != nil && len(s.ids) <= dedupIndexMin/2 {
		s.index = nil
	}
}

// written clears the checkpoint marks after a checkpoint wrote the set.
func (s *dedupSet) written() {
	for i := range s.groups {
		s.groups[i].nd &^= groupDirty
	}
	s.dropped = s.dropped[:0]
}

// insertSpare is slices.Insert growing by a quarter instead of append's
// doubling: a device's dedup slices grow and shrink by a group at a time,
// and 10,000 devices' doubling slack was a large part of their heap.
func insertSpare[T any](s []T, i int, v ...T) []T {
	s = openGap(s, i, len(v))
	copy(s[i:], v)
	return s
}

// openGap makes room for n elements at i, growing s by a quarter when it
// must; the n elements at i hold stale values for the caller to set.
func openGap[T any](s []T, i, n int) []T {
	if need := len(s) + n; need > cap(s) {
		grown := make([]T, len(s), max(4, need+need/4))
		copy(grown, s)
		s = grown
	}
	s = s[:len(s)+n]
	copy(s[i+n:], s[i:])
	return s
}

// shrunk returns s in a smaller array once it fills under a quarter of
// its capacity, so a set that was once large (a backlog's burst) does not
// keep that room.
func shrunk[T any](s []T) []T {
	if cap(s) > 16 && len(s) < cap(s)/4 {
		if len(s) == 0 {
			return nil
		}
		return append(make([]T, 0, len(s)+len(s)/4), s...)
	}
	return s
}
