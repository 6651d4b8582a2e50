package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeagent/edgeagent/testrig/certtest"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
)

// A status endpoint with status.tls serves HTTPS only: the gateway's own
// CLI reads it through the config (the certificate pinned), a laptop with
// --addr https://… and --ca, and `config check` refuses a pair that does
// not load, with its line.
func TestStatusOverTLS(t *testing.T) {
	dir := t.TempDir()
	crt, key := filepath.Join(dir, "status.crt"), filepath.Join(dir, "status.key")
	certtest.WriteSelfSigned(t, crt, key, "127.0.0.1")
	mqttAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	statusAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	cfgPath := writeConfig(t, dir, embeddedAgentConfig("tls-gw", dir, mqttAddr)+fmt.Sprintf(`
status:
  listen: "%s"
  token: s3cret
  tls: {cert_file: %s, key_file: %s}
`, statusAddr, crt, key))
	if out, err := exec.Command(agentBin, "config", "check", "-c", cfgPath).CombinedOutput(); err != nil {
		t.Fatalf("config check: %v\n%s", err, out)
	}
	p := startAgent(t, "run", "-c", cfgPath)
	p.waitLog(t, "status endpoint listening")

	out, err := exec.Command(agentBin, "status", "-c", cfgPath).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "tls-gw") {
		t.Errorf("status -c over TLS: %v\n%s", err, out)
	}
	if out, err := exec.Command(agentBin, "inspect", "bronze", "-c", cfgPath, "--json").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "[") {
		t.Errorf("inspect through the TLS endpoint: %v\n%s", err, out)
	}
	remote := exec.Command(agentBin, "status", "--addr", "https://"+statusAddr, "--ca", crt, "--json")
	remote.Env = append(os.Environ(), "EDGEAGENT_STATUS_TOKEN=s3cret")
	if out, err := remote.CombinedOutput(); err != nil || !strings.Contains(string(out), `"gateway": "tls-gw"`) {
		t.Errorf("status --addr https:// --ca: %v\n%s", err, out)
	}
	// Without --ca the system roots do not know the certificate; over
	// plain HTTP the endpoint answers nothing but a refusal.
	for _, args := range [][]string{{"--addr", "https://" + statusAddr}, {"--addr", statusAddr}} {
		c := exec.Command(agentBin, append([]string{"status"}, args...)...)
		c.Env = append(os.Environ(), "EDGEAGENT_STATUS_TOKEN=s3cret")
		if out, err := c.CombinedOutput(); exitCode(err) != exitFail || strings.Contains(string(out), "tls-gw") {
			t.Errorf("status %v must fail: %v\n%s", args, err, out)
		}
	}
	if out, err := exec.Command(agentBin, "status", "--addr", statusAddr, "--ca", crt).CombinedOutput(); exitCode(err) != exitUsage {
		t.Errorf("--ca without https:// must be a usage error: %v\n%s", err, out)
	}
	// -c with --addr: the config's token.
	if out, err := exec.Command(agentBin, "status", "-c", cfgPath, "--addr", "https://"+statusAddr, "--ca", crt, "--json").CombinedOutput(); err != nil || !strings.Contains(string(out), `"gateway": "tls-gw"`) {
		t.Errorf("status -c with --addr: %v\n%s", err, out)
	}
	// A token for a remote address without a scheme is refused before any
	// connection (.invalid never resolves): it would go in clear text.
	c := exec.Command(agentBin, "status", "--addr", "gw-12.invalid:9464")
	c.Env = append(os.Environ(), "EDGEAGENT_STATUS_TOKEN=s3cret")
	if out, err := c.CombinedOutput(); exitCode(err) != exitUsage || !strings.Contains(string(out), "use https://gw-12.invalid:9464") {
		t.Errorf("a token to a remote plain address: %v\n%s", err, out)
	}
	// The scheme in any case, the default port when none is given.
	c = exec.Command(agentBin, "status", "--addr", "HTTPS://"+statusAddr, "--ca", crt, "--json")
	c.Env = append(os.Environ(), "EDGEAGENT_STATUS_TOKEN=s3cret")
	if out, err := c.CombinedOutput(); err != nil || !strings.Contains(string(out), `"gateway": "tls-gw"`) {
		t.Errorf("status --addr HTTPS://: %v\n%s", err, out)
	}
	p.stop(t)

	// A certificate renewed into a pair that does not load is caught by
	// config check, with the key's line.
	certtest.WriteSelfSigned(t, crt, filepath.Join(dir, "other.key"), "127.0.0.1")
	out, err = exec.Command(agentBin, "config", "check", "-c", cfgPath).CombinedOutput()
	if exitCode(err) != exitConfig || !strings.Contains(string(out), "status.tls.cert_file: "+crt+" with "+key) {
		t.Errorf("config check with a mismatched pair: %v\n%s", err, out)
	}
}
