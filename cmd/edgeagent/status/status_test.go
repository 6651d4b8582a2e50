package status

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeSource stands in for the agent: the status server is what is tested.
type fakeSource struct {
	mu    sync.Mutex
	snap  Snapshot
	ready bool
	why   string
}

func (f *fakeSource) Snapshot() Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snap
}

func (f *fakeSource) Ready() (bool, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ready, f.why
}

func (f *fakeSource) Inspect(table string, q Query) (any, error) {
	if table != "late" {
		return nil, ErrUnknownTable
	}
	if q.Reason != "" {
		return nil, ErrBadQuery
	}
	return []map[string]any{{"device": q.Device, "limit": q.Limit}}, nil
}

func (f *fakeSource) Config() []byte { return []byte("gateway_id: gw-7\nmqtt:\n  password: '***'\n") }

func sampleSnapshot() Snapshot {
	return Snapshot{
		Gateway: "gw-7", Version: "1.2.3", Time: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC), UptimeSeconds: 3600,
		Ingest: Ingest{Broker: "tcp://127.0.0.1:1883", Connected: true, ReceivedTotal: 12345, Rejected: map[string]uint64{"payload_too_large": 2}, BrokerDropped: 6},
		Bronze: Bronze{Records: 5000, Bytes: 900 << 20, MaxBytes: 1 << 30, BacklogRecords: 4321, UnprocessedBytes: 880 << 20},
		Window: Window{LoggedClock: time.Date(2026, 11, 29, 12, 0, 1, 500e6, time.UTC), LatestEventTime: time.Date(2026, 11, 29, 11, 59, 59, 0, time.UTC), ProcessedTotal: 8024, OpenWindows: 40000, EvictedWindows: 36000, LagSeconds: 2.5, LastBatchSeconds: 1.5, TriggerIntervalSeconds: 1,
			CheckpointsByReason: map[string]uint64{"interval": 4, "delta": 9},
			DeadLettersTotal:    3, DeadLettersByReason: map[string]uint64{"not_json": 3}, LateTotal: 7, DuplicatesTotal: 11, Tombstones: 24500},
		Outbox: Outbox{Rows: 77, Bytes: 250 << 20, MaxBytes: 256 << 20, OldestAge: 30},
		Uplink: Uplink{Transport: "nats", State: "down", Since: time.Date(2026, 11, 29, 11, 59, 58, 0, time.UTC),
			DownSince: time.Date(2026, 11, 29, 11, 0, 0, 0, time.UTC), FailingSince: time.Date(2026, 11, 29, 11, 58, 0, 0, time.UTC)},
		DeadLetters: []DeadLetter{{Seq: 9, Topic: "sensors/d1/telemetry", Code: "not_json", Reason: "payload is not JSON: <oops>", Payload: "<oops>"}},
	}
}

func startServer(t *testing.T, cfg Config, src Source) *Server {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	s, err := New(cfg, src)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func get(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Every line of /metrics is a comment or "name{labels} value" with a
// Prometheus-legal name, and each family has one TYPE line.
func TestMetricsExposition(t *testing.T) {
	src := &fakeSource{snap: sampleSnapshot(), ready: true}
	s := startServer(t, Config{TriggerInterval: time.Second}, src)
	code, body := get(t, "http://"+s.Addr()+"/metrics", "")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	line := regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})? -?[0-9.eE+-]+(NaN|Inf)?$`)
	types := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "# TYPE ") {
			types[strings.Fields(l)[2]]++
			continue
		}
		if strings.HasPrefix(l, "#") || l == "" {
			continue
		}
		if !line.MatchString(l) {
			t.Errorf("not Prometheus text format: %q", l)
		}
	}
	for name, n := range types {
		if n != 1 {
			t.Errorf("%d TYPE lines for %s", n, name)
		}
	}
	for _, want := range []string{
		"edgeagent_ingest_messages_received_total 12345",
		"edgeagent_window_tombstones 24500",
		`edgeagent_ingest_rejected_total{reason="payload_too_large"} 2`,
		`edgeagent_dead_letters_total{reason="not_json"} 3`,
		`edgeagent_window_checkpoints_total{reason="delta"} 9`,
		`edgeagent_window_checkpoints_total{reason="interval"} 4`,
		`edgeagent_uplink_state{state="down"} 1`,
		"edgeagent_end_to_end_lag_seconds 2.5",
		"edgeagent_bronze_backlog_records 4321",
		"edgeagent_bronze_backlog_bytes 9.2274688e+08",
		"edgeagent_ingest_broker_dropped_total 6",
		"edgeagent_window_evicted_windows 36000",
		"edgeagent_uplink_failing_seconds 120",
		"edgeagent_window_logged_clock_timestamp_seconds 1.7959536015e+09",
		"# TYPE edgeagent_late_readings_total counter",
		"process_resident_memory_bytes",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	for _, fd := range []string{"process_open_fds", "process_max_fds"} {
		if !strings.Contains(body, "\n"+fd+" ") {
			t.Errorf("/metrics lacks %s (docs/operations.md promises file descriptors)", fd)
		}
	}
	// No lag before a reading was processed: 0 would look perfect.
	none := sampleSnapshot()
	none.Window.LatestEventTime = time.Time{}
	var nb strings.Builder
	WriteMetrics(&nb, none)
	if strings.Contains(nb.String(), "edgeagent_end_to_end_lag_seconds ") {
		t.Errorf("a lag series before any reading:\n%s", nb.String())
	}
	if n := len(s.Current().Warnings); n == 0 || !strings.Contains(body, fmt.Sprintf("\nedgeagent_warnings %d\n", n)) {
		t.Errorf("/metrics should count the %d warnings in edgeagent_warnings", n)
	}
}

func TestWarnings(t *testing.T) {
	snap := sampleSnapshot()
	snap.Rates.BacklogGrowth = 50
	snap.Window.Failing, snap.Window.LastError = true, "write state.db: no space left on device"
	w := strings.Join(Warnings(&snap, time.Second), "\n")
	// The uplink is down since 11:00 though its state changed 2s ago (a
	// reconnect attempt): the outage is the whole span.
	for _, want := range []string{"backlog growing", "slower than the trigger", "outbox near its bound", "Bronze near its bound", "uplink down for 1h0m0s",
		"embedded broker dropped 6 messages", "window batches failing, retried with backoff: write state.db: no space left on device"} {
		if !strings.Contains(w, want) {
			t.Errorf("warnings lack %q:\n%s", want, w)
		}
	}
	// A local message the broker keeps refusing holds the alerts behind
	// it (an audit: the status said nothing while they waited).
	snap.Alerts = &Alerts{LocalLastError: "publish agg/d/t: not connected"}
	if w := strings.Join(Warnings(&snap, time.Second), "\n"); !strings.Contains(w, "local publishing failing, retried with backoff (the alerts and aggregates behind it wait): publish agg/d/t: not connected") {
		t.Errorf("no warning for failing local publishes:\n%s", w)
	}
	snap.Alerts = nil
	snap.ReloadRefused = "window.size changed from 1m0s to 5m0s"
	if w := strings.Join(Warnings(&snap, time.Second), "\n"); !strings.Contains(w, "the last reload was refused, and the agent runs the config it started with: window.size changed") {
		t.Errorf("no warning for a refused reload:\n%s", w)
	}
	snap.ReloadRefused = ""
	// A Bronze full of processed records is Bronze keeping history, not a
	// risk.
	snap.Bronze.UnprocessedBytes = 1 << 20
	if w := strings.Join(Warnings(&snap, time.Second), "\n"); strings.Contains(w, "Bronze near its bound") {
		t.Errorf("warned of a Bronze near its bound with 1 MiB unprocessed:\n%s", w)
	}
	// A link that comes up and fails again: never down for long, but
	// nothing delivered for 10 minutes, and the reason is said.
	flapping := Snapshot{Time: snap.Time, Ingest: Ingest{Connected: true}, Uplink: Uplink{State: "up", SealedBatches: 3,
		FailingSince: snap.Time.Add(-10 * time.Minute), LastError: "publish batch gw-7-1-40: nats: maximum payload exceeded"}}
	if w := strings.Join(Warnings(&flapping, time.Second), "\n"); !strings.Contains(w, "uplink not delivering for 10m0s") || !strings.Contains(w, "maximum payload exceeded") {
		t.Errorf("no warning for an uplink that delivers nothing: %q", w)
	}
	flapping.Uplink.FailingSince = snap.Time.Add(-time.Minute)
	if w := Warnings(&flapping, time.Second); len(w) != 0 {
		t.Errorf("warned after a minute of failures: %v", w)
	}
	// Since a 1970 boot that NTP corrected: the stamps say decades, the
	// monotonic durations a minute.
	booted := Snapshot{Time: snap.Time, Ingest: Ingest{Connected: true}, Uplink: Uplink{State: "down", SealedBatches: 3,
		DownSince: time.Unix(0, 0), DownFor: time.Minute, FailingSince: time.Unix(0, 0), FailingFor: time.Minute}}
	if w := Warnings(&booted, time.Second); len(w) != 0 {
		t.Errorf("warned of a link down for a minute since a clock step: %v", w)
	}
	var metrics strings.Builder
	WriteMetrics(&metrics, booted)
	if !strings.Contains(metrics.String(), "\nedgeagent_uplink_failing_seconds 60\n") {
		t.Errorf("failing seconds after a clock step:\n%s", metrics.String())
	}
	// The gateway clock went back two days (a Pi without RTC, corrected):
	// said, with how far; a second of NTP step is not.
	back := Snapshot{Time: snap.Time, Ingest: Ingest{Connected: true}, Uplink: Uplink{State: "up"}, Window: Window{LoggedClock: snap.Time.Add(48 * time.Hour)}}
	if w := strings.Join(Warnings(&back, time.Second), "\n"); !strings.Contains(w, "the gateway clock went back: the logged clock is 48h0m0s ahead") {
		t.Errorf("no warning for a clock that went back: %q", w)
	}
	back.Window.LoggedClock = snap.Time.Add(time.Second)
	if w := Warnings(&back, time.Second); len(w) != 0 {
		t.Errorf("warned of a one-second clock step: %v", w)
	}
	// A session the broker lost is an event: a warning for an hour, then
	// only the counter keeps it.
	lost := Snapshot{Time: snap.Time, Ingest: Ingest{Connected: true, SessionsLost: 2, SessionLostAt: snap.Time.Add(-10 * time.Minute)}, Uplink: Uplink{State: "up"}}
	if w := strings.Join(Warnings(&lost, time.Second), "\n"); !strings.Contains(w, "the broker lost the agent's session at 2026-11-29T11:50:00Z (2 time(s) since start)") {
		t.Errorf("no warning for a session lost 10 minutes ago: %q", w)
	}
	lost.Ingest.SessionLostAt = snap.Time.Add(-2 * time.Hour)
	if w := Warnings(&lost, time.Second); len(w) != 0 {
		t.Errorf("still warned of a session lost two hours ago: %v", w)
	}
	calm := Snapshot{Ingest: Ingest{Connected: true}, Uplink: Uplink{State: "up"}}
	if w := Warnings(&calm, time.Second); len(w) != 0 {
		t.Errorf("a healthy agent has warnings: %v", w)
	}
}

func TestReadyzAndHealthz(t *testing.T) {
	src := &fakeSource{snap: sampleSnapshot(), ready: true}
	s := startServer(t, Config{}, src)
	if code, _ := get(t, "http://"+s.Addr()+"/readyz", ""); code != 200 {
		t.Errorf("/readyz ready: %d", code)
	}
	src.mu.Lock()
	src.ready, src.why = false, "ingest is not connected"
	src.mu.Unlock()
	if code, body := get(t, "http://"+s.Addr()+"/readyz", ""); code != 503 || !strings.Contains(body, "not connected") {
		t.Errorf("/readyz not ready: %d %q", code, body)
	}
	if code, _ := get(t, "http://"+s.Addr()+"/healthz", ""); code != 200 {
		t.Errorf("/healthz: %d", code)
	}
}

func TestTokenRequiredOffLoopback(t *testing.T) {
	if _, err := New(Config{Listen: "0.0.0.0:9464"}, &fakeSource{}); !errors.Is(err, ErrNotLoopback) {
		t.Fatalf("non-loopback without token: %v", err)
	}
	src := &fakeSource{snap: sampleSnapshot(), ready: true}
	s := startServer(t, Config{Listen: "127.0.0.1:0", Token: "s3cret"}, src)
	base := "http://" + s.Addr()
	for _, path := range []string{"/metrics", "/status.json", "/", "/readyz", "/inspect/late"} {
		if code, _ := get(t, base+path, ""); code != 401 {
			t.Errorf("%s without token: %d, want 401", path, code)
		}
		if code, _ := get(t, base+path, "s3cret"); code != 200 {
			t.Errorf("%s with token: %d, want 200", path, code)
		}
	}
	if code, _ := get(t, base+"/healthz", ""); code != 200 {
		t.Errorf("/healthz must not need the token: %d", code)
	}
	c := NewClient(s.Addr(), "s3cret", nil)
	if snap, err := c.Snapshot(context.Background()); err != nil || snap.Gateway != "gw-7" {
		t.Errorf("client with token: %v %+v", err, snap)
	}
}

func TestInspectEndpoint(t *testing.T) {
	s := startServer(t, Config{}, &fakeSource{snap: sampleSnapshot()})
	code, body := get(t, "http://"+s.Addr()+"/inspect/late?device=d9&limit=5", "")
	if code != 200 || !strings.Contains(body, `"device": "d9"`) || !strings.Contains(body, `"limit": 5`) {
		t.Errorf("inspect late: %d %s", code, body)
	}
	if code, _ := get(t, "http://"+s.Addr()+"/inspect/nothing", ""); code != 404 {
		t.Errorf("unknown table: %d", code)
	}
	if code, body := get(t, "http://"+s.Addr()+"/inspect/late?from=yesterday", ""); code != 400 || !strings.Contains(body, "RFC 3339") {
		t.Errorf("bad time: %d %s", code, body)
	}
	if code, body := get(t, "http://"+s.Addr()+"/inspect/late?reason=not_json", ""); code != 400 {
		t.Errorf("a filter the table does not apply: %d %s, want 400", code, body)
	}
	// A misspelt filter is refused, not ignored (which returned every row).
	if code, body := get(t, "http://"+s.Addr()+"/inspect/bronze?devce=x", ""); code != 400 || !strings.Contains(body, `unknown parameter "devce"`) {
		t.Errorf("a misspelt filter: %d %s, want 400", code, body)
	}
}

// All well: "warnings" is an empty list, not null, for scripts.
func TestStatusJSONWarningsNeverNull(t *testing.T) {
	snap := Snapshot{Gateway: "gw-7"}
	snap.Ingest.Connected = true
	snap.Uplink.State = "up"
	if w := Warnings(&snap, time.Second); len(w) != 0 {
		t.Fatalf("the healthy snapshot has warnings: %v", w)
	}
	s := startServer(t, Config{}, &fakeSource{snap: snap, ready: true})
	code, body := get(t, "http://"+s.Addr()+"/status.json", "")
	if code != 200 || strings.Contains(body, `"warnings": null`) || !strings.Contains(body, `"warnings": [`) {
		t.Errorf("/status.json: %d %s", code, body)
	}
}

func TestNotRunning(t *testing.T) {
	s := startServer(t, Config{}, &fakeSource{})
	addr := s.Addr()
	s.Close()
	if _, err := NewClient(addr, "", nil).Snapshot(context.Background()); !errors.Is(err, ErrNotRunning) {
		t.Errorf("client against a stopped agent: %v, want ErrNotRunning", err)
	}
}

// The page is checked in a real headless Chromium when one is installed
// (.ci/run installs Debian's chromium): it renders the numbers, shows the
// warnings and masks secrets.
func TestStatusPageInChromium(t *testing.T) {
	chromium := ""
	for _, c := range []string{"chromium", "chromium-browser", "/usr/bin/chromium"} {
		if p, err := exec.LookPath(c); err == nil {
			chromium = p
			break
		}
	}
	if chromium == "" {
		t.Skip("chromium is not installed (apt-get install chromium); skipping the browser test of the status page")
	}
	s := startServer(t, Config{TriggerInterval: time.Second}, &fakeSource{snap: sampleSnapshot(), ready: true})
	dir := t.TempDir()
	shot := filepath.Join(dir, "status.png")
	args := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + filepath.Join(dir, "profile"), "--window-size=1280,1400"}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dom, err := exec.CommandContext(ctx, chromium, append(args, "--dump-dom", "http://"+s.Addr()+"/")...).Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom: %v", err)
	}
	for _, want := range []string{
		`<span id="backlog">4321</span>`,
		`<span id="open-windows">40000</span>`,
		`<span id="evicted-windows">36000</span> of them on disk only`,
		`id="lag">2.5s<`,
		`id="link-state">down<`,
		`<span id="outbox-rows">77</span>`,
		`payload is not JSON: &lt;oops&gt;`,
		"outbox near its bound",
		"password: '***'",
	} {
		if !strings.Contains(string(dom), want) {
			t.Errorf("rendered page lacks %q", want)
		}
	}
	if out, err := exec.CommandContext(ctx, chromium, append(args, "--screenshot="+shot, "http://"+s.Addr()+"/")...).CombinedOutput(); err != nil {
		t.Fatalf("chromium --screenshot: %v\n%s", err, out)
	}
	if fi, err := os.Stat(shot); err != nil || fi.Size() < 10_000 {
		t.Fatalf("screenshot missing or blank: %v", err)
	}
	if dst := os.Getenv("EDGEAGENT_SCREENSHOT"); dst != "" {
		b, _ := os.ReadFile(shot)
		os.WriteFile(dst, b, 0o644)
	}
}

// ParseTime takes the forms the CLI's --from and --to document; a window
// start copied from the wire (milliseconds) is not read as seconds.
func TestParseTime(t *testing.T) {
	for in, want := range map[string]time.Time{
		"2026-11-29T10:00:00Z": time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC),
		"2026-11-29":           time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC),
		"1795946400":           time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC),
		"1795946400000":        time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC),
		"0":                    time.Unix(0, 0).UTC(),
	} {
		if got, err := ParseTime(in); err != nil || !got.Equal(want) {
			t.Errorf("ParseTime(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseTime("yesterday"); err == nil || !strings.Contains(err.Error(), "Unix milliseconds") {
		t.Errorf("ParseTime(yesterday) = %v, want an error naming the forms", err)
	}
}

// Every edgeagent_ family has HELP text, and every entry of metricHelp is
// a family that is written (a renamed metric leaves no stale text).
func TestMetricsHaveHelp(t *testing.T) {
	snap := sampleSnapshot()
	snap.Alerts = &Alerts{Rules: 1, FiringByRule: map[string]int{"hot": 1}}
	src := &fakeSource{snap: snap, ready: true}
	s := startServer(t, Config{TriggerInterval: time.Second}, src)
	_, body := get(t, "http://"+s.Addr()+"/metrics", "")
	helped := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "# TYPE edgeagent_") {
			if rest, ok := strings.CutPrefix(l, "# HELP "); ok {
				name, text, _ := strings.Cut(rest, " ")
				helped[name] = text != ""
			}
			continue
		}
		name := strings.Fields(l)[2]
		if !helped[name] {
			t.Errorf("%s has no HELP text (add it to metricHelp)", name)
		}
	}
	for name := range metricHelp {
		if _, ok := helped[name]; !ok {
			t.Errorf("metricHelp has %s, which /metrics does not write", name)
		}
	}
	if !strings.Contains(body, "# HELP edgeagent_uplink_failing_seconds How long batches have been refused") {
		t.Errorf("HELP text not in the exposition:\n%.600s", body)
	}
}

// The operations guide lists every family /metrics writes (metricHelp
// holds exactly those: TestMetricsHaveHelp), with its HELP text.
func TestOperationsGuideListsEveryMetric(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for name, help := range metricHelp {
		row := "| `" + name + "` | " + strings.ReplaceAll(help, "|", `\|`) + " |"
		if !strings.Contains(string(doc), row) {
			t.Errorf("docs/operations.md, Every metric, lacks the row %s", row)
		}
	}
}
