package uplink

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeagent/edgeagent/testrig/faultproxy"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/edgeagent/edgeagent/testrig/logbuf"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
	"github.com/edgeagent/edgeagent/testrig/natstest"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

const (
	testStream  = "EDGE"
	testSubject = "edge." + testGateway + ".aggregates"
	probeSubj   = "edge.probe"
)

// startNATS starts an in-process or binary server with the test stream.
func startNATS(t testing.TB, kind string, dupWindow time.Duration) *natstest.Server {
	t.Helper()
	var s *natstest.Server
	if kind == "binary" {
		s = natstest.StartBinary(t)
	} else {
		s = natstest.Start(t)
	}
	natstest.CreateStream(t, s.URL(), testStream, []string{testSubject, probeSubj}, dupWindow)
	return s
}

func natsConfig(url string) Config {
	return Config{
		NATS:            &NATSConfig{URL: url, Subject: "edge.{gateway_id}.aggregates", Stream: testStream},
		MaxBatchRecords: 50,
		AckTimeout:      time.Second,
		ReconnectMax:    200 * time.Millisecond,
	}
}

func newProxy(t testing.TB, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close proxy: %v", err)
		}
	})
	return p
}

// streamReceiver reads the whole stream into a receiver, checking each
// message's headers against its body.
func streamReceiver(t *testing.T, url string) *receiver {
	t.Helper()
	r := newReceiver()
	for _, m := range natstest.StreamMessages(t, url, testStream) {
		if m.Subject != testSubject {
			continue // probes
		}
		enc := m.Header.Get(headerContentEncoding)
		b, err := wire.DecodeBatch(m.Data, enc)
		if err != nil {
			t.Fatalf("stream seq %d: %v", m.Seq, err)
		}
		if id := m.Header.Get(jetstream.MsgIDHeader); id != b.Batch {
			t.Fatalf("stream seq %d: Nats-Msg-Id %q, body says batch %q", m.Seq, id, b.Batch)
		}
		if ct := m.Header.Get(headerContentType); ct != wire.ContentType {
			t.Fatalf("stream seq %d: Content-Type %q", m.Seq, ct)
		}
		if wire.IsZstd(m.Data) != (enc == wire.EncodingZstd) {
			t.Fatalf("stream seq %d: Content-Encoding %q does not match the body", m.Seq, enc)
		}
		r.take(t, b)
	}
	return r
}

func TestNATSDelivery(t *testing.T) {
	for _, kind := range []string{"in-process", "binary"} {
		for _, compression := range []string{"zstd", "none"} {
			t.Run(kind+"/"+compression, func(t *testing.T) {
				srv := startNATS(t, kind, 0)
				db := openDB(t)
				fx := makeFixture(t, 20, 4)
				fill(t, db, fx.rows, 100)
				cfg := natsConfig(srv.URL())
				cfg.Compression = compression
				u := startUplink(t, db, cfg)
				u.waitDelivered(t, fx, 20*time.Second)

				r := streamReceiver(t, srv.URL())
				r.check(t, fx.truth(t))
				if d := r.duplicateBatches(); len(d) > 0 {
					t.Errorf("batches stored twice: %v", d)
				}
				for key, n := range r.aggregates {
					if n != 1 {
						t.Errorf("aggregate %s delivered %d times", key, n)
					}
				}
				checkOutboxLeft(t, db, fx.truth(t))
				st := u.Stats()
				if st.Link != LinkUp || st.Resends != 0 || st.Reconnects != 0 || st.BatchesSent != uint64(len(r.batches)) || st.BytesSent == 0 {
					t.Errorf("stats after a clean run: %+v", st)
				}
			})
		}
	}
}

// TestNATSFaults puts a TCP proxy between the uplink and the server and
// breaks the link in the middle of a drain: cut, blackhole, and lost
// PubAcks for messages the stream stored. After each, every aggregate is in
// the stream, no batch twice, and the receiver's upsert is exact.
func TestNATSFaults(t *testing.T) {
	faults := []struct {
		name   string
		inject func(p *faultproxy.Proxy)
		// seen waits until the uplink has noticed the fault.
		seen func(u *started, t *testing.T)
	}{
		{"cut", (*faultproxy.Proxy).Cut, func(u *started, t *testing.T) {
			waitFor(t, 10*time.Second, "the link to go down", func() bool { return u.Stats().Link != LinkUp })
		}},
		{"blackhole", (*faultproxy.Proxy).Blackhole, (*started).waitAckTimeout},
		{"lost-puback", (*faultproxy.Proxy).DropServerToClient, (*started).waitAckTimeout},
	}
	for _, kind := range []string{"in-process", "binary"} {
		for _, f := range faults {
			t.Run(kind+"/"+f.name, func(t *testing.T) {
				srv := startNATS(t, kind, 0)
				proxy := newProxy(t, srv.Addr())
				db := openDB(t)
				fx := makeFixture(t, 10, 12)
				half := len(fx.rows) / 2
				fill(t, db, fx.rows[:half], 100)
				u := startUplink(t, db, natsConfig("nats://"+proxy.Addr()))
				waitFor(t, 10*time.Second, "a few batches acknowledged", func() bool { return u.Stats().BatchesSent >= 3 })

				f.inject(proxy)
				fill(t, db, fx.rows[half:], 100) // the window stage keeps producing
				u.Notify()
				f.seen(u, t)
				if st := u.Stats(); st.AggregatesSent >= uint64(fx.aggs) {
					t.Fatalf("everything was acknowledged before the fault took effect: %+v", st)
				}
				proxy.Restore()
				u.waitDelivered(t, fx, 30*time.Second)

				r := streamReceiver(t, srv.URL())
				r.check(t, fx.truth(t))
				if d := r.duplicateBatches(); len(d) > 0 {
					t.Errorf("batches stored twice inside the duplicate window: %v", d)
				}
				checkOutboxLeft(t, db, fx.truth(t))
				st := u.Stats()
				if st.Reconnects == 0 {
					t.Errorf("no reconnect after the fault: %+v", st)
				}
				if f.name == "lost-puback" && st.Duplicates == 0 {
					t.Errorf("the resend of a stored batch was not reported as a duplicate: %+v", st)
				}
				t.Logf("%s: %d batches, %d resends, %d duplicates, %d reconnects", f.name, st.BatchesSent, st.Resends, st.Duplicates, st.Reconnects)
			})
		}
	}
}

// TestNATSOutageLongerThanDuplicateWindow loses the PubAck of stored
// batches, then keeps the link down until the stream has forgotten their
// ids. The resends are stored again — the stream holds duplicates — and the
// receiver's upsert still counts every window once.
func TestNATSOutageLongerThanDuplicateWindow(t *testing.T) {
	srv := startNATS(t, "in-process", time.Second)
	proxy := newProxy(t, srv.Addr())
	db := openDB(t)
	fx := makeFixture(t, 10, 8)
	half := len(fx.rows) / 2
	fill(t, db, fx.rows[:half], 100)
	u := startUplink(t, db, natsConfig("nats://"+proxy.Addr()))
	waitFor(t, 10*time.Second, "a few batches acknowledged", func() bool { return u.Stats().BatchesSent >= 2 })

	proxy.DropServerToClient()
	fill(t, db, fx.rows[half:], 100)
	u.Notify()
	u.waitAckTimeout(t)
	proxy.Cut()
	natstest.WaitDuplicateWindowPassed(t, srv.URL(), probeSubj, 30*time.Second)
	proxy.Restore()
	u.waitDelivered(t, fx, 30*time.Second)

	r := streamReceiver(t, srv.URL())
	r.check(t, fx.truth(t))
	if len(r.duplicateBatches()) == 0 {
		t.Errorf("expected the batches whose acks were lost to be stored twice after the window passed")
	}
	t.Logf("batches stored twice: %v", r.duplicateBatches())
	checkOutboxLeft(t, db, fx.truth(t))
}

// TestNATSStreamMissing: without create_stream the agent never creates the
// stream; publishing fails and is retried, nothing is lost, and once the
// cloud side creates the stream the backlog drains. With create_stream the
// agent makes it.
func TestNATSStreamMissing(t *testing.T) {
	srv := natstest.Start(t)
	db := openDB(t)
	fx := makeFixture(t, 5, 2)
	fill(t, db, fx.rows, 100)
	u := startUplink(t, db, natsConfig(srv.URL()))
	// The error says what is missing, naming the subject.
	waitFor(t, 10*time.Second, "a publish error naming the subject", func() bool {
		return strings.Contains(u.Stats().LastError, "no JetStream stream captures subject "+testSubject)
	})
	if st := u.Stats(); st.BatchesSent != 0 {
		t.Fatalf("batches acknowledged without a stream: %+v", st)
	}
	// The link comes up and fails again; the failure is one span, which
	// the status warns about after a while (down_since restarts each time).
	failing := u.Stats().FailingSince
	reconnects := u.Stats().Reconnects
	if failing.IsZero() {
		t.Fatal("FailingSince not set while every batch fails")
	}
	waitFor(t, 20*time.Second, "another failed connection", func() bool { return u.Stats().Reconnects > reconnects })
	if got := u.Stats().FailingSince; !got.Equal(failing) {
		t.Errorf("FailingSince moved from %v to %v on a reconnect", failing, got)
	}
	natstest.CreateStream(t, srv.URL(), testStream, []string{testSubject}, 0)
	u.waitDelivered(t, fx, 20*time.Second)
	streamReceiver(t, srv.URL()).check(t, fx.truth(t))
	if st := u.Stats(); !st.FailingSince.IsZero() {
		t.Errorf("FailingSince %v after delivery", st.FailingSince)
	}

	t.Run("create_stream", func(t *testing.T) {
		srv := natstest.Start(t)
		db := openDB(t)
		fill(t, db, fx.rows, 100)
		cfg := natsConfig(srv.URL())
		cfg.NATS.CreateStream = true
		u := startUplink(t, db, cfg)
		u.waitDelivered(t, fx, 20*time.Second)
		streamReceiver(t, srv.URL()).check(t, fx.truth(t))
	})
	// create_stream with the stream there on other subjects: nothing
	// captures the agent's, and the log says so at connect (an audit saw
	// only "no response from stream", forever).
	t.Run("create_stream, stream on other subjects", func(t *testing.T) {
		srv := natstest.Start(t)
		natstest.CreateStream(t, srv.URL(), testStream, []string{"other.x"}, 0)
		db := openDB(t)
		fill(t, db, fx.rows, 100)
		var logs logbuf.Buffer
		cfg := natsConfig(srv.URL())
		cfg.NATS.CreateStream = true
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		u := startUplink(t, db, cfg)
		waitFor(t, 10*time.Second, "a publish error naming the subject", func() bool {
			return strings.Contains(u.Stats().LastError, "no JetStream stream captures subject "+testSubject)
		})
		if l := logs.String(); !strings.Contains(l, "stream exists but does not capture the subject") || !strings.Contains(l, "stream_subjects=other.x") {
			t.Errorf("no warning that stream %s does not capture %s:\n%s", testStream, testSubject, l)
		}
	})
	// create_stream with the subject already in another stream (a fleet
	// stream on edge.*.aggregates): the create is refused, and publishing
	// to the existing stream is all that is needed.
	t.Run("create_stream, subject in another stream", func(t *testing.T) {
		srv := natstest.Start(t)
		natstest.CreateStream(t, srv.URL(), testStream, []string{"edge.*.aggregates"}, 0)
		db := openDB(t)
		fill(t, db, fx.rows, 100)
		cfg := natsConfig(srv.URL())
		cfg.NATS.CreateStream, cfg.NATS.Stream = true, "OTHER"
		u := startUplink(t, db, cfg)
		u.waitDelivered(t, fx, 20*time.Second)
		streamReceiver(t, srv.URL()).check(t, fx.truth(t))
	})
}

// TestNATSServerRestart stops the server (not the link) during a drain: the
// uplink reconnects when it is back and the file store still holds what it
// acknowledged.
func TestNATSServerRestart(t *testing.T) {
	srv := startNATS(t, "binary", 0)
	db := openDB(t)
	fx := makeFixture(t, 10, 6)
	half := len(fx.rows) / 2
	fill(t, db, fx.rows[:half], 100)
	u := startUplink(t, db, natsConfig(srv.URL()))
	waitFor(t, 10*time.Second, "a few batches acknowledged", func() bool { return u.Stats().BatchesSent >= 2 })
	srv.Shutdown()
	fill(t, db, fx.rows[half:], 100)
	waitFor(t, 10*time.Second, "the link to go down", func() bool { return u.Stats().Link != LinkUp })
	srv.Start()
	u.waitDelivered(t, fx, 30*time.Second)
	r := streamReceiver(t, srv.URL())
	r.check(t, fx.truth(t))
	if d := r.duplicateBatches(); len(d) > 0 {
		t.Errorf("batches stored twice: %v", d)
	}
	checkOutboxLeft(t, db, fx.truth(t))
	if st := u.Stats(); st.Reconnects == 0 {
		t.Errorf("no reconnect counted: %+v", st)
	}
}

func TestNATSLinkStateWhileDown(t *testing.T) {
	// Nothing listens: the uplink keeps trying and reports why.
	port := natstest.FreePort(t)
	db := openDB(t)
	fx := makeFixture(t, 5, 3)
	fill(t, db, fx.rows, 100)
	u := startUplink(t, db, natsConfig(fmt.Sprintf("nats://127.0.0.1:%d", port)))
	waitFor(t, 10*time.Second, "a connect error", func() bool { return strings.Contains(u.Stats().LastError, "connect") })
	st := u.Stats()
	if st.Link == LinkUp || st.BatchesSent != 0 {
		t.Fatalf("stats with no server: %+v", st)
	}
	// While down, only full batches are sealed; the rest waits in the
	// outbox, and the oldest unsent row is reported.
	waitFor(t, 10*time.Second, "full batches sealed while down", func() bool {
		return u.Stats().SealedBatches == uint64((fx.aggs+fx.alerts)/50)
	})
	if st := u.Stats(); st.OldestUnsent == 0 || st.OldestUnsent != fx.rows[0].emittedAt {
		t.Fatalf("oldest unsent = %d, want %d", st.OldestUnsent, fx.rows[0].emittedAt)
	}
}

// TestNATSPublishNotPermitted: a server that denies the gateway's subject
// answers a publish only with an asynchronous permissions error; the
// failure reason (last_error, behind "uplink not delivering") names it,
// and nats.go does not print it to stderr itself.
func TestNATSPublishNotPermitted(t *testing.T) {
	srv := natstest.Start(t, natstest.WithOptions(func(o *server.Options) {
		o.Users = []*server.User{{Username: "gw", Password: "pw", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"edge.other.aggregates", "$JS.API.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
		}}, {Username: "admin", Password: "pw"}}
	}))
	natstest.CreateStream(t, "nats://admin:pw@"+srv.Addr(), testStream, []string{testSubject}, 0)
	db := openDB(t)
	fx := makeFixture(t, 3, 1)
	fill(t, db, fx.rows, 100)
	cfg := natsConfig(srv.URL())
	cfg.NATS.User, cfg.NATS.Password = "gw", "pw"
	cfg.AckTimeout = 500 * time.Millisecond
	u := startUplink(t, db, cfg)
	waitFor(t, 20*time.Second, "the permissions violation as the failure's reason", func() bool {
		return strings.Contains(u.Stats().LastError, "Permissions Violation")
	})
	if st := u.Stats(); st.BatchesSent != 0 || st.FailingSince.IsZero() {
		t.Errorf("a denied publish: %+v", st)
	}
}

// TestWebsocketUplinks: both transports over websocket URLs, as the config
// reference allows (a link that only passes HTTP(S), say). config check
// took ws:// and the uplink refused it at start (found by an audit).
func TestWebsocketUplinks(t *testing.T) {
	t.Run("nats", func(t *testing.T) {
		wsPort := natstest.FreePort(t)
		srv := natstest.Start(t, natstest.WithOptions(func(o *server.Options) {
			o.Websocket.Host, o.Websocket.Port, o.Websocket.NoTLS = "127.0.0.1", wsPort, true
		}))
		natstest.CreateStream(t, srv.URL(), testStream, []string{testSubject}, 0)
		db := openDB(t)
		fx := makeFixture(t, 10, 4)
		fill(t, db, fx.rows, 100)
		u := startUplink(t, db, natsConfig(fmt.Sprintf("ws://127.0.0.1:%d", wsPort)))
		u.waitDelivered(t, fx, 20*time.Second)
		streamReceiver(t, srv.URL()).check(t, fx.truth(t))
	})
	t.Run("mqtt", func(t *testing.T) {
		tcpURL, wsURL := mqtttest.StartMochiWebsocket(t)
		collector := collectMQTT(t, tcpURL)
		db := openDB(t)
		fx := makeFixture(t, 10, 4)
		fill(t, db, fx.rows, 100)
		u := startUplink(t, db, mqttConfig(wsURL))
		u.waitDelivered(t, fx, 20*time.Second)
		collector.receiver(t).check(t, fx.truth(t))
	})
}

// TestQuietLinkLossIsDownNotFailing: a link lost with nothing to send is
// down, not failing: FailingSince (failing_seconds, "not delivering")
// stays zero (an audit: it grew on a quiet gateway whose server had
// restarted). A reload's uplink carries an outage over from the one it
// replaces.
func TestQuietLinkLossIsDownNotFailing(t *testing.T) {
	srv := natstest.Start(t)
	natstest.CreateStream(t, srv.URL(), testStream, []string{testSubject}, 0)
	proxy := newProxy(t, srv.Addr())
	db := openDB(t)
	u := startUplink(t, db, natsConfig("nats://"+proxy.Addr()))
	waitFor(t, 10*time.Second, "the link up", func() bool { return u.Stats().Link == LinkUp })
	proxy.Cut()
	waitFor(t, 10*time.Second, "the link down", func() bool { return u.Stats().Link != LinkUp })
	st := u.Stats()
	if !st.FailingSince.IsZero() || st.NotUpSince.IsZero() {
		t.Fatalf("a quiet link lost: failing since %v, not up since %v; want not failing, down", st.FailingSince, st.NotUpSince)
	}

	began := time.Date(2026, 11, 29, 11, 0, 0, 0, time.UTC)
	cfg := natsConfig("nats://" + proxy.Addr())
	cfg.Gateway, cfg.Logger = testGateway, testLogger()
	cfg.NotUpSince, cfg.FailingSince = began, began.Add(time.Minute)
	next, err := New(openDB(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if st := next.Stats(); !st.NotUpSince.Equal(began) || !st.FailingSince.Equal(began.Add(time.Minute)) {
		t.Fatalf("the outage carried over as not up since %v, failing since %v", st.NotUpSince, st.FailingSince)
	}
}
