package boltkv

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
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

// mappedPresent says whether the page of this process holding addr is
// mapped (/proc/self/pagemap bit 63).
func mappedPresent(t *testing.T, addr uintptr) bool {
	t.Helper()
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Skipf("no /proc/self/pagemap: %v", err)
	}
	defer f.Close()
	var e [8]byte
	if _, err := f.ReadAt(e[:], int64(addr/uintptr(os.Getpagesize()))*8); err != nil {
		t.Fatalf("pagemap entry of %#x: %v", addr, err)
	}
	return binary.LittleEndian.Uint64(e[:])&(1<<63) != 0
}

// TestDropMappedKeepsTheMetaPages: every transaction begins by reading
// both meta pages, so a drop leaves them mapped and drops the rest.
func TestDropMappedKeepsTheMetaPages(t *testing.T) {
	for _, pageSize := range []int{os.Getpagesize(), 32 << 10} {
		t.Run(fmt.Sprint(pageSize), func(t *testing.T) {
			opts := Options(false)
			opts.PageSize = pageSize
			db, err := bolt.Open(filepath.Join(t.TempDir(), "kv.db"), 0o600, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			val := bytes.Repeat([]byte("x"), 512)
			if err := db.Update(func(tx *bolt.Tx) error {
				b, err := tx.CreateBucket([]byte("b"))
				if err != nil {
					return err
				}
				for i := range 4000 {
					if err := b.Put(Key(uint64(i)), val); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			var last uintptr // the file's last page, a leaf the read touched
			if err := db.View(func(tx *bolt.Tx) error {
				last = db.Info().Data + uintptr(tx.Size()) - 1
				return tx.Bucket([]byte("b")).ForEach(func(k, v []byte) error { return nil })
			}); err != nil {
				t.Fatal(err)
			}
			base := db.Info().Data
			if !mappedPresent(t, base) || !mappedPresent(t, last) {
				// Under qemu-user the pagemap is the emulator's, at the
				// host's addresses (make test-armv7); natively a read
				// transaction maps both.
				t.Skip("/proc/self/pagemap shows pages a read transaction just touched as unmapped: it does not describe this process's mappings (an emulator's)")
			}
			if err := DropMapped(db); err != nil {
				t.Fatal(err)
			}
			for _, off := range []uintptr{0, uintptr(pageSize)} {
				if !mappedPresent(t, base+off) {
					t.Errorf("meta page at offset %d dropped", off)
				}
			}
			if mappedPresent(t, last) {
				t.Error("the file's last page is still mapped after DropMapped")
			}
		})
	}
}
