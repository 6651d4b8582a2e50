package window

import (
	"math/bits"
	"slices"
)

// startSet is a series' evicted window starts: an ordered set of starts on
// the slide grid (multiples of slide). A series usually holds a few
// dozen, all within allowed_lateness of each other, so they are a bitmap
// inside the struct — bit i is base + i*slide — and no allocation; a set
// spanning 64 slides or more (a long lateness on a short slide) is a
// sorted slice instead. In load mode (10,000 devices, 10 minutes of
// lateness on 1-minute windows) the slices took about 2 MB, 100 bytes a
// series.
type startSet struct {
	base int64
	bits uint64
	// wide holds the starts, ascending, once the set does not fit bits
	// (behind a pointer, so that a series stays in a smaller size class).
	wide *[]int64
}

func (s *startSet) len() int {
	if s.wide != nil {
		return len(*s.wide)
	}
	return bits.OnesCount64(s.bits)
}

// slot returns start's bit in the bitmap, if it has one.
func (s *startSet) slot(start, slide int64) (uint, bool) {
	if s.bits == 0 || start < s.base || (start-s.base)%slide != 0 || (start-s.base)/slide >= 64 {
		return 0, false
	}
	return uint((start - s.base) / slide), true
}

func (s *startSet) has(start, slide int64) bool {
	if s.wide != nil {
		_, ok := slices.BinarySearch(*s.wide, start)
		return ok
	}
	i, ok := s.slot(start, slide)
	return ok && s.bits&(1<<i) != 0
}

// add inserts start, a multiple of slide.
func (s *startSet) add(start, slide int64) {
	if s.wide != nil {
		if i, ok := slices.BinarySearch(*s.wide, start); !ok {
			*s.wide = insertSpare(*s.wide, i, start)
		}
		return
	}
	if s.bits == 0 {
		s.base, s.bits = start, 1
		return
	}
	if start < s.base {
		// Rebase downwards if everything still fits.
		shift := (s.base - start) / slide
		if shift < 64 && bits.LeadingZeros64(s.bits) >= int(shift) {
			s.bits = s.bits<<uint(shift) | 1
			s.base = start
			return
		}
	} else if i, ok := s.slot(start, slide); ok {
		s.bits |= 1 << i
		return
	}
	wide := s.starts(slide, make([]int64, 0, s.len()+1))
	s.wide, s.bits, s.base = &wide, 0, 0
	s.add(start, slide)
}

// remove deletes start if it is in the set.
func (s *startSet) remove(start, slide int64) {
	if s.wide != nil {
		if i, ok := slices.BinarySearch(*s.wide, start); ok {
			*s.wide = slices.Delete(*s.wide, i, i+1)
		}
		s.narrow(slide)
		return
	}
	if i, ok := s.slot(start, slide); ok {
		s.bits &^= 1 << i
		s.rebase(slide)
	}
}

// first and last return the lowest and highest start; the set must not
// be empty.
func (s *startSet) first(slide int64) int64 {
	if s.wide != nil {
		return (*s.wide)[0]
	}
	return s.base + int64(bits.TrailingZeros64(s.bits))*slide
}

func (s *startSet) last(slide int64) int64 {
	if s.wide != nil {
		return (*s.wide)[len(*s.wide)-1]
	}
	return s.base + int64(63-bits.LeadingZeros64(s.bits))*slide
}

// starts appends the starts, ascending, to dst.
func (s *startSet) starts(slide int64, dst []int64) []int64 {
	if s.wide != nil {
		return append(dst, *s.wide...)
	}
	for b := s.bits; b != 0; b &= b - 1 {
		dst = append(dst, s.base+int64(bits.TrailingZeros64(b))*slide)
	}
	return dst
}

// dropThrough removes the starts at or below limit, calling fn with each,
// ascending, and returns how many went.
func (s *startSet) dropThrough(limit, slide int64, fn func(start int64)) int {
	n := 0
	for s.len() > 0 {
		start := s.first(slide)
		if start > limit {
			break
		}
		fn(start)
		s.remove(start, slide)
		n++
	}
	return n
}

// rebase moves base up to the lowest start left.
func (s *startSet) rebase(slide int64) {
	if s.bits == 0 {
		s.base = 0
		return
	}
	tz := bits.TrailingZeros64(s.bits)
	s.bits >>= uint(tz)
	s.base += int64(tz) * slide
}

// narrow goes back to the bitmap once the slice's starts fit it again.
func (s *startSet) narrow(slide int64) {
	wide := *s.wide
	if len(wide) == 0 {
		s.wide = nil
		return
	}
	base := wide[0]
	if (wide[len(wide)-1]-base)/slide >= 64 {
		return
	}
	var b uint64
	for _, start := range wide {
		b |= 1 << uint((start-base)/slide)
	}
	s.base, s.bits, s.wide = base, b, nil
}
