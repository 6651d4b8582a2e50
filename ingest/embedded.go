package ingest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgeagent/edgeagent/internal/mochilisten"
)

// mochi's packets package keeps its tests' packet fixtures in a non-test
// file (tpackets.go): a map of about 1 MB that its init builds in every
// binary that links the broker, and that only mochi's own tests read. Left
// alone it is live heap for the agent's whole life, and full of pointers,
// so every collection scans it. Dropped here, the first collection frees it.
func init() { packets.TPacketData = nil }

// embedded runs the built-in mochi broker and ingests inside its publish
// path: the hook hands each device message to the committer, and the
// device's PUBACK goes out only after the Bronze commit (sent by the
// ackWriter for QoS1, by mochi after the hook returns for QoS2). This is
// stronger than subscribing over loopback, where the broker would
// acknowledge the device before the agent had stored anything and a crash of
// the one process would lose both copies.
type embedded struct {
	in   *Ingester
	srv  *mochi.Server
	dl   *connectDeadline
	acks *ackWriter
	up   atomic.Bool
	// closing is set while stop closes the broker: the read errors of
	// the connections it closes are no warning then.
	closing atomic.Bool
	// stalled are the local subscribers taken for ones that stopped
	// reading (see waitForSubscribers).
	stalledMu sync.Mutex
	stalled   map[string]bool
}

func (e *embedded) start(ctx context.Context) error {
	cfg := e.in.cfg
	// mochi logs every connect at info; keep its warnings only.
	mlog := slog.New(slog.NewTextHandler(io.Discard, nil))
	if cfg.Logger.Enabled(ctx, slog.LevelWarn) {
		mlog = slog.New(untitled{Handler: cfg.Logger.Handler(), closing: &e.closing}).With("component", "broker")
	}
	caps := mochi.NewDefaultServerCapabilities()
	caps.MaximumClientWritesPending = int32(cfg.EmbeddedMaxPendingWrites)
	if cfg.EmbeddedSessionExpiry > 0 {
		// mochi keeps sessions for ever by default: memory for every
		// client id that ever connected with a persistent session.
		caps.MaximumSessionExpiryInterval = uint32(min(max(cfg.EmbeddedSessionExpiry/time.Second, 1), math.MaxUint32))
	}
	if cfg.MaxPayloadBytes > 0 {
		// mochi reads a packet whole before any hook sees it: bound it, or
		// one huge publish costs its size in memory. A payload up to
		// embeddedPacketSlack over max_payload_bytes is still taken and
		// dead-lettered; a larger packet closes the device's connection.
		caps.MaximumPacketSize = uint32(min(int64(cfg.MaxPayloadBytes)+embeddedPacketSlack, math.MaxUint32))
	}
	srv := mochi.New(&mochi.Options{InlineClient: true, Logger: mlog, Capabilities: caps})
	if err := srv.AddHook(new(allowHook), nil); err != nil {
		return fmt.Errorf("embedded broker: auth hook: %w", err)
	}
	e.acks = &ackWriter{srv: srv, log: e.in.com.log, inflight: int(caps.ReceiveMaximum), queues: map[*mochi.Client][]committedPublish{}}
	if err := srv.AddHook(&ingestHook{in: e.in, acks: e.acks}, nil); err != nil {
		return fmt.Errorf("embedded broker: ingest hook: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.Embedded)
	if err != nil {
		return fmt.Errorf("embedded broker: listen on %s: %w", cfg.Embedded, err)
	}
	e.dl = &connectDeadline{Listener: ln, timeout: cfg.ConnectTimeout, log: e.in.com.log}
	if err := srv.AddListener(mochilisten.Serve("tcp", e.dl)); err != nil {
		ln.Close()
		return fmt.Errorf("embedded broker: listen on %s: %w", cfg.Embedded, err)
	}
	if err := srv.Serve(); err != nil {
		return fmt.Errorf("embedded broker: serve on %s: %w", cfg.Embedded, err)
	}
	e.srv = srv
	e.up.Store(true)
	e.in.stats.Connected.Store(true)
	e.in.com.log.Info("embedded broker listening", "listen", cfg.Embedded, "subscriptions", filters(cfg.Subscriptions))
	return nil
}

func (e *embedded) stop() {
	e.closing.Store(true)
	if e.srv != nil {
		// mochi's Close waits for every connection's goroutine; the
		// listener (mochilisten) closes every connection it accepted,
		// devices reconnecting meanwhile included. This bounds the wait
		// whatever else holds a connection's goroutine (a hook), so SIGTERM
		// always ends the agent. The goroutine left behind, if any, ends
		// with the process, or lives on past a reload until mochi's Close
		// returns.
		done := make(chan struct{})
		go func() {
			defer close(done)
			e.srv.Close()
			// With the connections closed, acknowledgements still being
			// written fail at once.
			e.acks.wg.Wait()
		}()
		select {
		case <-done:
		case <-time.After(brokerCloseTimeout):
			e.in.com.log.Warn("embedded broker: connections still open after the close timeout; stopping without them",
				"timeout", brokerCloseTimeout, "clients_connected", atomic.LoadInt64(&e.srv.Info.ClientsConnected))
		}
	}
	e.up.Store(false)
	e.in.stats.Connected.Store(false)
}

func (e *embedded) connected() bool { return e.up.Load() }

// untitled gives mochi's log lines that have no message one (it logs a
// client's read error, such as a packet over the size bound, as msg=""),
// and makes debug the read errors of connections the agent closes while
// it stops the broker (a stop, a reload). Other closes, such as a client
// id taken over by a new connection, stay warnings.
type untitled struct {
	slog.Handler
	closing *atomic.Bool
}

func (h untitled) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "" {
		r.Message = "broker: a client's connection ended with an error"
	}
	if h.closing != nil && h.closing.Load() && closedByUs(r) {
		// The agent is closing the broker (stopping or reloading): no
		// warning, debug at most.
		if !h.Handler.Enabled(ctx, slog.LevelDebug) {
			return nil
		}
		r.Level = slog.LevelDebug
	}
	return h.Handler.Handle(ctx, r)
}

// closedByUs reports whether r's error is a read on a connection this
// process closed.
func closedByUs(r slog.Record) bool {
	closed := false
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && errors.Is(err, net.ErrClosed) {
			closed = true
		}
		return !closed
	})
	return closed
}

func (h untitled) WithAttrs(as []slog.Attr) slog.Handler {
	return untitled{Handler: h.Handler.WithAttrs(as), closing: h.closing}
}
func (h untitled) WithGroup(name string) slog.Handler {
	return untitled{Handler: h.Handler.WithGroup(name), closing: h.closing}
}

// embeddedPacketSlack is what a packet may hold besides its payload: the
// largest topic, a packet id, MQTT 5 properties.
const embeddedPacketSlack = 64 << 10

// brokerCloseTimeout bounds the embedded broker's shutdown.
const brokerCloseTimeout = 10 * time.Second

// connectDeadline gives every accepted connection until timeout to send its
// CONNECT. mochi sets no read deadline before CONNECT (after it, the
// client's keepalive sets one), so a connection that never speaks — a port
// probe left open, a half-open link — would keep its goroutine for as long
// as the broker runs.
type connectDeadline struct {
	net.Listener
	timeout time.Duration
	log     *slog.Logger
}

func (l *connectDeadline) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		// An error from Accept would stop mochi serving: a connection whose
		// deadline cannot be set is dropped here instead.
		if err := c.SetDeadline(time.Now().Add(l.timeout)); err != nil {
			l.log.Warn("embedded broker: dropping a connection", "remote", c.RemoteAddr(), "err", err)
			c.Close()
			continue
		}
		return c, nil
	}
}

// Publish publishes on the embedded broker (for local alerts and
// republished aggregates). A QoS 1 or 2 publish first waits for the
// topic's subscribers to catch up (see waitForSubscribers).
func (in *Ingester) Publish(topicName string, payload []byte, retain bool, qos byte) error {
	e, ok := in.src.(*embedded)
	if !ok || e.srv == nil {
		return fmt.Errorf("ingest: no embedded broker to publish on")
	}
	if qos > 0 {
		e.waitForSubscribers(topicName)
	}
	return e.srv.Publish(topicName, payload, retain, qos)
}

// Local publishes come from the outbox in bursts (a backlog's windows
// close together), and mochi drops a message for a client whose write
// queue (max_pending_writes) is full, even one reading as fast as its
// connection allows. So a QoS>0 publish waits while a QoS>0 subscriber of
// its topic has half a queue unacknowledged. A subscriber that stays that
// far behind for subscriberStallAfter is taken for one that stopped
// reading: it is not waited for again until it catches up, and what its
// queue cannot hold is dropped and counted, as before, instead of holding
// back every other local consumer.
const (
	subscriberStallAfter = 2 * time.Second
	subscriberPoll       = time.Millisecond
)

func (e *embedded) waitForSubscribers(topic string) {
	limit := max(1, e.in.cfg.EmbeddedMaxPendingWrites/2)
	subs := e.srv.Topics.Subscribers(topic)
	ids := make([]string, 0, len(subs.Subscriptions))
	for id, sub := range subs.Subscriptions {
		if sub.Qos > 0 {
			ids = append(ids, id)
		}
	}
	for _, group := range subs.Shared {
		for id, sub := range group {
			if sub.Qos > 0 {
				ids = append(ids, id)
			}
		}
	}
	for _, id := range ids {
		cl, ok := e.srv.Clients.Get(id)
		if !ok {
			continue
		}
		behind := func() bool { return !cl.Closed() && cl.State.Inflight.Len() >= limit }
		e.stalledMu.Lock()
		stalled := e.stalled[id]
		e.stalledMu.Unlock()
		if stalled {
			if behind() {
				continue
			}
			if cl.Closed() {
				e.forgetStalled(id) // gone, not caught up
			} else {
				e.setStalled(id, false)
			}
		}
		var deadline time.Time
		for behind() && e.up.Load() {
			if deadline.IsZero() {
				deadline = time.Now().Add(subscriberStallAfter)
			} else if time.Now().After(deadline) {
				e.setStalled(id, true)
				break
			}
			time.Sleep(subscriberPoll)
		}
	}
}

// forgetStalled drops subscriber id from the stalled set without a word:
// it disconnected (a client that comes back starts afresh).
func (e *embedded) forgetStalled(id string) {
	e.stalledMu.Lock()
	delete(e.stalled, id)
	e.stalledMu.Unlock()
}

// setStalled records whether subscriber id is taken for one that stopped
// reading, logging each change.
func (e *embedded) setStalled(id string, stalled bool) {
	e.stalledMu.Lock()
	defer e.stalledMu.Unlock()
	if e.stalled[id] == stalled {
		return
	}
	if stalled {
		if e.stalled == nil {
			e.stalled = map[string]bool{}
		}
		e.stalled[id] = true
		e.in.com.log.Warn("embedded broker: a local subscriber is not acknowledging; local messages no longer wait for it and may be dropped for it",
			"client", id, "waited", subscriberStallAfter)
		return
	}
	delete(e.stalled, id)
	e.in.com.log.Info("embedded broker: local subscriber caught up", "client", id)
}

// ingestHook is the mochi hook that ingests device publishes.
type ingestHook struct {
	mochi.HookBase
	in   *Ingester
	acks *ackWriter
}

func (h *ingestHook) ID() string { return "edgeagent-ingest" }

func (h *ingestHook) Provides(b byte) bool {
	return b == mochi.OnPublish || b == mochi.OnPublishDropped || b == mochi.OnDisconnect || b == mochi.OnClientExpired
}

// OnClientExpired drops an expired session's subscriptions: mochi deletes
// the session but leaves its filters in the topic index, where they hold
// memory and deliver to a later client of the same id.
func (h *ingestHook) OnClientExpired(cl *mochi.Client) {
	if e, ok := h.in.src.(*embedded); ok {
		e.srv.UnsubscribeClient(cl)
	}
}

// OnDisconnect forgets the connection's acknowledgement state; what is
// still queued for it holds its own reference. A connection closed for a
// packet over the size bound is a message rejected for its size, though
// too large to keep even a prefix of.
func (h *ingestHook) OnDisconnect(cl *mochi.Client, err error, _ bool) {
	h.acks.conns.Delete(cl)
	if e, ok := h.in.src.(*embedded); ok {
		e.forgetStalled(cl.ID)
	}
	if errors.Is(err, packets.ErrPacketTooLarge) {
		h.in.stats.reject(ReasonOversized)
		h.in.com.log.Warn("embedded broker: closed a client's connection: it sent a packet larger than max_payload_bytes + 64 KiB (counted as payload_too_large; nothing of it is stored)",
			"client", cl.ID, "remote", cl.Net.Remote, "max_payload_bytes", h.in.cfg.MaxPayloadBytes)
	}
}

// OnPublishDropped counts a message mochi dropped because the client's
// write queue was full: a slow local subscriber, never device data.
func (h *ingestHook) OnPublishDropped(cl *mochi.Client, pk packets.Packet) {
	if h.in.stats.BrokerDropped.Add(1) == 1 {
		h.in.com.log.Warn("embedded broker: a client's write queue is full, dropping messages to it (counted in broker_dropped_total)",
			"client", cl.ID, "topic", pk.TopicName, "max_pending_writes", h.in.cfg.EmbeddedMaxPendingWrites)
	}
}

func (h *ingestHook) OnPublish(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.Net.Inline || !h.in.subscribed(pk.TopicName) {
		// Our own local publishes and other traffic on the gateway's bus
		// are not device data.
		return pk, nil
	}
	payload := bytes.Clone(pk.Payload)
	rec := h.in.classify(pk.TopicName, pk.FixedHeader.Qos, pk.FixedHeader.Retain, pk.FixedHeader.Dup, payload, len(payload))
	if pk.FixedHeader.Qos == 0 {
		h.in.handle(rec, nil)
		return pk, nil
	}
	if pk.FixedHeader.Qos == 1 {
		// Pipelined: the connection reads its next publish while this one
		// waits for its group commit, and the ackWriter sends the PUBACK
		// (and delivers the message to local subscribers) once it is
		// durable. Rejecting the packet keeps mochi from doing either now.
		ca := h.acks.conn(cl)
		select {
		case ca.slots <- struct{}{}:
		case <-h.in.stopping:
			return pk, packets.ErrRejectPacket
		}
		cp := committedPublish{conn: ca, id: pk.PacketID, topic: pk.TopicName, payload: payload, retain: pk.FixedHeader.Retain}
		if !h.in.handle(rec, ackFunc(func() { h.acks.committed(cl, cp) })) {
			<-ca.slots
		}
		return pk, packets.ErrRejectPacket
	}
	// QoS2 keeps mochi's PUBREC/PUBREL exchange: this connection waits for
	// the commit before mochi sends PUBREC.
	done := make(chan struct{})
	if !h.in.handle(rec, ackFunc(func() { close(done) })) {
		return pk, packets.ErrRejectPacket // shutting down: no PUBACK, the device resends
	}
	select {
	case <-done:
		return pk, nil
	case <-h.in.stopping:
		// Committed or not, the committer is finishing; without a PUBACK
		// the device resends and Bronze may hold a duplicate, never a loss.
		select {
		case <-done:
			return pk, nil
		default:
			return pk, packets.ErrRejectPacket
		}
	}
}

// allowHook lets every client connect and publish, like mochi's
// auth.AllowHook, whose package would also link a YAML parser into the
// binary. The embedded broker listens on loopback by default; gateways that
// expose it put it behind their own network policy.
type allowHook struct{ mochi.HookBase }

func (h *allowHook) ID() string { return "edgeagent-allow" }

func (h *allowHook) Provides(b byte) bool {
	return b == mochi.OnConnectAuthenticate || b == mochi.OnACLCheck
}

func (h *allowHook) OnConnectAuthenticate(*mochi.Client, packets.Packet) bool { return true }

func (h *allowHook) OnACLCheck(*mochi.Client, string, bool) bool { return true }

// committedPublish is a device's QoS1 publish whose Bronze commit is done.
type committedPublish struct {
	conn    *connAcks
	id      uint16
	topic   string
	payload []byte
	retain  bool
}

// connAcks is one connection's pipelined acknowledgements.
type connAcks struct {
	// slots holds a token per publish handed to the committer and not yet
	// acknowledged: a device that keeps publishing without reading its
	// PUBACKs blocks in its own read loop at the receive maximum, as with
	// mochi's own acknowledgements, instead of queueing without bound.
	slots chan struct{}
}

// ackWriter sends the PUBACKs of committed QoS1 publishes, per connection in
// commit order (which is arrival order), and then delivers each message to
// the broker's local subscribers, as mochi would have on receipt. A
// connection's writer goroutine runs only while it has acknowledgements to
// send, so the committer never waits on a device's socket and idle devices
// cost no goroutine. The PUBACKs a writer has in hand go out in one write
// (mochi's WritePacket makes a system call per packet, which cost a quarter
// of the agent's CPU at 35k msgs/s on 16 connections).
type ackWriter struct {
	srv      *mochi.Server
	log      *slog.Logger
	inflight int            // slots per connection: the receive maximum mochi announces
	wg       sync.WaitGroup // the writers, waited for at stop
	// deliveryFailures counts local deliveries mochi refused; the first is
	// logged.
	deliveryFailures atomic.Uint64

	conns sync.Map // *mochi.Client → *connAcks, while connected

	mu sync.Mutex
	// queues holds, per connection with a running writer, the publishes it
	// has still to acknowledge; a connection is a key exactly while its
	// writer runs.
	queues map[*mochi.Client][]committedPublish
}

// conn returns cl's acknowledgement state.
func (w *ackWriter) conn(cl *mochi.Client) *connAcks {
	if c, ok := w.conns.Load(cl); ok {
		return c.(*connAcks)
	}
	c, _ := w.conns.LoadOrStore(cl, &connAcks{slots: make(chan struct{}, w.inflight)})
	return c.(*connAcks)
}

// committed queues cp's acknowledgement (called by the committer).
func (w *ackWriter) committed(cl *mochi.Client, cp committedPublish) {
	w.mu.Lock()
	q, running := w.queues[cl]
	w.queues[cl] = append(q, cp)
	if !running {
		w.wg.Add(1)
	}
	w.mu.Unlock()
	if !running {
		go w.write(cl)
	}
}

func (w *ackWriter) write(cl *mochi.Client) {
	defer w.wg.Done()
	var buf bytes.Buffer
	for {
		w.mu.Lock()
		q := w.queues[cl]
		if len(q) == 0 {
			delete(w.queues, cl)
			w.mu.Unlock()
			return
		}
		w.queues[cl] = nil
		w.mu.Unlock()

		buf.Reset()
		for _, cp := range q {
			ack := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: cp.id,
				ProtocolVersion: cl.Properties.ProtocolVersion}
			if err := ack.PubackEncode(&buf); err != nil {
				w.failed(cl, fmt.Errorf("encode puback: %w", err))
				break
			}
		}
		if err := w.send(cl, buf.Bytes()); err != nil {
			// The device resends what it saw no PUBACK for: Bronze may
			// hold a duplicate, never a loss.
			w.failed(cl, err)
		}
		for _, cp := range q {
			<-cp.conn.slots
		}
		w.deliver(q)
	}
}

// ackWriteTimeout bounds one write of acknowledgements to a device.
const ackWriteTimeout = 30 * time.Second

// send writes b to cl under the client's lock, which mochi's own writes
// take too, so packets never interleave. A write that fails or times out
// may have sent part of a packet: the connection is closed.
func (w *ackWriter) send(cl *mochi.Client, b []byte) error {
	if cl.Closed() {
		return errors.New("connection closed")
	}
	err := func() error {
		cl.Lock()
		defer cl.Unlock()
		conn := cl.Net.Conn
		if conn == nil {
			return errors.New("no connection")
		}
		if err := conn.SetWriteDeadline(time.Now().Add(ackWriteTimeout)); err != nil {
			return err
		}
		_, err := conn.Write(b)
		if derr := conn.SetWriteDeadline(time.Time{}); err == nil {
			err = derr
		}
		return err
	}()
	if err != nil {
		cl.Stop(err)
	}
	return err
}

// failed logs acknowledgements that could not be written: routine when a
// device drops its connection with publishes in flight.
func (w *ackWriter) failed(cl *mochi.Client, err error) {
	w.log.Debug("embedded broker: acknowledgements to a device could not be written; it will resend", "client", cl.ID, "err", err)
}

// deliver publishes committed messages to the broker's local subscribers,
// after they are durable and acknowledged; the inline client's publish is
// not ingested again. With no subscription on the broker only retained
// messages need it. A failure here loses nothing the agent stored.
func (w *ackWriter) deliver(q []committedPublish) {
	subscribed := atomic.LoadInt64(&w.srv.Info.Subscriptions) > 0
	for _, cp := range q {
		if !subscribed && !cp.retain {
			continue
		}
		if err := w.srv.Publish(cp.topic, cp.payload, cp.retain, 1); err != nil && w.deliveryFailures.Add(1) == 1 {
			w.log.Warn("embedded broker: delivering a device message to local subscribers failed", "topic", cp.topic, "err", err)
		}
	}
}
