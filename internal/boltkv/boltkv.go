// Package boltkv holds the few bbolt encodings the stores share: big-endian
// sequence keys, which sort in numeric order, 8-byte counters, the arena
// their Put values are cut from, and the databases' options and opening.
package boltkv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Key returns seq as an 8-byte big-endian key. Each call returns new
// memory: bbolt keeps key slices until the transaction ends.
func Key(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq)
}

// Seq decodes a key made by Key.
func Seq(k []byte) uint64 { return binary.BigEndian.Uint64(k) }

// Uint reads an 8-byte counter; absent or malformed reads as 0.
func Uint(b *bolt.Bucket, k []byte) uint64 {
	v := b.Get(k)
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

// PutUint writes an 8-byte counter.
func PutUint(b *bolt.Bucket, k []byte, v uint64) error {
	if err := b.Put(k, Key(v)); err != nil {
		return fmt.Errorf("put %s: %w", k, err)
	}
	return nil
}

// AddInt adds delta to an 8-byte counter.
func AddInt(b *bolt.Bucket, k []byte, delta int64) error {
	return PutUint(b, k, uint64(int64(Uint(b, k))+delta))
}

// ErrDamaged marks a database file that bbolt cannot read: not a bbolt
// file, a bad checksum, or pages that are not what the file's structure
// says (bbolt panics on those while it rebuilds the freelist at open).
var ErrDamaged = errors.New("the file is damaged")

// Open opens the database at path with Options, reporting a damaged file
// as ErrDamaged instead of bbolt's panic or its bare format errors. A new
// file gets pages of pageSize bytes (0: the OS page size); an existing
// one keeps the size it was made with.
//
// A writable open of a file whose freelist is not stored (NoFreelistSync)
// makes bbolt walk every page to rebuild it, and a damaged page there
// panics in a goroutine of bbolt's, where no recover reaches: the process
// dies with a stack trace and restarts into the same panic. So an existing
// file is first walked here, read-only and under recover, through the same
// page reads; the walk costs about what bbolt's own costs, and the second
// one finds the pages in the page cache.
//
// Read-only opens (inspect, replay) walk too: their reads would meet the
// same panics. A file shorter than its meta page says is refused before
// any of it is mapped: reading a mapped page past the end of a file is a
// SIGBUS, which no recover catches. An empty file is left to bbolt, which
// initialises it.
func Open(path string, mode os.FileMode, readOnly bool, pageSize int) (*bolt.DB, error) {
	fi, err := os.Stat(path)
	if err == nil && fi.Size() == 0 && readOnly {
		// bbolt cannot initialise it read-only ("bad file descriptor").
		return nil, fmt.Errorf("%s is empty: nothing is stored in it yet (the agent initialises it at its start)", path)
	}
	if err == nil && fi.Size() > 0 {
		if err := checkLength(path, fi.Size()); err != nil {
			return nil, err
		}
		if err := walk(path); err != nil {
			return nil, err
		}
	}
	o := Options(readOnly)
	o.PageSize = pageSize
	return open(path, mode, o)
}

// checkLength compares the file's length with the page count its newest
// valid meta page records (bbolt's layout: two meta pages, each a 16-byte
// page header, then magic, version, page size, flags, root bucket (16),
// freelist page, page count, transaction id, and an FNV-64a checksum of
// the fields before it). The second meta page is one page in: with the
// first unreadable, its offset is searched as bbolt does, at every power
// of two from 1 KiB.
func checkLength(path string, size int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	const hdr, metaLen = 16, 64
	readMeta := func(off int64) (pageSize uint32, pages, txid uint64, ok bool) {
		b := make([]byte, hdr+metaLen)
		if _, err := f.ReadAt(b, off); err != nil {
			return 0, 0, 0, false
		}
		m := b[hdr:]
		h := fnv.New64a()
		h.Write(m[:56])
		if binary.LittleEndian.Uint32(m[0:]) != 0xED0CDAED || binary.LittleEndian.Uint64(m[56:]) != h.Sum64() {
			return 0, 0, 0, false
		}
		return binary.LittleEndian.Uint32(m[8:]), binary.LittleEndian.Uint64(m[40:]), binary.LittleEndian.Uint64(m[48:]), true
	}
	ps, pages, txid, ok0 := readMeta(0)
	var ps1 uint32
	var pages1, txid1 uint64
	ok1 := false
	if ok0 {
		ps1, pages1, txid1, ok1 = readMeta(int64(ps))
	} else {
		for off := int64(1024); off <= 16<<20 && off < size && !ok1; off <<= 1 {
			ps1, pages1, txid1, ok1 = readMeta(off)
			ok1 = ok1 && int64(ps1) == off
		}
	}
	switch {
	case !ok0 && !ok1:
		return fmt.Errorf("%w: no valid meta page (%d bytes)", ErrDamaged, size)
	case !ok0 || ok1 && txid1 > txid:
		ps, pages = ps1, pages1
	}
	if need := int64(pages) * int64(ps); size < need {
		return fmt.Errorf("%w: truncated: %d bytes, its pages need %d", ErrDamaged, size, need)
	}
	return nil
}

func open(path string, mode os.FileMode, o *bolt.Options) (db *bolt.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("%w: %v", ErrDamaged, r)
		}
	}()
	db, err = bolt.Open(path, mode, o)
	if errors.Is(err, berrors.ErrInvalid) || errors.Is(err, berrors.ErrChecksum) || errors.Is(err, berrors.ErrVersionMismatch) {
		return nil, fmt.Errorf("%w: %w", ErrDamaged, err)
	}
	return db, err
}

// walk reads every page of the file's tree (every bucket, key and value)
// in a read-only transaction, turning bbolt's panic on a damaged page into
// ErrDamaged.
func walk(path string) (err error) {
	db, err := open(path, 0, Options(true))
	if err != nil {
		return err
	}
	defer db.Close()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrDamaged, r)
		}
	}()
	// A damaged element can point past the file's end, inside the map:
	// reading it is a SIGBUS, which this makes a panic the recover above
	// turns into ErrDamaged.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	var w walker
	err = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(_ []byte, b *bolt.Bucket) error { return w.bucket(b) })
	})
	runtime.KeepAlive(w.last) // the reads that fill it must happen
	return err
}

// walker reads every key and value to its last byte, and checks that keys
// ascend: a writable open's own check (NoFreelistSync) compares keys in a
// goroutine of bbolt's, where a key past the file's end is a SIGBUS no
// recover reaches (an audit found it flipping single bits) and keys out of
// order are a panic.
type walker struct{ last byte }

func (w *walker) bucket(b *bolt.Bucket) error {
	c, search := b.Cursor(), b.Cursor()
	var prev []byte
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if prev != nil && bytes.Compare(prev, k) >= 0 {
			return fmt.Errorf("%w: keys out of order in a bucket", ErrDamaged)
		}
		// Iteration reads no branch page's keys; a search compares those
		// on its path, and a branch key is the first key of its child, so
		// seeking every key reads every one of them.
		if found, _ := search.Seek(k); !bytes.Equal(found, k) {
			return fmt.Errorf("%w: a key its bucket's search does not find", ErrDamaged)
		}
		prev = k
		w.last ^= k[len(k)-1]
		if len(v) > 0 {
			w.last ^= v[len(v)-1]
		}
		if v == nil {
			if nested := b.Bucket(k); nested != nil {
				if err := w.bucket(nested); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Options are the bbolt options of the agent's databases.
//
// InitialMmapSize reserves address space, not memory: bbolt grows its map
// by doubling, and each remap inside a write transaction copies every key
// and value the transaction has touched to the heap (node.dereference) —
// measured 48 MB of garbage in a 20 s load run, and the live-heap peaks
// that made the agent's RSS. The file still grows in AllocSize steps; only
// the pages touched count in RSS. 32-bit gateways get a smaller
// reservation out of their 3 GB of address space.
func Options(readOnly bool) *bolt.Options {
	mmap := 1 << 30
	if strconv.IntSize == 32 {
		mmap = 256 << 20
	}
	return &bolt.Options{Timeout: 2 * time.Second, ReadOnly: readOnly, FreelistType: bolt.FreelistMapType,
		NoFreelistSync: true, InitialMmapSize: mmap}
}

// Arena hands out the bytes of a transaction's keys and values, which bbolt
// keeps until the transaction ends — and of copies that must outlive a
// transaction. They are cut from 64 KiB chunks: a transaction of 100,000
// rows makes a few hundred allocations, and a chunk is never copied to grow
// (append's doubling would keep every outgrown copy alive as long as a
// slice of it). A slice cut keeps its whole chunk alive.
//
// An arena that serves one write transaction after another is Reset when
// a transaction begins: the chunks the last one filled are cut again
// instead of allocated (up to arenaKeep of them), which under load spares
// the collector a few hundred MB of allocations a minute.
type Arena struct {
	buf   []byte   // the chunk being cut
	full  [][]byte // the chunks cut before buf since the last Reset
	spare [][]byte // chunks to cut again
}

const (
	arenaChunk = 64 << 10
	// arenaKeep bounds what an idle arena keeps: a window batch's outbox
	// rows, or a checkpoint transaction's 256 KiB of rows.
	arenaKeep = 8
)

// Room returns the current chunk with at least n bytes free after its
// length, starting a new chunk if needed: append to it, then Cut. (A longer
// append is still cut correctly, only from a copy.)
func (a *Arena) Room(n int) []byte {
	if cap(a.buf)-len(a.buf) < n {
		if cap(a.buf) == arenaChunk {
			a.full = append(a.full, a.buf)
		}
		if k := len(a.spare); k > 0 && n <= arenaChunk {
			a.buf, a.spare[k-1] = a.spare[k-1][:0], nil
			a.spare = a.spare[:k-1]
		} else {
			a.buf = make([]byte, 0, max(arenaChunk, n))
		}
	}
	return a.buf
}

// Reset makes every chunk cut since the last Reset reusable. Nothing cut
// from them may be in use any more: no transaction that put them is open,
// and no copy made with them (outbox.ReadIn's) is still read.
func (a *Arena) Reset() {
	if cap(a.buf) == arenaChunk {
		a.full = append(a.full, a.buf)
	}
	for _, c := range a.full {
		if len(a.spare) == arenaKeep {
			break
		}
		a.spare = append(a.spare, c[:0])
	}
	clear(a.full)
	a.buf, a.full = nil, a.full[:0]
}

// Cut keeps grown (Room's chunk with bytes appended) and returns the
// appended bytes, capped so later appends cannot touch them.
func (a *Arena) Cut(grown []byte) []byte {
	v := grown[len(a.buf):len(grown):len(grown)]
	a.buf = grown
	return v
}
