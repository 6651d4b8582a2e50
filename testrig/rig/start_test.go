package rig

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/config"
	"github.com/edgeagent/edgeagent/testrig/agentproc"
	"github.com/edgeagent/edgeagent/testrig/servers"
)

// fakeAgentEnv makes this test binary, started as the agent ("run -c
// FILE"), bind the status address its config names, as the agent does
// first, and then say it is connected (or exit as the agent does when the
// port is taken).
const fakeAgentEnv = "EDGERIG_TEST_FAKE_AGENT"

func TestMain(m *testing.M) {
	if os.Getenv(fakeAgentEnv) == "1" {
		os.Exit(fakeAgent(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func fakeAgent(args []string) int {
	if len(args) != 3 || args[0] != "run" || args[1] != "-c" {
		fmt.Fprintf(os.Stderr, "fake agent: want run -c FILE, got %q\n", args)
		return 2
	}
	cfg, err := config.Load(args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	l, err := net.Listen("tcp", cfg.Status.Listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "stopped with an error: status: listen on %s: %v\n", cfg.Status.Listen, err)
		return 1
	}
	defer l.Close()
	fmt.Fprintln(os.Stderr, "connected to broker")
	select {} // until the test kills it
}

// fakeEnv is an env whose agent is this test binary, its config written.
func fakeEnv(t *testing.T) *env {
	t.Setenv(fakeAgentEnv, "1")
	dir := t.TempDir()
	status, err := servers.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	e := &env{cfg: envConfig{dir: dir}, started: time.Now(), dataDir: filepath.Join(dir, "data"), statusAddr: status,
		configPath: filepath.Join(dir, "agent.yaml")}
	e.agentCfg = agentConfig{DataDir: e.dataDir, Broker: "tcp://127.0.0.1:1", StatusListen: status,
		NATS: "nats://127.0.0.1:1", Agent: demoScenario(36, 0).Agent}
	if err := e.writeAgentConfig(); err != nil {
		t.Fatal(err)
	}
	e.agent = agentproc.New(os.Args[0], e.configPath, filepath.Join(dir, "agent.log"))
	t.Cleanup(func() {
		if e.agent.Running() {
			if err := e.agent.Kill(); err != nil {
				t.Error(err)
			}
		}
	})
	return e
}

// A status port taken between the rig's choice and the agent's first
// start costs a start on fresh ports, not the run (CI saw one such bind
// fail).
func TestStartAgentOnFreshPortsWhenOneWasTaken(t *testing.T) {
	e := fakeEnv(t)
	taken := e.statusAddr
	l, err := net.Listen("tcp", taken)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := e.startAgent(context.Background(), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if !e.agent.Running() {
		t.Fatal("the agent is not running after startAgent")
	}
	if e.agent.Starts() != 2 {
		t.Fatalf("%d starts, want 2 (one failed on the taken port)", e.agent.Starts())
	}
	if e.statusAddr == taken {
		t.Fatalf("status address still %s, the taken port", taken)
	}
	cfg, err := config.Load(e.configPath)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Status.Listen != e.statusAddr {
		t.Fatalf("config says status %s, the rig %s", cfg.Status.Listen, e.statusAddr)
	}
}

// Other start failures are not retried.
func TestStartAgentDoesNotRetryOtherFailures(t *testing.T) {
	e := fakeEnv(t)
	e.agentCfg.StatusListen = "127.0.0.1:notaport" // the agent exits at its config
	if err := e.writeAgentConfig(); err != nil {
		t.Fatal(err)
	}
	if err := e.startAgent(context.Background(), 20*time.Second); err == nil {
		t.Fatal("startAgent succeeded with an agent that cannot start")
	}
	if e.agent.Starts() != 1 {
		t.Fatalf("%d starts, want 1", e.agent.Starts())
	}
}
