package ingest

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/testrig/faultproxy"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
	"github.com/edgeagent/edgeagent/testrig/servers"
)

// messageRecords counts every message record in Bronze, duplicates included.
func messageRecords(t testing.TB, b *buffer.Bronze) int {
	t.Helper()
	n := 0
	if err := b.Scan(1, func(r buffer.Record) bool {
		if r.Kind == buffer.KindMessage {
			n++
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// The agent writes QoS1 PUBACKs itself, into the connection each message
// arrived on. Acknowledgements whose connection died while their commit
// was open are dropped, the broker redelivers on the next connection, and
// those copies are acknowledged there: a later session gets nothing again.
func TestPubacksFollowTheirConnection(t *testing.T) {
	mosq := mqtttest.StartMosquitto(t, "")
	proxy, err := faultproxy.New(mosq.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })

	var holdNext, holding atomic.Bool
	release := make(chan struct{})
	b := openBronze(t, buffer.Options{BeforeCommit: func() error {
		if holdNext.CompareAndSwap(true, false) {
			holding.Store(true)
			<-release
		}
		return nil
	}})
	cfg := testConfig(t, "tcp://"+proxy.Addr(), "edgeagent-puback", nil)
	in := startIngester(t, b, cfg)
	releaseCommit := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseCommit) // before the ingester's Close, should the test fail while holding
	mqtttest.WaitFor(t, 10*time.Second, "connected", in.Connected)

	pub := mqtttest.NewPublisher(t, mosq.URL(), "device-pub")
	first := payloads("warm", 100)
	pub.PublishAll(t, "sensors/d1/telemetry", 1, first)
	waitForMessages(t, b, first)

	holdNext.Store(true)
	held := payloads("held", 1)
	pub.PublishAll(t, "sensors/d1/telemetry", 1, held)
	mqtttest.WaitFor(t, 10*time.Second, "a commit held open", holding.Load)
	proxy.Cut()
	mqtttest.WaitFor(t, 10*time.Second, "connection loss seen", func() bool { return in.Stats().Reconnects.Load() >= 1 })
	acked := in.Stats().Acked.Load()
	releaseCommit() // the commit ends; its PUBACKs have no connection to go to
	mqtttest.WaitFor(t, 10*time.Second, "held message stored", func() bool { return in.Stats().Acked.Load() > acked })
	proxy.Restore()
	mqtttest.WaitFor(t, 20*time.Second, "reconnected", in.Connected)
	// The broker never got the held PUBACK: it redelivers, and the copy is
	// stored again (the window stage deduplicates it by event id).
	mqtttest.WaitFor(t, 20*time.Second, "held message redelivered and stored again", func() bool {
		return messageRecords(t, b) == len(first)+2
	})
	after := payloads("after", 100)
	pub.PublishAll(t, "sensors/d1/telemetry", 1, after)
	waitForMessages(t, b, append(append(first, held...), after...))
	in.Close()

	// A new session with the same client id gets only what is new: every
	// PUBACK written on the second connection reached the broker.
	b2 := openBronze(t, buffer.Options{})
	cfg.Broker = mosq.URL()
	startIngester(t, b2, cfg)
	marker := payloads("marker", 1)
	pub.PublishAll(t, "sensors/d1/telemetry", 1, marker)
	waitForMessages(t, b2, marker)
	if n := messageRecords(t, b2); n != 1 {
		t.Fatalf("the broker redelivered %d acknowledged messages to the next session", n-1)
	}
}

// DESIGN invariant 1 on the connection's own PUBLISH path: while the Bronze
// commit holding a QoS1 message is open, the broker still has it in flight
// for the agent; the PUBACK reaches the broker only after the commit.
func TestPubackWaitsForTheCommit(t *testing.T) {
	m, err := servers.StartMochi("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	b, holding, release := openBronzeHoldingFirstCommit(t)
	cfg := testConfig(t, m.URL(), "edgeagent-hold", nil)
	in := startIngester(t, b, cfg)
	releaseCommit := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseCommit) // before the ingester's Close, should the test fail while holding
	mqtttest.WaitFor(t, 10*time.Second, "connected", in.Connected)
	pub := mqtttest.NewPublisher(t, m.URL(), "device-pub")
	want := payloads("held", 1)
	pub.PublishAll(t, "sensors/d1/telemetry", 1, want)
	mqtttest.WaitFor(t, 10*time.Second, "commit held open", holding.Load)
	// The connection flushes PUBACKs within a millisecond: a PUBACK sent
	// before the commit would have reached the broker well within this.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for end := time.After(200 * time.Millisecond); ; {
		if n := m.Pending(cfg.ClientID); n != 1 {
			t.Fatalf("the broker holds %d messages in flight for the agent while the commit is open, want 1", n)
		}
		select {
		case <-tick.C:
			continue
		case <-end:
		}
		break
	}
	releaseCommit()
	waitForMessages(t, b, want)
	mqtttest.WaitFor(t, 10*time.Second, "PUBACK at the broker after the commit", func() bool { return m.Pending(cfg.ClientID) == 0 })
}
