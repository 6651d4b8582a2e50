package agent

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/edgeagent/edgeagent/config"
	"github.com/edgeagent/edgeagent/ingest"
	"github.com/edgeagent/edgeagent/uplink"
	"github.com/edgeagent/edgeagent/window"
)

// The stages take their own plain config structs; these functions map the
// YAML config onto them, in one place.

// WindowConfig maps the config onto the window stage's.
func WindowConfig(cfg *config.Config, configPath string, log *slog.Logger, clock func() time.Time) (window.Config, error) {
	subs := make([]window.Subscription, len(cfg.MQTT.Subscriptions))
	for i, s := range cfg.MQTT.Subscriptions {
		t, err := s.Template()
		if err != nil {
			return window.Config{}, fmt.Errorf("mqtt.subscriptions[%d].topic: %w", i, err)
		}
		subs[i] = window.Subscription{Template: t, Format: s.Format}
	}
	return window.Config{
		Gateway:             cfg.GatewayID,
		Subscriptions:       subs,
		EventID:             cfg.Readings.EventID,
		EventTime:           cfg.Readings.EventTime,
		TimeFormat:          cfg.Readings.TimeFormat,
		Metrics:             cfg.Readings.Metrics,
		MaxFutureSkew:       time.Duration(cfg.Readings.MaxFutureSkew),
		MaxPastSkew:         time.Duration(cfg.Readings.MaxPastSkew),
		Size:                time.Duration(cfg.Window.Size),
		Slide:               time.Duration(cfg.Window.Slide),
		WatermarkDelay:      time.Duration(cfg.Window.WatermarkDelay),
		AllowedLateness:     time.Duration(cfg.Window.AllowedLateness),
		IdleTimeout:         time.Duration(cfg.Window.IdleTimeout),
		Aggregates:          cfg.Window.Aggregates,
		MaxDevices:          cfg.Window.MaxDevices,
		MaxMetricsPerDevice: cfg.Window.MaxMetricsPerDevice,
		DeviceExpiry:        time.Duration(cfg.Window.DeviceExpiry),
		TriggerInterval:     time.Duration(cfg.Processing.TriggerInterval),
		MaxRecordsPerBatch:  cfg.Processing.MaxRecordsPerBatch,
		HeapPaced:           cfg.Processing.HeapPacing,
		CheckpointInterval:  time.Duration(cfg.Processing.CheckpointInterval),
		OutboxMaxBytes:      int64(cfg.Storage.OutboxMaxBytes),
		Logger:              log.With("component", "window"),
		Clock:               clock,
		ConfigPath:          configPath,
		// Batches sealed for the uplink but not yet acknowledged still count
		// against storage.outbox_max_bytes.
		OutboxBytes: uplink.BacklogBytes,
	}, nil
}

func ingestConfig(cfg *config.Config, log *slog.Logger, clock func() time.Time) (ingest.Config, error) {
	subs := make([]ingest.Subscription, len(cfg.MQTT.Subscriptions))
	for i, s := range cfg.MQTT.Subscriptions {
		t, err := s.Template()
		if err != nil {
			return ingest.Config{}, fmt.Errorf("mqtt.subscriptions[%d].topic: %w", i, err)
		}
		subs[i] = ingest.Subscription{Template: t, QoS: byte(s.QoS)}
	}
	tc, err := tlsConfig(cfg.MQTT.TLS, "mqtt")
	if err != nil {
		return ingest.Config{}, err
	}
	ic := ingest.Config{
		Broker:           cfg.MQTT.Broker,
		ClientID:         cfg.MQTT.ClientID,
		Username:         cfg.MQTT.Username,
		Password:         cfg.MQTT.Password,
		TLS:              tc,
		KeepAlive:        time.Duration(cfg.MQTT.KeepAlive),
		ConnectTimeout:   time.Duration(cfg.MQTT.ConnectTimeout),
		ReconnectMax:     time.Duration(cfg.MQTT.ReconnectMaxInterval),
		Subscriptions:    subs,
		CommitInterval:   time.Duration(cfg.Ingest.CommitInterval),
		MaxCommitRecords: cfg.Ingest.MaxCommitRecords,
		ClockTick:        time.Duration(cfg.Ingest.ClockTickInterval),
		MaxPayloadBytes:  int(cfg.Ingest.MaxPayloadBytes),
		Clock:            clock,
		Logger:           log,
	}
	if cfg.MQTT.Broker == "embedded" {
		ic.Broker, ic.Embedded, ic.EmbeddedMaxPendingWrites = "", cfg.MQTT.Embedded.Listen, cfg.MQTT.Embedded.MaxPendingWrites
		ic.EmbeddedSessionExpiry = time.Duration(cfg.MQTT.Embedded.SessionExpiry)
	}
	return ic, nil
}

// uplinkConfig maps the uplink section; ok is false when no sink is set.
func uplinkConfig(cfg *config.Config, log *slog.Logger, clock func() time.Time) (uplink.Config, bool, error) {
	u := cfg.Uplink
	uc := uplink.Config{
		Gateway:           cfg.GatewayID,
		MaxBatchRecords:   u.MaxBatchRecords,
		MaxBatchBytes:     int(u.MaxBatchBytes),
		Compression:       u.Compression,
		MaxBytesPerSecond: int64(u.MaxBytesPerSecond),
		AckTimeout:        time.Duration(u.AckTimeout),
		ReconnectMax:      time.Duration(u.ReconnectMaxInterval),
		Logger:            log, // the uplink adds component=uplink itself
		Clock:             clock,
	}
	tls := func(t config.TLS) uplink.TLSConfig {
		return uplink.TLSConfig{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, InsecureSkipVerify: t.InsecureSkipVerify}
	}
	switch {
	case u.NATS.URL != "":
		n := u.NATS
		uc.NATS = &uplink.NATSConfig{URL: n.URL, Subject: n.Subject, Stream: n.Stream, CreateStream: n.CreateStream,
			CredsFile: n.CredsFile, User: n.User, Password: n.Password, Token: n.Token, TLS: tls(n.TLS)}
	case u.MQTT.Broker != "":
		m := u.MQTT
		uc.MQTT = &uplink.MQTTConfig{Broker: m.Broker, Topic: m.Topic, QoS: byte(m.QoS), ClientID: m.ClientID,
			Username: m.Username, Password: m.Password, TLS: tls(m.TLS)}
	default:
		return uc, false, nil
	}
	return uc, true, nil
}
