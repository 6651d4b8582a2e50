// Package mqtttest starts real MQTT brokers for tests on free loopback
// ports: an in-process mochi broker, or Debian's mosquitto binary as a child
// process that a test can stop and start again.
package mqtttest

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"

	"github.com/edgeagent/edgeagent/internal/mochilisten"
	"github.com/edgeagent/edgeagent/testrig/freeport"
	"github.com/edgeagent/edgeagent/testrig/procattr"
)

// FreePort returns a free TCP port on 127.0.0.1.
func FreePort(t testing.TB) int {
	t.Helper()
	return freeport.Port(t)
}

// StartMochi runs an in-process mochi broker on a free loopback port until
// the test ends and returns its URL (tcp://127.0.0.1:PORT).
func StartMochi(t testing.TB) string {
	t.Helper()
	return StartMochiWith(t, new(auth.AllowHook))
}

// StartMochiWith is StartMochi with the given hooks instead of one that
// allows everything (an ACL hook refusing some topics, say).
func StartMochiWith(t testing.TB, hooks ...mochi.Hook) string {
	t.Helper()
	srv := mochi.New(&mochi.Options{
		InlineClient: true,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	for _, h := range hooks {
		if err := srv.AddHook(h, nil); err != nil {
			t.Fatalf("mqtttest: mochi hook %s: %v", h.ID(), err)
		}
	}
	addr := fmt.Sprintf("127.0.0.1:%d", FreePort(t))
	if err := srv.AddListener(mochilisten.Listen("tcp", addr)); err != nil {
		t.Fatalf("mqtttest: mochi listener: %v", err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatalf("mqtttest: mochi serve: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	return "tcp://" + addr
}

// StartMochiWebsocket is StartMochi with a websocket listener too: it
// returns the broker's tcp:// and ws:// URLs.
func StartMochiWebsocket(t testing.TB) (tcpURL, wsURL string) {
	t.Helper()
	srv := mochi.New(&mochi.Options{InlineClient: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatalf("mqtttest: mochi hook: %v", err)
	}
	tcpAddr := fmt.Sprintf("127.0.0.1:%d", FreePort(t))
	wsAddr := fmt.Sprintf("127.0.0.1:%d", FreePort(t))
	for _, l := range []listeners.Listener{
		mochilisten.Listen("tcp", tcpAddr),
		mochilisten.Guard(srv, listeners.NewWebsocket(listeners.Config{ID: "ws", Address: wsAddr})),
	} {
		if err := srv.AddListener(l); err != nil {
			t.Fatalf("mqtttest: mochi listener: %v", err)
		}
	}
	if err := srv.Serve(); err != nil {
		t.Fatalf("mqtttest: mochi serve: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	return "tcp://" + tcpAddr, "ws://" + wsAddr
}

// MosquittoPath returns the mosquitto binary, or skips the test with a clear
// message when it is not installed (.ci/run installs it, so CI never skips).
func MosquittoPath(t testing.TB) string {
	t.Helper()
	for _, p := range []string{"mosquitto", "/usr/sbin/mosquitto"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Skip("mqtttest: mosquitto is not installed (apt-get install mosquitto); skipping the test against it")
	return ""
}

// Mosquitto is a mosquitto child process with persistence in a temporary
// directory, so a Stop/Start keeps persistent sessions and queued messages.
type Mosquitto struct {
	t    testing.TB
	bin  string
	dir  string
	port int

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan error // cmd's Wait result
}

// StartMosquitto starts mosquitto on a free loopback port. extraConf is
// appended to the generated configuration (one option a line). The defaults
// lift the queue and in-flight limits so that no QoS1 message is dropped.
// A port taken between its choice and the bind is replaced by a fresh one.
func StartMosquitto(t testing.TB, extraConf string) *Mosquitto {
	t.Helper()
	return startMosquitto(t, extraConf, FreePort(t))
}

// startMosquitto is StartMosquitto on port, or on fresh ports after it
// while the one before was taken.
func startMosquitto(t testing.TB, extraConf string, port int) *Mosquitto {
	t.Helper()
	m := &Mosquitto{t: t, bin: MosquittoPath(t), dir: t.TempDir()}
	m.port = freeport.FirstStart(t, "mqtttest: mosquitto", port, func(port int) error {
		m.port = port
		conf := fmt.Sprintf(`listener %d 127.0.0.1
allow_anonymous true
persistence true
persistence_location %s/
autosave_interval 1
max_queued_messages 0
max_inflight_messages 0
log_dest file %s
# Run as root (tests and CI are), mosquitto would switch to its own user
# and could not write its log and persistence file in the temp dir.
user root
%s
`, m.port, m.dir, filepath.Join(m.dir, "mosquitto.log"), extraConf)
		if err := os.WriteFile(filepath.Join(m.dir, "mosquitto.conf"), []byte(conf), 0o600); err != nil {
			return fmt.Errorf("mqtttest: write mosquitto.conf: %w", err)
		}
		return m.start()
	})
	t.Cleanup(m.Stop)
	return m
}

// URL is the broker's address.
func (m *Mosquitto) URL() string { return "tcp://127.0.0.1:" + strconv.Itoa(m.port) }

// Addr is host:port.
func (m *Mosquitto) Addr() string { return "127.0.0.1:" + strconv.Itoa(m.port) }

// Start starts the broker (again, on the same port) and waits until it
// accepts connections.
func (m *Mosquitto) Start() {
	m.t.Helper()
	if err := m.start(); err != nil {
		m.t.Fatal(err)
	}
}

// mosquittoRunning is the line mosquitto logs once its listeners are bound.
const mosquittoRunning = " running\n"

// start starts mosquitto and waits for its own "running" line in the log
// and a connection to its port: a connection alone could reach another
// process that holds the port, while this mosquitto exits for want of it.
func (m *Mosquitto) start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		return nil
	}
	runs := strings.Count(m.Log(), mosquittoRunning)
	cmd := exec.Command(m.bin, "-c", filepath.Join(m.dir, "mosquitto.conf"))
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	// A test binary killed by its timeout leaves no broker behind.
	cmd.SysProcAttr = procattr.Child()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("mqtttest: start mosquitto: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("mqtttest: mosquitto on %s exited during start (%v); log:\n%s", m.Addr(), err, m.Log())
		default:
		}
		if strings.Count(m.Log(), mosquittoRunning) > runs {
			c, err := net.DialTimeout("tcp", m.Addr(), 200*time.Millisecond)
			if err == nil {
				c.Close()
				m.cmd, m.exited = cmd, exited
				return nil
			}
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("mqtttest: mosquitto did not listen on %s; log:\n%s", m.Addr(), m.Log())
		}
		time.Sleep(20 * time.Millisecond) // polling a port that has no event to wait on
	}
}

// Stop stops the broker gracefully (SIGTERM), so it saves its persistence file.
func (m *Mosquitto) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Signal(os.Interrupt)
	select {
	case <-m.exited:
	case <-time.After(10 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.exited
	}
	m.cmd = nil
}

// ForgetSessions deletes the stopped broker's persistence file, so that it
// starts again without the sessions and queued messages it had, as a broker
// without persistence does after a restart.
func (m *Mosquitto) ForgetSessions() {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		m.t.Fatal("mqtttest: ForgetSessions on a running mosquitto")
	}
	if err := os.Remove(filepath.Join(m.dir, "mosquitto.db")); err != nil && !os.IsNotExist(err) {
		m.t.Fatalf("mqtttest: %v", err)
	}
}

// Log returns mosquitto's log so far, for failure messages.
func (m *Mosquitto) Log() string {
	b, _ := os.ReadFile(filepath.Join(m.dir, "mosquitto.log"))
	return string(b)
}

// Publisher is a paho client for tests that publishes device readings.
type Publisher struct {
	Client paho.Client
}

// NewPublisher connects a publisher with a clean session to url.
func NewPublisher(t testing.TB, url, clientID string) *Publisher {
	t.Helper()
	opts := paho.NewClientOptions().AddBroker(url).SetClientID(clientID).
		SetCleanSession(true).SetAutoReconnect(true).SetConnectRetry(true).
		SetConnectRetryInterval(100 * time.Millisecond).SetMaxReconnectInterval(time.Second).
		SetConnectTimeout(5 * time.Second)
	c := paho.NewClient(opts)
	tok := c.Connect()
	if !tok.WaitTimeout(20*time.Second) || tok.Error() != nil {
		t.Fatalf("mqtttest: publisher connect to %s: %v", url, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(100) })
	return &Publisher{Client: c}
}

// Publish publishes one message and waits for its acknowledgement (QoS1).
func (p *Publisher) Publish(t testing.TB, topic string, qos byte, payload []byte) {
	t.Helper()
	tok := p.Client.Publish(topic, qos, false, payload)
	if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("mqtttest: publish %s: timeout or %v", topic, tok.Error())
	}
}

// PublishAll publishes every payload without waiting between them, then
// waits for all acknowledgements.
func (p *Publisher) PublishAll(t testing.TB, topic string, qos byte, payloads [][]byte) {
	t.Helper()
	toks := make([]paho.Token, len(payloads))
	for i, pl := range payloads {
		toks[i] = p.Client.Publish(topic, qos, false, pl)
	}
	for i, tok := range toks {
		if !tok.WaitTimeout(60*time.Second) || tok.Error() != nil {
			t.Fatalf("mqtttest: publish %d on %s: timeout or %v", i, topic, tok.Error())
		}
	}
}

// WaitFor polls cond until it holds or the deadline passes.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond) // poll interval, not a wait for the condition
	}
}
