package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/cmd/edgeagent/status"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
	"github.com/edgeagent/edgeagent/testrig/natstest"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// The whole pipeline through the real binary: devices publish to the
// embedded broker, the agent windows the readings and sends them to an
// in-process JetStream; the test decodes the stream and checks every window,
// the status endpoint, the CLI views and a clean SIGTERM exit.
func TestPipelineEndToEnd(t *testing.T) {
	nats := natstest.Start(t)
	dir := t.TempDir()
	mqttAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	statusAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	cfgPath := writeConfig(t, dir, embeddedAgentConfig("e2e-gw", dir, mqttAddr)+fmt.Sprintf(`
status:
  listen: "%s"
window:
  size: 1m
  watermark_delay: 0s
  allowed_lateness: 0s
  idle_timeout: 1h
processing:
  trigger_interval: 100ms
uplink:
  nats: {url: "%s", subject: "edge.{gateway_id}.aggregates", stream: EDGE, create_stream: true}
  max_batch_records: 7
`, statusAddr, nats.URL()))
	p := startAgent(t, "run", "-c", cfgPath)
	p.waitLog(t, "status endpoint listening")

	// 3 devices × 4 one-minute windows × 6 readings, temperature = minute*10 + i.
	// One more reading per device in minute 5 moves the watermark past
	// minute 4's end, so minutes 0-3 are final and emitted.
	base := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC).UnixMilli()
	pub := mqtttest.NewPublisher(t, "tcp://"+mqttAddr, "e2e-devices")
	type key struct {
		dev   string
		start int64
	}
	want := map[key][2]float64{} // count, sum
	for d := 0; d < 3; d++ {
		dev := fmt.Sprintf("press-%d", d)
		for m := 0; m < 4; m++ {
			for i := 0; i < 6; i++ {
				ts := base + int64(m)*60_000 + int64(i)*10_000
				v := float64(m*10 + i)
				pub.Publish(t, "sensors/"+dev+"/telemetry", 1, fmt.Appendf(nil, `{"id":"%s-%d-%d","ts":%d,"temperature":%g}`, dev, m, i, ts, v))
				k := key{dev, base + int64(m)*60_000}
				want[k] = [2]float64{want[k][0] + 1, want[k][1] + v}
			}
		}
		pub.Publish(t, "sensors/"+dev+"/telemetry", 1, fmt.Appendf(nil, `{"id":"%s-late","ts":%d,"temperature":1}`, dev, base+5*60_000))
	}
	// A duplicate (same id, inside the watermark horizon), a reading for a
	// final window (late: lateness is 0), and a malformed message.
	pub.Publish(t, "sensors/press-0/telemetry", 1, fmt.Appendf(nil, `{"id":"press-0-late","ts":%d,"temperature":1}`, base+5*60_000))
	pub.Publish(t, "sensors/press-0/telemetry", 1, fmt.Appendf(nil, `{"id":"press-0-new","ts":%d,"temperature":0}`, base))
	pub.Publish(t, "sensors/press-0/telemetry", 1, []byte(`{"id":"bad","ts":"yesterday","temperature":1}`))

	got := map[key]wire.Aggregate{}
	mqtttest.WaitFor(t, 30*time.Second, "12 windows in the stream", func() bool {
		for _, m := range natstest.StreamMessages(t, nats.URL(), "EDGE") {
			b, err := wire.DecodeBatch(m.Data, m.Header.Get("Content-Encoding"))
			if err != nil {
				t.Fatalf("decode batch %s: %v", m.Header.Get("Nats-Msg-Id"), err)
			}
			if m.Header.Get("Nats-Msg-Id") != b.Batch || m.Header.Get("Content-Type") != wire.ContentType {
				t.Fatalf("headers %v do not match batch %q", m.Header, b.Batch)
			}
			for _, a := range b.Aggregates {
				if a.Metric == "temperature" && (got[key{a.Device, a.Start}].Rev <= a.Rev) {
					got[key{a.Device, a.Start}] = a
				}
			}
		}
		return len(got) >= len(want)
	})
	for k, w := range want {
		a, ok := got[k]
		if !ok {
			t.Errorf("window %v missing", k)
			continue
		}
		if float64(a.Count) != w[0] || a.Sum == nil || *a.Sum != w[1] || a.End-a.Start != 60_000 {
			t.Errorf("window %v: count %d sum %v end-start %d, want %v", k, a.Count, a.Sum, a.End-a.Start, w)
		}
		if a.Key != wire.AggregateKey("e2e-gw", k.dev, "temperature", k.start, a.Rev) {
			t.Errorf("window %v: key %q", k, a.Key)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d windows arrived, want %d (windows after the watermark must not be emitted yet)", len(got), len(want))
	}

	// The status endpoint reflects what happened.
	var snap status.Snapshot
	mqtttest.WaitFor(t, 30*time.Second, "every record processed", func() bool {
		var err error
		snap, err = status.NewClient(statusAddr, "", nil).Snapshot(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return snap.Window.ProcessedTotal >= 78 && snap.Bronze.BacklogRecords == 0
	})
	if snap.Gateway != "e2e-gw" || !snap.Ingest.Connected || snap.Uplink.State != "up" ||
		snap.Window.DuplicatesTotal != 1 || snap.Window.LateTotal != 1 || snap.Window.DeadLettersTotal != 1 || snap.Ingest.CommittedTotal < 78 {
		t.Errorf("status.json does not reflect the run: %+v", snap)
	}
	metrics := httpGet(t, "http://"+statusAddr+"/metrics", 200)
	for _, m := range []string{"edgeagent_ingest_messages_received_total 78", "edgeagent_late_readings_total 1", "edgeagent_duplicate_readings_total 1", "edgeagent_uplink_up 1", "# TYPE edgeagent_dead_letters_total counter",
		// Every reason's series exists before its first count.
		`edgeagent_dead_letters_total{reason="not_cbor"} 0`, `edgeagent_ingest_rejected_total{reason="payload_too_large"} 0`} {
		if !strings.Contains(metrics, m) {
			t.Errorf("/metrics lacks %q", m)
		}
	}
	httpGet(t, "http://"+statusAddr+"/readyz", 200)
	page := httpGet(t, "http://"+statusAddr+"/", 200)
	if !strings.Contains(page, "e2e-gw") || strings.Contains(page, "http://") && strings.Contains(page, "<script src") {
		t.Errorf("status page wrong or loads external assets")
	}

	// CLI views go through the running agent.
	out, err := exec.Command(agentBin, "status", "-c", cfgPath).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "end-to-end lag") || !strings.Contains(string(out), "nats up") || !strings.Contains(string(out), "on disk only") {
		t.Errorf("edgeagent status: %v\n%s", err, out)
	}
	// Every table in one JSON style: snake_case names, RFC 3339 times.
	out, err = exec.Command(agentBin, "inspect", "deadletter", "-c", cfgPath, "--json").Output()
	var dls []map[string]any
	if err != nil || json.Unmarshal(out, &dls) != nil || len(dls) != 1 || !strings.Contains(fmt.Sprint(dls[0]["reason"]), "ts") ||
		dls[0]["code"] == nil || !isRFC3339(dls[0]["received_at"]) {
		t.Errorf("inspect deadletter while running: %v %s", err, out)
	}
	out, err = exec.Command(agentBin, "inspect", "late", "-c", cfgPath, "--json").Output()
	var lates []map[string]any
	if err != nil || json.Unmarshal(out, &lates) != nil || len(lates) != 1 || lates[0]["device"] == nil || lates[0]["metric"] == nil ||
		!isRFC3339(lates[0]["event_time"]) || !isRFC3339(lates[0]["window_start"]) || !isRFC3339(lates[0]["watermark"]) {
		t.Errorf("inspect late while running: %v %s", err, out)
	}
	if out, err := exec.Command(agentBin, "inspect", "late", "-c", cfgPath, "--reason", "not_json").CombinedOutput(); exitCode(err) != exitUsage {
		t.Errorf("inspect late --reason: a filter the table does not apply must be refused: %v %s", err, out)
	}

	p.stop(t)

	// Stopped: inspect reads the files.
	out, err = exec.Command(agentBin, "inspect", "bronze", "-c", cfgPath, "--device", "press-1", "--limit", "3").Output()
	if err != nil || bytes.Count(out, []byte("\n")) != 3 || !strings.Contains(string(out), `"device":"press-1"`) {
		t.Errorf("inspect bronze while stopped: %v\n%s", err, out)
	}
	out, err = exec.Command(agentBin, "status", "-c", cfgPath).CombinedOutput()
	if exitCode(err) != exitFail || !strings.Contains(string(out), "not running") {
		t.Errorf("status with the agent stopped: %v\n%s", err, out)
	}
}

func isRFC3339(v any) bool {
	s, ok := v.(string)
	if !ok {
		return false
	}
	_, err := time.Parse(time.RFC3339Nano, s)
	return err == nil
}

func httpGet(t *testing.T, url string, wantCode int) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != wantCode {
		t.Fatalf("GET %s: %d, want %d: %s", url, resp.StatusCode, wantCode, body)
	}
	return string(body)
}
