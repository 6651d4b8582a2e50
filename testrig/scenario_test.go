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
	for _, name := range scenario.Names() {
		t.Run(name, func(t *testing.T) {
			if testing.Short() && name != "steady" && name != "chaos" {
				t.Skip("-short: steady and chaos only")
			}
			rep, _ := runShort(t, name, rig.Options{})
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
}
