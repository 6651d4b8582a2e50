package status

import (
	"bytes"
	"flag"
	"html/template"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the status page's golden files in testdata/")

// trickySnapshot has every branch of the page taken the other way from
// sampleSnapshot, and text that needs escaping everywhere text goes.
func trickySnapshot() Snapshot {
	return Snapshot{
		Gateway: `gw<"&'+>`, Version: "v1+dirty", Time: time.Date(2026, 1, 2, 3, 4, 5, 600, time.FixedZone("x", 3600)), UptimeSeconds: 0.0004,
		Ingest: Ingest{Broker: "tcp://a&b:1883/?x=<y>", Connected: false, Reconnects: 3,
			Rejected: map[string]uint64{"zeta": 1, "alpha<": 2, "mid": 18446744073709551615}},
		Bronze: Bronze{Records: 1, Bytes: 1023, MaxBytes: 0, BacklogRecords: 0},
		Window: Window{LastBatchRecords: -1, OpenWindows: 3, DedupEntries: 4, Devices: 5, StateBytes: 5 << 40,
			LastBatchSeconds: 123.4567891, TriggerIntervalSeconds: 0.25, LagSeconds: -2,
			DeadLettersTotal: 9, DeadLettersByReason: map[string]uint64{"b": 2, "a": 7, "c'": 0},
			LatestEventTime: time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC), LateTotal: 1, DuplicatesTotal: 2},
		Outbox: Outbox{Rows: 0, Bytes: 1 << 62, MaxBytes: -1, OldestAge: 86400.5},
		Uplink: Uplink{Transport: "mqtt", State: "up", ReconnectsTotal: 4, BytesSent: 2048, LastError: `ack "x" & <y>`},
		Rates:  Rates{InputPerSecond: 1234.56, ProcessedPerSecond: 0.04},
		Alerts: &Alerts{Rules: 2, Firing: 3, FiringByRule: map[string]int{"over<heat>": 2, "cold": 1}, FiredTotal: 5, ClearedTotal: 2,
			SuppressedTotal: 1, SummariesTotal: 1, LocalQueuedTotal: 9, LocalPublishedTotal: 8, LocalFailuresTotal: 1, LocalLastError: `refused "x" & <y>`},
		Warnings: []string{"outbox <near> its bound & more", "a 'quoted' \"warning\"", "nul\x00byte, ünïcödé +1"},
		DeadLetters: []DeadLetter{
			{Seq: 1, Topic: "t/<1>", ReceivedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), Reason: "r&r", Payload: "{\"a\":'b'}+\x00"},
			{Seq: 2, Topic: "t/2", Reason: "", Payload: ""},
		},
	}
}

var pageCases = []struct {
	name   string
	snap   Snapshot
	config string
}{
	{"sample", sampleSnapshot(), "gateway_id: gw-7\nmqtt:\n  password: '***'\n"},
	{"zero", Snapshot{}, ""},
	{"tricky", trickySnapshot(), "a: \"<script>alert('x')</script>\" # & +\n"},
}

// TestPageGolden pins the status page byte for byte: the golden files were
// written by the html/template the page used to be rendered with, so the
// hand-written renderer must match that template's output and escaping.
// go test -run TestPageGolden -update rewrites them after a deliberate change.
func TestPageGolden(t *testing.T) {
	for _, c := range pageCases {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := renderPage(&buf, c.snap, c.config); err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", "page_"+c.name+".html")
			if *update {
				if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if got := buf.String(); got != string(want) {
				t.Errorf("page differs from %s:\n%s", golden, firstDiff(got, string(want)))
			}
		})
	}
}

// firstDiff shows where two texts part.
func firstDiff(got, want string) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	from := max(0, i-80)
	return "got:  …" + got[from:min(len(got), i+80)] + "…\nwant: …" + want[from:min(len(want), i+80)] + "…"
}

// escapeRef is the escaping the page had under html/template: a value
// printed in HTML text.
var escapeRef = template.Must(template.New("ref").Parse(`<p>{{.}}</p>`))

func checkEscape(t *testing.T, s string) {
	t.Helper()
	var want strings.Builder
	if err := escapeRef.Execute(&want, s); err != nil {
		t.Fatal(err)
	}
	if got := "<p>" + escapeHTML(s) + "</p>"; got != want.String() {
		t.Errorf("escapeHTML(%q) = %q, html/template gives %q", s, got, want.String())
	}
}

func TestEscapeHTMLMatchesTemplate(t *testing.T) {
	for _, s := range []string{"", "plain", `<>&'"+`, "\x00", "a\x00b", "ünïcödé ⚠ —", "&amp;", "\xff\xfe invalid utf-8", "\t\r\n", "`=/"} {
		checkEscape(t, s)
	}
}

func FuzzEscapeHTML(f *testing.F) {
	for _, s := range []string{"", `<script>alert('x')</script>`, "a+b\x00", "ä&ö"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkEscape(t, s) })
}
