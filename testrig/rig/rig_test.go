package rig

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgeagent/edgeagent/config"
	"github.com/edgeagent/edgeagent/testrig/agentproc"
	"github.com/edgeagent/edgeagent/testrig/faultproxy"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
	"github.com/edgeagent/edgeagent/testrig/scenario"
	"github.com/edgeagent/edgeagent/testrig/servers"
	"github.com/edgeagent/edgeagent/testrig/sim"
	"github.com/edgeagent/edgeagent/testrig/verify"
)

// TestAgentConfigIsValid loads what the rig writes with the agent's own
// config package, for every stock scenario, the demo and load mode.
func TestAgentConfigIsValid(t *testing.T) {
	var scs []*scenario.Scenario
	for _, n := range scenario.Names() {
		sc, err := scenario.Lookup(n)
		if err != nil {
			t.Fatal(err)
		}
		scs = append(scs, sc)
	}
	scs = append(scs, demoScenario(36, 0), loadScenario(100, 10*time.Second, 1000, 4, DefaultReadingInterval, ""))
	for _, sc := range scs {
		for _, embedded := range []bool{false, true} {
			ac := agentConfig{DataDir: "/tmp/rig-test/data", Broker: "tcp://127.0.0.1:1883", StatusListen: "127.0.0.1:9464",
				NATS: "nats://127.0.0.1:4222", Agent: sc.Agent}
			if embedded {
				// The embedded variant checks the MQTT uplink too.
				ac.Broker, ac.EmbeddedListen = "", "127.0.0.1:1884"
				ac.setUplink(UplinkMQTT, "tcp://127.0.0.1:1885")
				ac.NATS = ""
			}
			path := filepath.Join(t.TempDir(), "agent.yaml")
			if err := os.WriteFile(path, []byte(ac.render()), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, err := config.Load(path)
			if err != nil {
				t.Fatalf("%s (embedded %v): the agent refuses the rig's config: %v\n%s", sc.Name, embedded, err, ac.render())
			}
			w := cfg.Window
			if time.Duration(w.Size) != sc.Agent.Window.Size || time.Duration(w.WatermarkDelay) != sc.Agent.Window.WatermarkDelay ||
				time.Duration(w.AllowedLateness) != sc.Agent.Window.AllowedLateness || time.Duration(w.IdleTimeout) != sc.Agent.Window.IdleTimeout {
				t.Fatalf("%s: window settings did not survive the round trip: %+v", sc.Name, w)
			}
			if int64(cfg.Ingest.MaxPayloadBytes) != int64(sc.Agent.MaxPayloadBytes) || cfg.GatewayID != Gateway {
				t.Fatalf("%s: ingest or gateway differ", sc.Name)
			}
			if want := map[bool]string{false: "nats", true: "mqtt"}[embedded]; cfg.Uplink.Transport() != want {
				t.Fatalf("%s: uplink %q, want %s", sc.Name, cfg.Uplink.Transport(), want)
			}
			if embedded && cfg.Uplink.MQTT.Topic != "edge/{gateway_id}/aggregates" && cfg.Uplink.MQTT.Topic != UplinkTopic {
				t.Fatalf("%s: uplink topic %q", sc.Name, cfg.Uplink.MQTT.Topic)
			}
			if embedded != (cfg.MQTT.Broker == "embedded") {
				t.Fatalf("%s: broker %q, embedded %v", sc.Name, cfg.MQTT.Broker, embedded)
			}
		}
	}
}

func TestReportTableAndJSON(t *testing.T) {
	obs := uint64(3)
	rep := &Report{Mode: "run", Scenario: "steady", Short: true, Verdict: Fail, Broker: "mochi",
		Failures: []string{"windows: 1 wrong"},
		Plan:     PlanSummary{Devices: 2, Messages: 12345},
		Result: &verify.Result{Windows: verify.WindowCounts{Expected: 10, Received: 10, Correct: 9, Wrong: 1, Revised: 4, RevisionsExpected: 2},
			PTime:    verify.SeriesCounts{Mode: "exact", Expected: 2, Correct: 2},
			Delivery: verify.Delivery{KeyConflicts: 2},
			Problems: []string{"wrong a/t@x: count 1, want 2"}},
		Counters: Counters{Source: "status.json", Mode: "exact", Late: Counter{Expected: 3, Observed: &obs}},
		Faults:   []FaultEvent{{Kind: "disk_full", AtSeconds: 1, Skipped: "cannot mount"}},
	}
	var b bytes.Buffer
	rep.WriteTable(&b)
	out := b.String()
	for _, want := range []string{"edgerig run steady (short): FAIL", "12,345 messages", "wrong 1", "late 3/3",
		"revised 4: sent again with a new value; at least 2 expected", "ptime      series expected 2  correct 2", "as totals, exact",
		"skipped    disk_full: cannot mount", "FAILURE    windows: 1 wrong", "wrong a/t@x", "2 key conflicts"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	if err := rep.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.Verdict != Fail || back.Result.Windows.Wrong != 1 || *back.Counters.Late.Observed != 3 {
		t.Fatalf("JSON round trip lost data: %+v", back)
	}
}

// A load report judges the run against load mode's targets, each at its
// boundary: met at the target, missed past it, and "nothing dropped"
// missed by any failure.
func TestLoadTargets(t *testing.T) {
	base := LoadReport{Devices: TargetDevices, Ceiling: Rate{PerSecond: 1000}, Ingest: Rate{PerSecond: 900},
		Readings: 1e6, CPUSecondsPerMillion: 12, PeakRSSBytes: TargetPeakRSSBytes - 1}
	met := func(l LoadReport) []bool {
		l.judgeTargets()
		var out []bool
		for _, tg := range l.Targets {
			out = append(out, tg.Met)
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		change func(*LoadReport)
		want   []bool
	}{
		{"every target at its boundary", func(*LoadReport) {}, []bool{true, true, true, true}},
		{"ingest under 90%", func(l *LoadReport) { l.Ingest.PerSecond = 899 }, []bool{false, true, true, true}},
		{"CPU over 12 s", func(l *LoadReport) { l.CPUSecondsPerMillion = 12.01 }, []bool{true, false, true, true}},
		{"RSS at 40 MB", func(l *LoadReport) { l.PeakRSSBytes = TargetPeakRSSBytes }, []bool{true, true, false, true}},
		{"a failure", func(l *LoadReport) { l.Failures = []string{"verifier: 0 wrong, 1 missing, 0 extra windows"} }, []bool{true, true, true, false}},
		{"no figures", func(l *LoadReport) { *l = LoadReport{Devices: TargetDevices} }, []bool{false, false, false, true}},
	} {
		l := base
		tc.change(&l)
		if got := met(l); !slices.Equal(got, tc.want) {
			t.Errorf("%s: targets met %v, want %v", tc.name, got, tc.want)
		}
	}
	l := base
	l.PeakRSSBytes, l.PeakRSSLoadBytes, l.Devices = 62_200_000, 52_428_800, 1000
	l.judgeTargets()
	var b bytes.Buffer
	l.WriteTable(&b)
	for _, want := range []string{"targets (set for 10,000 devices; this run has 1,000)", "agent peak RSS < 40 MB", "MISSED  62.2 MB (59.3 MiB)", "met     90%", "59.3 MiB  (50.0 MiB when the load ended)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := l.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back LoadReport
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Targets) != 4 || back.Targets[2].Met || !back.Targets[0].Met {
		t.Fatalf("JSON targets %+v", back.Targets)
	}
}

// TestReportJSONAsDocumented resolves every JSON field docs/testrig.md
// names for the report in a report with every field filled, so the docs
// cannot name fields the JSON does not have.
func TestReportJSONAsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/testrig.md")
	if err != nil {
		t.Fatal(err)
	}
	obs := uint64(1)
	c := Counter{Expected: 1, Observed: &obs}
	rep := &Report{Mode: "run", Scenario: "steady", Description: "d", Verdict: Fail, Failures: []string{"f"}, Notes: []string{"n"}, Uplink: "u",
		Faults:   []FaultEvent{{Kind: "agent_kill", Skipped: "s", Error: "e", Note: "n"}},
		Result:   &verify.Result{Problems: []string{"p"}},
		Counters: Counters{Late: c, Duplicates: c, DeadLetters: c},
		Agent:    AgentSummary{Exits: []agentproc.Exit{{Code: 0, Signal: "killed"}}},
		Alerts:   &AlertResult{Examples: []string{"e"}},
		Tables:   &Tables{}}
	var b bytes.Buffer
	if err := rep.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var root map[string]any
	if err := json.Unmarshal(b.Bytes(), &root); err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), "| line | JSON fields |")
	if !ok {
		t.Fatal("docs/testrig.md has no table headed | line | JSON fields |")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	n := 0
	for _, row := range strings.Split(table, "\n") {
		cols := strings.Split(row, "|")
		if len(cols) < 4 || strings.HasPrefix(cols[1], "---") {
			continue
		}
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(cols[2], -1) {
			for _, path := range expandBraces(m[1]) {
				n++
				if !jsonHas(root, path) {
					t.Errorf("docs/testrig.md names JSON field %s, which the report does not have", path)
				}
			}
		}
	}
	if n < 40 {
		t.Fatalf("found only %d documented fields; did the table's format change?", n)
	}
}

// expandBraces expands "a.{b, c}.d" into "a.b.d" and "a.c.d".
func expandBraces(p string) []string {
	i := strings.Index(p, "{")
	if i < 0 {
		return []string{p}
	}
	j := i + strings.Index(p[i:], "}")
	var out []string
	for _, alt := range strings.Split(p[i+1:j], ",") {
		out = append(out, expandBraces(p[:i]+strings.TrimSpace(alt)+p[j+1:])...)
	}
	return out
}

// jsonHas reports whether a dotted path, with [] for an array's first
// element, names a field of v.
func jsonHas(v any, path string) bool {
	for _, seg := range strings.Split(path, ".") {
		name, array := strings.CutSuffix(seg, "[]")
		m, ok := v.(map[string]any)
		if !ok {
			return false
		}
		if v, ok = m[name]; !ok {
			return false
		}
		if array {
			a, ok := v.([]any)
			if !ok || len(a) == 0 {
				return false
			}
			v = a[0]
		}
	}
	return true
}

// The demo names the link's state in a user's words, not the fault
// proxy's ("forward").
func TestLinkWord(t *testing.T) {
	for m, want := range map[faultproxy.Mode]string{faultproxy.Forward: "up", faultproxy.Cutting: "cut"} {
		if got := linkWord(m); got != want {
			t.Errorf("linkWord(%v) = %q, want %q", m, got, want)
		}
	}
	for _, m := range []faultproxy.Mode{faultproxy.Blackholing, faultproxy.DroppingReplies} {
		if got := linkWord(m); got == "up" || got == m.String() {
			t.Errorf("linkWord(%v) = %q: neither up nor the proxy's own term", m, got)
		}
	}
}

func TestCounterModes(t *testing.T) {
	five := uint64(5)
	c := Counter{Expected: 4, Observed: &five}
	if c.ok(false) || !c.ok(true) {
		t.Fatal("5 observed of 4 expected: wrong when exact, fine at least once")
	}
	if !(Counter{Expected: 4}).ok(false) {
		t.Fatal("an unobserved counter cannot fail a run")
	}
}

// TestFillDisk fills a real small tmpfs, where the machine lets us mount
// one (root); elsewhere the fault injects write errors instead
// (TestDiskFullByWriteErrors), and this test is skipped.
func TestFillDisk(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=4m"); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v): disk_full injects write errors on such machines", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	n, err := fillDisk(dir)
	if err != nil {
		t.Fatal(err)
	}
	if n < 3<<20 {
		t.Fatalf("filled %d bytes of a 4 MiB filesystem", n)
	}
	if err := os.WriteFile(filepath.Join(dir, "more"), make([]byte, 8192), 0o600); err == nil {
		t.Fatal("a write succeeded on the full filesystem")
	}
	if err := os.Remove(filepath.Join(dir, fillName)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "more"), make([]byte, 8192), 0o600); err != nil {
		t.Fatalf("write after freeing the space: %v", err)
	}
}

// clearSession leaves no session for the agent's client id on an external
// broker, so messages queued for an earlier run's agent are gone.
func TestClearSession(t *testing.T) {
	m, err := servers.StartMochi("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	connect := func() paho.Client {
		c := paho.NewClient(paho.NewClientOptions().AddBroker(m.URL()).SetClientID(ClientID).SetCleanSession(false))
		tok := c.Connect()
		if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("connect: %v", tok.Error())
		}
		if tok := c.Subscribe("sensors/+/telemetry", 1, nil); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("subscribe: %v", tok.Error())
		}
		return c
	}
	connect().Disconnect(100)
	pub := paho.NewClient(paho.NewClientOptions().AddBroker(m.URL()).SetClientID("pub"))
	if tok := pub.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publisher: %v", tok.Error())
	}
	defer pub.Disconnect(100)
	if tok := pub.Publish("sensors/d1/telemetry", 1, false, "queued"); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	// The publisher's PUBACK can come before the broker queued the copy
	// for the stopped session: wait for it.
	mqtttest.WaitFor(t, 10*time.Second, "the message queued for the stopped agent's session", func() bool { return m.Pending(ClientID) == 1 })
	if err := clearSession(m.URL(), ClientID); err != nil {
		t.Fatal(err)
	}
	if n := m.Pending(ClientID); n != 0 {
		t.Fatalf("%d messages still queued for %s after clearSession", n, ClientID)
	}
}

// The catch-up banner tells received from correct: with every window in
// and some wrong, it waits for revisions, not for windows.
func TestSettleBanner(t *testing.T) {
	for _, c := range []struct {
		w      verify.WindowCounts
		gaveUp bool
		want   string
	}{
		{verify.WindowCounts{Expected: 384, Correct: 340, Missing: 22, Wrong: 22}, false, "close the last windows (362 of 384 received, 340 correct)"},
		{verify.WindowCounts{Expected: 384, Correct: 362, Wrong: 22}, false, "every expected window arrived (384), 22 with a value that is not final yet"},
		{verify.WindowCounts{Expected: 384, Correct: 384}, false, "settled: every expected window arrived correct (384 of 384)"},
		{verify.WindowCounts{Expected: 384, Correct: 362, Wrong: 22}, true, "gave up waiting after 45s (384 of 384 windows received, 362 correct)"},
	} {
		if got := settleBanner(&verify.Result{Windows: c.w}, c.gaveUp, 45*time.Second); !strings.Contains(got, c.want) {
			t.Errorf("%+v: %q, want it to contain %q", c.w, got, c.want)
		}
	}
}

// A demo without --duration shows devices offline in its first minute,
// not only minutes in (its plan spans a 30-minute horizon).
//
// The demo seeds its plan from the clock; the test takes fixed seeds, since
// for one plan in a few hundred none of the nine devices happens to go
// offline in the first 30 s.
func TestDemoOfflineEarly(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		sc := demoScenario(36, 0)
		sc.Seed = seed
		if err := sc.Validate(); err != nil {
			t.Fatal(err)
		}
		plan, err := sim.NewPlan(sc, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		offline, early := 0, 0
		for _, d := range plan.Devices {
			if d.OfflineUntil == 0 {
				continue
			}
			offline++
			if d.OfflineFrom < 5*time.Second || d.OfflineFrom > time.Minute {
				t.Errorf("seed %d: %s goes offline at %v, want within 5s-1m", seed, d.Name, d.OfflineFrom)
			}
			if d.OfflineFrom <= 30*time.Second {
				early++
			}
		}
		if offline < 6 || early == 0 {
			t.Errorf("seed %d: %d devices go offline, %d of them in the first 30s; want a quarter of 36 and some early", seed, offline, early)
		}
	}
}

// Every fleet size the demo accepts makes a valid scenario with 36
// devices split as before.
func TestDemoFleetSizes(t *testing.T) {
	for n := 3; n <= 40; n++ {
		sc := demoScenario(n, 0)
		if err := sc.Validate(); err != nil {
			t.Fatalf("--devices %d: %v", n, err)
		}
		if got := sc.DeviceCount(); got != n {
			t.Fatalf("--devices %d: %d devices", n, got)
		}
	}
	if g := demoScenario(36, 0).Devices; g[0].Count != 24 || g[1].Count != 8 || g[2].Count != 4 {
		t.Fatalf("36 devices split %d/%d/%d, want 24/8/4", g[0].Count, g[1].Count, g[2].Count)
	}
}

// The live view counts devices offline while they publish, and none once
// publishing is over: they no longer send or buffer anything.
func TestDemoViewOfflineCount(t *testing.T) {
	sc := demoScenario(36, 0)
	sc.Seed = 1
	plan, err := sim.NewPlan(sc, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var at time.Duration
	for _, d := range plan.Devices {
		if d.OfflineUntil > 0 {
			at = d.OfflineFrom + time.Second
			break
		}
	}
	if at == 0 {
		t.Fatal("no device of the demo goes offline")
	}
	if words, n := offlineNow(plan, at, false); n == 0 || words != fmt.Sprintf("%d offline now, buffering", n) {
		t.Errorf("while publishing: %q, %d; want a device offline", words, n)
	}
	if words, n := offlineNow(plan, at, true); n != 0 || words != "done publishing" {
		t.Errorf("while settling: %q, %d; want none offline", words, n)
	}
}

// The load report counts the checkpoints between its two status reads by
// reason, leaves out reasons with none, and says nothing for an agent
// that does not report them.
func TestLoadCheckpointsBetweenStatusReads(t *testing.T) {
	st := func(by map[string]uint64) *agentproc.Status {
		s := &agentproc.Status{}
		s.Window.CheckpointsByReason = by
		return s
	}
	before := st(map[string]uint64{"interval": 2, "delta": 5, "stop": 0})
	after := st(map[string]uint64{"interval": 2, "delta": 17, "stop": 0, "caught_up": 1})
	got := checkpointsBetween(before, after)
	if want := map[string]uint64{"delta": 12, "caught_up": 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("checkpoints %v, want %v", got, want)
	}
	if got := checkpointsBetween(st(nil), after); got != nil {
		t.Fatalf("checkpoints %v from an agent that did not report them before, want none", got)
	}
	l := LoadReport{Devices: TargetDevices, Checkpoints: &Rate{Count: 13, Seconds: 26, PerSecond: 0.5}, CheckpointsByReason: got}
	var b bytes.Buffer
	l.WriteTable(&b)
	if want := "state checkpoints                      0.50 /s  (caught_up 1, delta 12)"; !strings.Contains(b.String(), want) {
		t.Fatalf("table lacks %q:\n%s", want, b.String())
	}
	if reasons(map[string]uint64{}) != "none" {
		t.Fatalf("no checkpoints written as %q, want none", reasons(map[string]uint64{}))
	}
}

// The heap figures are the differences of the runtime's counters between
// the two reads of /metrics, per reading; a read that failed or lacks a
// counter gives none.
func TestLoadHeapBetweenMetricsReads(t *testing.T) {
	m0 := map[string]float64{"go_memstats_alloc_bytes_total": 1e6, "go_memstats_mallocs_total": 5000, "go_gc_duration_seconds_count": 10, "go_gc_cpu_seconds_total": 0.5}
	m1 := map[string]float64{"go_memstats_alloc_bytes_total": 801e6, "go_memstats_mallocs_total": 4_005_000, "go_gc_duration_seconds_count": 410, "go_gc_cpu_seconds_total": 3.5}
	h := heapBetween(m0, m1, 1_000_000, 12)
	if h == nil || h.AllocBytesPerReading != 800 || h.AllocsPerReading != 4 || h.CollectionsPerMillion != 400 || h.CollectorCPUShare != 0.25 {
		t.Fatalf("heap figures %+v, want 800 B, 4 allocations, 400 collections per million, a share of 0.25", h)
	}
	if got := heapBetween(nil, m1, 1_000_000, 12); got != nil {
		t.Fatalf("heap figures %+v from a failed read, want none", got)
	}
	delete(m0, "go_gc_cpu_seconds_total")
	if got := heapBetween(m0, m1, 1_000_000, 12); got != nil {
		t.Fatalf("heap figures %+v without the collector's CPU, want none", got)
	}
	l := LoadReport{Devices: TargetDevices, Heap: h}
	var b bytes.Buffer
	l.WriteTable(&b)
	if want := "agent heap                       800 B, 4.0 allocations per reading; 400 collections per million (the collector 25% of the CPU)"; !strings.Contains(b.String(), want) {
		t.Fatalf("table lacks %q:\n%s", want, b.String())
	}
}
