package main

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgeagent/edgeagent/testrig/mqtttest"
)

// With the uplink down, a device crossing its threshold still raises a local
// alert on the gateway's own broker, promptly after the window closes, and
// clears it with hysteresis; transitions arrive exactly once each.
func TestLocalAlertWithUplinkDown(t *testing.T) {
	dir := t.TempDir()
	mqttAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	deadNATS := fmt.Sprintf("nats://127.0.0.1:%d", mqtttest.FreePort(t)) // nothing listens: the link is down
	statusAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	cfgPath := writeConfig(t, dir, embeddedAgentConfig("alert-gw", dir, mqttAddr)+fmt.Sprintf(`
status: {listen: "%s"}
window: {size: 1m, watermark_delay: 0s, allowed_lateness: 0s, idle_timeout: 1h}
processing: {trigger_interval: 100ms}
uplink:
  nats: {url: "%s"}
alerts:
  - name: overheating
    metric: temperature
    devices: "press-*"
    when: "mean > 80"
    for: 2
    clear_when: "mean < 75"
    severity: high
    actions: [uplink, local]
    min_interval: 0s
local_publish:
  alerts_topic: edgeagent/{gateway_id}/alerts/{device}
`, statusAddr, deadNATS))
	p := startAgent(t, "run", "-c", cfgPath)
	p.waitLog(t, "embedded broker listening")

	type alertMsg struct {
		Rule, Device, State string
		Key                 string
	}
	var mu sync.Mutex
	var got []alertMsg
	var arrived []time.Time
	sub := mqtttest.NewPublisher(t, "tcp://"+mqttAddr, "hmi")
	tok := sub.Client.Subscribe("edgeagent/alert-gw/alerts/#", 1, func(_ paho.Client, m paho.Message) {
		var a alertMsg
		if err := json.Unmarshal(m.Payload(), &a); err != nil {
			t.Errorf("alert is not JSON: %v: %s", err, m.Payload())
		}
		mu.Lock()
		got = append(got, a)
		arrived = append(arrived, time.Now())
		mu.Unlock()
	})
	tok.Wait()

	// Window means by minute: 70, 85, 90 (fires after two), 78 (hysteresis:
	// stays firing), 70 (clears). A reading in minute 5 closes minute 4.
	means := []float64{70, 85, 90, 78, 70, 70}
	base := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC).UnixMilli()
	dev := mqtttest.NewPublisher(t, "tcp://"+mqttAddr, "press-1")
	var closedFiring time.Time
	for m, v := range means {
		if m == 3 {
			closedFiring = time.Now() // this reading closes minute 2, whose window fires
		}
		dev.Publish(t, "sensors/press-1/telemetry", 1, fmt.Appendf(nil, `{"id":"m%d","ts":%d,"temperature":%g}`, m, base+int64(m)*60_000, v))
	}
	mqtttest.WaitFor(t, 20*time.Second, "fired and cleared on the local topic", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= 2
	})
	// The alert figures an operator watches, on /metrics.
	want := []string{"edgeagent_alert_rules 1", "edgeagent_alerts_firing 0", `edgeagent_alerts_firing_by_rule{rule="overheating"} 0`,
		"edgeagent_alerts_fired_total 1", "edgeagent_alerts_cleared_total 1", "edgeagent_local_messages_published_total 2",
		"edgeagent_local_publish_failures_total 0", "edgeagent_late_rows_evicted_total 0", "edgeagent_devices_expired_total 0"}
	mqtttest.WaitFor(t, 10*time.Second, "alert figures on /metrics", func() bool {
		m := httpGet(t, "http://"+statusAddr+"/metrics", 200)
		for _, w := range want {
			if !strings.Contains(m, w+"\n") {
				return false
			}
		}
		return true
	})
	if out, err := exec.Command(agentBin, "status", "-c", cfgPath).CombinedOutput(); err != nil || !strings.Contains(string(out), "0 firing of 1 rules; 1 fired, 1 cleared") {
		t.Errorf("edgeagent status lacks the alerts row: %v\n%s", err, out)
	}
	p.stop(t)
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[0].State != "fired" || got[1].State != "cleared" || got[0].Device != "press-1" || got[0].Rule != "overheating" {
		t.Fatalf("local alerts %+v, want exactly fired then cleared for press-1", got)
	}
	if got[0].Key == got[1].Key || got[0].Key == "" {
		t.Errorf("alert keys must be distinct and set: %q %q", got[0].Key, got[1].Key)
	}
	// Within one trigger interval of the window closing, plus the commit and
	// publish; generous for a loaded CI machine, far below an uplink round trip.
	if d := arrived[0].Sub(closedFiring); d > 5*time.Second {
		t.Errorf("fired alert arrived %v after its window closed", d)
	}
}
