package wire_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

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
	PTime  bool     `json:"ptime,omitempty"`
}

// wirePerBatch is the batch size the targets are stated for (the default
// max_batch_records).
const wirePerBatch = 500

// BenchmarkWireSize reports the bytes on the wire per aggregate (and per
// reading that fed it) at 500 aggregates a batch, zstd and none, against the
// same batches as plain JSON, on two datasets:
//
//   - rig-steady: the rig's steady scenario scaled to 1000 devices, as the
//     rig's simulator and ground truth make it (the data the targets are
//     stated for);
//   - synthetic: uplink/internal/synthetic, 1000 devices × 4 metrics at a
//     reading a second.
//
// Batches are the emission order cut every 500 aggregates, each then put
// in its wire order (wire.SortAggregates) as the sealer does.
func BenchmarkWireSize(b *testing.B) {
	sets := []struct {
		name, gateway string
		aggs          func() []wire.Aggregate
	}{
		{"rig-steady", rigGateway, func() []wire.Aggregate { return steadyAggregates(b, 1000, 33*time.Minute) }},
		{"synthetic", "gw-0001", func() []wire.Aggregate { return synthetic.New("gw-0001", 1000, 1).Take(64 * wirePerBatch) }},
	}
	for _, set := range sets {
		aggs := set.aggs()
		aggs = aggs[:len(aggs)/wirePerBatch*wirePerBatch]
		benchWireSize(b, set.name, set.gateway, aggs)
	}
}

func benchWireSize(b *testing.B, name, gateway string, aggs []wire.Aggregate) {
	type batch struct {
		rows [][]byte
		id   string
	}
	var batches []batch
	var jsonBytes, rowBytes int
	var readings uint64
	for i := 0; i < len(aggs); i += wirePerBatch {
		part := slices.Clone(aggs[i : i+wirePerBatch])
		bt := batch{id: fmt.Sprintf("%s-%d-%d-0123456789abcdef", gateway, i+1, i+wirePerBatch)}
		jb := jsonBatch{V: wire.Version, Gateway: gateway, Batch: bt.id}
		for k := range part {
			a := &part[k]
			raw, err := wire.EncodeAggregate(a)
			if err != nil {
				b.Fatal(err)
			}
			bt.rows = append(bt.rows, raw)
			rowBytes += len(raw)
			readings += a.Count
			jb.Aggregates = append(jb.Aggregates, jsonAggregate{a.Device, a.Metric, a.Start, a.End, a.Count,
				a.Sum, a.Min, a.Max, a.Mean, a.First, a.Last, a.Rev, a.Key, a.ProcTime})
		}
		// The batch's order, as the sealer makes it (uplink/seal.go).
		wire.SortAggregates(bt.rows)
		j, err := json.Marshal(jb)
		if err != nil {
			b.Fatal(err)
		}
		jsonBytes += len(j)
		batches = append(batches, bt)
	}
	n := float64(len(aggs))
	jsonPerAgg := float64(jsonBytes) / n
	for _, enc := range []string{wire.EncodingZstd, wire.EncodingNone} {
		encName := enc
		if encName == "" {
			encName = "none"
		}
		b.Run(name+"/"+encName, func(b *testing.B) {
			var wireBytes int
			for b.Loop() {
				wireBytes = 0
				for _, bt := range batches {
					body, err := wire.EncodeBatchRaw(gateway, bt.id, bt.rows, nil, enc)
					if err != nil {
						b.Fatal(err)
					}
					wireBytes += len(body)
				}
			}
			per := float64(wireBytes) / n
			b.ReportMetric(per, "wire-B/agg")
			b.ReportMetric(float64(wireBytes)/float64(readings), "wire-B/reading")
			b.ReportMetric(jsonPerAgg, "json-B/agg")
			b.ReportMetric(100*per/jsonPerAgg, "ratio-%")
			b.ReportMetric(float64(rowBytes)/n, "row-B/agg")
			b.ReportMetric(n*float64(b.N)/b.Elapsed().Seconds(), "aggs/s")
		})
	}
}
