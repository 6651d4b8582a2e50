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
	if out, err := exec.Command(agentBin, "status", "-c", cfgPath).CombinedOutput(); err != nil || !strings.Contains(string(out), "0 firing of 1 rule; 1 fired, 1 cleared") {
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

// Thirty devices cross a threshold together, each window closing on its
// own device's reading (emitted at different instants): the gateway's
// broker gets at most storm_threshold individual alerts and two summaries,
// never thirty pages. The summaries' counts add up to the thirty
// transitions: the first counts the storm up to it, the part held until
// the storm's window ended counts the rest.
func TestAlertStormIsSummarizedLocally(t *testing.T) {
	dir := t.TempDir()
	mqttAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	statusAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	cfgPath := writeConfig(t, dir, embeddedAgentConfig("storm-gw", dir, mqttAddr)+fmt.Sprintf(`
status: {listen: "%s"}
window: {size: 1m, watermark_delay: 0s, allowed_lateness: 0s, idle_timeout: 1h}
processing: {trigger_interval: 100ms}
alerts:
  - {name: overheating, metric: temperature, devices: "press-*", when: "mean > 80", for: 1, actions: [local]}
local_publish: {alerts_topic: "edgeagent/{gateway_id}/alerts/{device}", storm_threshold: 20, storm_window: 2s}
`, statusAddr))
	p := startAgent(t, "run", "-c", cfgPath)
	p.waitLog(t, "status endpoint listening")

	type message struct {
		Type, Key   string
		Transitions int
	}
	var mu sync.Mutex
	var got []message
	sub := mqtttest.NewPublisher(t, "tcp://"+mqttAddr, "hmi")
	sub.Client.Subscribe("edgeagent/storm-gw/alerts/#", 1, func(_ paho.Client, m paho.Message) {
		var a message
		if err := json.Unmarshal(m.Payload(), &a); err != nil {
			t.Errorf("alert is not JSON: %v: %s", err, m.Payload())
		}
		mu.Lock()
		got = append(got, a)
		mu.Unlock()
	}).Wait()
	// individual alerts, the summaries' transitions (a summary rewritten
	// before it went out counts once, with its latest figure), and the
	// messages by key.
	counted := func() (individual, summarized, keys int) {
		mu.Lock()
		defer mu.Unlock()
		latest := map[string]int{}
		for _, m := range got {
			if m.Type == "summary" {
				latest[m.Key] = max(latest[m.Key], m.Transitions)
			} else {
				individual++
			}
		}
		for _, n := range latest {
			summarized += n
		}
		return individual, summarized, individual + len(latest)
	}

	base := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC).UnixMilli()
	reading := func(device string, minute int, v float64) []byte {
		return fmt.Appendf(nil, `{"id":"%s-%d","ts":%d,"temperature":%g}`, device, minute, base+int64(minute)*60_000, v)
	}
	pub := mqtttest.NewPublisher(t, "tcp://"+mqttAddr, "line")
	for i := range 30 {
		pub.Publish(t, fmt.Sprintf("sensors/press-%02d/telemetry", i), 1, reading(fmt.Sprintf("press-%02d", i), 0, 90))
	}
	for i := range 30 { // each closes its device's minute 0, which fires
		pub.Publish(t, fmt.Sprintf("sensors/press-%02d/telemetry", i), 1, reading(fmt.Sprintf("press-%02d", i), 1, 90))
	}
	mqtttest.WaitFor(t, 30*time.Second, "30 transitions fired", func() bool {
		return strings.Contains(httpGet(t, "http://"+statusAddr+"/status.json", 200), `"fired_total": 30,`)
	})
	// A part held after the first summary went out is queued by the first
	// window emitted after the storm's 2 s: another device's windows close,
	// one a half second.
	minute, last := 0, time.Time{}
	mqtttest.WaitFor(t, 30*time.Second, "summaries counting all 30 transitions", func() bool {
		if _, summarized, _ := counted(); summarized == 30 {
			return true
		}
		if time.Since(last) > 500*time.Millisecond {
			minute, last = minute+1, time.Now()
			pub.Publish(t, "sensors/boiler-1/telemetry", 1, reading("boiler-1", minute, 20))
		}
		return false
	})
	p.stop(t)
	if individual, _, keys := counted(); individual > 20 || keys > 22 {
		t.Fatalf("%d individual alerts, %d messages by key; want at most 20 and 22 (the threshold and two summaries): %+v", individual, keys, got)
	}
}
