package wire_test

import (
	"fmt"
	"testing"

	"github.com/edgeagent/edgeagent/uplink/internal/synthetic"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// BenchmarkEncodeAggregate measures encoding one aggregate, as the window
// stage does for every aggregate it emits.
func BenchmarkEncodeAggregate(b *testing.B) {
	aggs := synthetic.New("gw-0001", 1000, 1).Take(4000)
	i := 0
	for b.Loop() {
		if _, err := wire.EncodeAggregate(&aggs[i%len(aggs)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkEncodeBatchRaw measures sealing 500 encoded aggregates into a
// batch body: sorting, framing and compressing, as uplink/seal.go does.
func BenchmarkEncodeBatchRaw(b *testing.B) {
	rows := encodeRows(b, synthetic.New("gw-0001", 1000, 1).Take(wirePerBatch))
	work := make([][]byte, len(rows))
	for _, enc := range []string{wire.EncodingZstd, wire.EncodingNone} {
		name := enc
		if name == "" {
			name = "none"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				copy(work, rows)
				wire.SortAggregates(work)
				if _, err := wire.EncodeBatchRaw("gw-0001", fmt.Sprintf("gw-0001-%d-%d-0123456789abcdef", 1, 500), work, nil, enc); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(rows)), "ns/agg")
		})
	}
}
