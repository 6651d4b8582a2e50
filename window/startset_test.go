package window

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestStartSetMatchesSortedSlice: random adds, removes and drops on a
// startSet answer like a sorted slice of the same starts, in the bitmap,
// across the change to a slice when a start is 64 slides or more away, and
// back.
func TestStartSetMatchesSortedSlice(t *testing.T) {
	const slide = 60_000
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 1))
		var s startSet
		var ref []int64
		spread := []int64{8, 40, 70, 200}[seed%4]
		origin := int64(rng.IntN(1000)-500) * slide
		wentWide, wentBack := false, false
		for op := range 2000 {
			start := origin + int64(rng.Int64N(spread))*slide
			wide := s.wide != nil
			switch r := rng.IntN(10); {
			case r < 5:
				s.add(start, slide)
				if i, ok := slices.BinarySearch(ref, start); !ok {
					ref = slices.Insert(ref, i, start)
				}
			case r < 8:
				s.remove(start, slide)
				if i, ok := slices.BinarySearch(ref, start); ok {
					ref = slices.Delete(ref, i, i+1)
				}
			default:
				var got []int64
				n := s.dropThrough(start, slide, func(st int64) { got = append(got, st) })
				k := 0
				for k < len(ref) && ref[k] <= start {
					k++
				}
				if n != k || !slices.Equal(got, ref[:k]) {
					t.Fatalf("seed %d op %d: dropThrough(%d) = %d %v, want %v", seed, op, start, n, got, ref[:k])
				}
				ref = ref[k:]
			}
			wentWide = wentWide || s.wide != nil
			wentBack = wentBack || wide && s.wide == nil && len(ref) > 0
			if got := s.starts(slide, nil); !slices.Equal(got, ref) || s.len() != len(ref) {
				t.Fatalf("seed %d op %d: starts %v (len %d), want %v", seed, op, got, s.len(), ref)
			}
			if len(ref) > 0 && (s.first(slide) != ref[0] || s.last(slide) != ref[len(ref)-1]) {
				t.Fatalf("seed %d op %d: first %d last %d, want %d %d", seed, op, s.first(slide), s.last(slide), ref[0], ref[len(ref)-1])
			}
			probe := origin + int64(rng.Int64N(spread))*slide
			if _, want := slices.BinarySearch(ref, probe); s.has(probe, slide) != want {
				t.Fatalf("seed %d op %d: has(%d) = %v, want %v", seed, op, probe, !want, want)
			}
		}
		if spread >= 70 && (!wentWide || !wentBack) {
			t.Fatalf("seed %d: spread %d never went to a slice and back (%v, %v)", seed, spread, wentWide, wentBack)
		}
		if spread < 64 && wentWide {
			t.Fatalf("seed %d: starts within 64 slides went to a slice", seed)
		}
	}
}
