package status

import (
	"fmt"
	"html/template"
	"net/http"
	"time"
)

// The page is one self-contained HTML document (no scripts, fonts or
// stylesheets from elsewhere) so it works on a laptop plugged into a gateway
// with no internet. It refreshes itself every five seconds.
var pageTemplate = template.Must(template.New("page").Funcs(template.FuncMap{
	"bytes": func(n any) string { return Bytes(toInt64(n)) },
	"rate":  func(f float64) string { return fmt.Sprintf("%.1f/s", f) },
	"secs": func(f float64) string {
		return (time.Duration(f * float64(time.Second))).Round(time.Millisecond).String()
	},
	"pct": func(a, b any) string { return percent(toInt64(a), toInt64(b)) },
	"rfc3339": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format(time.RFC3339)
	},
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="5">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>edgeagent {{.S.Gateway}}</title>
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
<h1>edgeagent — {{.S.Gateway}}</h1>
<div class="sub">version {{.S.Version}} · up {{secs .S.UptimeSeconds}} · {{rfc3339 .S.Time}} · refreshes every 5 s</div>
{{range .S.Warnings}}<div class="warn" data-warning>⚠ {{.}}</div>{{else}}<p class="ok" id="no-warnings">No warnings.</p>{{end}}

<h2>The four numbers</h2>
<div class="grid">
<div class="card"><div class="sub">input vs processed</div>
<div class="num"><span id="input-rate">{{rate .S.Rates.InputPerSecond}}</span> / <span id="processed-rate">{{rate .S.Rates.ProcessedPerSecond}}</span></div>
<div class="sub">Bronze backlog <span id="backlog">{{.S.Bronze.BacklogRecords}}</span> records</div></div>
<div class="card"><div class="sub">batch duration vs trigger</div>
<div class="num"><span id="batch-duration">{{secs .S.Window.LastBatchSeconds}}</span> / {{secs .S.Window.TriggerIntervalSeconds}}</div>
<div class="sub">{{.S.Window.LastBatchRecords}} records in the last batch</div></div>
<div class="card"><div class="sub">state</div>
<div class="num"><span id="open-windows">{{.S.Window.OpenWindows}}</span> windows</div>
<div class="sub">{{.S.Window.DedupEntries}} dedup entries · {{.S.Window.Devices}} devices · {{bytes .S.Window.StateBytes}}</div></div>
<div class="card"><div class="sub">end-to-end lag</div>
<div class="num" id="lag">{{secs .S.Window.LagSeconds}}</div>
<div class="sub">latest event {{rfc3339 .S.Window.LatestEventTime}}</div></div>
</div>

<h2>Links and bounds</h2>
<div class="grid">
<div class="card"><div class="sub">MQTT broker</div>
<div class="num {{if .S.Ingest.Connected}}ok{{else}}bad{{end}}" id="broker-state">{{if .S.Ingest.Connected}}connected{{else}}disconnected{{end}}</div>
<div class="sub">{{.S.Ingest.Broker}} · {{.S.Ingest.Reconnects}} reconnects</div></div>
<div class="card"><div class="sub">uplink {{.S.Uplink.Transport}}</div>
<div class="num {{if eq .S.Uplink.State "up"}}ok{{else}}bad{{end}}" id="link-state">{{.S.Uplink.State}}</div>
<div class="sub">{{.S.Uplink.ReconnectsTotal}} reconnects · {{bytes .S.Uplink.BytesSent}} sent{{if .S.Uplink.LastError}} · {{.S.Uplink.LastError}}{{end}}</div></div>
<div class="card"><div class="sub">outbox</div>
<div class="num"><span id="outbox-rows">{{.S.Outbox.Rows}}</span> rows</div>
<div class="sub">{{bytes .S.Outbox.Bytes}} of {{bytes .S.Outbox.MaxBytes}} ({{pct .S.Outbox.Bytes .S.Outbox.MaxBytes}}) · oldest {{secs .S.Outbox.OldestAge}}</div></div>
<div class="card"><div class="sub">Bronze</div>
<div class="num"><span id="bronze-records">{{.S.Bronze.Records}}</span> records</div>
<div class="sub">{{bytes .S.Bronze.Bytes}} of {{bytes .S.Bronze.MaxBytes}} ({{pct .S.Bronze.Bytes .S.Bronze.MaxBytes}})</div></div>
</div>

<h2>Input quality</h2>
<table><tr><th>late</th><th>duplicates</th><th>dead letters</th><th>rejected at ingest</th></tr>
<tr><td id="late">{{.S.Window.LateTotal}}</td><td id="duplicates">{{.S.Window.DuplicatesTotal}}</td>
<td id="dead-letters">{{.S.Window.DeadLettersTotal}}{{range $k, $v := .S.Window.DeadLettersByReason}} · {{$k}} {{$v}}{{end}}</td>
<td>{{range $k, $v := .S.Ingest.Rejected}}{{$k}} {{$v}} {{end}}</td></tr></table>

<h2>Last dead letters</h2>
{{if .S.DeadLetters}}<table id="dead-letter-table"><tr><th>seq</th><th>received</th><th>topic</th><th>reason</th><th>payload</th></tr>
{{range .S.DeadLetters}}<tr><td>{{.Seq}}</td><td>{{rfc3339 .ReceivedAt}}</td><td>{{.Topic}}</td><td>{{.Reason}}</td><td><code>{{.Payload}}</code></td></tr>
{{end}}</table>{{else}}<p>None.</p>{{end}}

<h2>Effective configuration <span class="sub">(secrets masked)</span></h2>
<pre id="config">{{.Config}}</pre>
</body></html>
`))

func toInt64(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case uint64:
		return int64(n)
	case int:
		return int64(n)
	}
	return 0
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
	data := struct {
		S      Snapshot
		Config string
	}{s.Current(), string(s.src.Config())}
	if err := pageTemplate.Execute(w, data); err != nil {
		s.cfg.Logger.Error("render status page", "err", err)
	}
}
