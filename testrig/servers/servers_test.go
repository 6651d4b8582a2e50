package servers

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func client(t *testing.T, url, id string, clean bool, onMsg func()) paho.Client {
	t.Helper()
	opts := paho.NewClientOptions().AddBroker(url).SetClientID(id).SetCleanSession(clean).
		SetAutoReconnect(true).SetConnectRetry(true).SetConnectRetryInterval(50 * time.Millisecond).
		SetMaxReconnectInterval(200 * time.Millisecond)
	if onMsg != nil {
		opts.SetDefaultPublishHandler(func(paho.Client, paho.Message) { onMsg() })
	}
	c := paho.NewClient(opts)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", id, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(50) })
	return c
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
}

// TestMochiRestartAndCounts restarts the in-process broker on the same
// address and checks the counters the rig relies on.
func TestMochiRestartAndCounts(t *testing.T) {
	m, err := StartMochi("")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.CountAcksFrom("sub")
	var got atomic.Int64
	sub := client(t, m.URL(), "sub", false, func() { got.Add(1) })
	if tok := sub.Subscribe("a/#", 1, nil); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	pub := client(t, m.URL(), "pub", true, nil)
	for i := 0; i < 5; i++ {
		if tok := pub.Publish("a/b", 1, false, []byte("x")); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatal(tok.Error())
		}
	}
	waitFor(t, 5*time.Second, "5 deliveries acknowledged by sub", func() bool { return m.Acks() >= 5 && got.Load() == 5 })
	if m.Received() != 5 || m.Dropped() != 0 {
		t.Fatalf("received %d dropped %d, want 5 and 0", m.Received(), m.Dropped())
	}
	// The publisher leaves before the restart: paho v1.5.1's reconnect
	// marks stored publishes as duplicates in resume() while its writer may
	// be sending one of them (a data race the race detector reports;
	// eclipse-paho issue 703), and under a loaded machine a reconnect here
	// once took over 10 s and once never ended. Devices reconnecting after
	// a broker restart are covered end to end by the crash and chaos
	// scenarios; this test is about the broker.
	pub.Disconnect(50)
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := m.Stop(); err != nil { // idempotent
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	again := client(t, m.URL(), "pub-again", true, nil)
	if tok := again.Publish("a/b", 1, false, []byte("y")); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("publish after restart: %v", tok.Error())
	}
}

// TestMosquittoKeepsQueuedMessages: a message queued for an offline
// persistent session survives a restart.
func TestMosquittoKeepsQueuedMessages(t *testing.T) {
	m, err := StartMosquitto(t.TempDir())
	if errors.Is(err, ErrNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var got atomic.Int64
	sub := client(t, m.URL(), "keeper", false, func() { got.Add(1) })
	if tok := sub.Subscribe("q/#", 1, nil); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	sub.Disconnect(50)
	pub := client(t, m.URL(), "queuer", true, nil)
	if tok := pub.Publish("q/1", 1, false, []byte("kept")); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	pub.Disconnect(50)
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	client(t, m.URL(), "keeper", false, func() { got.Add(1) })
	waitFor(t, 10*time.Second, "the queued message after the restart", func() bool { return got.Load() == 1 })
}

// TestNATSStreamSurvivesRestart: the file-stored stream keeps its messages
// across Stop and Start on the same port.
func TestNATSStreamSurvivesRestart(t *testing.T) {
	n, err := StartNATS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := CreateStream(ctx, n.URL(), "S", []string{"s.x"}); err != nil {
		t.Fatal(err)
	}
	if err := CreateStream(ctx, n.URL(), "S", []string{"s.x"}); err != nil {
		t.Fatalf("creating it again: %v", err)
	}
	nc, err := nats.Connect(n.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.Publish(ctx, "s.x", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if err := n.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the client to reconnect", nc.IsConnected)
	// Asked again until it answers: a request sent while the client
	// resubscribes after the reconnect can lose its response, and this
	// one waited out the whole context once (20 s) under a loaded
	// machine.
	var info *jetstream.StreamInfo
	waitFor(t, 15*time.Second, "the stream's info after the restart", func() bool {
		try, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		st, err := js.Stream(try, "S")
		if err == nil {
			info, err = st.Info(try)
		}
		if err != nil {
			t.Logf("stream info: %v", err)
		}
		return err == nil
	})
	if info.State.Msgs != 1 {
		t.Fatalf("stream holds %d messages after the restart, want 1", info.State.Msgs)
	}
}
