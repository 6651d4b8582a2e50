package buffer

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/edgeagent/edgeagent/internal/boltkv"
)

// TestCatchUpReadsReleaseMappedPages: a window stage catching up reads the
// log through bbolt's map as fast as it is written; ReadInto releases the
// pages it read every releaseAfterRead bytes, so they do not pile up in the
// resident set between the agent's periodic releases (11 MiB of a 36 MiB
// peak while an agent drained a broker's backlog).
func TestCatchUpReadsReleaseMappedPages(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bronze.db")
	b, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	payload := bytes.Repeat([]byte("p"), 500)
	for range 200 { // about 12 MB, far past the in-memory tail
		recs := make([]Record, 100)
		for i := range recs {
			recs[i] = Record{Kind: KindMessage, Topic: "sensors/d/telemetry", QoS: 1, Payload: payload}
		}
		if err := b.Append(recs); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.DropMapped(); err != nil {
		t.Fatal(err)
	}
	var recs []Record
	read, peak := 0, 0
	for from := uint64(1); ; {
		if recs, err = b.ReadInto(recs, from, 1000); err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			break
		}
		from = recs[len(recs)-1].Seq + 1
		read += len(recs)
		kib, err := boltkv.MappedKiB(path)
		if err != nil {
			t.Skipf("no /proc/self/smaps: %v", err)
		}
		peak = max(peak, kib)
	}
	if read != 20_000 {
		t.Fatalf("read %d records, want 20000", read)
	}
	// A batch of 1000 records is about 0.5 MB, releaseAfterRead's size:
	// the pages of a batch or two, and the kernel's fault-around, stay
	// mapped.
	if limit := 3 * releaseAfterRead >> 10; peak > limit {
		t.Errorf("%d KiB of the log mapped at most while reading it through, want at most %d", peak, limit)
	}
}
