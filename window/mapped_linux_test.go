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

// TestCheckpointReleasesMappedPagesWithinATransaction: a transaction of a
// checkpoint writes chunkBytes of group rows, each read first, one leaf page
// apart, and the kernel maps 64 KiB around every page read; in load mode one
// transaction mapped 13-16 MiB of the state file. The writer releases the
// mapped pages every 32 KiB of rows, inside the transaction, and what the
// transaction reads afterwards is unchanged.
func TestCheckpointReleasesMappedPagesWithinATransaction(t *testing.T) {
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
	if err := w.wrote(16 << 10); err != nil { // half of 32 KiB: no release yet
		t.Fatal(err)
	}
	if kib, _ := boltkv.MappedKiB(db.Path()); kib < before/2 {
		t.Errorf("%d KiB mapped after 16 KiB of rows, %d before: released too early", kib, before)
	}
	if err := w.wrote(16 << 10); err != nil {
		t.Fatal(err)
	}
	after, err := boltkv.MappedKiB(db.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d KiB of the state file mapped before, %d after 32 KiB of rows", before, after)
	if after > 256 {
		t.Errorf("%d KiB mapped after 32 KiB of rows (%d before), want at most 256", after, before)
	}
	if got := readAll(); got != sum {
		t.Errorf("the transaction read %08x after the release, %08x before", got, sum)
	}
}
