package uplink

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	nats := func() *NATSConfig {
		return &NATSConfig{URL: "nats://127.0.0.1:4222", Subject: "edge.{gateway_id}.aggregates", Stream: "EDGE"}
	}
	mqtt := func() *MQTTConfig {
		return &MQTTConfig{Broker: "tcp://127.0.0.1:1883", Topic: "edge/{gateway_id}/aggregates"}
	}
	cases := []struct {
		name string
		edit func(c *Config)
		key  string // "" means valid
	}{
		{"nats ok", func(c *Config) {}, ""},
		{"mqtt ok", func(c *Config) { c.NATS, c.MQTT = nil, mqtt() }, ""},
		{"nats cluster urls", func(c *Config) { c.NATS.URL = "nats://a:4222, tls://b:4222" }, ""},
		{"no gateway", func(c *Config) { c.Gateway = "" }, "gateway_id"},
		{"gateway with a dot", func(c *Config) { c.Gateway = "gw.1" }, "gateway_id"},
		{"both sinks", func(c *Config) { c.MQTT = mqtt() }, "exactly one"},
		{"no sink", func(c *Config) { c.NATS = nil }, "exactly one"},
		{"records", func(c *Config) { c.MaxBatchRecords = -1 }, "uplink.max_batch_records"},
		{"bytes too small", func(c *Config) { c.MaxBatchBytes = 100 }, "uplink.max_batch_bytes"},
		{"bytes too big", func(c *Config) { c.MaxBatchBytes = 1 << 30 }, "uplink.max_batch_bytes"},
		{"compression", func(c *Config) { c.Compression = "gzip" }, "uplink.compression"},
		{"rate negative", func(c *Config) { c.MaxBytesPerSecond = -5 }, "uplink.max_bytes_per_second"},
		{"rate tiny", func(c *Config) { c.MaxBytesPerSecond = 10 }, "uplink.max_bytes_per_second"},
		{"ack timeout", func(c *Config) { c.AckTimeout = -time.Second }, "uplink.ack_timeout"},
		{"reconnect", func(c *Config) { c.ReconnectMax = -time.Second }, "uplink.reconnect_max_interval"},
		{"nats url empty", func(c *Config) { c.NATS.URL = "" }, "uplink.nats.url"},
		{"nats url scheme", func(c *Config) { c.NATS.URL = "http://x:4222" }, "uplink.nats.url"},
		{"nats subject wildcard", func(c *Config) { c.NATS.Subject = "edge.>" }, "uplink.nats.subject"},
		{"nats subject placeholder", func(c *Config) { c.NATS.Subject = "edge.{device}" }, "uplink.nats.subject"},
		{"nats stream missing", func(c *Config) { c.NATS.Stream, c.NATS.CreateStream = "", true }, "uplink.nats.stream"},
		{"nats two auths", func(c *Config) { c.NATS.User, c.NATS.Token = "u", "t" }, "uplink.nats"},
		{"nats password alone", func(c *Config) { c.NATS.Password = "p" }, "uplink.nats.user"},
		{"nats creds missing", func(c *Config) { c.NATS.CredsFile = "/nonexistent/edge.creds" }, "uplink.nats.creds_file"},
		{"nats ca missing", func(c *Config) { c.NATS.TLS.CAFile = "/nonexistent/ca.pem" }, "uplink.nats.tls.ca_file"},
		{"nats cert without key", func(c *Config) { c.NATS.TLS.CertFile = "/nonexistent/c.pem" }, "uplink.nats.tls"},
		{"mqtt broker scheme", func(c *Config) { c.NATS, c.MQTT = nil, mqtt(); c.MQTT.Broker = "nats://x:1" }, "uplink.mqtt.broker"},
		{"nats url not a URL, password", func(c *Config) { c.NATS.URL = "nats://u:s3cret@host:abc" }, "uplink.nats.url"},
		{"nats url scheme, password", func(c *Config) { c.NATS.URL = "http://u:s3cret@host:4222" }, "uplink.nats.url"},
		{"mqtt broker not a URL, password", func(c *Config) { c.NATS, c.MQTT = nil, mqtt(); c.MQTT.Broker = "tcp://u:s3cret@host:abc" }, "uplink.mqtt.broker"},
		{"mqtt topic wildcard", func(c *Config) { c.NATS, c.MQTT = nil, mqtt(); c.MQTT.Topic = "edge/#" }, "uplink.mqtt.topic"},
		{"mqtt qos", func(c *Config) { c.NATS, c.MQTT = nil, mqtt(); c.MQTT.QoS = 3 }, "uplink.mqtt.qos"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := Config{Gateway: "gw-1", NATS: nats()}
			c.edit(&cfg)
			err := cfg.Validate()
			if err != nil && strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("the error shows the URL's password: %v", err)
			}
			if c.key == "" {
				if err != nil {
					t.Fatalf("valid config refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.key) {
				t.Fatalf("error %v, want ErrConfig naming %q", err, c.key)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	cfg := Config{Gateway: "gw-7", MQTT: &MQTTConfig{Broker: "tcp://127.0.0.1:1883", Topic: "edge/{gateway_id}/aggregates"}}.withDefaults()
	if cfg.MaxBatchRecords != 500 || cfg.MaxBatchBytes != 256<<10 || cfg.Compression != "zstd" ||
		cfg.AckTimeout != 10*time.Second || cfg.ReconnectMax != 30*time.Second || cfg.Clock == nil || cfg.Rand == nil || cfg.Logger == nil {
		t.Fatalf("defaults: %+v", cfg)
	}
	if cfg.MQTT.Topic != "edge/gw-7/aggregates" || cfg.MQTT.ClientID != "edgeagent-gw-7-uplink" || cfg.MQTT.QoS != 1 {
		t.Fatalf("mqtt defaults: %+v", cfg.MQTT)
	}
	n := Config{Gateway: "gw-7", NATS: &NATSConfig{URL: "nats://x:1", Subject: "edge.{gateway_id}.aggregates"}}
	if got := n.withDefaults().NATS.Subject; got != "edge.gw-7.aggregates" {
		t.Fatalf("subject = %q", got)
	}
	if n.NATS.Subject != "edge.{gateway_id}.aggregates" {
		t.Fatal("withDefaults changed the caller's NATSConfig")
	}
	if _, err := New(nil, n); !errors.Is(err, ErrConfig) {
		t.Fatalf("New with a nil db: %v", err)
	}
}
