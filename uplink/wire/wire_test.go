package wire_test

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"testing"

	"github.com/edgeagent/edgeagent/uplink/internal/synthetic"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

func sampleBatch(t testing.TB, n int) *wire.Batch {
	t.Helper()
	b := &wire.Batch{V: wire.Version, Gateway: "gw-1", Batch: "gw-1-1-9-00aa", Aggregates: synthetic.New("gw-1", 3, 7).Take(n)}
	// Exercise the optional parts too: an aggregate without the optional
	// figures, processing-time windows, and alerts.
	b.Aggregates[0].Sum, b.Aggregates[0].Mean = nil, nil
	b.Aggregates[1].ProcTime = true
	b.Alerts = []wire.Alert{
		{Rule: "hot", Device: "dev-0001", Metric: "temperature", Start: 1767225600000, State: "fired", Severity: "critical", Value: 41.25, Key: "gw-1/hot/dev-0001/1767225600000/fired"},
		{Rule: "hot", Device: "dev-0001", Metric: "temperature", Start: 1767225660000, State: "cleared", Value: 20.5, Key: "gw-1/hot/dev-0001/1767225660000/cleared", Suppressed: 3},
	}
	return b
}

func TestBatchRoundTrip(t *testing.T) {
	for _, enc := range []string{wire.EncodingZstd, wire.EncodingNone} {
		t.Run("encoding="+enc, func(t *testing.T) {
			for _, n := range []int{0, 1, 12, 500} {
				in := sampleBatch(t, max(n, 2))
				in.Aggregates = in.Aggregates[:n]
				body, err := wire.EncodeBatch(in, enc)
				if err != nil {
					t.Fatal(err)
				}
				out, err := wire.DecodeBatch(body, enc)
				if err != nil {
					t.Fatalf("n=%d: %v", n, err)
				}
				if n == 0 {
					// Nil and empty are the same list on the wire.
					in.Aggregates = []wire.Aggregate{}
				}
				if !reflect.DeepEqual(in, out) {
					t.Fatalf("n=%d: round trip changed the batch:\n in %+v\nout %+v", n, in, out)
				}
				sniffed, err := wire.DecodeBody(body)
				if err != nil {
					t.Fatalf("DecodeBody: %v", err)
				}
				if !reflect.DeepEqual(out, sniffed) {
					t.Fatalf("DecodeBody and DecodeBatch disagree")
				}
				if got := wire.IsZstd(body); got != (enc == wire.EncodingZstd) {
					t.Fatalf("IsZstd = %v for encoding %q", got, enc)
				}
			}
		})
	}
}

// The sealer splices outbox rows instead of re-encoding them; the result must
// be the very bytes EncodeBatch makes, or a resend after an upgrade that
// switched paths would differ.
func TestEncodeBatchRawMatchesEncodeBatch(t *testing.T) {
	for _, withAlerts := range []bool{false, true} {
		b := sampleBatch(t, 40)
		if !withAlerts {
			b.Alerts = nil
		}
		var aggs, alerts [][]byte
		items := 0
		for i := range b.Aggregates {
			raw, err := wire.EncodeAggregate(&b.Aggregates[i])
			if err != nil {
				t.Fatal(err)
			}
			aggs = append(aggs, raw)
			items += len(raw)
		}
		for i := range b.Alerts {
			raw, err := wire.EncodeAlert(&b.Alerts[i])
			if err != nil {
				t.Fatal(err)
			}
			alerts = append(alerts, raw)
			items += len(raw)
		}
		for _, enc := range []string{wire.EncodingNone, wire.EncodingZstd} {
			want, err := wire.EncodeBatch(b, enc)
			if err != nil {
				t.Fatal(err)
			}
			got, err := wire.EncodeBatchRaw(b.Gateway, b.Batch, aggs, alerts, enc)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("alerts=%v encoding=%q: EncodeBatchRaw differs from EncodeBatch", withAlerts, enc)
			}
		}
		raw := wire.AppendBatchRaw(nil, b.Gateway, b.Batch, aggs, alerts)
		if size := wire.BatchRawSize(b.Gateway, b.Batch, len(aggs), len(alerts), items); size != len(raw) {
			t.Fatalf("BatchRawSize = %d, body is %d bytes", size, len(raw))
		}
	}
}

func TestEncodeDeterministic(t *testing.T) {
	b := sampleBatch(t, 500)
	first, err := wire.EncodeBatch(b, wire.EncodingZstd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		again, err := wire.EncodeBatch(sampleBatch(t, 500), wire.EncodingZstd)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(first, again) {
			t.Fatalf("encoding %d differs from the first", i)
		}
	}
}

func TestFloatsRoundTrip(t *testing.T) {
	// Every float travels as a double and decodes exactly.
	for _, v := range []float64{21.5, 21.37, -0.0, math.Inf(1), 1e300, 65504, 3.4e38} {
		a := wire.Aggregate{Device: "d", Metric: "m", Count: 1, Sum: wire.F(v), Rev: 1, Key: "k"}
		raw, err := wire.EncodeAggregate(&a)
		if err != nil {
			t.Fatal(err)
		}
		var out wire.Aggregate
		if err := wire.DecodeAggregate(raw, &out); err != nil {
			t.Fatal(err)
		}
		if math.Float64bits(*out.Sum) != math.Float64bits(v) {
			t.Fatalf("%v came back as %v", v, *out.Sum)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	good, err := wire.EncodeBatch(sampleBatch(t, 3), wire.EncodingNone)
	if err != nil {
		t.Fatal(err)
	}
	future := sampleBatch(t, 3)
	future.V = wire.Version + 1
	futureBody, err := wire.EncodeBatch(future, wire.EncodingNone)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		body []byte
	}{
		{"empty", nil},
		{"json", []byte(`{"v":1}`)},
		{"truncated cbor", good[:len(good)/2]},
		{"zstd magic then junk", append(wire.ZstdMagic[:], 1, 2, 3, 4)},
		{"cbor array, not map", []byte{0x80}},
		{"future version", futureBody},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := wire.DecodeBody(c.body); !errors.Is(err, wire.ErrDecode) {
				t.Fatalf("DecodeBody = %v, want ErrDecode", err)
			}
		})
	}
	if _, err := wire.DecodeBatch(good, "gzip"); !errors.Is(err, wire.ErrDecode) {
		t.Fatalf("unknown encoding: %v", err)
	}
}

func TestWellFormedItem(t *testing.T) {
	raw, err := wire.EncodeAggregate(&wire.Aggregate{Device: "d", Metric: "m", Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if err := wire.WellFormedItem(raw); err != nil {
		t.Fatalf("valid item: %v", err)
	}
	for _, bad := range [][]byte{nil, raw[:len(raw)-1], append(append([]byte{}, raw...), raw...)} {
		if err := wire.WellFormedItem(bad); !errors.Is(err, wire.ErrDecode) {
			t.Fatalf("WellFormedItem(%x) = %v, want ErrDecode", bad, err)
		}
	}
}

func TestAggregateKeyFormat(t *testing.T) {
	for _, c := range []struct {
		gw, dev, metric string
		start           int64
		rev             uint32
		want            string
	}{
		{"gw-0001", "dev-0042", "temperature", 1767225600000, 1, "gw-0001/temperature/1767225600000/dev-0042/1"},
		{"g", "d", "m", -60000, 4294967295, "g/m/-60000/d/4294967295"},
		{"", "", "", 0, 0, "//0//0"},
	} {
		if got := wire.AggregateKey(c.gw, c.dev, c.metric, c.start, c.rev); got != c.want {
			t.Errorf("AggregateKey(%q, %q, %q, %d, %d) = %q, want %q", c.gw, c.dev, c.metric, c.start, c.rev, got, c.want)
		}
		if got := wire.AppendAggregateKey([]byte("x"), c.gw, c.dev, c.metric, c.start, c.rev); string(got) != "x"+c.want {
			t.Errorf("AppendAggregateKey(\"x\", %q, %q, %q, %d, %d) = %q, want %q", c.gw, c.dev, c.metric, c.start, c.rev, got, "x"+c.want)
		}
	}
}
