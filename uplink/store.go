package uplink

import (
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/internal/boltkv"

	"github.com/edgeagent/edgeagent/buffer/outbox"
)

// The uplink's buckets in the state database. Sealed batches are keyed by the
// outbox sequence of their first row, so key order is outbox order.
var (
	bucketBatches  = []byte("uplink_batches")
	bucketMeta     = []byte("uplink_meta")
	bucketRejected = []byte("uplink_rejected")

	keyBatches = []byte("batches")
	keyBytes   = []byte("bytes")
)

// maxRejected bounds the rows kept for inspection in uplink_rejected; older
// ones are dropped (and were counted and logged when they were rejected).
const maxRejected = 1000

// sealedFormat is the version byte of a stored sealed batch.
const sealedFormat = 1

// ErrCorrupt is returned when a stored sealed batch cannot be decoded.
var ErrCorrupt = errors.New("uplink: corrupt sealed batch")

// Init creates the uplink's buckets, and the outbox's. Run calls it; the
// command layer may call it at open so that BacklogBytes works before Run.
func Init(tx *bolt.Tx) error {
	if err := outbox.Init(tx); err != nil {
		return err
	}
	for _, name := range [][]byte{bucketBatches, bucketMeta, bucketRejected} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("uplink: create bucket %s: %w", name, err)
		}
	}
	return nil
}

// sealed is one sealed batch as stored: the exact body that is sent, and
// sent again, byte for byte, until it is acknowledged.
type sealed struct {
	first, last uint64 // outbox sequences of its first and last row
	oldest      int64  // oldest row's EmittedAt, Unix ms
	aggregates  int
	alerts      int
	id          string
	encoding    string
	body        []byte
	// stored is the marshalled form when build made it, with body a
	// slice of its tail: putSealed then writes it without a copy.
	stored []byte
}

func (s *sealed) marshal() []byte {
	if s.stored != nil {
		return s.stored
	}
	v := s.appendHeader(make([]byte, 0, 48+len(s.id)+len(s.encoding)+len(s.body)))
	return append(v, s.body...)
}

// appendHeader appends what the stored form holds before the body.
func (s *sealed) appendHeader(v []byte) []byte {
	v = append(v, sealedFormat)
	v = binary.AppendUvarint(v, s.last)
	v = binary.AppendVarint(v, s.oldest)
	v = binary.AppendUvarint(v, uint64(s.aggregates))
	v = binary.AppendUvarint(v, uint64(s.alerts))
	v = binary.AppendUvarint(v, uint64(len(s.id)))
	v = append(v, s.id...)
	v = binary.AppendUvarint(v, uint64(len(s.encoding)))
	return append(v, s.encoding...)
}

// unmarshalSealed decodes a stored batch, its body copied out of the
// transaction.
func unmarshalSealed(k, v []byte) (sealed, error) {
	s, body, err := unmarshalHeader(k, v)
	if err != nil {
		return s, err
	}
	s.body = append([]byte(nil), body...)
	return s, nil
}

// unmarshalHeader decodes a stored batch's header and returns its body,
// which is v's tail: valid only as long as v.
func unmarshalHeader(k, v []byte) (s sealed, body []byte, err error) {
	if len(k) != 8 || len(v) < 1 || v[0] != sealedFormat {
		return s, nil, fmt.Errorf("%w: key %x", ErrCorrupt, k)
	}
	s.first = binary.BigEndian.Uint64(k)
	r := v[1:]
	bad := func(what string) error { return fmt.Errorf("%w: batch at %d: %s", ErrCorrupt, s.first, what) }
	uv := func() (uint64, bool) {
		x, n := binary.Uvarint(r)
		if n <= 0 {
			return 0, false
		}
		r = r[n:]
		return x, true
	}
	var ok bool
	if s.last, ok = uv(); !ok {
		return s, nil, bad("last")
	}
	oldest, n := binary.Varint(r)
	if n <= 0 {
		return s, nil, bad("oldest")
	}
	s.oldest, r = oldest, r[n:]
	aggs, ok1 := uv()
	alerts, ok2 := uv()
	if !ok1 || !ok2 || aggs > 1<<31 || alerts > 1<<31 {
		return s, nil, bad("counts")
	}
	s.aggregates, s.alerts = int(aggs), int(alerts)
	str := func() (string, bool) {
		l, ok := uv()
		if !ok || l > uint64(len(r)) {
			return "", false
		}
		x := string(r[:l])
		r = r[l:]
		return x, true
	}
	if s.id, ok = str(); !ok {
		return s, nil, bad("id")
	}
	if s.encoding, ok = str(); !ok {
		return s, nil, bad("encoding")
	}
	return s, r, nil
}

// putSealed stores a batch and counts it.
func putSealed(tx *bolt.Tx, s *sealed) error {
	b := tx.Bucket(bucketBatches)
	if b == nil {
		return errors.New("uplink: not initialised")
	}
	v := s.marshal()
	if err := b.Put(boltkv.Key(s.first), v); err != nil {
		return fmt.Errorf("uplink: put sealed batch %s: %w", s.id, err)
	}
	return addMeta(tx, 1, int64(8+len(v)))
}

// deleteSealed removes acknowledged batches by their first sequence.
func deleteSealed(tx *bolt.Tx, firsts ...uint64) error {
	b := tx.Bucket(bucketBatches)
	if b == nil {
		return errors.New("uplink: not initialised")
	}
	var n, bytes int64
	for _, f := range firsts {
		k := boltkv.Key(f)
		v := b.Get(k)
		if v == nil {
			continue
		}
		n--
		bytes -= int64(8 + len(v))
		if err := b.Delete(k); err != nil {
			return fmt.Errorf("uplink: delete sealed batch at %d: %w", f, err)
		}
	}
	return addMeta(tx, n, bytes)
}

// readSealed returns up to max sealed batches whose first sequence is >= from,
// oldest first, copied out of the transaction.
func readSealed(tx *bolt.Tx, from uint64, max int) ([]sealed, error) {
	b := tx.Bucket(bucketBatches)
	if b == nil {
		return nil, nil
	}
	var out []sealed
	c := b.Cursor()
	for k, v := c.Seek(boltkv.Key(from)); k != nil && len(out) < max; k, v = c.Next() {
		s, err := unmarshalSealed(k, v)
		if err != nil {
			return out, err
		}
		out = append(out, s)
	}
	return out, nil
}

// Backlog is the sealed part of what waits to be sent.
type Backlog struct {
	// Batches and Bytes count sealed, unacknowledged batches; Bytes is
	// their size in the database (compressed body plus a small header).
	Batches uint64
	Bytes   uint64
	// Oldest is the oldest sealed row's EmittedAt (Unix ms), 0 when none.
	Oldest int64
}

// ReadBacklog returns the sealed, unacknowledged batches' count, size and
// age anchor.
func ReadBacklog(tx *bolt.Tx) (Backlog, error) {
	var bl Backlog
	m := tx.Bucket(bucketMeta)
	if m == nil {
		return bl, nil
	}
	bl.Batches, bl.Bytes = boltkv.Uint(m, keyBatches), boltkv.Uint(m, keyBytes)
	if b := tx.Bucket(bucketBatches); b != nil {
		if k, v := b.Cursor().First(); k != nil {
			s, _, err := unmarshalHeader(k, v)
			if err != nil {
				return bl, err
			}
			bl.Oldest = s.oldest
		}
	}
	return bl, nil
}

// BacklogBytes is the figure storage.outbox_max_bytes bounds: the outbox rows
// (including local ones) plus the sealed batches that wait for an ack.
// Sealing moves bytes from the first to the second, compressed, so the sum
// stays an honest measure of what the gateway holds for the cloud. The window
// stage's backpressure check calls it inside its own transaction.
func BacklogBytes(tx *bolt.Tx) (uint64, error) {
	ob, err := outbox.ReadStats(tx)
	if err != nil {
		return 0, fmt.Errorf("uplink: outbox stats: %w", err)
	}
	var sealedBytes uint64
	if m := tx.Bucket(bucketMeta); m != nil {
		sealedBytes = boltkv.Uint(m, keyBytes)
	}
	return ob.Bytes + sealedBytes, nil
}

// putRejected keeps a row the uplink could not decode for inspection, and
// drops the oldest kept rows past maxRejected.
func putRejected(tx *bolt.Tx, e outbox.Entry, reason string) error {
	b := tx.Bucket(bucketRejected)
	if b == nil {
		return errors.New("uplink: not initialised")
	}
	v := make([]byte, 0, 16+len(reason)+len(e.Data))
	v = append(v, byte(e.Kind))
	v = binary.AppendVarint(v, e.EmittedAt)
	v = binary.AppendUvarint(v, uint64(len(reason)))
	v = append(v, reason...)
	v = append(v, e.Data...)
	if err := b.Put(boltkv.Key(e.Seq), v); err != nil {
		return fmt.Errorf("uplink: keep rejected row %d: %w", e.Seq, err)
	}
	for b.Stats().KeyN > maxRejected {
		k, _ := b.Cursor().First()
		if err := b.Delete(k); err != nil {
			return fmt.Errorf("uplink: trim rejected rows: %w", err)
		}
	}
	return nil
}

func addMeta(tx *bolt.Tx, n, bytes int64) error {
	m := tx.Bucket(bucketMeta)
	if m == nil {
		return errors.New("uplink: not initialised")
	}
	if err := boltkv.AddInt(m, keyBatches, n); err != nil {
		return fmt.Errorf("uplink: meta: %w", err)
	}
	if err := boltkv.AddInt(m, keyBytes, bytes); err != nil {
		return fmt.Errorf("uplink: meta: %w", err)
	}
	return nil
}
