package buffer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/internal/boltkv"
)

// Sentinel errors.
var (
	// ErrFull is returned by Append when storing the records would exceed
	// MaxBytes and no checkpointed record is left to trim. The caller must
	// hold its acknowledgements and retry: nothing was written.
	ErrFull = errors.New("buffer: bronze full of unprocessed records")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("buffer: bronze closed")
)

// Options bound and instrument a Bronze log.
type Options struct {
	// Retention is the age (by received-at) after which checkpointed records
	// are trimmed. 0 keeps them until MaxBytes forces them out.
	Retention time.Duration
	// MaxBytes bounds the logical size (keys + values). 0 is unbounded.
	MaxBytes int64
	// Clock defaults to time.Now.
	Clock func() time.Time
	// BeforeCommit, when set, runs inside every append transaction just
	// before it commits; an error rolls the transaction back. It is the
	// failure-injection point for disk-full and I/O-error tests.
	BeforeCommit func() error
	// ReadOnly opens the file without taking the write lock, for inspection
	// while the agent runs elsewhere. Appends fail.
	ReadOnly bool
}

// Bronze is the append-only log of raw messages. Append is safe for one
// writer at a time; Read, Stats and Trim may run concurrently with it.
type Bronze struct {
	db   *bolt.DB
	opts Options

	mu       sync.Mutex // serialises Append and Trim
	next     uint64     // next sequence to assign
	records  int64
	bytes    int64
	chunkMax int // see chunkBytes

	// tail keeps the most recently appended records in memory, as
	// committed, so the window stage reads what it just stored without
	// going back through bbolt's memory map (which would keep every page
	// it touched resident).
	tailMu    sync.Mutex
	tail      []tailChunk
	tailBytes int
	// recycle holds the arenas that left the tail, for Append to reuse
	// once the reader has released their records (see ReleaseThrough).
	// Under tailMu.
	recycle arenaRecycler
	// copies holds the arenas ReadInto copies the file's chunks into,
	// recycled the same way. Under tailMu.
	copies readCopies

	lastSeq    atomic.Uint64
	checkpoint atomic.Uint64
	// revFloor is the highest revision the window stage has committed,
	// kept here too (see SetRevisionFloor).
	revFloor atomic.Uint64
	// trimmedNewest is the newest received-at among the records Trim
	// deleted (see TrimmedNewest).
	trimmedNewest atomic.Int64
	// appended marks when this process appended which sequences, by
	// Options.Clock (with Go's monotonic reading in production): see
	// youngFrom.
	appended []appendMark
	// openedNext is the first sequence this run appends (SetLimits).
	openedNext uint64
	full       atomic.Bool
	closed     atomic.Bool
	// readMapped counts the bytes ReadInto read through the file's map
	// since its pages were last released; releaseErr keeps a failure of
	// that release for the next DropMapped to report.
	readMapped atomic.Int64
	releaseErr atomic.Pointer[error]
}

var (
	bucketLog  = []byte("bronze")
	bucketMeta = []byte("bronze_meta")
	keyNext    = []byte("next")
	keyRecords = []byte("records")
	keyBytes   = []byte("bytes")
	keyFormat  = []byte("format")
	keyRevs    = []byte("revision_floor")
	keyTrimmed = []byte("trimmed_newest")
)

// logFormat is the layout of the log bucket: 2 is chunks of records, each
// under its first record's sequence (an Append writes one or more). Format
// 1, one record per key, was never released.
const logFormat = 2

// chunkBytes returns the largest chunk Append puts for a database of
// pageSize: two chunks and their keys fill a leaf page. bbolt never splits
// a leaf below two entries a page, so when a commit's records went into
// one large value, the last leaf kept the previous two to four commits'
// chunks and the commit rewrote them all: 446 KB of pages for 100 KB of
// records (measured with bbolt 1.5's page statistics), against 120 KB in
// pieces of this size. A record larger than this is a chunk of its own.
func chunkBytes(pageSize int) int {
	const pageHeader, leafElement, keyBytes = 16, 16, 8
	return (pageSize-pageHeader)/2 - leafElement - keyBytes
}

// Open opens (creating if needed) the Bronze log at path.
func Open(path string, opts Options) (*Bronze, error) {
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.ReadOnly {
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("open bronze %s: %w", path, err)
		}
	}
	// Group-readable, so that the umask decides: under the unit's
	// UMask=0027 members of group edgeagent can inspect a stopped agent.
	db, err := boltkv.Open(path, 0o640, opts.ReadOnly, 0)
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("open bronze %s: locked by another process (is the agent running?): %w", path, err)
		}
		return nil, fmt.Errorf("open bronze %s: %w", path, err)
	}
	b := &Bronze{db: db, opts: opts, next: 1, chunkMax: chunkBytes(db.Info().PageSize)}
	load := func(tx *bolt.Tx) error {
		m := tx.Bucket(bucketMeta)
		if m == nil {
			return nil
		}
		if f := boltkv.Uint(m, keyFormat); f != logFormat {
			if f != 0 {
				return fmt.Errorf("the log has format %d, this build reads format %d: move the file aside", f, logFormat)
			}
			if log := tx.Bucket(bucketLog); log != nil && log.Stats().KeyN > 0 {
				return fmt.Errorf("the log holds one record per key (format 1, before release), this build reads format %d: move the file aside", logFormat)
			}
			if !opts.ReadOnly {
				if err := boltkv.PutUint(m, keyFormat, logFormat); err != nil {
					return err
				}
			}
		}
		b.next = max(boltkv.Uint(m, keyNext), 1)
		b.records = int64(boltkv.Uint(m, keyRecords))
		b.bytes = int64(boltkv.Uint(m, keyBytes))
		b.revFloor.Store(boltkv.Uint(m, keyRevs))
		b.trimmedNewest.Store(int64(boltkv.Uint(m, keyTrimmed)))
		return nil
	}
	if opts.ReadOnly {
		err = db.View(load)
	} else {
		err = db.Update(func(tx *bolt.Tx) error {
			for _, name := range [][]byte{bucketLog, bucketMeta} {
				if _, err := tx.CreateBucketIfNotExists(name); err != nil {
					return fmt.Errorf("create bucket %s: %w", name, err)
				}
			}
			return load(tx)
		})
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open bronze %s: %w", path, err)
	}
	b.lastSeq.Store(b.next - 1)
	b.openedNext = b.next
	return b, nil
}

// Close closes the file. It is safe to call twice.
func (b *Bronze) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.db.Close(); err != nil {
		return fmt.Errorf("close bronze: %w", err)
	}
	return nil
}

// SetLimits replaces Options.Retention and MaxBytes: a reload keeps the
// file open and applies the new config's limits to it.
func (b *Bronze) SetLimits(retention time.Duration, maxBytes int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if retention > b.opts.Retention && b.next > b.openedNext {
		// The marks were kept for the old retention (none for 0): keep
		// all this run appended for the new one from now, which is
		// conservative.
		now := b.opts.Clock()
		b.appended = []appendMark{{seq: b.openedNext, at: now, last: now}}
	}
	b.opts.Retention, b.opts.MaxBytes = retention, maxBytes
}

// Path is the file's path.
func (b *Bronze) Path() string { return b.db.Path() }

// Append stores recs in one transaction (one fsync) and sets each record's
// Seq. It returns only after the commit is durable. On any error nothing was
// stored and the caller must not acknowledge the records.
//
// When the log is over MaxBytes, Append first trims checkpointed records in
// the same transaction; if that does not make room it returns ErrFull.
func (b *Bronze) Append(recs []Record) error {
	if len(recs) == 0 {
		return nil
	}
	if b.closed.Load() {
		return ErrClosed
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	next, records, bytes := b.next, b.records, b.bytes
	var trimmedNewest int64
	var arena []byte
	var ends []int
	err := b.db.Update(func(tx *bolt.Tx) error {
		// bbolt's record of reused pages grows with the log (see
		// boltkv.ForgetAllocations): up to 4 MB of the heap in load mode.
		boltkv.ForgetAllocations(tx)
		var add int64
		size := 0
		for i := range recs {
			n := recs[i].EncodedSize()
			add += int64(StoredSize(&recs[i]))
			size += uvarintLen(uint64(n)) + n
		}
		if b.opts.MaxBytes > 0 && bytes+add > b.opts.MaxBytes {
			n, freed, newest, err := b.trimIn(tx, 0, math.MaxUint64, bytes+add-b.opts.MaxBytes, math.MaxInt)
			if err != nil {
				return err
			}
			trimmedNewest = newest
			records -= int64(n)
			bytes -= freed
			if bytes+add > b.opts.MaxBytes {
				return ErrFull
			}
		}
		log := tx.Bucket(bucketLog)
		log.FillPercent = 1 // append-only: pack pages full
		// The batch is encoded once into the arena; its chunks are slices
		// of it, cut at record boundaries (see chunkBytes). bbolt keeps
		// the values until commit and the in-memory tail keeps the arena
		// after: it is never written again.
		arena, ends = b.newArena(size, len(recs))
		first := next
		for i := range recs {
			arena = binary.AppendUvarint(arena, uint64(recs[i].EncodedSize()))
			arena = recs[i].AppendEncode(arena)
			ends = append(ends, len(arena))
			recs[i].Seq = next
			next++
			records++
		}
		bytes += add
		if err := b.putChunks(log, first, arena, ends); err != nil {
			return err
		}
		if err := b.putMeta(tx, next, records, bytes); err != nil {
			return err
		}
		if b.opts.BeforeCommit != nil {
			if err := b.opts.BeforeCommit(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		for i := range recs {
			recs[i].Seq = 0
		}
		if errors.Is(err, ErrFull) {
			b.full.Store(true)
			return err
		}
		return fmt.Errorf("append bronze batch of %d: %w", len(recs), err)
	}
	b.full.Store(false)
	b.markAppended(next - uint64(len(recs)))
	b.next, b.records, b.bytes = next, records, bytes
	b.trimmedNewest.Store(max(b.trimmedNewest.Load(), trimmedNewest))
	b.addTail(next-uint64(len(recs)), arena, ends)
	b.lastSeq.Store(next - 1)
	return nil
}

// putChunks puts the records of arena (record i ending at ends[i], the
// first with sequence first) as chunks of at most b.chunkMax bytes.
func (b *Bronze) putChunks(log *bolt.Bucket, first uint64, arena []byte, ends []int) error {
	var key [8]byte
	start := 0
	for i := 0; i < len(ends); {
		j := i + 1 // a chunk takes at least one record
		for j < len(ends) && ends[j]-start <= b.chunkMax {
			j++
		}
		binary.BigEndian.PutUint64(key[:], first+uint64(i))
		if err := log.Put(key[:], arena[start:ends[j-1]:ends[j-1]]); err != nil {
			return fmt.Errorf("put records %d-%d: %w", first+uint64(i), first+uint64(j-1), err)
		}
		start = ends[j-1]
		i = j
	}
	return nil
}

// tailMaxBytes bounds the in-memory tail: a fraction of a second of the
// rig's load mode (50,000 messages/s, 70 KB an append), all a window stage
// that keeps up needs; a stage behind it reads the chunks back from disk.
// Load mode, three alternated pairs: peak RSS 96-102 MiB at 1 MiB against
// 104-107 MiB at 4 MiB, CPU within the runs' noise (session 14). At 512 KiB
// the tail's arenas hold half the heap they did at 1 MiB, which took part
// of load mode's peak down (docs/performance.md, session 55).
const tailMaxBytes = 512 << 10

// tailChunk is one committed append: arena is the chunk as stored (each
// record a uvarint length and its encoding), record i ending at ends[i].
type tailChunk struct {
	first uint64
	arena []byte
	ends  []int
}

func (b *Bronze) addTail(first uint64, arena []byte, ends []int) {
	b.tailMu.Lock()
	defer b.tailMu.Unlock()
	if len(arena) > tailMaxBytes {
		// Larger than the whole tail (a commit of large messages): kept,
		// it would hold that memory until the next commit, however long
		// the agent then idles. Its records are read from the file.
		b.dropTail()
		return
	}
	if n := len(b.tail); n > 0 {
		last := &b.tail[n-1]
		if last.first+uint64(len(last.ends)) != first {
			b.dropTail() // not contiguous: start over
		}
	}
	b.tail = append(b.tail, tailChunk{first: first, arena: arena, ends: ends})
	b.tailBytes += len(arena)
	for len(b.tail) > 1 && b.tailBytes > tailMaxBytes {
		b.tailBytes -= len(b.tail[0].arena)
		b.recycle.left(b.tail[0])
		b.tail[0] = tailChunk{}
		b.tail = b.tail[1:]
	}
}

// dropTail empties the tail; under tailMu.
func (b *Bronze) dropTail() {
	for _, c := range b.tail {
		b.recycle.left(c)
	}
	clear(b.tail)
	b.tail, b.tailBytes = b.tail[:0], 0
}

// newArena returns the arrays an Append of size encoded bytes and n
// records fills: a recycled arena's when one is large enough (see
// ReleaseThrough). Under load the arenas were 15 % of all the agent
// allocated (load mode, 10,000 devices), each a fresh large object for the
// collector to count toward its next cycle.
func (b *Bronze) newArena(size, n int) ([]byte, []int) {
	b.tailMu.Lock()
	arena, ends, ok := b.recycle.take(size, n)
	b.tailMu.Unlock()
	if ok {
		return arena, ends
	}
	if size > 16<<10 {
		// A large object takes whole 8 KiB pages: the rounding is free,
		// and lets the arena serve a later, somewhat larger commit.
		size = (size + 8<<10 - 1) &^ (8<<10 - 1)
	}
	return make([]byte, 0, size), make([]int, 0, n+n/4)
}

// ReleaseThrough tells Bronze that the caller, the only reader that
// keeps records past its next Read, holds none of the records up to seq
// any more (nor strings or slices of them): their memory may be reused.
// Until the first call nothing is reused, so a reader that never calls it
// keeps Read's promise that records stay valid as long as they are kept.
// The window stage calls it after each slice of records it processed and
// after each commit. A reader that goes back to read records again (the
// stage reloading its checkpoint after a failed commit) first calls it
// with the lower seq: what it released above seq is no longer reused as
// it leaves the tail, since the reader will hold those records again.
func (b *Bronze) ReleaseThrough(seq uint64) {
	b.tailMu.Lock()
	b.recycle.release(seq)
	b.copies.release(seq)
	b.tailMu.Unlock()
}

// arenaRecycler keeps the arenas of appends that left the tail: those
// whose records the reader may still hold (spent), and those it released
// (spare), which the next appends reuse. Both lists are short and bounded;
// what does not fit is left to the collector, as before recycling.
type arenaRecycler struct {
	on       bool   // a reader releases (ReleaseThrough was called)
	released uint64 // the sequence released through, as last said
	spent    []tailChunk
	spare    []tailChunk
}

const (
	// maxSpent bounds the arenas that left the tail but are not released:
	// a reader behind the tail (catch-up) reads from the file and releases
	// late, and the arenas it never read need not wait for it.
	maxSpent = 4
	// maxSpare bounds the released arenas kept for reuse. The window
	// stage releases what it read as it goes, ahead of the tail's
	// evictions, so in load mode (50 appends a second, 70 KB each) one
	// append's eviction is the next one's arena. Twelve kept, and
	// releases only at the stage's commits, measured about 0.5 MiB more
	// peak RSS in load mode (six runs each).
	maxSpare = 4
	// maxSpareBytes bounds one kept arena, so a burst of large commits is
	// not kept (the tail's own bound is tailMaxBytes).
	maxSpareBytes = 256 << 10
)

// left takes an arena that left the tail.
func (r *arenaRecycler) left(c tailChunk) {
	if !r.on || cap(c.arena) > maxSpareBytes || len(c.ends) == 0 {
		return
	}
	r.spent = appendBounded(r.spent, c, maxSpent)
	r.release(r.released)
}

// appendBounded appends c to list, dropping the oldest first when list
// already holds max.
func appendBounded[T any](list []T, c T, max int) []T {
	if len(list) == max {
		clear(list[:1])
		list = append(list[:0], list[1:]...)
	}
	return append(list, c)
}

// release makes the spent arenas whose records all are at or below seq
// spare.
func (r *arenaRecycler) release(seq uint64) {
	r.on = true
	r.released = seq
	kept := r.spent[:0]
	for _, c := range r.spent {
		if c.first+uint64(len(c.ends))-1 > r.released {
			kept = append(kept, c)
			continue
		}
		r.spare = appendBounded(r.spare, tailChunk{arena: c.arena[:0], ends: c.ends[:0]}, maxSpare)
	}
	clear(r.spent[len(kept):])
	r.spent = kept
}

// take returns a spare arena for size bytes and n records: the smallest
// that is large enough.
func (r *arenaRecycler) take(size, n int) ([]byte, []int, bool) {
	best := -1
	for i, c := range r.spare {
		if cap(c.arena) >= size && cap(c.ends) >= n && (best < 0 || cap(c.arena) < cap(r.spare[best].arena)) {
			best = i
		}
	}
	if best < 0 {
		return nil, nil, false
	}
	c := r.spare[best]
	last := len(r.spare) - 1
	r.spare[best] = r.spare[last]
	r.spare[last] = tailChunk{}
	r.spare = r.spare[:last]
	return c.arena, c.ends, true
}

// readTail serves Read from the in-memory tail when it holds from; ok is
// false when from is older than the tail.
func (b *Bronze) readTail(out []Record, from uint64, max int) (_ []Record, ok bool, err error) {
	b.tailMu.Lock()
	defer b.tailMu.Unlock()
	if len(b.tail) == 0 || from < b.tail[0].first {
		return out, false, nil
	}
	b.copies.dropSpare()
	last := b.tail[len(b.tail)-1]
	if end := last.first + uint64(len(last.ends)); from < end {
		out = slices.Grow(out, int(min(uint64(max), end-from)))
	}
	for _, c := range b.tail {
		end := c.first + uint64(len(c.ends))
		if from >= end {
			continue
		}
		for i := int(from - c.first); i < len(c.ends) && len(out) < max; i++ {
			start := 0
			if i > 0 {
				start = c.ends[i-1]
			}
			seq := c.first + uint64(i)
			_, n := binary.Uvarint(c.arena[start:]) // the length; ends has it already
			// The arena is never written again: records alias it, their
			// strings included.
			r, err := decodeRecord(seq, c.arena[start+n:c.ends[i]:c.ends[i]], true)
			if err != nil {
				return nil, true, err
			}
			out = append(out, r)
			from = seq + 1
		}
		if len(out) == max {
			break
		}
	}
	return out, true, nil
}

// Read returns up to max records with Seq >= from, in order. The records
// stay valid for as long as the caller keeps them, but their Payload (and
// the bytes behind Topic) may be shared with the log's in-memory tail and
// other reads: read-only.
func (b *Bronze) Read(from uint64, max int) ([]Record, error) {
	return b.ReadInto(nil, from, max)
}

// ReadInto is Read into dst's array (from dst[:0]): a reader that takes
// batch after batch reuses one array instead of allocating a batch's worth
// of records each time (the window stage's reads were about 40 MB of
// allocations per 10 s of load). The records' bytes are the same as Read's;
// only the array is reused.
//
// It also stops after the record that brings the bytes read (topics and
// payloads) to ReadMaxBytes, so a batch of large messages does not come
// into memory whole: a reader that needs everything reads until it gets
// no record, not until it gets fewer than max.
func (b *Bronze) ReadInto(dst []Record, from uint64, max int) ([]Record, error) {
	if b.closed.Load() {
		return dst[:0], ErrClosed
	}
	out, ok, err := b.readTail(dst[:0], from, max)
	if ok {
		return out, err
	}
	// Grown once to what the read can return, as the tail's reads are: a
	// caller reading a slice at a time keeps an array of that slice.
	if last := b.lastSeq.Load(); last >= from {
		out = slices.Grow(out, int(min(uint64(max), last-from+1)))
	}
	n := 0
	cp := b.newChunkCopier()
	err = b.scanRecords(from, cp.copy, func(r Record) bool {
		out = append(out, r)
		cp.returned(r.Seq)
		n += r.HeldBytes()
		return len(out) < max && n < ReadMaxBytes
	})
	cp.done()
	// A window stage catching up reads the file as fast as ingest writes
	// it (100k records/s draining a broker's backlog): between the
	// agent's periodic releases, the pages read stayed mapped, 11 MiB of
	// a 36 MiB peak. Released every releaseAfterRead bytes read instead.
	if b.readMapped.Add(int64(n)) >= releaseAfterRead {
		b.readMapped.Store(0)
		if rerr := boltkv.DropMapped(b.db); rerr != nil {
			b.releaseErr.Store(&rerr)
		}
	}
	return out, err
}

// releaseAfterRead is how many bytes ReadInto reads from the file before
// it releases the mapped pages (DropMapped).
const releaseAfterRead = 512 << 10

// ReadFull reports whether recs, what a ReadInto of at most max records
// returned, stopped at one of its bounds (max, ReadMaxBytes) rather than
// at the end of the log: more may be there right away.
func ReadFull(recs []Record, max int) bool {
	if len(recs) >= max {
		return true
	}
	n := 0
	for i := range recs {
		n += recs[i].HeldBytes()
	}
	return n >= ReadMaxBytes
}

// ReadMaxBytes bounds the topic and payload bytes of one ReadInto (the
// in-memory tail it may serve from is smaller still). Measured: a window
// batch of 1000 messages of 200 KB, read whole, took the agent's peak RSS
// to 400 MB.
const ReadMaxBytes = 8 << 20

// Scan calls fn for each record with Seq >= from, in order, until fn returns
// false. The record's Payload is only valid during the call.
func (b *Bronze) Scan(from uint64, fn func(Record) bool) error {
	return b.scanRecords(from, nil, fn)
}

// scanRecords is Scan; with a keep function, each chunk is copied once
// (keep returns the copy) and its records alias the copy, topic and all
// (nothing writes it until the reader released them), so they stay valid
// after the call — one copy a chunk, not two a record.
func (b *Bronze) scanRecords(from uint64, keep func([]byte) []byte, fn func(Record) bool) error {
	return b.scanChunks(from, func(first uint64, v []byte) (bool, error) {
		if keep != nil {
			v = keep(v)
		}
		more := true
		err := eachRecord(first, v, func(seq uint64, rec []byte) (bool, error) {
			if seq < from {
				return true, nil
			}
			r, err := decodeRecord(seq, rec, keep != nil)
			if err != nil {
				return false, err
			}
			more = fn(r)
			return more, nil
		})
		return more, err
	})
}

// scanChunks calls fn with each stored chunk from the one holding from
// on, in order, until fn returns false or an error. v is bbolt's memory:
// valid only during the call.
func (b *Bronze) scanChunks(from uint64, fn func(first uint64, v []byte) (bool, error)) error {
	if b.closed.Load() {
		return ErrClosed
	}
	return b.db.View(func(tx *bolt.Tx) error {
		log := tx.Bucket(bucketLog)
		if log == nil {
			return nil
		}
		c := log.Cursor()
		k, v := c.Seek(binary.BigEndian.AppendUint64(nil, from))
		// Seek finds the first chunk starting at or after from; the chunk
		// holding from may be the one before.
		if k == nil {
			k, v = c.Last()
		} else if binary.BigEndian.Uint64(k) > from {
			if k, v = c.Prev(); k == nil {
				k, v = c.First()
			}
		}
		for ; k != nil; k, v = c.Next() {
			if more, err := fn(binary.BigEndian.Uint64(k), v); err != nil || !more {
				return err
			}
		}
		return nil
	})
}

// eachRecord calls fn with each record of the chunk v, whose first record
// has sequence first, until fn returns false or an error.
func eachRecord(first uint64, v []byte, fn func(seq uint64, rec []byte) (bool, error)) error {
	for seq := first; len(v) > 0; seq++ {
		l, n := binary.Uvarint(v)
		if n <= 0 || l > uint64(len(v)-n) {
			return fmt.Errorf("%w: seq %d: bad record length in the chunk from %d", ErrCorruptRecord, seq, first)
		}
		more, err := fn(seq, v[n:n+int(l)])
		if err != nil || !more {
			return err
		}
		v = v[n+int(l):]
	}
	return nil
}

// SkipTo makes the next record's sequence at least seq+1 and reports
// whether it moved. After the log was lost, or replaced by an older copy,
// the window stage's offset is past the log's end: reusing those sequences
// would make new records look processed, and they would be acknowledged
// to the broker and never windowed.
func (b *Bronze) SkipTo(seq uint64) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.next > seq {
		return false, nil
	}
	if err := b.db.Update(func(tx *bolt.Tx) error { return b.putMeta(tx, seq+1, b.records, b.bytes) }); err != nil {
		return false, fmt.Errorf("bronze: continue after sequence %d: %w", seq, err)
	}
	b.next = seq + 1
	b.lastSeq.Store(seq)
	return true, nil
}

// SetRevisionFloor durably records rev, the highest revision the window
// stage is about to commit, when it is above the floor already recorded.
// The log outlives a damaged or deleted state database, whose own record
// of it is lost with it: a stage rebuilt from Bronze then continues above
// the floor (RevisionFloor), so the cloud's keep-the-highest-revision
// upsert takes the rebuilt windows instead of ignoring them as stale. The
// stage calls it right after the commit that holds the revision, before
// anything may read that commit's rows (window.Config.SendGate): with a
// floor below a revision already sent, the rebuilt windows' revisions
// would land on keys already sent with other contents. Each window numbers its revisions 1, 2, 3… above the
// base, so the highest rarely rises: a write now and then, not per batch.
func (b *Bronze) SetRevisionFloor(rev uint32) error {
	if uint64(rev) <= b.revFloor.Load() {
		return nil
	}
	if b.closed.Load() {
		return errors.New("bronze: record the revision floor: the log is closed")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	err := b.db.Update(func(tx *bolt.Tx) error {
		return boltkv.PutUint(tx.Bucket(bucketMeta), keyRevs, uint64(rev))
	})
	if err != nil {
		return fmt.Errorf("bronze: record the revision floor %d: %w", rev, err)
	}
	b.revFloor.Store(uint64(rev))
	return nil
}

// RevisionFloor is the highest revision recorded by SetRevisionFloor.
func (b *Bronze) RevisionFloor() uint32 { return uint32(b.revFloor.Load()) }

// LastSeq is the sequence of the newest committed record (0 when empty).
func (b *Bronze) LastSeq() uint64 { return b.lastSeq.Load() }

// SetCheckpoint tells Bronze the window stage has committed everything up to
// and including seq; only such records may be trimmed.
func (b *Bronze) SetCheckpoint(seq uint64) { b.checkpoint.Store(seq) }

// Checkpoint is the last value given to SetCheckpoint.
func (b *Bronze) Checkpoint() uint64 { return b.checkpoint.Load() }

// MaxBytes is the bound Append keeps the log under (0: none).
func (b *Bronze) MaxBytes() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.opts.MaxBytes
}

// StoredSize is what r takes against MaxBytes.
func StoredSize(r *Record) int { return 8 + r.EncodedSize() }

// Full reports whether the last Append failed with ErrFull.
func (b *Bronze) Full() bool { return b.full.Load() }

// Trim deletes checkpointed records older than Retention, and the oldest
// checkpointed records while the log is over MaxBytes, a whole Append's
// chunk at a time. It stops once it deleted limit records or more per call
// (0: 10,000), to keep transactions short.
func (b *Bronze) Trim(limit int) (deleted int, err error) {
	if b.closed.Load() {
		return 0, ErrClosed
	}
	if limit <= 0 {
		limit = 10_000
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var cutoff int64
	youngFrom := uint64(math.MaxUint64)
	if b.opts.Retention > 0 {
		now := b.opts.Clock()
		cutoff = now.Add(-b.opts.Retention).UnixNano()
		youngFrom = b.youngFrom(now)
	}
	var over int64
	if b.opts.MaxBytes > 0 && b.bytes > b.opts.MaxBytes {
		over = b.bytes - b.opts.MaxBytes
	}
	if cutoff == 0 && over == 0 {
		return 0, nil
	}
	var freed, newest int64
	err = b.db.Update(func(tx *bolt.Tx) error {
		var err error
		deleted, freed, newest, err = b.trimIn(tx, cutoff, youngFrom, over, limit)
		if err != nil || deleted == 0 {
			return err
		}
		return b.putMeta(tx, b.next, b.records-int64(deleted), b.bytes-freed)
	})
	if err != nil {
		return 0, fmt.Errorf("trim bronze: %w", err)
	}
	b.records -= int64(deleted)
	b.bytes -= freed
	b.trimmedNewest.Store(max(b.trimmedNewest.Load(), newest))
	return deleted, nil
}

// appendMark says that this process appended the sequences from seq on,
// up to the next mark's, between at and last.
type appendMark struct {
	seq      uint64
	at, last time.Time
}

// markAppended records that the sequences from first on were appended
// now, in marks at least a 64th of the retention apart (so at most about
// 65 are live), dropping those the retention has passed.
func (b *Bronze) markAppended(first uint64) {
	if b.opts.Retention <= 0 {
		return
	}
	now := b.opts.Clock()
	if n := len(b.appended); n > 0 && now.Sub(b.appended[n-1].at) < b.opts.Retention/64 {
		b.appended[n-1].last = now
	} else {
		b.appended = append(b.appended, appendMark{seq: first, at: now, last: now})
	}
	for len(b.appended) > 1 && now.Sub(b.appended[0].last) >= b.opts.Retention {
		b.appended = b.appended[1:]
	}
}

// youngFrom is the first sequence this process appended less than the
// retention before now by its own clock, whatever its stamp says
// (math.MaxUint64: none). A gateway that booted with its clock in 1970
// stamps its first records so, and NTP's step would have them trimmed at
// once, before a replay could recover the readings they held; Go's
// monotonic clock, which Options.Clock carries in production, is not
// moved by the step. A mark's records may be kept up to a 64th of the
// retention longer than it.
func (b *Bronze) youngFrom(now time.Time) uint64 {
	for _, m := range b.appended {
		if now.Sub(m.last) < b.opts.Retention {
			return m.seq
		}
	}
	return math.MaxUint64
}

// trimIn is trimTx from the checkpoint, recording the newest received-at
// it deleted (TrimmedNewest); the caller raises b.trimmedNewest to it once
// tx commits.
func (b *Bronze) trimIn(tx *bolt.Tx, cutoff int64, youngFrom uint64, over int64, limit int) (n int, freed, newest int64, err error) {
	n, freed, newest, err = b.trimTx(tx, b.checkpoint.Load(), cutoff, youngFrom, over, limit)
	if err == nil && newest > b.trimmedNewest.Load() {
		err = boltkv.PutUint(tx.Bucket(bucketMeta), keyTrimmed, uint64(newest))
	}
	return n, freed, newest, err
}

// TrimmedNewest is the newest received-at (Unix ns) among the records Trim
// deleted, 0 when none were or a build before it trimmed them. Stamps
// mostly rise with sequences, but not after the gateway's clock stepped
// back, so the oldest record left does not tell what the trimmed ones
// held (window.Replay's whole windows).
func (b *Bronze) TrimmedNewest() int64 { return b.trimmedNewest.Load() }

// trimTx deletes chunks from the oldest while all their records are
// checkpointed and either received before cutoff (unix ns) and before
// sequence youngFrom, or needed to free over bytes. A chunk goes whole: it
// may free more than over, and a chunk with a record past the checkpoint
// or the cutoff stays, older records and all. It stops once it deleted
// limit records or more.
func (b *Bronze) trimTx(tx *bolt.Tx, checkpoint uint64, cutoff int64, youngFrom uint64, over int64, limit int) (n int, freed, trimmedNewest int64, err error) {
	log := tx.Bucket(bucketLog)
	c := log.Cursor()
	for k, v := c.First(); k != nil && n < limit; k, v = c.First() {
		first := binary.BigEndian.Uint64(k)
		var count int
		var size, newest int64
		err := eachRecord(first, v, func(seq uint64, rec []byte) (bool, error) {
			// Frozen: only ReceivedAt is read, within the transaction, so
			// the topic need not be copied out of bbolt's map.
			r, err := decodeRecord(seq, rec, true)
			count++
			size += int64(8 + len(rec))
			newest = max(newest, r.ReceivedAt)
			return true, err
		})
		if err != nil {
			return n, freed, trimmedNewest, err
		}
		last := first + uint64(count) - 1
		if last > checkpoint || (freed >= over && (newest >= cutoff || last >= youngFrom)) {
			break
		}
		if err := c.Delete(); err != nil {
			return n, freed, trimmedNewest, fmt.Errorf("delete records %d-%d: %w", first, last, err)
		}
		n += count
		freed += size
		trimmedNewest = max(trimmedNewest, newest)
	}
	return n, freed, trimmedNewest, nil
}

func (b *Bronze) putMeta(tx *bolt.Tx, next uint64, records, bytes int64) error {
	m := tx.Bucket(bucketMeta)
	for _, kv := range []struct {
		k []byte
		v uint64
	}{{keyNext, next}, {keyRecords, uint64(records)}, {keyBytes, uint64(bytes)}} {
		if err := boltkv.PutUint(m, kv.k, kv.v); err != nil {
			return err
		}
	}
	return nil
}

// Stats describes the log's size and position.
type Stats struct {
	Records    int64
	Bytes      int64
	FirstSeq   uint64 // 0 when empty
	LastSeq    uint64
	Checkpoint uint64
	// Backlog is the number of records after the checkpoint.
	Backlog uint64
	// OldestAt is the oldest record's received-at (Unix ns), 0 when empty.
	OldestAt int64
	MaxBytes int64
	Full     bool
}

// Stats reads the log's size and position.
func (b *Bronze) Stats() (Stats, error) {
	b.mu.Lock()
	s := Stats{Records: b.records, Bytes: b.bytes, LastSeq: b.next - 1, Checkpoint: b.checkpoint.Load(), MaxBytes: b.opts.MaxBytes, Full: b.full.Load()}
	b.mu.Unlock()
	if s.LastSeq > s.Checkpoint {
		s.Backlog = s.LastSeq - s.Checkpoint
	}
	if b.closed.Load() {
		return s, ErrClosed
	}
	err := b.db.View(func(tx *bolt.Tx) error {
		log := tx.Bucket(bucketLog)
		if log == nil {
			return nil
		}
		k, v := log.Cursor().First()
		if k == nil {
			return nil
		}
		s.FirstSeq = binary.BigEndian.Uint64(k)
		return eachRecord(s.FirstSeq, v, func(seq uint64, rec []byte) (bool, error) {
			r, err := DecodeRecord(seq, rec)
			s.OldestAt = r.ReceivedAt
			return false, err
		})
	})
	return s, err
}

// DropMapped takes the log's file pages out of the process's resident set;
// see boltkv.DropMapped. It also reports a failed release of ReadInto's
// since the last call (when its own succeeds: it always tries).
func (b *Bronze) DropMapped() error {
	err := boltkv.DropMapped(b.db)
	if last := b.releaseErr.Swap(nil); last != nil && err == nil {
		err = fmt.Errorf("after a read: %w", *last)
	}
	return err
}
