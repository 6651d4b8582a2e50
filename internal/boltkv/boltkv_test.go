package boltkv

import (
	"bytes"
	"path/filepath"
	"testing"

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
