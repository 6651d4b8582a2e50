package buffer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"unsafe"
)

// Kind says what a Bronze record holds.
type Kind uint8

const (
	// KindMessage is an MQTT message as it arrived: topic and raw payload.
	KindMessage Kind = 1
	// KindTick is a clock tick the ingest stage logs when nothing else
	// arrived, so later stages have a logged clock (DESIGN invariant 3).
	KindTick Kind = 2
	// KindRejected is a message ingest refused (oversized, bad topic). It is
	// kept, with its reason and a bounded prefix of the payload, so the window
	// stage dead-letters it in its own table and nothing accepted is lost.
	KindRejected Kind = 3
)

func (k Kind) String() string {
	switch k {
	case KindMessage:
		return "message"
	case KindTick:
		return "tick"
	case KindRejected:
		return "rejected"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Record is one entry of the Bronze log.
type Record struct {
	// Seq is the sequence Bronze assigned at append; 0 before that.
	Seq  uint64
	Kind Kind
	// ReceivedAt is the gateway clock when ingest received the message, in
	// Unix nanoseconds. For a tick it is the tick's time.
	ReceivedAt int64
	Topic      string
	QoS        byte
	Retained   bool
	Duplicate  bool
	// Reason is set on KindRejected records only.
	Reason  string
	Payload []byte
}

// HeldBytes is what a record holds in memory besides its fixed fields:
// its topic and payload. Ingest's byte budget and ReadInto's byte bound
// count it.
func (r *Record) HeldBytes() int { return len(r.Topic) + len(r.Payload) }

const recordFormat = 1

const (
	flagRetained  = 1 << 2
	flagDuplicate = 1 << 3
)

// ErrCorruptRecord is returned when a stored record cannot be decoded.
var ErrCorruptRecord = errors.New("buffer: corrupt record")

// EncodedSize is the number of bytes AppendEncode will append for r. It is
// exact: Append sizes its arena, which the in-memory tail keeps, and checks
// MaxBytes with it.
func (r *Record) EncodedSize() int {
	return 2 + uvarintLen(uint64(r.ReceivedAt)) + uvarintLen(uint64(len(r.Topic))) + len(r.Topic) +
		uvarintLen(uint64(len(r.Reason))) + len(r.Reason) + len(r.Payload)
}

// uvarintLen is the length of binary.AppendUvarint's encoding of x.
func uvarintLen(x uint64) int { return (bits.Len64(x|1) + 6) / 7 }

// AppendEncode appends the stored form of r (without its sequence, which is
// the key) to dst.
//
// Layout: format<<4|kind, flags (qos in the low two bits), uvarint
// received-at, uvarint len + topic, uvarint len + reason, payload to the end.
func (r *Record) AppendEncode(dst []byte) []byte {
	flags := r.QoS & 3
	if r.Retained {
		flags |= flagRetained
	}
	if r.Duplicate {
		flags |= flagDuplicate
	}
	dst = append(dst, recordFormat<<4|byte(r.Kind)&0x0f, flags)
	dst = binary.AppendUvarint(dst, uint64(r.ReceivedAt))
	dst = binary.AppendUvarint(dst, uint64(len(r.Topic)))
	dst = append(dst, r.Topic...)
	dst = binary.AppendUvarint(dst, uint64(len(r.Reason)))
	dst = append(dst, r.Reason...)
	return append(dst, r.Payload...)
}

// DecodeRecord decodes a stored record. The returned record's Payload
// aliases b; callers that keep it past a bbolt transaction must copy b first.
func DecodeRecord(seq uint64, b []byte) (Record, error) {
	return decodeRecord(seq, b, false)
}

// decodeRecord decodes like DecodeRecord; with frozen, Topic and Reason
// alias b instead of copying it (one allocation a record less). Only for
// memory that is never written again while any record may refer to it —
// Bronze's committed tail arenas and the chunk copies Read makes — and for
// bbolt's map, which is unmapped on remap and close, only when the record is
// dropped before its transaction ends.
func decodeRecord(seq uint64, b []byte, frozen bool) (Record, error) {
	str := func(s []byte) string {
		if frozen {
			return unsafe.String(unsafe.SliceData(s), len(s))
		}
		return string(s)
	}
	r := Record{Seq: seq}
	if len(b) < 2 {
		return r, fmt.Errorf("%w: seq %d: %d bytes", ErrCorruptRecord, seq, len(b))
	}
	if b[0]>>4 != recordFormat {
		return r, fmt.Errorf("%w: seq %d: format %d", ErrCorruptRecord, seq, b[0]>>4)
	}
	r.Kind = Kind(b[0] & 0x0f)
	r.QoS = b[1] & 3
	r.Retained = b[1]&flagRetained != 0
	r.Duplicate = b[1]&flagDuplicate != 0
	rest := b[2:]
	at, n := binary.Uvarint(rest)
	if n <= 0 {
		return r, fmt.Errorf("%w: seq %d: received-at", ErrCorruptRecord, seq)
	}
	r.ReceivedAt = int64(at)
	rest = rest[n:]
	var s []byte
	var err error
	if s, rest, err = readString(rest); err != nil {
		return r, fmt.Errorf("%w: seq %d: topic: %v", ErrCorruptRecord, seq, err)
	}
	r.Topic = str(s)
	if s, rest, err = readString(rest); err != nil {
		return r, fmt.Errorf("%w: seq %d: reason: %v", ErrCorruptRecord, seq, err)
	}
	r.Reason = str(s)
	r.Payload = rest
	return r, nil
}

func readString(b []byte) (s, rest []byte, err error) {
	l, n := binary.Uvarint(b)
	if n <= 0 {
		return nil, nil, errors.New("bad length")
	}
	if uint64(len(b)-n) < l {
		return nil, nil, errors.New("truncated")
	}
	return b[n : n+int(l)], b[n+int(l):], nil
}
