package window

import "slices"

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
type dedupSet struct {
	groups []dedupIDs // by end, ascending
	n      int        // ids in all groups
	index  map[uint64]int64
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

// dedupIndexMin is the set size from which lookups go through a map.
const dedupIndexMin = 256

// seen reports whether id is held by a group that still counts.
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

// minEnd is the end of the oldest group, or endless.
func (s *dedupSet) minEnd() int64 {
	if len(s.groups) == 0 {
		return endless
	}
	return s.groups[0].end
}

// prune drops the groups that end at or before finalBefore and returns how
// many groups and ids went.
func (s *dedupSet) prune(finalBefore int64) (groups, ids int) {
	k, gone := 0, 0
	for k < len(s.groups) && s.groups[k].end <= finalBefore {
		g := &s.groups[k]
		gone += len(g.ids)
		s.dropped = append(s.dropped, g.end)
		if s.index != nil {
			for _, id := range g.ids {
				if s.index[id] == g.end {
					delete(s.index, id)
				}
			}
		}
		k++
	}
	if k == 0 {
		return 0, 0
	}
	s.groups = slices.Delete(s.groups, 0, k)
	s.n -= gone
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
	return k, gone
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
