// Package outbox is the durable queue between the window stage, which appends
// emitted aggregates and alerts inside its checkpoint transaction, and the
// uplink, which seals them into batches and deletes them once acknowledged.
//
// The outbox lives in the state database. Every function takes the caller's
// bbolt transaction, so appends commit atomically with the state that
// produced them (DESIGN invariant 2).
package outbox

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/internal/boltkv"
)

// Kind says what an outbox entry carries.
type Kind uint8

const (
	// KindAggregate is a CBOR-encoded wire.Aggregate.
	KindAggregate Kind = 1
	// KindAlert is a CBOR-encoded wire.Alert for the uplink.
	KindAlert Kind = 2
	// KindLocal is a message for the gateway's local broker (an alert or a
	// republished aggregate): see LocalMessage.
	KindLocal Kind = 3
)

// Entry is one queued row.
type Entry struct {
	Seq  uint64
	Kind Kind
	// EmittedAt is the logged clock (Unix milliseconds) when the window stage
	// emitted the entry; the uplink reports the age of the oldest one.
	EmittedAt int64
	Data      []byte
}

var (
	bucketRows = []byte("outbox")
	bucketMeta = []byte("outbox_meta")
	keyBytes   = []byte("bytes")
	keyRows    = []byte("rows")
)

// ErrCorrupt is returned when a stored entry cannot be decoded.
var ErrCorrupt = errors.New("outbox: corrupt entry")

// Init creates the outbox buckets. Call it once in a write transaction at open.
func Init(tx *bolt.Tx) error {
	for _, name := range [][]byte{bucketRows, bucketMeta} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("outbox: create bucket %s: %w", name, err)
		}
	}
	return nil
}

// Append queues one entry and returns its sequence. Sequences are assigned by
// the bucket and so are deterministic for a deterministic series of appends.
func Append(tx *bolt.Tx, kind Kind, emittedAt int64, data []byte) (uint64, error) {
	a, err := NewAppender(tx, nil)
	if err != nil {
		return 0, err
	}
	seq, err := a.Append(kind, emittedAt, data)
	if err != nil {
		return 0, err
	}
	return seq, a.Close()
}

// Appender queues many entries in one transaction: the rows go in as
// Append puts them, the row and byte counters once, at Close (two Gets and
// two Puts per row were most of an append's cost). Other appends in the
// same transaction may interleave: the counters only ever add.
type Appender struct {
	tx          *bolt.Tx
	b           *bolt.Bucket
	rows, bytes int64
	arena       *boltkv.Arena
}

// NewAppender starts appending in tx. Close must be called before the
// transaction commits, or the counters miss the rows. The rows' bytes are
// cut from arena, which must outlive the transaction; nil gives the
// appender one of its own.
func NewAppender(tx *bolt.Tx, arena *boltkv.Arena) (*Appender, error) {
	b := tx.Bucket(bucketRows)
	if b == nil {
		return nil, errors.New("outbox: not initialised")
	}
	b.FillPercent = 1 // append-only: pack pages full
	if arena == nil {
		arena = new(boltkv.Arena)
	}
	return &Appender{tx: tx, b: b, arena: arena}, nil
}

// Append queues one entry and returns its sequence.
func (a *Appender) Append(kind Kind, emittedAt int64, data []byte) (uint64, error) {
	seq, err := a.b.NextSequence()
	if err != nil {
		return 0, fmt.Errorf("outbox: next sequence: %w", err)
	}
	// The key and the value from one cut of the arena.
	buf := binary.BigEndian.AppendUint64(a.arena.Room(8+1+binary.MaxVarintLen64+len(data)), seq)
	buf = append(buf, byte(kind))
	buf = binary.AppendVarint(buf, emittedAt)
	kv := a.arena.Cut(append(buf, data...))
	k, v := kv[:8:8], kv[8:]
	if err := a.b.Put(k, v); err != nil {
		return 0, fmt.Errorf("outbox: put %d: %w", seq, err)
	}
	a.rows++
	a.bytes += int64(8 + len(v))
	return seq, nil
}

// Close writes the counters for the rows appended.
func (a *Appender) Close() error {
	if a.rows == 0 {
		return nil
	}
	err := addMeta(a.tx, a.rows, a.bytes)
	a.rows, a.bytes = 0, 0
	return err
}

// Read returns up to max entries with sequence >= from, oldest first. The
// entries' Data is copied and outlives the transaction; the copies share a
// few larger buffers, each of which lives as long as any entry in it.
func Read(tx *bolt.Tx, from uint64, max int) ([]Entry, error) {
	return ReadIn(tx, from, max, nil, nil)
}

// ReadIn is Read into dst's array, copying the entries' Data into slab: a
// reader that reads round after round resets slab (and reuses dst) once
// the last round's entries are no longer used. A nil slab is a new one.
func ReadIn(tx *bolt.Tx, from uint64, max int, slab *boltkv.Arena, dst []Entry) ([]Entry, error) {
	b := tx.Bucket(bucketRows)
	if b == nil || max <= 0 {
		return dst[:0], nil
	}
	out := dst[:0]
	if out == nil {
		out = make([]Entry, 0, min(max, 128))
	}
	if slab == nil {
		slab = new(boltkv.Arena)
	}
	c := b.Cursor()
	for k, v := c.Seek(boltkv.Key(from)); k != nil && len(out) < max; k, v = c.Next() {
		e, n, err := decode(k, v)
		if err != nil {
			return out, err
		}
		data := v[n:]
		e.Data = slab.Cut(append(slab.Room(len(data)), data...))
		out = append(out, e)
	}
	return out, nil
}

// Has reports whether the entry of sequence seq is still queued.
func Has(tx *bolt.Tx, seq uint64) bool {
	b := tx.Bucket(bucketRows)
	return b != nil && b.Get(boltkv.Key(seq)) != nil
}

// Delete removes the entries with the given sequences (absent ones are skipped).
func Delete(tx *bolt.Tx, seqs ...uint64) error {
	b := tx.Bucket(bucketRows)
	if b == nil {
		return nil
	}
	var rows, size int64
	// One cursor for every row: a Get and a Delete are a search each, and
	// a new cursor each, which allocates its stack. Seek does not keep its
	// key, so one key buffer serves all.
	c := b.Cursor()
	key := make([]byte, 8)
	for _, s := range seqs {
		binary.BigEndian.PutUint64(key, s)
		k, v := c.Seek(key)
		if !bytes.Equal(k, key) {
			continue
		}
		rows--
		size -= int64(8 + len(v))
		if err := c.Delete(); err != nil {
			return fmt.Errorf("outbox: delete %d: %w", s, err)
		}
	}
	return addMeta(tx, rows, size)
}

// Stats is the outbox's size.
type Stats struct {
	Rows  uint64
	Bytes uint64
	// Oldest is the oldest entry's EmittedAt (Unix ms), 0 when empty.
	Oldest int64
}

// ReadStats returns the outbox's size and the age anchor of its oldest entry.
func ReadStats(tx *bolt.Tx) (Stats, error) {
	var s Stats
	m := tx.Bucket(bucketMeta)
	if m == nil {
		return s, nil
	}
	s.Rows = boltkv.Uint(m, keyRows)
	s.Bytes = boltkv.Uint(m, keyBytes)
	if b := tx.Bucket(bucketRows); b != nil {
		if k, v := b.Cursor().First(); k != nil {
			e, _, err := decode(k, v)
			if err != nil {
				return s, err
			}
			s.Oldest = e.EmittedAt
		}
	}
	return s, nil
}

// CountKind returns how many entries of kind k the outbox holds, by a scan
// of every row (the meta counts do not split by kind): for occasional use,
// such as the end of `run --once`.
func CountKind(tx *bolt.Tx, k Kind) (uint64, error) {
	b := tx.Bucket(bucketRows)
	if b == nil {
		return 0, nil
	}
	var n uint64
	c := b.Cursor()
	for key, v := c.First(); key != nil; key, v = c.Next() {
		if len(v) == 0 {
			return n, fmt.Errorf("%w: key %x", ErrCorrupt, key)
		}
		if Kind(v[0]) == k {
			n++
		}
	}
	return n, nil
}

// decode decodes an entry's key and header; its data is v[n:], which the
// caller copies if it must outlive the transaction.
func decode(k, v []byte) (e Entry, n int, err error) {
	if len(k) != 8 || len(v) < 2 {
		return Entry{}, 0, fmt.Errorf("%w: key %x", ErrCorrupt, k)
	}
	e = Entry{Seq: binary.BigEndian.Uint64(k), Kind: Kind(v[0])}
	at, n := binary.Varint(v[1:])
	if n <= 0 {
		return e, 0, fmt.Errorf("%w: seq %d: emitted-at", ErrCorrupt, e.Seq)
	}
	e.EmittedAt = at
	return e, 1 + n, nil
}

func addMeta(tx *bolt.Tx, rows, bytes int64) error {
	m := tx.Bucket(bucketMeta)
	if m == nil {
		return errors.New("outbox: not initialised")
	}
	// Both counters' new values in one allocation: bbolt keeps a value
	// until the transaction ends.
	v := make([]byte, 16)
	binary.BigEndian.PutUint64(v, uint64(int64(boltkv.Uint(m, keyRows))+rows))
	binary.BigEndian.PutUint64(v[8:], uint64(int64(boltkv.Uint(m, keyBytes))+bytes))
	if err := m.Put(keyRows, v[:8:8]); err != nil {
		return fmt.Errorf("outbox: put %s: %w", keyRows, err)
	}
	if err := m.Put(keyBytes, v[8:]); err != nil {
		return fmt.Errorf("outbox: put %s: %w", keyBytes, err)
	}
	return nil
}
