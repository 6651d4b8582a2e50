package uplink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeagent/edgeagent/uplink/wire"
)

// Message headers on the NATS subject.
const (
	headerContentType     = "Content-Type"
	headerContentEncoding = "Content-Encoding"
)

// natsSink publishes batches to a JetStream stream and completes each
// publish's pendingAck from the PubAck (or its error).
type natsSink struct {
	cfg    Config
	log    *slog.Logger
	nc     *nats.Conn
	js     jetstream.JetStream
	lostCh chan struct{}
	lostMu sync.Once

	mu      sync.Mutex
	pending map[string]*ackResult // by Nats-Msg-Id
}

func newNATSSink(cfg Config, log *slog.Logger) *natsSink {
	return &natsSink{cfg: cfg, log: log, lostCh: make(chan struct{}), pending: make(map[string]*ackResult)}
}

// connectTimeout bounds the dial and handshake: a blackholed link must not
// hold the uplink in "connecting" for long.
func connectTimeout(cfg Config) time.Duration { return min(cfg.AckTimeout, 10*time.Second) }

// natsOptions turns the config into nats.go options (without handlers).
func natsOptions(cfg Config) ([]nats.Option, error) {
	n := cfg.NATS
	opts := []nats.Option{
		nats.Name("edgeagent-" + cfg.Gateway + "-uplink"),
		// The uplink reconnects itself, with its own backoff and link
		// state, and resends from the sealed store.
		nats.NoReconnect(),
		nats.Timeout(connectTimeout(cfg)),
		// Find a dead link while idle too, not only when a batch waits.
		nats.PingInterval(max(cfg.AckTimeout, time.Second)),
		nats.MaxPingsOutstanding(2),
	}
	switch {
	case n.CredsFile != "":
		opts = append(opts, nats.UserCredentials(n.CredsFile))
	case n.User != "":
		opts = append(opts, nats.UserInfo(n.User, n.Password))
	case n.Token != "":
		opts = append(opts, nats.Token(n.Token))
	}
	if n.TLS.enabled() || strings.HasPrefix(n.URL, "tls://") {
		tc, err := n.TLS.build("uplink.nats.tls")
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.Secure(tc))
	}
	return opts, nil
}

func (s *natsSink) markLost() { s.lostMu.Do(func() { close(s.lostCh) }) }

func (s *natsSink) lost() <-chan struct{} { return s.lostCh }

func (s *natsSink) connect(ctx context.Context) error {
	opts, err := natsOptions(s.cfg)
	if err != nil {
		return err
	}
	opts = append(opts,
		nats.ClosedHandler(func(*nats.Conn) { s.markLost() }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, _ error) { s.markLost() }),
	)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	nc, err := nats.Connect(s.cfg.NATS.URL, opts...)
	if err != nil {
		return fmt.Errorf("connect to nats %s: %w", s.cfg.NATS.URL, err)
	}
	s.nc = nc
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(2*maxInFlight),
		// The uplink times acks itself; the library's timer only frees
		// its bookkeeping, later, so the two never race.
		jetstream.WithPublishAsyncTimeout(2*s.cfg.AckTimeout),
		jetstream.WithPublishAsyncAckHandler(s.onAck),
		jetstream.WithPublishAsyncErrHandler(s.onErr),
	)
	if err != nil {
		return fmt.Errorf("jetstream context: %w", err)
	}
	s.js = js
	if mp := nc.MaxPayload(); mp > 0 && int64(s.cfg.MaxBatchBytes)+1024 > mp {
		s.log.Warn("uplink: max_batch_bytes exceeds the server's max_payload; a batch that large would be refused",
			"max_batch_bytes", s.cfg.MaxBatchBytes, "max_payload", mp)
	}
	if s.cfg.NATS.CreateStream {
		if err := s.ensureStream(ctx); err != nil {
			return err
		}
	}
	return nil
}

// ensureStream creates the stream when it does not exist (create_stream:
// true, development only). An existing stream is left as it is.
func (s *natsSink) ensureStream(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout(s.cfg))
	defer cancel()
	_, err := s.js.Stream(ctx, s.cfg.NATS.Stream)
	if err == nil {
		return nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("look up stream %s: %w", s.cfg.NATS.Stream, err)
	}
	_, err = s.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       s.cfg.NATS.Stream,
		Subjects:   []string{s.cfg.NATS.Subject},
		Storage:    jetstream.FileStorage,
		Duplicates: 2 * time.Minute,
	})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("create stream %s: %w", s.cfg.NATS.Stream, err)
	}
	s.log.Info("uplink: created stream (create_stream is for development only)", "stream", s.cfg.NATS.Stream, "subject", s.cfg.NATS.Subject)
	return nil
}

func (s *natsSink) publish(_ context.Context, m *message) (pendingAck, error) {
	msg := nats.NewMsg(s.cfg.NATS.Subject)
	msg.Header.Set(jetstream.MsgIDHeader, m.id)
	msg.Header.Set(headerContentType, wire.ContentType)
	if m.encoding != wire.EncodingNone {
		msg.Header.Set(headerContentEncoding, m.encoding)
	}
	msg.Data = m.body
	a := newAckResult()
	s.mu.Lock()
	if old, ok := s.pending[m.id]; ok {
		// Not expected on one connection; keep the map consistent.
		old.complete(false, fmt.Errorf("%w: superseded", ErrLinkLost))
	}
	s.pending[m.id] = a
	s.mu.Unlock()
	if _, err := s.js.PublishMsgAsync(msg, jetstream.WithMsgID(m.id)); err != nil {
		s.finish(m.id, false, err)
		return nil, err
	}
	return a, nil
}

func (s *natsSink) onAck(_ jetstream.JetStream, msg *nats.Msg, ack *jetstream.PubAck) {
	s.finish(msg.Header.Get(jetstream.MsgIDHeader), ack.Duplicate, nil)
}

func (s *natsSink) onErr(_ jetstream.JetStream, msg *nats.Msg, err error) {
	s.finish(msg.Header.Get(jetstream.MsgIDHeader), false, err)
}

func (s *natsSink) finish(id string, dup bool, err error) {
	s.mu.Lock()
	a, ok := s.pending[id]
	delete(s.pending, id)
	s.mu.Unlock()
	if ok {
		a.complete(dup, err)
	}
}

func (s *natsSink) close() error {
	s.markLost()
	if s.nc != nil {
		s.nc.Close()
	}
	return nil
}
