package ingest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	mpackets "github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/internal/topic"
	"github.com/edgeagent/edgeagent/testrig/logbuf"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
)

func openBronze(t testing.TB, opts buffer.Options) *buffer.Bronze {
	t.Helper()
	b, err := buffer.Open(filepath.Join(t.TempDir(), "bronze.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func testConfig(t testing.TB, broker, clientID string, logs io.Writer) Config {
	t.Helper()
	tmpl, err := topic.Parse("sensors/{device}/telemetry")
	if err != nil {
		t.Fatal(err)
	}
	if logs == nil {
		logs = io.Discard
	}
	return Config{
		Broker:           broker,
		ClientID:         clientID,
		Subscriptions:    []Subscription{{Template: tmpl, QoS: 1}},
		CommitInterval:   2 * time.Millisecond,
		MaxCommitRecords: 200,
		ClockTick:        time.Hour, // ticks are tested on their own
		MaxPayloadBytes:  1024,
		RetryMin:         5 * time.Millisecond,
		RetryMax:         50 * time.Millisecond,
		ConnectTimeout:   5 * time.Second,
		ReconnectMax:     500 * time.Millisecond,
		Logger:           slog.New(slog.NewTextHandler(logs, nil)),
	}
}

func startIngester(t testing.TB, b *buffer.Bronze, cfg Config) *Ingester {
	t.Helper()
	in, err := New(b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close() })
	return in
}

// messagesIn returns the payloads of every message record in Bronze.
func messagesIn(t testing.TB, b *buffer.Bronze) map[string]buffer.Record {
	t.Helper()
	out := map[string]buffer.Record{}
	err := b.Scan(1, func(r buffer.Record) bool {
		if r.Kind == buffer.KindMessage {
			r.Payload = bytes.Clone(r.Payload)
			out[string(r.Payload)] = r
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func payloads(prefix string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = fmt.Appendf(nil, `{"id":"%s-%d","ts":%d,"v":%d}`, prefix, i, 1700000000000+int64(i), i)
	}
	return out
}

func waitForMessages(t *testing.T, b *buffer.Bronze, want [][]byte) {
	t.Helper()
	mqtttest.WaitFor(t, 30*time.Second, fmt.Sprintf("%d messages in bronze", len(want)), func() bool {
		got := messagesIn(t, b)
		for _, p := range want {
			if _, ok := got[string(p)]; !ok {
				return false
			}
		}
		return true
	})
}

// ingestAgainst runs the basic end-to-end check against one broker URL.
func ingestAgainst(t *testing.T, url string) {
	b := openBronze(t, buffer.Options{})
	in := startIngester(t, b, testConfig(t, url, "edgeagent-test", nil))
	mqtttest.WaitFor(t, 10*time.Second, "connected", in.Connected)
	pub := mqtttest.NewPublisher(t, url, "device-pub")
	want := payloads("m", 500)
	before := time.Now()
	pub.PublishAll(t, "sensors/press-1/telemetry", 1, want)
	waitForMessages(t, b, want)
	got := messagesIn(t, b)
	for _, p := range want {
		r := got[string(p)]
		if r.Topic != "sensors/press-1/telemetry" || r.QoS != 1 || r.Seq == 0 {
			t.Fatalf("record %+v: want topic, qos 1 and a sequence", r)
		}
		if at := time.Unix(0, r.ReceivedAt); at.Before(before.Add(-time.Second)) || at.After(time.Now()) {
			t.Fatalf("received-at %v is not the gateway clock at receipt", at)
		}
	}
	if s := in.Stats(); s.Commits.Load() == 0 || s.Commits.Load() >= 500 {
		t.Errorf("commits = %d for 500 messages: want group commit (more than 0, fewer than one per message)", s.Commits.Load())
	}
}

func TestIngestMochi(t *testing.T) { ingestAgainst(t, mqtttest.StartMochi(t)) }

func TestIngestMosquitto(t *testing.T) { ingestAgainst(t, mqtttest.StartMosquitto(t, "").URL()) }

// A QoS1 message must not be acknowledged before its commit: while commits
// fail, the broker gets no PUBACK; when they recover everything is stored once
// the broker redelivers, and the failure was logged and counted.
func TestCommitFailureHoldsAcks(t *testing.T) {
	mosq := mqtttest.StartMosquitto(t, "")
	var failing atomic.Bool
	failing.Store(true)
	b := openBronze(t, buffer.Options{BeforeCommit: func() error {
		if failing.Load() {
			return errors.New("write bronze.db: no space left on device")
		}
		return nil
	}})
	logs := &logbuf.Buffer{}
	in := startIngester(t, b, testConfig(t, mosq.URL(), "edgeagent-fail", logs))
	mqtttest.WaitFor(t, 10*time.Second, "connected", in.Connected)
	pub := mqtttest.NewPublisher(t, mosq.URL(), "device-pub")
	want := payloads("f", 50)
	for _, p := range want {
		pub.Client.Publish("sensors/d1/telemetry", 1, false, p)
	}
	mqtttest.WaitFor(t, 10*time.Second, "failed commits", func() bool { return in.Stats().CommitFailures.Load() >= 3 })
	if n := in.Stats().Acked.Load(); n != 0 {
		t.Fatalf("%d messages acknowledged while every commit failed", n)
	}
	if len(messagesIn(t, b)) != 0 {
		t.Fatal("a failed commit left records in bronze")
	}
	if !in.Stats().CommitFailing.Load() {
		t.Error("CommitFailing not set while commits fail")
	}
	if !strings.Contains(logs.String(), "bronze commit failed") || !strings.Contains(logs.String(), "no space left on device") {
		t.Fatalf("the failure was not logged clearly:\n%s", logs.String())
	}
	failing.Store(false)
	waitForMessages(t, b, want)
	// Acks follow the commit that stored the messages.
	mqtttest.WaitFor(t, 10*time.Second, "all messages acknowledged", func() bool { return in.Stats().Acked.Load() >= uint64(len(want)) })
	if in.Stats().CommitFailing.Load() || in.Stats().LastError() != "" || in.Stats().LastCommitError() != "" {
		t.Errorf("commit failure not cleared after recovery: %q", in.Stats().LastError())
	}
}

// Bronze full of unprocessed records: ingest holds acknowledgements (the
// broker keeps queueing) and resumes when the checkpoint lets it trim.
func TestBronzeFullHoldsAcks(t *testing.T) {
	mosq := mqtttest.StartMosquitto(t, "")
	b := openBronze(t, buffer.Options{MaxBytes: 4096})
	logs := &logbuf.Buffer{}
	in := startIngester(t, b, testConfig(t, mosq.URL(), "edgeagent-full", logs))
	mqtttest.WaitFor(t, 10*time.Second, "connected", in.Connected)
	pub := mqtttest.NewPublisher(t, mosq.URL(), "device-pub")
	want := payloads("full", 200) // about 12 KiB of records: three times the bound
	for _, p := range want {
		pub.Client.Publish("sensors/d1/telemetry", 1, false, p)
	}
	// The committer flags Full before it logs it: wait for both.
	mqtttest.WaitFor(t, 10*time.Second, "bronze full, flagged and logged", func() bool {
		return in.Stats().Full.Load() && strings.Contains(logs.String(), "bronze is full")
	})
	// Play the window stage: checkpoint everything stored so far, repeatedly,
	// and collect what passes through before it is trimmed.
	seen := map[string]bool{}
	t.Cleanup(func() {
		if t.Failed() { // what a timeout leaves to go on (a flake seen once, in CI)
			st := in.Stats()
			t.Logf("seen %d of %d; received %d, committed %d, acked %d, commits %d, full %v (episodes %d), connected %v, reconnects %d, sessions lost %d, last error %q\nlog:\n%s",
				len(seen), len(want), st.Received.Load(), st.Committed.Load(), st.Acked.Load(), st.Commits.Load(), st.Full.Load(), st.FullTotal.Load(),
				in.Connected(), st.Reconnects.Load(), st.SessionsLost.Load(), st.LastError(), logs.String())
		}
	})
	mqtttest.WaitFor(t, 30*time.Second, "all messages through a full bronze", func() bool {
		b.Scan(b.Checkpoint()+1, func(r buffer.Record) bool {
			if r.Kind == buffer.KindMessage {
				seen[string(r.Payload)] = true
			}
			return true
		})
		b.SetCheckpoint(b.LastSeq())
		for _, p := range want {
			if !seen[string(p)] {
				return false
			}
		}
		return true
	})
	if s, err := b.Stats(); err != nil || s.Bytes > 4096 {
		t.Fatalf("bronze bytes %d over its bound 4096 (err %v)", s.Bytes, err)
	}
	// Room again. Being full is the configured bound, counted as such,
	// never as a failed commit, an error or a failing disk.
	mqtttest.WaitFor(t, 10*time.Second, "full flag cleared", func() bool { return !in.Stats().Full.Load() })
	st := in.Stats()
	if st.FullTotal.Load() == 0 || st.CommitFailures.Load() != 0 || st.CommitFailing.Load() || st.LastError() != "" || st.LastCommitError() != "" {
		t.Errorf("a full Bronze: full_total %d, commit failures %d, failing %v, errors %q %q; want a count of full episodes only",
			st.FullTotal.Load(), st.CommitFailures.Load(), st.CommitFailing.Load(), st.LastError(), st.LastCommitError())
	}
}

func TestRejectedMessagesAreKeptWithReason(t *testing.T) {
	url := mqtttest.StartMochi(t)
	b := openBronze(t, buffer.Options{})
	cfg := testConfig(t, url, "edgeagent-rej", nil)
	in := startIngester(t, b, cfg)
	mqtttest.WaitFor(t, 10*time.Second, "connected", in.Connected)
	pub := mqtttest.NewPublisher(t, url, "device-pub")
	big := bytes.Repeat([]byte("x"), 5000)
	pub.Publish(t, "sensors/d1/telemetry", 1, big)
	// Larger than the connection's read buffer: only its prefix is read in.
	pub.Publish(t, "sensors/d1/telemetry", 1, bytes.Repeat([]byte("y"), 4<<20))
	pub.Publish(t, "sensors/d1/telemetry", 1, []byte(`{"id":"after"}`))
	var rejected []buffer.Record
	mqtttest.WaitFor(t, 10*time.Second, "three records", func() bool {
		n := 0
		rejected = rejected[:0]
		b.Scan(1, func(r buffer.Record) bool {
			n++
			if r.Kind == buffer.KindRejected {
				r.Payload = bytes.Clone(r.Payload)
				rejected = append(rejected, r)
			}
			return true
		})
		return n == 3
	})
	for i, size := range []string{"5000 bytes", "4194304 bytes"} {
		if len(rejected) != 2 || !strings.HasPrefix(rejected[i].Reason, ReasonOversized) || !strings.Contains(rejected[i].Reason, size) {
			t.Fatalf("oversized messages not kept as rejected with their reasons: %+v", rejected)
		}
		if len(rejected[i].Payload) == 0 || len(rejected[i].Payload) > 256 {
			t.Errorf("rejected record keeps %d payload bytes, want a bounded prefix", len(rejected[i].Payload))
		}
	}
	if got := in.Stats().Rejected()[ReasonOversized]; got != 2 {
		t.Errorf("rejected[%s] = %d, want 2", ReasonOversized, got)
	}

	// Topics the broker can deliver but no template explains, and invalid
	// UTF-8, are classified the same way.
	for _, c := range []struct{ topic, reason, detail string }{
		{"sensors/d1/other", ReasonNoTemplate, "topic matches no subscription template"},
		{"sensors//telemetry", ReasonNoTemplate, "it has an empty level"},
		{"sensors/\xff/telemetry", ReasonBadTopic, "not valid UTF-8"},
	} {
		r := in.classify(c.topic, 1, false, false, []byte("{}"), 2)
		if r.Kind != buffer.KindRejected || !strings.HasPrefix(r.Reason, c.reason) || !strings.Contains(r.Reason, c.detail) {
			t.Errorf("classify(%q) = %v %q, want rejected %s (%s)", c.topic, r.Kind, r.Reason, c.reason, c.detail)
		}
	}
}

// With the broker down at start, the agent starts anyway, logs clock ticks,
// and ingests once the broker comes up; a broker restart while running loses
// nothing either (persistent session, mosquitto persistence).
func TestBrokerDownAndRestart(t *testing.T) {
	mosq := mqtttest.StartMosquitto(t, "")
	mosq.Stop()
	b := openBronze(t, buffer.Options{})
	logs := &logbuf.Buffer{}
	cfg := testConfig(t, mosq.URL(), "edgeagent-restart", logs)
	cfg.ClockTick = 20 * time.Millisecond
	in := startIngester(t, b, cfg)
	mqtttest.WaitFor(t, 10*time.Second, "clock ticks with the broker down", func() bool {
		s, _ := b.Stats()
		return s.Records >= 3
	})
	if in.Connected() {
		t.Fatal("connected to a stopped broker")
	}
	mosq.Start()
	mqtttest.WaitFor(t, 20*time.Second, "connected after broker start", in.Connected)
	pub := mqtttest.NewPublisher(t, mosq.URL(), "device-pub")
	first := payloads("before", 100)
	pub.PublishAll(t, "sensors/d1/telemetry", 1, first)
	waitForMessages(t, b, first)

	mosq.Stop()
	// The handler counts the loss before it logs it: wait for both.
	mqtttest.WaitFor(t, 20*time.Second, "disconnect counted and logged", func() bool {
		return in.Stats().Reconnects.Load() >= 1 && strings.Contains(logs.String(), "broker connection lost")
	})
	mosq.Start()
	mqtttest.WaitFor(t, 20*time.Second, "reconnected", in.Connected)
	second := payloads("after", 100)
	pub.PublishAll(t, "sensors/d1/telemetry", 1, second)
	waitForMessages(t, b, append(first, second...))
}

// Messages published while the agent is down are queued by the broker for
// the persistent session and ingested after a restart.
func TestPersistentSessionQueuesWhileDown(t *testing.T) {
	mosq := mqtttest.StartMosquitto(t, "")
	dir := t.TempDir()
	path := filepath.Join(dir, "bronze.db")
	b, err := buffer.Open(path, buffer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, mosq.URL(), "edgeagent-session", nil)
	in, err := New(b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	mqtttest.WaitFor(t, 10*time.Second, "connected", in.Connected)
	in.Close()
	b.Close()

	pub := mqtttest.NewPublisher(t, mosq.URL(), "device-pub")
	want := payloads("queued", 300)
	pub.PublishAll(t, "sensors/d2/telemetry", 1, want)

	b = openBronzeAt(t, path)
	startIngester(t, b, cfg)
	waitForMessages(t, b, want)
}

func openBronzeAt(t *testing.T, path string) *buffer.Bronze {
	t.Helper()
	b, err := buffer.Open(path, buffer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// The embedded broker acknowledges a device's QoS1 publish only after the
// Bronze commit holding it.
func TestEmbeddedAckAfterCommit(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	release := make(chan struct{})
	var commits atomic.Int32
	b := openBronze(t, buffer.Options{BeforeCommit: func() error {
		if commits.Add(1) == 1 {
			<-release // hold the first commit open
		}
		return nil
	}})
	cfg := testConfig(t, "", "edgeagent-embedded", nil)
	cfg.Embedded = addr
	in := startIngester(t, b, cfg)
	if !in.Connected() {
		t.Fatal("embedded broker not up")
	}
	pub := mqtttest.NewPublisher(t, "tcp://"+addr, "device-pub")
	tok := pub.Client.Publish("sensors/e1/telemetry", 1, false, []byte(`{"id":"e"}`))
	mqtttest.WaitFor(t, 10*time.Second, "commit started", func() bool { return commits.Load() >= 1 })
	if tok.WaitTimeout(200 * time.Millisecond) {
		t.Fatal("the device got its PUBACK before the bronze commit finished")
	}
	close(release)
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("no PUBACK after commit: %v", tok.Error())
	}
	if got := messagesIn(t, b); len(got) != 1 {
		t.Fatalf("bronze holds %d messages, want 1", len(got))
	}
	// Other traffic on the gateway bus is not device data.
	pub.Publish(t, "edgeagent/gw/alerts/e1", 1, []byte("{}"))
	pub.Publish(t, "sensors/e1/telemetry", 1, []byte(`{"id":"e2"}`))
	mqtttest.WaitFor(t, 10*time.Second, "second message", func() bool { return len(messagesIn(t, b)) == 2 })
	s, _ := b.Stats()
	if s.Records != 2 {
		t.Errorf("bronze has %d records, want 2 (the alert topic is not ingested)", s.Records)
	}
	// The embedded broker still delivers device data to local subscribers.
	if err := in.Publish("edgeagent/gw/x", []byte("hi"), false, 1); err != nil {
		t.Errorf("publish on the embedded broker: %v", err)
	}
}

func TestClockTicksWhenIdle(t *testing.T) {
	b := openBronze(t, buffer.Options{})
	cfg := embeddedConfig(t, "edgeagent-tick", nil)
	cfg.ClockTick = 10 * time.Millisecond
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	cfg.Clock = func() time.Time { return time.Unix(0, now.Add(int64(time.Second))) }
	in := startIngester(t, b, cfg)
	var ticks []buffer.Record
	mqtttest.WaitFor(t, 10*time.Second, "three ticks", func() bool {
		ticks, _ = b.Read(1, 100)
		return len(ticks) >= 3
	})
	// A tick is committed, but it is not a message.
	if n := in.Stats().Committed.Load(); n != 0 {
		t.Errorf("%d messages committed with only ticks in Bronze", n)
	}
	mqtttest.NewPublisher(t, "tcp://"+cfg.Embedded, "device-tick").Publish(t, "sensors/s1/telemetry", 1, []byte(`{"id":"t"}`))
	if n := in.Stats().Committed.Load(); n != 1 {
		t.Errorf("%d messages committed after one publish acknowledged, want 1", n)
	}
	for i, r := range ticks {
		if r.Kind != buffer.KindTick {
			t.Fatalf("record %d is %v, want tick", i, r.Kind)
		}
		if i > 0 && r.ReceivedAt <= ticks[i-1].ReceivedAt {
			t.Fatalf("tick times do not follow the injected clock: %d then %d", ticks[i-1].ReceivedAt, r.ReceivedAt)
		}
	}
}

// A connection to the embedded broker that never sends CONNECT (a port
// probe left open, a half-open link) is closed after the connect timeout,
// so it does not hold a goroutine for as long as the broker runs.
func TestEmbeddedClosesASilentConnectionAtItsDeadline(t *testing.T) {
	cfg := embeddedConfig(t, "edgeagent-silent", nil)
	cfg.ConnectTimeout = 200 * time.Millisecond
	in, conn := silentConnection(t, cfg)
	wantClosedByBroker(t, conn, "while the broker runs")
	in.Close()
}

// A connection accepted while the embedded broker stops, or one still
// silent then, is closed by the stop itself: mochi's own listener closed
// only the clients it had registered, and its Close waited for the rest
// until the agent's close timeout gave up on them.
func TestEmbeddedStopClosesUnregisteredConnections(t *testing.T) {
	logs := &logbuf.Buffer{}
	cfg := embeddedConfig(t, "edgeagent-unregistered", logs)
	cfg.ConnectTimeout = time.Minute // the deadline does not end it here
	in, conn := silentConnection(t, cfg)
	closed := make(chan struct{})
	go func() { in.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close still waiting after 30 s")
	}
	if strings.Contains(logs.String(), "still open after the close timeout") {
		t.Fatalf("the stop waited out its close timeout for a connection it should have closed:\n%s", logs.String())
	}
	wantClosedByBroker(t, conn, "after the stop")
}

// silentConnection starts an ingester on cfg's embedded broker and opens
// a connection to it that sends nothing.
func silentConnection(t *testing.T, cfg Config) (*Ingester, net.Conn) {
	t.Helper()
	in := startIngester(t, openBronze(t, buffer.Options{}), cfg)
	conn, err := net.Dial("tcp", cfg.Embedded)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	// A device's round trip after it: by then the broker has long accepted
	// the silent connection and is waiting for its CONNECT.
	mqtttest.NewPublisher(t, "tcp://"+cfg.Embedded, "device-after-silent").Publish(t, "sensors/s1/telemetry", 1, []byte(`{"id":"s"}`))
	return in, conn
}

// wantClosedByBroker reads conn until the broker's end is closed: EOF,
// not a timeout.
func wantClosedByBroker(t *testing.T, conn net.Conn, when string) {
	t.Helper()
	if err := conn.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("read on the silent connection %s: %v, want EOF", when, err)
	}
}

// A message under max_payload_bytes whose record is still larger than the
// whole Bronze bound could never be stored: it is refused (a rejected
// record, payload_too_large) instead of holding every message behind it.
func TestRecordLargerThanBronzeIsRefused(t *testing.T) {
	b := openBronze(t, buffer.Options{MaxBytes: 4 << 10})
	cfg := embeddedConfig(t, "edgeagent-huge", nil)
	cfg.MaxPayloadBytes = 4 << 10
	in := startIngester(t, b, cfg)
	pub := mqtttest.NewPublisher(t, "tcp://"+cfg.Embedded, "device-huge")
	pub.Publish(t, "sensors/s1/telemetry", 1, bytes.Repeat([]byte("x"), 4091))
	pub.Publish(t, "sensors/s1/telemetry", 1, []byte(`{"id":"after"}`))
	recs, err := b.Read(1, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].Kind != buffer.KindRejected || !strings.HasPrefix(recs[0].Reason, ReasonOversized+": ") ||
		len(recs[0].Payload) != 256 || recs[1].Kind != buffer.KindMessage || string(recs[1].Payload) != `{"id":"after"}` {
		t.Fatalf("bronze holds %+v", recs)
	}
	if n := in.Stats().Rejected()[ReasonOversized]; n != 1 {
		t.Errorf("payload_too_large counted %d times, want 1", n)
	}
}

// A broker that refuses the connection (here: nothing listens) is named in
// a warning with the reason, not only at debug level by paho.
func TestConnectFailureIsLogged(t *testing.T) {
	b := openBronze(t, buffer.Options{})
	logs := &logbuf.Buffer{}
	url := fmt.Sprintf("tcp://127.0.0.1:%d", mqtttest.FreePort(t))
	cfg := testConfig(t, url, "edgeagent-refused", logs)
	cfg.ReconnectMax = 2 * time.Second // the first retry comes 0.5 to 1 s after
	startIngester(t, b, cfg)
	mqtttest.WaitFor(t, 10*time.Second, "a connect-failure warning", func() bool {
		s := logs.String()
		return strings.Contains(s, "broker connect failed; retrying") && strings.Contains(s, "refused")
	})
	// One line an attempt (paho's per-broker notification doubled them):
	// two lines are two attempts, the first retry's back-off apart.
	var at []time.Time
	mqtttest.WaitFor(t, 10*time.Second, "a second attempt's warning", func() bool {
		at = at[:0]
		for l := range strings.Lines(logs.String()) {
			if !strings.Contains(l, "broker connect failed; retrying") {
				continue
			}
			stamp, _, _ := strings.Cut(strings.TrimPrefix(l, "time="), " ")
			ts, err := time.Parse(time.RFC3339Nano, stamp)
			if err != nil {
				t.Fatalf("log line without a time: %q", l)
			}
			at = append(at, ts)
		}
		return len(at) >= 2
	})
	if gap := at[1].Sub(at[0]); gap < 500*time.Millisecond {
		t.Errorf("two warnings %v apart: one attempt logged twice", gap)
	}
}

// A QoS2 message goes through paho (QoS2's exchange is paho's), yet one
// over max_payload_bytes is still dead-lettered as oversized with its
// size on the wire and a prefix, not read whole nor taken for a message.
func TestOversizedQoS2MessageIsRejected(t *testing.T) {
	url := mqtttest.StartMochi(t)
	b := openBronze(t, buffer.Options{})
	cfg := testConfig(t, url, "edgeagent-qos2", nil)
	cfg.Subscriptions[0].QoS = 2
	in := startIngester(t, b, cfg)
	mqtttest.WaitFor(t, 10*time.Second, "connected", in.Connected)
	pub := mqtttest.NewPublisher(t, url, "device-qos2")
	pub.Publish(t, "sensors/d1/telemetry", 2, bytes.Repeat([]byte("y"), 4<<20))
	pub.Publish(t, "sensors/d1/telemetry", 2, []byte(`{"id":"after"}`))
	var recs []buffer.Record
	mqtttest.WaitFor(t, 10*time.Second, "two records", func() bool {
		recs = recs[:0]
		b.Scan(1, func(r buffer.Record) bool {
			r.Payload = bytes.Clone(r.Payload)
			recs = append(recs, r)
			return true
		})
		return len(recs) == 2
	})
	if r := recs[0]; r.Kind != buffer.KindRejected || r.QoS != 2 || !strings.HasPrefix(r.Reason, ReasonOversized+": ") ||
		!strings.Contains(r.Reason, "4194304 bytes") || len(r.Payload) != 256 {
		t.Fatalf("the oversized QoS2 message is %v QoS %d %q with %d payload bytes, want rejected as oversized (4194304 bytes) with a 256-byte prefix",
			r.Kind, r.QoS, r.Reason, len(r.Payload))
	}
	if r := recs[1]; r.Kind != buffer.KindMessage || r.QoS != 2 || string(r.Payload) != `{"id":"after"}` {
		t.Fatalf("the message after it is %v QoS %d %q", r.Kind, r.QoS, r.Payload)
	}
}

// The first connect to a broker that is down backs off as reconnects do
// (paho's own first-connect retry is a fixed interval): from 1 s,
// doubling, capped at ReconnectMax, with jitter; and a stop ends the wait.
func TestFirstConnectBacksOff(t *testing.T) {
	b := openBronze(t, buffer.Options{})
	url := fmt.Sprintf("tcp://127.0.0.1:%d", mqtttest.FreePort(t))
	cfg := testConfig(t, url, "edgeagent-backoff", nil)
	cfg.ReconnectMax = 6 * time.Second
	cfg.rand = func() float64 { return 0 } // the jitter's lower end: d/2
	var mu sync.Mutex
	var waits []time.Duration
	stopped := make(chan error, 1)
	cfg.connectWait = func(ctx context.Context, d time.Duration) error {
		mu.Lock()
		waits = append(waits, d)
		n := len(waits)
		mu.Unlock()
		if n < 6 {
			return nil // recorded, not waited: the next attempt follows
		}
		<-ctx.Done() // the sixth wait lasts until the stop
		select {
		case stopped <- ctx.Err():
		default: // paho may try once more before it sees the stop
		}
		return ctx.Err()
	}
	in := startIngester(t, b, cfg)
	mqtttest.WaitFor(t, 10*time.Second, "six first-connect retries", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(waits) >= 6
	})
	mu.Lock()
	got := slices.Clone(waits)
	mu.Unlock()
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second, 3 * time.Second}
	if !slices.Equal(got, want) {
		t.Fatalf("first-connect waits %v, want %v", got, want)
	}
	in.Close()
	select {
	case err := <-stopped:
		if err == nil {
			t.Fatal("the wait ended without its context ending")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the first-connect back-off")
	}
}

// A broker that comes back without the agent's session (no persistence)
// has lost what it queued for the agent: the reconnect says so, counted.
// A first start with an empty Bronze has no session to lose; a first
// start over an earlier run's Bronze has.
func TestLostSessionIsWarned(t *testing.T) {
	mosq := mqtttest.StartMosquitto(t, "")
	b := openBronze(t, buffer.Options{})
	logs := &logbuf.Buffer{}
	in := startIngester(t, b, testConfig(t, mosq.URL(), "edgeagent-session", logs))
	mqtttest.WaitFor(t, 10*time.Second, "connected", in.Connected)
	if n := in.Stats().SessionsLost.Load(); n != 0 {
		t.Fatalf("first start: %d sessions lost, want 0", n)
	}
	// The broker keeps the session across a restart with persistence.
	mosq.Stop()
	mosq.Start()
	mqtttest.WaitFor(t, 30*time.Second, "reconnected", func() bool { return in.Connected() && in.Stats().Reconnects.Load() == 1 })
	if n := in.Stats().SessionsLost.Load(); n != 0 {
		t.Fatalf("a restart that kept the session counted %d lost", n)
	}
	mosq.Stop()
	mosq.ForgetSessions()
	mosq.Start()
	mqtttest.WaitFor(t, 30*time.Second, "the lost session counted", func() bool { return in.Stats().SessionsLost.Load() == 1 })
	if !strings.Contains(logs.String(), "the broker had no session for the agent") {
		t.Errorf("no warning about the lost session:\n%s", logs.String())
	}

	// A restarted agent expects its session back, if it had one at this
	// broker under this client id; a new client id has none to lose.
	sessionFile := filepath.Join(t.TempDir(), "mqtt-session")
	cfg := testConfig(t, mosq.URL(), "edgeagent-resuming", nil)
	cfg.SessionFile = sessionFile
	first := startIngester(t, openBronze(t, buffer.Options{}), cfg)
	mqtttest.WaitFor(t, 10*time.Second, "the session recorded", func() bool { _, err := os.Stat(sessionFile); return err == nil })
	first.Close()
	renamed := cfg
	renamed.ClientID = "edgeagent-renamed"
	in2 := startIngester(t, openBronze(t, buffer.Options{}), renamed)
	mqtttest.WaitFor(t, 10*time.Second, "connected under the new client id", in2.Connected)
	if n := in2.Stats().SessionsLost.Load(); n != 0 {
		t.Fatalf("a new client id counted %d lost sessions", n)
	}
	in2.Close()
	mosq.Stop()
	mosq.ForgetSessions()
	mosq.Start()
	in3 := startIngester(t, openBronze(t, buffer.Options{}), renamed)
	mqtttest.WaitFor(t, 10*time.Second, "a restart whose session the broker lost counted", func() bool { return in3.Stats().SessionsLost.Load() == 1 })
}

// denyReading is a mochi hook that lets every client connect and publish
// but subscribe to nothing, as a broker's ACL can.
type denyReading struct{ mochi.HookBase }

func (denyReading) ID() string { return "deny-reading" }
func (denyReading) Provides(b byte) bool {
	return b == mochi.OnConnectAuthenticate || b == mochi.OnACLCheck
}
func (denyReading) OnConnectAuthenticate(*mochi.Client, mpackets.Packet) bool { return true }
func (denyReading) OnACLCheck(_ *mochi.Client, _ string, write bool) bool     { return write }

// A subscription the broker refuses (an ACL; mosquitto 2.0 grants it and
// delivers nothing, mochi answers 0x80) is an error that stays visible,
// not a connected agent that silently receives nothing.
func TestRefusedSubscriptionIsReported(t *testing.T) {
	url := mqtttest.StartMochiWith(t, new(denyReading))
	b := openBronze(t, buffer.Options{})
	logs := &logbuf.Buffer{}
	in := startIngester(t, b, testConfig(t, url, "edgeagent-acl", logs))
	mqtttest.WaitFor(t, 10*time.Second, "the refusal recorded", func() bool { _, refused := in.Stats().SubscribeError(); return refused })
	if msg, _ := in.Stats().SubscribeError(); !strings.Contains(msg, "sensors/+/telemetry refused") || !strings.Contains(logs.String(), "the broker refused a subscription") {
		t.Errorf("subscribe error %q, log:\n%s", msg, logs.String())
	}
}
