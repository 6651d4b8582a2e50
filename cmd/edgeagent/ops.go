package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/cmd/edgeagent/agent"
	"github.com/edgeagent/edgeagent/cmd/edgeagent/status"
	"github.com/edgeagent/edgeagent/config"
	"github.com/edgeagent/edgeagent/window"
	bolt "go.etcd.io/bbolt"
)

func init() {
	register(&command{
		name:    "status",
		summary: "print the running agent's numbers and warnings",
		usage: `Usage: edgeagent status [-c FILE] [--addr [https://]HOST:PORT [--ca FILE]] [--json]

Reads the running agent's status endpoint (status.listen in the config, or
--addr) and prints the numbers that matter as a short table, with warnings
first: backlog growing, batches slower than the trigger, outbox or Bronze
near its bound, uplink down for long, broker disconnected.

With -c, the config gives the address, the token and, when status.tls is
set, the certificate to trust (exactly that one). With --addr, the token
comes from $EDGEAGENT_STATUS_TOKEN (or, given -c too, from the config); an
https:// address is checked against the system's roots, or against the
certificates in --ca (a private CA, or the gateway's self-signed
certificate).

Examples:
  edgeagent status
  edgeagent status -c ./config.yaml
  edgeagent status --addr 127.0.0.1:9464 --json
  EDGEAGENT_STATUS_TOKEN=... edgeagent status --addr https://gw-12.plant.lan:9464 --ca gw-12.crt
`,
		run: statusCmd,
	})
	for _, table := range []string{"bronze", "late", "deadletter", "outbox"} {
		register(&command{
			name:    "inspect " + table,
			summary: inspectSummary[table],
			usage: fmt.Sprintf(`Usage: edgeagent inspect %s -c FILE [--device D] [--from T] [--to T]%s [--limit N] [--json]

%s
Read-only. While the agent runs this goes through its status endpoint;
when it is stopped, through the files in data_dir.
--from and --to select by %s.
Times are RFC 3339 (2026-11-29T10:00:00Z), a date (2026-11-29), Unix
seconds or Unix milliseconds (1795946400000).

Examples:
  edgeagent inspect %s -c /etc/edgeagent/config.yaml --limit 20
  edgeagent inspect %s -c ./config.yaml --device press-7 --from 2026-11-29 --json
`, table, inspectExtraFlags[table], inspectSummary[table]+".", inspectTimeField[table], table, table),
			run: func(ctx context.Context, e *env, args []string) int { return inspectCmd(ctx, e, table, args) },
		})
	}
	register(&command{
		name:    "reset-state",
		summary: "drop window state and rebuild it from Bronze (after an incompatible window change)",
		usage: `Usage: edgeagent reset-state -c FILE

Deletes the window state (open windows, dedup entries, watermarks), the late
and dead-letter tables and the processing offset, and keeps Bronze and the
unsent outbox. The next 'edgeagent run' reprocesses every retained Bronze
record with the current config. Revisions continue above every revision
already sent, so the cloud's keep-highest-revision upsert takes the new
values. Run it with the agent stopped (it refuses while the agent runs).
Nothing it drops is lost for good: Bronze holds the records it is rebuilt
from, though windows older than Bronze's retention are not rebuilt.

Examples:
  systemctl stop edgeagent
  edgeagent reset-state -c /etc/edgeagent/config.yaml
  systemctl start edgeagent
`,
		run: resetStateCmd,
	})
	register(&command{
		name:    "replay",
		summary: "re-derive aggregates for an event-time range from Bronze, as new revisions",
		usage: `Usage: edgeagent replay -c FILE --from T --to T

The batch path: recomputes every window whose start lies in [from, to) from
all retained Bronze records — parsed with the current config, so records
that were dead-lettered before a config fix now count — and queues them in
the outbox as new revisions, which the cloud's upsert takes over the old
ones. Windows that may have had readings Bronze no longer holds are
skipped, and counted. Run it with the agent stopped; the next run delivers them. T is RFC
3339, a date (UTC midnight), Unix seconds or Unix milliseconds (a window's
start as the wire carries it).

Examples:
  edgeagent replay -c /etc/edgeagent/config.yaml --from 2026-11-28T00:00:00Z --to 2026-11-29T00:00:00Z
  edgeagent replay -c ./config.yaml --from 2026-11-28 --to 2026-11-29
`,
		run: replayCmd,
	})
}

var inspectSummary = map[string]string{
	"bronze":     "list raw Bronze records (topic, received-at, payload)",
	"late":       "list readings refused as too late, with the watermark they missed",
	"deadletter": "list records that could not become readings, with the reason",
	"outbox":     "list aggregates and alerts waiting for the uplink",
}

// inspectTimeField is what --from and --to select on in each table.
var inspectTimeField = map[string]string{
	"bronze":     "the time the agent received the message",
	"late":       "the reading's event time",
	"deadletter": "the time the agent received the message",
	"outbox":     "the time the aggregate or alert was queued\n(emitted_at), not a window's start",
}

var inspectExtraFlags = map[string]string{
	"bronze": " [--seq N]", "late": "", "deadletter": " [--reason CODE]", "outbox": " [--seq N]",
}

// statusClient finds the status endpoint and its token: --addr (with its
// scheme and --ca) wins, then the config file.
func statusClient(e *env, path, addr, caFile string, explicitConfig bool) (*status.Client, int) {
	if addr != "" {
		token := os.Getenv("EDGEAGENT_STATUS_TOKEN")
		if token == "" && explicitConfig {
			// -c with --addr: the config gives the token.
			cfg, code := loadReadOnlyConfig(e, path, "status.token")
			if cfg == nil {
				return nil, code
			}
			token = cfg.Status.Token
		}
		scheme, hostPort := splitScheme(addr)
		switch {
		case scheme == "https":
			tc, err := status.CATLS(caFile)
			if err != nil {
				e.errorf("--ca: %v", err)
				return nil, exitUsage
			}
			return status.NewClient(hostPort, token, tc), exitOK
		case caFile != "":
			e.errorf("--ca needs an https:// --addr")
			return nil, exitUsage
		case scheme == "" && token != "" && !loopbackAddr(hostPort):
			// The token would cross the network in clear text; an
			// explicit http:// says that is meant.
			e.errorf("--addr %s with a token: use https://%s (the endpoint serves HTTPS with status.tls), or http://%s to send the token in clear text", addr, hostPort, hostPort)
			return nil, exitUsage
		}
		return status.NewClient(hostPort, token, nil), exitOK
	}
	if caFile != "" {
		e.errorf("--ca needs an https:// --addr (with -c, status.tls.cert_file is trusted)")
		return nil, exitUsage
	}
	if _, err := os.Stat(path); err != nil && !explicitConfig {
		return status.NewClient("127.0.0.1:9464", "", nil), exitOK
	}
	cfg, code := loadReadOnlyConfig(e, path, statusKeys...)
	if cfg == nil {
		return nil, code
	}
	if cfg.Status.Listen == "" {
		e.errorf("status.listen is empty in %s: the status endpoint is disabled; set it (e.g. 127.0.0.1:9464) and reload the agent (systemctl reload edgeagent)", path)
		return nil, exitFail
	}
	return configStatusClient(e, cfg)
}

// splitScheme splits an --addr into its scheme ("http", "https" or "" for
// none, any case) and host:port, with the default port when none is given.
func splitScheme(addr string) (scheme, hostPort string) {
	hostPort = addr
	if i := strings.Index(addr, "://"); i >= 0 {
		scheme, hostPort = strings.ToLower(addr[:i]), addr[i+3:]
	}
	hostPort = strings.TrimSuffix(hostPort, "/")
	if _, _, err := net.SplitHostPort(hostPort); err != nil {
		hostPort = net.JoinHostPort(strings.Trim(hostPort, "[]"), "9464")
	}
	return scheme, hostPort
}

// loopbackAddr reports whether host:port names this machine.
func loopbackAddr(hostPort string) bool {
	host, _, _ := net.SplitHostPort(hostPort)
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// statusKeys are the keys the status client reads.
var statusKeys = []string{"status.listen", "status.token", "status.tls.cert_file", "status.tls.key_file"}

// configStatusClient is the client for the endpoint the config describes,
// pinned to its TLS certificate when it has one.
func configStatusClient(e *env, cfg *config.Config) (*status.Client, int) {
	var tc *tls.Config
	if cfg.Status.TLS.Enabled() {
		var err error
		if tc, err = status.PinnedTLS(cfg.Status.TLS.CertFile); err != nil {
			e.errorf("status.tls.cert_file: %v", err)
			return nil, exitConfig
		}
	}
	client := status.NewClient(cfg.Status.Listen, cfg.Status.Token, tc)
	client.Expect = expectedAgent(cfg)
	return client, exitOK
}

// expectedAgent is the agent cfg describes, which its status.listen must
// answer as; nil when data_dir comes from a variable that is not set here.
func expectedAgent(cfg *config.Config) *status.Identity {
	if len(cfg.Unresolved("data_dir")) > 0 {
		return nil
	}
	id := status.AgentIdentity(cfg.GatewayID, cfg.DataDir)
	if len(cfg.Unresolved("gateway_id")) > 0 {
		id.Gateway = ""
	}
	return &id
}

// noteGatewayChange tells of a gateway_id edited in the config but not yet
// in force: the figures are this data_dir's agent's, under its old name.
func noteGatewayChange(e *env, client *status.Client, path string) {
	want := client.Expect
	if want == nil || want.Gateway == "" || client.Answered.Gateway == want.Gateway {
		return
	}
	fmt.Fprintf(e.stderr, "edgeagent: note: the running agent's gateway_id is %q, %s says %q: reload it (systemctl reload edgeagent) to apply the change\n",
		client.Answered.Gateway, path, want.Gateway)
}

func statusCmd(ctx context.Context, e *env, args []string) int {
	c := lookup("status")
	fs := newFlags(c, e)
	path := fs.String("c", defaultConfigPath, "config file (for status.listen, status.token and status.tls)")
	addr := fs.String("addr", "", "status endpoint address (host:port, or https://host:port), instead of the config's")
	caFile := fs.String("ca", "", "with an https:// --addr: PEM certificates to trust instead of the system's roots")
	asJSON := fs.Bool("json", false, "print the raw /status.json")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	client, code := statusClient(e, *path, *addr, *caFile, flagSet(fs, "c"))
	if client == nil {
		return code
	}
	snap, err := client.Snapshot(ctx)
	if err != nil {
		var unknownCA x509.UnknownAuthorityError
		var otherAgent *status.OtherAgentError
		switch {
		case errors.As(err, &otherAgent):
			e.errorf("%v.\nGive each agent its own status.listen (and reload it); --addr HOST:PORT reads whichever agent answers there.", err)
		case errors.Is(err, status.ErrNotRunning):
			e.errorf("the agent is not running (nothing listens on %s). Start it with: systemctl start edgeagent (or edgeagent run -c FILE)", client.Base)
		case errors.As(err, &unknownCA):
			e.errorf("%v\nTrust the gateway's certificate (status.tls.cert_file) or its CA with --ca FILE.", err)
		case strings.Contains(err.Error(), "HTTP request to an HTTPS server"):
			e.errorf("%v\nThe endpoint serves HTTPS (status.tls): use --addr https://HOST:PORT.", err)
		case strings.Contains(err.Error(), "401 Unauthorized"):
			e.errorf("%v\nWith --addr the token comes from $EDGEAGENT_STATUS_TOKEN (or -c FILE's status.token).", err)
		case strings.Contains(err.Error(), "does not look like a TLS handshake"):
			e.errorf("%v\nThe endpoint serves plain HTTP (no status.tls in the running agent's config, or it was not restarted since).", err)
		default:
			e.errorf("%v", err)
		}
		return exitFail
	}
	noteGatewayChange(e, client, *path)
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(snap); err != nil {
			e.errorf("status: %v", err)
			return exitFail
		}
		return exitOK
	}
	printStatus(e.stdout, &snap, isTerminal(e.stdout))
	return exitOK
}

func flagSet(fs *flag.FlagSet, name string) bool {
	found := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			found = true
		}
	})
	return found
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// printStatus prints the snapshot as a short table, warnings first.
func printStatus(w io.Writer, s *status.Snapshot, color bool) {
	warn := func(msg string) string {
		if color {
			return "\x1b[1;31mWARNING\x1b[0m " + msg
		}
		return "WARNING " + msg
	}
	fmt.Fprintf(w, "edgeagent %s on %s, up %s\n", s.Version, s.Gateway, (time.Duration(s.UptimeSeconds) * time.Second).String())
	for _, m := range s.Warnings {
		fmt.Fprintln(w, warn(m))
	}
	if len(s.Warnings) == 0 {
		fmt.Fprintln(w, "no warnings")
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	d := func(sec float64) string {
		return time.Duration(sec * float64(time.Second)).Round(time.Millisecond).String()
	}
	broker := "disconnected"
	if s.Ingest.Connected {
		broker = "connected"
	}
	lag := "— (no reading processed yet)"
	if !s.Window.LatestEventTime.IsZero() {
		lag = d(s.Window.LagSeconds)
	}
	rows := [][2]string{
		{"input / processed", fmt.Sprintf("%.1f msgs/s / %.1f records/s", s.Rates.InputPerSecond, s.Rates.ProcessedPerSecond)},
		{"Bronze backlog", fmt.Sprintf("%d record%s, about %s (%+.1f/s)", s.Bronze.BacklogRecords, plural(int(s.Bronze.BacklogRecords)), status.Bytes(s.Bronze.UnprocessedBytes), s.Rates.BacklogGrowth)},
		{"batch / trigger", fmt.Sprintf("%s / %s", d(s.Window.LastBatchSeconds), d(s.Window.TriggerIntervalSeconds))},
		{"state", fmt.Sprintf("%s (%d on disk only), %s, %s, %s", counted(s.Window.OpenWindows, "window", "windows"), s.Window.EvictedWindows,
			counted(s.Window.DedupEntries, "dedup entry", "dedup entries"), counted(s.Window.Devices, "device", "devices"), status.Bytes(s.Window.StateBytes))},
		{"end-to-end lag", lag},
		{"outbox", fmt.Sprintf("%d rows, %s of %s, oldest %s", s.Outbox.Rows, status.Bytes(int64(s.Outbox.Bytes)), status.Bytes(s.Outbox.MaxBytes), d(s.Outbox.OldestAge))},
		{"uplink", strings.TrimSpace(s.Uplink.Transport + " " + fmt.Sprintf("%s, %d reconnects, %s sent", s.Uplink.State, s.Uplink.ReconnectsTotal, status.Bytes(int64(s.Uplink.BytesSent))))},
		{"broker", fmt.Sprintf("%s (%s)", broker, s.Ingest.Broker)},
		{"Bronze", fmt.Sprintf("%d record%s, %s of %s", s.Bronze.Records, plural(int(s.Bronze.Records)), status.Bytes(s.Bronze.Bytes), status.Bytes(s.Bronze.MaxBytes))},
		{"late / duplicates / dead letters", fmt.Sprintf("%d / %d / %d", s.Window.LateTotal, s.Window.DuplicatesTotal, s.Window.DeadLettersTotal)},
	}
	if al := s.Alerts; al != nil {
		rows = append(rows, [2]string{"alerts", fmt.Sprintf("%d firing of %d rule%s; %d fired, %d cleared, %d suppressed; local messages %d queued, %d published, %d failures",
			al.Firing, al.Rules, plural(al.Rules), al.FiredTotal, al.ClearedTotal, al.SuppressedTotal, al.LocalQueuedTotal, al.LocalPublishedTotal, al.LocalFailuresTotal)})
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
	}
	tw.Flush()
}

func inspectCmd(ctx context.Context, e *env, table string, args []string) int {
	c := lookup("inspect " + table)
	fs := newFlags(c, e)
	path := fs.String("c", defaultConfigPath, "config file")
	device := fs.String("device", "", "only this device")
	from := fs.String("from", "", "from this time (inclusive)")
	to := fs.String("to", "", "to this time (exclusive)")
	// Only the filters a table applies: an ignored one would look applied.
	var reason string
	var seq uint64
	if table == "deadletter" {
		fs.StringVar(&reason, "reason", "", "dead letters with this reason code only")
	}
	if table == "bronze" || table == "outbox" {
		fs.Uint64Var(&seq, "seq", 0, "start at this sequence")
	}
	limit := fs.Int("limit", 100, "at most this many rows")
	asJSON := fs.Bool("json", false, "print JSON")
	if msg := filterElsewhere(table, args); msg != "" {
		e.errorf("inspect %s: %s", table, msg)
		return exitUsage
	}
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if err := agent.CheckReason(reason); err != nil {
		e.errorf("inspect %s: --%v", table, err)
		return exitUsage
	}
	vals := url.Values{}
	for k, v := range map[string]string{"device": *device, "from": *from, "to": *to, "reason": reason} {
		if v != "" {
			vals.Set(k, v)
		}
	}
	if seq > 0 {
		vals.Set("seq", strconv.FormatUint(seq, 10))
	}
	vals.Set("limit", strconv.Itoa(*limit))
	q, err := status.ParseQuery(vals.Get)
	if err != nil {
		e.errorf("inspect %s: %v", table, err)
		return exitUsage
	}
	// The tables read data_dir and name devices through the subscriptions.
	cfg, code := loadReadOnlyConfig(e, *path, append([]string{"data_dir", "gateway_id", "mqtt.subscriptions"}, statusKeys...)...)
	if cfg == nil {
		return code
	}
	var rows any
	viaEndpoint := false
	if cfg.Status.Listen != "" {
		client, code := configStatusClient(e, cfg)
		if client == nil {
			return code
		}
		var raw json.RawMessage
		err := client.Inspect(ctx, table, vals, &raw)
		var otherAgent *status.OtherAgentError
		switch {
		case err == nil:
			rows, viaEndpoint = raw, true
			noteGatewayChange(e, client, *path)
		case errors.As(err, &otherAgent):
			// This config's agent is not the one listening: stopped, or
			// started before status.listen changed. Its files say which.
			fmt.Fprintf(e.stderr, "edgeagent: note: %v; reading %s's files instead\n", err, cfg.DataDir)
		case !errors.Is(err, status.ErrNotRunning):
			e.errorf("inspect %s through the running agent: %v", table, err)
			return exitFail
		}
	}
	if !viaEndpoint {
		var file string
		rows, file, err = inspectFiles(cfg, table, q)
		if err != nil {
			if file != "" {
				return openFailed(e, fmt.Errorf("inspect %s: %w", table, err), cfg.DataDir, file, "inspect")
			}
			e.errorf("inspect %s: %v", table, err)
			return exitFail
		}
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rows); err != nil {
			e.errorf("%v", err)
			return exitFail
		}
		return exitOK
	}
	return printRows(e, rows)
}

// inspectFiles reads table from the files of a stopped agent; file names
// the one that would not open, if that was the error.
func inspectFiles(cfg *config.Config, table string, q status.Query) (rows any, file string, err error) {
	bronzePath := filepath.Join(cfg.DataDir, agent.BronzeFile)
	b, err := buffer.Open(bronzePath, buffer.Options{ReadOnly: true})
	if err != nil {
		return nil, agent.BronzeFile, err
	}
	defer b.Close()
	db, err := agent.OpenState(cfg.DataDir, true)
	if err != nil {
		return nil, agent.StateFile, err
	}
	defer db.Close()
	t, err := agent.NewTables(cfg, b, db)
	if err != nil {
		return nil, "", err
	}
	rows, err = t.Inspect(table, q)
	return rows, "", err
}

// printRows prints any JSON-able rows as one compact JSON object a line,
// which stays readable and greppable for every table.
func printRows(e *env, rows any) int {
	raw, err := json.Marshal(rows)
	if err != nil {
		e.errorf("%v", err)
		return exitFail
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		e.errorf("%v", err)
		return exitFail
	}
	for _, r := range list {
		fmt.Fprintln(e.stdout, string(r))
	}
	fmt.Fprintf(e.stderr, "%d row%s\n", len(list), plural(len(list)))
	return exitOK
}

// openFailed reports a data file a maintenance command could not open,
// with the next step: stop the agent (the file is locked), or move a
// damaged file aside.
func openFailed(e *env, err error, dataDir, file, cmd string) int {
	var hint *agent.HintError
	switch {
	case errors.Is(err, bolt.ErrTimeout):
		e.errorf("%v. Stop the agent first (systemctl stop edgeagent), then run %s again.", err, cmd)
	case errors.As(agent.Damaged(err, dataDir, file), &hint):
		e.errorf("%v\n%s", err, hint.Hint)
		return exitConfig // as run exits: no retry reads a damaged file
	case errors.Is(err, fs.ErrNotExist):
		e.errorf("%v. Nothing is stored in %s yet: check data_dir in the config, or start the agent once.", err, dataDir)
	default:
		e.errorf("%v", err)
	}
	return exitFail
}

func resetStateCmd(_ context.Context, e *env, args []string) int {
	c := lookup("reset-state")
	fs := newFlags(c, e)
	path := fs.String("c", defaultConfigPath, "config file")
	// --yes was required before; scripts that pass it keep working.
	fs.Bool("yes", false, "accepted for compatibility; not needed")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	cfg, code := loadConfig(e, *path, false)
	if cfg == nil {
		return code
	}
	// The rebuild reads Bronze: a damaged one would leave nothing to
	// rebuild from, after the state was dropped.
	if b, err := buffer.Open(filepath.Join(cfg.DataDir, agent.BronzeFile), buffer.Options{ReadOnly: true}); err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			return openFailed(e, err, cfg.DataDir, agent.BronzeFile, "reset-state")
		}
	} else if err := b.Close(); err != nil {
		e.errorf("%v", err)
		return exitFail
	}
	db, err := agent.OpenState(cfg.DataDir, false)
	if err != nil {
		return openFailed(e, err, cfg.DataDir, agent.StateFile, "reset-state")
	}
	defer db.Close()
	if err := window.ResetState(db); err != nil {
		e.errorf("reset state: %v", err)
		return exitFail
	}
	fmt.Fprintf(e.stdout, "Window state reset in %s. Bronze and the outbox are kept.\nStart the agent (systemctl start edgeagent, or edgeagent run -c %s): it reprocesses all retained Bronze records with the current config.\n", cfg.DataDir, *path)
	return exitOK
}

func replayCmd(_ context.Context, e *env, args []string) int {
	c := lookup("replay")
	fs := newFlags(c, e)
	path := fs.String("c", defaultConfigPath, "config file")
	fromS := fs.String("from", "", "event-time range start (inclusive), required")
	toS := fs.String("to", "", "event-time range end (exclusive), required")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *fromS == "" || *toS == "" {
		e.errorf("replay needs --from and --to, e.g. --from 2026-11-28 --to 2026-11-29")
		return exitUsage
	}
	from, err := status.ParseTime(*fromS)
	if err != nil {
		e.errorf("--from: %v", err)
		return exitUsage
	}
	to, err := status.ParseTime(*toS)
	if err != nil {
		e.errorf("--to: %v", err)
		return exitUsage
	}
	if !from.Before(to) {
		e.errorf("--from %s is not before --to %s", from.Format(time.RFC3339), to.Format(time.RFC3339))
		return exitUsage
	}
	cfg, code := loadConfig(e, *path, false)
	if cfg == nil {
		return code
	}
	db, err := agent.OpenState(cfg.DataDir, false)
	if err != nil {
		return openFailed(e, err, cfg.DataDir, agent.StateFile, "replay")
	}
	defer db.Close()
	b, err := buffer.Open(filepath.Join(cfg.DataDir, agent.BronzeFile), buffer.Options{ReadOnly: true})
	if err != nil {
		return openFailed(e, err, cfg.DataDir, agent.BronzeFile, "replay")
	}
	defer b.Close()
	wcfg, err := agent.WindowConfig(cfg, *path, newLogger(e.stderr, cfg.Log.Format, cfg.Log.Level), time.Now)
	if err != nil {
		e.errorf("%v", err)
		return exitFail
	}
	res, err := window.Replay(db, b, wcfg, from, to)
	if err != nil {
		e.errorf("replay: %v", err)
		if errors.Is(err, window.ErrIncompatibleState) {
			// What run would refuse: a replay under it would overwrite
			// other windows at the receiver.
			e.errorf("replay under the config the saved state was built with, or rebuild the state first: edgeagent reset-state -c %s", *path)
			return exitConfig
		}
		return exitFail
	}
	oldest := "nothing"
	if s, err := b.Stats(); err == nil && s.OldestAt > 0 {
		oldest = time.Unix(0, s.OldestAt).UTC().Format(time.RFC3339)
	}
	n := res.Windows
	fmt.Fprintf(e.stdout, "Replayed %d window%s with start in [%s, %s) from Bronze (retained since %s) into the outbox as new revisions.\n",
		n, plural(n), from.Format(time.RFC3339), to.Format(time.RFC3339), oldest)
	if res.Partial > 0 {
		fmt.Fprintf(e.stdout, "Skipped %d window%s starting before %s: Bronze no longer holds every reading they may have had, and a partial window would replace the whole one at the receiver.\n",
			res.Partial, plural(res.Partial), res.WholeFrom.Format(time.RFC3339))
	}
	fmt.Fprintln(e.stdout, "Start the agent to deliver them.")
	return exitOK
}

// counted writes n and the noun in its number: "1 device", "2 devices".
func counted(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// filterElsewhere says, for a filter flag in args that another table
// takes, which tables take it: clearer than the flag package's "flag
// provided but not defined".
func filterElsewhere(table string, args []string) string {
	for _, a := range args {
		if a == "--" {
			break // what follows is not flags
		}
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch {
		case name == "seq" && table != "bronze" && table != "outbox":
			return "--seq applies to bronze and outbox only"
		case name == "reason" && table != "deadletter":
			return "--reason applies to deadletter only"
		}
	}
	return ""
}
