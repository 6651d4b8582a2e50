package packaging

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgeagent/edgeagent/testrig/mqtttest"
)

// debianMosquittoConf is what Debian's /etc/mosquitto/mosquitto.conf sets,
// with the paths moved into the test's directory: the snippet must load
// next to it (mosquitto refuses some options twice).
const debianMosquittoConf = `persistence true
persistence_location %[1]s/
log_dest file %[1]s/mosquitto.log
include_dir %[1]s/conf.d
# The test runs as root in CI: stay root so the temporary directory stays
# writable (mosquitto otherwise switches to the mosquitto user).
user root
`

// gatewayBroker is mosquitto configured as on a Debian gateway.
type gatewayBroker struct {
	t    *testing.T
	bin  string
	dir  string
	addr string
	cmd  *exec.Cmd
	done chan struct{}
}

// startGatewayBroker starts mosquitto with Debian's main config and, when
// withSnippet, packaging/mosquitto-edgeagent.conf in conf.d.
func startGatewayBroker(t *testing.T, withSnippet bool) *gatewayBroker {
	t.Helper()
	b := &gatewayBroker{t: t, bin: mqtttest.MosquittoPath(t), dir: t.TempDir()}
	b.addr = fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	if err := os.Mkdir(filepath.Join(b.dir, "conf.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	listener := "listener " + strings.Replace(b.addr, "127.0.0.1:", "", 1) + " 127.0.0.1\nallow_anonymous true\n"
	if withSnippet {
		snippet := readFile(t, filepath.Join(repoRoot(t), "packaging", "mosquitto-edgeagent.conf"))
		const shipped = "listener 1883 127.0.0.1\nallow_anonymous true\n"
		if !strings.Contains(snippet, shipped) {
			t.Fatalf("the snippet no longer holds %q; update this test", shipped)
		}
		listener = strings.Replace(snippet, shipped, listener, 1)
	}
	if err := os.WriteFile(filepath.Join(b.dir, "conf.d", "edgeagent.conf"), []byte(listener), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b.dir, "mosquitto.conf"), []byte(fmt.Sprintf(debianMosquittoConf, b.dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	b.start()
	t.Cleanup(b.stop)
	return b
}

func (b *gatewayBroker) start() {
	b.t.Helper()
	b.cmd = exec.Command(b.bin, "-c", filepath.Join(b.dir, "mosquitto.conf"))
	b.cmd.Stdout, b.cmd.Stderr = io.Discard, io.Discard
	if err := b.cmd.Start(); err != nil {
		b.t.Fatalf("start mosquitto: %v", err)
	}
	b.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(b.cmd, b.done)
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", b.addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-b.done:
			b.t.Fatalf("mosquitto exited at start (config refused?):\n%s", b.log())
		default:
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("mosquitto did not listen on %s:\n%s", b.addr, b.log())
		}
		time.Sleep(20 * time.Millisecond) // polling a port: there is no event to wait on
	}
}

// stop stops mosquitto with SIGTERM, on which it saves its persistence file.
func (b *gatewayBroker) stop() {
	if b.cmd == nil {
		return
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
	case <-time.After(20 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.done
	}
	b.cmd = nil
}

func (b *gatewayBroker) log() string {
	s, _ := os.ReadFile(filepath.Join(b.dir, "mosquitto.log"))
	return string(s)
}

// agentSession is a subscriber with a persistent session, as the agent
// keeps one: clean session off, a stable client id, QoS 1.
type agentSession struct {
	mu       sync.Mutex
	received map[string]bool
	client   paho.Client
}

func connectAgentSession(t *testing.T, s *agentSession, addr string) {
	t.Helper()
	opts := paho.NewClientOptions().AddBroker("tcp://" + addr).SetClientID("edgeagent-gw-test").
		SetCleanSession(false).SetAutoReconnect(false).SetConnectTimeout(5 * time.Second).
		// Messages queued for the session arrive before Subscribe returns.
		SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) {
			s.mu.Lock()
			s.received[string(m.Payload())] = true
			s.mu.Unlock()
		})
	s.client = paho.NewClient(opts)
	if tok := s.client.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscriber connect: %v", tok.Error())
	}
}

func (s *agentSession) has(payload string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.received[payload]
}

func (s *agentSession) count(prefix string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for p := range s.received {
		if strings.HasPrefix(p, prefix) {
			n++
		}
	}
	return n
}

// queueWhileAway runs the outage a gateway sees: the agent subscribes, goes
// away, devices publish n QoS 1 readings, the broker restarts (restart
// true), the agent comes back. It returns how many readings reached it.
func queueWhileAway(t *testing.T, b *gatewayBroker, n int, restart bool) int {
	t.Helper()
	const topic = "sensors/dev-1/telemetry"
	s := &agentSession{received: map[string]bool{}}
	connectAgentSession(t, s, b.addr)
	if tok := s.client.Subscribe("sensors/+/telemetry", 1, nil); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	s.client.Disconnect(100)

	pub := mqtttest.NewPublisher(t, "tcp://"+b.addr, "device-1")
	payloads := make([][]byte, n)
	for i := range payloads {
		payloads[i] = []byte(fmt.Sprintf("reading-%05d", i))
	}
	pub.PublishAll(t, topic, 1, payloads)
	pub.Client.Disconnect(100)

	if restart {
		b.stop()
		b.start()
	}

	connectAgentSession(t, s, b.addr)
	defer s.client.Disconnect(100)
	// QoS 1 messages on one topic arrive in order, so once a reading sent
	// now has arrived, everything queued before it has too.
	pub = mqtttest.NewPublisher(t, "tcp://"+b.addr, "device-1")
	pub.Publish(t, topic, 1, []byte("sentinel"))
	mqtttest.WaitFor(t, 60*time.Second, "the sentinel reading", func() bool { return s.has("sentinel") })
	return s.count("reading-")
}

// TestMosquittoSnippet shows that the shipped mosquitto settings do what
// docs/install.md says: with Debian's defaults a subscriber that is away
// loses QoS 1 readings beyond 1000; with the snippet all of them wait for
// it, across a broker restart.
func TestMosquittoSnippet(t *testing.T) {
	const n = 1500 // more than mosquitto's default max_queued_messages (1000)

	t.Run("debian-defaults-drop", func(t *testing.T) {
		b := startGatewayBroker(t, false)
		got := queueWhileAway(t, b, n, false)
		t.Logf("without the snippet: %d of %d queued readings delivered", got, n)
		if got >= n {
			t.Errorf("without the snippet all %d readings arrived; the snippet's reason to exist is gone (mosquitto changed its default?)", n)
		}
	})
	t.Run("snippet-keeps-all", func(t *testing.T) {
		b := startGatewayBroker(t, true)
		if got := queueWhileAway(t, b, n, true); got != n {
			t.Errorf("with the snippet %d of %d queued readings survived the outage and a broker restart\n%s", got, n, b.log())
		}
	})
}
