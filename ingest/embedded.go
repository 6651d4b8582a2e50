package ingest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// embedded runs the built-in mochi broker and ingests inside its publish
// path: the hook hands each device message to the committer and returns only
// after the Bronze commit, so mochi sends the device's PUBACK after the data
// is durable. This is stronger than subscribing over loopback, where the
// broker would acknowledge the device before the agent had stored anything
// and a crash of the one process would lose both copies.
type embedded struct {
	in  *Ingester
	srv *mochi.Server
	dl  *connectDeadline
	up  atomic.Bool
}

func (e *embedded) start(ctx context.Context) error {
	cfg := e.in.cfg
	// mochi logs every connect at info; keep its warnings only.
	mlog := slog.New(slog.NewTextHandler(io.Discard, nil))
	if cfg.Logger.Enabled(ctx, slog.LevelWarn) {
		mlog = cfg.Logger.With("component", "broker")
	}
	caps := mochi.NewDefaultServerCapabilities()
	caps.MaximumClientWritesPending = int32(cfg.EmbeddedMaxPendingWrites)
	srv := mochi.New(&mochi.Options{InlineClient: true, Logger: mlog, Capabilities: caps})
	if err := srv.AddHook(new(allowHook), nil); err != nil {
		return fmt.Errorf("embedded broker: auth hook: %w", err)
	}
	if err := srv.AddHook(&ingestHook{in: e.in}, nil); err != nil {
		return fmt.Errorf("embedded broker: ingest hook: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.Embedded)
	if err != nil {
		return fmt.Errorf("embedded broker: listen on %s: %w", cfg.Embedded, err)
	}
	e.dl = &connectDeadline{Listener: ln, timeout: cfg.ConnectTimeout, log: e.in.com.log}
	if err := srv.AddListener(listeners.NewNet("tcp", e.dl)); err != nil {
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
	if e.srv != nil {
		// mochi's Close waits for every connection's goroutine. The connect
		// deadline bounds that wait; this bounds it whatever else holds a
		// connection, so SIGTERM always ends the agent. The goroutine left
		// behind, if any, ends with the process.
		e.dl.barrier()
		done := make(chan struct{})
		go func() {
			defer close(done)
			e.srv.Close()
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

// brokerCloseTimeout bounds the embedded broker's shutdown.
const brokerCloseTimeout = 10 * time.Second

// connectDeadline gives every accepted connection until timeout to send its
// CONNECT. mochi sets no read deadline before CONNECT (after it, the
// client's keepalive sets one), so a connection that never speaks — a port
// probe left open, a half-open link — would keep its goroutine, and mochi's
// Close, waiting forever: a SIGTERM then never ended the agent.
type connectDeadline struct {
	net.Listener
	timeout time.Duration
	log     *slog.Logger
	// reads is touched by every read on an accepted connection and loaded
	// before the broker closes. mochi adds each connection to the
	// WaitGroup its Close waits on from the connection's own goroutine,
	// with nothing ordering that Add before the Wait; this atomic does, for
	// every connection that has started reading (the race detector flags
	// the Add and Wait otherwise, for a connection that never sent data).
	reads atomic.Uint64
}

// barrier orders every read so far before what follows it.
func (l *connectDeadline) barrier() { l.reads.Load() }

type countedConn struct {
	net.Conn
	reads *atomic.Uint64
}

func (c countedConn) Read(p []byte) (int, error) {
	c.reads.Add(1)
	return c.Conn.Read(p)
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
		return countedConn{Conn: c, reads: &l.reads}, nil
	}
}

// Publish publishes on the embedded broker (for local alerts and
// republished aggregates).
func (in *Ingester) Publish(topicName string, payload []byte, retain bool, qos byte) error {
	e, ok := in.src.(*embedded)
	if !ok || e.srv == nil {
		return fmt.Errorf("ingest: no embedded broker to publish on")
	}
	return e.srv.Publish(topicName, payload, retain, qos)
}

// ingestHook is the mochi hook that ingests device publishes.
type ingestHook struct {
	mochi.HookBase
	in *Ingester
}

func (h *ingestHook) ID() string { return "edgeagent-ingest" }

func (h *ingestHook) Provides(b byte) bool {
	return b == mochi.OnPublish || b == mochi.OnPublishDropped
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
	if cl.Net.Inline || !h.in.matches(pk.TopicName) {
		// Our own local publishes and other traffic on the gateway's bus
		// are not device data.
		return pk, nil
	}
	payload := bytes.Clone(pk.Payload)
	rec := h.in.classify(pk.TopicName, pk.FixedHeader.Qos, pk.FixedHeader.Retain, pk.FixedHeader.Dup, payload)
	if pk.FixedHeader.Qos == 0 {
		h.in.handle(rec, nil)
		return pk, nil
	}
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
