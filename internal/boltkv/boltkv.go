// Package boltkv holds the few bbolt encodings the stores share: big-endian
// sequence keys, which sort in numeric order, and 8-byte counters.
package boltkv

import (
	"encoding/binary"
	"fmt"

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
