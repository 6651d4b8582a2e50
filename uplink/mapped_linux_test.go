package uplink

import (
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/internal/boltkv"
)

// TestSealingReleasesMappedPages: a sealing round reads its rows through
// bbolt's map, and the kernel maps their cached neighbours too; the rounds
// take those pages out of the resident set again, read and write alike, so
// a backlog's rows do not sit in the agent's RSS between its periodic drops
// (which this test does not run).
func TestSealingReleasesMappedPages(t *testing.T) {
	db := openDB(t)
	fx := makeFixture(t, 100, 20)
	fill(t, db, fx.rows, 500)
	// Read through the map, as a round does.
	if err := db.View(func(tx *bolt.Tx) error {
		_, err := outbox.Read(tx, 0, 1<<30)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	before, err := boltkv.MappedKiB(db.Path())
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	if before < 1024 {
		t.Skipf("reading %d rows left %d KiB of the file mapped: pages are not mapped here as on Linux (an emulator?)", len(fx.rows), before)
	}
	// The link stays down (nothing listens there), so only full batches
	// are sealed: all of them, and the rest waits.
	cfg := natsConfig("nats://127.0.0.1:1")
	cfg.MaxBatchRecords = 100
	s := startUplink(t, db, cfg)
	full := uint64((fx.aggs + fx.alerts) / cfg.MaxBatchRecords)
	waitFor(t, 30*time.Second, "every full batch sealed", func() bool { return s.Stats().SealedBatches == full })
	var after int
	waitFor(t, 10*time.Second, "the state file's pages released", func() bool {
		after, err = boltkv.MappedKiB(db.Path())
		if err != nil {
			t.Fatal(err)
		}
		return after <= 256
	})
	t.Logf("%d KiB of the state file mapped after reading %d rows, %d after sealing %d batches", before, len(fx.rows), after, full)
}
