package boltkv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	bolt "go.etcd.io/bbolt"
)

func TestKeysSortNumerically(t *testing.T) {
	if !(bytes.Compare(Key(255), Key(256)) < 0 && bytes.Compare(Key(1), Key(1<<40)) < 0) {
		t.Fatal("keys do not sort in numeric order")
	}
	if Seq(Key(123456789)) != 123456789 {
		t.Fatal("Seq(Key(n)) != n")
	}
}

func TestCounters(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "kv.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("m"))
		if err != nil {
			return err
		}
		if Uint(b, []byte("n")) != 0 {
			t.Error("absent counter is not 0")
		}
		if err := AddInt(b, []byte("n"), 5); err != nil {
			return err
		}
		if err := AddInt(b, []byte("n"), -2); err != nil {
			return err
		}
		if got := Uint(b, []byte("n")); got != 3 {
			t.Errorf("counter = %d, want 3", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Cuts keep their bytes whatever is cut after them, across chunks and for
// appends longer than the room asked for.
func TestArenaCutsStayIntact(t *testing.T) {
	var a Arena
	var cuts [][]byte
	for i := range 3000 {
		n := i % 50
		room := n
		if i%7 == 0 {
			room = 1 // asked for less than it appends
		}
		cuts = append(cuts, a.Cut(append(a.Room(room), bytes.Repeat([]byte{byte(i)}, n)...)))
	}
	for i, c := range cuts {
		if len(c) != i%50 || cap(c) != len(c) || (len(c) > 0 && !bytes.Equal(c, bytes.Repeat([]byte{byte(i)}, len(c)))) {
			t.Fatalf("cut %d: %v (cap %d)", i, c, cap(c))
		}
	}
}

// After a Reset the arena cuts the chunks it filled again, up to
// arenaKeep of them, and cuts made after it stay intact.
func TestArenaResetReusesChunks(t *testing.T) {
	var a Arena
	fill := func(chunks int, b byte) [][]byte {
		var cuts [][]byte
		for range chunks * 64 {
			cuts = append(cuts, a.Cut(append(a.Room(1000), bytes.Repeat([]byte{b}, 1000)...)))
		}
		return cuts
	}
	first := fill(2*arenaKeep, 1)
	chunkOf := func(c []byte) *byte { return unsafe.SliceData(c[:1]) }
	starts := map[*byte]bool{}
	for _, c := range first {
		starts[chunkOf(c)] = true
	}
	a.Reset()
	second := fill(2*arenaKeep, 2)
	reused := 0
	for _, c := range second {
		if starts[chunkOf(c)] {
			reused++
		}
		if !bytes.Equal(c, bytes.Repeat([]byte{2}, 1000)) {
			t.Fatalf("a cut after Reset changed: %v", c[:8])
		}
	}
	// Cuts of 1000 bytes land at the same offsets of a reused chunk as
	// of the chunk the first time.
	if want := arenaKeep * (arenaChunk / 1000); reused != want {
		t.Fatalf("%d of %d cuts in reused chunks, want %d (arenaKeep chunks)", reused, len(second), want)
	}
	if n := len(a.spare); n != 0 {
		t.Fatalf("%d spare chunks left after cutting more than were kept", n)
	}
}

// TestOpenReportsDamage: a file with damaged tree pages, or damaged meta
// pages, opens as ErrDamaged, never a panic (which bbolt raises in a
// goroutine of its own while rebuilding the freelist of a writable open).
func TestOpenReportsDamage(t *testing.T) {
	for _, tc := range []struct {
		name     string
		from, to int // pages overwritten
	}{{"tree pages", 2, 40}, {"meta pages", 0, 2}} {
		for _, size := range testPageSizes {
			t.Run(fmt.Sprintf("%s/%d-byte pages", tc.name, size), func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "kv.db")
				pageSize := writeLog(t, path, size)
				db, err := Open(path, 0o600, false, 0)
				if err != nil {
					t.Fatalf("a sound file: %v", err)
				}
				db.Close()
				overwritePages(t, path, pageSize, tc.from, tc.to)
				for _, readOnly := range []bool{false, true} {
					if _, err := Open(path, 0o600, readOnly, 0); !errors.Is(err, ErrDamaged) {
						t.Errorf("read-only %v: Open = %v, want ErrDamaged", readOnly, err)
					}
				}
			})
		}
	}
}

// testPageSizes are the page sizes the opening tests cover: the OS's
// (Bronze's) and the state database's larger ones.
var testPageSizes = []int{0, 32 << 10}

// overwritePages overwrites pages [from, to) of the file at path with junk.
func overwritePages(t *testing.T, path string, pageSize, from, to int) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	junk := bytes.Repeat([]byte{0xA5, 0x17, 0x3C}, (to-from)*pageSize/3+1)
	if _, err := f.WriteAt(junk[:(to-from)*pageSize], int64(from*pageSize)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestOpenWithOneMetaPage: with its first meta page damaged, a file opens
// from the second, which lies one page in, whatever the page size (bbolt
// searches for it; the length check before bbolt must find it too).
func TestOpenWithOneMetaPage(t *testing.T) {
	for _, size := range testPageSizes {
		t.Run(fmt.Sprintf("%d-byte pages", size), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kv.db")
			pageSize := writeLog(t, path, size)
			// bbolt writes transaction n's meta to page n%2: the newest
			// goes to the second page, so the damage loses nothing.
			db, err := Open(path, 0o600, false, 0)
			if err != nil {
				t.Fatal(err)
			}
			for odd := false; !odd && err == nil; {
				err = db.Update(func(tx *bolt.Tx) error {
					odd = tx.ID()%2 == 1
					return tx.Bucket([]byte("log")).Put([]byte("newest"), []byte{1})
				})
			}
			if cerr := db.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}
			overwritePages(t, path, pageSize, 0, 1)
			for _, readOnly := range []bool{true, false} {
				db, err = Open(path, 0o600, readOnly, 0)
				if err != nil {
					t.Fatalf("read-only %v: Open = %v, want the file opened from its second meta page", readOnly, err)
				}
				err = db.View(func(tx *bolt.Tx) error {
					if n := tx.Bucket([]byte("log")).Stats().KeyN; n != 20_001 {
						return fmt.Errorf("%d rows, want 20001", n)
					}
					return nil
				})
				if cerr := db.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					t.Fatalf("read-only %v: %v", readOnly, err)
				}
			}
		})
	}
}

// TestOpenPageSize: a new file gets the page size asked for; an existing
// one keeps its own, so a state file made before the state's larger pages
// opens as it is.
func TestOpenPageSize(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	if got := writeLog(t, path, 16<<10); got != 16<<10 {
		t.Fatalf("a new file asked for 16 KiB pages has %d-byte pages", got)
	}
	old := filepath.Join(t.TempDir(), "old.db")
	want := writeLog(t, old, 0)
	if want != os.Getpagesize() {
		t.Fatalf("a new file at the default has %d-byte pages, want the OS's %d", want, os.Getpagesize())
	}
	db, err := Open(old, 0o600, false, 16<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if got := db.Info().PageSize; got != want {
		t.Errorf("an existing file opened asking for 16 KiB pages has %d-byte pages, want its own %d", got, want)
	}
	err = db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("log")).Put(Key(1<<40), []byte("more")) })
	if err != nil {
		t.Fatalf("writing to it: %v", err)
	}
}

// TestOpenReportsDamagedElements: a leaf element whose key lies past the
// file's end (a flipped bit in its offset; an audit found one that made
// bbolt's own check SIGBUS the agent at a writable open) and keys out of
// order open as ErrDamaged.
func TestOpenReportsDamagedElements(t *testing.T) {
	for _, tc := range []struct {
		name string
		// damage changes page; pastEnd is an element 0 pos that points a
		// page past the file's end.
		damage func(page []byte, pastEnd uint32)
	}{
		{"key past the end", func(page []byte, pastEnd uint32) {
			binary.LittleEndian.PutUint32(page[16+4:], pastEnd) // element 0's pos
		}},
		{"branch key past the end", nil},
		{"keys out of order", func(page []byte, _ uint32) {
			// Element 1's key is element 0's (pos is from the element).
			pos0, ksize0 := binary.LittleEndian.Uint32(page[16+4:]), binary.LittleEndian.Uint32(page[16+8:])
			binary.LittleEndian.PutUint32(page[32+4:], pos0-16)
			binary.LittleEndian.PutUint32(page[32+8:], ksize0)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kv.db")
			pageSize := writeLog(t, path, 0)
			// A leaf page in use (bbolt says which are free).
			leaf := -1
			db, err := bolt.Open(path, 0o600, Options(false))
			if err != nil {
				t.Fatal(err)
			}
			err = db.View(func(tx *bolt.Tx) error {
				for id := 2; leaf < 0 && id < int(tx.Size())/pageSize; id++ {
					p, err := tx.Page(id)
					if err != nil {
						return err
					}
					want := "leaf"
					if tc.damage == nil {
						want = "branch"
					}
					if p != nil && p.Type == want && p.Count > 2 {
						leaf = id
					}
				}
				return nil
			})
			if cerr := db.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}
			if leaf < 0 {
				t.Fatal("no leaf page with several keys")
			}
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			pastEnd := uint32(len(data) - (leaf*pageSize + 16) + pageSize)
			if tc.damage == nil {
				// A branch element: pos, ksize, pgid; its key past the end.
				binary.LittleEndian.PutUint32(data[leaf*pageSize+16:], pastEnd)
			} else {
				tc.damage(data[leaf*pageSize:(leaf+1)*pageSize], pastEnd)
			}
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			for _, readOnly := range []bool{true, false} {
				db, err := Open(path, 0o600, readOnly, 0)
				if !errors.Is(err, ErrDamaged) {
					t.Errorf("read-only %v: Open = %v, want ErrDamaged", readOnly, err)
				}
				if db != nil {
					db.Close()
				}
			}
		})
	}
}

// TestOpenTruncated: a file cut short (a copy interrupted, a full disk) is
// ErrDamaged before anything is mapped — reading a mapped page past the
// end of a file is a SIGBUS no recover catches — and an empty file is
// initialised as a new database.
func TestOpenTruncated(t *testing.T) {
	for _, size := range testPageSizes {
		t.Run(fmt.Sprintf("%d-byte pages", size), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kv.db")
			pageSize := writeLog(t, path, size)
			for _, length := range []int64{int64(pageSize), int64(4 * pageSize), 100_000} {
				if err := os.Truncate(path, length); err != nil {
					t.Fatal(err)
				}
				for _, readOnly := range []bool{false, true} {
					if _, err := Open(path, 0o600, readOnly, 0); !errors.Is(err, ErrDamaged) {
						t.Errorf("truncated to %d bytes, read-only %v: Open = %v, want ErrDamaged", length, readOnly, err)
					}
				}
			}
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
			db, err := Open(path, 0o600, false, size)
			if err != nil {
				t.Fatalf("an empty file: %v", err)
			}
			db.Close()
		})
	}
}

// writeLog writes a database at path, with pages of pageSize bytes (0:
// the OS's), with a bucket of 20,000 rows (a few hundred pages) and
// returns its page size.
func writeLog(t *testing.T, path string, pageSize int) int {
	t.Helper()
	db, err := Open(path, 0o600, false, pageSize)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("log"))
		if err != nil {
			return err
		}
		for i := range uint64(20_000) {
			if err := b.Put(Key(i), bytes.Repeat([]byte{byte(i)}, 40)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	size := db.Info().PageSize
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return size
}
