package agent

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/internal/boltkv"
)

// TestOpenReleasesWhatTheStartMapped: the start reads Bronze whole (the
// damage walk, bbolt's freelist rebuild), which maps it into the resident
// set; Open releases those pages before the agent runs (a 40 MB Bronze
// kept 12 MiB mapped until the first periodic release, the peak of an
// agent draining a backlog).
func TestOpenReleasesWhatTheStartMapped(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, BronzeFile)
	b, err := buffer.Open(path, buffer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	payload := bytes.Repeat([]byte("p"), 500)
	for range 160 { // about 10 MB
		recs := make([]buffer.Record, 100)
		for i := range recs {
			recs[i] = buffer.Record{Kind: buffer.KindMessage, Topic: "s/d1", Payload: payload}
		}
		if err := b.Append(recs); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	a, err := Open(filesTestConfig(t, dir, ""), Options{Logger: slog.New(slog.DiscardHandler), ConfigPath: "edgeagent.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	kib, err := boltkv.MappedKiB(path)
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	if kib > 1024 {
		t.Errorf("%d KiB of a 10 MB Bronze mapped after Open, want at most 1024", kib)
	}

	// And the executable's pages, which the start's init functions
	// mapped nearly whole.
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(exe)
	if err != nil {
		t.Fatal(err)
	}
	if kib, err = boltkv.MappedKiB(exe); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d KiB of the %d KiB executable resident after Open", kib, fi.Size()>>10)
	if kib > int(fi.Size()>>10)/2 {
		t.Errorf("%d KiB of the %d KiB executable resident after Open, want at most half (nearly all without the release)", kib, fi.Size()>>10)
	}
}
