package testrig_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/testrig/rig"
	"github.com/edgeagent/edgeagent/testrig/scenario"
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
