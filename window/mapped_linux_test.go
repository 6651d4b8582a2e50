package window

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"log/slog"
	"testing"

	"github.com/edgeagent/edgeagent/internal/boltkv"
	bolt "go.etcd.io/bbolt"
)

// TestCheckpointReleasesMappedPagesAfterEachTransaction: a transaction of
// a checkpoint reads each group row's old version first, and the kernel
// maps 64 KiB around every page read. The writer releases the mapped pages
// when the transaction commits, not inside it (chunkNodes bounds what one
// transaction reads; releasing every 32 KiB of rows cost about 1 s of CPU
// per million readings in load mode for no lower peak, session 53), and
// what the next transaction reads is unchanged.
func TestCheckpointReleasesMappedPagesAfterEachTransaction(t *testing.T) {
	db := openDB(t, "", true)
	value := bytes.Repeat([]byte("v"), 500)
	err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("rows"))
		if err != nil {
			return err
		}
		for i := range 20_000 { // about 10 MB
			key := binary.BigEndian.AppendUint32(nil, uint32(i))
			if err := b.Put(key, append(key, value...)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := boltkv.DropMapped(db); err != nil {
		t.Fatal(err)
	}
	w := &chunkWriter{db: db, log: slog.New(slog.DiscardHandler), ar: &boltkv.Arena{}}
	if err := w.begin(); err != nil {
		t.Fatal(err)
	}
	defer w.abort()
	readAll := func() uint32 {
		h := crc32.NewIEEE()
		if err := w.tx.Bucket([]byte("rows")).ForEach(func(k, v []byte) error {
			h.Write(v)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return h.Sum32()
	}
	sum := readAll()
	before, err := boltkv.MappedKiB(db.Path())
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	if before < 4096 {
		t.Skipf("reading 10 MB through the map left %d KiB mapped: pages are not mapped here as on Linux (an emulator?)", before)
	}
	if err := w.wrote(32 << 10); err != nil { // within the transaction: no release
		t.Fatal(err)
	}
	if kib, _ := boltkv.MappedKiB(db.Path()); kib < before/2 {
		t.Errorf("%d KiB mapped after 32 KiB of rows, %d before: released inside the transaction", kib, before)
	}
	chunks := w.chunks
	if err := w.wrote(chunkBytes); err != nil { // past chunkBytes: commits, releases, begins the next
		t.Fatal(err)
	}
	if w.chunks != chunks+1 {
		t.Fatalf("chunkBytes of rows began %d transactions, want 1", w.chunks-chunks)
	}
	after, err := boltkv.MappedKiB(db.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d KiB of the state file mapped before, %d after the transaction's commit", before, after)
	if after > 256 {
		t.Errorf("%d KiB mapped after the transaction's commit (%d before), want at most 256", after, before)
	}
	if got := readAll(); got != sum {
		t.Errorf("the next transaction read %08x, %08x before the release", got, sum)
	}
}
