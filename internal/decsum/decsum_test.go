package decsum

import (
	"encoding/binary"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// plainSum sums xs the way the window stage does, and returns the
// smallest and largest reading.
func plainSum(xs []float64) (sum, lo, hi float64) {
	lo, hi = xs[0], xs[0]
	for _, x := range xs {
		sum += x
		lo, hi = math.Min(lo, x), math.Max(hi, x)
	}
	return sum, lo, hi
}

func TestSnapExamples(t *testing.T) {
	third, pi, e := 1.0/3, math.Pi, math.E // variables: constant sums would be exact
	cases := []struct {
		name      string
		xs        []float64
		sum, mean float64
	}{
		{"0.1+0.2", []float64{0.1, 0.2}, 0.3, 0.15},
		// Plain: 65.52000000000001 and 21.840000000000003.
		{"hundredths", []float64{21.76, 21.86, 21.9}, 65.52, 21.84},
		// Plain: 64.21000000000001 and 21.403333333333336.
		{"hundredths, mean not a short decimal", []float64{21.14, 21.47, 21.6}, 64.21, 64.21 / 3},
		{"hundredths, exact already", []float64{21.37, 21.41, 21.38, 21.4, 21.39, 21.42}, 128.37, 21.395},
		{"mixed signs", []float64{-0.1, 0.3, -0.07}, 0.13, 0.13 / 3},
		{"negative", []float64{-12.31, -12.3, -12.33}, -36.94, -36.94 / 3},
		{"integers", []float64{3, 4, 5}, 12, 4},
		{"one reading", []float64{21.37}, 21.37, 21.37},
		{"large magnitude", []float64{1e9 + 0.01, 1e9 + 0.02, 1e9 + 0.04}, 3e9 + 0.07, 1e9 + 0.07/3},
		{"tiny decimals", []float64{0.000001, 0.000002, 0.000004}, 0.000007, 0.000007 / 3},
		{"zeros", []float64{0, 0, 0}, 0, 0},
		{"cancelling", []float64{0.1, 0.2, -0.3}, 0, 0},        // plain: 5.551115123125783e-17
		{"cancelling below", []float64{-0.1, -0.2, 0.3}, 0, 0}, // plain: -5.551115123125783e-17; +0, not -0
		// The window's sum starts at +0, and +0 + -0 is +0.
		{"negative zero", []float64{math.Copysign(0, -1)}, 0, 0},
		// Not decimals: left alone.
		{"pi and e", []float64{pi, e}, pi + e, (pi + e) / 2},
		{"thirds", []float64{third, third, third, third}, third + third + third + third, (third + third + third + third) / 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sum, lo, hi := plainSum(c.xs)
			got, mean := Snap(sum, uint64(len(c.xs)), lo, hi)
			if math.Float64bits(got) != math.Float64bits(c.sum) || math.Float64bits(mean) != math.Float64bits(c.mean) {
				t.Fatalf("Snap(%v) = %v, %v; want %v, %v (plain sum %v)", c.xs, got, mean, c.sum, c.mean, sum)
			}
		})
	}
}

func TestSnapLeavesOddInputsAlone(t *testing.T) {
	inf, nan := math.Inf(1), math.NaN()
	for _, c := range []struct {
		sum     float64
		n       uint64
		lo, hi  float64
		comment string
	}{
		{inf, 2, 1, inf, "infinite sum"},
		{nan, 2, 1, 2, "NaN sum"},
		{0.30000000000000004, 2, 0.1, nan, "NaN reading"},
		{0.30000000000000004, 0, 0.1, 0.2, "no readings"},
		{0.30000000000000004, maxCount + 1, 0.1, 0.2, "beyond the bound's count"},
		// A day of one-second readings near 1e6 at hundredths: the bound
		// is wider than a hundredth's quarter.
		{86400e6 + 0.01, 86400, 1e6, 1e6 + 0.02, "bound too wide"},
	} {
		got, mean := Snap(c.sum, c.n, c.lo, c.hi)
		if math.Float64bits(got) != math.Float64bits(c.sum) {
			t.Errorf("%s: sum %v became %v", c.comment, c.sum, got)
		}
		if want := c.sum / float64(c.n); math.Float64bits(mean) != math.Float64bits(want) && !(math.IsNaN(mean) && math.IsNaN(want)) {
			t.Errorf("%s: mean %v, want %v", c.comment, mean, want)
		}
	}
}

// decimalCase draws n readings of d decimal places around a level, the
// doubles nearest them, and the exact decimal sum as an integer count of
// 10^-d.
func decimalCase(r *rand.Rand) (xs []float64, k int64, d int) {
	d = r.IntN(7)
	n := 1 + r.IntN(2000)
	if r.IntN(4) == 0 {
		n = 1 + r.IntN(20)
	}
	// Integer level and spread in units of 10^-d.
	level := int64(r.NormFloat64() * math.Pow(10, float64(r.IntN(8))))
	spread := int64(1 + r.IntN(1_000_000))
	if r.IntN(3) == 0 {
		level = 0 // mixed signs
	}
	p := pow10[d]
	for range n {
		ki := level + r.Int64N(2*spread+1) - spread
		k += ki
		xs = append(xs, float64(ki)/p) // both exact: the double nearest ki/10^d
	}
	return xs, k, d
}

// checkDecimal asserts that Snap gives the double nearest the exact decimal
// sum and mean whenever the package's preconditions hold, and reports
// whether they did.
func checkDecimal(t *testing.T, xs []float64, k int64, d int) bool {
	t.Helper()
	sum, lo, hi := plainSum(xs)
	n := uint64(len(xs))
	p := pow10[d]
	got, mean := Snap(sum, n, lo, hi)
	checkChange(t, xs, sum, got)
	if Bound(sum, n, lo, hi)*p > 0.25 || math.Abs(sum)*p >= 1<<50 {
		return false
	}
	wantSum, _ := new(big.Rat).SetFrac64(k, int64(p)).Float64()
	wantMean, _ := new(big.Rat).SetFrac(big.NewInt(k), new(big.Int).Mul(big.NewInt(int64(p)), new(big.Int).SetUint64(n))).Float64()
	if got != wantSum || mean != wantMean {
		t.Fatalf("%d readings of %d places, exact sum %d/10^%d: Snap = %v, %v; want %v, %v (plain %v, bound %g)",
			n, d, k, d, got, mean, wantSum, wantMean, sum, Bound(sum, n, lo, hi))
	}
	return true
}

// checkChange asserts the two bounds of the package documentation against
// exact arithmetic: the plain sum is within (n−1)·½ulp(A) of the exact sum
// of the doubles, and Snap moved it by at most E + ½ulp.
func checkChange(t *testing.T, xs []float64, sum, snapped float64) {
	t.Helper()
	_, lo, hi := plainSum(xs)
	n := uint64(len(xs))
	exact := new(big.Float).SetPrec(4200)
	for _, x := range xs {
		exact.Add(exact, new(big.Float).SetFloat64(x))
	}
	fn := float64(n)
	m := max(math.Abs(lo), math.Abs(hi))
	a := math.Abs(sum)
	if lo < 0 && hi > 0 {
		a = fn * m * (1 + 0x1p-19)
	}
	sumErr := new(big.Float).SetPrec(4200).Sub(new(big.Float).SetFloat64(sum), exact)
	if limit := (fn - 1) * halfUlp(a); !math.IsInf(limit, 1) && sumErr.Abs(sumErr).Cmp(new(big.Float).SetFloat64(limit)) > 0 {
		t.Fatalf("plain sum %v of %d readings is %v from the exact sum, beyond the summation bound %v", sum, n, sumErr, limit)
	}
	if !finite(snapped) && finite(sum) {
		t.Fatalf("Snap made %v of %v", snapped, sum)
	}
	change := math.Abs(snapped - sum) // exact: the two are within a factor of two or equal
	if snapped != sum && change > Bound(sum, n, lo, hi)*(1+0x1p-48)+halfUlp(math.Abs(snapped)) {
		t.Fatalf("Snap moved %v to %v, by %g, beyond the bound %g", sum, snapped, change, Bound(sum, n, lo, hi))
	}
}

func TestSnapDecimalReadings(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	cases, exact := 3000, 0
	if testing.Short() {
		cases = 300
	}
	for range cases {
		xs, k, d := decimalCase(r)
		if checkDecimal(t, xs, k, d) {
			exact++
		}
	}
	// The preconditions hold for nearly all realistic cases; a test that
	// silently checked none would prove nothing.
	if exact < cases*9/10 {
		t.Fatalf("the exactness preconditions held in only %d of %d cases", exact, cases)
	}
}

// FuzzSnap feeds arbitrary doubles (any bit pattern) and arbitrary decimal
// readings.
func FuzzSnap(f *testing.F) {
	f.Add(false, uint8(2), []byte("\x00\x00\x00\x00\x00\x00\xf0\x3f\x9a\x99\x99\x99\x99\x99\xb9\x3f"))
	f.Add(true, uint8(2), []byte("\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c"))
	f.Add(true, uint8(0), []byte("\xff\xff\xff\x7f\x00\x00\x00\x80"))
	f.Fuzz(func(t *testing.T, decimal bool, places uint8, data []byte) {
		if !decimal {
			var xs []float64
			for ; len(data) >= 8 && len(xs) < 256; data = data[8:] {
				x := math.Float64frombits(binary.LittleEndian.Uint64(data))
				if finite(x) {
					xs = append(xs, x)
				}
			}
			if len(xs) == 0 {
				return
			}
			sum, lo, hi := plainSum(xs)
			if !finite(sum) {
				return
			}
			got, _ := Snap(sum, uint64(len(xs)), lo, hi)
			checkChange(t, xs, sum, got)
			return
		}
		d := int(places) % (MaxDigits + 1)
		var xs []float64
		var k int64
		for ; len(data) >= 4 && len(xs) < 4096; data = data[4:] {
			ki := int64(int32(binary.LittleEndian.Uint32(data)))
			k += ki
			xs = append(xs, float64(ki)/pow10[d])
		}
		if len(xs) == 0 {
			return
		}
		checkDecimal(t, xs, k, d)
	})
}

func BenchmarkSnap(b *testing.B) {
	xs := []float64{21.37, 21.41, 21.38, 21.4, 21.39, 21.42}
	sum, lo, hi := plainSum(xs)
	for b.Loop() {
		Snap(sum, 6, lo, hi)
	}
}
