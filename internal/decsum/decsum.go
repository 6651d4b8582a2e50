// Package decsum recovers the exact decimal sum from a float64 sum of
// decimal readings, so that a window's sum and mean come out as the doubles
// nearest the true decimal figures instead of carrying rounding noise.
//
// Sensors report decimals (21.37, 1013.25), which a float64 holds only
// approximately, and a plain float64 sum adds a rounding error at every
// step: 0.1 + 0.2 gives 0.30000000000000004. Snap takes such a sum, with the
// count and the smallest and largest reading, computes a rigorous bound E
// of how far the plain sum can be from the sum of the decimals the readings
// stand for, and returns the double nearest the one decimal with the fewest
// places (at most MaxDigits) that lies within E of the plain sum — when the
// bound is tight enough for that decimal to be the only candidate.
//
// # The bound
//
// Let the n readings be doubles x_i with |x_i| ≤ M (M = max(|min|, |max|)),
// summed in any order as s_1 = x_1, s_k = fl(s_{k-1} + x_k). With round to
// nearest, each addition errs by at most half an ulp of its result (an
// addition whose result is subnormal is exact), so if A bounds every |s_k|,
//
//	|s_n − Σ x_i| ≤ (n−1)·½ulp(A).
//
// When all readings have one sign the partial sums grow monotonically in
// magnitude and A = |s_n|; otherwise A = n·M·(1+2⁻¹⁹), which holds while
// n·2⁻⁵³ ≤ 2⁻²⁰ (the partial sums are at most k·M plus their own errors).
// A reading that stands for the decimal d_i is the double nearest it, so
// |x_i − d_i| ≤ ½ulp(M), and
//
//	E = (n−1)·½ulp(A) + n·½ulp(M)  ≥  |s_n − Σ d_i|.
//
// E is the error bound the plain sum already carries with respect to the
// decimal sum of the readings; no safety factor is needed because it is
// rigorous, not an estimate (the property tests check it with exact
// arithmetic).
//
// # What Snap guarantees
//
//   - The change is bounded: Snap accepts a decimal k/10^D only when
//     |s_n − k/10^D| ≤ E (to within a relative 2⁻⁴⁹, the rounding of the
//     test itself), and returns the double nearest it, so
//     |Snap − s_n| ≤ E + ½ulp(result), whatever the readings are: never
//     more than the plain sum's own error bound, plus the rounding every
//     double result has.
//   - Decimal readings give the exact answer: if every reading is the
//     double nearest a decimal of at most D ≤ MaxDigits places, and
//     E·10^D ≤ ¼ and |s_n|·10^D < 2⁵⁰, Snap returns the double nearest the
//     exact decimal sum. The decimal sum is within E of s_n; a candidate
//     with fewer places that Snap might accept first is within E too, and
//     two points of the 10^-D grid both within E ≤ 10^-D/4 of s_n are equal,
//     so it is the same number. At D itself, s_n·10^D is within ¼ + ⅛ of
//     the integer k (the ⅛ is the rounding of the product below 2⁵⁰), so
//     rounding finds k.
//   - The mean is then k / (10^D·n) in one correctly rounded division (when
//     10^D·n is below 2⁵³), the double nearest the exact decimal mean.
//
// Readings that are not decimals of at most MaxDigits places (or sums whose
// bound is too wide, such as a day of one-second readings at 9 places) are
// left as they are, or moved by at most E as the first point says.
package decsum

import "math"

// MaxDigits is the most decimal places Snap tries.
const MaxDigits = 9

// maxCount is the largest count Snap handles: the bound on the partial
// sums of mixed-sign readings assumes n·2⁻⁵³ ≤ 2⁻²⁰.
const maxCount = 1 << 33

var pow10 = [MaxDigits + 1]float64{1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9}

// Snap returns the sum of n readings and their mean: the doubles nearest
// the decimal sum and mean when sum is, within its error bound, a decimal
// of at most MaxDigits places; sum and sum/n otherwise. lo and hi are the
// smallest and largest reading. See the package documentation for what it
// guarantees.
func Snap(sum float64, n uint64, lo, hi float64) (float64, float64) {
	fn := float64(n)
	plain := sum / fn
	if n == 0 || n > maxCount || !finite(sum) || !finite(lo) || !finite(hi) {
		return sum, plain
	}
	e := Bound(sum, n, lo, hi)
	for _, p := range pow10 {
		sp := sum * p
		if !(e*p <= 0.25) || math.Abs(sp) >= 1<<50 {
			// The grid is finer than the bound (or than the double): a
			// decimal within E would not be the only one. Finer grids are
			// only worse.
			break
		}
		k := math.Round(sp)
		if k == 0 {
			k = 0 // a decimal zero is +0, even when cancellation left -1e-17
		}
		// sum·p − k with a single rounding: the distance to the grid point,
		// scaled by p.
		if math.Abs(math.FMA(sum, p, -k)) > e*p {
			continue
		}
		// k and p are exact, so s is the double nearest k/10^D; below 2⁵³
		// p·n is exact too, and k/(p·n) the double nearest the mean.
		s := k / p
		if pn := p * fn; pn < 1<<53 {
			return s, k / pn
		}
		return s, s / fn
	}
	return sum, plain
}

// Bound returns E, the rigorous bound on how far sum — a plain float64 sum
// of n readings between lo and hi, in any order — can be from the sum of the
// decimals the readings stand for (see the package documentation). It is
// +Inf when n is beyond what the bound covers or an input is not finite.
func Bound(sum float64, n uint64, lo, hi float64) float64 {
	if n == 0 || n > maxCount || !finite(sum) || !finite(lo) || !finite(hi) {
		return math.Inf(1)
	}
	fn := float64(n)
	m := max(math.Abs(lo), math.Abs(hi))
	a := math.Abs(sum)
	if lo < 0 && hi > 0 {
		a = fn * m * (1 + 0x1p-19)
	}
	e := (fn-1)*halfUlp(a) + fn*halfUlp(m)
	// The two products are exact (powers of two times integers below
	// 2⁵³); their sum may round down by half an ulp: round E up instead.
	return e * (1 + 0x1p-50)
}

// halfUlp is half the gap between x ≥ 0 and the next double above it
// (+Inf for the largest double and beyond).
func halfUlp(x float64) float64 {
	switch {
	case x == 0:
		return 0
	case x >= math.MaxFloat64:
		return math.Inf(1)
	}
	return (math.Nextafter(x, math.Inf(1)) - x) / 2
}

func finite(x float64) bool { return !math.IsInf(x, 0) && !math.IsNaN(x) }
