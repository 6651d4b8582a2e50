package rig

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/edgeagent/edgeagent/testrig/agentproc"
	"github.com/edgeagent/edgeagent/testrig/faultproxy"
	"github.com/edgeagent/edgeagent/testrig/scenario"
	"github.com/edgeagent/edgeagent/testrig/sim"
	"github.com/edgeagent/edgeagent/testrig/truth"
	"github.com/edgeagent/edgeagent/testrig/verify"
)

// DemoOptions configure the demo.
type DemoOptions struct {
	// Agent is the edgeagent binary.
	Agent string
	// Duration stops the demo after this long; 0 runs until Stop.
	Duration time.Duration
	// Stop, when closed, stops the demo as the end of Duration does (the
	// first Ctrl-C): the devices stop, the agent closes its last windows,
	// the summary follows. ctx ending instead aborts at once: the agent
	// and servers are stopped and no summary is made.
	Stop <-chan struct{}
	// Devices is the fleet size (default 36).
	Devices int
	// Dir keeps the data there ("" uses a temporary directory, removed
	// after a passing demo).
	Dir string
	// Out receives the live view and the summary.
	Out io.Writer
	// Uplink is the agent's uplink: UplinkNATS (or "") or UplinkMQTT (an
	// in-process MQTT broker as the cloud).
	Uplink string
}

// demoHorizon is how long a demo without --duration can run: the plan is
// made for it up front.
const demoHorizon = 30 * time.Minute

// demoScenario is the demo's fleet: a few dozen devices of the three
// formats, a quarter of them going offline and flushing a backlog, and a
// link outage every 90 seconds (or one, a third into a timed demo).
func demoScenario(devices int, d time.Duration) *scenario.Scenario {
	if devices < 3 {
		devices = 3
	}
	total := d
	if total == 0 {
		total = demoHorizon
	}
	// Two thirds JSON, two ninths CBOR, the rest plain numbers, and at
	// least one of each: a group of 0 devices is invalid.
	nCBOR := max(1, devices*2/9)
	nNum := max(1, devices-devices*2/3-devices*2/9)
	nJSON := devices - nCBOR - nNum
	sc := &scenario.Scenario{
		Name:        "demo",
		Description: "make demo: the agent's embedded broker between simulated devices and an in-process NATS cloud",
		Seed:        uint64(time.Now().UnixNano()),
		Duration:    total,
		Speed:       30, // a minute of device time every two seconds
		Connections: 4,
		Devices: []scenario.DeviceGroup{
			{Prefix: "sensor", Count: nJSON, Format: scenario.FormatJSON, Interval: 5 * time.Second, Metrics: []string{"temperature", "humidity"}},
			{Prefix: "meter", Count: nCBOR, Format: scenario.FormatCBOR, Interval: 10 * time.Second, Metrics: []string{"power", "voltage"}},
			{Prefix: "tank", Count: nNum, Format: scenario.FormatNumber, Interval: 10 * time.Second, Metrics: []string{"level"}},
		},
		Misbehaviour: scenario.Misbehaviour{
			Offline: &scenario.Offline{Devices: 0.25, Min: 2 * time.Minute, Max: 5 * time.Minute},
		},
		Agent: scenario.Agent{Window: scenario.Window{Size: time.Minute, WatermarkDelay: 10 * time.Second,
			AllowedLateness: 10 * time.Minute, IdleTimeout: 5 * time.Second}},
	}
	if d > 0 {
		sc.Faults = []scenario.Fault{{At: scenario.At{Offset: d / 3}, Kind: scenario.FaultUplinkCut, For: max(5*time.Second, d/4)}}
	} else {
		// Spread over the 30-minute horizon, the offline spells would
		// start minutes in: a new user would watch the first minutes
		// without one. They start in the first minute instead, and last
		// 8-16 s of wall time, so the view shows devices buffering and
		// their backlog flushing (and the idle-closed windows revised)
		// while someone is watching. After that minute the link outages
		// go on; the devices stay online.
		sc.Misbehaviour.Offline.Within = &[2]scenario.At{{Offset: 5 * time.Second}, {Offset: time.Minute}}
		sc.Misbehaviour.Offline.Min, sc.Misbehaviour.Offline.Max = 4*time.Minute, 8*time.Minute
		for at := 20 * time.Second; at < total; at += 90 * time.Second {
			sc.Faults = append(sc.Faults, scenario.Fault{At: scenario.At{Offset: at}, Kind: scenario.FaultUplinkCut, For: 15 * time.Second})
		}
	}
	sc.Normalize()
	return sc
}

// Demo runs the demo: the agent with its embedded broker, simulated
// devices, an in-process NATS JetStream cloud, a link outage, and a live
// view refreshed every second. It stops on Stop or after Duration, lets
// the agent catch up, and returns the verifier's report; ctx ending aborts.
func Demo(ctx context.Context, o DemoOptions) (_ *Report, err error) {
	if o.Devices == 0 {
		o.Devices = 36
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if err := CheckUplink(Options{Uplink: o.Uplink}); err != nil {
		return nil, err
	}
	sc := demoScenario(o.Devices, o.Duration)
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	dir, temp, err := runDir(o.Dir, "edgerig-demo-")
	if err != nil {
		return nil, err
	}
	// No progress writer: its lines come from the fault goroutine, and the
	// view owns o.Out.
	e, err := newEnv(ctx, envConfig{dir: dir, agentBin: o.Agent, agent: sc.Agent, embedded: true, uplink: o.Uplink})
	if err != nil {
		removeTemp(dir, temp)
		return nil, err
	}
	defer e.close()
	defer func() {
		// Aborted (a second Ctrl-C): no report points at the data, so a
		// temporary directory goes with the run.
		if err != nil && ctx.Err() != nil && temp {
			e.close()
			os.RemoveAll(dir)
		}
	}()
	if e.cleared != "" {
		fmt.Fprintln(o.Out, e.cleared)
	}
	cloud := "NATS JetStream on " + e.natsURL
	if e.natsURL == "" {
		cloud = e.uplinkName
	}
	fmt.Fprintf(o.Out, "starting: agent %s, its embedded MQTT broker on %s, the cloud: %s\n", o.Agent, e.brokerURL, cloud)
	if err := e.startAgent(ctx, 30*time.Second); err != nil {
		return nil, err
	}
	plan, err := sim.NewPlan(sc, time.Now())
	if err != nil {
		return nil, err
	}
	rep := &Report{Mode: "demo", Description: sc.Description, Broker: e.brokerName, Uplink: e.uplinkName, RunDir: dir}
	c := plan.Counts()
	rep.Plan = PlanSummary{Devices: c.Devices, Messages: c.Messages, Readings: c.Readings, Retries: c.Retries, Dead: c.Dead}

	// Publishing and faults stop on Stop (Ctrl-C) or after Duration; the
	// catch-up after them stops only when ctx ends (a second Ctrl-C).
	runCtx, stopRun := WithStop(ctx, o.Stop)
	defer stopRun()
	if o.Duration > 0 {
		// From runCtx, so that Ctrl-C still stops the run early.
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(runCtx, o.Duration+2*time.Second)
		defer cancel()
	}
	started := make(chan time.Time, 1)
	pub := sim.NewPublisher(plan, sim.PublisherConfig{Broker: e.brokerURL, ClientPrefix: "edgerig-demo",
		OnStart: func(t time.Time) { started <- t }})
	fl := &faults{e: e, pub: pub}
	pubErr := make(chan error, 1)
	go func() { pubErr <- pub.Run(runCtx) }()
	var start time.Time
	select {
	case start = <-started:
	case err := <-pubErr:
		if ctx.Err() == nil && runCtx.Err() != nil {
			return nil, errStoppedEarly
		}
		return nil, fmt.Errorf("rig: publisher: %w", err)
	}
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		fl.run(runCtx, sc.Faults, sc.Duration, start)
	}()
	view := &liveView{out: o.Out, tty: isTerminal(o.Out), e: e, pub: pub, plan: plan, fl: fl, start: start, total: o.Duration, faults: sc.Faults}
	// One ticker paces the view through publishing and settling alike, so
	// the switch between them draws no second line within the same second.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var perr error
loop:
	for {
		select {
		case perr = <-pubErr:
			break loop
		case <-tick.C:
			view.draw(ctx, "")
		}
	}
	<-faultsDone
	e.proxy.Restore() // an outage cut short by Ctrl-C ends here
	rep.PublishSeconds = time.Since(start).Seconds()
	pp := pub.Progress()
	rep.Publisher = PublisherSummary{Published: pp.Published, Acked: pp.Acked, Republished: pp.Republished, Unacked: pub.Unacked()}
	if perr != nil && runCtx.Err() == nil {
		rep.Failures = append(rep.Failures, fmt.Sprintf("publisher: %v", perr))
	}

	exp := truth.Compute(plan, pub.Sent(), pub.SentAt(), truthSettings(sc.Agent))
	opts := verify.CompareOptions{Gateway: Gateway, Aggregates: sc.Agent.Window.Aggregates, Size: sc.Agent.Window.Size, Slide: sc.Agent.Window.Slide, AtLeastOnce: pp.Republished > 0}
	const settleTimeout = 45 * time.Second
	// The settle ends early only when ctx does (a second Ctrl-C).
	settleCtx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	settleStart := time.Now()
	for done := false; !done; {
		select {
		case <-tick.C:
		case <-settleCtx.Done():
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("rig: demo aborted while the agent caught up: %w", ctx.Err())
		}
		res := e.verifier.Compare(exp, opts)
		banner := settleBanner(res, settleCtx.Err() != nil, settleTimeout)
		done = res.Complete() || settleCtx.Err() != nil
		// The last line is drawn after the verifier settled, so that it
		// agrees with the summary below it. Its status fetch gets ctx:
		// settleCtx may have expired.
		view.draw(ctx, banner)
	}
	tick.Stop()
	rep.SettleSeconds = time.Since(settleStart).Seconds()
	// The final reads get their own time: settleCtx may have expired.
	finalCtx, cancelFinal := context.WithTimeout(ctx, 10*time.Second)
	defer cancelFinal()
	st := e.finalStatus(finalCtx)
	code, err := e.agent.Terminate(30 * time.Second)
	rep.Agent.FinalExitCode = code
	if err != nil {
		rep.Failures = append(rep.Failures, err.Error())
	} else if code != 0 {
		rep.Failures = append(rep.Failures, fmt.Sprintf("agent exited %d after SIGTERM, want 0", code))
	}
	rep.Agent.Usage = e.agent.Usage()
	if err := e.verifier.WaitDrained(finalCtx); err != nil {
		rep.Notes = append(rep.Notes, err.Error())
	}
	rep.Result = e.verifier.Compare(exp, opts)
	rep.Faults = fl.Events()
	finish(rep, e, exp, st, opts.AtLeastOnce, fl)
	rep.TotalSeconds = time.Since(e.started).Seconds()
	e.close()
	if rep.OK() && temp {
		os.RemoveAll(dir)
		rep.RunDir = "" // it no longer exists: naming it would send a reader looking
	}
	fmt.Fprintln(o.Out)
	return rep, nil
}

// settleBanner says where the catch-up after the devices stopped stands.
// Received and correct are told apart: once every window has arrived, what
// is left to wait for is a revision of the wrong ones, not more windows.
func settleBanner(res *verify.Result, gaveUp bool, timeout time.Duration) string {
	w := res.Windows
	got := w.Expected - w.Missing
	switch {
	case res.Complete():
		return fmt.Sprintf("settled: every expected window arrived correct (%s of %s); stopping the agent", num(w.Correct), num(w.Expected))
	case gaveUp:
		return fmt.Sprintf("gave up waiting after %v (%s of %s windows received, %s correct); stopping the agent", timeout, num(got), num(w.Expected), num(w.Correct))
	case w.Missing == 0 && w.Wrong > 0:
		return fmt.Sprintf("stopping: every expected window arrived (%s), %s with a value that is not final yet; waiting for their revisions (%s correct)",
			num(w.Expected), num(w.Wrong), num(w.Correct))
	}
	return fmt.Sprintf("stopping: devices are quiet, so lag grows; waiting for the agent to close the last windows (%s of %s received, %s correct)",
		num(got), num(w.Expected), num(w.Correct))
}

// liveView draws the demo's terminal view.
type liveView struct {
	out    io.Writer
	tty    bool
	e      *env
	pub    *sim.Publisher
	plan   *sim.Plan
	fl     *faults
	start  time.Time
	total  time.Duration
	faults []scenario.Fault

	lastSent uint64
	lastAt   time.Time
}

// offlineNow says how many of plan's devices are offline el into the run
// (buffering their readings), and the view's words for it; none once
// publishing is over (settling), when no device sends or buffers.
func offlineNow(plan *sim.Plan, el time.Duration, settling bool) (string, int) {
	if settling {
		return "done publishing", 0
	}
	offline := 0
	for _, d := range plan.Devices {
		if d.OfflineUntil > 0 && el >= d.OfflineFrom && el < d.OfflineUntil {
			offline++
		}
	}
	return fmt.Sprintf("%d offline now, buffering", offline), offline
}

func (v *liveView) draw(ctx context.Context, banner string) {
	now := time.Now()
	el := now.Sub(v.start)
	pp := v.pub.Progress()
	rate := 0.0
	if !v.lastAt.IsZero() {
		rate = float64(pp.Acked-v.lastSent) / now.Sub(v.lastAt).Seconds()
	}
	v.lastSent, v.lastAt = pp.Acked, now
	devices, offline := offlineNow(v.plan, el, banner != "")
	vp := v.e.verifier.Progress()
	st := v.e.status(ctx)
	var b strings.Builder
	of := ""
	if v.total > 0 && el <= v.total {
		of = " of " + clock(v.total)
	}
	fmt.Fprintf(&b, "edgeagent demo — %s%s   (Ctrl-C stops, the verifier's summary follows; twice aborts)\n\n", clock(el), of)
	fmt.Fprintf(&b, "  devices   %d simulated (JSON, CBOR, plain numbers) on the agent's embedded broker; %s\n", len(v.plan.Devices), devices)
	fmt.Fprintf(&b, "  readings  %s sent (%.0f/s)", num(int(pp.Acked)), rate)
	if st != nil {
		fmt.Fprintf(&b, "   ingested %s   processed %s   lag %.1fs", num(int(st.Ingest.CommittedTotal)), num(int(st.Window.ProcessedTotal)), st.Window.LagSeconds)
	}
	fmt.Fprintln(&b)
	if st != nil {
		fmt.Fprintf(&b, "  agent     open windows %s   late %d   duplicates %d   dead letters %d\n",
			num(int(st.Window.OpenWindows)), st.Window.LateTotal, st.Window.DuplicatesTotal, st.Window.DeadLettersTotal)
		fmt.Fprintf(&b, "  outbox    %s rows, %s, oldest %.1fs\n", num(int(st.Outbox.Rows)), bytesStr(int64(st.Outbox.Bytes)), st.Outbox.OldestAgeSeconds)
		fmt.Fprintf(&b, "  uplink    link %s   agent's connection %s   reconnects %d   sent %s\n",
			linkWord(v.e.proxy.Mode()), linkState(st), st.Uplink.ReconnectsTotal, bytesStr(int64(st.Uplink.BytesSentTotal)))
	} else {
		fmt.Fprintf(&b, "  agent     (status endpoint not answering)\n")
	}
	// Windows and plain-number windows apart, as the summary counts them.
	fmt.Fprintf(&b, "  cloud     %s windows received (%d revised) + %s plain-number windows; %s aggregates in %s batches, %s; last %s ago\n",
		num(vp.Windows-vp.PTimeWindows), vp.Revised, num(vp.PTimeWindows), num(int(vp.Aggregates)), num(int(vp.Messages)), bytesStr(int64(vp.Bytes)), since(vp.LastArrival))
	link := linkWord(v.e.proxy.Mode())
	if link != "up" {
		fmt.Fprintf(&b, "\n  >>> LINK OUTAGE: the link to the cloud is %s — aggregates wait in the outbox, then catch up <<<\n", link)
	}
	if banner != "" {
		fmt.Fprintf(&b, "\n  %s\n", banner)
	}
	if v.tty {
		fmt.Fprint(v.out, "\033[H\033[2J"+b.String())
		return
	}
	// Not a terminal (a log, CI): one line per refresh.
	line := fmt.Sprintf("[%s] sent %s, %d offline, cloud windows %s, link %s", clock(el), num(int(pp.Acked)), offline, num(vp.Windows-vp.PTimeWindows), linkWord(v.e.proxy.Mode()))
	if st != nil {
		line += fmt.Sprintf(", outbox %d, lag %.1fs", st.Outbox.Rows, st.Window.LagSeconds)
	}
	if banner != "" {
		line += " — " + banner
	}
	fmt.Fprintln(v.out, line)
}

// linkWord names the rig's link to the cloud (the fault proxy's mode) in
// a user's words: "forward" is the proxy's term for a working link.
func linkWord(m faultproxy.Mode) string {
	switch m {
	case faultproxy.Forward:
		return "up"
	case faultproxy.Cutting:
		return "cut"
	case faultproxy.Blackholing:
		return "silent (nothing gets through)"
	case faultproxy.DroppingReplies:
		return "losing the cloud's replies"
	}
	return m.String()
}

func linkState(st *agentproc.Status) string {
	if st.Uplink.State == "up" {
		return "up"
	}
	return strings.ToUpper(st.Uplink.State)
}

func clock(d time.Duration) string {
	d = d.Round(time.Second)
	return fmt.Sprintf("%02d:%02d", int(d.Minutes()), int(d.Seconds())%60)
}

func since(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return time.Since(t).Round(100 * time.Millisecond).String()
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
