package ingest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/testrig/logbuf"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
)

// embeddedConfig is testConfig for the embedded broker on a free port.
func embeddedConfig(t testing.TB, clientID string, logs io.Writer) Config {
	t.Helper()
	cfg := testConfig(t, "", clientID, logs)
	cfg.Embedded = fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	return cfg
}

// rawClient connects to addr as an MQTT 3.1.1 client with a bare TCP
// connection and reads the CONNACK; it reads nothing after what the caller
// asks for, so its socket fills like a stuck subscriber's would.
func rawClient(t testing.TB, addr, id string) net.Conn {
	t.Helper()
	return rawClientV(t, addr, id, 4)
}

// rawSubscribe subscribes conn to filter at qos and reads the SUBACK;
// nothing is read after it.
func rawSubscribe(t testing.TB, conn net.Conn, filter string, qos byte) {
	t.Helper()
	sub := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, ProtocolVersion: 4, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: filter, Qos: qos}}}
	var buf bytes.Buffer
	if err := sub.SubscribeEncode(&buf); err != nil {
		t.Fatal(err)
	}
	rawRoundTrip(t, conn, buf.Bytes(), 5)
}

// rawClientV is rawClient speaking MQTT protocol version v (4: 3.1.1, 5).
func rawClientV(t testing.TB, addr, id string, v byte) net.Conn {
	t.Helper()
	return rawConnect(t, addr, id, v, true)
}

// rawConnect connects as id with protocol version v and the clean-session
// flag clean, and reads the CONNACK.
func rawConnect(t testing.TB, addr, id string, v byte, clean bool) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: v,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), Clean: clean, Keepalive: 60, ClientIdentifier: id}}
	var buf bytes.Buffer
	if err := pk.ConnectEncode(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	if typ, _ := readRawPacket(t, conn); typ != packets.Connack {
		t.Fatalf("got packet type %d, want CONNACK", typ)
	}
	return conn
}

// readRawPacket reads one packet and returns its type and body.
func readRawPacket(t testing.TB, conn net.Conn) (byte, []byte) {
	t.Helper()
	if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	r := byteReader{conn} // reads no further than the packet
	hb, err := r.ReadByte()
	if err != nil {
		t.Fatalf("read packet header: %v", err)
	}
	n, _, err := packets.DecodeLength(r)
	if err != nil {
		t.Fatalf("read packet length: %v", err)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		t.Fatalf("read packet body: %v", err)
	}
	return hb >> 4, body
}

// byteReader reads a connection a byte at a time, unbuffered.
type byteReader struct{ io.Reader }

func (r byteReader) ReadByte() (byte, error) {
	var b [1]byte
	_, err := io.ReadFull(r.Reader, b[:])
	return b[0], err
}

// rawRoundTrip writes req and reads a reply of n bytes.
func rawRoundTrip(t testing.TB, conn net.Conn, req []byte, n int) {
	t.Helper()
	if _, err := conn.Write(req); err != nil {
		t.Fatal(err)
	}
	if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(conn, make([]byte, n)); err != nil {
		t.Fatalf("read %d-byte reply: %v", n, err)
	}
}

// A local subscriber that stops reading fills its write queue; the
// embedded broker then drops what it would send it, counts the drops and
// warns, and device data keeps being ingested and acknowledged.
func TestEmbeddedStuckSubscriberIsCountedNotBlocking(t *testing.T) {
	logs := &logbuf.Buffer{}
	b := openBronze(t, buffer.Options{})
	cfg := embeddedConfig(t, "edgeagent-stuck", logs)
	cfg.EmbeddedMaxPendingWrites = 4
	in := startIngester(t, b, cfg)

	rawSubscribe(t, rawClient(t, cfg.Embedded, "stuck-subscriber"), "local/#", 0)

	// Far more than the loopback socket buffers hold: the broker's writer
	// blocks, its queue of four fills, and the rest is dropped.
	payload := bytes.Repeat([]byte("x"), 64<<10)
	for i := 0; i < 1000 && in.Stats().BrokerDropped.Load() == 0; i++ {
		if err := in.Publish("local/x", payload, false, 0); err != nil {
			t.Fatalf("local publish %d: %v", i, err)
		}
	}
	mqtttest.WaitFor(t, 10*time.Second, "drops counted", func() bool { return in.Stats().BrokerDropped.Load() > 0 })
	if !strings.Contains(logs.String(), "write queue is full") {
		t.Errorf("no warning about the full write queue in the log:\n%s", logs.String())
	}

	pub := mqtttest.NewPublisher(t, "tcp://"+cfg.Embedded, "device-beside-stuck")
	pub.Publish(t, "sensors/d1/telemetry", 1, []byte(`{"id":"after-drops"}`))
	if got := messagesIn(t, b); len(got) != 1 || got[`{"id":"after-drops"}`].Topic != "sensors/d1/telemetry" {
		t.Fatalf("bronze holds %v, want the device's message", got)
	}
}

// BenchmarkEmbeddedConnectionHeap reports the embedded broker's heap and
// goroutine stacks per connected client (devices connect and stay
// connected), at mqtt.embedded.max_pending_writes' default and at mochi's
// own 8,192. The broker makes each client's write queue at connect, so its
// size is a floor under memory per device connection.
func BenchmarkEmbeddedConnectionHeap(b *testing.B) {
	for _, pending := range []int{256, 8192} {
		b.Run(fmt.Sprintf("max_pending_writes=%d", pending), func(b *testing.B) {
			const conns = 500
			for range b.N {
				bz := openBronze(b, buffer.Options{})
				cfg := embeddedConfig(b, "edgeagent-heap", nil)
				cfg.EmbeddedMaxPendingWrites = pending
				startIngester(b, bz, cfg)
				g0 := runtime.NumGoroutine()
				heap0, stack0 := memInUse()
				for i := range conns {
					rawClient(b, cfg.Embedded, fmt.Sprintf("device-%04d", i))
				}
				heap1, stack1 := memInUse()
				b.ReportMetric(float64(heap1-heap0)/conns, "heap-B/conn")
				b.ReportMetric(float64(stack1-stack0)/conns, "stack-B/conn")
				b.ReportMetric(float64(runtime.NumGoroutine()-g0)/conns, "goroutines/conn")
			}
		})
	}
}

// memInUse returns the heap and goroutine stacks in use after a collection.
func memInUse() (heap, stacks int64) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse), int64(m.StackInuse)
}

// One connection's QoS1 publishes are pipelined: the broker reads the next
// while earlier ones wait for their group commit, so a single connection (a
// bridge, a PLC gateway) fills commits instead of getting one message into
// each.
func TestEmbeddedPipelinesOneConnection(t *testing.T) {
	b := openBronze(t, buffer.Options{})
	cfg := embeddedConfig(t, "edgeagent-pipeline", nil)
	cfg.CommitInterval = 20 * time.Millisecond
	in := startIngester(t, b, cfg)
	const n = 300
	commits0 := in.Stats().Commits.Load()
	mqtttest.NewPublisher(t, "tcp://"+cfg.Embedded, "bridge").PublishAll(t, "sensors/d1/telemetry", 1, payloads("p", n))
	if got := len(messagesIn(t, b)); got != n {
		t.Fatalf("bronze holds %d messages, want %d", got, n)
	}
	// Acknowledged one commit at a time, the connection would need n commits.
	if c := in.Stats().Commits.Load() - commits0; c > n/10 {
		t.Errorf("%d commits for %d messages on one connection: not pipelined", c, n)
	}
}

// A local subscriber on the embedded broker gets a device's QoS1 message
// only once it is durable, as the device gets its PUBACK.
func TestEmbeddedLocalDeliveryAfterCommit(t *testing.T) {
	b, held, release := openBronzeHoldingFirstCommit(t)
	cfg := embeddedConfig(t, "edgeagent-local", nil)
	startIngester(t, b, cfg)

	got := make(chan string, 1)
	sub := mqtttest.NewPublisher(t, "tcp://"+cfg.Embedded, "local-dashboard")
	if tok := sub.Client.Subscribe("sensors/+/telemetry", 1, func(_ paho.Client, m paho.Message) {
		got <- string(m.Payload())
	}); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	dev := mqtttest.NewPublisher(t, "tcp://"+cfg.Embedded, "device-local")
	tok := dev.Client.Publish("sensors/d7/telemetry", 1, false, []byte(`{"id":"l1"}`))
	mqtttest.WaitFor(t, 10*time.Second, "commit started", held.Load)
	select {
	case m := <-got:
		t.Fatalf("the local subscriber got %s before the commit", m)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("no PUBACK after the commit: %v", tok.Error())
	}
	select {
	case m := <-got:
		if m != `{"id":"l1"}` {
			t.Errorf("the local subscriber got %s", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the local subscriber never got the device's message")
	}
}

// Pipelined PUBACKs go out in the order the publishes came in, for MQTT
// 3.1.1 and 5 clients alike (MQTT-4.6.0-2: a server acknowledges QoS1
// publishes in the order it received them).
func TestEmbeddedPubacksInOrder(t *testing.T) {
	for _, v := range []byte{4, 5} {
		t.Run(fmt.Sprintf("protocol=%d", v), func(t *testing.T) {
			b := openBronze(t, buffer.Options{})
			cfg := embeddedConfig(t, "edgeagent-order", nil)
			cfg.MaxCommitRecords = 7 // the publishes span several commits
			startIngester(t, b, cfg)
			conn := rawClientV(t, cfg.Embedded, fmt.Sprintf("raw-v%d", v), v)
			const n = 40
			if _, err := conn.Write(encodePublishes(t, v, "raw", n)); err != nil {
				t.Fatal(err)
			}
			readPubacksInOrder(t, conn, n)
			if got := len(messagesIn(t, b)); got != n {
				t.Fatalf("bronze holds %d messages, want %d", got, n)
			}
		})
	}
}

// A device that publishes faster than its publishes commit has at most the
// receive maximum (1,024) handed over and unacknowledged; its connection is
// then not read until acknowledgements catch up, so a client that never
// waits costs bounded memory. Everything is stored and acknowledged once
// the commits go through.
func TestEmbeddedBackpressureAtReceiveMaximum(t *testing.T) {
	b, _, release := openBronzeHoldingFirstCommit(t)
	cfg := embeddedConfig(t, "edgeagent-backpressure", nil)
	cfg.MaxCommitRecords = 5000
	in := startIngester(t, b, cfg)
	conn := rawClient(t, cfg.Embedded, "flood")
	const n = 3000
	flood := encodePublishes(t, 4, "flood", n)
	writeErr := make(chan error, 1)
	go func() { _, err := conn.Write(flood); writeErr <- err }()
	mqtttest.WaitFor(t, 10*time.Second, "the receive maximum handed over", func() bool { return in.Stats().Received.Load() >= 1024 })
	// A bound is shown by what does not happen: give the broker time to
	// read past it if it could.
	time.Sleep(200 * time.Millisecond)
	if got := in.Stats().Received.Load(); got != 1024 {
		t.Fatalf("%d publishes handed over with none acknowledged, want the receive maximum 1024", got)
	}
	close(release)
	if err := <-writeErr; err != nil {
		t.Fatal(err)
	}
	readPubacksInOrder(t, conn, n)
	if got := len(messagesIn(t, b)); got != n {
		t.Fatalf("bronze holds %d messages, want %d", got, n)
	}
}

// openBronzeHoldingFirstCommit opens a Bronze whose first commit waits for
// release; held reports that it started.
func openBronzeHoldingFirstCommit(t *testing.T) (b *buffer.Bronze, held *atomic.Bool, release chan struct{}) {
	t.Helper()
	held, release = new(atomic.Bool), make(chan struct{})
	b = openBronze(t, buffer.Options{BeforeCommit: func() error {
		if held.CompareAndSwap(false, true) {
			<-release
		}
		return nil
	}})
	return b, held, release
}

// encodePublishes encodes QoS1 publishes 1..n of device dev (packet id i,
// reading id dev-i) in MQTT protocol version v.
func encodePublishes(t testing.TB, v byte, dev string, n int) []byte {
	t.Helper()
	var buf bytes.Buffer
	for i := 1; i <= n; i++ {
		pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, ProtocolVersion: v,
			TopicName: "sensors/" + dev + "/telemetry", PacketID: uint16(i), Payload: fmt.Appendf(nil, `{"id":"%s-%d"}`, dev, i)}
		if err := pk.PublishEncode(&buf); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

// readPubacksInOrder reads n successful PUBACKs for packet ids 1..n, in order.
func readPubacksInOrder(t testing.TB, conn net.Conn, n int) {
	t.Helper()
	for want := 1; want <= n; want++ {
		typ, body := readRawPacket(t, conn)
		if typ != packets.Puback || len(body) < 2 {
			t.Fatalf("packet %d: type %d, %d bytes, want a PUBACK", want, typ, len(body))
		}
		if id := binary.BigEndian.Uint16(body); id != uint16(want) {
			t.Fatalf("PUBACK %d acknowledges packet %d", want, id)
		}
		if len(body) > 2 && body[2] != 0 {
			t.Fatalf("PUBACK %d has reason code %#x, want success", want, body[2])
		}
	}
}

// A connection's acknowledgement state goes with it: devices that
// reconnect all day leave nothing behind.
func TestEmbeddedForgetsDisconnectedClients(t *testing.T) {
	b := openBronze(t, buffer.Options{})
	cfg := embeddedConfig(t, "edgeagent-forget", nil)
	in := startIngester(t, b, cfg)
	acks := in.src.(*embedded).acks
	count := func() (n int) {
		acks.conns.Range(func(any, any) bool { n++; return true })
		return n
	}
	for i := range 5 {
		conn := rawClient(t, cfg.Embedded, fmt.Sprintf("brief-%d", i))
		if _, err := conn.Write(encodePublishes(t, 4, fmt.Sprintf("brief%d", i), 3)); err != nil {
			t.Fatal(err)
		}
		readPubacksInOrder(t, conn, 3)
		if count() == 0 {
			t.Fatal("no acknowledgement state while a device is connected")
		}
		conn.Close()
	}
	mqtttest.WaitFor(t, 10*time.Second, "every disconnected client forgotten", func() bool { return count() == 0 })
	if got := len(messagesIn(t, b)); got != 15 {
		t.Fatalf("bronze holds %d messages, want 15", got)
	}
}

// A burst of local QoS1 publishes (a backlog's alerts) far larger than a
// client's write queue reaches a QoS1 subscriber that keeps reading: the
// publishes wait for it instead of overflowing its queue.
func TestEmbeddedLocalBurstReachesAReadingSubscriber(t *testing.T) {
	logs := &logbuf.Buffer{}
	b := openBronze(t, buffer.Options{})
	cfg := embeddedConfig(t, "edgeagent-burst", logs)
	cfg.EmbeddedMaxPendingWrites = 16
	in := startIngester(t, b, cfg)

	var got atomic.Int64
	sub := mqtttest.NewPublisher(t, "tcp://"+cfg.Embedded, "local-plc")
	if tok := sub.Client.Subscribe("local/#", 1, func(paho.Client, paho.Message) { got.Add(1) }); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	const n = 2000
	for i := range n {
		if err := in.Publish("local/alert", []byte(strconv.Itoa(i)), false, 1); err != nil {
			t.Fatalf("local publish %d: %v", i, err)
		}
	}
	mqtttest.WaitFor(t, 30*time.Second, "every local message delivered", func() bool { return got.Load() == n })
	if d := in.Stats().BrokerDropped.Load(); d != 0 {
		t.Errorf("%d local messages dropped for a subscriber that kept reading", d)
	}
	if strings.Contains(logs.String(), "not acknowledging") {
		t.Errorf("a reading subscriber was taken for a stuck one:\n%s", logs.String())
	}
}

// A QoS1 subscriber that stops reading holds local publishes back only
// for a while: then it is taken for a stuck one, its messages are dropped
// and counted, and publishing goes on without waiting for it.
func TestEmbeddedStuckQoS1SubscriberStopsHoldingPublishes(t *testing.T) {
	logs := &logbuf.Buffer{}
	b := openBronze(t, buffer.Options{})
	cfg := embeddedConfig(t, "edgeagent-stuck1", logs)
	cfg.EmbeddedMaxPendingWrites = 4
	in := startIngester(t, b, cfg)

	rawSubscribe(t, rawClient(t, cfg.Embedded, "stuck-qos1"), "local/#", 1) // no PUBACK is ever sent

	done := make(chan error, 1)
	go func() {
		for i := range 100 {
			if err := in.Publish("local/x", []byte(strconv.Itoa(i)), false, 1); err != nil {
				done <- fmt.Errorf("local publish %d: %w", i, err)
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("local publishes still held by a subscriber that never acknowledges")
	}
	if !strings.Contains(logs.String(), "not acknowledging") || !strings.Contains(logs.String(), "stuck-qos1") {
		t.Errorf("no warning naming the stuck subscriber:\n%s", logs.String())
	}
}

// The built-in broker bounds a packet by max_payload_bytes (plus room for
// the topic): a payload a little over it is dead-lettered as usual; a huge
// one closes the sender's connection, counted and logged, without being
// read into memory, and other devices go on.
func TestEmbeddedBoundsPacketSize(t *testing.T) {
	logs := &logbuf.Buffer{}
	b := openBronze(t, buffer.Options{})
	cfg := embeddedConfig(t, "edgeagent-bound", logs)
	cfg.MaxPayloadBytes = 4 << 10
	in := startIngester(t, b, cfg)

	pub := mqtttest.NewPublisher(t, "tcp://"+cfg.Embedded, "device-over")
	pub.Publish(t, "sensors/d1/telemetry", 1, bytes.Repeat([]byte("x"), 5<<10))
	if got := in.Stats().Rejected()[ReasonOversized]; got != 1 {
		t.Fatalf("payload just over the bound: rejected %d, want 1 (dead-lettered)", got)
	}

	huge := rawClient(t, cfg.Embedded, "device-huge")
	// A PUBLISH header announcing 64 MiB; the broker must refuse it on the
	// header, before its body arrives.
	if _, err := huge.Write([]byte{0x30, 0x80, 0x80, 0x80, 0x20}); err != nil {
		t.Fatal(err)
	}
	mqtttest.WaitFor(t, 10*time.Second, "the huge packet counted", func() bool { return in.Stats().Rejected()[ReasonOversized] == 2 })
	if !strings.Contains(logs.String(), "larger than max_payload_bytes") || !strings.Contains(logs.String(), "device-huge") {
		t.Errorf("no warning naming the client:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), `msg=""`) {
		t.Errorf("a log line without a message:\n%s", logs.String())
	}
	pub.Publish(t, "sensors/d2/telemetry", 1, []byte(`{"id":"after"}`))
	if got := messagesIn(t, b); got[`{"id":"after"}`].Topic != "sensors/d2/telemetry" {
		t.Fatalf("bronze holds %v, want the later device's message", got)
	}
}

// A device publish on a subscription's filter that names no device (an
// empty {device} level) is kept in Bronze as rejected, with its reason,
// as through an external broker: it was acknowledged and must not vanish.
func TestEmbeddedEmptyDeviceLevelIsRejectedNotDropped(t *testing.T) {
	b := openBronze(t, buffer.Options{})
	cfg := embeddedConfig(t, "edgeagent-emptylevel", nil)
	in := startIngester(t, b, cfg)
	pub := mqtttest.NewPublisher(t, "tcp://"+cfg.Embedded, "device-empty")
	pub.Publish(t, "sensors//telemetry", 1, []byte(`{"id":"e1"}`))
	pub.Publish(t, "other/d1/telemetry", 1, []byte(`{"id":"bus"}`)) // not on the filter: the gateway's own bus
	pub.Publish(t, "sensors/d1/telemetry", 1, []byte(`{"id":"after"}`))
	var recs []buffer.Record
	mqtttest.WaitFor(t, 10*time.Second, "the message after", func() bool {
		recs = recs[:0]
		if err := b.Scan(1, func(r buffer.Record) bool {
			if r.Kind != buffer.KindTick {
				r.Payload = bytes.Clone(r.Payload)
				recs = append(recs, r)
			}
			return true
		}); err != nil {
			t.Fatal(err)
		}
		return len(recs) > 0 && string(recs[len(recs)-1].Payload) == `{"id":"after"}`
	})
	if len(recs) != 2 || recs[0].Kind != buffer.KindRejected || recs[0].Topic != "sensors//telemetry" ||
		!strings.HasPrefix(recs[0].Reason, ReasonNoTemplate+": ") || !strings.Contains(recs[0].Reason, "empty level") {
		t.Fatalf("records %+v, want the empty-level publish rejected (%s) and then the next message", recs, ReasonNoTemplate)
	}
	if got := in.Stats().Rejected()[ReasonNoTemplate]; got != 1 {
		t.Errorf("rejected[%s] = %d, want 1", ReasonNoTemplate, got)
	}
}

// mochi's warning for a connection the agent closed itself (at a stop or a
// reload) is debug, not a warning; other read errors stay warnings, with
// a message.
func TestBrokerLogDemotesOwnClosedConnections(t *testing.T) {
	logs := &logbuf.Buffer{}
	var closing atomic.Bool
	log := slog.New(untitled{Handler: slog.NewTextHandler(logs, nil), closing: &closing})
	closed := &net.OpError{Op: "read", Net: "tcp", Err: net.ErrClosed}
	// While the broker runs (a client id taken over) it stays a warning.
	log.Warn("", "listener", "tcp", "error", closed)
	if n := strings.Count(logs.String(), "closed network connection"); n != 1 {
		t.Fatalf("a close while the broker runs: %d warnings, want 1:\n%s", n, logs)
	}
	closing.Store(true)
	log.Warn("", "listener", "tcp", "error", closed)
	log.Warn("", "listener", "tcp", "error", errors.New("packet too large"))
	out := logs.String()
	if n := strings.Count(out, "closed network connection"); n != 1 {
		t.Errorf("a connection closed by the agent's stop was logged at warning level:\n%s", out)
	}
	if !strings.Contains(out, `level=WARN msg="broker: a client's connection ended with an error" listener=tcp error="packet too large"`) {
		t.Errorf("another read error was not kept as a warning:\n%s", out)
	}
}

// A disconnected client's persistent session is dropped after
// mqtt.embedded.session_expiry: mochi's own default keeps it for ever, and
// an audit grew the agent by 9-10 KB of memory for every client id that
// ever connected with a persistent session.
func TestEmbeddedSessionsExpire(t *testing.T) {
	b := openBronze(t, buffer.Options{})
	cfg := embeddedConfig(t, "edgeagent-expiry", nil)
	cfg.EmbeddedSessionExpiry = time.Second
	in := startIngester(t, b, cfg)
	srv := in.src.(*embedded).srv
	conn := rawConnect(t, cfg.Embedded, "persistent-1", 4, false)
	rawSubscribe(t, conn, "alerts/#", 1)
	conn.Close()
	session := func() bool { _, ok := srv.Clients.Get("persistent-1"); return ok }
	if !session() {
		t.Fatal("no session for the persistent client right after it left")
	}
	mqtttest.WaitFor(t, 10*time.Second, "the disconnected session expired", func() bool { return !session() })
	// Its subscriptions go with it (mochi leaves them in the topic index).
	if subs := srv.Topics.Subscribers("alerts/x").Subscriptions; len(subs) != 0 {
		t.Fatalf("the expired session's subscriptions stay: %v", subs)
	}
}

// The agent drops mochi's packet fixtures at init (see the init in
// embedded.go); mochi's broker code never reads them.
func TestMochiPacketFixturesAreDropped(t *testing.T) {
	if packets.TPacketData != nil {
		t.Fatalf("packets.TPacketData holds %d cases after init, want nil", len(packets.TPacketData))
	}
}
