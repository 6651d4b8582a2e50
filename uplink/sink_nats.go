package uplink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeagent/edgeagent/internal/secret"
	"github.com/edgeagent/edgeagent/uplink/internal/jsapi"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// Message headers on the NATS subject.
const (
	headerContentType     = "Content-Type"
	headerContentEncoding = "Content-Encoding"
)

// natsSink publishes batches to a JetStream stream (through jsapi, over
// the core connection) and hands back each publish's PubAck future.
type natsSink struct {
	cfg    Config
	log    *slog.Logger
	nc     *nats.Conn
	pub    *jsapi.Publisher
	lostCh chan struct{}
	lostMu sync.Once

	asyncMu sync.Mutex
	async   error // the server's last asynchronous error (a permissions violation)
}

// asyncError is the server's last asynchronous error on this connection:
// a publish it refuses for permissions is answered only that way, and the
// batch's ack then times out without a reason.
func (s *natsSink) asyncError() error {
	s.asyncMu.Lock()
	defer s.asyncMu.Unlock()
	return s.async
}

func newNATSSink(cfg Config, log *slog.Logger) *natsSink {
	return &natsSink{cfg: cfg, log: log, lostCh: make(chan struct{})}
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
	if n.TLS.enabled() || strings.HasPrefix(n.URL, "tls://") || strings.HasPrefix(n.URL, "wss://") {
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
		// Without a handler nats.go prints these to stderr, unstructured
		// and unthrottled; the warning is throttled by message.
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			s.asyncMu.Lock()
			s.async = err
			s.asyncMu.Unlock()
			s.log.Warn("uplink: the NATS server reported an error", "err", err)
		}),
	)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	nc, err := nats.Connect(s.cfg.NATS.URL, opts...)
	if err != nil {
		return fmt.Errorf("connect to nats %s: %w", secret.URL(s.cfg.NATS.URL, true), err)
	}
	s.nc = nc
	pub, err := jsapi.NewPublisher(nc)
	if err != nil {
		return fmt.Errorf("jetstream publisher: %w", err)
	}
	s.pub = pub
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
	subjects, err := jsapi.StreamInfo(ctx, s.nc, s.cfg.NATS.Stream)
	if err == nil {
		if !slices.ContainsFunc(subjects, func(f string) bool { return jsapi.SubjectMatches(f, s.cfg.NATS.Subject) }) {
			// Another stream may capture it; if none does, every publish
			// fails with no response, and this says why.
			s.log.Warn("uplink: stream exists but does not capture the subject; publishes go to a stream that does, or get no response",
				"stream", s.cfg.NATS.Stream, "stream_subjects", strings.Join(subjects, ","), "subject", s.cfg.NATS.Subject)
		}
		return nil
	}
	if !errors.Is(err, jsapi.ErrStreamNotFound) {
		return fmt.Errorf("look up stream %s: %w", s.cfg.NATS.Stream, err)
	}
	err = jsapi.CreateStream(ctx, s.nc, jsapi.StreamConfig{
		Name:       s.cfg.NATS.Stream,
		Subjects:   []string{s.cfg.NATS.Subject},
		Duplicates: 2 * time.Minute,
	})
	if errors.Is(err, jsapi.ErrSubjectsOverlap) {
		// Another stream already captures the subject: publishes are
		// stored there, which is all the uplink needs.
		s.log.Info("uplink: stream not created: another stream already captures the subject; publishing to it", "stream", s.cfg.NATS.Stream, "subject", s.cfg.NATS.Subject)
		return nil
	}
	if err != nil && !errors.Is(err, jsapi.ErrStreamNameInUse) {
		return fmt.Errorf("create stream %s: %w", s.cfg.NATS.Stream, err)
	}
	s.log.Info("uplink: created stream (create_stream is for development only)", "stream", s.cfg.NATS.Stream, "subject", s.cfg.NATS.Subject)
	return nil
}

func (s *natsSink) publish(_ context.Context, m *message) (pendingAck, error) {
	msg := nats.NewMsg(s.cfg.NATS.Subject)
	msg.Header.Set(jsapi.MsgIDHeader, m.id)
	msg.Header.Set(headerContentType, wire.ContentType)
	if m.encoding != wire.EncodingNone {
		msg.Header.Set(headerContentEncoding, m.encoding)
	}
	msg.Data = m.body
	f, err := s.pub.Publish(msg)
	if err != nil {
		return nil, err
	}
	return natsAck{f: f, subject: s.cfg.NATS.Subject}, nil
}

// natsAck is a PubAck future as a pendingAck.
type natsAck struct {
	f       *jsapi.Future
	subject string
}

func (a natsAck) done() <-chan struct{} { return a.f.Done() }

func (a natsAck) result() (dup bool, err error) {
	ack, err := a.f.Result()
	if errors.Is(err, jsapi.ErrNoStreamResponse) {
		// The server's answer names no cause; these are the ones there are.
		err = fmt.Errorf("%w: no JetStream stream captures subject %s, or the account has no JetStream (create a stream on it, or set uplink.nats.create_stream for development)", err, a.subject)
	}
	return ack.Duplicate, err
}

func (s *natsSink) close() error {
	s.markLost()
	if s.pub != nil {
		s.pub.Close()
	}
	if s.nc != nil {
		s.nc.Close()
	}
	return nil
}
