package boltkv

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// mappedRSS is the resident size in KiB of this process's maps of path,
// from /proc/self/smaps.
func mappedRSS(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	defer f.Close()
	total, in := 0, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) >= 5 && strings.Contains(fields[0], "-") {
			in = len(fields) >= 6 && fields[5] == path
			continue
		}
		if in && fields[0] == "Rss:" {
			kb, err := strconv.Atoi(fields[1])
			if err != nil {
				t.Fatalf("smaps line %q: %v", line, err)
			}
			total += kb
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return total
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
