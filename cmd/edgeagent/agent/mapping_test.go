package agent

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/config"
)

// TestConfigCheckAgreesWithTheStages guards against drift between the
// config check (which names file, line and key) and the checks the window
// stage and the uplink make when they start: a value the check passes but a
// stage refuses makes `edgeagent config check` succeed and the agent fail
// to start without a line number. Each case sets one value at or past a
// boundary; whatever the check accepts, the stages must accept (the check
// may be stricter).
func TestConfigCheckAgreesWithTheStages(t *testing.T) {
	base := []struct{ key, yaml string }{
		{"gateway_id", "gateway_id: gw-1"},
		{"data_dir", "data_dir: /tmp/edgeagent-mapping-test"},
		{"mqtt", "mqtt:\n  broker: tcp://127.0.0.1:1883\n  subscriptions:\n    - {topic: \"s/{device}\", format: json}"},
		{"readings", "readings: {event_id: id, event_time: ts}"},
		{"window", "window: {size: 1m}"},
		{"processing", "processing: {trigger_interval: 1s}"},
		{"uplink", "uplink:\n  nats: {url: \"nats://127.0.0.1:4222\"}"},
	}
	metrics := make([]string, 65)
	for i := range metrics {
		metrics[i] = fmt.Sprintf("m%d", i)
	}
	cases := []struct {
		key, yaml string
	}{
		{"gateway_id", "gateway_id: gw-1_A"},
		{"gateway_id", "gateway_id: gw.1"},
		{"gateway_id", "gateway_id: gw/1"},
		{"gateway_id", "gateway_id: \"gw 1\""},
		{"gateway_id", "gateway_id: \"gw>1\""},
		{"gateway_id", "gateway_id: \"gw{1}\""},
		{"gateway_id", "gateway_id: \"gw+1\""},
		{"gateway_id", "gateway_id: \"gw:1\""},

		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\"}, max_batch_bytes: 1023}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\"}, max_batch_bytes: 1024}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\"}, max_batch_bytes: 64MiB}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\"}, max_batch_bytes: 67108865}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\"}, max_bytes_per_second: 1}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\"}, max_bytes_per_second: 1023}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\"}, max_bytes_per_second: 1024}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\"}, max_batch_records: 0}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\"}, compression: lz4}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\"}, ack_timeout: 0s}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\"}, reconnect_max_interval: 0s}"},
		{"uplink", "uplink: {nats: {url: \"http://127.0.0.1:4222\"}}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222,tls://127.0.0.1:4223\"}}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\", subject: \"edge..x\"}}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\", subject: \"edge.*\"}}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\", subject: \"edge.>\"}}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\", subject: \"edge.a*b\"}}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\", subject: \"edge.{device}\"}}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\", subject: \"edge.x.\"}}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\", stream: \"a.b\"}}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\", stream: \"\", create_stream: true}}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\", user: u, token: t}}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\", password: p}}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\", creds_file: /nonexistent/creds}}"},
		{"uplink", "uplink: {nats: {url: \"nats://127.0.0.1:4222\", tls: {cert_file: /nonexistent/c.pem}}}"},
		{"uplink", "uplink: {mqtt: {broker: \"tcp://127.0.0.1:1884\"}}"},
		{"uplink", "uplink: {mqtt: {broker: \"http://127.0.0.1:1884\"}}"},
		{"uplink", "uplink: {mqtt: {broker: \"tcp://127.0.0.1:1884\", topic: \"a/+\"}}"},
		{"uplink", "uplink: {mqtt: {broker: \"tcp://127.0.0.1:1884\", topic: \"a/{device}\"}}"},
		{"uplink", "uplink: {mqtt: {broker: \"tcp://127.0.0.1:1884\", qos: 0}}"},
		{"uplink", "uplink: {mqtt: {broker: \"tcp://127.0.0.1:1884\", qos: 2}}"},
		{"uplink", "uplink: {mqtt: {broker: \"tcp://127.0.0.1:1884\", password: p}}"},

		{"window", "window: {size: 1ms}"},
		{"window", "window: {size: 1500us}"},
		{"window", "window: {size: 1m, slide: 2m}"},
		{"window", "window: {size: 2h, slide: 1m}"},
		{"window", "window: {size: 100m, slide: 1m}"},
		{"window", "window: {size: 1m, watermark_delay: -1s}"},
		{"window", "window: {size: 1m, allowed_lateness: -1s}"},
		{"window", "window: {size: 1m, idle_timeout: 0s}"},
		{"window", "window: {size: 1m, idle_timeout: 1h, device_expiry: 30m}"},
		{"window", "window: {size: 1m, aggregates: [count, count]}"},
		{"window", "window: {size: 1m, aggregates: [median]}"},
		{"window", "window: {size: 1m, max_devices: -1}"},

		{"processing", "processing: {trigger_interval: 500us}"},
		{"processing", "processing: {trigger_interval: 1s, checkpoint_interval: -1s}"},
		{"processing", "processing: {trigger_interval: 1s, max_records_per_batch: -1}"},

		{"readings", "readings: {event_id: .id, event_time: ts}"},
		{"readings", "readings: {event_id: id, event_time: a..b}"},
		{"readings", "readings: {event_id: id, event_time: ts, metrics: [\"\"]}"},
		{"readings", "readings: {event_id: id, event_time: ts, metrics: [id]}"},
		{"readings", "readings: {event_id: id, event_time: ts, metrics: [" + strings.Join(metrics, ", ") + "]}"},
		{"readings", "readings: {event_id: id, event_time: ts, time_format: unix_us}"},
		{"readings", "readings: {event_id: id, event_time: ts, max_future_skew: -1s}"},

		{"mqtt", "mqtt:\n  broker: tcp://127.0.0.1:1883\n  subscriptions:\n    - {topic: \"s/+\", format: json}"},
		{"mqtt", "mqtt:\n  broker: tcp://127.0.0.1:1883\n  subscriptions:\n    - {topic: \"s/{device}\", format: xml}"},
	}
	log := slog.New(slog.DiscardHandler)
	clock := func() time.Time { return time.Unix(0, 0) }
	refused := 0
	for _, tc := range cases {
		var b strings.Builder
		for _, s := range base {
			if s.key == tc.key {
				b.WriteString(tc.yaml)
			} else {
				b.WriteString(s.yaml)
			}
			b.WriteByte('\n')
		}
		cfg, checkErr := config.Parse("edgeagent.yaml", []byte(b.String()), func(string) (string, bool) { return "", false })
		if checkErr == nil {
			checkErr = cfg.CheckFiles()
		}
		if checkErr != nil {
			refused++
			continue
		}
		var stageErrs []string
		wc, err := WindowConfig(cfg, "edgeagent.yaml", log, clock)
		if err == nil {
			err = wc.Validate()
		}
		if err != nil {
			stageErrs = append(stageErrs, "window: "+err.Error())
		}
		if uc, ok, err := uplinkConfig(cfg, log, clock); err != nil {
			stageErrs = append(stageErrs, "uplink mapping: "+err.Error())
		} else if ok {
			if err := uc.Validate(); err != nil {
				stageErrs = append(stageErrs, "uplink: "+err.Error())
			}
		}
		if len(stageErrs) > 0 {
			t.Errorf("%s: the config check accepts it, but a stage refuses it at start:\n  %s", tc.yaml, strings.Join(stageErrs, "\n  "))
		}
	}
	if refused == 0 || refused == len(cases) {
		t.Fatalf("%d of %d cases refused by the check: the cases no longer probe both sides", refused, len(cases))
	}
}

// processing.heap_pacing reaches the window stage, which skips its own
// collections around large checkpoints when the heap is paced.
func TestHeapPacingReachesTheWindowStage(t *testing.T) {
	for _, on := range []bool{true, false} {
		cfg := config.Default()
		cfg.Processing.HeapPacing = on
		wc, err := WindowConfig(cfg, "", slog.New(slog.DiscardHandler), time.Now)
		if err != nil {
			t.Fatal(err)
		}
		if wc.HeapPaced != on {
			t.Errorf("heap_pacing %v: window.Config.HeapPaced %v", on, wc.HeapPaced)
		}
	}
}
