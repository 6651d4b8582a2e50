package local

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
)

// The crash test re-executes the test binary as a child that runs a
// publisher; these variables switch it into that role.
const (
	envCrashChild = "EDGEAGENT_LOCAL_CRASH_CHILD"
	envCrashDB    = "EDGEAGENT_LOCAL_CRASH_DB"
	envCrashURL   = "EDGEAGENT_LOCAL_CRASH_URL"
)

// crashBatchRows bounds what a kill can make the next run publish again.
const crashBatchRows = 50

func TestMain(m *testing.M) {
	if os.Getenv(envCrashChild) != "" {
		os.Exit(crashChild())
	}
	os.Exit(m.Run())
}

// pacedSink spaces publishes so the parent's kill lands mid-drain.
type pacedSink struct {
	Sink
	every time.Duration
}

func (s pacedSink) Publish(topic string, payload []byte, retain bool, qos byte) error {
	time.Sleep(s.every) // pacing the child's output, not waiting on a condition
	return s.Sink.Publish(topic, payload, retain, qos)
}

// crashChild runs a publisher until it is killed.
func crashChild() int {
	db, err := bolt.Open(os.Getenv(envCrashDB), 0o600, &bolt.Options{Timeout: 10 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: open db:", err)
		return 2
	}
	ps, err := NewPahoSink(PahoConfig{Broker: os.Getenv(envCrashURL), Gateway: "gw1", Logger: testLogger()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: sink:", err)
		return 2
	}
	p, err := New(db, Config{Gateway: "gw1", Sink: pacedSink{ps, time.Millisecond}, Logger: testLogger(), BatchRows: crashBatchRows})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: new:", err)
		return 2
	}
	if err := p.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "child: run:", err)
		return 2
	}
	return 0
}

// TestCrashBetweenPublishAndDelete kills (SIGKILL) a child publishing local
// rows in the middle of its drain, then runs a publisher again on the same
// state database. Every message arrives, first occurrences in outbox order;
// the only duplicates are rows of the round the kill interrupted (published,
// not yet deleted), at most BatchRows of them.
func TestCrashBetweenPublishAndDelete(t *testing.T) {
	srv, url := startInlineMochi(t)
	sub := subscribe(t, url, "sub-crash", "edgeagent/#")
	path := filepath.Join(t.TempDir(), "state.db")
	const n = 1000
	msgs := numbered("edgeagent/gw1/alerts", 0, n)
	func() {
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		appendLocal(t, db, msgs)
	}()

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envCrashChild+"=1", envCrashDB+"="+path, envCrashURL+"="+url)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	mqtttest.WaitFor(t, 30*time.Second, "the child to publish 300", func() bool { return sub.count() >= 300 })
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	before := sub.count()
	if before >= n {
		t.Fatalf("the child published all %d before the kill; the test did not crash it mid-drain", before)
	}

	db := openDB(t, path)
	p, err := New(db, Config{Gateway: "gw1", Sink: SinkFunc(srv.Publish), Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	runPublisher(t, p)
	mqtttest.WaitFor(t, 30*time.Second, "the outbox to drain", func() bool { return rowsByKind(t, db)[outbox.KindLocal] == 0 })
	mqtttest.WaitFor(t, 30*time.Second, "every message", func() bool {
		seen := map[string]bool{}
		for _, p := range payloads(sub.got()) {
			seen[p] = true
		}
		return len(seen) == n
	})
	// A redelivery from the broker to the test's own subscriber (QoS 1
	// after a reconnect under load) is not a republish by the publisher:
	// it counts for the order of first occurrences, not against the bound
	// on republished rows below.
	all := sub.got()
	got, redelivered := 0, 0
	var first []string
	seen := map[string]bool{}
	for _, m := range all {
		if m.Redelivered {
			redelivered++
		} else {
			got++
		}
		if !seen[m.Payload] {
			seen[m.Payload] = true
			first = append(first, m.Payload)
		}
	}
	want := make([]string, n)
	for i, m := range msgs {
		want[i] = string(m.Payload)
	}
	if !slices.Equal(first, want) {
		t.Fatalf("first occurrences out of order:\n got %v\nwant %v", first, want)
	}
	dups := got - n
	if dups > crashBatchRows {
		t.Fatalf("%d duplicates, want at most the %d rows of one round", dups, crashBatchRows)
	}
	t.Logf("killed after %d messages; %d republished after the restart; %d broker redeliveries to the subscriber", before, dups, redelivered)
}
