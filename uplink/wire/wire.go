// Package wire defines the uplink wire format (version 1) — the sealed batch of
// aggregates edgeagent sends to the cloud — and encodes and decodes it, so a Go
// backend can read batches without reimplementing docs/wire-format.md.
//
// A batch is a CBOR map with text keys, optionally zstd-compressed as a whole
// (the transport says so: NATS header Content-Encoding: zstd). Receivers upsert
// aggregates on (gateway, device, metric, start) and keep the highest rev.
package wire

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/fxamacker/cbor/v2"

	"github.com/edgeagent/edgeagent/uplink/wire/internal/zstd"
)

// Version is the format version carried in every batch's "v" key.
const Version = 1

// Encoding names used in the Content-Encoding header.
const (
	EncodingZstd = "zstd"
	EncodingNone = ""
)

// ContentType is the value of the Content-Type header.
const ContentType = "application/cbor"

// Batch is one sealed uplink message.
type Batch struct {
	V          int         `cbor:"v"`
	Gateway    string      `cbor:"gateway"`
	Batch      string      `cbor:"batch"`
	Aggregates []Aggregate `cbor:"aggregates"`
	// Alerts carries alert transitions (fired / cleared) when alert rules
	// with the uplink action are configured. Absent otherwise.
	Alerts []Alert `cbor:"alerts,omitempty"`
}

// Aggregate is one event-time window of one metric of one device.
//
// The optional aggregates are pointers: a key is absent from the map when the
// gateway's window.aggregates does not configure it.
//
// The field order is the order of the keys in the encoded map, chosen for
// compression (measured in BenchmarkWireSize over every order of the
// non-float keys): what is constant within a batch's run of one metric
// first, then the key string, whose varying part (the device) ends it, right
// before the device it repeats, then the float figures.
type Aggregate struct {
	Metric string `cbor:"metric"`
	// Start and End are the window bounds in Unix milliseconds, [start, end).
	Start int64  `cbor:"start"`
	End   int64  `cbor:"end"`
	Count uint64 `cbor:"count"`
	// ProcTime is true when at least one reading had no event time and was
	// windowed by its received-at (processing time) instead.
	ProcTime bool `cbor:"ptime,omitempty"`
	// Key is the idempotency key: gateway/metric/start/device/rev.
	Key    string `cbor:"key"`
	Device string `cbor:"device"`
	// Rev is the revision: 1 for the first emission of a window, higher for
	// each update by late data or a replay.
	Rev   uint32   `cbor:"rev"`
	Min   *float64 `cbor:"min,omitempty"`
	First *float64 `cbor:"first,omitempty"`
	Last  *float64 `cbor:"last,omitempty"`
	Max   *float64 `cbor:"max,omitempty"`
	Mean  *float64 `cbor:"mean,omitempty"`
	Sum   *float64 `cbor:"sum,omitempty"`
}

// Alert is one alert transition.
type Alert struct {
	Rule     string  `cbor:"rule"`
	Device   string  `cbor:"device"`
	Metric   string  `cbor:"metric"`
	Start    int64   `cbor:"start"`
	State    string  `cbor:"state"` // "fired" or "cleared"
	Severity string  `cbor:"severity,omitempty"`
	Value    float64 `cbor:"value"`
	Key      string  `cbor:"key"`
	// Suppressed counts transitions the rate limit folded into this one.
	Suppressed uint32 `cbor:"suppressed,omitempty"`
}

// AggregateKey builds the deterministic idempotency key of an aggregate:
// <gateway>/<metric>/<start>/<device>/<rev>. The device comes late, next to
// the device key that follows it in the map, so that in a batch sorted by
// metric the key differs from its neighbour's only where the rows differ
// anyway (measured with the key order of Aggregate: 23.7 bytes an aggregate
// on the wire, against 25.0 with gateway/device/metric/start/rev first in
// the row).
func AggregateKey(gateway, device, metric string, start int64, rev uint32) string {
	// One allocation: the string's.
	return string(AppendAggregateKey(make([]byte, 0, len(gateway)+len(metric)+len(device)+36), gateway, device, metric, start, rev))
}

// AppendAggregateKey appends AggregateKey's key to dst: a writer that only
// encodes the aggregate builds its key in a buffer it reuses.
func AppendAggregateKey(dst []byte, gateway, device, metric string, start int64, rev uint32) []byte {
	dst = append(append(append(dst, gateway...), '/'), metric...)
	dst = strconv.AppendInt(append(dst, '/'), start, 10)
	dst = append(append(append(dst, '/'), device...), '/')
	return strconv.AppendUint(dst, uint64(rev), 10)
}

// F returns a pointer to v, for filling the optional aggregates.
func F(v float64) *float64 { return &v }

// ErrDecode wraps every decoding failure.
var ErrDecode = errors.New("wire: decode")

var (
	encMode = func() cbor.EncMode {
		// Floats always as 9-byte doubles, not in their shortest form
		// (21.5 would fit a 3-byte half float): every row of a metric then
		// has one layout, which zstd matches better than it loses on the
		// few short floats — measured on the rig's steady data 1.7 % fewer
		// bytes with zstd, 0.7 % more without (BenchmarkWireSize).
		// Keys keep the struct order (SortNone) so the byte form is fixed by
		// this file; nil slices encode as empty arrays, never null, so
		// EncodeBatch and EncodeBatchRaw agree and receivers always see a list.
		m, err := cbor.EncOptions{
			ShortestFloat: cbor.ShortestFloatNone,
			Sort:          cbor.SortNone,
			NilContainers: cbor.NilContainerAsEmpty,
		}.EncMode()
		if err != nil {
			panic(err)
		}
		return m
	}()
	decMode = func() cbor.DecMode {
		m, err := cbor.DecOptions{MaxArrayElements: 1 << 20, MaxMapPairs: 1 << 20}.DecMode()
		if err != nil {
			panic(err)
		}
		return m
	}()
)

// MarshalCBOR-free helpers: these are the only encoders the agent uses, so the
// byte form of a value is fixed by this package.

// EncodeAggregate encodes one aggregate as a CBOR map. The error is always
// nil; it stays for callers written against the reflection encoder.
func EncodeAggregate(a *Aggregate) ([]byte, error) {
	return AppendAggregate(make([]byte, 0, aggregateSize(a)), a), nil
}

// DecodeAggregate decodes one CBOR-encoded aggregate.
func DecodeAggregate(b []byte, a *Aggregate) error {
	if err := decMode.Unmarshal(b, a); err != nil {
		return fmt.Errorf("%w: aggregate: %v", ErrDecode, err)
	}
	return nil
}

// EncodeAlert encodes one alert transition as a CBOR map. The error is
// always nil, as EncodeAggregate's.
func EncodeAlert(a *Alert) ([]byte, error) { return AppendAlert(nil, a), nil }

// DecodeAlert decodes one CBOR-encoded alert transition.
func DecodeAlert(b []byte, a *Alert) error {
	if err := decMode.Unmarshal(b, a); err != nil {
		return fmt.Errorf("%w: alert: %v", ErrDecode, err)
	}
	return nil
}

// EncodeBatch encodes b and compresses it with encoding (EncodingZstd or
// EncodingNone). The output is deterministic for equal input.
func EncodeBatch(b *Batch, encoding string) ([]byte, error) {
	raw, err := encMode.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("wire: encode batch: %w", err)
	}
	return Compress(raw, encoding)
}

// Compress compresses an encoded batch body.
func Compress(raw []byte, encoding string) ([]byte, error) {
	switch encoding {
	case EncodingNone:
		return raw, nil
	case EncodingZstd:
		return appendZstd(nil, raw), nil
	}
	return nil, fmt.Errorf("wire: unknown encoding %q", encoding)
}

// appendZstd appends raw, compressed, to dst, growing dst once to a size
// that holds most batches' output (aggregates compress 8 to 1 and better).
func appendZstd(dst, raw []byte) []byte {
	return zstdEncoder().EncodeAll(raw, slices.Grow(dst, len(raw)/4+64))
}

// DecodeBatch decompresses (per encoding, the Content-Encoding header) and
// decodes a batch body.
func DecodeBatch(body []byte, encoding string) (*Batch, error) {
	raw := body
	switch encoding {
	case EncodingNone:
	case EncodingZstd:
		var err error
		raw, err = zstdDecoder().DecodeAll(body, nil)
		if err != nil {
			return nil, fmt.Errorf("%w: zstd: %v", ErrDecode, err)
		}
	default:
		return nil, fmt.Errorf("%w: unknown content encoding %q", ErrDecode, encoding)
	}
	var b Batch
	if err := decMode.Unmarshal(raw, &b); err != nil {
		return nil, fmt.Errorf("%w: batch: %v", ErrDecode, err)
	}
	if b.V != Version {
		return nil, fmt.Errorf("%w: unsupported format version %d (this decoder reads %d)", ErrDecode, b.V, Version)
	}
	return &b, nil
}

var (
	encOnce sync.Once
	enc     *zstd.Encoder
	decOnce sync.Once
	dec     *zstd.Decoder
)

func zstdEncoder() *zstd.Encoder {
	encOnce.Do(func() {
		var err error
		// One goroutine and a small window: gateways are small and batches
		// are at most max_batch_bytes (256 KiB by default; larger batches
		// only lose matches further back than the window, and their similar
		// rows sit side by side anyway). SpeedBetterCompression, not the
		// best level. Measured on 500-aggregate batches of the rig's steady
		// data: the best level holds 34.6 MiB of match tables, whatever the
		// window, to save 2 to 3 % of the bytes — more than the agent's
		// whole memory budget on a small gateway. This one holds 1.15 MiB:
		// the fork's long-match table is 512 KiB, upstream's 4 MiB (see
		// internal/zstd).
		enc, err = zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1),
			zstd.WithEncoderLevel(zstd.SpeedBetterCompression), zstd.WithWindowSize(256<<10),
			zstd.WithLowerEncoderMem(true))
		if err != nil {
			panic(err)
		}
	})
	return enc
}

func zstdDecoder() *zstd.Decoder {
	decOnce.Do(func() {
		var err error
		dec, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(64<<20))
		if err != nil {
			panic(err)
		}
	})
	return dec
}
