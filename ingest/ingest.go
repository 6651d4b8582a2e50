// Package ingest subscribes to device MQTT (an external broker through paho,
// or the built-in mochi broker) and group-commits every message to Bronze
// before acknowledging it, so a kill -9 at any instant loses nothing that
// was acknowledged.
package ingest

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/internal/backoff"
	"github.com/edgeagent/edgeagent/internal/topic"
)

// Reason codes of messages ingest refuses. They are stored as Bronze records
// of kind rejected, so the window stage dead-letters them with the reason.
const (
	ReasonOversized  = "payload_too_large"
	ReasonBadTopic   = "topic_not_utf8"
	ReasonNoTemplate = "topic_unmatched"
)

// ErrConfig wraps configuration errors.
var ErrConfig = errors.New("ingest: invalid config")

// Subscription is one subscribed topic template.
type Subscription struct {
	Template *topic.Template
	QoS      byte
}

// Config configures an Ingester.
type Config struct {
	// Broker is the external broker URL (tcp://host:port, ssl://…). Empty
	// when Embedded is set.
	Broker string
	// Embedded runs the built-in broker on this address instead, and ingests
	// inside it: a device's PUBACK is sent only after the Bronze commit.
	Embedded string
	// EmbeddedMaxPendingWrites is mqtt.embedded.max_pending_writes: the
	// built-in broker's queue of messages to write to one client (default
	// 256). mochi's default, 8,192, reserves 64 KiB on every connection.
	EmbeddedMaxPendingWrites int
	// EmbeddedSessionExpiry is mqtt.embedded.session_expiry: how long the
	// built-in broker keeps a disconnected client's session (default 1h;
	// also the most an MQTT 5 client may ask for).
	EmbeddedSessionExpiry time.Duration
	ClientID              string
	Username              string
	Password              string
	TLS                   *tls.Config
	KeepAlive             time.Duration
	ConnectTimeout        time.Duration
	ReconnectMax          time.Duration
	Subscriptions         []Subscription
	// SessionFile, when set, records the broker and client id of the last
	// connection that subscribed: a first connect to the same broker under
	// the same id without a saved session is a lost session, not a first
	// start (nor a new client id or broker, which have none to lose).
	SessionFile string

	CommitInterval   time.Duration
	MaxCommitRecords int
	ClockTick        time.Duration
	MaxPayloadBytes  int
	// RetryMin and RetryMax bound the backoff after a failed commit.
	RetryMin, RetryMax time.Duration

	Clock  func() time.Time
	Logger *slog.Logger

	// connectWait waits before a retry of the first connect (tests
	// record the waits instead); rand is the jitter's source.
	connectWait func(ctx context.Context, d time.Duration) error
	rand        func() float64

	// viaPaho sends every message through paho, as before the connection
	// took PUBLISH packets out of paho's stream: for the side-by-side
	// benchmark.
	viaPaho bool
}

// Validate reports what New would refuse in c.
func (c Config) Validate() error { return c.setDefaults() }

func (c *Config) setDefaults() error {
	if c.Broker == "" && c.Embedded == "" {
		return fmt.Errorf("%w: no broker and no embedded listen address", ErrConfig)
	}
	if len(c.Subscriptions) == 0 {
		return fmt.Errorf("%w: no subscriptions", ErrConfig)
	}
	if c.ClientID == "" {
		return fmt.Errorf("%w: empty client id (a persistent session needs a stable one)", ErrConfig)
	}
	if c.EmbeddedMaxPendingWrites <= 0 {
		c.EmbeddedMaxPendingWrites = 256
	}
	if c.MaxCommitRecords <= 0 {
		c.MaxCommitRecords = 1000
	}
	if c.ClockTick <= 0 {
		c.ClockTick = time.Second
	}
	if c.KeepAlive <= 0 {
		c.KeepAlive = 30 * time.Second
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = 10 * time.Second
	}
	if c.ReconnectMax <= 0 {
		c.ReconnectMax = 30 * time.Second
	}
	if c.RetryMin <= 0 {
		c.RetryMin = 100 * time.Millisecond
	}
	if c.RetryMax <= 0 {
		c.RetryMax = 10 * time.Second
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.connectWait == nil {
		c.connectWait = backoff.Sleep
	}
	if c.rand == nil {
		c.rand = rand.Float64
	}
	return nil
}

// Ingester owns the MQTT source and the committer.
type Ingester struct {
	cfg   Config
	stats Stats
	com   *committer
	src   source
	// maxRecordBytes is the Bronze bound, when it has one: a record
	// larger could never be stored, and would hold every message behind
	// it for ever.
	maxRecordBytes int64

	stopping chan struct{} // closed when shutdown begins: handlers stop handing over
	stopOnce sync.Once
	wg       sync.WaitGroup
	cancel   context.CancelFunc
}

// source is the MQTT side: paho against an external broker, or the embedded
// mochi broker. Both hand messages to the committer via Ingester.handle.
type source interface {
	start(ctx context.Context) error
	stop()
	connected() bool
}

// New validates cfg. It starts nothing.
func New(app Appender, cfg Config) (*Ingester, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	in := &Ingester{cfg: cfg, stopping: make(chan struct{})}
	if m, ok := app.(interface{ MaxBytes() int64 }); ok {
		in.maxRecordBytes = m.MaxBytes()
	}
	in.com = &committer{
		app:      app,
		in:       make(chan pending, 2*cfg.MaxCommitRecords),
		interval: cfg.CommitInterval,
		quiet:    cfg.CommitInterval / 10,
		maxBatch: cfg.MaxCommitRecords,
		tick:     cfg.ClockTick,
		clock:    cfg.Clock,
		log:      cfg.Logger.With("component", "ingest"),
		backoff:  commitBackoff{cfg.RetryMin, cfg.RetryMax},
		stats:    &in.stats,
		budget:   newByteBudget(maxQueuedBytes),
	}
	if cfg.Embedded != "" {
		in.src = &embedded{in: in}
	} else {
		in.src = &pahoSource{in: in}
	}
	return in, nil
}

// Start starts the committer and connects to the broker. Connecting retries
// in the background with backoff, so Start succeeds with the broker down.
func (in *Ingester) Start(ctx context.Context) error {
	ctx, in.cancel = context.WithCancel(ctx)
	in.wg.Add(1)
	go func() {
		defer in.wg.Done()
		in.com.run(ctx)
	}()
	if err := in.src.start(ctx); err != nil {
		in.cancel()
		in.wg.Wait()
		return err
	}
	return nil
}

// Close stops taking messages, commits and acknowledges what is in hand, and
// disconnects. Safe to call twice.
func (in *Ingester) Close() error {
	in.stopOnce.Do(func() {
		close(in.stopping)
		if in.cancel != nil {
			in.cancel()
		}
		in.wg.Wait()
		in.src.stop()
	})
	return nil
}

// Stats returns the live counters.
func (in *Ingester) Stats() *Stats { return &in.stats }

// Connected reports whether the broker connection (or the embedded broker)
// is up.
func (in *Ingester) Connected() bool { return in.src.connected() }

// classify builds the Bronze record for a received message: a message, or a
// rejected record carrying the reason. size is the payload's length on the
// wire, more than len(payload) when the connection kept only a prefix.
func (in *Ingester) classify(topicName string, qos byte, retained, dup bool, payload []byte, size int) buffer.Record {
	rec := buffer.Record{
		Kind:       buffer.KindMessage,
		ReceivedAt: in.cfg.Clock().UnixNano(),
		Topic:      topicName,
		QoS:        qos,
		Retained:   retained,
		Duplicate:  dup,
		Payload:    payload,
	}
	reject := func(code, detail string) buffer.Record {
		rec.Kind = buffer.KindRejected
		rec.Reason = code + ": " + detail
		// Keep a bounded prefix so the dead letter is inspectable without
		// letting an oversized message fill Bronze.
		if len(rec.Payload) > 256 {
			// A copy: a slice would keep the whole payload in memory
			// until the commit, past the byte budget, which counts 256.
			rec.Payload = bytes.Clone(rec.Payload[:256])
		}
		in.stats.reject(code)
		return rec
	}
	if !utf8.ValidString(topicName) {
		rec.Topic = fmt.Sprintf("%q", topicName)
		return reject(ReasonBadTopic, "topic is not valid UTF-8")
	}
	if in.cfg.MaxPayloadBytes > 0 && size > in.cfg.MaxPayloadBytes {
		return reject(ReasonOversized, fmt.Sprintf("payload is %d bytes, max_payload_bytes is %d", size, in.cfg.MaxPayloadBytes))
	}
	if !in.matches(topicName) {
		detail := "topic matches no subscription template"
		if strings.HasPrefix(topicName, "/") || strings.HasSuffix(topicName, "/") || strings.Contains(topicName, "//") {
			// The broker's + matches an empty level; {device} and
			// {metric} do not.
			detail += " (it has an empty level, and a {device} or {metric} level cannot be empty)"
		}
		return reject(ReasonNoTemplate, detail)
	}
	if in.maxRecordBytes > 0 {
		if n := int64(buffer.StoredSize(&rec)); n > in.maxRecordBytes {
			return reject(ReasonOversized, fmt.Sprintf("the record would take %d bytes, more than bronze_max_bytes (%d): it could never be stored", n, in.maxRecordBytes))
		}
	}
	return rec
}

// matches reports whether topicName matches a subscription template.
func (in *Ingester) matches(topicName string) bool {
	for _, s := range in.cfg.Subscriptions {
		if _, _, ok := s.Template.Match(topicName); ok {
			return true
		}
	}
	return false
}

// subscribed reports whether topicName is on one of the subscriptions'
// filters, as an external broker would deliver it: device data for
// ingest even when it names no device (an empty level), which classify
// then rejects with its reason instead of letting it pass unrecorded.
func (in *Ingester) subscribed(topicName string) bool {
	for _, s := range in.cfg.Subscriptions {
		if s.Template.InFilter(topicName) {
			return true
		}
	}
	return false
}

// handle hands a record to the committer, blocking while it is busy (which
// pushes back on the broker). It returns false when shutdown began and the
// message was not taken: the caller must not acknowledge it.
func (in *Ingester) handle(rec buffer.Record, ack acker) bool {
	return in.handlePending(pending{rec: rec, ack: ack})
}

// handlePending is handle for a pending message already made.
func (in *Ingester) handlePending(p pending) bool {
	size := p.rec.HeldBytes()
	if !in.com.budget.acquire(size, in.stopping) {
		return false
	}
	select {
	case in.com.in <- p:
		in.stats.Received.Add(1)
		return true
	case <-in.stopping:
		in.com.budget.release(size)
		return false
	}
}
