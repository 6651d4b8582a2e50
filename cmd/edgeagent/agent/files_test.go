package agent

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/config"
	"github.com/edgeagent/edgeagent/window"
)

// filesTestConfig is an agent's config with its data in dataDir and no
// status endpoint: the default, 127.0.0.1:9464, would answer another
// package's test that runs at the same time (one ran `inspect` against it
// and read this package's 100 rows instead of its own empty files).
func filesTestConfig(t *testing.T, dataDir, extra string) *config.Config {
	t.Helper()
	yaml := fmt.Sprintf(`gateway_id: gw-files
data_dir: %q
mqtt:
  broker: tcp://127.0.0.1:1883
  subscriptions:
    - {topic: "s/{device}", format: json}
readings: {event_id: id, event_time: ts}
status: {listen: ""}
%s`, dataDir, extra)
	cfg, err := config.Parse("edgeagent.yaml", []byte(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestReloadKeepsFiles: an agent's data files handed on with Detach stay
// open through its Close; an Open with them that fails leaves them open
// for the caller; one that succeeds uses them and closes them.
func TestReloadKeepsFiles(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Logger: slog.New(slog.DiscardHandler), ConfigPath: "edgeagent.yaml"}
	first, err := Open(filesTestConfig(t, dir, ""), opts)
	if err != nil {
		t.Fatal(err)
	}
	files := first.Detach()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	usable := func(when string) error {
		if err := files.Bronze.Append([]buffer.Record{{Kind: buffer.KindMessage, ReceivedAt: time.Now().UnixNano(), Topic: "s/d1", Payload: []byte(`{}`)}}); err != nil {
			return fmt.Errorf("%s: append to Bronze: %w", when, err)
		}
		if err := files.State.Update(func(*bolt.Tx) error { return nil }); err != nil {
			return fmt.Errorf("%s: write the state database: %w", when, err)
		}
		return nil
	}
	if err := usable("after Detach and Close"); err != nil {
		t.Fatal(err)
	}

	opts.Files = files
	if _, err := Open(filesTestConfig(t, dir, "window: {size: 5m}\n"), opts); err == nil {
		t.Fatal("Open with a window size the saved state refuses succeeded")
	}
	if err := usable("after a failed Open"); err != nil {
		t.Fatal(err)
	}

	second, err := Open(filesTestConfig(t, dir, ""), opts)
	if err != nil {
		t.Fatal(err)
	}
	if second.Bronze != files.Bronze || second.State != files.State {
		t.Fatal("Open with Files opened the files again")
	}
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	if err := usable("after the owner's Close"); err == nil {
		t.Fatal("the files stayed open after the agent that owned them closed")
	}
}

// TestReloadDoesNotShareFilesWithAStraggler: when Run gives up waiting for
// a stage to stop, that stage may still write to the files, so Detach
// hands none on and Close closes them (found by a review: two window
// stages had shared one state database after a slow stop).
func TestReloadDoesNotShareFilesWithAStraggler(t *testing.T) {
	dir := t.TempDir()
	a, err := Open(filesTestConfig(t, dir, ""), Options{Logger: slog.New(slog.DiscardHandler), ConfigPath: "edgeagent.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	a.stopWait = 100 * time.Millisecond
	var recs []buffer.Record
	for i := range 100 {
		recs = append(recs, buffer.Record{Kind: buffer.KindMessage, ReceivedAt: time.Now().UnixNano(), Topic: "s/d1",
			Payload: fmt.Appendf(nil, `{"id":"%d","ts":%d,"t":1}`, i, time.Now().UnixMilli())})
	}
	if err := a.Bronze.Append(recs); err != nil {
		t.Fatal(err)
	}
	// A write transaction held here keeps the window stage's commit, and
	// so the stage, from stopping: a disk that stalls.
	tx, err := a.State.Begin(true)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- a.Run(ctx) }()
	// Stop once the stage waits for the transaction.
	deadline := time.Now().Add(10 * time.Second)
	for !blockedInWriteTx() {
		if time.Now().After(deadline) {
			t.Fatal("the window stage never waited for a write transaction")
		}
		runtime.Gosched()
	}
	cancel()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if !a.stragglers {
		t.Fatal("Run waited for every stage although one was blocked")
	}
	if f := a.Detach(); f != nil {
		t.Fatal("Detach handed on files a stage that did not stop may still write to")
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Bronze.Append(recs[:1]); err == nil {
		t.Fatal("Close left Bronze open after a Detach that kept it")
	}
}

// blockedInWriteTx says whether the window stage waits to begin a bbolt
// write transaction.
func blockedInWriteTx() bool {
	buf := make([]byte, 1<<20)
	for _, g := range bytes.Split(buf[:runtime.Stack(buf, true)], []byte("\n\n")) {
		if bytes.Contains(g, []byte("bbolt.(*DB).beginRWTx")) && bytes.Contains(g, []byte("window.(*Stage)")) {
			return true
		}
	}
	return false
}

// TestStateFilePageSizes: a new state file gets the window stage's large
// pages and Bronze the OS's; a state file made with other pages (an older
// build's) opens with its own and keeps them.
func TestStateFilePageSizes(t *testing.T) {
	dir := t.TempDir()
	db, err := OpenState(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := db.Info().PageSize; got != window.StatePageSize {
		t.Errorf("a new state file has %d-byte pages, want %d", got, window.StatePageSize)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := buffer.Open(filepath.Join(dir, BronzeFile), buffer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	bdb, err := bolt.Open(filepath.Join(dir, BronzeFile), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := bdb.Info().PageSize; got != os.Getpagesize() {
		t.Errorf("Bronze has %d-byte pages, want the OS's %d", got, os.Getpagesize())
	}
	bdb.Close()

	old := t.TempDir()
	odb, err := bolt.Open(filepath.Join(old, StateFile), 0o600, &bolt.Options{PageSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if err := odb.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = OpenState(old, false)
	if err != nil {
		t.Fatalf("a state file with 4 KiB pages: %v", err)
	}
	defer db.Close()
	if got := db.Info().PageSize; got != 4096 {
		t.Errorf("a state file made with 4 KiB pages opens with %d-byte pages", got)
	}
}
