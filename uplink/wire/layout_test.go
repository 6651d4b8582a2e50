package wire_test

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fxamacker/cbor/v2"

	"github.com/edgeagent/edgeagent/uplink/internal/synthetic"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

func encodeRows(t testing.TB, aggs []wire.Aggregate) [][]byte {
	t.Helper()
	rows := make([][]byte, len(aggs))
	for i := range aggs {
		raw, err := wire.EncodeAggregate(&aggs[i])
		if err != nil {
			t.Fatal(err)
		}
		rows[i] = raw
	}
	return rows
}

func TestSortAggregatesOrder(t *testing.T) {
	aggs := synthetic.New("gw-1", 7, 3).Take(7 * 4 * 3) // 7 devices × 4 metrics × 3 windows
	// A revision and a second revision of one window.
	r2 := aggs[5]
	r2.Rev, r2.Key = 2, wire.AggregateKey("gw-1", r2.Device, r2.Metric, r2.Start, 2)
	r3 := r2
	r3.Rev, r3.Key = 3, wire.AggregateKey("gw-1", r2.Device, r2.Metric, r2.Start, 3)
	aggs = append(aggs, r3, r2)
	rows := encodeRows(t, aggs)
	wire.SortAggregates(rows)
	var prev *wire.Aggregate
	for i, raw := range rows {
		var a wire.Aggregate
		if err := wire.DecodeAggregate(raw, &a); err != nil {
			t.Fatal(err)
		}
		if prev != nil {
			p := prev
			less := p.Metric < a.Metric ||
				p.Metric == a.Metric && (p.Device < a.Device ||
					p.Device == a.Device && (p.Start < a.Start ||
						p.Start == a.Start && p.Rev < a.Rev))
			if !less {
				t.Fatalf("row %d (%s %s %d rev %d) after (%s %s %d rev %d)", i, a.Metric, a.Device, a.Start, a.Rev,
					p.Metric, p.Device, p.Start, p.Rev)
			}
		}
		prev = &a
	}
}

// The order depends on the rows only: a batch sealed again from the same
// rows, read in another order, is byte-identical.
func TestSortAggregatesDeterministic(t *testing.T) {
	rows := encodeRows(t, synthetic.New("gw-1", 50, 9).Take(500))
	rows = append(rows, rows[3], []byte{0xa1, 0x61, 0x78, 0x01}, []byte{0x80}, nil) // a duplicate, foreign and broken rows
	want := slices.Clone(rows)
	wire.SortAggregates(want)
	r := rand.New(rand.NewPCG(1, 1))
	for range 5 {
		got := slices.Clone(rows)
		r.Shuffle(len(got), func(i, j int) { got[i], got[j] = got[j], got[i] })
		wire.SortAggregates(got)
		if !slices.EqualFunc(got, want, bytes.Equal) {
			t.Fatal("the order depends on the input order")
		}
	}
	// Rows that are not aggregates go last, by their bytes.
	tail := want[len(want)-3:]
	if !bytes.Equal(tail[0], nil) || !bytes.Equal(tail[1], []byte{0x80}) || !bytes.Equal(tail[2], []byte{0xa1, 0x61, 0x78, 0x01}) {
		t.Fatalf("foreign rows at the end: %x", tail)
	}
}

// Rows with their keys in another order (say, written by an older agent
// before an upgrade) sort by the same fields.
func TestSortAggregatesAnyKeyOrder(t *testing.T) {
	aggs := synthetic.New("gw-1", 3, 5).Take(12)
	mode, err := cbor.EncOptions{Sort: cbor.SortBytewiseLexical, ShortestFloat: cbor.ShortestFloat16}.EncMode()
	if err != nil {
		t.Fatal(err)
	}
	var mixed [][]byte
	for i := range aggs {
		a := &aggs[i]
		if i%2 == 0 {
			raw, err := wire.EncodeAggregate(a)
			if err != nil {
				t.Fatal(err)
			}
			mixed = append(mixed, raw)
			continue
		}
		raw, err := mode.Marshal(map[string]any{
			"count": a.Count, "device": a.Device, "end": a.End, "key": a.Key, "metric": a.Metric,
			"rev": a.Rev, "start": a.Start, "sum": *a.Sum,
		})
		if err != nil {
			t.Fatal(err)
		}
		mixed = append(mixed, raw)
	}
	wire.SortAggregates(mixed)
	for i := 1; i < len(mixed); i++ {
		var a, b wire.Aggregate
		if err := wire.DecodeAggregate(mixed[i-1], &a); err != nil {
			t.Fatal(err)
		}
		if err := wire.DecodeAggregate(mixed[i], &b); err != nil {
			t.Fatal(err)
		}
		if a.Metric > b.Metric || a.Metric == b.Metric && a.Device > b.Device {
			t.Fatalf("%s/%s sorted before %s/%s", a.Metric, a.Device, b.Metric, b.Device)
		}
	}
}

// FuzzSortAggregates: arbitrary rows never make the sort panic, and its
// result does not depend on the input order.
func FuzzSortAggregates(f *testing.F) {
	for _, raw := range encodeRows(f, synthetic.New("gw-1", 2, 1).Take(3)) {
		f.Add(raw, raw[:len(raw)/2])
	}
	f.Add([]byte{0xbf, 0x61, 0x78, 0xff}, []byte{0xa1, 0x66, 'm', 'e', 't', 'r', 'i', 'c', 0x9b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, a, b []byte) {
		one := [][]byte{a, b, a}
		two := [][]byte{b, a, a}
		wire.SortAggregates(one)
		wire.SortAggregates(two)
		if !slices.EqualFunc(one, two, bytes.Equal) {
			t.Fatalf("order depends on input order: %x vs %x", one, two)
		}
	})
}

func BenchmarkSortAggregates(b *testing.B) {
	rows := encodeRows(b, synthetic.New("gw-1", 1000, 1).Take(500))
	work := make([][]byte, len(rows))
	for b.Loop() {
		copy(work, rows)
		wire.SortAggregates(work)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(rows)), "ns/agg")
}
