package testrig_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/testrig/rig"
	"github.com/edgeagent/edgeagent/testrig/scenario"
	"github.com/edgeagent/edgeagent/testrig/servers"
)

// TestScenarios runs the short version of every stock scenario against the
// real agent binary, with real brokers, NATS and faults. Each must deliver
// every window with its final value: nothing missing, wrong or extra after
// the upsert, counters as the truth predicts, no unexpected agent exit.
//
// With -short only steady and chaos run (chaos holds every misbehaviour
// and fault); CI runs them all.
func TestScenarios(t *testing.T) {
	bin := agent(t)
	for _, name := range scenario.Names() {
		t.Run(name, func(t *testing.T) {
			if testing.Short() && name != "steady" && name != "chaos" {
				t.Skip("-short: steady and chaos only")
			}
			sc, err := scenario.Lookup(name)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			rep, err := rig.Run(ctx, rig.Options{Agent: bin, Scenario: sc, Short: true, Progress: logWriter{t}})
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			rep.WriteTable(&b)
			t.Log("\n" + b.String())
			w := rep.Result.Windows
			if w.Missing != 0 || w.Wrong != 0 || w.Extra != 0 || w.Expected == 0 || w.Correct != w.Expected {
				t.Fatalf("windows: %+v", w)
			}
			if !rep.OK() {
				t.Fatalf("verdict %s: %v", rep.Verdict, rep.Failures)
			}
		})
	}
}

// TestDemo runs make demo's code path for a few seconds: embedded broker,
// link outage, live view, summary.
func TestDemo(t *testing.T) {
	bin := agent(t)
	var out bytes.Buffer
	rep, err := rig.Demo(context.Background(), rig.DemoOptions{Agent: bin, Duration: 8 * time.Second, Devices: 12, Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	rep.WriteTable(&out)
	t.Log("\n" + out.String())
	if !rep.OK() || rep.Result.Windows.Correct == 0 {
		t.Fatalf("demo: %s %v", rep.Verdict, rep.Failures)
	}
	if !bytes.Contains(out.Bytes(), []byte("link cut")) {
		t.Fatal("the live view never showed the link outage")
	}
	if rep.RunDir != "" {
		t.Errorf("run_dir %q names the temporary directory a pass removed", rep.RunDir)
	}
}

// reuse is a small fleet for TestReuseDirAndStream: a few seconds, with
// the same gateway, keys and stream on every run.
const reuse = `
name: reuse
description: two runs in one directory against one NATS
seed: 7
duration: 3s
speed: 120
devices:
  - {prefix: th, count: 4, format: json, interval: 10s, metrics: [temperature]}
  - {prefix: nm, count: 1, format: number, interval: 20s, metrics: [level]}
agent:
  window: {size: 1m, watermark_delay: 10s, allowed_lateness: 10m, idle_timeout: 2s}
`

// TestReuseDirAndStream runs twice in one run directory against one
// external NATS: the second run must not resume the first one's agent
// data or see its aggregates, so both pass (they used to report every
// window wrong and the counters off the second time).
func TestReuseDirAndStream(t *testing.T) {
	bin := agent(t)
	sc, err := scenario.Parse("reuse", []byte(reuse))
	if err != nil {
		t.Fatal(err)
	}
	n, err := servers.StartNATS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	dir := t.TempDir()
	for run := 1; run <= 2; run++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		var progress bytes.Buffer
		rep, err := rig.Run(ctx, rig.Options{Agent: bin, Scenario: sc, Dir: dir, NATS: n.URL(), Progress: &progress})
		cancel()
		if err != nil {
			t.Fatalf("run %d: %v\n%s", run, err, progress.String())
		}
		var b bytes.Buffer
		rep.WriteTable(&b)
		t.Logf("run %d:\n%s%s", run, progress.String(), b.String())
		if !rep.OK() || rep.Result.Windows.Correct == 0 {
			t.Fatalf("run %d: %s %v", run, rep.Verdict, rep.Failures)
		}
		if run == 2 {
			for _, want := range []string{"removed the previous run's data", "the verifier reads only what comes after"} {
				if !bytes.Contains(progress.Bytes(), []byte(want)) {
					t.Errorf("run 2's progress does not say %q", want)
				}
			}
		}
	}
}
