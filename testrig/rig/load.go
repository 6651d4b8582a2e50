package rig

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgeagent/edgeagent/testrig/agentproc"
	"github.com/edgeagent/edgeagent/testrig/scenario"
	"github.com/edgeagent/edgeagent/testrig/servers"
	"github.com/edgeagent/edgeagent/testrig/sim"
	"github.com/edgeagent/edgeagent/testrig/truth"
	"github.com/edgeagent/edgeagent/testrig/verify"
)

// LoadOptions configure load mode.
type LoadOptions struct {
	// Agent is the edgeagent binary.
	Agent string
	// Devices is the fleet size (default 10,000).
	Devices int
	// Duration is how long the agent is loaded (default 30s).
	Duration time.Duration
	// Connections is how many MQTT connections the devices share (default 16).
	Connections int
	// ReadingInterval is the event time between one device's readings
	// (default 10s). The plan's rate is fixed by the machine, so this sets
	// how fast event time runs against the wall clock, and with it how many
	// windows a second open, close and are checkpointed: 10s at 10,000
	// devices and 25,000 msgs/s plays event time about 25 times faster than
	// real time, as a fleet flushing backlogs would; devices reading every
	// 400ms play it at about wall speed.
	ReadingInterval time.Duration
	// MaxRate caps the plan: it holds min(MaxRate, 1.5 × the measured
	// ceiling) × Duration messages, so an agent faster than that runs out
	// of plan (reported) rather than of load (default DefaultMaxRate).
	MaxRate int
	// Rate, when set, paces the publishers at this many messages a second
	// for the agent's phase instead of sending as fast as the agent takes
	// them. The agent's CPU per reading falls and its peak RSS rises with
	// the rate, and an unpaced run gets whatever rate the machine gives at
	// that moment; two builds compare only at the same rate.
	Rate int
	// MaxSpread, when above zero, bounds how far apart in event time the
	// devices may get in an unpaced run (sim.PublisherConfig.Lockstep).
	// By default the connections race, and over a 120 s run their devices
	// end three to five minutes of event time apart, like a
	// fleet whose devices flush backlogs of their own; bounded, the fleet
	// is live, every device's windows closing at about the same moment
	// (docs/testrig.md, docs/performance.md session 47).
	MaxSpread time.Duration
	// CeilingDuration is the length of the bare-subscriber measurement
	// (default Duration, at most 10s).
	CeilingDuration time.Duration
	// MQTT names an external broker; the ceiling is measured on it too.
	MQTT string
	// Embedded makes the devices publish to the agent's embedded broker,
	// so the agent's CPU and memory include the broker's work, as on a
	// gateway where the agent is the only broker. The ceiling is then
	// measured on a separate in-process mochi before the agent starts.
	Embedded bool
	// Uplink is the agent's uplink: UplinkNATS (or "") or UplinkMQTT (an
	// in-process MQTT broker as the cloud), for its bytes per reading.
	Uplink string
	Dir    string
	// Progress receives phase lines; nil discards them.
	Progress io.Writer
}

// gateWindow and ceilingGateWindow bound how far publishing may run ahead
// of the consumer's count, far below the broker's in-flight quota (mochi's
// 65,535), so nothing is dropped. Each must cover the rate times its
// consumer's worst acknowledgement delay, or it measures that delay instead
// of throughput. The agent acknowledges after a group commit (a 10 ms linger
// and two fdatasyncs, which take tens of milliseconds now and then on a
// shared disk): 2,000 (70 ms at 30,000 msgs/s) held it at 80-85 % of the
// ceiling in runs where 8,000 gave it 92-96 %. The bare subscriber
// acknowledges at once, and a larger window only queues more in the broker:
// its ceiling measured 3-4 % lower at 8,000 than at 2,000 in alternating
// runs, so it keeps 2,000, the better of the two for it.
const (
	gateWindow        = 8_000
	ceilingGateWindow = 2_000
)

// DefaultReadingInterval is LoadOptions.ReadingInterval's default.
const DefaultReadingInterval = 10 * time.Second

// DefaultMaxRate is LoadOptions.MaxRate's default: above the agent's rate on
// this project's fastest days (56k msgs/s against a 51k ceiling, which
// 40,000 ran out under), at about 3 GB of the rig's memory for 120 s.
const DefaultMaxRate = 80_000

// lockstepFor is the plan-time span that keeps the devices of a plan
// played at speed within maxSpread of event time (0: unbounded).
func lockstepFor(maxSpread time.Duration, speed float64) time.Duration {
	if maxSpread <= 0 || speed <= 0 {
		return 0
	}
	return max(time.Millisecond, time.Duration(float64(maxSpread)/speed))
}

// Rate is a count over a time.
type Rate struct {
	Count     uint64  `json:"count"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"per_second"`
}

func rate(n uint64, d time.Duration) Rate {
	r := Rate{Count: n, Seconds: d.Seconds()}
	if d > 0 {
		r.PerSecond = float64(n) / d.Seconds()
	}
	return r
}

// checkpointsBetween returns the checkpoints written between two status
// reads by reason (the reasons with none left out), or nil when the agent
// does not report them.
func checkpointsBetween(st0, st1 *agentproc.Status) map[string]uint64 {
	if st0.Window.CheckpointsByReason == nil || st1.Window.CheckpointsByReason == nil {
		return nil
	}
	by := map[string]uint64{}
	for reason, n := range st1.Window.CheckpointsByReason {
		if d := n - st0.Window.CheckpointsByReason[reason]; d > 0 {
			by[reason] = d
		}
	}
	return by
}

// reasons writes counts by reason as "delta 12, interval 1", or "none".
func reasons(by map[string]uint64) string {
	keys := slices.Sorted(maps.Keys(by))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, by[k])
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// LoadReport is load mode's outcome.
type LoadReport struct {
	Devices     int    `json:"devices"`
	Connections int    `json:"connections"`
	Broker      string `json:"broker"`
	// ReadingIntervalSeconds is the event time between a device's readings;
	// EventTimeSpeed is how many times faster than the wall clock the plan
	// plays event time.
	ReadingIntervalSeconds float64 `json:"reading_interval_seconds"`
	EventTimeSpeed         float64 `json:"event_time_speed"`
	// MaxSpreadSeconds is the bound on how far apart in event time the
	// devices could get (0: unbounded), EventTimeSpreadSeconds how far
	// apart their last readings were when the load ended.
	MaxSpreadSeconds       float64 `json:"max_spread_seconds"`
	EventTimeSpreadSeconds float64 `json:"event_time_spread_seconds"`
	// Ceiling is a bare paho subscriber on CeilingBroker (the same broker,
	// unless the devices publish to the agent's embedded one), acking at once.
	Ceiling       Rate   `json:"ceiling"`
	CeilingBroker string `json:"ceiling_broker"`
	// Offered is what the publishers sent while the agent was loaded.
	Offered Rate `json:"offered"`
	// PacedRate is the rate the publishers were paced at (--rate), or 0
	// when they sent as fast as the agent took the messages.
	PacedRate int `json:"paced_rate,omitempty"`
	// Ingest is the agent's durable ingest (acknowledged after the Bronze
	// commit), measured by IngestSource.
	Ingest       Rate   `json:"ingest"`
	IngestSource string `json:"ingest_source"`
	// Processed is the window stage's records (status.json), over the same span.
	Processed *Rate `json:"processed,omitempty"`
	// BronzeCommits is the agent's group commits over the same span, and
	// BronzeCommitMeanMs their mean duration: a slow disk shows here first.
	BronzeCommits      *Rate   `json:"bronze_commits,omitempty"`
	BronzeCommitMeanMs float64 `json:"bronze_commit_mean_ms,omitempty"`
	// Checkpoints is the window stage's state checkpoints over the same
	// span, and CheckpointsByReason what made them due: under load the
	// bound on held changes, not processing.checkpoint_interval, sets
	// their pace.
	Checkpoints         *Rate             `json:"checkpoints,omitempty"`
	CheckpointsByReason map[string]uint64 `json:"checkpoints_by_reason,omitempty"`
	// Heap is what the agent's heap allocated and collected over the same
	// span, from the Go runtime's counters on its /metrics. It varies far
	// less from run to run than the CPU does, so a change to the garbage
	// shows in one pair of runs.
	Heap *HeapFigures `json:"heap,omitempty"`
	// Readings is how many messages the agent got in all.
	Readings      uint64 `json:"readings"`
	PlanExhausted bool   `json:"plan_exhausted"`
	// LagP50Ms and LagP99Ms: from a reading's publish to the arrival of
	// its window in the cloud.
	LagP50Ms     float64 `json:"lag_p50_ms"`
	LagP99Ms     float64 `json:"lag_p99_ms"`
	PeakRSSBytes int64   `json:"peak_rss_bytes"`
	// PeakRSSLoadBytes is the agent's VmHWM when the load ended: the peak
	// of its start and the load, without the settling after it (where a
	// fleet falling silent at once closes every device's windows).
	PeakRSSLoadBytes      int64   `json:"peak_rss_load_bytes"`
	CPUSeconds            float64 `json:"cpu_seconds"`
	CPUSecondsPerMillion  float64 `json:"cpu_seconds_per_million_readings"`
	UplinkBytes           uint64  `json:"uplink_bytes"`
	UplinkBytesPerReading float64 `json:"uplink_bytes_per_reading"`
	// Uplink says what carried the agent's uplink to the verifier.
	Uplink   string         `json:"uplink"`
	Result   *verify.Result `json:"result"`
	Failures []string       `json:"failures,omitempty"`
	Notes    []string       `json:"notes,omitempty"`
	// Targets judges the run against load mode's targets. They are set for
	// 10,000 devices on a machine like the gateway's; a miss is reported,
	// and is not a failure: the exit status says whether every window
	// arrived right.
	Targets []Target `json:"targets"`
}

// HeapFigures are the agent's allocations and collections per reading the
// window stage took in.
type HeapFigures struct {
	AllocBytesPerReading  float64 `json:"alloc_bytes_per_reading"`
	AllocsPerReading      float64 `json:"allocs_per_reading"`
	CollectionsPerMillion float64 `json:"collections_per_million_readings"`
	// CollectorCPUShare is the collector's part of the agent's CPU (the
	// runtime's own estimate), 0 to 1.
	CollectorCPUShare float64 `json:"collector_cpu_share"`
}

// heapBetween returns the heap figures between two reads of the agent's
// metrics, over the readings the window stage took in and cpu seconds of
// the agent's CPU, or nil when a read failed or lacks a counter.
func heapBetween(m0, m1 map[string]float64, readings uint64, cpu float64) *HeapFigures {
	names := [...]string{"go_memstats_alloc_bytes_total", "go_memstats_mallocs_total", "go_gc_duration_seconds_count", "go_gc_cpu_seconds_total"}
	var d [len(names)]float64
	for i, n := range names {
		v0, ok0 := m0[n]
		v1, ok1 := m1[n]
		if !ok0 || !ok1 {
			return nil
		}
		d[i] = v1 - v0
	}
	if readings == 0 {
		return nil
	}
	r := float64(readings)
	h := &HeapFigures{AllocBytesPerReading: d[0] / r, AllocsPerReading: d[1] / r, CollectionsPerMillion: d[2] / r * 1e6}
	if cpu > 0 {
		h.CollectorCPUShare = d[3] / cpu
	}
	return h
}

// Target is one of load mode's targets, judged on one run.
type Target struct {
	Name  string `json:"name"`
	Value string `json:"value"`
	Met   bool   `json:"met"`
}

// Load mode's targets, with QoS1 and durable ingest: at least this share
// of the ceiling's rate, at most this CPU per million readings (parse,
// dedup, windows, commits and uplink together), a peak RSS under this
// many bytes (40 MB), and nothing dropped.
const (
	TargetCeilingShare   = 0.90
	TargetCPUPerMillion  = 12.0
	TargetPeakRSSBytes   = 40_000_000
	TargetDevices        = 10_000
	targetNothingDropped = "nothing dropped, every window correct"
)

// judgeTargets fills Targets from the run's figures.
func (l *LoadReport) judgeTargets() {
	// A paced run is judged against what it was offered, or against the
	// ceiling when it was paced above it.
	ref, refName := l.Ceiling.PerSecond, "the ceiling"
	if l.PacedRate > 0 && float64(l.PacedRate) < ref {
		ref, refName = float64(l.PacedRate), "the paced rate"
	}
	share := 0.0
	if ref > 0 {
		share = l.Ingest.PerSecond / ref
	}
	dropped := "yes"
	if l.OK() {
		dropped = "none"
	}
	l.Targets = []Target{
		{fmt.Sprintf("durable ingest >= %.0f%% of %s", 100*TargetCeilingShare, refName), fmt.Sprintf("%.0f%%", 100*share), share >= TargetCeilingShare},
		{fmt.Sprintf("agent CPU <= %g s per million readings", TargetCPUPerMillion), fmt.Sprintf("%.1f s", l.CPUSecondsPerMillion),
			l.Readings > 0 && l.CPUSecondsPerMillion <= TargetCPUPerMillion},
		{fmt.Sprintf("agent peak RSS < %d MB", TargetPeakRSSBytes/1_000_000), fmt.Sprintf("%.1f MB (%s)", float64(l.PeakRSSBytes)/1e6, bytesStr(l.PeakRSSBytes)),
			l.PeakRSSBytes > 0 && l.PeakRSSBytes < TargetPeakRSSBytes},
		{targetNothingDropped, dropped, l.OK()},
	}
}

// OK reports whether the load run delivered everything correctly.
func (l *LoadReport) OK() bool { return len(l.Failures) == 0 }

// WriteJSON writes the report as indented JSON.
func (l *LoadReport) WriteJSON(w io.Writer) error { return writeIndentedJSON(w, "load report", l) }

// WriteTable writes the figures side by side with the ceiling.
func (l *LoadReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "edgerig load: %s devices on %d connections, broker %s\n", num(l.Devices), l.Connections, l.Broker)
	fmt.Fprintf(w, "  a reading every %gs of event time per device; event time runs %.1f× the wall clock\n", l.ReadingIntervalSeconds, l.EventTimeSpeed)
	bound := "unbounded"
	if l.MaxSpreadSeconds > 0 {
		bound = fmt.Sprintf("at most %gs", l.MaxSpreadSeconds)
	}
	fmt.Fprintf(w, "  the devices' event times %.0fs apart when the load ended (%s)\n", l.EventTimeSpreadSeconds, bound)
	if l.PacedRate > 0 {
		fmt.Fprintf(w, "  publishers paced at %d msgs/s (--rate); offered %.0f msgs/s\n", l.PacedRate, l.Offered.PerSecond)
	}
	pct := 0.0
	if l.Ceiling.PerSecond > 0 {
		pct = 100 * l.Ingest.PerSecond / l.Ceiling.PerSecond
	}
	fmt.Fprintf(w, "  ceiling (bare paho subscriber)   %10.0f msgs/s  (%s in %.1fs)\n", l.Ceiling.PerSecond, num(int(l.Ceiling.Count)), l.Ceiling.Seconds)
	if l.CeilingBroker != l.Broker {
		fmt.Fprintf(w, "    measured on %s; the agent's figures below include its broker's work\n", l.CeilingBroker)
	}
	share := fmt.Sprintf("%.0f%% of the ceiling", pct)
	if l.PacedRate > 0 {
		share = fmt.Sprintf("%.0f%% of the paced rate, %s", 100*l.Ingest.PerSecond/float64(l.PacedRate), share)
	}
	fmt.Fprintf(w, "  agent durable ingest             %10.0f msgs/s  (%s; %s)\n", l.Ingest.PerSecond, share, l.IngestSource)
	if l.Processed != nil {
		fmt.Fprintf(w, "  window stage processed           %10.0f records/s\n", l.Processed.PerSecond)
	}
	if c := l.BronzeCommits; c != nil {
		fmt.Fprintf(w, "  Bronze group commits             %10.0f /s  (%.0f messages each, %.1f ms mean)\n",
			c.PerSecond, l.Ingest.PerSecond/c.PerSecond, l.BronzeCommitMeanMs)
	}
	if c := l.Checkpoints; c != nil {
		fmt.Fprintf(w, "  state checkpoints                %10.2f /s  (%s)\n", c.PerSecond, reasons(l.CheckpointsByReason))
	}
	fmt.Fprintf(w, "  end-to-end lag (publish→cloud)   p50 %s  p99 %s\n", ms(l.LagP50Ms), ms(l.LagP99Ms))
	fmt.Fprintf(w, "  agent peak RSS                   %s  (%s when the load ended)\n", bytesStr(l.PeakRSSBytes), bytesStr(l.PeakRSSLoadBytes))
	fmt.Fprintf(w, "  agent CPU                        %.1f s per million readings (%.1f s for %s)\n", l.CPUSecondsPerMillion, l.CPUSeconds, num(int(l.Readings)))
	if h := l.Heap; h != nil {
		fmt.Fprintf(w, "  agent heap                       %.0f B, %.1f allocations per reading; %.0f collections per million (the collector %.0f%% of the CPU)\n",
			h.AllocBytesPerReading, h.AllocsPerReading, h.CollectionsPerMillion, 100*h.CollectorCPUShare)
	}
	fmt.Fprintf(w, "  uplink                           %.2f bytes per reading (%s, over %s)\n", l.UplinkBytesPerReading, bytesStr(int64(l.UplinkBytes)), l.Uplink)
	if r := l.Result; r != nil {
		fmt.Fprintf(w, "  verified                         %s windows correct, %d wrong, %d missing, %d extra\n",
			num(r.Windows.Correct), r.Windows.Wrong, r.Windows.Missing, r.Windows.Extra)
	}
	l.WriteTargets(w)
	for _, n := range l.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
	for _, f := range l.Failures {
		fmt.Fprintf(w, "  FAILURE: %s\n", f)
	}
}

// WriteTargets writes the targets' lines of the table.
func (l *LoadReport) WriteTargets(w io.Writer) {
	if len(l.Targets) > 0 {
		scale := ""
		if l.Devices != TargetDevices {
			scale = fmt.Sprintf(" (set for %s devices; this run has %s)", num(TargetDevices), num(l.Devices))
		}
		fmt.Fprintf(w, "  targets%s\n", scale)
		for _, t := range l.Targets {
			verdict := "met"
			if !t.Met {
				verdict = "MISSED"
			}
			fmt.Fprintf(w, "    %-44s %-6s  %s\n", t.Name, verdict, t.Value)
		}
	}
}

// loadScenario is the load fleet: 70% JSON, 20% CBOR, 10% plain-number
// devices reading every interval of event time, with enough plan for maxRate.
func loadScenario(devices int, d time.Duration, maxRate int, connections int, interval time.Duration, prefix string) *scenario.Scenario {
	perDevice := max(2, int(int64(maxRate)*int64(d/time.Second)/int64(devices)))
	speed := float64(perDevice) * interval.Seconds() / d.Seconds()
	nJSON, nCBOR := devices*7/10, devices*2/10
	nNum := max(0, devices-nJSON-nCBOR)
	groups := []scenario.DeviceGroup{
		{Prefix: prefix + "j", Count: max(1, nJSON), Format: scenario.FormatJSON, Interval: interval, Metrics: []string{"temperature", "humidity"}},
		{Prefix: prefix + "c", Count: max(1, nCBOR), Format: scenario.FormatCBOR, Interval: interval, Metrics: []string{"temperature", "pressure"}},
	}
	if nNum > 0 {
		groups = append(groups, scenario.DeviceGroup{Prefix: prefix + "n", Count: nNum, Format: scenario.FormatNumber, Interval: interval, Metrics: []string{"level"}})
	}
	sc := &scenario.Scenario{Name: "load", Seed: 42, Duration: d, Speed: speed, Connections: connections, Devices: groups,
		SettleTimeout: 2 * time.Minute}
	sc.Normalize()
	return sc
}

// Load runs a sustained load: first a bare subscriber's ceiling on the
// broker, then the agent under the same publishers for Duration, then a
// settle until every window arrived; it reports rates, lag and resource use.
func Load(ctx context.Context, o LoadOptions) (*LoadReport, error) {
	if o.Devices <= 0 {
		o.Devices = 10_000
	}
	if o.Duration <= 0 {
		o.Duration = 30 * time.Second
	}
	if o.Connections <= 0 {
		o.Connections = 16
	}
	if o.MaxRate <= 0 {
		o.MaxRate = DefaultMaxRate
	}
	if o.ReadingInterval <= 0 {
		o.ReadingInterval = DefaultReadingInterval
	}
	if o.CeilingDuration <= 0 {
		o.CeilingDuration = min(10*time.Second, o.Duration)
	}
	if o.Embedded && o.MQTT != "" {
		return nil, errors.New("rig: load: Embedded and MQTT exclude each other")
	}
	if err := CheckUplink(Options{Uplink: o.Uplink}); err != nil {
		return nil, err
	}
	sc := loadScenario(o.Devices, o.Duration, o.MaxRate, o.Connections, o.ReadingInterval, "")
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	dir, temp, err := runDir(o.Dir, "edgerig-load-")
	if err != nil {
		return nil, err
	}
	e, err := newEnv(ctx, envConfig{dir: dir, agentBin: o.Agent, agent: sc.Agent, mqtt: o.MQTT, embedded: o.Embedded, uplink: o.Uplink,
		holdVerifier: true, progress: o.Progress})
	if err != nil {
		removeTemp(dir, temp)
		return nil, err
	}
	defer e.close()
	lr := &LoadReport{Devices: o.Devices, Connections: o.Connections, Broker: e.brokerName, Uplink: e.uplinkName, ReadingIntervalSeconds: o.ReadingInterval.Seconds(),
		CeilingBroker: e.brokerName, MaxSpreadSeconds: max(0, o.MaxSpread.Seconds())}

	// 1. The ceiling: a bare subscriber that acks at once.
	cs := loadScenario(o.Devices, o.CeilingDuration, o.MaxRate, o.Connections, o.ReadingInterval, "ceil")
	cplan, err := sim.NewPlan(cs, time.Now())
	if err != nil {
		return nil, err
	}
	e.logf("ceiling: bare paho subscriber, %s planned messages for %v", num(cplan.Counts().Messages), o.CeilingDuration)
	ceil, err := func() (Rate, error) {
		if !o.Embedded {
			return measureCeiling(ctx, e.brokerURL, cplan, o.CeilingDuration, lockstepFor(o.MaxSpread, cs.Speed))
		}
		// The agent's broker is not up yet (and would count the ceiling's
		// messages as its own): the ceiling gets a broker of its own, for
		// that phase only.
		m, err := servers.StartMochi("")
		if err != nil {
			return Rate{}, err
		}
		defer m.Close()
		lr.CeilingBroker = "a separate " + m.Name()
		return measureCeiling(ctx, m.URL(), cplan, o.CeilingDuration, lockstepFor(o.MaxSpread, cs.Speed))
	}()
	if err != nil {
		return nil, err
	}
	lr.Ceiling = ceil
	e.logf("ceiling: %.0f msgs/s", ceil.PerSecond)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	// The agent takes messages about as fast as the ceiling (same broker,
	// same publishers; up to 1.4 times it, as the group commit lets the
	// publishers run further ahead than the bare subscriber's acks): a plan
	// of half more is enough, and keeps the rig's memory (about 300 bytes a
	// planned message) in bounds.
	if o.Rate > 0 {
		sc = loadScenario(o.Devices, o.Duration, o.Rate, o.Connections, o.ReadingInterval, "")
		lr.PacedRate = o.Rate
	} else if r := int(ceil.PerSecond * 1.5); r > 0 && r < o.MaxRate {
		sc = loadScenario(o.Devices, o.Duration, r, o.Connections, o.ReadingInterval, "")
	}
	lr.EventTimeSpeed = sc.Speed

	// 2. The agent under the same publishers. The ceiling subscriber's
	// unacknowledged messages were dropped at its disconnect; only drops
	// from here on count.
	var dropped0 uint64
	if e.mochi != nil {
		dropped0 = e.mochi.Dropped()
	}
	if err := e.startAgent(ctx, 30*time.Second); err != nil {
		return nil, err
	}
	plan, err := e.planFor(sc)
	if err != nil {
		return nil, err
	}
	ingested := func() uint64 { return e.mochi.Acks() }
	lr.IngestSource = "acknowledgements after the Bronze commit, counted at the broker"
	var committed atomic.Uint64
	stopPoll := func() {}
	if e.mochi == nil {
		// An external broker: the agent's own committed count, polled.
		lr.IngestSource = "status.json committed_total"
		pctx, cancel := context.WithCancel(ctx)
		stopPoll = cancel
		go func() {
			for pctx.Err() == nil {
				if st := e.status(pctx); st != nil {
					committed.Store(st.Ingest.CommittedTotal)
				}
				sleepCtx(pctx, 100*time.Millisecond)
			}
		}()
		ingested = committed.Load
	}
	defer stopPoll()
	runCtx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	started := make(chan time.Time, 1)
	pub := sim.NewPublisher(plan, sim.PublisherConfig{Broker: e.brokerURL, ClientPrefix: "edgerig-load", Unpaced: o.Rate <= 0,
		Gate: ingested, GateWindow: gateWindow, Lockstep: lockstepFor(o.MaxSpread, sc.Speed), OnStart: func(t time.Time) { started <- t }})
	e.logf("agent phase: %s planned messages for %v", num(plan.Counts().Messages), o.Duration)
	pubErr := make(chan error, 1)
	go func() { pubErr <- pub.Run(runCtx) }()
	var t0 time.Time
	select {
	case t0 = <-started:
	case err := <-pubErr:
		return nil, fmt.Errorf("rig: publisher: %w", err)
	}
	in0 := ingested()
	cpu0 := e.agent.Usage().CPUSeconds
	st0 := e.status(ctx)
	m0 := e.metrics(ctx)
	perr := <-pubErr
	t1 := time.Now()
	in1 := ingested()
	u1 := e.agent.Usage()
	cpu1 := u1.CPUSeconds
	lr.PeakRSSLoadBytes = u1.PeakRSSBytes
	st1 := e.status(ctx)
	m1 := e.metrics(ctx)
	// The ceiling phase had no verifier beside it: over NATS this one
	// has held its consumption until now, and reads what the stream kept
	// (arrival times are the stream's).
	e.verifier.Release()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	pp := pub.Progress()
	lr.Offered = rate(pp.Published, t1.Sub(t0))
	lr.Ingest = rate(in1-in0, t1.Sub(t0))
	if st0 != nil && st1 != nil {
		r := rate(st1.Window.ProcessedTotal-st0.Window.ProcessedTotal, t1.Sub(t0))
		lr.Processed = &r
		lr.Heap = heapBetween(m0, m1, st1.Window.ReadingsTotal-st0.Window.ReadingsTotal, cpu1-cpu0)
		if n := st1.Ingest.CommitsTotal - st0.Ingest.CommitsTotal; n > 0 {
			c := rate(n, t1.Sub(t0))
			lr.BronzeCommits = &c
			lr.BronzeCommitMeanMs = (st1.Ingest.CommitSecondsTotal - st0.Ingest.CommitSecondsTotal) * 1000 / float64(n)
		}
		if by := checkpointsBetween(st0, st1); by != nil {
			var n uint64
			for _, c := range by {
				n += c
			}
			c := rate(n, t1.Sub(t0))
			lr.Checkpoints, lr.CheckpointsByReason = &c, by
		}
	}
	// The publisher drains what is in flight past the deadline, so the
	// plan ran out when all of it went out, whenever Run returned.
	lr.PlanExhausted = pp.Total > 0 && pp.Published >= pp.Total
	if lr.PlanExhausted && o.Rate <= 0 {
		lr.Notes = append(lr.Notes, fmt.Sprintf("the plan ran out after %.1fs: the agent is faster than --max-rate; raise it", t1.Sub(t0).Seconds()))
	}
	if perr != nil && runCtx.Err() == nil {
		lr.Failures = append(lr.Failures, fmt.Sprintf("publisher: %v", perr))
	}
	if u := pub.Unacked(); u > 0 {
		lr.Failures = append(lr.Failures, fmt.Sprintf("%d publishes never acknowledged", u))
	}
	e.logf("agent phase: offered %.0f msgs/s, ingested %.0f msgs/s, agent CPU %.1f s before the load and %.1f s during it; settling",
		lr.Offered.PerSecond, lr.Ingest.PerSecond, cpu0, cpu1-cpu0)

	// 3. Settle, stop, verify.
	lr.EventTimeSpreadSeconds = plan.EventTimeSpread(pub.Sent()).Seconds()
	exp := truth.Compute(plan, pub.Sent(), pub.SentAt(), truthSettings(sc.Agent))
	opts := verify.CompareOptions{Gateway: Gateway, Aggregates: sc.Agent.Window.Aggregates, Size: sc.Agent.Window.Size, Slide: sc.Agent.Window.Slide, AtLeastOnce: pp.Republished > 0}
	// The verifier first reads what the stream kept during the load: a
	// comparison holds its lock, and comparing a million windows every
	// 200 ms starved that catch-up (a minute for 1.1 million windows).
	cctx, ccancel := context.WithTimeout(ctx, sc.SettleTimeout)
	if err := e.verifier.WaitDrained(cctx); err != nil {
		lr.Notes = append(lr.Notes, "catching up with the stream: "+err.Error())
	}
	ccancel()
	res := waitComplete(ctx, e, exp, opts, sc.SettleTimeout)
	if !res.Complete() {
		lr.Failures = append(lr.Failures, fmt.Sprintf("not every window arrived within %v of the end of the load", sc.SettleTimeout))
	}
	usage := e.agent.Usage()
	if code, err := e.agent.Terminate(30 * time.Second); err != nil || code != 0 {
		lr.Failures = append(lr.Failures, fmt.Sprintf("agent stop: exit %d, %v", code, err))
	}
	if u := e.agent.Usage(); u.CPUSeconds > 0 {
		usage = u
	}
	dctx, dcancel := context.WithTimeout(ctx, 15*time.Second)
	if err := e.verifier.WaitDrained(dctx); err != nil {
		lr.Notes = append(lr.Notes, err.Error())
	}
	dcancel()
	lr.Result = e.verifier.Compare(exp, opts)
	if !lr.Result.OK() {
		lr.Failures = append(lr.Failures, fmt.Sprintf("verifier: %d wrong, %d missing, %d extra windows", lr.Result.Windows.Wrong, lr.Result.Windows.Missing, lr.Result.Windows.Extra))
	}
	if e.mochi != nil && e.mochi.Dropped() > dropped0 {
		lr.Failures = append(lr.Failures, fmt.Sprintf("the broker dropped %d messages", e.mochi.Dropped()-dropped0))
	}
	lr.Readings = pp.Acked
	lr.LagP50Ms, lr.LagP99Ms = lr.Result.Latency.P50Ms, lr.Result.Latency.P99Ms
	lr.PeakRSSBytes, lr.CPUSeconds = usage.PeakRSSBytes, usage.CPUSeconds
	lr.UplinkBytes = lr.Result.Delivery.Bytes
	if lr.Readings > 0 {
		lr.CPUSecondsPerMillion = usage.CPUSeconds / float64(lr.Readings) * 1e6
		lr.UplinkBytesPerReading = float64(lr.UplinkBytes) / float64(lr.Readings)
	}
	lr.judgeTargets()
	e.close()
	if lr.OK() && temp {
		os.RemoveAll(dir)
	}
	return lr, nil
}

// ceilingFilters are the agent's subscriptions as MQTT filters.
var ceilingFilters = []string{"sensors/+/telemetry", "cbor/+/telemetry", "num/+/+"}

// measureCeiling publishes plan for d against a bare subscriber that acks
// at once and returns the subscriber's receive rate.
func measureCeiling(ctx context.Context, broker string, plan *sim.Plan, d, lockstep time.Duration) (Rate, error) {
	var n atomic.Uint64
	subscribed := make(chan error, 1)
	opts := paho.NewClientOptions().AddBroker(broker).SetClientID(fmt.Sprintf("edgerig-ceiling-%d", time.Now().UnixNano())).
		SetCleanSession(false).SetOrderMatters(true).SetConnectTimeout(10 * time.Second)
	count := func(paho.Client, paho.Message) { n.Add(1) }
	opts.SetDefaultPublishHandler(count)
	opts.SetOnConnectHandler(func(c paho.Client) {
		filters := map[string]byte{}
		for _, f := range ceilingFilters {
			filters[f] = 1
		}
		tok := c.SubscribeMultiple(filters, count)
		tok.WaitTimeout(10 * time.Second)
		select {
		case subscribed <- tok.Error():
		default:
		}
	})
	c := paho.NewClient(opts)
	if tok := c.Connect(); !tok.WaitTimeout(15*time.Second) || tok.Error() != nil {
		return Rate{}, fmt.Errorf("rig: ceiling subscriber connect: %v", tok.Error())
	}
	defer func() {
		// The session is persistent, like the agent's (mochi serves the two
		// kinds differently); unsubscribe so nothing is queued for it later.
		c.Unsubscribe(ceilingFilters...).WaitTimeout(5 * time.Second)
		c.Disconnect(100)
	}()
	select {
	case err := <-subscribed:
		if err != nil {
			return Rate{}, fmt.Errorf("rig: ceiling subscriber subscribe: %w", err)
		}
	case <-time.After(15 * time.Second):
		return Rate{}, fmt.Errorf("rig: ceiling subscriber: no subscription within 15s")
	}
	runCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	started := make(chan time.Time, 1)
	pub := sim.NewPublisher(plan, sim.PublisherConfig{Broker: broker, ClientPrefix: "edgerig-ceiling-pub", Unpaced: true,
		Gate: n.Load, GateWindow: ceilingGateWindow, Lockstep: lockstep, OnStart: func(t time.Time) { started <- t }})
	pubErr := make(chan error, 1)
	go func() { pubErr <- pub.Run(runCtx) }()
	var t0 time.Time
	select {
	case t0 = <-started:
	case err := <-pubErr:
		return Rate{}, fmt.Errorf("rig: ceiling publisher: %w", err)
	}
	n0 := n.Load()
	<-pubErr
	return rate(n.Load()-n0, time.Since(t0)), nil
}
