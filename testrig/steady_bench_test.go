package testrig_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/testrig/rig"
	"github.com/edgeagent/edgeagent/testrig/scenario"
)

// BenchmarkSteady runs the steady scenario at its full length (-short: the
// CI length) against the real agent and reports the agent's peak RSS
// (VmHWM) and CPU: what a small fleet costs the gateway (make bench).
func BenchmarkSteady(b *testing.B) {
	sc, err := scenario.Lookup("steady")
	if err != nil {
		b.Fatal(err)
	}
	bin := agent(b)
	for i := 0; i < b.N; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		rep, err := rig.Run(ctx, rig.Options{Agent: bin, Scenario: sc, Short: testing.Short()})
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		if !rep.OK() {
			var table strings.Builder
			rep.WriteTable(&table)
			b.Fatalf("steady run failed: %v\n%s", rep.Failures, table.String())
		}
		b.ReportMetric(float64(rep.Agent.Usage.PeakRSSBytes)/(1<<20), "agent-peak-RSS-MiB")
		b.ReportMetric(rep.Agent.Usage.CPUSeconds, "agent-CPU-s")
		b.ReportMetric(float64(rep.Result.Windows.Correct), "windows-correct")
	}
}
