package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/cmd/edgeagent/status"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
	"github.com/edgeagent/edgeagent/testrig/natstest"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// replay after a config fix turns dead letters into data and re-sends
// windows as higher revisions; a window-size change is refused until
// reset-state, after which the run rebuilds correct windows from Bronze.
func TestReplayAndResetState(t *testing.T) {
	nats := natstest.Start(t)
	dir := t.TempDir()
	mqttAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	config := func(metrics, size string) string {
		return writeConfig(t, dir, embeddedAgentConfig("maint-gw", dir, mqttAddr)+fmt.Sprintf(`
status: {listen: ""}
readings: {metrics: [%s]}
window: {size: %s, watermark_delay: 0s, allowed_lateness: 0s, idle_timeout: 1h}
processing: {trigger_interval: 100ms}
local_publish: {aggregates_topic: "local/{gateway_id}/{device}/{metric}"}
uplink:
  nats: {url: "%s", subject: "edge.{gateway_id}.aggregates", stream: EDGE, create_stream: true}
`, metrics, size, nats.URL()))
	}
	type key struct {
		metric     string
		start, end int64
	}
	// latest upserts the stream by window identity, keeping the highest rev.
	latest := func() map[key]wire.Aggregate {
		got := map[key]wire.Aggregate{}
		for _, m := range natstest.StreamMessages(t, nats.URL(), "EDGE") {
			b, err := wire.DecodeBatch(m.Data, m.Header.Get("Content-Encoding"))
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range b.Aggregates {
				k := key{a.Metric, a.Start, a.End}
				if a.Rev > got[k].Rev {
					got[k] = a
				}
			}
		}
		return got
	}
	base := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC).UnixMilli()

	cfgPath := config("temperature", "1m")
	p := startAgent(t, "run", "-c", cfgPath)
	p.waitLog(t, "embedded broker listening")
	pub := mqtttest.NewPublisher(t, "tcp://"+mqttAddr, "d1")
	for m := 0; m < 4; m++ {
		for i := 0; i < 3; i++ {
			pub.Publish(t, "sensors/d1/telemetry", 1, fmt.Appendf(nil, `{"id":"%d-%d","ts":%d,"temperature":%d}`, m, i, base+int64(m)*60_000+int64(i)*1000, 10*m+i))
		}
	}
	// Only "temp": no configured metric, so a dead letter until the fix.
	pub.Publish(t, "sensors/d1/telemetry", 1, fmt.Appendf(nil, `{"id":"t","ts":%d,"temp":99}`, base+30_000))
	pub.Publish(t, "sensors/d1/telemetry", 1, fmt.Appendf(nil, `{"id":"close","ts":%d,"temperature":0}`, base+5*60_000))
	mqtttest.WaitFor(t, 30*time.Second, "four one-minute windows", func() bool { return len(latest()) >= 4 })
	p.stop(t)
	before := latest()
	if a := before[key{"temperature", base, base + 60_000}]; a.Count != 3 || *a.Sum != 3 {
		t.Fatalf("minute 0 before replay: %+v", a)
	}

	// Fix the config, replay the range, run: the dead letter now counts and
	// every window comes again with a higher revision.
	cfgPath = config("temperature, temp", "1m")
	out, err := exec.Command(agentBin, "replay", "-c", cfgPath, "--from", time.UnixMilli(base).UTC().Format(time.RFC3339), "--to", time.UnixMilli(base+4*60_000).UTC().Format(time.RFC3339)).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Replayed") {
		t.Fatalf("replay: %v\n%s", err, out)
	}
	// run --once delivers what the replay emitted before it exits, and says
	// so when it cannot: with the uplink unreachable it exits 1 and keeps
	// the outbox for the next run. The local copies of the aggregates wait
	// for the agent's next run (the built-in broker does not run here) and
	// do not count as undelivered.
	cfgData, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	deadPath := filepath.Join(dir, "dead-uplink.yaml")
	dead := strings.Replace(string(cfgData), nats.URL(), fmt.Sprintf("nats://127.0.0.1:%d", mqtttest.FreePort(t)), 1)
	if err := os.WriteFile(deadPath, []byte(dead), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(agentBin, "run", "-c", deadPath, "--once").CombinedOutput()
	if exitCode(err) != exitFail || !strings.Contains(string(out), "outbox not delivered") || !strings.Contains(string(out), "stay in the outbox for the next run") {
		t.Fatalf("run --once with the uplink unreachable: %v\n%s", err, out)
	}
	if _, ok := latest()[key{"temp", base, base + 60_000}]; ok {
		t.Fatalf("the replayed window reached the stream through an unreachable uplink")
	}
	out, err = exec.Command(agentBin, "run", "-c", cfgPath, "--once").CombinedOutput()
	if err != nil {
		t.Fatalf("run --once: %v\n%s", err, out)
	}
	if a, ok := latest()[key{"temp", base, base + 60_000}]; !ok || a.Count != 1 {
		t.Fatalf("after run --once the replayed window is not in the stream: %+v (found %v)\n%s", a, ok, out)
	}
	after := latest()
	for k, old := range before {
		if a := after[k]; a.Rev <= old.Rev || a.Count != old.Count || *a.Sum != *old.Sum {
			t.Errorf("window %v after replay: rev %d (was %d), count %d sum %v (were %d %v)", k, a.Rev, old.Rev, a.Count, *a.Sum, old.Count, *old.Sum)
		}
	}

	// A window-size change is refused, with the recovery command named.
	cfgPath = config("temperature, temp", "2m")
	out, err = exec.Command(agentBin, "run", "-c", cfgPath).CombinedOutput()
	if exitCode(err) != exitConfig || !strings.Contains(string(out), "window.size changed") || !strings.Contains(string(out), "edgeagent reset-state -c "+cfgPath+"`") {
		t.Fatalf("run after a window-size change: %v\n%s", err, out)
	}
	// replay under that config is refused the same way: its two-minute
	// windows would overwrite the one-minute windows of the same starts.
	out, err = exec.Command(agentBin, "replay", "-c", cfgPath, "--from", time.UnixMilli(base).UTC().Format(time.RFC3339), "--to", time.UnixMilli(base+4*60_000).UTC().Format(time.RFC3339)).CombinedOutput()
	if exitCode(err) != exitConfig || !strings.Contains(string(out), "window.size changed") || !strings.Contains(string(out), "edgeagent reset-state -c "+cfgPath) {
		t.Fatalf("replay after a window-size change: %v\n%s", err, out)
	}
	// The command as the refusal names it, no confirmation flag.
	if out, err := exec.Command(agentBin, "reset-state", "-c", cfgPath).CombinedOutput(); err != nil || !strings.Contains(string(out), "Window state reset") {
		t.Fatalf("reset-state: %v\n%s", err, out)
	}
	p = startAgent(t, "run", "-c", cfgPath)
	want := map[int64]float64{0: 6, 2: 6} // two-minute windows [0,2) and [2,4), three readings a minute
	mqtttest.WaitFor(t, 30*time.Second, "two-minute windows after reset", func() bool {
		got := latest()
		for m, n := range want {
			a, ok := got[key{"temperature", base + m*60_000, base + (m+2)*60_000}]
			if !ok || float64(a.Count) != n {
				return false
			}
		}
		return true
	})
	p.stop(t)
	maxOld := uint32(0)
	for _, a := range after {
		maxOld = max(maxOld, a.Rev)
	}
	for m := range want {
		if a := latest()[key{"temperature", base + m*60_000, base + (m+2)*60_000}]; a.Rev <= maxOld || *a.Sum != float64(60*m+36) {
			t.Errorf("2m window at minute %d: rev %d (must exceed %d), sum %v", m, a.Rev, maxOld, *a.Sum)
		}
	}
}

// A lost bronze.db (deleted, or restored from an older copy) leaves the
// window stage's offset past the new log's end: the agent says so, and new
// records are numbered after the offset, so they are windowed instead of
// being taken for processed ones.
func TestLostBronzeContinuesAfterTheOffset(t *testing.T) {
	dir := t.TempDir()
	mqttAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	statusAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	cfgPath := writeConfig(t, dir, embeddedAgentConfig("lost-gw", dir, mqttAddr)+fmt.Sprintf(`
status: {listen: "%s"}
processing: {trigger_interval: 50ms}
`, statusAddr))
	readings := func() uint64 {
		var snap status.Snapshot
		if err := json.Unmarshal([]byte(httpGet(t, "http://"+statusAddr+"/status.json", 200)), &snap); err != nil {
			t.Fatal(err)
		}
		return snap.Window.ReadingsTotal
	}
	publish := func(dev string, n int) {
		pub := mqtttest.NewPublisher(t, "tcp://"+mqttAddr, dev)
		for i := range n {
			pub.Publish(t, "sensors/"+dev+"/telemetry", 1, fmt.Appendf(nil, `{"id":"%s-%d","ts":%d,"v":%d}`, dev, i, time.Now().UnixMilli(), i))
		}
	}

	p := startAgent(t, "run", "-c", cfgPath)
	p.waitLog(t, "embedded broker listening")
	publish("press-1", 30)
	mqtttest.WaitFor(t, 20*time.Second, "30 readings processed", func() bool { return readings() == 30 })
	p.stop(t)

	if err := os.Remove(filepath.Join(dir, "data", "bronze.db")); err != nil {
		t.Fatal(err)
	}
	p = startAgent(t, "run", "-c", cfgPath)
	p.waitLog(t, "embedded broker listening")
	if !strings.Contains(p.logs.String(), "the log ends before the window stage's offset") {
		t.Errorf("no warning about the lost log:\n%s", p.logs)
	}
	publish("press-2", 10)
	mqtttest.WaitFor(t, 20*time.Second, "the new device's readings processed", func() bool { return readings() == 40 })
	p.stop(t)

	// After a crash the outputs are written past the last checkpoint: new
	// records must come after those, or their own outputs (here a dead
	// letter) are taken for written during the catch-up.
	cfg2 := writeConfig(t, dir, embeddedAgentConfig("lost-gw", dir, mqttAddr)+fmt.Sprintf(`
status: {listen: "%s"}
processing: {trigger_interval: 50ms, checkpoint_interval: 1h}
`, statusAddr))
	p = startAgent(t, "run", "-c", cfg2)
	p.waitLog(t, "embedded broker listening")
	publish("press-3", 20)
	mqtttest.WaitFor(t, 20*time.Second, "press-3 processed", func() bool { return readings() == 60 })
	p.kill()
	if err := os.Remove(filepath.Join(dir, "data", "bronze.db")); err != nil {
		t.Fatal(err)
	}
	p = startAgent(t, "run", "-c", cfg2)
	p.waitLog(t, "embedded broker listening")
	pub := mqtttest.NewPublisher(t, "tcp://"+mqttAddr, "press-4")
	pub.Publish(t, "sensors/press-4/telemetry", 1, []byte(`{"id":"x","ts":"not a time","v":1}`))
	mqtttest.WaitFor(t, 20*time.Second, "the new record's dead letter written", func() bool {
		out, err := exec.Command(agentBin, "inspect", "deadletter", "-c", cfg2, "--json").Output()
		return err == nil && strings.Contains(string(out), "press-4")
	})
	p.stop(t)
}

// A damaged data file stops the agent with the file named and the step
// that recovers (exit 3: a restart cannot fix it), never a panic; with the
// file moved aside as told, the agent runs and windows new readings.
func TestDamagedDataFiles(t *testing.T) {
	dir := t.TempDir()
	mqttAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	cfgPath := writeConfig(t, dir, embeddedAgentConfig("damaged-gw", dir, mqttAddr)+"\nstatus: {listen: \"\"}\n")
	p := startAgent(t, "run", "-c", cfgPath)
	p.waitLog(t, "embedded broker listening")
	pub := mqtttest.NewPublisher(t, "tcp://"+mqttAddr, "press-1")
	for i := range 200 {
		pub.Publish(t, "sensors/press-1/telemetry", 1, fmt.Appendf(nil, `{"id":"%d","ts":%d,"v":%d}`, i, time.Now().UnixMilli(), i))
	}
	p.stop(t)

	rng := rand.New(rand.NewPCG(1, 2))
	for _, file := range []string{"bronze.db", "state.db"} {
		path := filepath.Join(dir, "data", file)
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		junk := make([]byte, 14*4096)
		for i := range junk {
			junk[i] = byte(rng.Uint32())
		}
		// Pages 2 to 15: the meta pages survive, the tree does not.
		if _, err := f.WriteAt(junk, 2*4096); err != nil {
			t.Fatal(err)
		}
		if file == "state.db" {
			// And the meta pages: bbolt refuses the file outright.
			if _, err := f.WriteAt(junk[:2*4096], 0); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(agentBin, "run", "-c", cfgPath).CombinedOutput()
		if exitCode(err) != exitConfig || !strings.Contains(string(out), path+" is damaged") ||
			!strings.Contains(string(out), "mv "+path+" "+path+".damaged") || strings.Contains(string(out), "panic") {
			t.Fatalf("run with a damaged %s: %v\n%s", file, err, out)
		}
		// reset-state stops too: with Bronze damaged it would drop the state
		// and leave nothing to rebuild it from.
		out, err = exec.Command(agentBin, "reset-state", "-c", cfgPath).CombinedOutput()
		if exitCode(err) != exitConfig || !strings.Contains(string(out), path+" is damaged") || strings.Contains(string(out), "Stop the agent") {
			t.Errorf("reset-state with a damaged %s: %v\n%s", file, err, out)
		}
		// The other commands that read the files exit as run does.
		table := map[string]string{"state.db": "late", "bronze.db": "bronze"}[file]
		for _, args := range [][]string{{"replay", "-c", cfgPath, "--from", "2026-11-28", "--to", "2026-11-29"}, {"inspect", table, "-c", cfgPath}} {
			out, err = exec.Command(agentBin, args...).CombinedOutput()
			if exitCode(err) != exitConfig || !strings.Contains(string(out), path+" is damaged") {
				t.Errorf("%s with a damaged %s: %v\n%s", args[0], file, err, out)
			}
		}
		if err := os.Rename(path, path+".damaged"); err != nil {
			t.Fatal(err)
		}
	}
	p = startAgent(t, "run", "-c", cfgPath)
	p.waitLog(t, "embedded broker listening")
	p.stop(t)
}

// Window rows bbolt reads but the stage cannot decode stop the agent with
// exit 3 and reset-state, which rebuilds the window state from Bronze and
// keeps the outbox (an audit: exit 1, no next step, and systemd restarting
// it into the same error); after reset-state the agent runs.
func TestCorruptWindowRows(t *testing.T) {
	dir := t.TempDir()
	mqttAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	cfgPath := writeConfig(t, dir, embeddedAgentConfig("corrupt-gw", dir, mqttAddr)+"\nstatus: {listen: \"\"}\n")
	p := startAgent(t, "run", "-c", cfgPath)
	p.waitLog(t, "embedded broker listening")
	pub := mqtttest.NewPublisher(t, "tcp://"+mqttAddr, "press-1")
	pub.Publish(t, "sensors/press-1/telemetry", 1, fmt.Appendf(nil, `{"id":"1","ts":%d,"v":1}`, time.Now().UnixMilli()))
	p.stop(t)

	statePath := filepath.Join(dir, "data", "state.db")
	db, err := bolt.Open(statePath, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte("window_groups"))
		if err != nil {
			return err
		}
		return b.Put([]byte{0xff}, []byte("not a group row"))
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(agentBin, "run", "-c", cfgPath).CombinedOutput()
	if exitCode(err) != exitConfig || !strings.Contains(string(out), "the window state in "+statePath+" is damaged") ||
		!strings.Contains(string(out), "edgeagent reset-state -c "+cfgPath) {
		t.Fatalf("run with a corrupt window row: %v, want exit 3 and reset-state\n%s", err, out)
	}
	if out, err := exec.Command(agentBin, "reset-state", "-c", cfgPath).CombinedOutput(); err != nil {
		t.Fatalf("reset-state: %v\n%s", err, out)
	}
	p = startAgent(t, "run", "-c", cfgPath)
	p.waitLog(t, "embedded broker listening")
	p.stop(t)
}

// run --once without an uplink processes Bronze and exits 0, the
// aggregates kept in the outbox; changing window.aggregates afterwards is
// refused like a window size, with exit 3, the change and reset-state, and
// after reset-state the same config runs.
func TestRunOnceWithoutUplinkThenAggregatesChange(t *testing.T) {
	dir := t.TempDir()
	mqttAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	config := func(aggregates string) string {
		return writeConfig(t, dir, embeddedAgentConfig("once-gw", dir, mqttAddr)+fmt.Sprintf(`
status: {listen: ""}
readings: {metrics: [temperature]}
window: {size: 1m, aggregates: [%s], watermark_delay: 0s, allowed_lateness: 0s, idle_timeout: 1h}
`, aggregates))
	}
	cfgPath := config("count, mean")
	p := startAgent(t, "run", "-c", cfgPath)
	p.waitLog(t, "embedded broker listening")
	pub := mqtttest.NewPublisher(t, "tcp://"+mqttAddr, "d1")
	base := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC).UnixMilli()
	for i := range 4 {
		pub.Publish(t, "sensors/d1/telemetry", 1, fmt.Appendf(nil, `{"id":"%d","ts":%d,"temperature":%d}`, i, base+int64(i)*30_000, 20+i))
	}
	p.stop(t)

	out, err := exec.Command(agentBin, "run", "-c", cfgPath, "--once").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "no uplink configured") {
		t.Fatalf("run --once without an uplink: %v, want exit 0 and the outbox kept\n%s", err, out)
	}
	out, err = exec.Command(agentBin, "inspect", "outbox", "-c", cfgPath).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "d1") {
		t.Fatalf("inspect outbox after run --once: %v, want d1's aggregates\n%s", err, out)
	}

	changed := config("count, max")
	out, err = exec.Command(agentBin, "run", "-c", changed, "--once").CombinedOutput()
	if exitCode(err) != exitConfig || !strings.Contains(string(out), "window.aggregates changed from count,mean to count,max") ||
		!strings.Contains(string(out), "edgeagent reset-state -c "+changed) {
		t.Fatalf("run --once with other aggregates: %v, want exit %d naming the change and reset-state\n%s", err, exitConfig, out)
	}
	if out, err := exec.Command(agentBin, "reset-state", "-c", changed).CombinedOutput(); err != nil {
		t.Fatalf("reset-state: %v\n%s", err, out)
	}
	if out, err := exec.Command(agentBin, "run", "-c", changed, "--once").CombinedOutput(); err != nil {
		t.Fatalf("run --once after reset-state: %v\n%s", err, out)
	}
}

// Batches an earlier run sealed but could not deliver (no stream took
// them) are what run --once must deliver, or exit 1 over: it used to ask
// the uplink how many there were before the uplink had loaded them, saw
// none, and exited 0 at once with everything still in the outbox (found by
// a walkthrough of the README).
func TestRunOnceDeliversBatchesAnEarlierRunSealed(t *testing.T) {
	dir := t.TempDir()
	mqttAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	statusAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	nats := natstest.Start(t)
	config := func(createStream bool) string {
		return writeConfig(t, dir, embeddedAgentConfig("sealed-gw", dir, mqttAddr)+fmt.Sprintf(`
status: {listen: %q}
readings: {metrics: [temperature]}
window: {size: 1m, watermark_delay: 0s, allowed_lateness: 0s, idle_timeout: 1h}
processing: {trigger_interval: 100ms}
uplink:
  nats: {url: %q, subject: "edge.{gateway_id}.aggregates", stream: EDGE, create_stream: %v}
  ack_timeout: 1s
`, statusAddr, nats.URL(), createStream))
	}
	// No stream captures the subject yet: the batches are sealed, sent and
	// never acknowledged.
	cfgPath := config(false)
	p := startAgent(t, "run", "-c", cfgPath)
	p.waitLog(t, "status endpoint listening")
	pub := mqtttest.NewPublisher(t, "tcp://"+mqttAddr, "d1")
	base := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC).UnixMilli()
	for m := range 4 {
		pub.Publish(t, "sensors/d1/telemetry", 1, fmt.Appendf(nil, `{"id":"%d","ts":%d,"temperature":%d}`, m, base+int64(m)*60_000, 20+m))
	}
	mqtttest.WaitFor(t, 30*time.Second, "sealed batches nobody acknowledged", func() bool {
		return !strings.Contains(httpGet(t, "http://"+statusAddr+"/status.json", 200), `"sealed_batches": 0,`)
	})
	p.stop(t)

	out, err := exec.Command(agentBin, "run", "-c", config(true), "--once").CombinedOutput()
	if err != nil {
		t.Fatalf("run --once with a stream for the subject: %v\n%s", err, out)
	}
	var got int
	for _, m := range natstest.StreamMessages(t, nats.URL(), "EDGE") {
		b, err := wire.DecodeBatch(m.Data, m.Header.Get("Content-Encoding"))
		if err != nil {
			t.Fatal(err)
		}
		got += len(b.Aggregates)
	}
	if got != 3 {
		t.Fatalf("the stream holds %d aggregates after run --once, want the 3 windows the first run sealed\n%s", got, out)
	}
}
