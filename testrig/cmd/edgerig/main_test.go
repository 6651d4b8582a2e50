package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
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
		{[]string{"run", "--agent", "/nonexistent/edgeagent", "--quiet", "steady"}, exitError, "agent binary not found"},
		{[]string{"demo", "extra"}, exitUsage, "unexpected argument"},
		{[]string{"load", "--embedded", "--mqtt", "tcp://127.0.0.1:1"}, exitUsage, "exclude each other"},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			code := Main(context.Background(), c.args, &out, &errb)
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
	fs := flags("run", &bytes.Buffer{})
	short := fs.Bool("short", false, "")
	pos, err := parse(fs, []string{"steady", "--short"})
	if err != nil || len(pos) != 1 || pos[0] != "steady" || !*short {
		t.Fatalf("pos %v short %v err %v", pos, *short, err)
	}
}
