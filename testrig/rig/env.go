// Package rig runs edgeagent end to end against simulated devices, injected
// faults and a verifying cloud: scenario runs (edgerig run), the live demo
// (edgerig demo) and load mode (edgerig load).
package rig

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgeagent/edgeagent/testrig/agentproc"
	"github.com/edgeagent/edgeagent/testrig/faultproxy"
	"github.com/edgeagent/edgeagent/testrig/scenario"
	"github.com/edgeagent/edgeagent/testrig/servers"
	"github.com/edgeagent/edgeagent/testrig/verify"
)

// ErrAgent wraps failures of the agent process itself (it does not start,
// exits, never connects).
var ErrAgent = errors.New("rig: agent")

// ErrNoAgent is returned when the agent binary does not exist.
var ErrNoAgent = errors.New("rig: agent binary not found")

// envConfig says which servers a run needs.
type envConfig struct {
	dir      string
	agentBin string
	agent    scenario.Agent
	// mqtt and nats are external servers ("" starts in-process ones).
	mqtt, nats string
	// mosquitto prefers a persistent mosquitto over mochi (broker
	// restarts); requireMosquitto makes its absence an error.
	mosquitto, requireMosquitto bool
	// uplink is UplinkNATS ("" too) or UplinkMQTT; uplinkBroker an
	// external MQTT uplink broker ("" starts an in-process one).
	uplink, uplinkBroker string
	// embedded makes the agent run its own broker.
	embedded bool
	// diskFull says the scenario has a disk_full fault; tmpfsBytes > 0
	// puts data_dir on a tmpfs of that size for it, where the machine
	// allows (else, and with tmpfsBytes 0, the fault injects write errors).
	diskFull   bool
	tmpfsBytes int64
	// holdVerifier starts a NATS verifier held until the caller releases
	// it (verify.Config.Hold); an MQTT one consumes from the start.
	holdVerifier bool
	progress     io.Writer
}

// env is a run's servers, proxy, verifier and agent.
type env struct {
	cfg        envConfig
	dataDir    string
	brokerURL  string
	brokerName string
	broker     servers.Broker // nil when external or embedded
	mochi      *servers.Mochi // the in-process mochi, when it is the broker
	nats       *servers.NATS  // nil when external
	natsURL    string
	// streamReused says the JetStream stream held earlier runs' batches
	// when this run started (an external --nats); see planFor.
	streamReused bool
	// uplinkMochi is the in-process MQTT uplink broker (--uplink mqtt);
	// uplinkName says what carries the uplink, for the report.
	uplinkMochi *servers.Mochi
	uplinkName  string
	proxy       *faultproxy.Proxy
	verifier    *verify.Verifier
	agent       *agentproc.Process
	statusAddr  string
	configPath  string
	agentCfg    agentConfig // what configPath holds
	// tmpfs is true when data_dir is a tmpfs the rig mounted; tmpfsNote
	// says why not when one was wanted.
	tmpfs     bool
	tmpfsNote string
	// cleared says what a previous run left that this one removed ("" for
	// a fresh directory).
	cleared string
	started time.Time

	closeOnce sync.Once
}

func (e *env) logf(format string, a ...any) {
	if e.cfg.progress != nil {
		fmt.Fprintf(e.cfg.progress, "[%6.1fs] "+format+"\n", append([]any{time.Since(e.started).Seconds()}, a...)...)
	}
}

// newEnv starts the servers and the verifier and writes the agent's
// config. The agent itself is not started.
func newEnv(ctx context.Context, cfg envConfig) (_ *env, err error) {
	if _, err := os.Stat(cfg.agentBin); err != nil {
		return nil, fmt.Errorf("%w: %s (build it with make build, or pass --agent)", ErrNoAgent, cfg.agentBin)
	}
	e := &env{cfg: cfg, started: time.Now(), dataDir: filepath.Join(cfg.dir, "data")}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if err := e.clearPreviousRun(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(e.dataDir, 0o750); err != nil {
		return nil, fmt.Errorf("rig: create data dir: %w", err)
	}
	if cfg.tmpfsBytes > 0 {
		e.mountTmpfs(cfg.tmpfsBytes)
	}
	switch {
	case cfg.embedded:
		addr, err := servers.FreeAddr()
		if err != nil {
			return nil, err
		}
		e.brokerURL, e.brokerName = "tcp://"+addr, "agent's embedded broker"
	case cfg.mqtt != "":
		e.brokerURL, e.brokerName = cfg.mqtt, "external "+cfg.mqtt
		// A session an earlier run's agent left on this broker would queue
		// what the rig publishes before the agent starts (load mode's
		// ceiling phase), and the agent would ingest it as readings no
		// ground truth expects: start from none.
		if err := clearSession(cfg.mqtt, ClientID); err != nil {
			return nil, err
		}
	default:
		if cfg.mosquitto {
			m, err := servers.StartMosquitto(filepath.Join(cfg.dir, "mosquitto"))
			if err == nil {
				e.broker, e.brokerURL, e.brokerName = m, m.URL(), m.Name()
				break
			}
			if cfg.requireMosquitto {
				return nil, err
			}
			e.logf("mosquitto unavailable (%v); using the in-process mochi broker", err)
		}
		m, err := servers.StartMochi("")
		if err != nil {
			return nil, err
		}
		e.broker, e.mochi, e.brokerURL, e.brokerName = m, m, m.URL(), m.Name()
		m.CountAcksFrom(ClientID)
	}
	uplinkURL, err := e.startUplink(ctx)
	if err != nil {
		return nil, err
	}
	if e.statusAddr, err = servers.FreeAddr(); err != nil {
		return nil, err
	}
	e.agentCfg = agentConfig{DataDir: e.dataDir, Broker: e.brokerURL, StatusListen: e.statusAddr,
		Agent: cfg.agent}
	e.agentCfg.setUplink(cfg.uplink, uplinkURL)
	if cfg.embedded {
		e.agentCfg.Broker, e.agentCfg.EmbeddedListen = "", e.brokerURL[len("tcp://"):]
	}
	e.configPath = filepath.Join(cfg.dir, "agent.yaml")
	if err := e.writeAgentConfig(); err != nil {
		return nil, err
	}
	e.agent = agentproc.New(cfg.agentBin, e.configPath, filepath.Join(cfg.dir, "agent.log"))
	if cfg.diskFull && !e.tmpfs {
		// Its log must not fail with its data files (BlockWrites).
		e.agent.PipeOutput()
	}
	return e, nil
}

// previousRun names what a run leaves in its directory. A run that reuses
// the directory (--dir demo-data twice) removes them first: the agent would
// resume from the old data_dir (its outbox, windows and counters), and
// mosquitto and the in-process NATS from their stores, so the verifier
// would see the earlier run's aggregates. Nothing else in the directory is
// touched: --dir may name a directory that holds other things.
var previousRun = []string{"data", "nats", "mosquitto", "agent.log", "agent.yaml"}

// clearPreviousRun removes what an earlier run left in the run directory,
// and says so (progress, and e.cleared for the demo).
func (e *env) clearPreviousRun() error {
	var removed []string
	for _, name := range previousRun {
		p := filepath.Join(e.cfg.dir, name)
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("rig: remove the previous run's %s (a tmpfs still mounted there by a killed run? umount it): %w", name, err)
		}
		removed = append(removed, name)
	}
	if len(removed) > 0 {
		e.cleared = fmt.Sprintf("run directory %s was used before: removed the previous run's %s", e.cfg.dir, strings.Join(removed, ", "))
		e.logf("%s", e.cleared)
	}
	return nil
}

// mountTmpfs mounts a small tmpfs on data_dir so that disk_full can fill
// it. Where the machine refuses (not root, no CAP_SYS_ADMIN), it records
// why and disk_full injects write errors instead.
func (e *env) mountTmpfs(size int64) {
	opts := fmt.Sprintf("size=%d,mode=0750", size)
	if err := syscall.Mount("tmpfs", e.dataDir, "tmpfs", 0, opts); err != nil {
		e.tmpfsNote = fmt.Sprintf("cannot mount a %d MiB tmpfs for data_dir (%v; needs root or CAP_SYS_ADMIN)", size>>20, err)
		return
	}
	e.tmpfs = true
}

// writeAgentConfig writes e.agentCfg where the agent reads its config.
func (e *env) writeAgentConfig() error {
	if err := os.WriteFile(e.configPath, []byte(e.agentCfg.render()), 0o600); err != nil {
		return fmt.Errorf("rig: write agent config: %w", err)
	}
	return nil
}

// startAttempts bounds the agent's first starts: see startAgent.
const startAttempts = 3

// startAgent starts the agent and waits until it is connected to its
// broker (or, embedded, listening), so nothing is published before its
// persistent session exists.
//
// The ports the agent listens on (its status endpoint, its embedded
// broker) are chosen free by the rig but bound by the agent, so another
// process can take one in between (seen once in CI: "bind: address already
// in use"). Nothing has connected to the agent before its first start, so
// the rig then picks fresh ports, rewrites the config and starts it again.
func (e *env) startAgent(ctx context.Context, timeout time.Duration) error {
	for attempt := 1; ; attempt++ {
		if err := e.agent.Start(); err != nil {
			return fmt.Errorf("%w: %v", ErrAgent, err)
		}
		err := e.waitAgentReady(ctx, timeout)
		if err == nil || attempt == startAttempts || e.agent.Running() || !e.agent.LoggedSinceStart("address already in use") {
			return err
		}
		if err := e.freshListenPorts(); err != nil {
			return err
		}
		e.logf("the agent could not listen on a port the rig chose (taken since); starting it again (status %s, broker %s)", e.statusAddr, e.brokerURL)
	}
}

// freshListenPorts chooses new ports for what the agent listens on and
// rewrites its config; only before anything connected to it.
func (e *env) freshListenPorts() (err error) {
	if e.statusAddr, err = servers.FreeAddr(); err != nil {
		return err
	}
	e.agentCfg.StatusListen = e.statusAddr
	if e.agentCfg.EmbeddedListen != "" {
		if e.agentCfg.EmbeddedListen, err = servers.FreeAddr(); err != nil {
			return err
		}
		e.brokerURL = "tcp://" + e.agentCfg.EmbeddedListen
	}
	return e.writeAgentConfig()
}

func (e *env) waitAgentReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if !e.agent.Running() {
			return fmt.Errorf("%w: exited during start; log:\n%s", ErrAgent, e.agent.LogTail(3000))
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := agentproc.FetchStatus(sctx, e.statusAddr)
		cancel()
		if err == nil && st.Ingest.Connected {
			return nil
		}
		// Without the status endpoint, the log line ingest writes once it
		// has subscribed (or the embedded broker listens) says the same.
		if e.agent.LoggedSinceStart("connected to broker") || e.agent.LoggedSinceStart("embedded broker listening") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: not connected to the broker within %v; log:\n%s", ErrAgent, timeout, e.agent.LogTail(3000))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond): // the agent has no event to wait on
		}
	}
}

// status reads the agent's status endpoint, nil when unavailable.
func (e *env) status(ctx context.Context) *agentproc.Status {
	return fetchOrNil(ctx, e.statusAddr, agentproc.FetchStatus)
}

// metrics reads the agent's /metrics, or nil when it does not answer.
func (e *env) metrics(ctx context.Context) map[string]float64 {
	return fetchOrNil(ctx, e.statusAddr, agentproc.FetchMetrics)
}

// fetchOrNil is fetch from the agent's status address within 2 s, or
// the zero value (nil) when the agent does not answer.
func fetchOrNil[T any](ctx context.Context, addr string, fetch func(context.Context, string) (T, error)) T {
	fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	v, err := fetch(fctx, addr)
	if err != nil {
		var zero T
		return zero
	}
	return v
}

// finalStatus reads /status.json for the verdict's counters, retrying for
// up to 10 s: one slow answer on a busy machine must not leave them
// unchecked. Nil when the agent never answered.
func (e *env) finalStatus(ctx context.Context) *agentproc.Status {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if st := e.status(ctx); st != nil || time.Now().After(deadline) || ctx.Err() != nil || !e.agent.Running() {
			return st
		}
		sleepCtx(ctx, 250*time.Millisecond)
	}
}

// close stops everything and unmounts the tmpfs. Safe to call twice.
func (e *env) close() {
	e.closeOnce.Do(func() {
		if e.agent != nil && e.agent.Running() {
			_ = e.agent.Kill()
		}
		if e.verifier != nil {
			e.verifier.Close()
		}
		if e.proxy != nil {
			e.proxy.Close()
		}
		if e.broker != nil {
			e.broker.Close()
		}
		if e.nats != nil {
			e.nats.Close()
		}
		if e.uplinkMochi != nil {
			e.uplinkMochi.Close()
		}
		if e.tmpfs {
			if err := syscall.Unmount(e.dataDir, 0); err != nil {
				_ = syscall.Unmount(e.dataDir, syscall.MNT_DETACH)
			}
			e.tmpfs = false
		}
	})
}

// clearSession discards whatever session the broker keeps for clientID: a
// clean-session connect does that in MQTT 3.1.1.
func clearSession(broker, clientID string) error {
	c := paho.NewClient(paho.NewClientOptions().AddBroker(broker).SetClientID(clientID).
		SetCleanSession(true).SetConnectTimeout(10 * time.Second))
	tok := c.Connect()
	if !tok.WaitTimeout(15 * time.Second) {
		return fmt.Errorf("rig: clear %s's session on %s: connect timed out", clientID, broker)
	}
	if err := tok.Error(); err != nil {
		return fmt.Errorf("rig: clear %s's session on %s: %w", clientID, broker, err)
	}
	c.Disconnect(100)
	return nil
}
