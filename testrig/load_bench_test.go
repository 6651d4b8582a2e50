package testrig_test

import (
	"context"
	"flag"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/testrig/rig"
)

var (
	loadDevices  = flag.Int("load.devices", 10_000, "BenchmarkLoad: simulated devices")
	loadDuration = flag.Duration("load.duration", 30*time.Second, "BenchmarkLoad: how long the agent is loaded")
)

// BenchmarkLoad is edgerig load as a benchmark (make bench): the real
// agent under a sustained load from thousands of devices, next to the
// ceiling of a bare paho subscriber on the same broker, measured in the
// same run. -short loads 1,000 devices for 5s.
func BenchmarkLoad(b *testing.B) {
	bin := agent(b)
	devices, d := *loadDevices, *loadDuration
	if testing.Short() {
		devices, d = 1_000, 5*time.Second
	}
	for i := 0; i < b.N; i++ {
		lr, err := rig.Load(context.Background(), rig.LoadOptions{Agent: bin, Devices: devices, Duration: d})
		if err != nil {
			b.Fatal(err)
		}
		if !lr.OK() {
			b.Fatalf("load run failed: %v", lr.Failures)
		}
		b.ReportMetric(lr.Ingest.PerSecond, "ingest-msgs/s")
		b.ReportMetric(lr.Ceiling.PerSecond, "ceiling-msgs/s")
		if lr.Processed != nil {
			b.ReportMetric(lr.Processed.PerSecond, "processed-records/s")
		}
		b.ReportMetric(lr.LagP99Ms, "p99-lag-ms")
		b.ReportMetric(float64(lr.PeakRSSBytes)/(1<<20), "peak-RSS-MiB")
		b.ReportMetric(lr.CPUSecondsPerMillion, "CPU-s/Mreadings")
		b.ReportMetric(lr.UplinkBytesPerReading, "uplink-B/reading")
	}
}
