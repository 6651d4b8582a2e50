package uplink

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgeagent/edgeagent/internal/secret"
)

// mqttSink publishes batches with QoS 1 (or 2) and completes each
// publish's pendingAck from paho's token (PUBACK, or PUBCOMP for QoS 2).
//
// MQTT 3.1.1 has no headers: receivers tell a zstd body from a plain one by
// its first bytes (wire.DecodeBody). The session is persistent (clean session
// false, stable client id); unacknowledged batches are redelivered by the
// uplink from its sealed store, which unlike paho's in-memory store survives
// a restart, so each connection gets a fresh paho client.
type mqttSink struct {
	cfg    Config
	log    *slog.Logger
	client paho.Client
	lostCh chan struct{}
	lostMu sync.Once
}

func newMQTTSink(cfg Config, log *slog.Logger) *mqttSink {
	return &mqttSink{cfg: cfg, log: log, lostCh: make(chan struct{})}
}

// mqttOptions turns the config into paho options (without handlers).
func mqttOptions(cfg Config) (*paho.ClientOptions, error) {
	m := cfg.MQTT
	o := paho.NewClientOptions().
		AddBroker(m.Broker).
		SetClientID(m.ClientID).
		SetCleanSession(false).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetConnectTimeout(connectTimeout(cfg)).
		SetWriteTimeout(cfg.AckTimeout).
		// MQTT sends the keep-alive as 16 bits of seconds; more would wrap.
		SetKeepAlive(min(max(cfg.AckTimeout, 2*time.Second), maxKeepAlive)).
		SetPingTimeout(max(cfg.AckTimeout/2, time.Second)).
		SetOrderMatters(false)
	if m.Username != "" {
		o.SetUsername(m.Username).SetPassword(m.Password)
	}
	if m.TLS.enabled() || strings.HasPrefix(m.Broker, "ssl://") || strings.HasPrefix(m.Broker, "tls://") || strings.HasPrefix(m.Broker, "mqtts://") || strings.HasPrefix(m.Broker, "wss://") {
		tc, err := m.TLS.build("uplink.mqtt.tls")
		if err != nil {
			return nil, err
		}
		o.SetTLSConfig(tc)
	}
	return o, nil
}

func (s *mqttSink) markLost() { s.lostMu.Do(func() { close(s.lostCh) }) }

func (s *mqttSink) lost() <-chan struct{} { return s.lostCh }

func (s *mqttSink) connect(ctx context.Context) error {
	o, err := mqttOptions(s.cfg)
	if err != nil {
		return err
	}
	o.SetConnectionLostHandler(func(_ paho.Client, err error) {
		s.log.Debug("uplink: mqtt connection lost", "err", err)
		s.markLost()
	})
	s.client = paho.NewClient(o)
	tok := s.client.Connect()
	select {
	case <-tok.Done():
	case <-ctx.Done():
		// Let the attempt end (it is bounded by the connect timeout) so
		// that no connection outlives the sink.
		tok.WaitTimeout(connectTimeout(s.cfg))
		s.client.Disconnect(0)
		return ctx.Err()
	}
	if err := tok.Error(); err != nil {
		return fmt.Errorf("connect to mqtt %s: %w", secret.URL(s.cfg.MQTT.Broker, false), err)
	}
	return nil
}

func (s *mqttSink) publish(_ context.Context, m *message) (pendingAck, error) {
	tok := s.client.Publish(s.cfg.MQTT.Topic, s.cfg.MQTT.QoS, false, m.body)
	// A token that fails at once (not connected, write timeout) is an
	// error of the publish, not of the ack.
	select {
	case <-tok.Done():
		if err := tok.Error(); err != nil {
			return nil, err
		}
	default:
	}
	return tokenAck{tok}, nil
}

func (s *mqttSink) close() error {
	s.markLost()
	if s.client != nil {
		// A no-op when the connection is already gone.
		s.client.Disconnect(100)
	}
	return nil
}

// tokenAck adapts a paho token.
type tokenAck struct{ tok paho.Token }

func (t tokenAck) done() <-chan struct{}         { return t.tok.Done() }
func (t tokenAck) result() (dup bool, err error) { return false, t.tok.Error() }

// maxKeepAlive is the longest keep-alive MQTT can carry.
const maxKeepAlive = 65535 * time.Second
