package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestUsageAndScenarios(t *testing.T) {
	cases := []struct {
		args []string
		code int
		out  string // expected in stdout or stderr
	}{
		{nil, exitUsage, "Usage:"},
		{[]string{"help"}, exitOK, "edgerig run"},
		{[]string{"fly"}, exitUsage, `unknown command "fly"`},
		{[]string{"scenarios"}, exitOK, "chaos"},
		{[]string{"run"}, exitUsage, "want one SCENARIO"},
		{[]string{"run", "no-such"}, exitUsage, "neither a stock scenario"},
		{[]string{"run", "--bogus", "steady"}, exitUsage, "flag provided but not defined"},
		{[]string{"run", "--broker", "foo", "steady"}, exitUsage, "want mochi or mosquitto"},
		{[]string{"run", "--disk-full", "fill", "steady"}, exitUsage, `--disk-full "fill": want auto or write-errors`},
		{[]string{"run", "--uplink", "amqp", "steady"}, exitUsage, "want nats or mqtt"},
		{[]string{"run", "../../scenario/testdata/invalid/agent-overlap.yaml"}, exitUsage, "agent-overlap.yaml:11: faults[1]: agent_restart at 3s overlaps"},
		{[]string{"run", "../../scenario/testdata/invalid/durations.yaml"}, exitUsage, "durations.yaml:10: devices[0].interval: \"15ss\" is not a duration"},
		{[]string{"run", "--uplink", "mqtt", "--nats", "nats://127.0.0.1:1", "steady"}, exitUsage, "the uplink is MQTT"},
		{[]string{"run", "--uplink-broker", "tcp://127.0.0.1:1", "steady"}, exitUsage, "needs the MQTT uplink"},
		{[]string{"run", "--help"}, exitOK, "Usage: edgerig run"},
		{[]string{"demo", "-h"}, exitOK, "Usage: edgerig demo"},
		{[]string{"load", "--help"}, exitOK, "Usage: edgerig load"},
		{[]string{"run", "--agent", "/nonexistent/edgeagent", "--quiet", "steady"}, exitError, "agent binary not found"},
		{[]string{"demo", "extra"}, exitUsage, "unexpected argument"},
		{[]string{"load", "--embedded", "--mqtt", "tcp://127.0.0.1:1"}, exitUsage, "exclude each other"},
		// Bad flag values are usage errors naming the flag, found before
		// anything starts (the agent path does not even exist here).
		{[]string{"demo", "--agent", "/nonexistent", "--duration", "-5s"}, exitUsage, "--duration -5s: want 0"},
		{[]string{"demo", "--agent", "/nonexistent", "--devices", "-3"}, exitUsage, "--devices -3: want at least 3"},
		{[]string{"run", "--agent", "/nonexistent", "--nats", "localhost", "steady"}, exitUsage, `--nats "localhost": want nats://host:port`},
		{[]string{"run", "--agent", "/nonexistent", "--mqtt", "127.0.0.1:59173", "steady"}, exitUsage, `--mqtt "127.0.0.1:59173": want tcp|`},
		{[]string{"run", "--agent", "/nonexistent", "--mqtt", "tcp://127.0.0.1", "steady"}, exitUsage, "host:port"},
		{[]string{"load", "--agent", "/nonexistent", "--devices", "0"}, exitUsage, "--devices 0"},
		{[]string{"load", "--agent", "/nonexistent", "--duration", "0s", "--connections", "0"}, exitUsage, "--connections 0"},
		{[]string{"load", "--agent", "/nonexistent", "--mqtt", "localhost:1883"}, exitUsage, "--mqtt"},
		{[]string{"load", "--agent", "/nonexistent", "--max-rate", "0"}, exitUsage, "--max-rate 0"},
		{[]string{"run", "--agent", "/nonexistent", "--uplink", "mqtt", "--uplink-broker", "localhost:1883", "steady"}, exitUsage, `--uplink-broker "localhost:1883": want tcp|mqtt://host:port`},
		// A --json FILE that cannot be written is said before the run.
		{[]string{"run", "--agent", "/nonexistent", "--json", "/nonexistent/dir/report.json", "steady"}, exitUsage, "--json: open /nonexistent/dir/report.json: no such file or directory"},
		{[]string{"demo", "--agent", "/nonexistent", "--json", "/nonexistent/dir/report.json"}, exitUsage, "--json: open"},
		{[]string{"load", "--agent", "/nonexistent", "--json", "/nonexistent/dir/report.json"}, exitUsage, "--json: open"},
		{[]string{"demo", "--agent", "/nonexistent", "--uplink", "amqp"}, exitUsage, "want nats or mqtt"},
		{[]string{"load", "--agent", "/nonexistent", "--uplink", "amqp"}, exitUsage, "want nats or mqtt"},
		{[]string{"replay", "--help"}, exitOK, "Usage: edgerig replay"},
		{[]string{"replay", "--agent", "/nonexistent"}, exitUsage, "--dir: required"},
		{[]string{"replay", "--dir", "/nonexistent"}, exitUsage, "--agent: at least one"},
		{[]string{"replay", "--dir", "/nonexistent", "--agent", "/nonexistent", "--rounds", "0"}, exitUsage, "--rounds 0"},
		{[]string{"replay", "--dir", "/nonexistent", "--agent", "/nonexistent"}, exitError, "edgerig load --dir"},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			code := Main(context.Background(), nil, c.args, &out, &errb)
			if code != c.code {
				t.Fatalf("exit %d, want %d; stderr: %s", code, c.code, errb.String())
			}
			if all := out.String() + errb.String(); !strings.Contains(all, c.out) {
				t.Fatalf("output lacks %q:\n%s", c.out, all)
			}
		})
	}
}

// Flags may follow the scenario name, as in edgerig run steady --short.
func TestParseInterleaved(t *testing.T) {
	fs := flags("run", synRun)
	short := fs.Bool("short", false, "")
	pos, err := parse(fs, []string{"steady", "--short"})
	if err != nil || len(pos) != 1 || pos[0] != "steady" || !*short {
		t.Fatalf("pos %v short %v err %v", pos, *short, err)
	}
}

// Every flag a subcommand defines is in its synopsis, and so in the
// top-level usage; --help goes to stdout, where a pager can read it.
func TestUsageListsEveryFlag(t *testing.T) {
	for cmd, syn := range map[string]string{"run": synRun, "demo": synDemo, "load": synLoad, "replay": synReplay} {
		var out, errb bytes.Buffer
		if code := Main(context.Background(), nil, []string{cmd, "--help"}, &out, &errb); code != exitOK {
			t.Fatalf("%s --help: exit %d, want %d", cmd, code, exitOK)
		}
		if errb.Len() != 0 {
			t.Errorf("%s --help wrote to stderr: %s", cmd, errb.String())
		}
		if !strings.Contains(usage, syn) {
			t.Errorf("the top-level usage lacks %q", syn)
		}
		n := 0
		for _, line := range strings.Split(out.String(), "\n") {
			// PrintDefaults starts each flag's line with "  -name".
			if !strings.HasPrefix(line, "  -") {
				continue
			}
			name := strings.Fields(line)[0][1:]
			n++
			if !strings.Contains(syn, "--"+name+" ") && !strings.Contains(syn, "--"+name+"]") {
				t.Errorf("%s: flag --%s is missing from the synopsis %q", cmd, name, syn)
			}
		}
		if n == 0 {
			t.Errorf("%s --help listed no flags:\n%s", cmd, out.String())
		}
	}
}

// The first Ctrl-C stops (the summary follows), the second aborts, a third
// exits at once.
func TestInterrupts(t *testing.T) {
	sigs := make(chan os.Signal, 1)
	stop := make(chan struct{})
	aborted, exited, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	defer close(done)
	var errb bytes.Buffer // read only after exit, which follows every write
	go interrupts(sigs, stop, func() { close(aborted) }, done, &errb, func() { close(exited) })
	within := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s", what)
		}
	}
	sigs <- syscall.SIGINT
	within(stop, "stop after the first Ctrl-C")
	select {
	case <-aborted:
		t.Fatal("the first Ctrl-C aborted")
	default:
	}
	sigs <- syscall.SIGINT
	within(aborted, "abort after the second Ctrl-C")
	sigs <- syscall.SIGINT
	within(exited, "exit after the third Ctrl-C")
	if !strings.Contains(errb.String(), "Ctrl-C again aborts") {
		t.Errorf("the first Ctrl-C does not say what a second does:\n%s", errb.String())
	}
}
