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

	"github.com/edgeagent/edgeagent/cmd/edgeagent/agent"
	"github.com/edgeagent/edgeagent/ingest"
	"github.com/edgeagent/edgeagent/uplink"
	"github.com/edgeagent/edgeagent/window"
)

// Help goes to stdout with exit 0, flags included, however it is asked
// for; after a flag error the usage goes to stderr with the error, exit 2.
func TestHelpAndFlagErrors(t *testing.T) {
	for _, args := range [][]string{{"help", "status"}, {"status", "--help"}} {
		var out, errb bytes.Buffer
		if code := Run(context.Background(), args, &out, &errb); code != exitOK || !strings.Contains(out.String(), "Flags:") ||
			!strings.Contains(out.String(), "-addr") || errb.Len() != 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out.String(), errb.String())
		}
	}
	var out, errb bytes.Buffer
	if code := Run(context.Background(), []string{"inspect", "late", "--bogus"}, &out, &errb); code != exitUsage || out.Len() != 0 ||
		!strings.Contains(errb.String(), "flag provided but not defined: -bogus") || !strings.Contains(errb.String(), "Usage: edgeagent inspect late") {
		t.Errorf("a flag error: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}

// A typo in a table name or a reason code is said, exit 2; neither may
// look like an empty table (found by an audit).
func TestInspectTyposAreRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"inspect", "foo"}, `unknown command "inspect foo"`},
		{[]string{"inspect", "deadletter", "--reason", "time-past", "-c", "/nonexistent.yaml"}, `--reason "time-past" is not a dead-letter code (want one of unknown_topic,`},
		// A filter another table takes says which (found by a walkthrough).
		{[]string{"inspect", "late", "--seq", "3"}, "inspect late: --seq applies to bronze and outbox only"},
		{[]string{"inspect", "outbox", "-reason=time_past"}, "inspect outbox: --reason applies to deadletter only"},
	} {
		var out, errb bytes.Buffer
		if code := Run(context.Background(), tc.args, &out, &errb); code != exitUsage || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tc.args, code, errb.String(), exitUsage, tc.want)
		}
	}
	if err := agent.CheckReason("time_past"); err != nil {
		t.Errorf("a real code refused: %v", err)
	}
}

// The maintenance commands on a data_dir the agent never ran in, or with
// empty files, say so and what to check (an audit: a bare "no such file",
// and "bad file descriptor" for an empty file).
func TestMaintenanceWithoutData(t *testing.T) {
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	cfg := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "gateway_id: gw\ndata_dir: %s\nmqtt:\n  broker: tcp://127.0.0.1:1\n  subscriptions: [{topic: \"s/{device}/t\"}]\nstatus: {listen: \"\"}\n", dataDir), 0o600); err != nil {
		t.Fatal(err)
	}
	cmds := [][]string{{"inspect", "bronze", "-c", cfg}, {"inspect", "late", "-c", cfg}, {"reset-state", "-c", cfg},
		{"replay", "-c", cfg, "--from", "2026-11-01", "--to", "2026-11-02"}}
	check := func(want string) {
		t.Helper()
		for _, args := range cmds {
			var out, errb bytes.Buffer
			if code := Run(context.Background(), args, &out, &errb); code != exitFail || !strings.Contains(errb.String(), want) {
				t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", args, code, errb.String(), exitFail, want)
			}
		}
	}
	check("Nothing is stored in " + dataDir + " yet: check data_dir in the config, or start the agent once.")
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"bronze.db", "state.db"} {
		if err := os.WriteFile(filepath.Join(dataDir, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmds = cmds[:2] // reset-state and replay open the files writable, and initialise them
	check("is empty: nothing is stored in it yet")
}

// A stage that refuses its settings at start is an invalid config (exit
// 3, which systemd does not restart), not a failure a restart may cure.
func TestStageConfigErrorsAreConfigErrors(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("open uplink: %w", fmt.Errorf("%w: uplink.nats.url: scheme", uplink.ErrConfig)),
		fmt.Errorf("%w: window.size", window.ErrInvalidConfig),
		fmt.Errorf("%w: no subscriptions", ingest.ErrConfig),
	} {
		if !invalidConfig(err) {
			t.Errorf("%v: not taken for an invalid config", err)
		}
	}
	if invalidConfig(fmt.Errorf("open state: %w", os.ErrPermission)) {
		t.Error("a permission error taken for an invalid config")
	}
}

// JSON logs write durations as the text format does ("1.5s"), not as
// integer nanoseconds.
func TestJSONLogDurations(t *testing.T) {
	var b bytes.Buffer
	newLogger(&b, "json", "info").Info("uplink: link down; reconnecting", "in", 1500*time.Millisecond)
	if !strings.Contains(b.String(), `"in":"1.5s"`) {
		t.Errorf("JSON log line %s, want \"in\":\"1.5s\"", b.String())
	}
}
