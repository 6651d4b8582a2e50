package window

import (
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// DeadLetter is a Bronze record that could not become a reading.
type DeadLetter struct {
	Seq    uint64
	Topic  string
	Device string // "" when the topic named none
	// ReceivedAt is the Bronze received-at, Unix nanoseconds.
	ReceivedAt int64
	// Reason is the human message ("field ts missing"); Code is one of the
	// Code* constants and names the counter.
	Reason, Code string
	// Payload is the first 256 bytes of the payload.
	Payload []byte
}

// Late is one reading refused by one window because the window was already
// final: its end plus allowed_lateness was not after the device's watermark.
// A reading in several (hopping) windows may give several rows.
type Late struct {
	Seq            uint64
	Device, Metric string
	// EventTime, WindowStart and Watermark are Unix milliseconds.
	EventTime   int64
	WindowStart int64
	Value       float64
	// Watermark is the device watermark the lateness was judged against.
	Watermark int64
}

// Filter selects table rows. Zero fields match everything. From and To
// bound ReceivedAt for dead letters and EventTime for late rows, [From, To).
// Reason matches a dead letter's Code; it is ignored for late rows.
type Filter struct {
	Device   string
	From, To time.Time
	Reason   string
}

func (f *Filter) inRange(ms int64) bool {
	if !f.From.IsZero() && ms < f.From.UnixMilli() {
		return false
	}
	if !f.To.IsZero() && ms >= f.To.UnixMilli() {
		return false
	}
	return true
}

// ReadDeadLetters returns up to max dead-letter rows matching f, newest first.
func ReadDeadLetters(tx *bolt.Tx, f Filter, max int) ([]DeadLetter, error) {
	b := tx.Bucket(bucketDead)
	if b == nil {
		return nil, nil
	}
	var out []DeadLetter
	c := b.Cursor()
	for k, v := c.Last(); k != nil && len(out) < max; k, v = c.Prev() {
		dl, err := decodeDead(v)
		if err != nil {
			return out, fmt.Errorf("dead-letter row %x: %w", k, err)
		}
		if f.Device != "" && dl.Device != f.Device || f.Reason != "" && dl.Code != f.Reason || !f.inRange(floorDiv(dl.ReceivedAt, 1e6)) {
			continue
		}
		out = append(out, dl)
	}
	return out, nil
}

// ReadLate returns up to max late rows matching f, newest first.
func ReadLate(tx *bolt.Tx, f Filter, max int) ([]Late, error) {
	b := tx.Bucket(bucketLate)
	if b == nil {
		return nil, nil
	}
	var out []Late
	c := b.Cursor()
	for k, v := c.Last(); k != nil && len(out) < max; k, v = c.Prev() {
		l, err := decodeLate(v)
		if err != nil {
			return out, fmt.Errorf("late row %x: %w", k, err)
		}
		if f.Device != "" && l.Device != f.Device || !f.inRange(l.EventTime) {
			continue
		}
		out = append(out, l)
	}
	return out, nil
}

func appendLate(b []byte, l *Late) []byte {
	b = binary.AppendUvarint(b, l.Seq)
	b = appendString(b, l.Device)
	b = appendString(b, l.Metric)
	b = binary.AppendVarint(b, l.EventTime)
	b = binary.AppendVarint(b, l.WindowStart)
	b = appendFloat(b, l.Value)
	return binary.AppendVarint(b, l.Watermark)
}

func decodeLate(v []byte) (Late, error) {
	d := decoder{b: v}
	l := Late{Seq: d.uvarint(), Device: d.string(), Metric: d.string(), EventTime: d.varint(),
		WindowStart: d.varint(), Value: d.float(), Watermark: d.varint()}
	if d.err != nil {
		return l, fmt.Errorf("%w: %v", ErrCorruptState, d.err)
	}
	return l, nil
}

func appendDead(b []byte, r *DeadLetter) []byte {
	b = binary.AppendUvarint(b, r.Seq)
	b = appendString(b, r.Topic)
	b = appendString(b, r.Device)
	b = binary.AppendVarint(b, r.ReceivedAt)
	b = appendString(b, r.Reason)
	b = appendString(b, r.Code)
	return appendBytes(b, r.Payload)
}

func decodeDead(v []byte) (DeadLetter, error) {
	d := decoder{b: v}
	r := DeadLetter{Seq: d.uvarint(), Topic: d.string(), Device: d.string(), ReceivedAt: d.varint(),
		Reason: d.string(), Code: d.string()}
	r.Payload = append([]byte(nil), d.bytes()...)
	if d.err != nil {
		return r, fmt.Errorf("%w: %v", ErrCorruptState, d.err)
	}
	return r, nil
}

// fmtMs formats Unix milliseconds for messages.
func fmtMs(ms int64) string {
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z07:00")
}
