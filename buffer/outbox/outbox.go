// Package outbox is the durable queue between the window stage, which appends
// emitted aggregates and alerts inside its checkpoint transaction, and the
// uplink, which seals them into batches and deletes them once acknowledged.
//
// The outbox lives in the state database. Every function takes the caller's
// bbolt transaction, so appends commit atomically with the state that
// produced them (DESIGN invariant 2).
package outbox

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

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
// The entry is a pack of its own, in an allocation of its size: an
// Appender's arena would take a 64 KiB chunk for it.
func Append(tx *bolt.Tx, kind Kind, emittedAt int64, data []byte) (uint64, error) {
	b := tx.Bucket(bucketRows)
	if b == nil {
		return 0, errors.New("outbox: not initialised")
	}
	b.FillPercent = 1
	seq, err := b.NextSequence()
	if err != nil {
		return 0, fmt.Errorf("outbox: next sequence: %w", err)
	}
	e := Entry{Seq: seq, Kind: kind, EmittedAt: emittedAt}
	kv := binary.BigEndian.AppendUint64(make([]byte, 0, 8+1+packedMax+len(data)), seq)
	kv = appendPacked(append(kv, packMarker), e, 0, data)
	if err := b.Put(kv[:8:8], kv[8:]); err != nil {
		return 0, fmt.Errorf("outbox: put %d: %w", seq, err)
	}
	return seq, addMeta(tx, 1, entryBytes(e, data))
}

// Entries are stored in packs: one bbolt value holds consecutive entries
// one Appender queued, up to packMaxEntries of them or packMaxBytes, keyed
// by the sequence of its last entry, so a seek to a sequence lands on the
// pack that holds it. A pack that loses entries keeps its key, which is
// still at or past each of them and before every later pack's entries.
//
// Why: a row per entry cost a bbolt Put each (a cursor search, and the
// leaf's array of elements grown one at a time to a window batch's 1,700
// rows) and a Delete each once sealed, about a fifth of everything the
// agent allocated in load mode; BenchmarkOutboxCycle spends half the CPU
// with packs.
//
// A pack's value starts with packMarker; each entry follows as the uvarint
// difference of its sequence from the one before (from 0 for the first),
// its kind, its emitted-at as a varint, its data's length as a uvarint, and
// the data. A value that starts with any other byte is a row of one entry,
// the layout before packs: kind, emitted-at as a varint and data, keyed by
// its own sequence.
const (
	packMarker     = 0
	packMaxEntries = 128
	packMaxBytes   = 16 << 10
)

// Appender queues many entries in one transaction: the entries go in a
// pack at a time, the row and byte counters once, at Close. Other appends
// in the same transaction may interleave: a sequence that is not the one
// after the pending pack's last puts that pack first, so packs never
// overlap, and the counters only ever add.
type Appender struct {
	tx          *bolt.Tx
	b           *bolt.Bucket
	rows, bytes int64
	arena       *boltkv.Arena
	// The pack being filled, in the arena's current chunk after room
	// for its key: the chunk's bytes, its entry count and last sequence.
	pack      []byte
	packLimit int // the length the pack may grow to in the chunk
	packN     int
	packEnd   uint64
}

// NewAppender starts appending in tx. Close must be called before the
// transaction commits, or the last pack and the counters are missing. The
// packs are built in arena, which must outlive the transaction and which
// nothing else may cut from until Close; nil gives the appender one of its
// own.
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

// packedMax bounds an entry's bytes in a pack beside its data: its
// sequence difference, kind, emitted-at and data length.
const packedMax = 3*binary.MaxVarintLen64 + 1

// Append queues one entry and returns its sequence.
func (a *Appender) Append(kind Kind, emittedAt int64, data []byte) (uint64, error) {
	seq, err := a.b.NextSequence()
	if err != nil {
		return 0, fmt.Errorf("outbox: next sequence: %w", err)
	}
	if a.packN > 0 && (seq != a.packEnd+1 || a.packN == packMaxEntries ||
		len(a.pack)+packedMax+len(data) > a.packLimit) {
		if err := a.flush(); err != nil {
			return 0, err
		}
	}
	if a.packN == 0 {
		// Built where it will stay: the room holds a whole pack (or
		// this one entry, when larger), so the appends below never
		// move it out of the chunk.
		n := 8 + 1 + max(packMaxBytes, packedMax+len(data))
		room := a.arena.Room(n)
		a.packLimit = len(room) + n
		a.pack = append(room[:len(room)+8], packMarker)
	}
	e := Entry{Seq: seq, Kind: kind, EmittedAt: emittedAt}
	a.pack = appendPacked(a.pack, e, a.packEnd, data)
	a.bytes += entryBytes(e, data)
	a.packN++
	a.packEnd = seq
	a.rows++
	return seq, nil
}

// flush puts the pending pack, its key written in the room left for it:
// bbolt keeps key and value until the transaction ends.
func (a *Appender) flush() error {
	if a.packN == 0 {
		return nil
	}
	kv := a.arena.Cut(a.pack)
	binary.BigEndian.PutUint64(kv, a.packEnd)
	if err := a.b.Put(kv[:8:8], kv[8:]); err != nil {
		return fmt.Errorf("outbox: put %d: %w", a.packEnd, err)
	}
	a.pack, a.packN, a.packEnd = nil, 0, 0
	return nil
}

// Close puts the last pack and writes the counters for the entries
// appended.
func (a *Appender) Close() error {
	if err := a.flush(); err != nil {
		return err
	}
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
		err := eachEntry(k, v, func(e Entry, data []byte) bool {
			if e.Seq >= from {
				e.Data = slab.Cut(append(slab.Room(len(data)), data...))
				out = append(out, e)
			}
			return len(out) < max
		})
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// Has reports whether the entry of sequence seq is still queued.
func Has(tx *bolt.Tx, seq uint64) bool {
	b := tx.Bucket(bucketRows)
	if b == nil {
		return false
	}
	k, v := b.Cursor().Seek(boltkv.Key(seq))
	if k == nil {
		return false
	}
	found := false
	err := eachEntry(k, v, func(e Entry, _ []byte) bool {
		found = e.Seq == seq
		return e.Seq < seq
	})
	return err == nil && found
}

// Delete removes the entries with the given sequences (absent ones are
// skipped). A pack that loses some of its entries is written again with
// the rest; one that loses all of them is deleted.
func Delete(tx *bolt.Tx, seqs ...uint64) error {
	b := tx.Bucket(bucketRows)
	if b == nil || len(seqs) == 0 {
		return nil
	}
	if !slices.IsSorted(seqs) { // a copy: the caller's stay as they are
		seqs = slices.Sorted(slices.Values(seqs))
	}
	var rows, size int64
	// One cursor for every pack, sought again after each change (a Put
	// or a Delete may move the pages under it). Seek does not keep its
	// key, so one key buffer serves all.
	c := b.Cursor()
	key := make([]byte, 8)
	for len(seqs) > 0 {
		binary.BigEndian.PutUint64(key, seqs[0])
		k, v := c.Seek(key)
		if k == nil {
			break
		}
		last := boltkv.Seq(k)
		n, _ := slices.BinarySearch(seqs, last+1)
		mine := seqs[:n] // the sequences this pack may hold
		seqs = seqs[n:]
		var kept []byte // the pack's other entries, nil while none
		var keptEnd uint64
		dropped := false
		err := eachEntry(k, v, func(e Entry, data []byte) bool {
			for len(mine) > 0 && mine[0] < e.Seq {
				mine = mine[1:]
			}
			if len(mine) > 0 && mine[0] == e.Seq {
				dropped = true
				rows--
				size -= entryBytes(e, data)
				return true
			}
			if kept == nil {
				kept = append(make([]byte, 0, len(v)), packMarker)
			}
			kept = appendPacked(kept, e, keptEnd, data)
			keptEnd = e.Seq
			return true
		})
		if err != nil {
			return err
		}
		switch {
		case !dropped:
		case kept == nil:
			if err := c.Delete(); err != nil {
				return fmt.Errorf("outbox: delete %d: %w", last, err)
			}
		default:
			// The pack keeps its key, still at or past its entries and
			// before every later pack's.
			if err := b.Put(k, kept); err != nil {
				return fmt.Errorf("outbox: put %d: %w", last, err)
			}
		}
	}
	return addMeta(tx, rows, size)
}

// appendPacked appends e, whose data is data, to a pack whose last entry
// has sequence prev (0 for the first).
func appendPacked(dst []byte, e Entry, prev uint64, data []byte) []byte {
	dst = binary.AppendUvarint(dst, e.Seq-prev)
	dst = append(dst, byte(e.Kind))
	dst = binary.AppendVarint(dst, e.EmittedAt)
	dst = binary.AppendUvarint(dst, uint64(len(data)))
	return append(dst, data...)
}

// entryBytes is what an entry counts toward Stats.Bytes: its size as a row
// of its own (key, kind, emitted-at and data), whichever way it is stored,
// so that the bound on the outbox's bytes means what it did before packs.
func entryBytes(e Entry, data []byte) int64 {
	var at [binary.MaxVarintLen64]byte
	return int64(8 + 1 + len(binary.AppendVarint(at[:0], e.EmittedAt)) + len(data))
}

// eachEntry calls fn with each entry of one stored value, a pack or a row
// of one entry, in sequence order, until fn returns false. The data
// aliases the value.
func eachEntry(k, v []byte, fn func(e Entry, data []byte) (more bool)) error {
	if len(k) != 8 || len(v) < 2 {
		return fmt.Errorf("%w: key %x", ErrCorrupt, k)
	}
	if v[0] != packMarker {
		e, n, err := decode(boltkv.Seq(k), v)
		if err != nil {
			return err
		}
		fn(e, v[n:])
		return nil
	}
	var seq uint64
	for rest := v[1:]; len(rest) > 0; {
		d, n := binary.Uvarint(rest)
		if n <= 0 || n >= len(rest) {
			return fmt.Errorf("%w: pack after seq %d: sequence", ErrCorrupt, seq)
		}
		seq += d
		e, m, err := decode(seq, rest[n:])
		if err != nil {
			return err
		}
		rest = rest[n+m:]
		size, l := binary.Uvarint(rest)
		if l <= 0 || size > uint64(len(rest)-l) {
			return fmt.Errorf("%w: seq %d: data length", ErrCorrupt, seq)
		}
		end := l + int(size)
		if !fn(e, rest[l:end:end]) {
			return nil
		}
		rest = rest[end:]
	}
	return nil
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
			err := eachEntry(k, v, func(e Entry, _ []byte) bool {
				s.Oldest = e.EmittedAt
				return false
			})
			if err != nil {
				return s, err
			}
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
		err := eachEntry(key, v, func(e Entry, _ []byte) bool {
			if e.Kind == k {
				n++
			}
			return true
		})
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// decode decodes the header (kind and emitted-at) of the entry of sequence
// seq at the start of v; what follows it starts at v[n:].
func decode(seq uint64, v []byte) (e Entry, n int, err error) {
	if len(v) < 2 {
		return Entry{}, 0, fmt.Errorf("%w: seq %d", ErrCorrupt, seq)
	}
	e = Entry{Seq: seq, Kind: Kind(v[0])}
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
