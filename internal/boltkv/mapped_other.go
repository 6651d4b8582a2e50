//go:build !linux

package boltkv

import bolt "go.etcd.io/bbolt"

// DropMapped is a no-op where madvise is not used.
func DropMapped(db *bolt.DB) error { return nil }
