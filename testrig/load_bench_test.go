package testrig_test

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/testrig/rig"
)

var (
	loadDevices = flag.Int("load.devices", 10_000, "BenchmarkLoad: simulated devices")
	// Two minutes, not thirty seconds: a 30 s run ends before the fleet's
	// event time spreads over many window starts, so that each checkpoint
	// rewrites three times the groups (docs/performance.md, sessions 45-46).
	loadDuration = flag.Duration("load.duration", 120*time.Second, "BenchmarkLoad: how long the agent is loaded")
	loadEmbedded = flag.Bool("load.embedded", false, "BenchmarkLoad: devices publish to the agent's embedded broker")
	loadConns    = flag.Int("load.connections", 0, "BenchmarkLoad: MQTT connections the devices share (0: the rig's default)")
	loadSpread   = flag.Duration("load.max-spread", 0, "BenchmarkLoad: how far apart in event time the devices may get (0: unbounded)")
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
		lr, err := rig.Load(context.Background(), rig.LoadOptions{Agent: bin, Devices: devices, Duration: d,
			Embedded: *loadEmbedded, Connections: *loadConns, MaxSpread: *loadSpread})
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
		if h := lr.Heap; h != nil {
			b.ReportMetric(h.AllocBytesPerReading, "heap-B/reading")
			b.ReportMetric(h.CollectionsPerMillion, "GCs/Mreadings")
		}
		var targets strings.Builder // what the metrics meet or miss
		lr.WriteTargets(&targets)
		b.Log("\n" + targets.String())
	}
}

// A short load run with the devices on the agent's embedded broker: the
// ceiling comes from a broker of its own, ingest from the agent's
// committed count, and every window still verifies.
func TestLoadEmbeddedShort(t *testing.T) {
	if testing.Short() {
		t.Skip("a load run with the real agent")
	}
	t.Parallel()
	lr, table := shortLoad(t, rig.LoadOptions{Connections: 40, MaxRate: 4000, Embedded: true, MaxSpread: time.Minute})
	if lr.Broker == lr.CeilingBroker || !strings.Contains(lr.Broker, "embedded") {
		t.Errorf("broker %q, ceiling measured on %q: want the agent's embedded broker and a separate one", lr.Broker, lr.CeilingBroker)
	}
	if lr.IngestSource != "status.json committed_total" || lr.Ingest.Count == 0 || lr.Readings == 0 {
		t.Errorf("ingest %d from %q, %d readings: want the agent's committed count", lr.Ingest.Count, lr.IngestSource, lr.Readings)
	}
	if lr.Result == nil || lr.Result.Windows.Correct == 0 {
		t.Errorf("no window verified: %+v", lr.Result)
	}
	// Unpaced, 40 connections race through 600 s of event time in 3 s;
	// MaxSpread keeps their devices within a minute of each other (and a
	// reading interval: a device's last reading is up to one interval
	// behind its connection's place in the plan).
	if lr.MaxSpreadSeconds != 60 || lr.EventTimeSpreadSeconds > lr.MaxSpreadSeconds+lr.ReadingIntervalSeconds {
		t.Errorf("devices %.0fs apart in event time, bound %.0fs: want them within a minute and a reading interval",
			lr.EventTimeSpreadSeconds, lr.MaxSpreadSeconds)
	}
	if !strings.Contains(table, "(at most 60s)") {
		t.Errorf("the table does not give the bound on the devices' spread:\n%s", table)
	}
	// VmHWM only grows: the peak when the load ended is part of the run's.
	if lr.PeakRSSLoadBytes <= 0 || lr.PeakRSSLoadBytes > lr.PeakRSSBytes {
		t.Errorf("peak RSS %d bytes when the load ended, %d over the run: want 0 < the first <= the second", lr.PeakRSSLoadBytes, lr.PeakRSSBytes)
	}
	if !strings.Contains(table, "include its broker's work") {
		t.Errorf("the table does not say the agent's figures include its broker:\n%s", table)
	}
}

// A paced load run (--rate) publishes on the plan's schedule, no faster,
// and judges durable ingest against the rate it was offered.
func TestLoadPacedShort(t *testing.T) {
	if testing.Short() {
		t.Skip("a load run with the real agent")
	}
	t.Parallel()
	const paced = 1000
	lr, table := shortLoad(t, rig.LoadOptions{Connections: 4, Rate: paced})
	// Unpaced, these 3,000 messages go out in a fraction of a second.
	if lr.PacedRate != paced || lr.Offered.Count == 0 || lr.Offered.PerSecond > 1.25*paced {
		t.Errorf("paced at %d msgs/s, offered %d messages at %.0f msgs/s: want the publishers held to %d msgs/s", lr.PacedRate, lr.Offered.Count, lr.Offered.PerSecond, paced)
	}
	if len(lr.Targets) == 0 || !strings.Contains(lr.Targets[0].Name, "of the paced rate") {
		t.Errorf("rate target %+v: want it judged against the paced rate", lr.Targets)
	}
	if !strings.Contains(table, "paced at 1000 msgs/s") {
		t.Errorf("the table does not say the publishers were paced:\n%s", table)
	}
	// The heap figures come from the agent's own /metrics.
	if h := lr.Heap; h == nil || h.AllocBytesPerReading <= 0 || h.AllocsPerReading <= 0 || h.CollectorCPUShare < 0 || h.CollectorCPUShare > 1 {
		t.Errorf("heap figures %+v: want the agent's allocations per reading and the collector's share of its CPU", lr.Heap)
	}
	if !strings.Contains(table, "agent heap") {
		t.Errorf("the table has no heap line:\n%s", table)
	}
}

// shortLoad runs o as a short load run of 200 devices for 3s (a 2s
// ceiling) with the real agent, logs its table and fails t unless every
// window arrived right.
func shortLoad(t *testing.T, o rig.LoadOptions) (*rig.LoadReport, string) {
	t.Helper()
	o.Agent, o.Devices, o.Duration, o.CeilingDuration, o.Progress = agent(t), 200, 3*time.Second, 2*time.Second, logWriter{t}
	lr, err := rig.Load(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	lr.WriteTable(&table)
	t.Log(table.String())
	if !lr.OK() {
		t.Fatalf("load run failed: %v", lr.Failures)
	}
	return lr, table.String()
}

// A replay runs agents over the Bronze log a load run left: each run
// processes the whole log (its aggregates stay in the outbox), and the
// report gives every run's CPU, faults and bytes written.
func TestReplayOfALoadRun(t *testing.T) {
	if testing.Short() {
		t.Skip("a load run and replays with the real agent")
	}
	t.Parallel()
	dir := t.TempDir()
	lr, _ := shortLoad(t, rig.LoadOptions{Dir: dir})
	work := t.TempDir()
	bin := agent(t)
	rep, err := rig.Replay(context.Background(), rig.ReplayOptions{Dir: dir, Agents: []string{bin, bin}, Rounds: 2, Work: work})
	if err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	rep.WriteTable(&table)
	t.Log(table.String())
	if len(rep.Agents) != 2 || rep.BronzeBytes == 0 {
		t.Fatalf("report %+v", rep)
	}
	for _, s := range rep.Agents {
		if len(s.Runs) != 2 || s.MedianCPUSeconds <= 0 || s.MedianMinorFaults <= 0 || s.MedianWritten <= 0 {
			t.Errorf("agent %s: %d runs, median %.2f s CPU, %d faults, %d bytes written: want two runs that did work",
				s.Agent, len(s.Runs), s.MedianCPUSeconds, s.MedianMinorFaults, s.MedianWritten)
		}
	}
	// The last run's agent processed every reading of the load run into
	// the outbox: it says how many rows it left there.
	logs, err := filepath.Glob(filepath.Join(work, "agent-1-2.log"))
	if err != nil || len(logs) != 1 {
		t.Fatalf("the last run's log: %v %v", logs, err)
	}
	b, err := os.ReadFile(logs[0])
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`run --once: no uplink configured.* rows=(\d+)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("the replay's log does not say what it left in the outbox:\n%s", b)
	}
	if rows, _ := strconv.Atoi(string(m[1])); rows < lr.Result.Windows.Expected {
		t.Errorf("the replay left %d aggregates in the outbox; the load run's cloud expected %d windows", rows, lr.Result.Windows.Expected)
	}
}
