package wire_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/edgeagent/edgeagent/uplink/internal/synthetic"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// jsonBatch is the plain-JSON rendering of a batch with the same keys, the
// baseline the wire format is measured against.
type jsonBatch struct {
	V          int             `json:"v"`
	Gateway    string          `json:"gateway"`
	Batch      string          `json:"batch"`
	Aggregates []jsonAggregate `json:"aggregates"`
}

type jsonAggregate struct {
	Device string   `json:"device"`
	Metric string   `json:"metric"`
	Start  int64    `json:"start"`
	End    int64    `json:"end"`
	Count  uint64   `json:"count"`
	Sum    *float64 `json:"sum,omitempty"`
	Min    *float64 `json:"min,omitempty"`
	Max    *float64 `json:"max,omitempty"`
	Mean   *float64 `json:"mean,omitempty"`
	First  *float64 `json:"first,omitempty"`
	Last   *float64 `json:"last,omitempty"`
	Rev    uint32   `json:"rev"`
	Key    string   `json:"key"`
}

// BenchmarkWireSize reports the bytes on the wire per aggregate for steady
// data from 1000 devices × 4 metrics in one-minute windows, 500 aggregates a
// batch in emission order, against the same batches as plain JSON.
func BenchmarkWireSize(b *testing.B) {
	const devices, perBatch, batches = 1000, 500, 64 // 8 minutes of the fleet
	gen := synthetic.New("gw-0001", devices, 1)
	type batch struct {
		raw  [][]byte
		json []byte
		id   string
	}
	var all []batch
	jsonBytes := 0
	for i := 0; i < batches; i++ {
		aggs := gen.Take(perBatch)
		bt := batch{id: fmt.Sprintf("gw-0001-%d-%d-0123456789abcdef", i*perBatch+1, (i+1)*perBatch)}
		jb := jsonBatch{V: wire.Version, Gateway: "gw-0001", Batch: bt.id}
		for k := range aggs {
			a := &aggs[k]
			raw, err := wire.EncodeAggregate(a)
			if err != nil {
				b.Fatal(err)
			}
			bt.raw = append(bt.raw, raw)
			jb.Aggregates = append(jb.Aggregates, jsonAggregate{a.Device, a.Metric, a.Start, a.End, a.Count, a.Sum, a.Min, a.Max, a.Mean, a.First, a.Last, a.Rev, a.Key})
		}
		j, err := json.Marshal(jb)
		if err != nil {
			b.Fatal(err)
		}
		jsonBytes += len(j)
		all = append(all, bt)
	}
	aggs := float64(perBatch * batches)
	jsonPerAgg := float64(jsonBytes) / aggs
	for _, enc := range []string{wire.EncodingZstd, wire.EncodingNone} {
		name := enc
		if name == "" {
			name = "none"
		}
		b.Run(name, func(b *testing.B) {
			var wireBytes, rawBytes int
			for b.Loop() {
				wireBytes, rawBytes = 0, 0
				for _, bt := range all {
					body, err := wire.EncodeBatchRaw("gw-0001", bt.id, bt.raw, nil, enc)
					if err != nil {
						b.Fatal(err)
					}
					wireBytes += len(body)
					for _, r := range bt.raw {
						rawBytes += len(r)
					}
				}
			}
			per := float64(wireBytes) / aggs
			b.ReportMetric(per, "wire-B/agg")
			b.ReportMetric(jsonPerAgg, "json-B/agg")
			b.ReportMetric(100*per/jsonPerAgg, "ratio-%")
			b.ReportMetric(float64(rawBytes)/aggs, "row-B/agg")
			b.ReportMetric(aggs*float64(b.N)/b.Elapsed().Seconds(), "aggs/s")
		})
	}
}
