package status

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// RateWindow is the span rates are computed over.
const RateWindow = 10 * time.Second

// Source is the running agent, as the status server sees it.
type Source interface {
	// Snapshot reads the current figures (without Rates and Warnings,
	// which the server adds).
	Snapshot() Snapshot
	// Ready reports whether ingest is connected and the store writable,
	// and if not, why.
	Ready() (bool, string)
	// Inspect returns read-only rows of one table: bronze, late,
	// deadletter or outbox.
	Inspect(table string, q Query) (any, error)
	// Config is the effective config, secrets masked, as YAML.
	Config() []byte
}

// Query filters an inspect request.
type Query struct {
	Device string
	From   time.Time
	To     time.Time
	Reason string
	// Seq is where a bronze or outbox listing starts.
	Seq   uint64
	Limit int
}

// Config configures the server.
type Config struct {
	Listen string
	// Token, when set, is required as "Authorization: Bearer TOKEN" (or
	// ?token=) on every endpoint except /healthz.
	Token string
	// CertFile and KeyFile, when set, make the endpoint serve HTTPS.
	CertFile, KeyFile string
	// Identity is sent with every authorized answer (the Edgeagent-*
	// headers), so that a client reading this config's endpoint can tell
	// this agent from another one holding the same address.
	Identity Identity
	// Limits feed the warnings: the trigger interval a batch should fit in.
	TriggerInterval time.Duration
	Logger          *slog.Logger
	Clock           func() time.Time
}

// ErrNotLoopback is returned by New for a non-loopback listen address
// without a token.
var ErrNotLoopback = errors.New("status: binding to a non-loopback address requires status.token")

// Server is the status endpoint.
type Server struct {
	cfg   Config
	src   Source
	srv   *http.Server
	ln    net.Listener
	certs *certReloader // nil: plain HTTP
	wg    sync.WaitGroup
	ident http.Header // cfg.Identity's headers

	mu      sync.Mutex
	samples []sample
	cancel  context.CancelFunc
}

type sample struct {
	at                         time.Time
	received, processed, bytes uint64
	backlog                    uint64
}

// New validates cfg. It starts nothing.
func New(cfg Config, src Source) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("status: listen %q: %w", cfg.Listen, err)
	}
	if !isLoopback(host) && cfg.Token == "" {
		return nil, ErrNotLoopback
	}
	s := &Server{cfg: cfg, src: src, ident: cfg.Identity.headers()}
	if cfg.CertFile != "" {
		if s.certs, err = newCertReloader(cfg.CertFile, cfg.KeyFile, cfg.Logger); err != nil {
			return nil, err
		}
	} else if !isLoopback(host) {
		cfg.Logger.Warn("status endpoint reachable beyond this machine over plain HTTP: its token and figures cross the network in clear text; set status.tls",
			"addr", cfg.Listen)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.auth(s.readyz))
	mux.HandleFunc("GET /metrics", s.auth(s.metrics))
	mux.HandleFunc("GET /status.json", s.auth(s.statusJSON))
	mux.HandleFunc("GET /inspect/{table}", s.auth(s.inspect))
	mux.HandleFunc("GET /{$}", s.auth(s.page))
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 30 * time.Second,
		// TLS handshake failures and the like: anyone who reaches the port
		// can cause them, so they stay at debug level, structured.
		ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug)}
	return s, nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Start listens and serves until Close; it also samples rates each second.
func (s *Server) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("status: listen on %s: %w", s.cfg.Listen, err)
	}
	if s.certs != nil {
		ln = tls.NewListener(ln, &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: s.certs.get})
	}
	s.ln = ln
	ctx, s.cancel = context.WithCancel(ctx)
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.cfg.Logger.Error("status endpoint stopped", "err", err)
		}
	}()
	go func() {
		defer s.wg.Done()
		s.sampleLoop(ctx)
	}()
	s.cfg.Logger.Info("status endpoint listening", "addr", ln.Addr().String(), "tls", s.certs != nil)
	return nil
}

// Addr is the bound address (useful with port 0).
func (s *Server) Addr() string {
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Close stops the server. Safe to call twice.
func (s *Server) Close() error {
	if s.cancel == nil {
		return nil
	}
	s.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	s.wg.Wait()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("status: shutdown: %w", err)
	}
	return nil
}

func (s *Server) sampleLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		s.record(s.src.Snapshot())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Server) record(snap Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples = append(s.samples, sample{at: s.cfg.Clock(), received: snap.Ingest.ReceivedTotal,
		processed: snap.Window.ProcessedTotal, bytes: snap.Uplink.BytesSent, backlog: snap.Bronze.BacklogRecords})
	// Keep RateWindow plus one sample.
	for len(s.samples) > 2 && s.samples[len(s.samples)-1].at.Sub(s.samples[1].at) >= RateWindow {
		s.samples = s.samples[1:]
	}
}

// Current returns a full snapshot: figures, rates and warnings.
func (s *Server) Current() Snapshot {
	snap := s.src.Snapshot()
	s.mu.Lock()
	if n := len(s.samples); n >= 2 {
		a, b := s.samples[0], s.samples[n-1]
		if dt := b.at.Sub(a.at).Seconds(); dt > 0 {
			snap.Rates = Rates{
				InputPerSecond:     float64(b.received-a.received) / dt,
				ProcessedPerSecond: float64(b.processed-a.processed) / dt,
				BacklogGrowth:      (float64(b.backlog) - float64(a.backlog)) / dt,
				SentPerSecond:      float64(b.bytes-a.bytes) / dt,
			}
		}
	}
	s.mu.Unlock()
	// [] rather than null in JSON when all is well.
	snap.Warnings = append([]string{}, Warnings(&snap, s.cfg.TriggerInterval)...)
	if s.certs != nil {
		if w := s.certs.expiryWarning(s.cfg.Clock()); w != "" {
			snap.Warnings = append(snap.Warnings, w)
		}
	}
	return snap
}

// Thresholds for warnings.
const (
	outboxNearFraction = 0.8
	bronzeNearFraction = 0.8
	linkDownWarnAfter  = 5 * time.Minute
	backlogWarnRecords = 1000
	// sessionLostWarnFor is how long a lost broker session stays a warning.
	sessionLostWarnFor = time.Hour
	// clockBackWarnAfter: an NTP step of a few seconds is no news.
	clockBackWarnAfter = time.Minute
)

// Warnings lists what an operator should look at in snap.
func Warnings(snap *Snapshot, trigger time.Duration) []string {
	var w []string
	if !snap.Ingest.Connected {
		w = append(w, "ingest is not connected to the MQTT broker")
	}
	if snap.Ingest.SubscribeError != "" {
		w = append(w, "the broker did not grant every subscription: "+snap.Ingest.SubscribeError)
	}
	// An event, not a state: it warns for a while, and the counter and
	// session_lost_at keep it after that.
	if at := snap.Ingest.SessionLostAt; !at.IsZero() && snap.Time.Sub(at) < sessionLostWarnFor {
		w = append(w, fmt.Sprintf("the broker lost the agent's session at %s (%d time(s) since start): what it had queued for the agent then is gone (keep sessions across broker restarts: mosquitto's persistence true)",
			at.Format(time.RFC3339), snap.Ingest.SessionsLost))
	}
	if snap.Ingest.BronzeFull {
		w = append(w, "Bronze is full of unprocessed records: acknowledgements are held, the broker is queueing")
	}
	if snap.Window.Failing {
		w = append(w, "window batches failing, retried with backoff: "+snap.Window.LastError)
	}
	if snap.Window.Blocked {
		w = append(w, "window stage paused: the outbox is at storage.outbox_max_bytes")
	}
	if snap.Rates.BacklogGrowth > 0 && snap.Bronze.BacklogRecords > backlogWarnRecords {
		w = append(w, fmt.Sprintf("Bronze backlog growing: %d records, +%.0f/s", snap.Bronze.BacklogRecords, snap.Rates.BacklogGrowth))
	}
	if trigger > 0 && snap.Window.LastBatchSeconds > trigger.Seconds() {
		w = append(w, fmt.Sprintf("batches slower than the trigger: last %.2fs > %.2fs", snap.Window.LastBatchSeconds, trigger.Seconds()))
	}
	if snap.Outbox.MaxBytes > 0 && float64(snap.Outbox.Bytes) >= outboxNearFraction*float64(snap.Outbox.MaxBytes) {
		w = append(w, fmt.Sprintf("outbox near its bound: %s of %s", Bytes(int64(snap.Outbox.Bytes)), Bytes(snap.Outbox.MaxBytes)))
	}
	// Processed records fill Bronze up to its bound by design (retention
	// keeps them until room is needed): only unprocessed ones are a risk.
	if snap.Bronze.MaxBytes > 0 && float64(snap.Bronze.UnprocessedBytes) >= bronzeNearFraction*float64(snap.Bronze.MaxBytes) {
		w = append(w, fmt.Sprintf("Bronze near its bound with unprocessed records: about %s of %s", Bytes(snap.Bronze.UnprocessedBytes), Bytes(snap.Bronze.MaxBytes)))
	}
	downLong := false
	if snap.Uplink.State != "up" && snap.Uplink.State != "disabled" && !snap.Uplink.DownSince.IsZero() {
		if d := snap.Uplink.downFor(snap.Time); d >= linkDownWarnAfter {
			downLong = true
			w = append(w, withReason(fmt.Sprintf("uplink down for %s", d.Round(time.Second)), snap.Uplink.LastError))
		}
	}
	// A link that comes up and fails again (a batch the server refuses)
	// is never down for long; what shows it is that nothing is delivered.
	if !downLong && snap.Uplink.SealedBatches > 0 && !snap.Uplink.FailingSince.IsZero() {
		if d := snap.Uplink.failingFor(snap.Time); d >= linkDownWarnAfter {
			w = append(w, withReason(fmt.Sprintf("uplink not delivering for %s (it connects, but the oldest batch is refused or not acknowledged)", d.Round(time.Second)), snap.Uplink.LastError))
		}
	}
	if n := snap.Ingest.BrokerDropped; n > 0 {
		w = append(w, fmt.Sprintf("embedded broker dropped %d messages for a client whose write queue was full (mqtt.embedded.max_pending_writes)", n))
	}
	if !snap.Window.LoggedClock.IsZero() && !snap.Time.IsZero() {
		if d := snap.Window.LoggedClock.Sub(snap.Time); d >= clockBackWarnAfter {
			w = append(w, fmt.Sprintf("the gateway clock went back: the logged clock is %s ahead of it; idle closes, device expiry and revisions run at half speed until the clock catches up, after about twice the step (see the operations guide, wrong gateway clock)", d.Round(time.Second)))
		}
	}
	if snap.ReloadRefused != "" {
		w = append(w, "the last reload was refused, and the agent runs the config it started with: "+snap.ReloadRefused)
	}
	if snap.Ingest.CommitFailing {
		w = append(w, "Bronze commits failing: "+snap.Ingest.LastCommitError)
	}
	// Local messages go out in order: one the broker keeps refusing holds
	// every alert behind it.
	if a := snap.Alerts; a != nil && a.LocalLastError != "" {
		w = append(w, "local publishing failing, retried with backoff (the alerts and aggregates behind it wait): "+a.LocalLastError)
	}
	return w
}

// withReason appends ": reason" when there is one.
func withReason(s, reason string) string {
	if reason == "" {
		return s
	}
	return s + ": " + reason
}

// Bytes formats a byte count with binary units.
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// auth answers only requests with the token (when one is set), and names
// the agent in the answers it lets through: data_dir's path is not for
// whoever can reach the port without the token. Not inlined: each of its
// routes would carry its own copy of both closures (arm64 budget).
//
//go:noinline
func (s *Server) auth(h http.HandlerFunc) http.HandlerFunc {
	identified := func(w http.ResponseWriter, r *http.Request) {
		hdr := w.Header()
		for k, v := range s.ident {
			hdr[k] = v
		}
		h(w, r)
	}
	if s.cfg.Token == "" {
		return identified
	}
	want := []byte(s.cfg.Token)
	return func(w http.ResponseWriter, r *http.Request) {
		got := r.URL.Query().Get("token")
		if a := r.Header.Get("Authorization"); strings.HasPrefix(a, "Bearer ") {
			got = strings.TrimPrefix(a, "Bearer ")
		}
		if subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="edgeagent"`)
			http.Error(w, "status endpoint: missing or wrong token (send Authorization: Bearer <status.token>)", http.StatusUnauthorized)
			return
		}
		identified(w, r)
	}
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(w, "ok")
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if ok, why := s.src.Ready(); !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "not ready:", why)
		return
	}
	fmt.Fprintln(w, "ready")
}

func (s *Server) statusJSON(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, s.Current())
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// inspectParams are the query parameters /inspect reads: the filters
// and the token.
var inspectParams = []string{"device", "from", "to", "reason", "seq", "limit", "token"}

func (s *Server) inspect(w http.ResponseWriter, r *http.Request) {
	vals := r.URL.Query()
	for k := range vals {
		// A misspelt filter would return every row as if it had matched.
		if !slices.Contains(inspectParams, k) {
			http.Error(w, fmt.Sprintf("unknown parameter %q (filters: device, from, to, reason, seq, limit)", k), http.StatusBadRequest)
			return
		}
	}
	q, err := ParseQuery(vals.Get)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rows, err := s.src.Inspect(r.PathValue("table"), q)
	if err != nil {
		code := http.StatusInternalServerError
		switch {
		case errors.Is(err, ErrUnknownTable):
			code = http.StatusNotFound
		case errors.Is(err, ErrBadQuery):
			code = http.StatusBadRequest
		}
		http.Error(w, err.Error(), code)
		return
	}
	writeJSON(w, rows)
}

// ErrUnknownTable is returned by Inspect for a table it does not know.
var ErrUnknownTable = errors.New("status: unknown table (want bronze, late, deadletter or outbox)")

// ErrBadQuery is returned by Inspect for a filter the table does not apply.
var ErrBadQuery = errors.New("status: bad inspect query")

// ParseQuery reads inspect filters from URL query values (get returns ""
// when absent): device, from, to (RFC 3339), reason, seq, limit.
func ParseQuery(get func(string) string) (Query, error) {
	q := Query{Device: get("device"), Reason: get("reason"), Limit: 100}
	var err error
	for _, f := range []struct {
		key string
		dst *time.Time
	}{{"from", &q.From}, {"to", &q.To}} {
		if v := get(f.key); v != "" {
			if *f.dst, err = ParseTime(v); err != nil {
				return q, fmt.Errorf("%s: %w", f.key, err)
			}
		}
	}
	if v := get("seq"); v != "" {
		if q.Seq, err = strconv.ParseUint(v, 10, 64); err != nil {
			return q, fmt.Errorf("seq: %q is not a sequence number", v)
		}
	}
	if v := get("limit"); v != "" {
		if q.Limit, err = strconv.Atoi(v); err != nil || q.Limit < 1 {
			return q, fmt.Errorf("limit: %q is not a positive number", v)
		}
	}
	return q, nil
}

// ParseTime accepts RFC 3339 ("2026-11-29T10:00:00Z"), a date
// ("2026-11-29", UTC midnight), Unix seconds, or Unix milliseconds (12
// digits or more: window starts and ends on the wire are milliseconds, and
// as seconds they would be tens of thousands of years ahead).
func ParseTime(v string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if t, err := time.Parse("2006-01-02", v); err == nil {
		return t, nil
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n >= 1e11 || n <= -1e11 {
			return time.UnixMilli(n).UTC(), nil
		}
		return time.Unix(n, 0).UTC(), nil
	}
	return time.Time{}, fmt.Errorf("%q is not a time: use RFC 3339 (2026-11-29T10:00:00Z), a date (2026-11-29), Unix seconds or Unix milliseconds", v)
}
