package testrig_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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
// and fault); CI runs them all, in parallel: each has its own servers and
// directory and mostly waits on its scenario's clock (docs/testrig.md).
func TestScenarios(t *testing.T) {
	for _, name := range scenario.Names() {
		t.Run(name, func(t *testing.T) {
			if testing.Short() && name != "steady" && name != "chaos" {
				t.Skip("-short: steady and chaos only")
			}
			t.Parallel()
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
	t.Parallel()
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

// The demo with the MQTT uplink: an in-process MQTT broker is the cloud.
func TestDemoMQTTUplink(t *testing.T) {
	t.Parallel()
	bin := agent(t)
	var out bytes.Buffer
	rep, err := rig.Demo(context.Background(), rig.DemoOptions{Agent: bin, Duration: 6 * time.Second, Devices: 6, Out: &out, Uplink: rig.UplinkMQTT})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !rep.OK() || rep.Result.Windows.Correct == 0 || !strings.HasPrefix(rep.Uplink, "MQTT") {
		t.Fatalf("demo over the MQTT uplink: %s %v, uplink %q\n%s", rep.Verdict, rep.Failures, rep.Uplink, out.String())
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
// window wrong and the counters off the second time), and must not send
// batches JetStream takes for the first run's.
func TestReuseDirAndStream(t *testing.T) {
	t.Parallel()
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
			// The seed of its own keeps run 2's batches from repeating run
			// 1's ids, which JetStream would drop as duplicates (a CI run
			// lost 4 of 24 windows so).
			for _, want := range []string{"removed the previous run's data", "the verifier reads only what comes after",
				"instead of the scenario's 7, so that no batch repeats an earlier run's"} {
				if !bytes.Contains(progress.Bytes(), []byte(want)) {
					t.Errorf("run 2's progress does not say %q", want)
				}
			}
		}
	}
}

// trigger is a progress or view writer that calls a function once when a
// line containing a given text has been written.
type trigger struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	when map[string]func()
}

func (w *trigger) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for text, f := range w.when {
		if strings.Contains(w.buf.String(), text) {
			delete(w.when, text)
			f()
		}
	}
	return len(p), nil
}

func (w *trigger) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// A run stopped (the first Ctrl-C) while publishing reports what had
// arrived, marked interrupted, instead of a bare "context canceled".
func TestRunStopped(t *testing.T) {
	bin := agent(t)
	sc, err := scenario.Parse("reuse", []byte(strings.Replace(reuse, "duration: 3s", "duration: 60s", 1)))
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	progress := &trigger{when: map[string]func(){"agent up; publishing": func() { close(stop) }}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := rig.Run(ctx, rig.Options{Agent: bin, Scenario: sc, Dir: t.TempDir(), Progress: progress, Stop: stop})
	if err != nil {
		t.Fatalf("%v\n%s", err, progress)
	}
	var b bytes.Buffer
	rep.WriteTable(&b)
	t.Logf("\n%s%s", progress, b.String())
	if !rep.Interrupted || rep.OK() || rep.PublishSeconds > 30 {
		t.Fatalf("interrupted %v, verdict %s, %.1fs publishing: want an interrupted FAIL well before the 60s end", rep.Interrupted, rep.Verdict, rep.PublishSeconds)
	}
	if !strings.Contains(b.String(), "(interrupted: a partial report)") || !strings.Contains(b.String(), "interrupted") {
		t.Fatalf("the table does not say the run was interrupted:\n%s", b.String())
	}
}

// A demo stopped (the first Ctrl-C) goes on to the catch-up; a second
// Ctrl-C (ctx ending) aborts it there at once.
func TestDemoAbortedWhileSettling(t *testing.T) {
	bin := agent(t)
	ctx, abort := context.WithCancel(context.Background())
	defer abort()
	stop := make(chan struct{})
	out := &trigger{when: map[string]func(){
		"] sent":    func() { close(stop) },
		"stopping:": abort,
	}}
	// Its temporary data directory goes with an aborted run.
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	begun := time.Now()
	_, err := rig.Demo(ctx, rig.DemoOptions{Agent: bin, Devices: 6, Out: out, Stop: stop})
	t.Logf("%v\n%s", err, out)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("demo returned %v, want an abort", err)
	}
	if d := time.Since(begun); d > 30*time.Second {
		t.Fatalf("the abort took %v", d)
	}
	if left, err := filepath.Glob(filepath.Join(tmp, "edgerig-demo-*")); err != nil || len(left) > 0 {
		t.Fatalf("the aborted demo left %v behind (%v)", left, err)
	}
}

// A demo run with --duration still stops on the first Ctrl-C: publishing
// ends there and the catch-up and summary follow (the duration's timer
// had replaced the stop).
func TestDemoStoppedBeforeItsDuration(t *testing.T) {
	t.Parallel()
	bin := agent(t)
	stop := make(chan struct{})
	out := &trigger{when: map[string]func(){"] sent": func() { close(stop) }}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := rig.Demo(ctx, rig.DemoOptions{Agent: bin, Duration: 10 * time.Minute, Devices: 6, Out: out, Stop: stop, Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	if rep.PublishSeconds > 60 {
		t.Fatalf("publishing went on for %.0f s after the stop", rep.PublishSeconds)
	}
	if !rep.OK() {
		t.Fatalf("demo stopped early: %s %v\n%s", rep.Verdict, rep.Failures, out)
	}
}

// A device broker that goes away for good fails the run once publishing
// passes its bound, instead of holding it forever.
func TestRunBoundsPublishing(t *testing.T) {
	t.Parallel()
	bin := agent(t)
	sc, err := scenario.Parse("reuse", []byte(reuse))
	if err != nil {
		t.Fatal(err)
	}
	m, err := servers.StartMochi("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	progress := &trigger{when: map[string]func(){"agent up; publishing": func() { m.Close() }}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := rig.Run(ctx, rig.Options{Agent: bin, Scenario: sc, Dir: t.TempDir(), MQTT: m.URL(), Progress: progress, PublishLimit: 4 * time.Second})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, progress)
	}
	if rep.OK() || !slices.ContainsFunc(rep.Failures, func(f string) bool { return strings.Contains(f, "publishing did not finish within 4s") }) {
		t.Fatalf("run with the broker gone: %s %v\n%s", rep.Verdict, rep.Failures, progress)
	}
}

const diskFull = `
name: disk-full-write-errors
description: a steady fleet through a span of injected write errors
seed: 3
duration: 8s
speed: 120
connections: 4
devices:
  - {prefix: th, count: 16, format: json, interval: 10s, metrics: [temperature, humidity]}
  - {prefix: nm, count: 4, format: number, interval: 20s, metrics: [level]}
faults:
  - {at: 25%, kind: disk_full, for: 3s}
agent:
  window: {size: 1m, watermark_delay: 10s, allowed_lateness: 10m, idle_timeout: 3s}
`

// TestDiskFullByWriteErrors runs disk_full the way a machine that cannot
// mount a tmpfs does (--disk-full write-errors): the real agent's writes
// to its data files fail with EFBIG for the span, it says so in its log,
// and every window still arrives right after upsert.
func TestDiskFullByWriteErrors(t *testing.T) {
	t.Parallel()
	sc, err := scenario.Parse("disk-full-write-errors", []byte(diskFull))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	rep, err := rig.Run(ctx, rig.Options{Agent: agent(t), Scenario: sc, Dir: dir, Keep: true,
		DiskFull: rig.DiskFullWriteErrors, Progress: logWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	rep.WriteTable(&b)
	t.Log("\n" + b.String())
	w := rep.Result.Windows
	if !rep.OK() || w.Expected == 0 || w.Correct != w.Expected {
		t.Fatalf("verdict %s %v, windows %+v", rep.Verdict, rep.Failures, w)
	}
	if len(rep.Faults) != 1 || rep.Faults[0].Skipped != "" || rep.Faults[0].Error != "" ||
		!strings.Contains(rep.Faults[0].Note, "injected write errors") {
		t.Fatalf("fault events %+v: want one disk_full by injected write errors", rep.Faults)
	}
	log, err := os.ReadFile(filepath.Join(dir, "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(log, []byte("file too large")) {
		t.Fatalf("the agent never logged a failed write (EFBIG):\n%s", log)
	}
}
