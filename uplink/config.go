package uplink

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/edgeagent/edgeagent/internal/secret"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// Defaults applied by New to zero fields of Config.
const (
	DefaultMaxBatchRecords = 500
	DefaultMaxBatchBytes   = 256 << 10
	DefaultCompression     = "zstd"
	DefaultAckTimeout      = 10 * time.Second
	DefaultReconnectMax    = 30 * time.Second
)

// Config configures an Uplink. The command layer maps the YAML keys under
// uplink: onto it; error messages name those keys.
type Config struct {
	// Gateway is the gateway id: it names the batches and fills
	// {gateway_id} in the subject or topic.
	Gateway string
	// Exactly one of NATS and MQTT is set.
	NATS *NATSConfig
	MQTT *MQTTConfig
	// MaxBatchRecords bounds the aggregates and alerts in one batch.
	MaxBatchRecords int
	// MaxBatchBytes bounds the uncompressed CBOR body of one batch, and so
	// the memory a receiver needs to decompress it. A single row larger than
	// this travels alone.
	MaxBatchBytes int
	// Compression is "zstd" (the default) or "none".
	Compression string
	// MaxBytesPerSecond caps the message bytes sent per second (token
	// bucket, one second of burst); 0 means unlimited.
	MaxBytesPerSecond int64
	// AckTimeout bounds the wait for a batch's acknowledgement; past it the
	// connection is considered dead and is replaced.
	AckTimeout time.Duration
	// ReconnectMax caps the exponential reconnect backoff.
	ReconnectMax time.Duration
	// OutboxGate, when set, is held for reading while rows are read from
	// the outbox: the window stage holds it for writing from a commit
	// that raises the highest revision until Bronze has recorded it, so
	// no row above Bronze's revision floor is ever sent (see
	// window.Config.SendGate).
	OutboxGate *sync.RWMutex
	// NotUpSince and FailingSince, when set, carry an outage over from the
	// uplink this one replaces (a reload): the status's "uplink down for"
	// counts from when it began, not from the reload.
	NotUpSince, FailingSince time.Time
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Clock defaults to time.Now; Rand (uniform in [0,1)) to math/rand.
	// Tests inject both to pin the backoff and the token bucket.
	Clock func() time.Time
	Rand  func() float64
}

// NATSConfig is uplink.nats.
type NATSConfig struct {
	// URL is one server URL or a comma-separated list (nats://, tls://).
	URL string
	// Subject may contain {gateway_id}.
	Subject string
	// Stream names the stream CreateStream creates.
	Stream string
	// CreateStream creates the stream (subjects = Subject) when it does not
	// exist: for development and the demo. Production streams are made by
	// the cloud side with the settings docs/uplink.md recommends.
	CreateStream bool
	CredsFile    string
	User         string
	Password     string
	Token        string
	TLS          TLSConfig
}

// MQTTConfig is uplink.mqtt.
type MQTTConfig struct {
	// Broker is tcp://, ssl://, tls:// or mqtts:// host:port.
	Broker string
	// Topic may contain {gateway_id}.
	Topic string
	// QoS is 1 (default) or 2; QoS 0 has no acknowledgement to delete on.
	QoS byte
	// ClientID defaults to edgeagent-<gateway>-uplink. It must be stable:
	// the session is persistent (clean session false).
	ClientID string
	Username string
	Password string
	TLS      TLSConfig
}

// TLSConfig is the tls: block of either sink. Setting any file, or using a
// tls:// or ssl:// URL, turns TLS on.
type TLSConfig struct {
	CAFile             string
	CertFile           string
	KeyFile            string
	InsecureSkipVerify bool
}

// ErrConfig is wrapped by every configuration error; the message names the
// YAML key.
var ErrConfig = errors.New("uplink: invalid config")

func configErr(key, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrConfig, key, fmt.Sprintf(format, args...))
}

const gatewayPlaceholder = "{gateway_id}"

// withDefaults returns cfg with zero fields defaulted and templates expanded.
func (cfg Config) withDefaults() Config {
	if cfg.MaxBatchRecords == 0 {
		cfg.MaxBatchRecords = DefaultMaxBatchRecords
	}
	if cfg.MaxBatchBytes == 0 {
		cfg.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if cfg.Compression == "" {
		cfg.Compression = DefaultCompression
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	if cfg.ReconnectMax == 0 {
		cfg.ReconnectMax = DefaultReconnectMax
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	if cfg.NATS != nil {
		n := *cfg.NATS
		n.Subject = strings.ReplaceAll(n.Subject, gatewayPlaceholder, cfg.Gateway)
		cfg.NATS = &n
	}
	if cfg.MQTT != nil {
		m := *cfg.MQTT
		m.Topic = strings.ReplaceAll(m.Topic, gatewayPlaceholder, cfg.Gateway)
		if m.QoS == 0 {
			m.QoS = 1
		}
		if m.ClientID == "" {
			m.ClientID = "edgeagent-" + cfg.Gateway + "-uplink"
		}
		cfg.MQTT = &m
	}
	return cfg
}

// Validate checks cfg, with the defaults New applies, and names the first
// wrong key. New calls it; the config loader may too, to refuse a bad file
// before anything starts.
func (cfg Config) Validate() error { return cfg.withDefaults().validate() }

func (cfg Config) validate() error {
	switch {
	case cfg.Gateway == "":
		return configErr("gateway_id", "empty")
	case strings.ContainsAny(cfg.Gateway, " \t\r\n/+#*>.{}"):
		// The id lands in subjects, topics and batch ids.
		return configErr("gateway_id", "%q contains a character that is not allowed in a NATS subject token or MQTT topic level", cfg.Gateway)
	case (cfg.NATS == nil) == (cfg.MQTT == nil):
		return configErr("uplink", "configure exactly one of uplink.nats and uplink.mqtt")
	case cfg.MaxBatchRecords < 1:
		return configErr("uplink.max_batch_records", "%d, want at least 1", cfg.MaxBatchRecords)
	case cfg.MaxBatchBytes < 1024:
		return configErr("uplink.max_batch_bytes", "%d, want at least 1KiB", cfg.MaxBatchBytes)
	case cfg.MaxBatchBytes > 64<<20:
		return configErr("uplink.max_batch_bytes", "%d, want at most 64MiB (the receivers' decompression limit)", cfg.MaxBatchBytes)
	case cfg.Compression != "zstd" && cfg.Compression != "none":
		return configErr("uplink.compression", "%q, want zstd or none", cfg.Compression)
	case cfg.MaxBytesPerSecond < 0:
		return configErr("uplink.max_bytes_per_second", "%d, want 0 (unlimited) or more", cfg.MaxBytesPerSecond)
	case cfg.MaxBytesPerSecond > 0 && cfg.MaxBytesPerSecond < 1024:
		return configErr("uplink.max_bytes_per_second", "%d, want 0 (unlimited) or at least 1024", cfg.MaxBytesPerSecond)
	case cfg.AckTimeout <= 0:
		return configErr("uplink.ack_timeout", "%v, want a positive duration", cfg.AckTimeout)
	case cfg.ReconnectMax <= 0:
		return configErr("uplink.reconnect_max_interval", "%v, want a positive duration", cfg.ReconnectMax)
	}
	if n := cfg.NATS; n != nil {
		if err := n.validate(); err != nil {
			return err
		}
	}
	if m := cfg.MQTT; m != nil {
		if err := m.validate(); err != nil {
			return err
		}
	}
	return nil
}

func (n *NATSConfig) validate() error {
	if n.URL == "" {
		return configErr("uplink.nats.url", "empty")
	}
	websocket := 0
	urls := strings.Split(n.URL, ",")
	for _, u := range urls {
		p, err := url.Parse(strings.TrimSpace(u))
		u = secret.URL(u, true) // shown below: a password or token in it is not
		if err != nil {
			// url.Error repeats the URL, password and all.
			return configErr("uplink.nats.url", "%q: not a URL", u)
		}
		if p.Scheme == "ws" || p.Scheme == "wss" {
			websocket++
		}
		switch p.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return configErr("uplink.nats.url", "%q: scheme %q, want nats://, tls://, ws:// or wss://", u, p.Scheme)
		}
		if p.Host == "" {
			return configErr("uplink.nats.url", "%q: no host", u)
		}
	}
	if websocket > 0 && websocket < len(urls) {
		// nats.go refuses the mix at every connect.
		return configErr("uplink.nats.url", "mixes websocket (ws://, wss://) and other URLs; list one kind")
	}
	if n.Subject == "" {
		return configErr("uplink.nats.subject", "empty")
	}
	if strings.ContainsAny(n.Subject, " \t\r\n*>") || strings.Contains(n.Subject, "..") ||
		strings.HasPrefix(n.Subject, ".") || strings.HasSuffix(n.Subject, ".") {
		return configErr("uplink.nats.subject", "%q is not a literal NATS subject", n.Subject)
	}
	if strings.ContainsAny(n.Subject, "{}") {
		return configErr("uplink.nats.subject", "%q: unknown placeholder (only {gateway_id})", n.Subject)
	}
	if n.CreateStream && n.Stream == "" {
		return configErr("uplink.nats.stream", "empty, but create_stream is true")
	}
	if strings.ContainsAny(n.Stream, " \t\r\n.*>/\\") {
		return configErr("uplink.nats.stream", "%q is not a valid stream name", n.Stream)
	}
	auth := 0
	for _, set := range []bool{n.CredsFile != "", n.User != "", n.Token != ""} {
		if set {
			auth++
		}
	}
	if auth > 1 {
		return configErr("uplink.nats", "set at most one of creds_file, user/password and token")
	}
	if n.Password != "" && n.User == "" {
		return configErr("uplink.nats.user", "empty, but password is set")
	}
	if n.CredsFile != "" {
		if _, err := os.Stat(n.CredsFile); err != nil {
			return configErr("uplink.nats.creds_file", "%v", err)
		}
	}
	return n.TLS.validate("uplink.nats.tls")
}

func (m *MQTTConfig) validate() error {
	if m.Broker == "" {
		return configErr("uplink.mqtt.broker", "empty")
	}
	p, err := url.Parse(m.Broker)
	if err != nil {
		// url.Error repeats the URL, password and all.
		return configErr("uplink.mqtt.broker", "%q: not a URL", secret.URL(m.Broker, false))
	}
	switch p.Scheme {
	case "tcp", "mqtt", "ssl", "tls", "mqtts", "ws", "wss":
	default:
		return configErr("uplink.mqtt.broker", "%q: scheme %q, want tcp://, mqtt://, ssl://, tls://, mqtts://, ws:// or wss://", secret.URL(m.Broker, false), p.Scheme)
	}
	if p.Host == "" {
		return configErr("uplink.mqtt.broker", "%q: no host", secret.URL(m.Broker, false))
	}
	if m.Topic == "" {
		return configErr("uplink.mqtt.topic", "empty")
	}
	if strings.ContainsAny(m.Topic, "+#\x00") {
		return configErr("uplink.mqtt.topic", "%q: a publish topic cannot hold wildcards", m.Topic)
	}
	if strings.ContainsAny(m.Topic, "{}") {
		return configErr("uplink.mqtt.topic", "%q: unknown placeholder (only {gateway_id})", m.Topic)
	}
	if m.QoS != 1 && m.QoS != 2 {
		return configErr("uplink.mqtt.qos", "%d, want 1 or 2 (QoS 0 is never acknowledged, so a batch could not be deleted safely)", m.QoS)
	}
	if strings.ContainsAny(m.ClientID, "\x00") || len(m.ClientID) > 65535 {
		// MQTT 3.1.1 only promises 23 characters, but mosquitto, mochi and
		// the cloud brokers accept longer ids, so only the hard limits count.
		return configErr("uplink.mqtt.client_id", "%q is not a valid client id", m.ClientID)
	}
	if m.Password != "" && m.Username == "" {
		return configErr("uplink.mqtt.username", "empty, but password is set")
	}
	return m.TLS.validate("uplink.mqtt.tls")
}

func (t TLSConfig) validate(key string) error {
	if (t.CertFile == "") != (t.KeyFile == "") {
		return configErr(key, "cert_file and key_file go together")
	}
	for k, f := range map[string]string{"ca_file": t.CAFile, "cert_file": t.CertFile, "key_file": t.KeyFile} {
		if f == "" {
			continue
		}
		if _, err := os.Stat(f); err != nil {
			return configErr(key+"."+k, "%v", err)
		}
	}
	return nil
}

func (t TLSConfig) enabled() bool {
	return t.CAFile != "" || t.CertFile != "" || t.InsecureSkipVerify
}

// build loads the files into a *tls.Config.
func (t TLSConfig) build(key string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: t.InsecureSkipVerify} //nolint:gosec // explicit opt-in for test rigs
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, configErr(key+".ca_file", "%v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, configErr(key+".ca_file", "%s holds no PEM certificate", t.CAFile)
		}
		c.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, configErr(key+".cert_file", "%v", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

func (cfg Config) encoding() string {
	if cfg.Compression == "none" {
		return wire.EncodingNone
	}
	return wire.EncodingZstd
}
