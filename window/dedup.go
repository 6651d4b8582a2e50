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
// Ids sit in plain slices, 8 bytes each, where a Go map took about 30: at
// 10,000 devices and 10 minutes of lateness that is the larger part of the
// stage's heap. A lookup scans the live groups, which is cheaper than a map
// for the few dozen ids a device usually holds; a device past
// dedupIndexMin ids also keeps a map, so a fast device never scans
// thousands.
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
	groups []dedupIDs // hot groups, by end, ascending
	n      int        // ids in the hot groups
	index  map[uint64]int64
	// cold are the groups held only on disk, by end, ascending; coldFP
	// their ids' fingerprints, group after group; coldBits a bit per
	// fingerprint value (modulo its length) that most lookups end at.
	cold     []coldGroup
	coldFP   []uint16
	coldBits []uint64
	// filter has a bit set for every id held (nine bits of its hash), so
	// most lookups of a new id end here instead of walking every group's
	// slice (a cache miss each); rebuilt when groups are dropped.
	filter [8]uint64
	// dropped are the ends of groups removed since the last checkpoint
	// (their rows are deleted); dirty says the device is in the engine's
	// list of sets to write.
	dropped []int64
	dirty   bool
}

type dedupIDs struct {
	end   int64
	ids   []uint64
	dirty bool // changed since the last checkpoint
}

type coldGroup struct {
	end int64
	n   int // ids, and fingerprints in coldFP
}

// dedupIndexMin is the set size from which lookups go through a map.
const dedupIndexMin = 256

// seen reports whether id is held by a hot group that still counts; cold
// groups are asked through coldCandidates.
func (s *dedupSet) seen(id uint64, finalBefore int64) bool {
	if s.index != nil {
		end, ok := s.index[id]
		return ok && end > finalBefore
	}
	if w, bit := filterBit(id); s.filter[w]&bit == 0 {
		return false
	}
	for i := len(s.groups) - 1; i >= 0 && s.groups[i].end > finalBefore; i-- {
		if slices.Contains(s.groups[i].ids, id) {
			return true
		}
	}
	return false
}

// add records id under the group of end and marks the group for the next
// checkpoint; it reports whether the group was clean before. A stale copy
// of id in a group that no longer counts stays there until that group is
// dropped: no lookup consults it.
func (s *dedupSet) add(id uint64, end int64) (newlyDirty bool) {
	i := len(s.groups)
	for i > 0 && s.groups[i-1].end > end {
		i--
	}
	if i == 0 || s.groups[i-1].end != end {
		s.groups = slices.Insert(s.groups, i, dedupIDs{end: end})
	} else {
		i--
	}
	g := &s.groups[i]
	g.ids = append(g.ids, id)
	newlyDirty, g.dirty = !g.dirty, true
	s.n++
	s.remember(id, end)
	return newlyDirty
}

// load adds a stored group (rows come in key order: ascending ends).
func (s *dedupSet) load(end int64, ids []uint64) {
	s.groups = append(s.groups, dedupIDs{end: end, ids: ids})
	s.n += len(ids)
	for _, id := range ids {
		s.remember(id, end)
	}
}

// remember makes an id already in a group findable: its filter bit, and
// its index entry once the set is past dedupIndexMin (the index is built
// once, when the set crosses it, and then kept up).
func (s *dedupSet) remember(id uint64, end int64) {
	w, bit := filterBit(id)
	s.filter[w] |= bit
	switch {
	case s.index != nil:
		s.indexAdd(id, end)
	case s.n > dedupIndexMin:
		s.buildIndex()
	}
}

func (s *dedupSet) buildIndex() {
	s.index = make(map[uint64]int64, s.n)
	for _, g := range s.groups {
		for _, id := range g.ids {
			s.indexAdd(id, g.end)
		}
	}
}

// indexAdd maps id to the latest end it is held under.
func (s *dedupSet) indexAdd(id uint64, end int64) {
	if old, ok := s.index[id]; !ok || end > old {
		s.index[id] = end
	}
}

// minEnd is the end of the oldest group, hot or cold, or endless.
func (s *dedupSet) minEnd() int64 {
	m := int64(endless)
	if len(s.groups) > 0 {
		m = s.groups[0].end
	}
	if len(s.cold) > 0 {
		m = min(m, s.cold[0].end)
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
	if w, bit := s.coldBit(fp); s.coldBits[w]&bit == 0 {
		return false
	}
	hi := len(s.coldFP)
	for i := len(s.cold) - 1; i >= 0 && s.cold[i].end > finalBefore; i-- {
		lo := hi - s.cold[i].n
		if slices.Contains(s.coldFP[lo:hi], fp) && check(s.cold[i].end) {
			return true
		}
		hi = lo
	}
	return false
}

// coldAt returns the index of the cold group of end.
func (s *dedupSet) coldAt(end int64) (int, bool) {
	return slices.BinarySearchFunc(s.cold, end, func(g coldGroup, end int64) int { return cmp.Compare(g.end, end) })
}

// warm makes cold group i hot again with its ids read back from disk, so
// that an id can be added to it.
func (s *dedupSet) warm(i int, ids []uint64) {
	end := s.cold[i].end
	off := 0
	for _, g := range s.cold[:i] {
		off += g.n
	}
	s.coldFP = slices.Delete(s.coldFP, off, off+s.cold[i].n)
	s.cold = slices.Delete(s.cold, i, i+1)
	s.rebuildColdBits()
	j, _ := slices.BinarySearchFunc(s.groups, end, func(g dedupIDs, end int64) int { return cmp.Compare(g.end, end) })
	s.groups = slices.Insert(s.groups, j, dedupIDs{end: end, ids: ids})
	s.n += len(ids)
	for _, id := range ids {
		s.remember(id, end)
	}
}

// evict makes the clean hot groups that end at or before through cold. It
// must run right after a checkpoint, when every clean group is on disk as
// it is; through is the device's watermark, so every window of their
// readings was emitted and new in-order readings never land in them.
func (s *dedupSet) evict(through int64) {
	k, ids := 0, 0
	for k < len(s.groups) && s.groups[k].end <= through && !s.groups[k].dirty {
		s.addCold(s.groups[k].end, s.groups[k].ids)
		ids += len(s.groups[k].ids)
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
	for i > 0 && s.cold[i-1].end > end {
		i--
		off -= s.cold[i].n
	}
	s.cold = slices.Insert(s.cold, i, coldGroup{end: end, n: len(ids)})
	if off == len(s.coldFP) {
		for _, id := range ids {
			s.coldFP = append(s.coldFP, fingerprint(id))
		}
		return
	}
	s.coldFP = slices.Insert(s.coldFP, off, make([]uint16, len(ids))...)
	for j, id := range ids {
		s.coldFP[off+j] = fingerprint(id)
	}
}

// rebuildColdBits sizes coldBits to about eight bits a fingerprint and
// sets the bit of each.
func (s *dedupSet) rebuildColdBits() {
	if len(s.coldFP) == 0 {
		s.cold, s.coldFP, s.coldBits = nil, nil, nil
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

// fingerprint is the 16 low bits of an id hash (the filters take the top).
func fingerprint(id uint64) uint16 { return uint16(id) }

// prune drops the groups, hot and cold, that end at or before finalBefore
// and returns how many groups and ids went.
func (s *dedupSet) prune(finalBefore int64) (groups, ids int) {
	c, cids := 0, 0
	for c < len(s.cold) && s.cold[c].end <= finalBefore {
		s.dropped = append(s.dropped, s.cold[c].end)
		cids += s.cold[c].n
		c++
	}
	if c > 0 {
		s.cold = slices.Delete(s.cold, 0, c)
		s.coldFP = slices.Delete(s.coldFP, 0, cids)
		s.rebuildColdBits()
	}
	k, gone := 0, 0
	for k < len(s.groups) && s.groups[k].end <= finalBefore {
		s.dropped = append(s.dropped, s.groups[k].end)
		gone += len(s.groups[k].ids)
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
		for _, g := range s.groups[:k] {
			for _, id := range g.ids {
				if s.index[id] == g.end {
					delete(s.index, id)
				}
			}
		}
	}
	s.groups = slices.Delete(s.groups, 0, k)
	s.n -= ids
	if s.index != nil && s.n <= dedupIndexMin/2 {
		s.index = nil
	}
	// Bits of dropped ids only cost a needless scan, and with an index the
	// filter is not consulted: rebuild it only for sets that rely on it.
	if s.index == nil {
		s.filter = [8]uint64{}
		for _, g := range s.groups {
			for _, id := range g.ids {
				w, bit := filterBit(id)
				s.filter[w] |= bit
			}
		}
	}
}

// filterBit is id's word and bit in dedupSet.filter.
func filterBit(id uint64) (int, uint64) {
	b := id >> 55 // the top nine bits: the hash's best mixed
	return int(b >> 6), 1 << (b & 63)
}

// written clears the checkpoint marks after a checkpoint wrote the set.
func (s *dedupSet) written() {
	for i := range s.groups {
		s.groups[i].dirty = false
	}
	s.dropped = s.dropped[:0]
	s.dirty = false
}
