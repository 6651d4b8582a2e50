package config

import (
	"math"
	"time"

	"github.com/edgeagent/edgeagent/internal/topic"
)

// Config is the whole agent configuration. The yaml tags are the key names
// of the file (a contract: docs/config.md documents each one). Fields tagged
// secret:"true" are masked by Redacted; fields tagged redact:"url" have the
// password in their URL user info masked, and redact:"nats-url" the token
// too (a NATS URL's user without a password is a token).
type Config struct {
	// GatewayID names this gateway in every aggregate, NATS subject and MQTT
	// topic it produces. Required; letters, digits, '_' and '-' (one NATS subject token).
	GatewayID string `yaml:"gateway_id"`
	// DataDir holds the Bronze log and the state database.
	DataDir      string       `yaml:"data_dir"`
	Log          Log          `yaml:"log"`
	MQTT         MQTT         `yaml:"mqtt"`
	Ingest       Ingest       `yaml:"ingest"`
	Storage      Storage      `yaml:"storage"`
	Status       Status       `yaml:"status"`
	Readings     Readings     `yaml:"readings"`
	Window       Window       `yaml:"window"`
	Processing   Processing   `yaml:"processing"`
	Uplink       Uplink       `yaml:"uplink"`
	Alerts       []AlertRule  `yaml:"alerts"`
	LocalPublish LocalPublish `yaml:"local_publish"`

	// src remembers where each key was written so Validate can name lines;
	// nil for configs built in code.
	src *source
}

// Log configures the agent's own log output (stderr).
type Log struct {
	Format string `yaml:"format"` // text | json
	Level  string `yaml:"level"`  // debug | info | warn | error
}

// TLS configures a TLS client connection. Paths are read at connect time.
type TLS struct {
	CAFile             string `yaml:"ca_file"`
	CertFile           string `yaml:"cert_file"`
	KeyFile            string `yaml:"key_file"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
}

// IsZero reports whether no TLS setting is made.
func (t TLS) IsZero() bool { return t == TLS{} }

// MQTT is the device-side broker the agent subscribes to.
type MQTT struct {
	// Broker is a URL (tcp, ssl, tls, mqtt, mqtts, ws, wss) or "embedded"
	// to run the built-in broker listening on Embedded.Listen.
	Broker   string   `yaml:"broker" redact:"url"`
	Embedded Embedded `yaml:"embedded"`
	// ClientID defaults to "edgeagent-<gateway_id>". It must be stable: the
	// broker keeps the persistent QoS1 session under it.
	ClientID             string         `yaml:"client_id"`
	Username             string         `yaml:"username"`
	Password             string         `yaml:"password" secret:"true"`
	TLS                  TLS            `yaml:"tls"`
	KeepAlive            Duration       `yaml:"keep_alive"`
	ConnectTimeout       Duration       `yaml:"connect_timeout"`
	ReconnectMaxInterval Duration       `yaml:"reconnect_max_interval"`
	Subscriptions        []Subscription `yaml:"subscriptions"`
}

// Embedded configures the built-in broker (mqtt.broker: embedded).
type Embedded struct {
	Listen string `yaml:"listen"` // host:port
	// MaxPendingWrites bounds the messages the broker holds for one
	// connected client while they wait to be written to it; beyond that
	// it drops them (counted). The broker reserves room for this many on
	// every connection, devices included, so it sets a floor on memory
	// per connected device.
	MaxPendingWrites int `yaml:"max_pending_writes"`
	// SessionExpiry is how long the broker keeps a disconnected client's
	// persistent session: kept for ever (mochi's default), one per client
	// id that ever connected, sessions grew memory without end.
	SessionExpiry Duration `yaml:"session_expiry"`
}

// Subscription is one topic template the agent subscribes to.
type Subscription struct {
	// Topic is a template with a {device} level and optionally a {metric}
	// level, e.g. "sensors/{device}/telemetry".
	Topic  string `yaml:"topic"`
	QoS    int    `yaml:"qos"`    // 0, 1 or 2
	Format string `yaml:"format"` // json | cbor | number
}

// Template parses the subscription's topic template. It cannot fail on a
// Config that passed Validate.
func (s Subscription) Template() (*topic.Template, error) { return topic.Parse(s.Topic) }

func (s *Subscription) setDefaults() { *s = Subscription{QoS: 1, Format: "json"} }

// Ingest tunes how received messages are committed to Bronze.
type Ingest struct {
	// CommitInterval is the longest a received message waits for its group
	// commit (and so for its PUBACK). Once a fifth of it has passed, a
	// group commits as soon as the input paused for a tenth of it.
	CommitInterval    Duration `yaml:"commit_interval"`
	MaxCommitRecords  int      `yaml:"max_commit_records"`
	ClockTickInterval Duration `yaml:"clock_tick_interval"`
	// MaxPayloadBytes: larger payloads are dead-lettered.
	MaxPayloadBytes Size `yaml:"max_payload_bytes"`
}

// Storage bounds the on-disk buffers.
type Storage struct {
	// BronzeRetention is the age after which processed Bronze records are
	// trimmed; 0 keeps them until BronzeMaxBytes forces them out.
	BronzeRetention Duration `yaml:"bronze_retention"`
	BronzeMaxBytes  Size     `yaml:"bronze_max_bytes"`
	OutboxMaxBytes  Size     `yaml:"outbox_max_bytes"`
}

// Status configures the local status endpoint (/metrics, JSON, human view).
type Status struct {
	// Listen is host:port; "" disables the endpoint.
	Listen string `yaml:"listen"`
	// Token is required when Listen is not a loopback address; clients send
	// it as a bearer token.
	Token string `yaml:"token" secret:"true"`
	// TLS serves the endpoint over HTTPS, so the token and the figures do
	// not cross the network in clear text.
	TLS StatusTLS `yaml:"tls"`
}

// StatusTLS is the status endpoint's server certificate. The files are
// read again when they change, so a renewed certificate needs no restart.
type StatusTLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// Enabled reports whether the endpoint serves HTTPS.
func (t StatusTLS) Enabled() bool { return t.CertFile != "" }

// Readings says how to read a device payload.
type Readings struct {
	EventID       string   `yaml:"event_id"`    // dot path; "" → content hash
	EventTime     string   `yaml:"event_time"`  // dot path; "" → received-at, flagged
	TimeFormat    string   `yaml:"time_format"` // unix_s | unix_ms | unix_ns | rfc3339 | auto
	Metrics       []string `yaml:"metrics"`     // dot paths; empty → every numeric field
	MaxFutureSkew Duration `yaml:"max_future_skew"`
	MaxPastSkew   Duration `yaml:"max_past_skew"`
}

// Window configures event-time windowing. Changing Size or Slide makes
// saved window state incompatible.
type Window struct {
	Size            Duration `yaml:"size"`
	Slide           Duration `yaml:"slide"`
	WatermarkDelay  Duration `yaml:"watermark_delay"`
	AllowedLateness Duration `yaml:"allowed_lateness"`
	IdleTimeout     Duration `yaml:"idle_timeout"`
	Aggregates      []string `yaml:"aggregates"`
	MaxDevices      int      `yaml:"max_devices"`
	// MaxMetricsPerDevice bounds one device's metrics in state: a device
	// inventing a metric name with every reading (a key made of a
	// timestamp) would hold memory without end.
	MaxMetricsPerDevice int      `yaml:"max_metrics_per_device"`
	DeviceExpiry        Duration `yaml:"device_expiry"`
}

// Processing paces the micro-batches from Bronze to the outbox.
type Processing struct {
	TriggerInterval    Duration `yaml:"trigger_interval"`
	MaxRecordsPerBatch int      `yaml:"max_records_per_batch"`
	CheckpointInterval Duration `yaml:"checkpoint_interval"`
	// MaxProcs is how many threads run the agent's Go code at once
	// (GOMAXPROCS); 0 means one per CPU. GOMAXPROCS in the environment
	// takes precedence.
	MaxProcs int `yaml:"max_procs"`
	// HeapPacing sets Go's soft memory limit after every collection from
	// the quietest live heap of the last eight, its pointer-free bytes
	// given half GOGC's headroom (internal/heapgoal), so a collection that
	// lands on a passing peak does not raise the heap's goal, and resident
	// memory, with it.
	HeapPacing bool `yaml:"heap_pacing"`
}

// Uplink configures delivery of the outbox to the cloud. At most one of
// NATS.URL and MQTT.Broker may be set. When neither is set the uplink is
// disabled: aggregates accumulate in the outbox (bounded by
// storage.outbox_max_bytes) until an uplink is configured.
type Uplink struct {
	NATS                 NATS       `yaml:"nats"`
	MQTT                 UplinkMQTT `yaml:"mqtt"`
	MaxBatchRecords      int        `yaml:"max_batch_records"`
	MaxBatchBytes        Size       `yaml:"max_batch_bytes"`
	Compression          string     `yaml:"compression"` // zstd | none
	MaxBytesPerSecond    Size       `yaml:"max_bytes_per_second"`
	AckTimeout           Duration   `yaml:"ack_timeout"`
	ReconnectMaxInterval Duration   `yaml:"reconnect_max_interval"`
}

// Transport names the configured uplink: "nats", "mqtt", or "" when the
// uplink is disabled.
func (u Uplink) Transport() string {
	switch {
	case u.NATS.URL != "":
		return "nats"
	case u.MQTT.Broker != "":
		return "mqtt"
	}
	return ""
}

// NATS is the JetStream uplink.
type NATS struct {
	// URL is one server URL or a comma-separated list.
	URL string `yaml:"url" redact:"nats-url"`
	// Subject may contain {gateway_id}.
	Subject      string `yaml:"subject"`
	Stream       string `yaml:"stream"`
	CreateStream bool   `yaml:"create_stream"`
	CredsFile    string `yaml:"creds_file"`
	User         string `yaml:"user"`
	Password     string `yaml:"password" secret:"true"`
	Token        string `yaml:"token" secret:"true"`
	TLS          TLS    `yaml:"tls"`
}

// UplinkMQTT is the MQTT uplink (QoS 1 or 2, so there is an ack to wait for).
type UplinkMQTT struct {
	Broker string `yaml:"broker" redact:"url"`
	// Topic may contain {gateway_id}.
	Topic string `yaml:"topic"`
	QoS   int    `yaml:"qos"`
	// ClientID defaults to "edgeagent-<gateway_id>-uplink".
	ClientID string `yaml:"client_id"`
	Username string `yaml:"username"`
	Password string `yaml:"password" secret:"true"`
	TLS      TLS    `yaml:"tls"`
}

// AlertRule turns window aggregates into fired / cleared transitions.
type AlertRule struct {
	Name    string `yaml:"name"`
	Metric  string `yaml:"metric"`
	Devices string `yaml:"devices"` // path.Match glob over device ids
	// When is "<aggregate> <op> <number>", e.g. "mean > 80".
	When string `yaml:"when"`
	// For is how many consecutive windows When must hold before firing.
	For int `yaml:"for"`
	// ClearWhen defaults to the negation of When; Parse fills it in.
	ClearWhen   string   `yaml:"clear_when"`
	Severity    string   `yaml:"severity"`
	Actions     []string `yaml:"actions"` // uplink, local
	Retain      bool     `yaml:"retain"`
	MinInterval Duration `yaml:"min_interval"`
}

// WhenCondition parses When.
func (r AlertRule) WhenCondition() (Condition, error) { return ParseCondition(r.When) }

// ClearCondition parses ClearWhen, or negates When when ClearWhen is empty.
func (r AlertRule) ClearCondition() (Condition, error) {
	if r.ClearWhen != "" {
		return ParseCondition(r.ClearWhen)
	}
	c, err := ParseCondition(r.When)
	if err != nil {
		return Condition{}, err
	}
	return c.Negate(), nil
}

func (r *AlertRule) setDefaults() {
	*r = AlertRule{Devices: "*", For: 1, Actions: []string{"uplink"}, MinInterval: Duration(time.Minute)}
}

// LocalPublish configures messages published back to the device-side broker.
type LocalPublish struct {
	// AlertsTopic may contain {gateway_id} and {device}; "" turns local
	// alert messages off.
	AlertsTopic string `yaml:"alerts_topic"`
	// AggregatesTopic may contain {gateway_id}, {device} and {metric};
	// "" (the default) turns local aggregate messages off.
	AggregatesTopic string `yaml:"aggregates_topic"`
	// StormThreshold: more transitions of one rule within StormWindow
	// than this are folded into one summary message.
	StormThreshold int `yaml:"storm_threshold"`
	// StormWindow is how long after a rule's first transition, on the
	// logged clock, later ones count to the same storm; 0 counts only
	// transitions at the same instant.
	StormWindow Duration `yaml:"storm_window"`
}

// Default returns a Config holding every default. It does not validate:
// gateway_id and mqtt.subscriptions have no default.
func Default() *Config {
	return &Config{
		DataDir: "/var/lib/edgeagent",
		Log:     Log{Format: "text", Level: "info"},
		MQTT: MQTT{
			Broker:               "tcp://127.0.0.1:1883",
			Embedded:             Embedded{Listen: "127.0.0.1:1883", MaxPendingWrites: 256, SessionExpiry: Duration(time.Hour)},
			KeepAlive:            Duration(30 * time.Second),
			ConnectTimeout:       Duration(10 * time.Second),
			ReconnectMaxInterval: Duration(30 * time.Second),
			Subscriptions:        []Subscription{},
		},
		Ingest: Ingest{
			CommitInterval:    Duration(50 * time.Millisecond),
			MaxCommitRecords:  1000,
			ClockTickInterval: Duration(time.Second),
			MaxPayloadBytes:   256 << 10,
		},
		Storage: Storage{
			BronzeRetention: Duration(168 * time.Hour),
			BronzeMaxBytes:  1 << 30,
			OutboxMaxBytes:  256 << 20,
		},
		Status: Status{Listen: "127.0.0.1:9464"},
		Readings: Readings{
			EventID:       "id",
			EventTime:     "ts",
			TimeFormat:    "auto",
			Metrics:       []string{},
			MaxFutureSkew: Duration(5 * time.Minute),
			MaxPastSkew:   Duration(720 * time.Hour),
		},
		Window: Window{
			// In a file, Slide, IdleTimeout and DeviceExpiry follow the
			// size unless written (ApplyDerived); these are their values
			// for the default size.
			Size:                Duration(time.Minute),
			Slide:               Duration(time.Minute),
			WatermarkDelay:      Duration(10 * time.Second),
			AllowedLateness:     Duration(10 * time.Minute),
			IdleTimeout:         DefaultIdleTimeout,
			Aggregates:          []string{"count", "sum", "min", "max", "mean", "first", "last"},
			MaxDevices:          100000,
			MaxMetricsPerDevice: 1000,
			DeviceExpiry:        DefaultDeviceExpiry,
		},
		Processing: Processing{
			TriggerInterval:    Duration(time.Second),
			MaxRecordsPerBatch: 10000,
			CheckpointInterval: Duration(10 * time.Second),
			MaxProcs:           1,
			HeapPacing:         true,
		},
		Uplink: Uplink{
			NATS: NATS{Subject: "edge.{gateway_id}.aggregates", Stream: "EDGE"},
			MQTT: UplinkMQTT{Topic: "edge/{gateway_id}/aggregates", QoS: 1},

			MaxBatchRecords:      500,
			MaxBatchBytes:        256 << 10,
			Compression:          "zstd",
			AckTimeout:           Duration(10 * time.Second),
			ReconnectMaxInterval: Duration(30 * time.Second),
		},
		Alerts: []AlertRule{},
		LocalPublish: LocalPublish{
			AlertsTopic:    "edgeagent/{gateway_id}/alerts/{device}",
			StormThreshold: 20,
			StormWindow:    Duration(time.Minute),
		},
	}
}

// The floors of the window defaults derived from the size.
const (
	DefaultIdleTimeout  = Duration(2 * time.Minute)
	DefaultDeviceExpiry = Duration(24 * time.Hour)
)

// written reports whether key was set in the file the config came from.
func (c *Config) written(key string) bool {
	if c.src == nil {
		return false
	}
	_, ok := c.src.pos[key]
	return ok
}

// ApplyDerived fills the defaults that depend on other fields: the MQTT
// client ids (from gateway_id), each alert's clear_when (the negation of
// its when) and, in a config parsed from a file, the window settings that
// follow window.size when the file does not write them: slide = size,
// idle_timeout = max(2m, size + watermark_delay), device_expiry =
// max(24h, 2 × (idle_timeout + allowed_lateness)). Parse calls it; call it
// after building or editing a Config in code. Values already set are kept.
func (c *Config) ApplyDerived() {
	// So that writing only size: 5m gives tumbling 5m windows that no idle
	// close cuts short, and a day's window does not fail the device_expiry
	// rule it never wrote.
	// A size that is itself wrong derives nothing: its error is enough,
	// without echoes on keys the file never wrote.
	if w := &c.Window; c.src != nil && w.Size > 0 && time.Duration(w.Size)%time.Millisecond == 0 {
		if !c.written("window.slide") {
			w.Slide = w.Size
		}
		// Saturating: a size of centuries must not wrap into a negative
		// default that then fails a rule the file never wrote.
		if !c.written("window.idle_timeout") {
			w.IdleTimeout = max(DefaultIdleTimeout, satAdd(w.Size, w.WatermarkDelay))
		}
		if !c.written("window.device_expiry") {
			d := satAdd(w.IdleTimeout, w.AllowedLateness)
			w.DeviceExpiry = max(DefaultDeviceExpiry, satAdd(d, d))
		}
	}
	if c.GatewayID != "" {
		if c.MQTT.ClientID == "" {
			c.MQTT.ClientID = "edgeagent-" + c.GatewayID
		}
		if c.Uplink.MQTT.ClientID == "" {
			c.Uplink.MQTT.ClientID = "edgeagent-" + c.GatewayID + "-uplink"
		}
	}
	for i := range c.Alerts {
		r := &c.Alerts[i]
		if r.ClearWhen != "" {
			continue
		}
		if cond, err := ParseCondition(r.When); err == nil {
			r.ClearWhen = cond.Negate().String()
		}
	}
}

// satAdd adds two non-negative durations, stopping at the largest.
func satAdd(a, b Duration) Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
