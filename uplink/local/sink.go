package local

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"

	"github.com/edgeagent/edgeagent/internal/secret"
)

// Sink publishes one message and returns once it is delivered as far as its
// QoS promises (for QoS 1, acknowledged by the broker), or failed.
type Sink interface {
	Publish(topic string, payload []byte, retain bool, qos byte) error
}

// SinkFunc adapts a function to Sink; the agent passes the embedded
// broker's inline publish, (*ingest.Ingester).Publish.
type SinkFunc func(topic string, payload []byte, retain bool, qos byte) error

// Publish calls f.
func (f SinkFunc) Publish(topic string, payload []byte, retain bool, qos byte) error {
	return f(topic, payload, retain, qos)
}

// Sentinel errors of PahoSink.
var (
	// ErrInvalidOption wraps every PahoConfig validation failure.
	ErrInvalidOption = errors.New("local: invalid option")
	// ErrNotConnected is returned by PahoSink.Publish while the client is
	// not connected: the row stays in the outbox instead of in paho's
	// in-memory queue, which a restart would lose.
	ErrNotConnected = errors.New("local: not connected to the local broker")
	// ErrTimeout is returned when the broker did not acknowledge a publish
	// within PahoConfig.PublishTimeout.
	ErrTimeout = errors.New("local: publish not acknowledged in time")
	// ErrClosed is returned by Publish after Close.
	ErrClosed = errors.New("local: sink closed")
)

// PahoConfig configures a PahoSink.
type PahoConfig struct {
	// Broker is the local broker's URL (mqtt.broker), e.g. tcp://127.0.0.1:1883.
	Broker string
	// ClientID defaults to "edgeagent-<Gateway>-local". It must differ from
	// the ingest and uplink client ids, or the broker would disconnect one
	// of them; it is stable because the session is persistent.
	ClientID string
	// Gateway is gateway_id, used for the default ClientID.
	Gateway            string
	Username, Password string
	// TLS, when set, is used for ssl://, tls:// and mqtts:// brokers.
	TLS *tls.Config
	// ConnectTimeout defaults to 10s; PublishTimeout (how long a publish
	// waits for its PUBACK) to 10s; MaxReconnectInterval to 5s.
	ConnectTimeout, PublishTimeout, MaxReconnectInterval time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// PahoSink publishes to an external MQTT broker with a persistent session
// (clean session false). It connects in the background and reconnects by
// itself; Publish fails fast with ErrNotConnected while it is down.
type PahoSink struct {
	cfg    PahoConfig
	client paho.Client
	log    *slog.Logger

	closeOnce sync.Once
	closed    chan struct{}
}

// NewPahoSink validates cfg and starts connecting in the background; it
// does not wait for the connection.
func NewPahoSink(cfg PahoConfig) (*PahoSink, error) {
	if cfg.Broker == "" {
		return nil, fmt.Errorf("%w: broker is empty", ErrInvalidOption)
	}
	if cfg.ClientID == "" {
		if cfg.Gateway == "" {
			return nil, fmt.Errorf("%w: client id and gateway are both empty", ErrInvalidOption)
		}
		cfg.ClientID = "edgeagent-" + cfg.Gateway + "-local"
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	if cfg.PublishTimeout <= 0 {
		cfg.PublishTimeout = 10 * time.Second
	}
	if cfg.MaxReconnectInterval <= 0 {
		cfg.MaxReconnectInterval = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &PahoSink{cfg: cfg, log: cfg.Logger, closed: make(chan struct{})}
	o := paho.NewClientOptions().
		AddBroker(cfg.Broker).
		SetClientID(cfg.ClientID).
		SetCleanSession(false).
		SetAutoReconnect(true).
		SetConnectRetry(true).
		SetConnectRetryInterval(min(time.Second, cfg.MaxReconnectInterval)).
		SetMaxReconnectInterval(cfg.MaxReconnectInterval).
		SetConnectTimeout(cfg.ConnectTimeout).
		SetWriteTimeout(cfg.PublishTimeout).
		SetKeepAlive(30 * time.Second).
		SetOrderMatters(false).
		SetStore(outboxBackedStore{paho.NewMemoryStore()}).
		SetConnectionLostHandler(func(_ paho.Client, err error) {
			s.log.Warn("local: connection to the local broker lost", "broker", secret.URL(cfg.Broker, false), "err", err)
		}).
		SetOnConnectHandler(func(paho.Client) {
			s.log.Info("local: connected to the local broker", "broker", secret.URL(cfg.Broker, false))
		})
	if cfg.Username != "" {
		o.SetUsername(cfg.Username).SetPassword(cfg.Password)
	}
	if cfg.TLS != nil {
		o.SetTLSConfig(cfg.TLS)
	}
	s.client = paho.NewClient(o)
	// With ConnectRetry the token completes only once connected (or on
	// Disconnect); paho keeps retrying in its own goroutine, which
	// Close ends.
	s.client.Connect()
	return s, nil
}

// Publish publishes and waits for the broker's acknowledgement (QoS 1 and
// 2) or for the write (QoS 0).
func (s *PahoSink) Publish(topic string, payload []byte, retain bool, qos byte) error {
	select {
	case <-s.closed:
		return ErrClosed
	default:
	}
	if !s.client.IsConnectionOpen() {
		return fmt.Errorf("%w (%s)", ErrNotConnected, secret.URL(s.cfg.Broker, false))
	}
	tok := s.client.Publish(topic, qos, retain, payload)
	t := time.NewTimer(s.cfg.PublishTimeout)
	defer t.Stop()
	select {
	case <-tok.Done():
	case <-t.C:
		return fmt.Errorf("%w: %s after %v", ErrTimeout, topic, s.cfg.PublishTimeout)
	case <-s.closed:
		return ErrClosed
	}
	if err := tok.Error(); err != nil {
		return fmt.Errorf("publish %s: %w", topic, err)
	}
	return nil
}

// Close disconnects; it is safe to call more than once.
func (s *PahoSink) Close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.client.Disconnect(250)
	})
	return nil
}

// outboxBackedStore is paho's MemoryStore without outbound PUBLISH packets.
// A publish that is not acknowledged in time stays in the outbox and is
// published again from there, so paho's copy is redundant, and harmful:
// after a reconnect paho resends every stored publish while the sink,
// already seeing the connection open, publishes new ones. A publish made
// in that moment was sent twice (and paho raced on its DUP flag).
type outboxBackedStore struct{ paho.Store }

func (s outboxBackedStore) Put(key string, m packets.ControlPacket) {
	if _, ok := m.(*packets.PublishPacket); ok && strings.HasPrefix(key, "o.") {
		return
	}
	s.Store.Put(key, m)
}
