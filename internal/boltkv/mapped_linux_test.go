package boltkv

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func mappedRSS(t *testing.T, path string) int {
	t.Helper()
	kib, err := MappedKiB(path)
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	return kib
}

func TestDropMappedReleasesPagesAndKeepsData(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	db, err := bolt.Open(path, 0o600, Options(false))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	val := bytes.Repeat([]byte("x"), 512)
	for batch := range 8 {
		err := db.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("b"))
			if err != nil {
				return err
			}
			for i := range 2000 {
				if err := b.Put(Key(uint64(batch*2000+i)), val); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	readAll := func() int {
		n := 0
		err := db.View(func(tx *bolt.Tx) error {
			return tx.Bucket([]byte("b")).ForEach(func(k, v []byte) error {
				if !bytes.Equal(v, val) {
					return fmt.Errorf("key %d: value changed", Seq(k))
				}
				n++
				return nil
			})
		})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	readAll()
	before := mappedRSS(t, path)
	if before < 4096 {
		t.Fatalf("reading 8 MB through the map left only %d KiB resident; the measurement does not work", before)
	}
	if err := DropMapped(db); err != nil {
		t.Fatal(err)
	}
	if after := mappedRSS(t, path); after > before/4 {
		t.Errorf("resident map of %s: %d KiB before DropMapped, %d KiB after", path, before, after)
	}
	if n := readAll(); n != 16000 {
		t.Errorf("read %d records after DropMapped, want 16000", n)
	}
}
