package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/testrig/mqtttest"
)

// status and inspect read this config's agent, never another one that
// happens to answer on its status.listen (another gateway's config on a
// shared host, a test copy): they check the data_dir the answer names.
func TestCommandsReadOnlyThisConfigsAgent(t *testing.T) {
	dirA, dirB := t.TempDir(), t.TempDir()
	mqttAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	statusAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	statusSection := fmt.Sprintf("\nstatus: {listen: %q}\n", statusAddr)
	cfgA := writeConfig(t, dirA, embeddedAgentConfig("gw-a", dirA, mqttAddr)+statusSection)
	p := startAgent(t, "run", "-c", cfgA)
	p.waitLog(t, "status endpoint listening")
	pub := mqtttest.NewPublisher(t, "tcp://"+mqttAddr, "identity-devices")
	for i := range 3 {
		pub.Publish(t, "sensors/a-dev/telemetry", 1, fmt.Appendf(nil, `{"id":"a-%d","ts":%d,"temperature":1}`, i, time.Now().UnixMilli()))
	}
	run := func(args ...string) (code int, stdout, stderr string) {
		var out, errb bytes.Buffer
		code = Run(context.Background(), args, &out, &errb)
		return code, out.String(), errb.String()
	}
	mqtttest.WaitFor(t, 30*time.Second, "3 Bronze rows through gw-a's endpoint", func() bool {
		code, out, _ := run("inspect", "bronze", "-c", cfgA)
		return code == exitOK && strings.Count(out, `"device":"a-dev"`) == 3
	})

	// gw-b's config names the same status.listen, and data of its own
	// (none yet). Its inspect reads its own files, and says why.
	cfgB := writeConfig(t, dirB, embeddedAgentConfig("gw-b", dirB, mqttAddr)+statusSection)
	dataA, dataB := filepath.Join(dirA, "data"), filepath.Join(dirB, "data")
	code, out, errOut := run("inspect", "bronze", "-c", cfgB)
	if code != exitFail || out != "" ||
		!strings.Contains(errOut, "keeps its data in "+dataA+` (gateway_id "gw-a"), this config in `+dataB) ||
		!strings.Contains(errOut, "reading "+dataB+"'s files instead") ||
		!strings.Contains(errOut, "Nothing is stored in "+dataB+" yet") {
		t.Errorf("inspect bronze with gw-b's config: exit %d, stdout %q, stderr %q; want exit %d, nothing from gw-a, and gw-b's empty data_dir", code, out, errOut, exitFail)
	}
	code, out, errOut = run("status", "-c", cfgB)
	if code != exitFail || out != "" || !strings.Contains(errOut, "is not this config's") || !strings.Contains(errOut, "Give each agent its own status.listen") {
		t.Errorf("status with gw-b's config: exit %d, stdout %q, stderr %q; want exit %d naming the other agent", code, out, errOut, exitFail)
	}
	// --addr reads whichever agent answers, as it always did.
	if code, out, errOut := run("status", "-c", cfgB, "--addr", statusAddr, "--json"); code != exitOK || !strings.Contains(out, `"gateway": "gw-a"`) {
		t.Errorf("status --addr: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	// gw-a's data_dir through a link is gw-a's agent.
	link := filepath.Join(t.TempDir(), "a")
	if err := os.Symlink(dirA, link); err != nil {
		t.Fatal(err)
	}
	cfgLink := writeConfig(t, t.TempDir(), embeddedAgentConfig("gw-a", link, mqttAddr)+statusSection)
	if code, out, errOut := run("inspect", "bronze", "-c", cfgLink); code != exitOK || strings.Count(out, `"device":"a-dev"`) != 3 || strings.Contains(errOut, "note:") {
		t.Errorf("inspect bronze with gw-a's data_dir through a link: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	// gw-a's config with gateway_id edited and not reloaded: the same
	// agent's figures, with a note that the new name is not in force.
	renamed := writeConfig(t, t.TempDir(), embeddedAgentConfig("gw-renamed", dirA, mqttAddr)+statusSection)
	note := `the running agent's gateway_id is "gw-a", ` + renamed + ` says "gw-renamed": reload it`
	if code, out, errOut := run("status", "-c", renamed); code != exitOK || !strings.Contains(out, "gw-a") || !strings.Contains(errOut, note) {
		t.Errorf("status with gateway_id edited: exit %d, stdout %q, stderr %q; want gw-a's status and %q", code, out, errOut, note)
	}
	if code, out, errOut := run("inspect", "bronze", "-c", renamed); code != exitOK || strings.Count(out, `"device":"a-dev"`) != 3 || !strings.Contains(errOut, note) {
		t.Errorf("inspect bronze with gateway_id edited: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
