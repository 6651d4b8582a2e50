package status

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The page is one self-contained HTML document (no scripts, fonts or
// stylesheets from elsewhere) so it works on a laptop plugged into a gateway
// with no internet. It refreshes itself every five seconds.
//
// It is written out by hand rather than with html/template: the template
// package reaches reflect.Value.MethodByName, and that one call makes the
// linker keep every exported method of every type in the binary — about 3
// MB of the arm64 release binary (issue #6). Every value that comes from the
// snapshot or the config goes through escapeHTML, which escapes exactly as
// html/template does for text (testdata/page_*.html were written by the
// template this replaced, and TestPageGolden holds the output to them).

const pageHead = `<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="5">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>edgeagent `

const pageStyle = `</title>
<style>
body{font:15px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.4em;margin:0 0 .2em} h2{font-size:1.1em;margin:1.4em 0 .4em}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(14em,1fr));gap:.8em}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.7em .9em}
.num{font-size:1.6em;font-weight:600} .sub{color:#666;font-size:.9em}
.warn{background:#fff4e5;border:1px solid #f0a020;border-radius:6px;padding:.5em .9em;margin:.3em 0}
.ok{color:#1a7f37} .bad{color:#c62828}
table{border-collapse:collapse;width:100%;background:#fff} td,th{border:1px solid #ddd;padding:.3em .5em;text-align:left;font-size:.9em}
pre{background:#fff;border:1px solid #ddd;padding:.7em;overflow:auto;font-size:.85em}
</style></head><body>
<h1>edgeagent — `

// htmlReplacer escapes text the way html/template escapes a value in an
// HTML text or RCDATA context: the five significant characters, '+' (so a
// value can never complete a UTF-7 sequence) and NUL.
var htmlReplacer = strings.NewReplacer(
	"\x00", "\uFFFD",
	`"`, "&#34;",
	"&", "&amp;",
	"'", "&#39;",
	"+", "&#43;",
	"<", "&lt;",
	">", "&gt;",
)

// escapeHTML returns s safe to place in HTML text.
func escapeHTML(s string) string { return htmlReplacer.Replace(s) }

// pageWriter builds the page: raw appends markup, text appends a value
// escaped.
type pageWriter struct{ strings.Builder }

func (p *pageWriter) raw(s ...string) {
	for _, v := range s {
		p.WriteString(v)
	}
}

func (p *pageWriter) text(s string) { p.WriteString(escapeHTML(s)) }

func (p *pageWriter) uint(n uint64) { p.WriteString(strconv.FormatUint(n, 10)) }

func (p *pageWriter) int(n int64) { p.WriteString(strconv.FormatInt(n, 10)) }

// alerts writes the alert rules' figures and the local publisher's, as
// /status.json has them.
func (p *pageWriter) alerts(a *Alerts) {
	p.raw("\n<h2>Alerts</h2>\n<table><tr><th>firing</th><th>fired</th><th>cleared</th><th>held back</th><th>storm summaries</th><th>local messages</th></tr>\n<tr><td id=\"alerts-firing\">")
	p.int(int64(a.Firing))
	p.raw(" across ")
	p.int(int64(a.Rules))
	p.raw(" rules")
	byRule := make(map[string]uint64, len(a.FiringByRule))
	for n, c := range a.FiringByRule {
		byRule[n] = uint64(c)
	}
	p.counts(byRule, " · ", "")
	for _, n := range [...]uint64{a.FiredTotal, a.ClearedTotal, a.SuppressedTotal, a.SummariesTotal} {
		p.raw("</td><td>")
		p.uint(n)
	}
	p.raw("</td><td>")
	p.uint(a.LocalPublishedTotal)
	p.raw(" of ")
	p.uint(a.LocalQueuedTotal)
	p.raw(" published")
	if a.LocalFailuresTotal > 0 {
		p.raw(" · ")
		p.uint(a.LocalFailuresTotal)
		p.raw(" failures")
	}
	if a.LocalLastError != "" {
		p.raw(" · ")
		p.text(a.LocalLastError)
	}
	p.raw("</td></tr></table>\n")
}

// counts appends "key value<sep>" for each entry of m in key order (as a
// template's range over a map does), starting each with before.
func (p *pageWriter) counts(m map[string]uint64, before, after string) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		p.raw(before)
		p.text(k)
		p.raw(" ")
		p.uint(m[k])
		p.raw(after)
	}
}

// renderPage writes the status page for snap, with config (already
// masked) shown at the bottom.
func renderPage(w io.Writer, snap Snapshot, config string) error {
	var p pageWriter
	s := &snap
	p.raw(pageHead)
	p.text(s.Gateway)
	p.raw(pageStyle)
	p.text(s.Gateway)
	p.raw("</h1>\n<div class=\"sub\">version ")
	p.text(s.Version)
	p.raw(" · up ", escapeHTML(secs(s.UptimeSeconds)), " · ", escapeHTML(rfc3339(s.Time)), " · refreshes every 5 s</div>\n")
	for _, w := range s.Warnings {
		p.raw(`<div class="warn" data-warning>⚠ `)
		p.text(w)
		p.raw("</div>")
	}
	if len(s.Warnings) == 0 {
		p.raw(`<p class="ok" id="no-warnings">No warnings.</p>`)
	}

	p.raw("\n\n<h2>The four numbers</h2>\n<div class=\"grid\">\n" +
		"<div class=\"card\"><div class=\"sub\">input vs processed</div>\n" +
		"<div class=\"num\"><span id=\"input-rate\">")
	p.raw(escapeHTML(rate(s.Rates.InputPerSecond)), `</span> / <span id="processed-rate">`, escapeHTML(rate(s.Rates.ProcessedPerSecond)), "</span></div>\n")
	p.raw(`<div class="sub">Bronze backlog <span id="backlog">`)
	p.uint(s.Bronze.BacklogRecords)
	p.raw("</span> records, about ", escapeHTML(Bytes(s.Bronze.UnprocessedBytes)), "</div></div>\n"+
		"<div class=\"card\"><div class=\"sub\">batch duration vs trigger</div>\n"+
		"<div class=\"num\"><span id=\"batch-duration\">")
	p.raw(escapeHTML(secs(s.Window.LastBatchSeconds)), "</span> / ", escapeHTML(secs(s.Window.TriggerIntervalSeconds)), "</div>\n<div class=\"sub\">")
	p.int(int64(s.Window.LastBatchRecords))
	p.raw(" records in the last batch</div></div>\n" +
		"<div class=\"card\"><div class=\"sub\">state</div>\n" +
		"<div class=\"num\"><span id=\"open-windows\">")
	p.int(int64(s.Window.OpenWindows))
	p.raw("</span> windows</div>\n<div class=\"sub\"><span id=\"evicted-windows\">")
	p.int(int64(s.Window.EvictedWindows))
	p.raw("</span> of them on disk only · ")
	p.int(int64(s.Window.DedupEntries))
	p.raw(" dedup entries · ")
	p.int(int64(s.Window.Devices))
	p.raw(" devices · ", escapeHTML(Bytes(s.Window.StateBytes)), "</div></div>\n"+
		"<div class=\"card\"><div class=\"sub\">end-to-end lag</div>\n"+
		"<div class=\"num\" id=\"lag\">", escapeHTML(lagText(&s.Window)), "</div>\n"+
		"<div class=\"sub\">latest event ", escapeHTML(rfc3339(s.Window.LatestEventTime)), "</div></div>\n</div>\n")

	p.raw("\n<h2>Links and bounds</h2>\n<div class=\"grid\">\n" +
		"<div class=\"card\"><div class=\"sub\">MQTT broker</div>\n")
	if s.Ingest.Connected {
		p.raw(`<div class="num ok" id="broker-state">connected</div>`)
	} else {
		p.raw(`<div class="num bad" id="broker-state">disconnected</div>`)
	}
	p.raw("\n<div class=\"sub\">")
	p.text(s.Ingest.Broker)
	p.raw(" · ")
	p.uint(s.Ingest.Reconnects)
	p.raw(" reconnects</div></div>\n<div class=\"card\"><div class=\"sub\">uplink ")
	p.text(s.Uplink.Transport)
	p.raw("</div>\n")
	if s.Uplink.State == "up" {
		p.raw(`<div class="num ok" id="link-state">`)
	} else {
		p.raw(`<div class="num bad" id="link-state">`)
	}
	p.text(s.Uplink.State)
	p.raw("</div>\n<div class=\"sub\">")
	p.uint(s.Uplink.ReconnectsTotal)
	p.raw(" reconnects · ", escapeHTML(Bytes(int64(s.Uplink.BytesSent))), " sent")
	if s.Uplink.LastError != "" {
		p.raw(" · ")
		p.text(s.Uplink.LastError)
	}
	p.raw("</div></div>\n<div class=\"card\"><div class=\"sub\">outbox</div>\n<div class=\"num\"><span id=\"outbox-rows\">")
	p.uint(s.Outbox.Rows)
	p.raw("</span> rows</div>\n<div class=\"sub\">", escapeHTML(Bytes(int64(s.Outbox.Bytes))), " of ", escapeHTML(Bytes(s.Outbox.MaxBytes)),
		" (", escapeHTML(percent(int64(s.Outbox.Bytes), s.Outbox.MaxBytes)), ") · oldest ", escapeHTML(secs(s.Outbox.OldestAge)), "</div></div>\n")
	p.raw("<div class=\"card\"><div class=\"sub\">Bronze</div>\n<div class=\"num\"><span id=\"bronze-records\">")
	p.int(s.Bronze.Records)
	p.raw("</span> records</div>\n<div class=\"sub\">", escapeHTML(Bytes(s.Bronze.Bytes)), " of ", escapeHTML(Bytes(s.Bronze.MaxBytes)),
		" (", escapeHTML(percent(s.Bronze.Bytes, s.Bronze.MaxBytes)), ")</div></div>\n</div>\n")

	p.raw("\n<h2>Input quality</h2>\n" +
		"<table><tr><th>late</th><th>duplicates</th><th>dead letters</th><th>rejected at ingest</th></tr>\n" +
		"<tr><td id=\"late\">")
	p.uint(s.Window.LateTotal)
	p.raw(`</td><td id="duplicates">`)
	p.uint(s.Window.DuplicatesTotal)
	p.raw("</td>\n<td id=\"dead-letters\">")
	p.uint(s.Window.DeadLettersTotal)
	p.counts(s.Window.DeadLettersByReason, " · ", "")
	p.raw("</td>\n<td>")
	p.counts(s.Ingest.Rejected, "", " ")
	p.raw("</td></tr></table>\n")
	if a := s.Alerts; a != nil {
		p.alerts(a)
	}
	p.raw("\n<h2>Last dead letters</h2>\n")
	if len(s.DeadLetters) > 0 {
		p.raw(`<table id="dead-letter-table"><tr><th>seq</th><th>received</th><th>topic</th><th>reason</th><th>payload</th></tr>` + "\n")
		for _, d := range s.DeadLetters {
			p.raw("<tr><td>")
			p.uint(d.Seq)
			p.raw("</td><td>", escapeHTML(rfc3339(d.ReceivedAt)), "</td><td>")
			p.text(d.Topic)
			p.raw("</td><td>")
			p.text(d.Reason)
			p.raw("</td><td><code>")
			p.text(d.Payload)
			p.raw("</code></td></tr>\n")
		}
		p.raw("</table>")
	} else {
		p.raw("<p>None.</p>")
	}
	p.raw("\n\n<h2>Effective configuration <span class=\"sub\">(secrets masked)</span></h2>\n<pre id=\"config\">")
	p.text(config)
	p.raw("</pre>\n</body></html>\n")
	_, err := io.WriteString(w, p.String())
	return err
}

// rate formats a per-second figure.
func rate(f float64) string { return fmt.Sprintf("%.1f/s", f) }

// secs formats seconds as a duration, to the millisecond.
func secs(f float64) string {
	return (time.Duration(f * float64(time.Second))).Round(time.Millisecond).String()
}

// lagText is the lag, or "—" before any reading was processed (a lag of
// 0 would read as a healthy agent).
func lagText(w *Window) string {
	if w.LatestEventTime.IsZero() {
		return "—"
	}
	return secs(w.LagSeconds)
}

// rfc3339 formats t in UTC, or a dash for the zero time.
func rfc3339(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format(time.RFC3339)
}

func percent(a, b int64) string {
	if b <= 0 {
		return "unbounded"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(a)/float64(b))
}

func (s *Server) page(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	// No external loads, ever: the policy makes a regression visible.
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	// Opened with ?token=, the page must not be cached or pass its address on.
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer")
	if err := renderPage(w, s.Current(), string(s.src.Config())); err != nil {
		s.cfg.Logger.Error("render status page", "err", err)
	}
}
