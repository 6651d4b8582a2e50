// Package boltkv holds the few bbolt encodings the stores share: big-endian
// sequence keys, which sort in numeric order, 8-byte counters, the arena
// their Put values are cut from, and the databases' options.
package boltkv

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"
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
// keeps until the transaction ends, so none is ever reused — and of copies
// that must outlive a transaction. They are cut from 64 KiB chunks: a
// transaction of 100,000 rows makes a few hundred allocations, and a chunk
// is never copied to grow (append's doubling would keep every outgrown copy
// alive as long as a slice of it). A slice cut keeps its whole chunk alive.
type Arena struct{ buf []byte }

const arenaChunk = 64 << 10

// Room returns the current chunk with at least n bytes free after its
// length, starting a new chunk if needed: append to it, then Cut. (A longer
// append is still cut correctly, only from a copy.)
func (a *Arena) Room(n int) []byte {
	if cap(a.buf)-len(a.buf) < n {
		a.buf = make([]byte, 0, max(arenaChunk, n))
	}
	return a.buf
}

// Cut keeps grown (Room's chunk with bytes appended) and returns the
// appended bytes, capped so later appends cannot touch them.
func (a *Arena) Cut(grown []byte) []byte {
	v := grown[len(a.buf):len(grown):len(grown)]
	a.buf = grown
	return v
}
