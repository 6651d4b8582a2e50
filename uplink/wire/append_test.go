package wire

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

// The reference for AppendAggregate and AppendAlert is the reflection
// encoder they replace: encMode.Marshal, with the struct tags.

func checkAggregate(t *testing.T, a *Aggregate) {
	t.Helper()
	want, err := encMode.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	if got := AppendAggregate(nil, a); !bytes.Equal(got, want) {
		t.Fatalf("AppendAggregate(%+v)\n got %x\nwant %x", *a, got, want)
	}
	if n := aggregateSize(a); n != len(want) {
		t.Fatalf("aggregateSize = %d, want %d", n, len(want))
	}
	// Appending after existing bytes leaves them alone.
	if got := AppendAggregate([]byte{0xee}, a); got[0] != 0xee || !bytes.Equal(got[1:], want) {
		t.Fatalf("AppendAggregate after a prefix: %x", got)
	}
	if got, _ := EncodeAggregate(a); !bytes.Equal(got, want) {
		t.Fatalf("EncodeAggregate differs from the reflection encoder: %x", got)
	}
}

func checkAlert(t *testing.T, a *Alert) {
	t.Helper()
	want, err := encMode.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := EncodeAlert(a); !bytes.Equal(got, want) {
		t.Fatalf("EncodeAlert(%+v)\n got %x\nwant %x", *a, got, want)
	}
}

// edgeFloats are the floats whose encoding is not the plain double.
var edgeFloats = []float64{0, math.Copysign(0, -1), 21.5, -1e300, math.SmallestNonzeroFloat64,
	math.MaxFloat64, math.NaN(), math.Float64frombits(0x7ff0000000000001), math.Float64frombits(0xfff8000000000000),
	math.Inf(1), math.Inf(-1)}

// edgeInts cross every CBOR head width, both signs.
var edgeInts = []int64{0, 1, 23, 24, 255, 256, 65535, 65536, 1<<32 - 1, 1 << 32, math.MaxInt64,
	-1, -24, -25, -256, -257, -65536, -65537, -1 << 32, -1<<32 - 1, math.MinInt64}

func TestAppendAggregateEdges(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	base := Aggregate{Metric: "temperature", Start: 1767225600000, End: 1767225660000, Count: 60,
		Key: "gw/temperature/1767225600000/dev-0001/1", Device: "dev-0001", Rev: 1}
	checkAggregate(t, &Aggregate{}) // every string empty, every pointer nil
	checkAggregate(t, &base)
	for _, v := range edgeInts {
		a := base
		a.Start, a.End, a.Count, a.Rev = v, -v, uint64(v), uint32(v)
		checkAggregate(t, &a)
	}
	for _, c := range []uint64{math.MaxUint64, 1 << 63} {
		a := base
		a.Count = c
		checkAggregate(t, &a)
	}
	for _, n := range []int{0, 23, 24, 255, 256, 65535, 65536} {
		a := base
		a.Metric, a.Key, a.Device = long(n), long(n+1), "é"+long(n)
		checkAggregate(t, &a)
	}
	for _, f := range edgeFloats {
		a := base
		a.ProcTime = true
		a.Min, a.First, a.Last, a.Max, a.Mean, a.Sum = &f, &f, &f, &f, &f, &f
		checkAggregate(t, &a)
		// One float at a time, in each position.
		for i := range 6 {
			a := base
			*[...]**float64{&a.Min, &a.First, &a.Last, &a.Max, &a.Mean, &a.Sum}[i] = &f
			checkAggregate(t, &a)
		}
	}
}

func TestAppendAlertEdges(t *testing.T) {
	checkAlert(t, &Alert{})
	for _, f := range edgeFloats {
		checkAlert(t, &Alert{Rule: "hot", Device: "dev-1", Metric: "temperature", Start: -5, State: "fired",
			Value: f, Key: "gw/hot/dev-1/-5/fired"})
	}
	for _, v := range edgeInts {
		checkAlert(t, &Alert{Rule: strings.Repeat("r", 300), Start: v, Severity: "warn", Suppressed: uint32(v)})
	}
}

// FuzzAppendAggregate: the hand-written encoder and the reflection encoder
// agree on every aggregate. mask picks the floats that are set (bit i for
// the i-th of min, first, last, max, mean, sum).
func FuzzAppendAggregate(f *testing.F) {
	f.Add("temperature", "gw/temperature/1767225600000/dev-0001/1", "dev-0001", int64(1767225600000), int64(1767225660000),
		uint64(60), false, uint32(1), uint8(0x3f), 20.5, 21.25, 21.0, 22.75, 21.5, 1290.0)
	f.Add("", "", "", int64(-1), int64(math.MinInt64), uint64(math.MaxUint64), true, uint32(math.MaxUint32), uint8(0x15),
		math.NaN(), math.Inf(1), math.Inf(-1), math.Copysign(0, -1), 0.0, 1e-310)
	f.Add(strings.Repeat("m", 24), strings.Repeat("k", 256), strings.Repeat("d", 70000), int64(24), int64(-25),
		uint64(1<<32), false, uint32(65536), uint8(0x2a), 1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
	f.Fuzz(func(t *testing.T, metric, key, device string, start, end int64, count uint64, ptime bool, rev uint32,
		mask uint8, min, first, last, max, mean, sum float64) {
		a := Aggregate{Metric: metric, Start: start, End: end, Count: count, ProcTime: ptime, Key: key,
			Device: device, Rev: rev}
		for i, p := range [...]**float64{&a.Min, &a.First, &a.Last, &a.Max, &a.Mean, &a.Sum} {
			if mask&(1<<i) != 0 {
				v := [...]float64{min, first, last, max, mean, sum}[i]
				*p = &v
			}
		}
		checkAggregate(t, &a)
	})
}

// FuzzAppendAlert: as FuzzAppendAggregate, for alerts.
func FuzzAppendAlert(f *testing.F) {
	f.Add("hot", "dev-1", "temperature", int64(1767225600000), "fired", "", 31.5, "gw/hot/dev-1/1767225600000/fired", uint32(0))
	f.Add("", "", "", int64(math.MinInt64), "", "critical", math.NaN(), strings.Repeat("k", 300), uint32(math.MaxUint32))
	f.Fuzz(func(t *testing.T, rule, device, metric string, start int64, state, severity string, value float64, key string, suppressed uint32) {
		checkAlert(t, &Alert{Rule: rule, Device: device, Metric: metric, Start: start, State: state,
			Severity: severity, Value: value, Key: key, Suppressed: suppressed})
	})
}

func BenchmarkAppendAggregate(b *testing.B) {
	a := Aggregate{Metric: "temperature", Start: 1767225600000, End: 1767225660000, Count: 60,
		Key: "gw/temperature/1767225600000/dev-0001/1", Device: "dev-0001", Rev: 1,
		Min: F(20.5), First: F(21.25), Last: F(21), Max: F(22.75), Mean: F(21.5), Sum: F(1290)}
	buf := make([]byte, 0, 256)
	for b.Loop() {
		buf = AppendAggregate(buf[:0], &a)
	}
}
