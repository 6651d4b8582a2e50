package rig

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/edgeagent/edgeagent/testrig/agentproc"
	"github.com/edgeagent/edgeagent/testrig/scenario"
	"github.com/edgeagent/edgeagent/testrig/sim"
	"github.com/edgeagent/edgeagent/testrig/truth"
	"github.com/edgeagent/edgeagent/testrig/verify"
)

// Options configure a scenario run.
type Options struct {
	// Agent is the edgeagent binary.
	Agent    string
	Scenario *scenario.Scenario
	// Short applies the scenario's short settings (CI).
	Short bool
	// Dir is the run directory; "" makes a temporary one, removed after a
	// passing run unless Keep.
	Dir  string
	Keep bool
	// MQTT and NATS name external servers instead of in-process ones;
	// faults that restart them are then skipped.
	MQTT, NATS string
	// Broker picks the in-process broker: "mochi", "mosquitto", or ""
	// for mosquitto when the scenario restarts the broker or the agent and
	// mosquitto is installed, mochi otherwise.
	Broker string
	// Uplink is the agent's uplink transport: UplinkNATS (or "") or
	// UplinkMQTT. UplinkBroker is an external MQTT broker for it ("" runs
	// an in-process mochi of its own, apart from the devices' broker).
	Uplink, UplinkBroker string
	// Progress receives one line per phase and fault; nil discards them.
	Progress io.Writer
	// Stop, when closed, ends the run early (the first Ctrl-C): publishing
	// and faults stop, the agent is stopped without waiting for it to
	// deliver the rest, and the report covers what had arrived, marked
	// Interrupted. ctx ending instead aborts at once, without a report.
	Stop <-chan struct{}
	// PublishLimit bounds publishing (0: three times the scenario's
	// duration plus two minutes): a broker that stops acknowledging for
	// good fails the run there instead of holding it forever.
	PublishLimit time.Duration
	// DiskFull says how a disk_full fault fills the disk: DiskFullAuto
	// (or "") fills a small tmpfs where the rig can mount one and injects
	// write errors where it cannot; DiskFullWriteErrors always injects.
	DiskFull string
}

// The ways of a disk_full fault (Options.DiskFull, edgerig run
// --disk-full).
const (
	DiskFullAuto        = "auto"
	DiskFullWriteErrors = "write-errors"
)

// CheckOptions refuses options Run cannot run with (Run does too; a
// command line calls it first to tell a usage error apart).
func CheckOptions(o Options) error {
	switch o.Broker {
	case "", "mochi", "mosquitto":
	default:
		return fmt.Errorf("rig: --broker %q: want mochi or mosquitto", o.Broker)
	}
	switch o.DiskFull {
	case "", DiskFullAuto, DiskFullWriteErrors:
	default:
		return fmt.Errorf("rig: --disk-full %q: want %s or %s", o.DiskFull, DiskFullAuto, DiskFullWriteErrors)
	}
	return CheckUplink(o)
}

// WithStop returns a context that ends with ctx or when stop is closed
// (nil: never). Its goroutine ends with the context: call cancel.
func WithStop(ctx context.Context, stop <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	if stop != nil {
		go func() {
			select {
			case <-stop:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	return ctx, cancel
}

// errStoppedEarly is returned when a run is stopped before its devices
// started publishing: there is nothing to report.
var errStoppedEarly = errors.New("rig: stopped before the devices started publishing: nothing to report")

// tmpfsSize is the data_dir filesystem of runs with a disk_full fault.
const tmpfsSize = 256 << 20

// Run runs a scenario against the real agent binary and returns its
// report. An error means the run could not be carried out (a server or the
// agent did not start); a run that found problems returns a FAIL report.
func Run(ctx context.Context, o Options) (*Report, error) {
	sc := o.Scenario
	if sc == nil {
		return nil, errors.New("rig: no scenario")
	}
	if o.Short {
		sc = sc.WithShort()
	}
	// Checked before the run directory exists, so a bad value leaves none.
	if err := CheckOptions(o); err != nil {
		return nil, err
	}
	dir, temp, err := runDir(o.Dir, "edgerig-"+sc.Name+"-")
	if err != nil {
		return nil, err
	}
	cfg := envConfig{dir: dir, agentBin: o.Agent, agent: sc.Agent, mqtt: o.MQTT, nats: o.NATS, progress: o.Progress,
		uplink: o.Uplink, uplinkBroker: o.UplinkBroker}
	for _, f := range sc.Faults {
		switch f.Kind {
		case scenario.FaultBrokerRestart, scenario.FaultAgentKill, scenario.FaultAgentRestart:
			// mosquitto survives its own restart and a session takeover
			// under load; mochi needs the devices paused for both.
			cfg.mosquitto = true
		case scenario.FaultDiskFull:
			cfg.diskFull = true
			if o.DiskFull != DiskFullWriteErrors {
				cfg.tmpfsBytes = tmpfsSize
			}
		}
	}
	switch o.Broker {
	case "mochi":
		cfg.mosquitto = false
	case "mosquitto":
		cfg.mosquitto, cfg.requireMosquitto = true, true
	}
	e, err := newEnv(ctx, cfg)
	if err != nil {
		removeTemp(dir, temp)
		return nil, err
	}
	defer e.close()
	rep, err := run(ctx, e, sc, o)
	if err != nil {
		return nil, fmt.Errorf("%w (run directory %s)", err, dir)
	}
	rep.RunDir = dir
	e.close()
	if rep.OK() && temp && !o.Keep {
		os.RemoveAll(dir)
		rep.RunDir = "" // it no longer exists: naming it would send a reader looking
	}
	return rep, nil
}

// runDir makes the run directory.
func runDir(dir, pattern string) (string, bool, error) {
	if dir == "" {
		d, err := os.MkdirTemp("", pattern)
		if err != nil {
			return "", false, fmt.Errorf("rig: run dir: %w", err)
		}
		return d, true, nil
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return "", false, fmt.Errorf("rig: run dir: %w", err)
	}
	return dir, false, nil
}

// removeTemp removes a temporary run directory of a run that could not
// start: there is nothing in it to look at.
func removeTemp(dir string, temp bool) {
	if temp {
		os.RemoveAll(dir)
	}
}

func run(ctx context.Context, e *env, sc *scenario.Scenario, o Options) (*Report, error) {
	rep := &Report{Mode: "run", Scenario: sc.Name, Description: sc.Description, Short: o.Short, Broker: e.brokerName, Uplink: e.uplinkName}
	e.logf("scenario %s: %d devices, %v publishing at %gx, broker %s, uplink over %s", sc.Name, sc.DeviceCount(), sc.Duration, sc.Speed, e.brokerName, e.uplinkName)
	if err := e.startAgent(ctx, 30*time.Second); err != nil {
		return nil, err
	}
	var alerts *alertWatch
	if len(sc.Agent.Alerts) > 0 {
		w, err := watchAlerts(ctx, e.brokerURL)
		if err != nil {
			return nil, err
		}
		defer w.close()
		alerts = w
	}
	plan, err := e.planFor(sc)
	if err != nil {
		return nil, err
	}
	c := plan.Counts()
	rep.Plan = PlanSummary{Devices: c.Devices, Messages: c.Messages, Readings: c.Readings, Retries: c.Retries, Dead: c.Dead}

	// Publishing and faults stop early on o.Stop; the rest only on ctx.
	runCtx, stopRun := WithStop(ctx, o.Stop)
	defer stopRun()
	started := make(chan time.Time, 1)
	pub := sim.NewPublisher(plan, sim.PublisherConfig{
		Broker: e.brokerURL, ClientPrefix: "edgerig-" + sc.Name,
		OnStart: func(t time.Time) { started <- t },
	})
	fl := &faults{e: e, pub: pub}
	superCtx, stopSuper := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		fl.supervise(superCtx)
	}()
	defer func() {
		stopSuper()
		wg.Wait()
	}()
	// The publisher waits for every acknowledgement, so a broker that goes
	// away for good would hold the run forever: publishing gets a bound.
	limit := o.PublishLimit
	if limit <= 0 {
		limit = 3*sc.Duration + 2*time.Minute
	}
	pubCtx, cancelPub := context.WithTimeout(runCtx, limit)
	defer cancelPub()
	pubErr := make(chan error, 1)
	go func() { pubErr <- pub.Run(pubCtx) }()
	var start time.Time
	select {
	case start = <-started:
	case err := <-pubErr:
		if ctx.Err() == nil && runCtx.Err() != nil {
			return nil, errStoppedEarly
		}
		return nil, fmt.Errorf("rig: publisher: %w", err)
	}
	e.logf("agent up; publishing %d messages", c.Messages)
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		fl.run(runCtx, sc.Faults, sc.Duration, start)
	}()
	perr := <-pubErr
	rep.PublishSeconds = time.Since(start).Seconds()
	<-faultsDone
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	pp := pub.Progress()
	rep.Publisher = PublisherSummary{Published: pp.Published, Acked: pp.Acked, Republished: pp.Republished, Unacked: pub.Unacked()}
	rep.Interrupted = runCtx.Err() != nil
	switch {
	case rep.Interrupted:
		e.proxy.Restore() // an outage cut short ends here
		rep.Failures = append(rep.Failures, fmt.Sprintf("interrupted %.1fs into publishing: this report covers what had arrived; the agent was stopped without time to deliver the rest, which counts as missing", rep.PublishSeconds))
		e.logf("interrupted after %d messages: stopping the agent and reporting what has arrived (Ctrl-C again aborts)", pp.Acked)
	case perr != nil && pubCtx.Err() != nil:
		rep.Failures = append(rep.Failures, fmt.Sprintf("publishing did not finish within %v (the scenario publishes for %v): the broker stopped taking or acknowledging messages", limit, sc.Duration))
	case perr != nil:
		rep.Failures = append(rep.Failures, fmt.Sprintf("publisher: %v", perr))
	}
	if !rep.Interrupted {
		e.logf("published %d messages in %.1fs; waiting for the agent to catch up", pp.Acked, rep.PublishSeconds)
	}

	exp := truth.Compute(plan, pub.Sent(), pub.SentAt(), truthSettings(sc.Agent))
	atLeastOnce := sc.AtLeastOnce() || pp.Republished > 0
	opts := verify.CompareOptions{Gateway: Gateway, Aggregates: sc.Agent.Window.Aggregates, Size: sc.Agent.Window.Size, Slide: sc.Agent.Window.Slide, AtLeastOnce: atLeastOnce}
	// After a publishing timeout nothing more is coming: no settle.
	if !rep.Interrupted && (perr == nil || pubCtx.Err() == nil) {
		settleStart := time.Now()
		res := waitComplete(ctx, e, exp, opts, sc.SettleTimeout)
		rep.SettleSeconds = time.Since(settleStart).Seconds()
		if !res.Settled(opts) && ctx.Err() == nil {
			rep.Failures = append(rep.Failures, fmt.Sprintf("the agent did not deliver every window within settle_timeout %v", sc.SettleTimeout))
		}
		// A quiet period: anything still to come (an extra, a late
		// revision) has time to arrive before the agent is stopped.
		sleepCtx(ctx, max(time.Second, 3*sc.Agent.TriggerInterval))
		if alerts != nil {
			rep.Alerts = waitAlerts(ctx, alerts, exp.Transitions(sc.Agent.Alerts), 10*time.Second)
		}
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	stopSuper()
	wg.Wait()
	st := e.finalStatus(ctx)
	rep.Agent.Usage = e.agent.Usage()
	if e.agent.Running() {
		code, err := e.agent.Terminate(30 * time.Second)
		rep.Agent.FinalExitCode = code
		if err != nil {
			rep.Failures = append(rep.Failures, err.Error())
		} else if code != 0 {
			rep.Failures = append(rep.Failures, fmt.Sprintf("agent exited %d after SIGTERM, want 0", code))
		}
	} else {
		rep.Failures = append(rep.Failures, "agent was not running at the end of the run")
	}
	rep.Agent.Usage = e.agent.Usage()
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	if err := e.verifier.WaitDrained(dctx); err != nil {
		rep.Notes = append(rep.Notes, err.Error())
	}
	cancel()
	rep.Result = e.verifier.Compare(exp, opts)
	rep.Faults = fl.Events()
	finish(rep, e, exp, st, atLeastOnce, fl)
	rep.TotalSeconds = time.Since(e.started).Seconds()
	e.logf("done: %s", rep.Verdict)
	return rep, nil
}

func truthSettings(a scenario.Agent) truth.Settings {
	return truth.Settings{Size: a.Window.Size, Slide: a.Window.Slide, WatermarkDelay: a.Window.WatermarkDelay, AllowedLateness: a.Window.AllowedLateness}
}

// waitComplete polls the verifier until every expected window has its
// final value or timeout passes, and returns the last comparison.
func waitComplete(ctx context.Context, e *env, exp *truth.Expected, o verify.CompareOptions, timeout time.Duration) *verify.Result {
	deadline := time.Now().Add(timeout)
	lastLog := time.Now()
	for {
		res := e.verifier.Compare(exp, o)
		if res.Settled(o) || time.Now().After(deadline) || ctx.Err() != nil {
			return res
		}
		if time.Since(lastLog) > 5*time.Second {
			lastLog = time.Now()
			e.logf("waiting: %d of %d windows correct, %d missing, %d wrong", res.Windows.Correct, res.Windows.Expected, res.Windows.Missing, res.Windows.Wrong)
		}
		sleepCtx(ctx, 200*time.Millisecond) // the verifier's state has no event to wait on
	}
}

// finish fills the counters, agent summary and verdict.
func finish(rep *Report, e *env, exp *truth.Expected, st *agentproc.Status, atLeastOnce bool, fl *faults) {
	// What was sent, which is less than planned when a demo is stopped.
	rep.Plan.Messages, rep.Plan.Readings, rep.Plan.Dead = int(exp.Messages), int(exp.Readings), int(exp.Dead)
	rep.Plan.Retries = rep.Plan.Messages - rep.Plan.Readings - rep.Plan.Dead
	rep.Counters = Counters{Source: "status.json unavailable", Mode: "exact",
		Late: Counter{Expected: exp.Late}, Duplicates: Counter{Expected: exp.Duplicates}, DeadLetters: Counter{Expected: exp.Dead}}
	if atLeastOnce {
		rep.Counters.Mode = "at-least-once"
	}
	if st != nil {
		rep.Counters.Source = "status.json"
		rep.Counters.Late.Observed = ptr(st.Window.LateTotal)
		rep.Counters.Duplicates.Observed = ptr(st.Window.DuplicatesTotal)
		rep.Counters.DeadLetters.Observed = ptr(st.Window.DeadLettersTotal)
	} else {
		// The rig configured the endpoint: an agent that does not serve
		// it cannot be judged on what it counted.
		rep.Failures = append(rep.Failures, "the agent's /status.json did not answer: its late, duplicate and dead-letter counts could not be compared with the truth")
	}
	for name, c := range map[string]Counter{"late": rep.Counters.Late, "duplicates": rep.Counters.Duplicates, "dead letters": rep.Counters.DeadLetters} {
		if !c.ok(atLeastOnce) {
			rep.Failures = append(rep.Failures, fmt.Sprintf("%s counter %d, expected %d (%s)", name, *c.Observed, c.Expected, rep.Counters.Mode))
		}
	}
	if !e.agent.Running() {
		// The counters say how many; the tables, read once the agent has
		// stopped, which.
		tables, err := checkTables(e.dataDir, exp, atLeastOnce)
		if err != nil {
			rep.Failures = append(rep.Failures, err.Error())
		}
		rep.Tables = tables
		if tables != nil {
			for name, t := range map[string]TableResult{"late": tables.Late, "dead-letter": tables.DeadLetters} {
				if t.Missing > 0 || t.Unexpected > 0 {
					rep.Failures = append(rep.Failures, fmt.Sprintf("%s table: %d rows, %d expected: %d missing, %d unexpected (%s)", name, t.Rows, t.Expected, t.Missing, t.Unexpected, rep.Counters.Mode))
				}
			}
		}
	}
	rep.Agent.Starts = e.agent.Starts()
	rep.Agent.Exits = e.agent.Exits()
	rep.Agent.Log = e.agent.LogPath()
	for _, x := range rep.Agent.Exits {
		if !x.Unexpected {
			continue
		}
		if fl != nil && fl.duringDiskFull(x.At) {
			rep.Notes = append(rep.Notes, fmt.Sprintf("the agent exited (code %d) while the disk was full and was restarted", x.Code))
			continue
		}
		rep.Agent.UnexpectedExits++
	}
	if rep.Agent.UnexpectedExits > 0 {
		rep.Failures = append(rep.Failures, fmt.Sprintf("the agent exited on its own %d times (see %s)", rep.Agent.UnexpectedExits, rep.Agent.Log))
	}
	if rep.Publisher.Unacked > 0 {
		rep.Failures = append(rep.Failures, fmt.Sprintf("%d publishes never acknowledged: the truth cannot say whether they count", rep.Publisher.Unacked))
	}
	if e.uplinkMochi != nil {
		if n := e.uplinkMochi.Dropped(); n > 0 {
			rep.Failures = append(rep.Failures, fmt.Sprintf("the uplink broker dropped %d batches before the verifier could take them", n))
		}
	}
	if e.mochi != nil {
		rep.BrokerDropped = e.mochi.Dropped()
		if rep.BrokerDropped > 0 {
			rep.Failures = append(rep.Failures, fmt.Sprintf("the broker dropped %d messages before the agent could take them", rep.BrokerDropped))
		}
	}
	for _, f := range rep.Faults {
		if f.Error != "" {
			rep.Failures = append(rep.Failures, fmt.Sprintf("fault %s: %s", f.Kind, f.Error))
		}
	}
	if r := rep.Result; r != nil && !r.OK() {
		w, p := r.Windows, r.PTime
		rep.Failures = append(rep.Failures, fmt.Sprintf("windows: %d wrong, %d missing, %d extra; ptime series: %d wrong, %d missing, %d extra; %d undecodable batches",
			w.Wrong, w.Missing, w.Extra, p.Wrong, p.Missing, p.Extra, r.Delivery.DecodeErrors))
		if n := r.Delivery.KeyConflicts; n > 0 {
			rep.Failures = append(rep.Failures, fmt.Sprintf("%d aggregates reused an idempotency key with other contents: a receiver that upserts on the key keeps whichever copy it saw first", n))
		}
	}
	if rep.Alerts != nil {
		rep.Failures = append(rep.Failures, rep.Alerts.failures()...)
	}
	slices.Sort(rep.Failures)
	rep.Failures = slices.Compact(rep.Failures)
	rep.Verdict = Pass
	if len(rep.Failures) > 0 {
		rep.Verdict = Fail
	}
}

func ptr(v uint64) *uint64 { return &v }
