package local

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
)

// TestPublisherDeliversInOrder publishes local rows through both sinks to a
// real broker: the embedded-style inline publish, and paho over TCP. A
// subscriber gets every message once, in outbox order, with its retain
// flag; the local rows are deleted and the uplink's rows are left alone.
func TestPublisherDeliversInOrder(t *testing.T) {
	for _, kind := range []string{"inline", "paho"} {
		t.Run(kind, func(t *testing.T) {
			srv, url := startInlineMochi(t)
			sub := subscribe(t, url, "sub-"+kind, "edgeagent/#")
			var sink Sink = SinkFunc(srv.Publish)
			if kind == "paho" {
				ps, err := NewPahoSink(PahoConfig{Broker: url, Gateway: "gw1", Logger: testLogger()})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { ps.Close() })
				sink = ps
			}
			db := openDB(t, "")
			msgs := numbered("edgeagent/gw1/alerts", 0, 300)
			msgs[5].Retain = true
			appendLocal(t, db, msgs[:150])
			p, err := New(db, Config{Gateway: "gw1", Sink: sink, Logger: testLogger()})
			if err != nil {
				t.Fatal(err)
			}
			runPublisher(t, p)
			appendLocal(t, db, msgs[150:]) // while it runs
			p.Notify()
			mqtttest.WaitFor(t, 20*time.Second, "300 messages", func() bool { return sub.count() >= 300 })
			got := sub.got()
			want := make([]string, len(msgs))
			for i, m := range msgs {
				want[i] = string(m.Payload)
			}
			if !slices.Equal(payloads(got), want) {
				t.Fatalf("payloads out of order or duplicated:\n got %v\nwant %v", payloads(got), want)
			}
			for i, m := range got {
				if m.Topic != msgs[i].Topic {
					t.Fatalf("message %d on %q, want %q", i, m.Topic, msgs[i].Topic)
				}
			}
			// A live subscriber gets a retained message with the flag
			// cleared (MQTT 3.1.1 §3.3.1.3); a new one gets it retained.
			late := subscribe(t, url, "late-"+kind, "edgeagent/gw1/alerts/1")
			mqtttest.WaitFor(t, 10*time.Second, "the retained message", func() bool { return late.count() >= 1 })
			if r := late.got()[0]; !r.Retain || r.Payload != string(msgs[5].Payload) {
				t.Fatalf("new subscriber got %+v, want retained %s", r, msgs[5].Payload)
			}
			mqtttest.WaitFor(t, 10*time.Second, "local rows deleted", func() bool { return rowsByKind(t, db)[outbox.KindLocal] == 0 })
			if n := rowsByKind(t, db)[outbox.KindAggregate]; n != 100 {
				t.Fatalf("%d aggregate rows left, want the 100 appended", n)
			}
			if st := p.Stats(); st.Published != 300 || st.Failures != 0 || st.Pending != 0 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// flakySink fails the first two attempts at every n-th message (never when
// every is 0) and records what it accepted.
type flakySink struct {
	mu       sync.Mutex
	every    int
	attempts map[string]int
	accepted []string
}

func (s *flakySink) Publish(topic string, payload []byte, retain bool, qos byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := string(payload)
	s.attempts[p]++
	var n int
	fmt.Sscanf(p, "m%d", &n)
	if s.every > 0 && n%s.every == 0 && s.attempts[p] < 3 {
		return errors.New("broker said no")
	}
	s.accepted = append(s.accepted, p)
	return nil
}

func (s *flakySink) snapshot() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.accepted)
}

// TestPublisherRetriesInOrder makes the sink refuse every tenth message
// twice: each is retried from the same row, nothing after it goes first,
// and nothing is published twice.
func TestPublisherRetriesInOrder(t *testing.T) {
	db := openDB(t, "")
	msgs := numbered("edgeagent/gw1/alerts", 1, 50)
	appendLocal(t, db, msgs)
	sink := &flakySink{every: 10, attempts: map[string]int{}}
	p, err := New(db, Config{Gateway: "gw1", Sink: sink, Logger: testLogger(), MaxBackoff: 10 * time.Millisecond, BatchRows: 7})
	if err != nil {
		t.Fatal(err)
	}
	runPublisher(t, p)
	mqtttest.WaitFor(t, 20*time.Second, "all accepted", func() bool { return len(sink.snapshot()) >= len(msgs) })
	want := make([]string, len(msgs))
	for i, m := range msgs {
		want[i] = string(m.Payload)
	}
	if got := sink.snapshot(); !slices.Equal(got, want) {
		t.Fatalf("accepted %v\nwant %v", got, want)
	}
	mqtttest.WaitFor(t, 10*time.Second, "rows deleted", func() bool { return rowsByKind(t, db)[outbox.KindLocal] == 0 })
	if st := p.Stats(); st.Failures != 10 || st.Published != 50 || st.LastError != "" {
		t.Fatalf("stats %+v, want 10 failures (5 messages × 2) and 50 published", st)
	}
}

// TestPublisherDropsCorruptRows deletes and counts a row it cannot decode
// and goes on with the next.
func TestPublisherDropsCorruptRows(t *testing.T) {
	db := openDB(t, "")
	appendLocal(t, db, numbered("a", 0, 2))
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := outbox.Append(tx, outbox.KindLocal, 1, []byte{7, 7, 7, 7})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	appendLocal(t, db, numbered("a", 2, 2))
	sink := &flakySink{every: 0, attempts: map[string]int{}}
	p, err := New(db, Config{Gateway: "gw1", Sink: sink, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	runPublisher(t, p)
	mqtttest.WaitFor(t, 10*time.Second, "rows gone", func() bool { return rowsByKind(t, db)[outbox.KindLocal] == 0 })
	if got := sink.snapshot(); !slices.Equal(got, []string{"m000000", "m000001", "m000002", "m000003"}) {
		t.Fatalf("accepted %v", got)
	}
	if st := p.Stats(); st.Rejected != 1 || st.Published != 4 {
		t.Fatalf("stats %+v, want 1 rejected and 4 published", st)
	}
}

// TestPublisherMosquittoOutage stops mosquitto under a running publisher:
// the rows queued meanwhile stay in the outbox and are retried; once the
// broker is back they are all delivered, in order.
func TestPublisherMosquittoOutage(t *testing.T) {
	// mqtttest runs mosquitto with persistence, so the subscriber's
	// session survives the restart.
	m := mqtttest.StartMosquitto(t, "")
	sub := subscribe(t, m.URL(), "sub-outage", "edgeagent/#")
	ps, err := NewPahoSink(PahoConfig{Broker: m.URL(), Gateway: "gw1", Logger: testLogger(),
		MaxReconnectInterval: 200 * time.Millisecond, PublishTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ps.Close() })
	db := openDB(t, "")
	p, err := New(db, Config{Gateway: "gw1", Sink: ps, Logger: testLogger(), MaxBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runPublisher(t, p)

	appendLocal(t, db, numbered("edgeagent/gw1/alerts", 0, 20))
	p.Notify()
	mqtttest.WaitFor(t, 20*time.Second, "first 20 delivered", func() bool { return sub.count() >= 20 })

	m.Stop()
	appendLocal(t, db, numbered("edgeagent/gw1/alerts", 20, 30))
	p.Notify()
	mqtttest.WaitFor(t, 20*time.Second, "failed attempts while down", func() bool { return p.Stats().Failures >= 3 })
	if n := rowsByKind(t, db)[outbox.KindLocal]; n != 30 {
		t.Fatalf("%d local rows in the outbox while the broker is down, want 30", n)
	}
	if st := p.Stats(); st.Pending != 30 || st.LastError == "" {
		t.Fatalf("stats while down: %+v", st)
	}

	m.Start()
	mqtttest.WaitFor(t, 30*time.Second, "rows drained after restart", func() bool { return rowsByKind(t, db)[outbox.KindLocal] == 0 })
	defer func() {
		if t.Failed() {
			t.Logf("mosquitto log:\n%s", m.Log())
		}
	}()
	mqtttest.WaitFor(t, 30*time.Second, "50 delivered", func() bool {
		if sub.count() >= 50 {
			return true
		}
		return false
	})
	// QoS 1 may deliver again what was in flight at the stop, on either
	// leg: the publisher's (a PUBACK lost) or the subscriber's (mosquitto
	// resends a range of unacknowledged messages from its saved session).
	// In the order of first arrival nothing may be missing or out of order.
	var got []string
	seen := map[string]bool{}
	for _, p := range payloads(sub.got()) {
		if !seen[p] {
			seen[p] = true
			got = append(got, p)
		}
	}
	want := payloads(nil)
	for _, m := range numbered("x", 0, 50) {
		want = append(want, string(m.Payload))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("delivered %v\nwant %v\nmosquitto log:\n%s", got, want, m.Log())
	}
}

// TestNotifyWakesThePublisher sets a poll interval of an hour: only Notify
// can make the row go out.
func TestNotifyWakesThePublisher(t *testing.T) {
	db := openDB(t, "")
	sink := &flakySink{every: 0, attempts: map[string]int{}}
	p, err := New(db, Config{Gateway: "gw1", Sink: sink, Logger: testLogger(), PollInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	runPublisher(t, p)
	// The first round finds the outbox empty and sleeps for the hour.
	mqtttest.WaitFor(t, 10*time.Second, "first round", func() bool { return p.Stats() == Stats{} })
	appendLocal(t, db, numbered("a", 0, 1))
	p.Notify()
	mqtttest.WaitFor(t, 10*time.Second, "notified publish", func() bool { return len(sink.snapshot()) == 1 })
}

func TestPublisherLifecycle(t *testing.T) {
	db := openDB(t, "")
	if _, err := New(db, Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New without a sink: %v, want ErrInvalidConfig", err)
	}
	if _, err := New(db, Config{Sink: SinkFunc(nil), BatchRows: -1}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New with negative batch rows: %v, want ErrInvalidConfig", err)
	}
	if _, err := NewPahoSink(PahoConfig{}); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("NewPahoSink without broker: %v, want ErrInvalidOption", err)
	}
	p, err := New(db, Config{Sink: &flakySink{every: 1, attempts: map[string]int{}}, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 2)
	go func() { errc <- p.Run(t.Context()) }()
	mqtttest.WaitFor(t, 10*time.Second, "run started", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.running
	})
	if err := p.Run(t.Context()); !errors.Is(err, ErrRunning) {
		t.Fatalf("second Run: %v, want ErrRunning", err)
	}
	p.Close()
	if err := <-errc; err != nil {
		t.Fatalf("Run after Close: %v", err)
	}
	p.Close() // twice is fine
	// Closed before Run: Run returns at once.
	q, err := New(db, Config{Sink: SinkFunc(nil)})
	if err != nil {
		t.Fatal(err)
	}
	q.Close()
	if err := q.Run(t.Context()); err != nil {
		t.Fatalf("Run after Close: %v", err)
	}
}

// TestPahoSinkNotConnected: a publish while the broker is unreachable fails
// at once instead of queueing in paho's memory.
func TestPahoSinkNotConnected(t *testing.T) {
	url := fmt.Sprintf("tcp://127.0.0.1:%d", mqtttest.FreePort(t))
	ps, err := NewPahoSink(PahoConfig{Broker: url, ClientID: "c1", Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	if err := ps.Publish("a", []byte("x"), false, 1); !errors.Is(err, ErrNotConnected) {
		t.Fatalf("publish while down: %v, want ErrNotConnected", err)
	}
	ps.Close()
	if err := ps.Publish("a", []byte("x"), false, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("publish after close: %v, want ErrClosed", err)
	}
}
