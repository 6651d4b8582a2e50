package uplink

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/testrig/natstest"
)

// The crash test re-executes the test binary as a child that runs an
// uplink; these variables switch it into that role.
const (
	envCrashChild = "EDGEAGENT_UPLINK_CRASH_CHILD"
	envCrashDB    = "EDGEAGENT_UPLINK_CRASH_DB"
	envCrashURL   = "EDGEAGENT_UPLINK_CRASH_URL"
)

func TestMain(m *testing.M) {
	if os.Getenv(envCrashChild) != "" {
		os.Exit(crashChild())
	}
	os.Exit(m.Run())
}

// crashChild runs an uplink until it is killed.
func crashChild() int {
	db, err := bolt.Open(os.Getenv(envCrashDB), 0o600, &bolt.Options{Timeout: 10 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: open db:", err)
		return 2
	}
	cfg := crashConfig(os.Getenv(envCrashURL))
	cfg.AckTimeout = time.Hour // the parent kills us while we wait
	cfg.Logger = testLogger()
	u, err := New(db, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: new:", err)
		return 2
	}
	if err := u.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "child: run:", err)
		return 2
	}
	return 0
}

func crashConfig(url string) Config {
	cfg := natsConfig(url)
	cfg.Gateway = testGateway
	cfg.MaxBatchRecords = 20
	// Slow enough that the parent can lose acks in the middle of the
	// drain, fast enough for a short test.
	cfg.MaxBytesPerSecond = 4 << 10
	return cfg
}

// published is a message as it crossed the server, resends included.
type published struct {
	id   string
	body []byte
}

// TestCrashBetweenSendAndAck kills (SIGKILL) a child process running the
// uplink while batches it sent are stored but unacknowledged — the proxy
// swallows the PubAcks — and then runs the uplink again on the same state
// database. The resent batches are byte-identical to the first sends (same
// Nats-Msg-Id, same body), the stream keeps each once, and nothing is lost.
func TestCrashBetweenSendAndAck(t *testing.T) {
	srv := startNATS(t, "in-process", 0)
	proxy := newProxy(t, srv.Addr())
	dbPath := filepath.Join(t.TempDir(), "state.db")
	fx := makeFixture(t, 20, 8)
	func() {
		db, err := bolt.Open(dbPath, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := db.Update(Init); err != nil {
			t.Fatal(err)
		}
		fill(t, db, fx.rows, 100)
		if err := db.Close(); err != nil { // the child takes the file lock
			t.Fatal(err)
		}
	}()

	// A core subscriber sees every publish, including the ones JetStream
	// deduplicates.
	var mu sync.Mutex
	var seen []published
	nc := natstest.Connect(t, srv.URL())
	if _, err := nc.Subscribe(testSubject, func(m *nats.Msg) {
		mu.Lock()
		seen = append(seen, published{m.Header.Get(jetstream.MsgIDHeader), append([]byte(nil), m.Data...)})
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}

	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), envCrashChild+"=1", envCrashDB+"="+dbPath, envCrashURL+"=nats://"+proxy.Addr())
	var stderr bytes.Buffer
	child.Stderr = &stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = child.Process.Kill()
			_ = child.Wait()
		}
	})
	waitFor(t, 20*time.Second, "the child's first batch", func() bool { return count() > 0 })
	proxy.DropServerToClient()
	n0 := count()
	waitFor(t, 20*time.Second, "two batches sent after the acks stopped coming", func() bool { return count() >= n0+2 })
	if err := child.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	_ = child.Wait()
	killed = true
	if child.ProcessState.Success() {
		t.Fatalf("child exited by itself: %s", stderr.String())
	}

	// What the child left: sealed batches, some of which the server holds.
	db := openDBAt(t, dbPath)
	var left []sealed
	if err := db.View(func(tx *bolt.Tx) error {
		var err error
		left, err = readSealed(tx, 0, 1<<20)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	firstSend := map[string][]byte{}
	for _, p := range seen {
		if _, ok := firstSend[p.id]; !ok {
			firstSend[p.id] = p.body
		}
	}
	mu.Unlock()
	var inFlight []string
	for _, s := range left {
		body, sent := firstSend[s.id]
		if !sent {
			continue
		}
		inFlight = append(inFlight, s.id)
		if !bytes.Equal(body, s.body) {
			t.Fatalf("batch %s: the stored body differs from what was sent", s.id)
		}
	}
	if len(inFlight) == 0 {
		t.Fatalf("no batch was between send and ack at the kill (%d sealed left, %d sends seen)", len(left), count())
	}

	proxy.Restore()
	cfg := crashConfig("nats://" + proxy.Addr())
	cfg.MaxBytesPerSecond = 0
	u := startUplink(t, db, cfg)
	waitFor(t, 30*time.Second, "the outbox and the sealed batches to drain", func() bool { return drained(t, db) })

	// Every resend is byte-identical to the first send of its id.
	mu.Lock()
	resent := map[string]int{}
	for _, p := range seen {
		if _, ok := firstSend[p.id]; !ok {
			firstSend[p.id] = p.body
		}
		if !bytes.Equal(p.body, firstSend[p.id]) {
			t.Errorf("batch %s was resent with different bytes", p.id)
		}
		resent[p.id]++
	}
	mu.Unlock()
	for _, id := range inFlight {
		if resent[id] < 2 {
			t.Errorf("in-flight batch %s was not resent after the restart", id)
		}
	}
	r := streamReceiver(t, srv.URL())
	r.check(t, fx.truth(t))
	if d := r.duplicateBatches(); len(d) > 0 {
		t.Errorf("the stream stored batches twice: %v", d)
	}
	if st := u.Stats(); st.Duplicates < uint64(len(inFlight)) {
		t.Errorf("%d in-flight batches, but only %d resends were deduplicated: %+v", len(inFlight), st.Duplicates, st)
	}
	checkOutboxLeft(t, db, fx.truth(t))
	t.Logf("%d batches were in flight at the kill; all resent byte-identical", len(inFlight))
}
