package rig

import (
	"fmt"
	"strings"
	"time"

	"github.com/edgeagent/edgeagent/testrig/scenario"
	"github.com/edgeagent/edgeagent/testrig/sim"
)

// Names the rig gives the agent's side of the run.
const (
	Gateway = "rig-gw"
	Stream  = "EDGE"
	// Subject is edge.{gateway_id}.aggregates expanded for Gateway.
	Subject  = "edge." + Gateway + ".aggregates"
	ClientID = "edgeagent-" + Gateway
)

// agentConfig is what the rig writes into the agent's config file.
type agentConfig struct {
	DataDir string
	// Broker is the device broker URL, or "" for the agent's embedded
	// broker on EmbeddedListen.
	Broker         string
	EmbeddedListen string
	StatusListen   string
	// NATS or MQTTUplink is the uplink URL (the fault proxy in front of
	// the server); exactly one is set.
	NATS, MQTTUplink string
	Agent            scenario.Agent
}

// setUplink points the agent's uplink at url over transport.
func (c *agentConfig) setUplink(transport, url string) {
	if transport == UplinkMQTT {
		c.MQTTUplink = url
		return
	}
	c.NATS = url
}

// render writes the configuration with the exact keys of docs/config.md.
func (c agentConfig) render() string {
	a := c.Agent
	w := a.Window
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("# Written by edgerig for one run.")
	p("gateway_id: %s", Gateway)
	p("data_dir: %q", c.DataDir)
	p("log: {format: text, level: info}")
	p("mqtt:")
	if c.Broker == "" {
		p("  broker: embedded")
		p("  embedded: {listen: %q}", c.EmbeddedListen)
	} else {
		p("  broker: %q", c.Broker)
	}
	p("  client_id: %s", ClientID)
	p("  subscriptions:")
	p("    - {topic: %q, qos: 1, format: json}", sim.TopicJSON)
	p("    - {topic: %q, qos: 1, format: cbor}", sim.TopicCBOR)
	p("    - {topic: %q, qos: 1, format: number}", sim.TopicNumber)
	p("ingest: {commit_interval: %s, max_commit_records: 1000, clock_tick_interval: %s, max_payload_bytes: %d}",
		dur(a.CommitInterval), dur(a.ClockTickInterval), a.MaxPayloadBytes)
	p("storage: {bronze_retention: 168h, bronze_max_bytes: %d, outbox_max_bytes: %d}", a.BronzeMaxBytes, a.OutboxMaxBytes)
	p("status: {listen: %q}", c.StatusListen)
	p("readings: {event_id: id, event_time: ts, time_format: auto, metrics: [], max_future_skew: %s, max_past_skew: %s}",
		dur(a.MaxFutureSkew), dur(a.MaxPastSkew))
	p("window:")
	p("  size: %s", dur(w.Size))
	p("  slide: %s", dur(w.Slide))
	p("  watermark_delay: %s", dur(w.WatermarkDelay))
	p("  allowed_lateness: %s", dur(w.AllowedLateness))
	p("  idle_timeout: %s", dur(w.IdleTimeout))
	p("  aggregates: [%s]", strings.Join(w.Aggregates, ", "))
	p("  max_devices: 100000")
	p("  device_expiry: 24h")
	p("processing: {trigger_interval: %s, max_records_per_batch: 10000}", dur(a.TriggerInterval))
	p("uplink:")
	if c.MQTTUplink != "" {
		p("  mqtt: {broker: %q, topic: \"edge/{gateway_id}/aggregates\", qos: 1}", c.MQTTUplink)
	} else {
		p("  nats: {url: %q, subject: \"edge.{gateway_id}.aggregates\", stream: %s, create_stream: true}", c.NATS, Stream)
	}
	u := a.Uplink
	p("  max_batch_records: %d", u.MaxBatchRecords)
	p("  max_batch_bytes: %d", u.MaxBatchBytes)
	p("  compression: %s", u.Compression)
	p("  max_bytes_per_second: 0")
	p("  ack_timeout: %s", dur(u.AckTimeout))
	p("  reconnect_max_interval: %s", dur(u.ReconnectMaxInterval))
	if len(a.Alerts) > 0 {
		// Every change sent and none folded: the transitions are then a
		// function of the windows (truth.Transitions).
		p("alerts:")
		for _, r := range a.Alerts {
			p("  - {name: %q, metric: %q, devices: %q, when: %q, for: %d, clear_when: %q, actions: [local], min_interval: 0s}",
				r.Name, r.Metric, r.Devices, r.When, r.For, r.ClearWhen)
		}
		p("local_publish: {alerts_topic: %q, storm_threshold: 1000000000, storm_window: 0s}", AlertsTopic)
	}
	return b.String()
}

// AlertsTopic is where the agent publishes the alerts of a scenario's
// rules, on the device broker.
const AlertsTopic = "edgeagent/{gateway_id}/alerts/{device}"

// dur writes a duration as Go prints it (1m0s, 200ms): the agent parses it
// with time.ParseDuration.
func dur(d time.Duration) string { return d.String() }
