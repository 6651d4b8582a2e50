// Package agent wires the stages of edgeagent together from a validated
// config — Bronze, ingest, the window stage, the uplink — and owns their
// lifecycle: start order, the shutdown drain and the periodic Bronze trim.
package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/cmd/edgeagent/status"
	"github.com/edgeagent/edgeagent/config"
	"github.com/edgeagent/edgeagent/ingest"
	"github.com/edgeagent/edgeagent/internal/boltkv"
	"github.com/edgeagent/edgeagent/internal/exepages"
	"github.com/edgeagent/edgeagent/uplink"
	"github.com/edgeagent/edgeagent/uplink/local"
	"github.com/edgeagent/edgeagent/window"
	"github.com/edgeagent/edgeagent/window/alert"
)

// File names inside data_dir.
const (
	BronzeFile = "bronze.db"
	StateFile  = "state.db"
	// SessionFile names the broker and client id the agent last subscribed
	// with, so a broker that lost that session can be told from a new one.
	SessionFile = "mqtt-session"
)

// HintError is an error with a next step for the person at the keyboard.
type HintError struct {
	Err  error
	Hint string
}

func (e *HintError) Error() string { return e.Err.Error() }
func (e *HintError) Unwrap() error { return e.Err }

// Options are the command-line side of the agent.
type Options struct {
	Logger     *slog.Logger
	ConfigPath string
	Version    string
	// Clock defaults to time.Now.
	Clock func() time.Time
	// Files, when set, are data_dir's files already open (a reload hands
	// them from the agent it stopped): Open uses them instead of opening
	// the files again, which reads every page of a large Bronze (tens of
	// seconds for a gigabyte on a cold cache). A successful Open owns them;
	// after a failed one the caller still does.
	Files *Files
}

// Files are an agent's open data files.
type Files struct {
	Bronze *buffer.Bronze
	State  *bolt.DB
	// uplinkNotUp and uplinkFailing carry the uplink's outage over a
	// reload, so the status's warnings count from when it began.
	uplinkNotUp, uplinkFailing time.Time
}

// Close closes both files.
func (f *Files) Close() error {
	var errs []error
	if f.State != nil {
		if err := f.State.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close state: %w", err))
		}
	}
	if f.Bronze != nil {
		errs = append(errs, f.Bronze.Close())
	}
	return errors.Join(errs...)
}

// Agent is a running gateway agent.
type Agent struct {
	cfg  *config.Config
	opts Options
	log  *slog.Logger

	Bronze    *buffer.Bronze
	State     *bolt.DB
	Ingest    *ingest.Ingester
	Stage     *window.Stage
	Uplink    *uplink.Uplink   // nil when no uplink is configured
	Status    *status.Server   // nil when status.listen is ""
	Alerts    *alert.Engine    // nil without alert rules or local republishing
	Local     *local.Publisher // nil when nothing is published locally
	localSink interface{ Close() error }
	// exe is the executable's clean pages, released with the data files'.
	exe *exepages.Pages
	// reloadRefused is why the last reload was refused (see ReloadRefused).
	reloadRefused atomic.Pointer[string]
	// sendGate keeps the uplink and the local publisher from reading
	// outbox rows above Bronze's revision floor (window.Config.SendGate).
	sendGate sync.RWMutex

	// ownsFiles says Close closes Bronze and State (see Detach).
	ownsFiles bool
	// stopWait bounds how long Run waits for its stages to stop (15 s);
	// stragglers says it gave up on one, which may still use the files.
	stopWait   time.Duration
	stragglers bool
	closeOnce  sync.Once
	closeErr   error
}

// ReloadRefused records why a reload was refused, for the status: the
// config file is then not the config in force.
func (a *Agent) ReloadRefused(reason string) { a.reloadRefused.Store(&reason) }

// Detach hands the agent's data files to the caller, for the next Open
// after a reload; Close then leaves them open. Call it after Run and
// before Close. It returns nil, and Close closes the files as usual, when
// Run gave up waiting for a stage to stop: that stage may still write to
// them, and the next agent must not share them with it.
func (a *Agent) Detach() *Files {
	if a.stragglers {
		return nil
	}
	a.ownsFiles = false
	f := &Files{Bronze: a.Bronze, State: a.State}
	if a.Uplink != nil {
		s := a.Uplink.Stats()
		f.uplinkNotUp, f.uplinkFailing = s.NotUpSince, s.FailingSince
	}
	return f
}

// CheckReload reports whether cfg would open over this agent's data as Open
// would open it, short of the files and ports Open takes: every stage
// accepts its settings and the window state matches them. A reload checks
// a config with it before it stops the running agent, so that a change
// the start would refuse (a changed window.size, a setting a stage
// refuses) leaves the agent running instead of down.
func (a *Agent) CheckReload(cfg *config.Config) error {
	if cfg.DataDir != a.cfg.DataDir {
		// The check reads this agent's state, not the other directory's.
		return fmt.Errorf("data_dir changed from %s to %s: moving the data takes a restart, not a reload", a.cfg.DataDir, cfg.DataDir)
	}
	// An address the new config listens on that something else holds
	// would fail the start after the running agent stopped.
	for _, l := range []struct{ key, old, new string }{
		{"status.listen", a.cfg.Status.Listen, cfg.Status.Listen},
		{"mqtt.embedded.listen", embeddedListen(a.cfg), embeddedListen(cfg)},
	} {
		if l.new == "" || l.new == l.old {
			continue
		}
		ln, err := net.Listen("tcp", l.new)
		if err != nil {
			return fmt.Errorf("%s %s: %w", l.key, l.new, err)
		}
		if err := ln.Close(); err != nil {
			return fmt.Errorf("%s %s: %w", l.key, l.new, err)
		}
	}
	if icfg, err := ingestConfig(cfg, a.log, a.opts.Clock); err != nil {
		return err
	} else if err := icfg.Validate(); err != nil {
		return err
	}
	wcfg, err := WindowConfig(cfg, a.opts.ConfigPath, a.log, a.opts.Clock)
	if err != nil {
		return err
	}
	if err := window.CheckState(a.State, wcfg); err != nil {
		return err
	}
	if ucfg, ok, err := uplinkConfig(cfg, a.log, a.opts.Clock); err != nil {
		return err
	} else if ok {
		if err := ucfg.Validate(); err != nil {
			return err
		}
	}
	if err := alertConfig(cfg, a.log).Validate(); err != nil {
		return fmt.Errorf("alerts: %w", err)
	}
	return nil
}

// embeddedListen is the built-in broker's address, "" with an external one.
func embeddedListen(cfg *config.Config) string {
	if cfg.MQTT.Broker != "embedded" {
		return ""
	}
	return cfg.MQTT.Embedded.Listen
}

// alertConfig maps the alert rules and local publishing (OnLocal unset).
func alertConfig(cfg *config.Config, log *slog.Logger) alert.Config {
	return alert.Config{
		Gateway: cfg.GatewayID, Rules: cfg.Alerts, LocalPublish: cfg.LocalPublish,
		Expiry: time.Duration(cfg.Window.DeviceExpiry), Logger: log.With("component", "alerts"),
	}
}

// Open opens the data files and builds every stage. It starts nothing.
func Open(cfg *config.Config, opts Options) (*Agent, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	a := &Agent{cfg: cfg, opts: opts, log: opts.Logger, stopWait: 15 * time.Second}
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return nil, fmt.Errorf("create data_dir %s: %w", cfg.DataDir, err)
	}
	var err error
	if f := opts.Files; f != nil {
		// Until Open succeeds they stay the caller's: the error paths'
		// Close leaves them open.
		a.Bronze, a.State = f.Bronze, f.State
		a.Bronze.SetLimits(time.Duration(cfg.Storage.BronzeRetention), int64(cfg.Storage.BronzeMaxBytes))
	} else {
		a.ownsFiles = true
		a.Bronze, err = buffer.Open(filepath.Join(cfg.DataDir, BronzeFile), buffer.Options{
			Retention: time.Duration(cfg.Storage.BronzeRetention),
			MaxBytes:  int64(cfg.Storage.BronzeMaxBytes),
			Clock:     opts.Clock,
		})
		if err != nil {
			return nil, Damaged(err, cfg.DataDir, BronzeFile)
		}
		a.State, err = OpenState(cfg.DataDir, false)
		if err != nil {
			a.Close()
			return nil, Damaged(err, cfg.DataDir, StateFile)
		}
	}
	icfg, err := ingestConfig(cfg, opts.Logger, opts.Clock)
	if err != nil {
		a.Close()
		return nil, err
	}
	icfg.SessionFile = filepath.Join(cfg.DataDir, SessionFile)
	a.Ingest, err = ingest.New(a.Bronze, icfg)
	if err != nil {
		a.Close()
		return nil, err
	}
	wcfg, err := WindowConfig(cfg, opts.ConfigPath, opts.Logger, opts.Clock)
	if err != nil {
		a.Close()
		return nil, err
	}
	if err := a.openAlerts(); err != nil {
		a.Close()
		return nil, err
	}
	if a.Alerts != nil {
		wcfg.Observer = a.Alerts
	}
	// The uplink is opened below; by the time the stage runs it is set.
	wcfg.Committed = func() {
		if a.Uplink != nil {
			a.Uplink.Notify()
		}
	}
	wcfg.SendGate = &a.sendGate
	a.Stage, err = window.New(a.State, a.Bronze, wcfg)
	if err != nil {
		a.Close()
		if errors.Is(err, window.ErrIncompatibleState) {
			return nil, &HintError{Err: err, Hint: fmt.Sprintf("the saved window state does not match the config; to rebuild it from Bronze run: edgeagent reset-state -c %s", opts.ConfigPath)}
		}
		if errors.Is(err, window.ErrCorruptState) {
			// Rows bbolt reads and the stage cannot: a restart cannot fix
			// them either, and reset-state, which keeps the outbox, can.
			return nil, &HintError{Err: err, Hint: fmt.Sprintf("the window state in %s is damaged; to rebuild it from Bronze, keeping the aggregates not yet uplinked, run: edgeagent reset-state -c %s",
				filepath.Join(cfg.DataDir, StateFile), opts.ConfigPath)}
		}
		return nil, fmt.Errorf("open window stage: %w", err)
	}
	if err := a.continueBronze(); err != nil {
		a.Close()
		return nil, err
	}
	if ucfg, ok, err := uplinkConfig(cfg, opts.Logger, opts.Clock); err != nil {
		a.Close()
		return nil, err
	} else if ok {
		ucfg.OutboxGate = &a.sendGate
		if f := opts.Files; f != nil {
			ucfg.NotUpSince, ucfg.FailingSince = f.uplinkNotUp, f.uplinkFailing
		}
		a.Uplink, err = uplink.New(a.State, ucfg)
		if err != nil {
			a.Close()
			return nil, fmt.Errorf("open uplink: %w", err)
		}
	} else {
		opts.Logger.Warn("no uplink configured (uplink.nats.url and uplink.mqtt.broker are empty): aggregates stay in the outbox until one is")
	}
	if cfg.Status.Listen != "" {
		tables, err := NewTables(cfg, a.Bronze, a.State)
		if err != nil {
			a.Close()
			return nil, err
		}
		redacted, err := cfg.Redacted().YAML()
		if err != nil {
			a.Close()
			return nil, fmt.Errorf("render effective config: %w", err)
		}
		src := &statusSource{a: a, tables: tables, started: opts.Clock(), config: redacted}
		a.Status, err = status.New(status.Config{Listen: cfg.Status.Listen, Token: cfg.Status.Token,
			Identity: status.AgentIdentity(cfg.GatewayID, cfg.DataDir),
			CertFile: cfg.Status.TLS.CertFile, KeyFile: cfg.Status.TLS.KeyFile,
			TriggerInterval: time.Duration(cfg.Processing.TriggerInterval), Logger: opts.Logger.With("component", "status"), Clock: opts.Clock}, src)
		if err != nil {
			a.Close()
			return nil, err
		}
	}
	a.ownsFiles = true
	// The start read both files whole (boltkv.Open's walk, bbolt's
	// freelist rebuild, the stage's load), which mapped them into the
	// resident set: a 40 MB Bronze kept 12 MiB of it until trimLoop's
	// first release, 250 ms in, the peak of a backlog's drain. Go's start
	// ran every package's init function, which mapped nearly the whole
	// executable; the agent's code comes back as it runs.
	a.exe = exepages.Find()
	a.releaseMapped(true)
	return a, nil
}

// releaseMapped takes the data files' pages that bbolt's reads mapped out
// of the resident set (boltkv.DropMapped), and the executable's code and
// read-only data (the collector reads the function tables of every
// goroutine's frames as it scans stacks); with start, the executable's
// pages also leave the page cache (see exepages.Pages.Drop).
func (a *Agent) releaseMapped(start bool) {
	// Each error names its file (one Warn: the arm64 binary's code room).
	for _, err := range [...]error{a.exe.Drop(start), a.Bronze.DropMapped(), boltkv.DropMapped(a.State)} {
		if err != nil {
			a.log.Warn("releasing mapped pages failed", "err", err)
		}
	}
}

// Damaged adds the recovery step to the error of a data file bbolt cannot
// read. A restart cannot fix it, so the agent exits as for an invalid
// config, and systemd does not restart it into the same error.
func Damaged(err error, dataDir, file string) error {
	if !errors.Is(err, boltkv.ErrDamaged) {
		return err
	}
	path := filepath.Join(dataDir, file)
	hint := fmt.Sprintf("%s is damaged and cannot be read. Keep it for analysis and start without it: mv %s %s.damaged", path, path, path)
	switch file {
	case BronzeFile:
		hint += "; the agent starts a new log and numbers its records after what the window stage processed. Lost with the old file: the records the window stage had not processed yet (the broker does not send acknowledged messages again)."
	case StateFile:
		hint += "; the agent rebuilds the window state from the retained Bronze records, with revisions above the highest Bronze recorded. Lost with the old file: the aggregates and alerts not yet uplinked, the late and dead-letter tables, and windows older than Bronze's retention."
	}
	return &HintError{Err: err, Hint: hint}
}

// continueBronze makes new Bronze records follow the window stage's
// offset when the log ends before it: the file was deleted, truncated or
// restored from an older copy. Numbered from 1 again, new records would
// count as processed — acknowledged to the broker, never windowed.
func (a *Agent) continueBronze() error {
	// Past the outputs already written, not only the checkpoint: after a
	// crash a new record numbered in between would count as replayed.
	offset, last := a.Stage.Stats().WrittenThrough, a.Bronze.LastSeq()
	moved, err := a.Bronze.SkipTo(offset)
	if err != nil {
		return err
	}
	if moved {
		a.log.Warn("bronze: the log ends before the window stage's offset: bronze.db was lost, truncated or replaced by an older copy, and the records after its end are gone; new records continue after the offset",
			"bronze_last_seq", last, "window_offset", offset, "path", a.Bronze.Path())
	}
	return nil
}

// OpenState opens the state database (window state, outbox, uplink batches).
func OpenState(dataDir string, readOnly bool) (*bolt.DB, error) {
	path := filepath.Join(dataDir, StateFile)
	if readOnly {
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("open state %s: %w", path, err)
		}
	}
	// Group-readable like Bronze (buffer.Open): the umask decides.
	db, err := boltkv.Open(path, 0o640, readOnly, window.StatePageSize)
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("open state %s: locked by another process (is the agent running?): %w", path, err)
		}
		return nil, fmt.Errorf("open state %s: %w", path, err)
	}
	return db, nil
}

// Run starts every stage and blocks until ctx ends, then shuts down in
// order: ingest stops taking messages and commits what it holds, the window
// stage finishes its batch, the uplink stops, the files are closed by Close.
func (a *Agent) Run(ctx context.Context) error {
	a.log.Info("edgeagent starting", "version", a.opts.Version, "gateway", a.cfg.GatewayID, "data_dir", a.cfg.DataDir)
	if a.Status != nil {
		if err := a.Status.Start(ctx); err != nil {
			return err
		}
	}
	if err := a.Ingest.Start(ctx); err != nil {
		return fmt.Errorf("start ingest: %w", err)
	}
	stageCtx, stopStage := context.WithCancel(context.Background())
	upCtx, stopUplink := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := a.Stage.Run(stageCtx); err != nil {
			errs <- fmt.Errorf("window stage: %w", err)
		}
	}()
	if a.Uplink != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.Uplink.Run(upCtx); err != nil {
				errs <- fmt.Errorf("uplink: %w", err)
			}
		}()
	}
	if a.Local != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.Local.Run(upCtx); err != nil {
				errs <- fmt.Errorf("local publisher: %w", err)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.trimLoop(stageCtx)
	}()

	var runErr error
	select {
	case <-ctx.Done():
		a.log.Info("shutting down: finishing the batch in hand")
	case runErr = <-errs:
		a.log.Error("stage failed; shutting down", "err", runErr)
	}
	a.Ingest.Close()
	stopStage()
	stopUplink()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(a.stopWait):
		a.stragglers = true
		a.log.Error("shutdown: stages did not stop in time; closing anyway", "waited", a.stopWait)
	}
	a.log.Info("edgeagent stopped")
	return runErr
}

// ErrUndelivered is returned by RunOnce when aggregates or alerts are left
// in the outbox at its end: they are kept for the next run.
var ErrUndelivered = errors.New("outbox not delivered")

// RunOnce processes everything already in Bronze, flushes, tries to deliver
// the outbox to the uplink for up to the ack timeout (at least 5 s), and
// returns (`run --once`). Aggregates or alerts a configured uplink left
// undelivered are an ErrUndelivered, so a job runner sees that they have
// not reached the cloud yet; with no uplink configured they stay in the
// outbox and the run succeeds. Local messages are not published: they are
// for live subscribers on the gateway's broker (which, when it is the
// built-in one, does not run here), and wait for the next run of the agent.
func (a *Agent) RunOnce(ctx context.Context) error {
	if err := a.Stage.RunOnce(); err != nil {
		return fmt.Errorf("window stage: %w", err)
	}
	// Nothing publishes local rows during --once, so they are counted once
	// (a scan of the outbox) and left out of every poll after.
	var local uint64
	if err := a.State.View(func(tx *bolt.Tx) (err error) {
		local, err = outbox.CountKind(tx, outbox.KindLocal)
		return err
	}); err != nil {
		return fmt.Errorf("read outbox: %w", err)
	}
	if a.Uplink == nil {
		// No uplink is a choice, not a failure: everything was processed,
		// and the outbox keeps the aggregates until one is configured.
		rows, sealed, err := a.outboxLeft(local)
		if err != nil {
			return err
		}
		if rows+sealed > 0 {
			a.log.Info("run --once: no uplink configured; aggregates and alerts stay in the outbox until one is", "rows", rows, "sealed_batches", sealed)
		}
		return nil
	}
	upCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- a.Uplink.Run(upCtx) }()
	wait := max(time.Duration(a.cfg.Uplink.AckTimeout), 5*time.Second)
	deadline := time.Now().Add(wait)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	rows, sealed, err := a.outboxLeft(local)
	for err == nil && rows+sealed > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		select {
		case <-tick.C:
		case <-ctx.Done():
		}
		rows, sealed, err = a.outboxLeft(local)
	}
	cancel()
	if uerr := <-errc; uerr != nil {
		return fmt.Errorf("uplink: %w", uerr)
	}
	switch {
	case err != nil:
		return err
	case rows+sealed > 0:
		st := a.Uplink.Stats()
		var what []string
		switch {
		case sealed == 1:
			what = append(what, "1 sealed batch")
		case sealed > 1:
			what = append(what, fmt.Sprintf("%d sealed batches", sealed))
		}
		if rows > 0 {
			what = append(what, fmt.Sprintf("%d aggregates and alerts not yet sealed", rows))
		}
		return fmt.Errorf("%w: after %v the uplink has not acknowledged %s (link %s, last error %q); they stay in the outbox for the next run",
			ErrUndelivered, wait, strings.Join(what, " and "), st.Link, st.LastError)
	}
	return nil
}

// outboxLeft returns the outbox rows for the uplink (the local rows'
// count, local, left out) not yet sealed, and the batches sealed but not
// acknowledged.
func (a *Agent) outboxLeft(local uint64) (rows, sealed uint64, err error) {
	err = a.State.View(func(tx *bolt.Tx) error {
		st, err := outbox.ReadStats(tx)
		if err != nil {
			return err
		}
		rows = st.Rows - min(local, st.Rows)
		// From the database, not the uplink's stats: those know of the
		// batches an earlier run sealed only once the uplink has loaded
		// them, and a --once that asked first saw none and exited 0.
		bl, err := uplink.ReadBacklog(tx)
		sealed = bl.Batches
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("read outbox: %w", err)
	}
	return rows, sealed, nil
}

// trimLoop applies Bronze retention behind the window checkpoint every 5 s,
// and every dropMappedEvery takes the file pages bbolt's reads touched out
// of the resident set (boltkv.DropMapped), so the agent's RSS is its heap,
// not its data files.
func (a *Agent) trimLoop(ctx context.Context) {
	t := time.NewTicker(dropMappedEvery)
	defer t.Stop()
	trimEvery := int(5 * time.Second / dropMappedEvery)
	for tick := 1; ; tick++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for tick%trimEvery == 0 {
			n, err := a.Bronze.Trim(10_000)
			if err != nil {
				a.log.Error("bronze retention failed", "err", err)
				break
			}
			if n < 10_000 {
				break
			}
		}
		a.releaseMapped(false)
	}
}

// dropMappedEvery: the kernel maps up to 16 cached pages around each page
// a read faults in (fault-around), so a checkpoint that reads a few
// hundred leaf pages maps megabytes of the state file within a second.
// Load mode, 10,000 devices, three alternated pairs: peak RSS 112-117 MiB
// at 250 ms against 123-128 MiB at 1 s, CPU per reading within the runs'
// noise; the advice costs one madvise per file.
const dropMappedEvery = 250 * time.Millisecond

// Close closes the files. Safe to call twice.
func (a *Agent) Close() error {
	a.closeOnce.Do(func() {
		if a.Status != nil {
			a.Status.Close()
		}
		if a.Ingest != nil {
			a.Ingest.Close()
		}
		if a.Uplink != nil {
			a.Uplink.Close()
		}
		if a.Local != nil {
			a.Local.Close()
		}
		if a.localSink != nil {
			a.localSink.Close()
		}
		if a.ownsFiles {
			a.closeErr = (&Files{Bronze: a.Bronze, State: a.State}).Close()
		}
	})
	return a.closeErr
}

// tlsConfig builds a client TLS config from the file paths, nil when unset.
func tlsConfig(t config.TLS, what string) (*tls.Config, error) {
	if t.IsZero() {
		return nil, nil
	}
	c := &tls.Config{InsecureSkipVerify: t.InsecureSkipVerify, MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%s.tls.ca_file: %w", what, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s.tls.ca_file %s: no PEM certificates in it", what, t.CAFile)
		}
		c.RootCAs = pool
	}
	if t.CertFile != "" || t.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%s.tls.cert_file/key_file: %w", what, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// openAlerts builds the alert engine and, when it publishes locally, the
// local publisher with a sink on the gateway's own broker: the embedded one
// inline, an external one through its own MQTT session.
func (a *Agent) openAlerts() error {
	cfg := a.cfg
	if len(cfg.Alerts) == 0 && cfg.LocalPublish.AggregatesTopic == "" {
		return nil
	}
	var notify func()
	acfg := alertConfig(cfg, a.log)
	acfg.OnLocal = func() {
		if notify != nil {
			notify()
		}
	}
	eng, err := alert.New(a.State, acfg)
	if err != nil {
		return fmt.Errorf("alerts: %w", err)
	}
	a.Alerts = eng
	if !eng.Local() {
		return nil
	}
	var sink local.Sink
	if cfg.MQTT.Broker == "embedded" {
		sink = local.SinkFunc(a.Ingest.Publish)
	} else {
		tc, err := tlsConfig(cfg.MQTT.TLS, "mqtt")
		if err != nil {
			return err
		}
		ps, err := local.NewPahoSink(local.PahoConfig{Broker: cfg.MQTT.Broker, Gateway: cfg.GatewayID,
			Username: cfg.MQTT.Username, Password: cfg.MQTT.Password, TLS: tc, Logger: a.log.With("component", "local")})
		if err != nil {
			return fmt.Errorf("local publisher: %w", err)
		}
		sink, a.localSink = ps, ps
	}
	a.Local, err = local.New(a.State, local.Config{Gateway: cfg.GatewayID, Sink: sink, Logger: a.log.With("component", "local"), Clock: a.opts.Clock,
		OutboxGate: &a.sendGate})
	if err != nil {
		return fmt.Errorf("local publisher: %w", err)
	}
	notify = a.Local.Notify
	return nil
}
