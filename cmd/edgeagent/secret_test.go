package main

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/testrig/mqtttest"
)

// Passwords written in broker URLs never leave the config: not on the
// status page, /status.json, /readyz, `edgeagent status`, nor in the logs,
// with both the device broker and the uplink unreachable, so that every
// error carrying a URL is shown.
func TestURLPasswordsAreNeverShown(t *testing.T) {
	dir := t.TempDir()
	statusAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	cfg := writeConfig(t, dir, fmt.Sprintf(`
gateway_id: secret-gw
data_dir: %s/data
mqtt:
  broker: "tcp://bob:mqttpw@127.0.0.1:%d"
  subscriptions:
    - topic: "sensors/{device}/telemetry"
status: {listen: "%s"}
uplink:
  nats: {url: "nats://alice:natspw@127.0.0.1:%d"}
  reconnect_max_interval: 1s
`, dir, mqtttest.FreePort(t), statusAddr, mqtttest.FreePort(t)))
	p := startAgent(t, "run", "-c", cfg)
	p.waitLog(t, "status endpoint listening")
	base := "http://" + statusAddr
	mqtttest.WaitFor(t, 30*time.Second, "the uplink's connect error in /status.json", func() bool {
		return strings.Contains(httpGet(t, base+"/status.json", 200), "connect to nats")
	})
	p.waitLog(t, "broker connect failed")
	shown := map[string]string{
		"/status.json": httpGet(t, base+"/status.json", 200),
		"/readyz":      httpGet(t, base+"/readyz", 503),
		"/":            httpGet(t, base+"/", 200),
	}
	out, err := exec.Command(agentBin, "status", "-c", cfg).CombinedOutput()
	if err != nil {
		t.Fatalf("edgeagent status: %v\n%s", err, out)
	}
	shown["edgeagent status"] = string(out)
	p.stop(t)
	shown["the logs"] = p.logs.String()
	for where, text := range shown {
		for _, pw := range []string{"mqttpw", "natspw"} {
			if strings.Contains(text, pw) {
				t.Errorf("%s shows the password %q:\n%s", where, pw, text)
			}
		}
	}
	// What is shown instead: the URLs with the password masked.
	for where, want := range map[string]string{
		"/status.json": "tcp://bob:***@127.0.0.1", "/readyz": "tcp://bob:***@127.0.0.1", "the logs": "nats://alice:***@127.0.0.1",
	} {
		if !strings.Contains(shown[where], want) {
			t.Errorf("%s does not show %q:\n%s", where, want, shown[where])
		}
	}
}
