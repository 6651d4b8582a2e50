package window

import (
	"cmp"
	"slices"
	"unsafe"
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
// with a slice per group, 936 with 16-byte headers, 872 with an array of
// ids and one of headers). A lookup scans the ids of the
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
	// buf holds the set's six arrays, each a section of whole words, in
	// the order of the dedupSection constants, with n their lengths. Six
	// slices made a device 256 bytes, every one of them scanned by the
	// collector and given headroom by the heap pacer (internal/heapgoal);
	// with one array it is 160, and the arrays' separate size-class
	// rounding goes too (BenchmarkDedupHeld: 872 bytes a device with six
	// slices, 824 like this). A change moves the sections after the one
	// it changes: a few dozen elements in all for most devices, and ids,
	// which grow most, come last.
	//
	// groups are the hot groups, by end, ascending, and ids their ids,
	// group after group; cold are the groups held only on disk, by end,
	// ascending, and coldFP their ids' fingerprints, group after group;
	// coldBits, once there are coldBitsMin fingerprints, is a bit per
	// fingerprint value (modulo its length) that most lookups end at;
	// dropped are the ends of groups removed since the last checkpoint
	// (their rows are deleted).
	buf   []uint64
	n     [nSections]uint32
	index map[uint32]uint32
}

// dedupSection names a section of dedupSet.buf.
type dedupSection int

const (
	secGroups dedupSection = iota
	secCold
	secColdBits
	secDropped
	secColdFP
	secIDs
	nSections
)

// sectionSize is the bytes of one element of each section.
var sectionSize = [nSections]int{
	secGroups:   int(unsafe.Sizeof(dedupGroup{})),
	secCold:     int(unsafe.Sizeof(dedupGroup{})),
	secColdBits: 8,
	secDropped:  8,
	secColdFP:   2,
	secIDs:      8,
}

// words is the words section sec takes at n elements.
func words(sec dedupSection, n int) int { return (n*sectionSize[sec] + 7) / 8 }

// section returns the word offset of sec in buf and its length. Not
// inlined: each view would carry its loop (the arm64 code budget).
//
//go:noinline
func (s *dedupSet) section(sec dedupSection) (off, n int) {
	for k := range sec {
		off += words(k, int(s.n[k]))
	}
	return off, int(s.n[sec])
}

// view returns section sec as a slice of its elements: it aliases buf,
// valid until the set changes.
func view[T any](s *dedupSet, sec dedupSection) []T {
	off, n := s.section(sec)
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&s.buf[off])), n)
}

func (s *dedupSet) groups() []dedupGroup { return view[dedupGroup](s, secGroups) }
func (s *dedupSet) cold() []dedupGroup   { return view[dedupGroup](s, secCold) }
func (s *dedupSet) coldBits() []uint64   { return view[uint64](s, secColdBits) }
func (s *dedupSet) dropped() []int64     { return view[int64](s, secDropped) }
func (s *dedupSet) coldFP() []uint16     { return view[uint16](s, secColdFP) }
func (s *dedupSet) ids() []uint64        { return view[uint64](s, secIDs) }

// splice removes del elements of section sec at i and opens a gap of ins
// there, holding stale values for the caller to set; the sections after
// sec move with it. buf grows by a quarter when it must.
func (s *dedupSet) splice(sec dedupSection, i, del, ins int) {
	sz := sectionSize[sec]
	off, n := s.section(sec)
	n1 := n - del + ins
	w0, w1 := words(sec, n), words(sec, n1)
	tail := off + w0 // the next section's start
	if w1 > w0 {
		need := len(s.buf) + w1 - w0
		if need > cap(s.buf) {
			grown := make([]uint64, len(s.buf), max(4, need+need/4))
			copy(grown, s.buf)
			s.buf = grown
		}
		s.buf = s.buf[:need]
		copy(s.buf[off+w1:], s.buf[tail:])
	}
	if w := max(w0, w1); w > 0 {
		b := unsafe.Slice((*byte)(unsafe.Pointer(&s.buf[off])), 8*w)
		copy(b[(i+ins)*sz:], b[(i+del)*sz:n*sz])
	}
	if w1 < w0 {
		copy(s.buf[off+w1:], s.buf[tail:])
		s.buf = s.buf[:len(s.buf)-(w0-w1)]
	}
	s.n[sec] = uint32(n1)
}

// shrink moves buf to a smaller array once it fills under a quarter of
// its capacity, so a set that was once large (a backlog's burst) does not
// keep that room, and frees it when the set is empty.
func (s *dedupSet) shrink() {
	switch {
	case len(s.buf) == 0:
		s.buf = nil
	case cap(s.buf) > 16 && len(s.buf) < cap(s.buf)/4:
		s.buf = append(make([]uint64, 0, len(s.buf)+len(s.buf)/4), s.buf...)
	}
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
	groups, ids := s.groups(), s.ids()
	hi := len(ids)
	for i := len(groups) - 1; i >= 0 && groups[i].end() > finalBefore; i-- {
		lo := hi - groups[i].count()
		if slices.Contains(ids[lo:hi], id) {
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
	groups := s.groups()
	i, off := len(groups), int(s.n[secIDs])
	for i > 0 && groups[i-1].end() > end {
		i--
		off -= groups[i].count()
	}
	if i == 0 || groups[i-1].end() != end {
		s.splice(secGroups, i, 0, 1)
		s.groups()[i] = newGroup(end, 0)
	} else {
		i--
	}
	s.splice(secIDs, off, 0, 1)
	s.ids()[off] = id
	g := &s.groups()[i]
	newlyDirty = !g.isDirty()
	g.nd = (g.nd + 1) | groupDirty
	s.remember(id)
	return newlyDirty
}

// load adds a stored group (rows come in key order: ascending ends).
func (s *dedupSet) load(end int64, ids []uint64) {
	g := int(s.n[secGroups])
	s.splice(secGroups, g, 0, 1)
	s.groups()[g] = newGroup(end, len(ids))
	at := int(s.n[secIDs])
	s.splice(secIDs, at, 0, len(ids))
	copy(s.ids()[at:], ids)
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
	case s.n[secIDs] > dedupIndexMin:
		s.buildIndex()
	}
}

func (s *dedupSet) buildIndex() {
	ids := s.ids()
	s.index = make(map[uint32]uint32, len(ids))
	for _, id := range ids {
		s.index[uint32(id)]++
	}
}

// hotIDs returns the ids of the hot group of end, in place: a checkpoint
// sorts and writes them.
func (s *dedupSet) hotIDs(end int64) ([]uint64, bool) {
	off, ids := 0, s.ids()
	for _, g := range s.groups() {
		if g.end() == end {
			return ids[off : off+g.count()], true
		}
		off += g.count()
	}
	return nil, false
}

// minEnd is the end of the oldest group, hot or cold, or endless.
func (s *dedupSet) minEnd() int64 {
	m := int64(endless)
	if groups := s.groups(); len(groups) > 0 {
		m = groups[0].end()
	}
	if cold := s.cold(); len(cold) > 0 {
		m = min(m, cold[0].end())
	}
	return m
}

// coldCandidates calls check with the end of every cold group that still
// counts and holds id's fingerprint, newest first, until check returns
// true; it reports whether one did. check reads the group's ids and says
// whether id is among them; it must not change the set.
func (s *dedupSet) coldCandidates(id uint64, finalBefore int64, check func(end int64) bool) bool {
	cold := s.cold()
	if len(cold) == 0 {
		return false
	}
	fp := fingerprint(id)
	if bits := s.coldBits(); len(bits) > 0 {
		if w, bit := coldBit(bits, fp); bits[w]&bit == 0 {
			return false
		}
	}
	fps := s.coldFP()
	hi := len(fps)
	for i := len(cold) - 1; i >= 0 && cold[i].end() > finalBefore; i-- {
		lo := hi - cold[i].count()
		if slices.Contains(fps[lo:hi], fp) && check(cold[i].end()) {
			return true
		}
		hi = lo
	}
	return false
}

// coldAt returns the index of the cold group of end.
func (s *dedupSet) coldAt(end int64) (int, bool) {
	return slices.BinarySearchFunc(s.cold(), end, func(g dedupGroup, end int64) int { return cmp.Compare(g.end(), end) })
}

// warm makes cold group i hot again with its ids read back from disk, so
// that an id can be added to it.
func (s *dedupSet) warm(i int, ids []uint64) {
	cold := s.cold()
	end, n := cold[i].end(), cold[i].count()
	off := 0
	for _, g := range cold[:i] {
		off += g.count()
	}
	s.splice(secColdFP, off, n, 0)
	s.splice(secCold, i, 1, 0)
	s.rebuildColdBits()
	hot := s.openGroup(secGroups, secIDs, end, len(ids))
	copy(s.ids()[hot:], ids)
	s.remember(ids...)
}

// evict makes the clean hot groups that end at or before through cold. It
// must run right after a checkpoint, when every clean group is on disk as
// it is; through is the device's watermark, so every window of their
// readings was emitted and new in-order readings never land in them.
func (s *dedupSet) evict(through int64) {
	k, lo := 0, 0
	for ; k < int(s.n[secGroups]); k++ {
		g := s.groups()[k]
		if g.end() > through || g.isDirty() {
			break
		}
		off := s.openGroup(secCold, secColdFP, g.end(), g.count())
		fps, ids := s.coldFP(), s.ids() // after openGroup moved the ids
		for j := range g.count() {
			fps[off+j] = fingerprint(ids[lo+j])
		}
		lo += g.count()
	}
	if k > 0 {
		s.dropHot(k, lo)
		s.rebuildColdBits()
		s.shrink()
	}
}

// loadCold adds a stored group as cold (rows come in key order).
func (s *dedupSet) loadCold(end int64, ids []uint64) {
	s.addCold(end, ids)
	nfp := int(s.n[secColdFP])
	if nfp < coldBitsMin {
		return
	}
	if bits := s.coldBits(); len(bits) == 0 || 64*len(bits) < 8*nfp && len(bits) < 1024 {
		s.rebuildColdBits() // doubles its size: linear over a whole load
		return
	}
	bits := s.coldBits()
	for _, id := range ids {
		w, bit := coldBit(bits, fingerprint(id))
		bits[w] |= bit
	}
}

// addCold adds a group to the cold ones (see openGroup).
func (s *dedupSet) addCold(end int64, ids []uint64) {
	off := s.openGroup(secCold, secColdFP, end, len(ids))
	fps := s.coldFP()
	for j, id := range ids {
		fps[off+j] = fingerprint(id)
	}
}

// openGroup inserts the header of a group of n elements in section hdr
// (groups or cold), in end order (usually after them all, but a group
// warmed for late data goes back among them), and opens room for them in
// section data (ids or coldFP); it returns their offset there.
func (s *dedupSet) openGroup(hdr, data dedupSection, end int64, n int) int {
	headers := view[dedupGroup](s, hdr)
	i, off := len(headers), int(s.n[data])
	for i > 0 && headers[i-1].end() > end {
		i--
		off -= headers[i].count()
	}
	s.splice(hdr, i, 0, 1)
	view[dedupGroup](s, hdr)[i] = newGroup(end, n)
	s.splice(data, off, 0, n)
	return off
}

// rebuildColdBits sizes coldBits to about eight bits a fingerprint and
// sets the bit of each, or drops it below coldBitsMin fingerprints.
func (s *dedupSet) rebuildColdBits() {
	nfp := int(s.n[secColdFP])
	words := 0
	if nfp >= coldBitsMin {
		words = 1
		for words*64 < 8*nfp && words < 1024 {
			words *= 2
		}
	}
	s.splice(secColdBits, 0, int(s.n[secColdBits]), words)
	if words == 0 {
		return
	}
	bits := s.coldBits()
	clear(bits)
	for _, fp := range s.coldFP() {
		w, bit := coldBit(bits, fp)
		bits[w] |= bit
	}
}

func coldBit(bits []uint64, fp uint16) (int, uint64) {
	b := int(fp) & (64*len(bits) - 1)
	return b >> 6, 1 << (b & 63)
}

// fingerprint is the 16 low bits of an id hash.
func fingerprint(id uint64) uint16 { return uint16(id) }

// prune drops the groups, hot and cold, that end at or before finalBefore
// and returns how many groups and ids went.
func (s *dedupSet) prune(finalBefore int64) (groups, ids int) {
	c, cids := 0, 0
	for cold := s.cold(); c < len(cold) && cold[c].end() <= finalBefore; c++ {
		cids += cold[c].count()
	}
	k, gone := 0, 0
	for hot := s.groups(); k < len(hot) && hot[k].end() <= finalBefore; k++ {
		gone += hot[k].count()
	}
	if c+k == 0 {
		return 0, 0
	}
	at := int(s.n[secDropped])
	s.splice(secDropped, at, 0, c+k)
	dropped := s.dropped()[at:]
	for j, g := range s.cold()[:c] {
		dropped[j] = g.end()
	}
	for j, g := range s.groups()[:k] {
		dropped[c+j] = g.end()
	}
	if c > 0 {
		s.splice(secCold, 0, c, 0)
		s.splice(secColdFP, 0, cids, 0)
		s.rebuildColdBits()
	}
	if k > 0 {
		s.dropHot(k, gone)
	}
	s.shrink()
	return c + k, cids + gone
}

// dropHot removes the first k hot groups, holding ids ids, from the hot
// set (prune deletes them, evict keeps them cold).
func (s *dedupSet) dropHot(k, ids int) {
	if s.index != nil {
		for _, id := range s.ids()[:ids] {
			if s.index[uint32(id)]--; s.index[uint32(id)] == 0 {
				delete(s.index, uint32(id))
			}
		}
	}
	s.splice(secGroups, 0, k, 0)
	s.splice(secIDs, 0, ids, 0)
	if s.index != nil && s.n[secIDs] <= dedupIndexMin/2 {
		s.index = nil
	}
}

// written clears the checkpoint marks after a checkpoint wrote the set.
func (s *dedupSet) written() {
	groups := s.groups()
	for i := range groups {
		groups[i].nd &^= groupDirty
	}
	s.splice(secDropped, 0, int(s.n[secDropped]), 0)
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
