package boltkv

import (
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestForgetAllocationsBoundsBboltsRecord runs an append-only log at a
// bound, as Bronze runs once full: every commit trims the oldest keys and
// appends as many, so its pages come from the freelist and bbolt records
// each one. Without ForgetAllocations the record holds every page of the
// log; with it, never more than maxAllocs and a few commits' worth. A
// reader held open through the first pass of the log keeps bbolt's release
// of pending pages on the path that reads the record (releaseRange), and
// the file must check clean at the end.
func TestForgetAllocationsBoundsBboltsRecord(t *testing.T) {
	defer func(n int) { maxAllocs = n }(maxAllocs)
	maxAllocs = 512
	for _, forget := range []bool{false, true} {
		db, err := Open(filepath.Join(t.TempDir(), "log.db"), 0o600, false, 4096)
		if err != nil {
			t.Fatal(err)
		}
		reader, err := db.Begin(false)
		if err != nil {
			t.Fatal(err)
		}
		val := make([]byte, 2000)
		const keep, perCommit = 12_000, 50
		var next, first uint64
		most := 0
		for range 1_000 {
			if reader != nil && next > 3*keep/2 {
				if err := reader.Rollback(); err != nil {
					t.Fatal(err)
				}
				reader = nil
			}
			err := db.Update(func(tx *bolt.Tx) error {
				if forget && !ForgetAllocations(tx) {
					t.Fatal("ForgetAllocations did not find bbolt's record of allocations: has bbolt's freelist changed?")
				}
				b, err := tx.CreateBucketIfNotExists([]byte("log"))
				if err != nil {
					return err
				}
				b.FillPercent = 1
				c := b.Cursor()
				for k, _ := c.First(); k != nil && next-first >= keep; k, _ = c.First() {
					if err := c.Delete(); err != nil {
						return err
					}
					first++
				}
				for range perCommit {
					if err := b.Put(Key(next), val); err != nil {
						return err
					}
					next++
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			m, ok := allocations(db)
			if !ok {
				t.Fatal("bbolt's record of allocations not found")
			}
			most = max(most, m.Len())
		}
		if forget && most > maxAllocs+4*perCommit {
			t.Errorf("with ForgetAllocations the record reached %d entries, want at most %d", most, maxAllocs+4*perCommit)
		}
		t.Logf("forget=%v: the record's largest size %d entries", forget, most)
		if !forget && most < keep/2 {
			t.Errorf("without ForgetAllocations the record reached only %d entries: the test no longer shows the growth it guards against", most)
		}
		err = db.View(func(tx *bolt.Tx) error {
			for err := range tx.Check() {
				return err
			}
			if n := tx.Bucket([]byte("log")).Stats().KeyN; uint64(n) != next-first {
				t.Errorf("log holds %d keys, want %d", n, next-first)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("forget=%v: %v", forget, err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
