package wire

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"

	"github.com/fxamacker/cbor/v2"
)

// ZstdMagic opens every zstd frame (RFC 8878). A body that starts with it is
// compressed; a plain body starts with a CBOR map head (0xa0-0xbf), so
// receivers on transports without headers (MQTT 3.1.1) tell them apart.
var ZstdMagic = [4]byte{0x28, 0xb5, 0x2f, 0xfd}

// EncodeBatchRaw builds the same body as EncodeBatch from aggregates and
// alerts that are already encoded, one CBOR item each, as EncodeAggregate and
// EncodeAlert return them (the form they wait in the outbox). It copies the
// items instead of decoding and re-encoding them, which is what makes sealing
// cheap; for items made by this package the output equals EncodeBatch's
// byte for byte.
func EncodeBatchRaw(gateway, batch string, aggregates, alerts [][]byte, encoding string) ([]byte, error) {
	return AppendBatchBody(nil, gateway, batch, aggregates, alerts, encoding)
}

// AppendBatchBody appends the body EncodeBatchRaw returns to dst, so a
// caller can put a header of its own in front of the body without copying
// it again.
func AppendBatchBody(dst []byte, gateway, batch string, aggregates, alerts [][]byte, encoding string) ([]byte, error) {
	switch encoding {
	case EncodingNone:
		return AppendBatchRaw(dst, gateway, batch, aggregates, alerts), nil
	case EncodingZstd:
		// The uncompressed body is scratch here: it lives in a pooled
		// buffer, not in a fresh one of up to max_batch_bytes per batch.
		sp := rawPool.Get().(*[]byte)
		raw := AppendBatchRaw((*sp)[:0], gateway, batch, aggregates, alerts)
		dst = appendZstd(dst, raw)
		if cap(raw) <= maxPooledRaw {
			*sp = raw
			rawPool.Put(sp)
		}
		return dst, nil
	}
	return nil, fmt.Errorf("wire: unknown encoding %q", encoding)
}

// maxPooledRaw bounds the scratch buffers rawPool keeps (the default
// max_batch_bytes is 256 KiB), so one huge batch does not stay in memory.
const maxPooledRaw = 4 << 20

var rawPool = sync.Pool{New: func() any { return new([]byte) }}

// AppendBatchRaw appends the uncompressed CBOR body that EncodeBatchRaw
// compresses to dst, growing dst once to the body's size.
func AppendBatchRaw(dst []byte, gateway, batch string, aggregates, alerts [][]byte) []byte {
	items := 0
	for _, a := range aggregates {
		items += len(a)
	}
	for _, a := range alerts {
		items += len(a)
	}
	dst = slices.Grow(dst, BatchRawSize(gateway, batch, len(aggregates), len(alerts), items))
	pairs := uint64(4)
	if len(alerts) > 0 {
		pairs = 5
	}
	dst = appendHead(dst, majorMap, pairs)
	dst = appendText(dst, "v")
	dst = appendHead(dst, majorUint, Version)
	dst = appendText(dst, "gateway")
	dst = appendText(dst, gateway)
	dst = appendText(dst, "batch")
	dst = appendText(dst, batch)
	dst = appendText(dst, "aggregates")
	dst = appendHead(dst, majorArray, uint64(len(aggregates)))
	for _, a := range aggregates {
		dst = append(dst, a...)
	}
	if len(alerts) > 0 {
		dst = appendText(dst, "alerts")
		dst = appendHead(dst, majorArray, uint64(len(alerts)))
		for _, a := range alerts {
			dst = append(dst, a...)
		}
	}
	return dst
}

// BatchRawSize is len(AppendBatchRaw(nil, ...)) for a batch whose items add
// up to itemBytes, computed without building it, so a sealer can stop
// adding items before a byte bound is crossed.
func BatchRawSize(gateway, batch string, aggregates, alerts, itemBytes int) int {
	n := headSize(4) + textSize("v") + headSize(Version) + textSize("gateway") + textSize(gateway) +
		textSize("batch") + textSize(batch) + textSize("aggregates") + headSize(uint64(aggregates)) + itemBytes
	if alerts > 0 {
		n += textSize("alerts") + headSize(uint64(alerts))
	}
	return n
}

// WellFormedItem reports whether b is exactly one well-formed CBOR data item,
// the property EncodeBatchRaw relies on for each element.
func WellFormedItem(b []byte) error {
	if err := cbor.Wellformed(b); err != nil {
		return fmt.Errorf("%w: %v", ErrDecode, err)
	}
	return nil
}

// IsZstd reports whether body starts with the zstd frame magic.
func IsZstd(body []byte) bool { return bytes.HasPrefix(body, ZstdMagic[:]) }

// DecodeBody decodes a batch body whose encoding is not known, as it arrives
// over MQTT: a body that starts with ZstdMagic is decompressed first, a body
// that starts with a CBOR map head is decoded as it is.
func DecodeBody(body []byte) (*Batch, error) {
	switch {
	case IsZstd(body):
		return DecodeBatch(body, EncodingZstd)
	case len(body) > 0 && body[0]>>5 == majorMap:
		return DecodeBatch(body, EncodingNone)
	case len(body) == 0:
		return nil, fmt.Errorf("%w: empty body", ErrDecode)
	}
	return nil, fmt.Errorf("%w: body starts with %#02x, neither a zstd frame nor a CBOR map", ErrDecode, body[0])
}

const (
	majorUint  = 0
	majorText  = 3
	majorArray = 4
	majorMap   = 5
)

// appendHead appends a CBOR head in its shortest form (RFC 8949 §3), the form
// the encoder mode above uses too.
func appendHead(b []byte, major byte, n uint64) []byte {
	m := major << 5
	switch {
	case n < 24:
		return append(b, m|byte(n))
	case n <= 0xff:
		return append(b, m|24, byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, m|25), uint16(n))
	case n <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(b, m|26), uint32(n))
	}
	return binary.BigEndian.AppendUint64(append(b, m|27), n)
}

func appendText(b []byte, s string) []byte {
	return append(appendHead(b, majorText, uint64(len(s))), s...)
}

func headSize(n uint64) int {
	switch {
	case n < 24:
		return 1
	case n <= 0xff:
		return 2
	case n <= 0xffff:
		return 3
	case n <= 0xffffffff:
		return 5
	}
	return 9
}

func textSize(s string) int { return headSize(uint64(len(s))) + len(s) }
