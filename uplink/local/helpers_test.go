package local

import (
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/internal/mochilisten"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
)

func testLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// openDB opens a real state database in a temp dir (or at path) and checks
// its consistency when the test ends.
func openDB(t testing.TB, path string) *bolt.DB {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "state.db")
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("open state db: %v", err)
	}
	t.Cleanup(func() {
		err := db.View(func(tx *bolt.Tx) error {
			for err := range tx.Check() {
				return err
			}
			return nil
		})
		if err != nil {
			t.Errorf("state db inconsistent: %v", err)
		}
		db.Close()
	})
	return db
}

// startInlineMochi runs an in-process mochi broker with its inline client on
// a free loopback port, like the agent's embedded broker, and returns it
// with its URL.
func startInlineMochi(t testing.TB) (*mochi.Server, string) {
	t.Helper()
	srv := mochi.New(&mochi.Options{InlineClient: true, Logger: testLogger()})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatalf("mochi auth hook: %v", err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	if err := srv.AddListener(mochilisten.Listen("tcp", addr)); err != nil {
		t.Fatalf("mochi listener: %v", err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatalf("mochi serve: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv, "tcp://" + addr
}

// received is one message as a subscriber got it.
type received struct {
	Topic   string
	Payload string
	Retain  bool
	// Redelivered is the MQTT DUP flag: the broker sent this message to
	// the subscriber again (its acknowledgement was lost to a reconnect).
	Redelivered bool
}

// subscriber collects every message on filter with QoS 1 and a persistent
// session, so it also gets what was published while it reconnected.
type subscriber struct {
	mu   sync.Mutex
	msgs []received
}

func subscribe(t testing.TB, url, clientID, filter string) *subscriber {
	t.Helper()
	s := &subscriber{}
	handler := func(_ paho.Client, m paho.Message) {
		s.mu.Lock()
		s.msgs = append(s.msgs, received{m.Topic(), string(m.Payload()), m.Retained(), m.Duplicate()})
		s.mu.Unlock()
	}
	opts := paho.NewClientOptions().AddBroker(url).SetClientID(clientID).
		SetCleanSession(false).SetAutoReconnect(true).SetConnectRetry(true).
		SetConnectRetryInterval(100 * time.Millisecond).SetMaxReconnectInterval(500 * time.Millisecond).
		SetConnectTimeout(5 * time.Second).SetOrderMatters(true).
		SetDefaultPublishHandler(handler).
		SetOnConnectHandler(func(c paho.Client) {
			// Resubscribe on every connect: a broker without persistence
			// forgets the subscription.
			c.Subscribe(filter, 1, handler)
		})
	c := paho.NewClient(opts)
	tok := c.Connect()
	if !tok.WaitTimeout(20*time.Second) || tok.Error() != nil {
		t.Fatalf("subscriber connect to %s: %v", url, tok.Error())
	}
	// Wait until the subscription is in place: the on-connect subscribe is
	// asynchronous, so subscribe again and wait for its SUBACK.
	st := c.Subscribe(filter, 1, handler)
	if !st.WaitTimeout(20*time.Second) || st.Error() != nil {
		t.Fatalf("subscribe %s: %v", filter, st.Error())
	}
	t.Cleanup(func() { c.Disconnect(100) })
	return s
}

func (s *subscriber) got() []received {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]received(nil), s.msgs...)
}

func (s *subscriber) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.msgs)
}

// appendLocal queues messages as local rows in one transaction, with a
// few aggregate and alert rows in between that the publisher must leave.
func appendLocal(t testing.TB, db *bolt.DB, msgs []Message) {
	t.Helper()
	err := db.Update(func(tx *bolt.Tx) error {
		if err := outbox.Init(tx); err != nil {
			return err
		}
		for i, m := range msgs {
			if i%3 == 1 {
				if _, err := outbox.Append(tx, outbox.KindAggregate, int64(1000+i), []byte("aggregate")); err != nil {
					return err
				}
			}
			if _, err := outbox.Append(tx, outbox.KindLocal, int64(1000+i), Encode(m)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("append local rows: %v", err)
	}
}

// numbered returns n QoS 1 messages "m<from>" … on topic prefix/<i>.
func numbered(prefix string, from, n int) []Message {
	out := make([]Message, n)
	for i := range out {
		out[i] = Message{Topic: fmt.Sprintf("%s/%d", prefix, (from+i)%4), Payload: []byte(fmt.Sprintf("m%06d", from+i)), QoS: 1}
	}
	return out
}

// rowsByKind counts the outbox rows of each kind.
func rowsByKind(t testing.TB, db *bolt.DB) map[outbox.Kind]int {
	t.Helper()
	out := map[outbox.Kind]int{}
	err := db.View(func(tx *bolt.Tx) error {
		es, err := outbox.Read(tx, 0, 1<<30)
		for _, e := range es {
			out[e.Kind]++
		}
		return err
	})
	if err != nil {
		t.Fatalf("read outbox: %v", err)
	}
	return out
}

// runPublisher starts p.Run in a goroutine owned by the test: it is closed
// and waited for at cleanup, and a Run error fails the test.
func runPublisher(t testing.TB, p *Publisher) {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- p.Run(t.Context()) }()
	t.Cleanup(func() {
		p.Close()
		if err := <-errc; err != nil {
			t.Errorf("publisher run: %v", err)
		}
	})
}

// payloads returns the payloads of msgs in order.
func payloads(msgs []received) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Payload
	}
	return out
}
