// Package servers starts the real servers the rig runs against outside of
// tests — an in-process mochi MQTT broker, mosquitto as a child process, an
// in-process nats-server with JetStream — on loopback ports, and stops and
// restarts them on demand for fault injection.
package servers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeagent/edgeagent/internal/mochilisten"

	"github.com/edgeagent/edgeagent/testrig/freeport"
	"github.com/edgeagent/edgeagent/testrig/procattr"
)

// ErrNotInstalled is returned when a server binary is not on this machine.
var ErrNotInstalled = errors.New("servers: not installed")

// startTimeout bounds a server start.
const startTimeout = 15 * time.Second

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago and
// that this process has not handed out before.
func FreePort() (int, error) {
	ports, err := freeport.Take(1)
	if err != nil {
		return 0, fmt.Errorf("servers: %w", err)
	}
	return ports[0], nil
}

// FreeAddr returns 127.0.0.1:PORT with a port that was free a moment ago.
func FreeAddr() (string, error) {
	p, err := FreePort()
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(p), nil
}

// waitListening polls addr until it accepts a connection.
func waitListening(addr string, timeout time.Duration, exited <-chan error) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case werr := <-exited:
			return fmt.Errorf("exited during start: %v", werr)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not listening on %s after %v: %w", addr, timeout, err)
		}
		time.Sleep(20 * time.Millisecond) // a port has no event to wait on
	}
}

// Broker is a device-side MQTT broker the rig can restart.
type Broker interface {
	// Name says which broker it is, for reports.
	Name() string
	URL() string
	// Stop stops the broker; Start starts it again on the same address.
	Stop() error
	Start() error
	Close() error
}

// Mochi is an in-process mochi MQTT broker. It loses its sessions and
// queued messages on Stop: a restart tests reconnection, not durability.
// It can also lose a message published while a persistent session is
// being taken over by a reconnecting client (v2.7.9 copies the in-flight
// messages, then clears the old session's, and a publish can land in
// between); the rig keeps publishers quiet around such reconnects.
type Mochi struct {
	addr string

	mu  sync.Mutex
	srv *mochi.Server

	acks, dropped, received atomic.Uint64
	ackClient               atomic.Pointer[string]
}

// StartMochi starts a mochi broker on addr ("" picks a free loopback port).
func StartMochi(addr string) (*Mochi, error) {
	if addr == "" {
		var err error
		if addr, err = FreeAddr(); err != nil {
			return nil, err
		}
	}
	m := &Mochi{addr: addr}
	if err := m.Start(); err != nil {
		return nil, err
	}
	return m, nil
}

// Name is "mochi (in-process)".
func (m *Mochi) Name() string { return "mochi (in-process)" }

// URL is tcp://addr.
func (m *Mochi) URL() string { return "tcp://" + m.addr }

// Addr is host:port.
func (m *Mochi) Addr() string { return m.addr }

// CountAcksFrom makes Acks count the QoS1 acknowledgements of clientID
// (the agent acknowledges only after its Bronze commit, so this is its
// durable ingest count, measured at the broker).
func (m *Mochi) CountAcksFrom(clientID string) { m.ackClient.Store(&clientID) }

// Acks is the number of QoS1 deliveries the CountAcksFrom client completed.
func (m *Mochi) Acks() uint64 { return m.acks.Load() }

// Pending is the number of QoS1 messages the broker holds for clientID
// and the client has not acknowledged (queued or in flight); 0 when the
// broker does not know the client.
func (m *Mochi) Pending(clientID string) int {
	m.mu.Lock()
	srv := m.srv
	m.mu.Unlock()
	if srv == nil {
		return 0
	}
	cl, ok := srv.Clients.Get(clientID)
	if !ok {
		return 0
	}
	return cl.State.Inflight.Len()
}

// Subscriptions is the number of subscriptions the broker holds for
// clientID (0 when it does not know the client).
func (m *Mochi) Subscriptions(clientID string) int {
	m.mu.Lock()
	srv := m.srv
	m.mu.Unlock()
	if srv == nil {
		return 0
	}
	cl, ok := srv.Clients.Get(clientID)
	if !ok {
		return 0
	}
	return cl.State.Subscriptions.Len()
}

// Received counts publishes the broker accepted from clients.
func (m *Mochi) Received() uint64 { return m.received.Load() }

// Dropped counts messages the broker dropped for the CountAcksFrom client
// (its queue or in-flight quota exceeded): a run with drops lost data
// before the agent could see it.
func (m *Mochi) Dropped() uint64 { return m.dropped.Load() }

// Start starts the broker (again).
func (m *Mochi) Start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.srv != nil {
		return nil
	}
	caps := mochi.NewDefaultServerCapabilities()
	// The most the protocol allows: an agent that is down or slow must not
	// make the broker drop what it queues for it.
	caps.MaximumInflight = 65535
	caps.MaximumClientWritesPending = 1 << 17
	srv := mochi.New(&mochi.Options{
		InlineClient: true,
		Capabilities: caps,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		return fmt.Errorf("servers: mochi auth hook: %w", err)
	}
	if err := srv.AddHook(&countHook{m: m}, nil); err != nil {
		return fmt.Errorf("servers: mochi count hook: %w", err)
	}
	if err := srv.AddListener(mochilisten.Listen("tcp", m.addr)); err != nil {
		return fmt.Errorf("servers: mochi listen on %s: %w", m.addr, err)
	}
	if err := srv.Serve(); err != nil {
		return fmt.Errorf("servers: mochi serve: %w", err)
	}
	m.srv = srv
	return nil
}

// Stop closes the broker and every connection.
func (m *Mochi) Stop() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.srv == nil {
		return nil
	}
	err := m.srv.Close()
	m.srv = nil
	if err != nil {
		return fmt.Errorf("servers: mochi close: %w", err)
	}
	return nil
}

// Close stops the broker. Safe to call twice.
func (m *Mochi) Close() error { return m.Stop() }

// countHook counts what the rig reports about the broker.
type countHook struct {
	mochi.HookBase
	m *Mochi
}

func (h *countHook) ID() string { return "edgerig-count" }

func (h *countHook) Provides(b byte) bool {
	return b == mochi.OnQosComplete || b == mochi.OnPublishDropped || b == mochi.OnQosDropped || b == mochi.OnPublished
}

func (h *countHook) OnQosComplete(cl *mochi.Client, pk packets.Packet) {
	if id := h.m.ackClient.Load(); id != nil && cl.ID == *id {
		h.m.acks.Add(1)
	}
}

func (h *countHook) OnPublishDropped(cl *mochi.Client, pk packets.Packet) { h.countDrop(cl) }

func (h *countHook) OnQosDropped(cl *mochi.Client, pk packets.Packet) { h.countDrop(cl) }

func (h *countHook) countDrop(cl *mochi.Client) {
	// A session taken over by a reconnect hands its in-flight messages
	// to the new connection and then "drops" them from the old one.
	if id := h.m.ackClient.Load(); id != nil && cl.ID == *id && !cl.IsTakenOver() {
		h.m.dropped.Add(1)
	}
}

func (h *countHook) OnPublished(cl *mochi.Client, pk packets.Packet) {
	if !cl.Net.Inline {
		h.m.received.Add(1)
	}
}

// MosquittoPath returns the mosquitto binary or ErrNotInstalled.
func MosquittoPath() (string, error) {
	for _, p := range []string{"mosquitto", "/usr/sbin/mosquitto"} {
		if path, err := exec.LookPath(p); err == nil {
			return path, nil
		}
	}
	return "", fmt.Errorf("%w: mosquitto (apt-get install mosquitto)", ErrNotInstalled)
}

// Mosquitto is a mosquitto child process with persistence in its
// directory, so a Stop/Start keeps sessions and queued messages.
type Mosquitto struct {
	bin, dir string
	port     int

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan error
}

// StartMosquitto starts mosquitto on a free loopback port with its files
// in dir. Queue and in-flight limits are lifted so that no QoS1 message is
// dropped (README: the broker must not drop what the agent has not acked).
func StartMosquitto(dir string) (*Mosquitto, error) {
	bin, err := MosquittoPath()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("servers: mosquitto dir: %w", err)
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	m := &Mosquitto{bin: bin, dir: dir, port: port}
	conf := fmt.Sprintf(`listener %d 127.0.0.1
allow_anonymous true
persistence true
persistence_location %s/
autosave_interval 1
max_queued_messages 0
max_inflight_messages 1000
log_dest file %s
`, port, dir, filepath.Join(dir, "mosquitto.log"))
	if os.Geteuid() == 0 {
		// Started as root, mosquitto switches to the mosquitto user, which
		// cannot write its log or persistence file in our directory: every
		// restart would then lose the queued messages without a word.
		conf += "user root\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "mosquitto.conf"), []byte(conf), 0o600); err != nil {
		return nil, fmt.Errorf("servers: write mosquitto.conf: %w", err)
	}
	if err := m.Start(); err != nil {
		return nil, err
	}
	return m, nil
}

// Name is "mosquitto (persistent)".
func (m *Mosquitto) Name() string { return "mosquitto (persistent)" }

// URL is tcp://127.0.0.1:port.
func (m *Mosquitto) URL() string { return "tcp://127.0.0.1:" + strconv.Itoa(m.port) }

// Start starts mosquitto (again) and waits until it listens.
func (m *Mosquitto) Start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		return nil
	}
	cmd := exec.Command(m.bin, "-c", filepath.Join(m.dir, "mosquitto.conf"))
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	// The rig stops it in order on Ctrl-C, and it dies with the rig.
	cmd.SysProcAttr = procattr.Child()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("servers: start mosquitto: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if err := waitListening("127.0.0.1:"+strconv.Itoa(m.port), startTimeout, exited); err != nil {
		_ = cmd.Process.Kill()
		return fmt.Errorf("servers: mosquitto: %w; log: %s", err, m.logTail())
	}
	m.cmd, m.exited = cmd, exited
	return nil
}

// Stop stops mosquitto with SIGTERM, so it saves its persistence file.
func (m *Mosquitto) Stop() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return nil
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
	case <-time.After(10 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.exited
	}
	m.cmd, m.exited = nil, nil
	return nil
}

// Close stops mosquitto. Safe to call twice.
func (m *Mosquitto) Close() error { return m.Stop() }

func (m *Mosquitto) logTail() string {
	b, _ := os.ReadFile(filepath.Join(m.dir, "mosquitto.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// NATS is an in-process nats-server with JetStream and file storage in
// its directory, which survives Stop and Start: the stream outlives a
// server restart as in a real cloud.
type NATS struct {
	dir  string
	port int

	mu  sync.Mutex
	srv *server.Server
}

// StartNATS starts a nats-server with JetStream on a free loopback port,
// storing in dir.
func StartNATS(dir string) (*NATS, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	n := &NATS{dir: dir, port: port}
	if err := n.Start(); err != nil {
		return nil, err
	}
	return n, nil
}

// URL is nats://127.0.0.1:port.
func (n *NATS) URL() string { return "nats://" + n.Addr() }

// Addr is 127.0.0.1:port, for a proxy in front of the server.
func (n *NATS) Addr() string { return "127.0.0.1:" + strconv.Itoa(n.port) }

// Start starts the server (again) on the same port and store.
func (n *NATS) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil {
		return nil
	}
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: n.port,
		JetStream: true, StoreDir: filepath.Join(n.dir, "jetstream"),
		NoLog: true, NoSigs: true,
	})
	if err != nil {
		return fmt.Errorf("servers: nats-server: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(startTimeout) {
		srv.Shutdown()
		return fmt.Errorf("servers: nats-server on %s not ready after %v", n.Addr(), startTimeout)
	}
	n.srv = srv
	return nil
}

// Stop shuts the server down; the store directory stays.
func (n *NATS) Stop() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
	}
	return nil
}

// Close stops the server. Safe to call twice.
func (n *NATS) Close() error { return n.Stop() }

// connectJS connects to the NATS server at url for one JetStream request.
func connectJS(url string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		return nil, nil, fmt.Errorf("servers: connect %s: %w", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("servers: jetstream: %w", err)
	}
	return nc, js, nil
}

// StreamLastSeq returns the last sequence of the stream name, 0 when it
// is empty.
func StreamLastSeq(ctx context.Context, url, name string) (uint64, error) {
	nc, js, err := connectJS(url)
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	st, err := js.Stream(ctx, name)
	if err != nil {
		return 0, fmt.Errorf("servers: stream %s: %w", name, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("servers: stream %s info: %w", name, err)
	}
	return info.State.LastSeq, nil
}

// CreateStream creates (or keeps) a file-storage stream over subjects.
func CreateStream(ctx context.Context, url, name string, subjects []string) error {
	nc, js, err := connectJS(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: subjects, Storage: jetstream.FileStorage})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("servers: create stream %s: %w", name, err)
	}
	return nil
}
