package outbox

import (
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/internal/boltkv"
)

// openBench opens an outbox in a state file of the benchmark's own, synced
// at each commit as the agent's is, and returns it with a row's data of
// size bytes.
func openBench(b *testing.B, size int) (*bolt.DB, []byte) {
	db, err := bolt.Open(filepath.Join(b.TempDir(), "state.db"), 0o600, boltkv.Options(false))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	if err := db.Update(Init); err != nil {
		b.Fatal(err)
	}
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i)
	}
	return db, data
}

// benchRows is how many rows one transaction appends or reads.
const benchRows = 10_000

// BenchmarkOutbox measures appending 10k rows of a typical aggregate's size
// in one write transaction, and reading them back in chunks of 1024 (as the
// sealer does) in one read transaction, on a real file.
func BenchmarkOutbox(b *testing.B) {
	db, data := openBench(b, 200)
	appendAll := func() {
		if err := db.Update(func(tx *bolt.Tx) error {
			for i := 0; i < benchRows; i++ {
				if _, err := Append(tx, KindAggregate, 1767225600000+int64(i), data); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	deleteAll := func() {
		if err := db.Update(func(tx *bolt.Tx) error {
			var seqs []uint64
			c := tx.Bucket(bucketRows).Cursor()
			for k, _ := c.First(); k != nil; k, _ = c.Next() {
				seqs = append(seqs, boltkv.Seq(k))
			}
			return Delete(tx, seqs...)
		}); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("append", func(b *testing.B) {
		for b.Loop() {
			appendAll()
			b.StopTimer()
			deleteAll()
			b.StartTimer()
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchRows), "ns/row")
	})
	b.Run("read", func(b *testing.B) {
		deleteAll() // the function runs more than once
		appendAll()
		for b.Loop() {
			n := 0
			if err := db.View(func(tx *bolt.Tx) error {
				for from := uint64(0); ; {
					es, err := Read(tx, from, 1024)
					if err != nil || len(es) == 0 {
						return err
					}
					n += len(es)
					from = es[len(es)-1].Seq + 1
				}
			}); err != nil {
				b.Fatal(err)
			}
			if n != benchRows {
				b.Fatalf("read %d rows, want %d", n, benchRows)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchRows), "ns/row")
	})
}

// BenchmarkOutboxCycle measures a row's whole stay in the outbox as load
// mode drives it: the window stage appends a batch's aggregates (1,700 of
// 230 bytes) in one transaction, the sealer reads them, and another
// transaction deletes them once they are sealed. The file is a real one,
// synced at each commit.
func BenchmarkOutboxCycle(b *testing.B) {
	const batch = 1700
	db, data := openBench(b, 230)
	var err error
	var arena, slab boltkv.Arena
	var entries []Entry
	seqs := make([]uint64, 0, batch)
	from := uint64(1)
	for b.Loop() {
		arena.Reset()
		if err := db.Update(func(tx *bolt.Tx) error {
			a, err := NewAppender(tx, &arena)
			if err != nil {
				return err
			}
			for i := range batch {
				if _, err := a.Append(KindAggregate, int64(i), data); err != nil {
					return err
				}
			}
			return a.Close()
		}); err != nil {
			b.Fatal(err)
		}
		seqs = seqs[:0]
		if err := db.View(func(tx *bolt.Tx) error {
			for len(seqs) < batch {
				slab.Reset()
				entries, err = ReadIn(tx, from, 1024, &slab, entries)
				if err != nil || len(entries) == 0 {
					return err
				}
				for _, e := range entries {
					seqs = append(seqs, e.Seq)
				}
				from = entries[len(entries)-1].Seq + 1
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		if len(seqs) != batch {
			b.Fatalf("read %d rows, want %d", len(seqs), batch)
		}
		if err := db.Update(func(tx *bolt.Tx) error { return Delete(tx, seqs...) }); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/row")
}
