package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/testrig/logbuf"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
)

// agentBin is the real edgeagent binary, built once by TestMain.
var agentBin string

func TestMain(m *testing.M) {
	// A test run under nohup ignores SIGHUP, the agents it starts inherit
	// that, and an agent started with SIGHUP ignored keeps it ignored (as
	// under nohup it should): the reload tests then wait for a reload that
	// never comes. A handler here is reset to the default by exec.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP)
	dir, err := os.MkdirTemp("", "edgeagent-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentBin = filepath.Join(dir, "edgeagent")
	build := exec.Command("go", "build", "-o", agentBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build edgeagent:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// agentProc is the agent running as a child process.
type agentProc struct {
	cmd  *exec.Cmd
	logs *logbuf.Buffer
	done chan struct{}
}

func startAgent(t *testing.T, args ...string) *agentProc {
	t.Helper()
	return startAgentEnv(t, nil, args...)
}

// startAgentEnv is startAgent with extra environment variables.
func startAgentEnv(t *testing.T, env []string, args ...string) *agentProc {
	t.Helper()
	return startAgentWith(t, func(c *exec.Cmd) { c.Env = append(c.Env, env...) }, args...)
}

// startAgentWith is startAgent with the command edited before it starts.
func startAgentWith(t *testing.T, edit func(*exec.Cmd), args ...string) *agentProc {
	t.Helper()
	if i := slices.Index(args, "-c"); i >= 0 && i+1 < len(args) {
		body, err := os.ReadFile(args[i+1])
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(body, []byte("\nstatus:")) {
			t.Fatalf("%s has no status section: the agent would listen on the default port, which another process may hold", args[i+1])
		}
	}
	p := &agentProc{cmd: exec.Command(agentBin, args...), logs: &logbuf.Buffer{}, done: make(chan struct{})}
	p.cmd.Env = os.Environ()
	edit(p.cmd)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start agent: %v", err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			logs := p.logs.String()
			if len(logs) > 16<<10 {
				logs = "…" + logs[len(logs)-16<<10:]
			}
			t.Logf("agent %v logs:\n%s", args, logs)
		}
	})
	return p
}

func (p *agentProc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// waitLog waits until the agent's log contains s.
func (p *agentProc) waitLog(t *testing.T, s string) {
	t.Helper()
	mqtttest.WaitFor(t, 30*time.Second, "agent log line "+strconv.Quote(s), func() bool {
		select {
		case <-p.done:
			t.Fatalf("agent exited while waiting for %q; logs:\n%s", s, p.logs)
		default:
		}
		return strings.Contains(p.logs.String(), s)
	})
}

// stop sends SIGTERM and waits for a clean exit.
func (p *agentProc) stop(t *testing.T) {
	t.Helper()
	p.waitLog(t, "edgeagent starting") // the signal handler is installed by then
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("agent did not exit within 30s of SIGTERM; logs:\n%s", p.logs)
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("agent exited %d after SIGTERM, want 0; logs:\n%s", code, p.logs)
	}
}

// embeddedAgentConfig is the head of a test config: the agent runs its
// embedded broker on addr and ingests sensors/{device}/telemetry, with its
// data under dir. Every test adds a status section: a free port, or none
// (listen ""). The default, 127.0.0.1:9464, is a fixed port that another
// process may hold while the tests run (one did, in a make test).
func embeddedAgentConfig(gateway, dir, addr string) string {
	return fmt.Sprintf(`
gateway_id: %s
data_dir: %s/data
mqtt:
  broker: embedded
  embedded: {listen: "%s"}
  subscriptions:
    - topic: "sensors/{device}/telemetry"`, gateway, dir, addr)
}

func writeConfig(t *testing.T, dir, body string) string {
	t.Helper()
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The crash test of the ingest issue: a publisher sends N QoS1 readings with
// unique ids while the agent is killed with SIGKILL at random moments and
// restarted; at the end every reading is in Bronze.
func TestCrashLosesNoAcknowledgedMessage(t *testing.T) {
	mosq := mqtttest.StartMosquitto(t, "")
	dir := t.TempDir()
	cfgPath := writeConfig(t, dir, fmt.Sprintf(`
gateway_id: crash-gw
data_dir: %s/data
mqtt:
  broker: %s
  subscriptions:
    - topic: "sensors/{device}/telemetry"
status:
  listen: ""
`, dir, mosq.URL()))

	// The first start creates the persistent session; from then on the
	// broker queues for the agent whenever it is down.
	first := startAgent(t, "run", "-c", cfgPath)
	first.waitLog(t, "connected to broker")

	const n = 4000
	pub := mqtttest.NewPublisher(t, mosq.URL(), "crash-publisher")
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for i := 0; i < n; i++ {
			tok := pub.Client.Publish(fmt.Sprintf("sensors/dev-%d/telemetry", i%10), 1, false,
				fmt.Appendf(nil, `{"id":"r-%d","ts":%d,"temperature":%d}`, i, 1700000000000+int64(i)*100, i%50))
			if i%20 == 19 {
				tok.Wait()
				time.Sleep(10 * time.Millisecond) // pace the publisher so the kills land while it publishes
			}
		}
	}()

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2))
	killsWhilePublishing := 0
	for kill := 0; kill < 6; kill++ {
		p := first
		if kill > 0 {
			p = startAgent(t, "run", "-c", cfgPath)
		}
		time.Sleep(time.Duration(150+rng.IntN(500)) * time.Millisecond) // a random moment to crash at, not a wait for a condition
		p.kill()
		select {
		case <-pubDone:
		default:
			killsWhilePublishing++
		}
	}
	if killsWhilePublishing < 5 {
		t.Errorf("only %d of the kills landed while the publisher was sending; the test proves too little", killsWhilePublishing)
	}
	<-pubDone
	p := startAgent(t, "run", "-c", cfgPath)
	bronzePath := filepath.Join(dir, "data", "bronze.db")
	deadline := time.Now().Add(60 * time.Second)
	for {
		// The agent holds the file lock; stop it, count, and start it again
		// until everything the broker queued has arrived.
		p.stop(t)
		missing := missingIDs(t, bronzePath, n)
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d readings missing from bronze after the crashes, e.g. %v; last agent logs:\n%s", len(missing), missing[:min(5, len(missing))], p.logs)
		}
		p = startAgent(t, "run", "-c", cfgPath)
		time.Sleep(300 * time.Millisecond) // let the restarted agent drain before the next count
	}
}

func missingIDs(t *testing.T, path string, n int) []string {
	t.Helper()
	b, err := buffer.Open(path, buffer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	seen := make(map[string]bool, n)
	if err := b.Scan(1, func(r buffer.Record) bool {
		if r.Kind == buffer.KindMessage {
			if i := bytes.Index(r.Payload, []byte(`"id":"`)); i >= 0 {
				rest := r.Payload[i+6:]
				seen[string(rest[:bytes.IndexByte(rest, '"')])] = true
			}
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	var missing []string
	for i := 0; i < n; i++ {
		if id := fmt.Sprintf("r-%d", i); !seen[id] {
			missing = append(missing, id)
		}
	}
	return missing
}

func TestVersionAndConfigCheck(t *testing.T) {
	out, err := exec.Command(agentBin, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "edgeagent ") {
		t.Fatalf("version: %v %s", err, out)
	}
	dir := t.TempDir()
	good := writeConfig(t, dir, "gateway_id: gw-01\nmqtt:\n  username: agent\n  password: ${EA_TEST_SECRET}\n  subscriptions:\n    - topic: sensors/{device}/telemetry\n")
	cmd := exec.Command(agentBin, "config", "check", "-c", good)
	cmd.Env = append(os.Environ(), "EA_TEST_SECRET=hunter2")
	out, err = cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("config check of a good file: %v\n%s", err, out)
	}
	for _, want := range []string{"gateway_id: gw-01", "bronze_retention: 168h", "client_id: edgeagent-gw-01"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("effective config lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "hunter2") {
		t.Errorf("config check printed a secret:\n%s", out)
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("gateway_id: gw-01\nstorage:\n  bronze_retension: 1h\nmqtt:\n  subscriptions:\n    - topic: sensors/{device}/telemetry\n      qos: 7\n"), 0o600)
	out, err = exec.Command(agentBin, "config", "check", "-c", bad).CombinedOutput()
	if code := exitCode(err); code != exitConfig {
		t.Fatalf("config check of a bad file exited %d, want %d\n%s", code, exitConfig, out)
	}
	for _, want := range []string{"bad.yaml:3", "storage.bronze_retension", "bronze_retention", "bad.yaml:7", "qos"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("errors lack %q:\n%s", want, out)
		}
	}

	// A file the config names but this machine lacks: config check and run
	// name its line and exit 3 before anything starts; --skip-files lets a
	// fleet config be checked elsewhere.
	creds := filepath.Join(dir, "missing.creds")
	named := writeConfig(t, dir, "gateway_id: gw-01\ndata_dir: "+filepath.Join(dir, "data")+"\nmqtt:\n  subscriptions:\n    - topic: s/{device}\nuplink:\n  nats:\n    url: nats://127.0.0.1:1\n    creds_file: "+creds+"\n")
	for _, args := range [][]string{{"config", "check", "-c", named}, {"run", "-c", named}} {
		out, err = exec.Command(agentBin, args...).CombinedOutput()
		if code := exitCode(err); code != exitConfig {
			t.Fatalf("%s with a missing creds_file exited %d, want %d\n%s", args[0], code, exitConfig, out)
		}
		if want := "config.yaml:9: uplink.nats.creds_file: " + creds; !strings.Contains(string(out), want) {
			t.Errorf("%s: output lacks %q:\n%s", args[0], want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Errorf("run with a missing creds_file touched data_dir (stat: %v)", err)
	}
	out, err = exec.Command(agentBin, "config", "check", "-c", named, "--skip-files").CombinedOutput()
	if err != nil {
		t.Errorf("config check --skip-files: %v\n%s", err, out)
	}
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}

// /readyz answers 503 while the broker is away and 200 again once the agent
// has reconnected; /healthz stays 200 throughout.
func TestReadyzFollowsBroker(t *testing.T) {
	mosq := mqtttest.StartMosquitto(t, "")
	dir := t.TempDir()
	statusAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	cfgPath := writeConfig(t, dir, fmt.Sprintf(`
gateway_id: ready-gw
data_dir: %s/data
mqtt:
  broker: %s
  reconnect_max_interval: 1s
  subscriptions:
    - topic: "sensors/{device}/telemetry"
status:
  listen: "%s"
`, dir, mosq.URL(), statusAddr))
	p := startAgent(t, "run", "-c", cfgPath)
	p.waitLog(t, "connected to broker")
	readyz := func() int {
		resp, err := http.Get("http://" + statusAddr + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	mqtttest.WaitFor(t, 10*time.Second, "/readyz 200", func() bool { return readyz() == 200 })
	mosq.Stop()
	mqtttest.WaitFor(t, 30*time.Second, "/readyz 503 with the broker gone", func() bool { return readyz() == 503 })
	httpGet(t, "http://"+statusAddr+"/healthz", 200)
	mosq.Start()
	mqtttest.WaitFor(t, 30*time.Second, "/readyz 200 after reconnect", func() bool { return readyz() == 200 })
	p.stop(t)
}

// The commands a technician runs read the service's environment file, so a
// fleet config with ${GATEWAY_ID} checks the same way the service runs it.
func TestConfigVariablesFromEnvironmentFile(t *testing.T) {
	dir := t.TempDir()
	cfg := writeConfig(t, dir, "gateway_id: ${GATEWAY_ID}\nmqtt:\n  subscriptions:\n    - topic: sensors/{device}/telemetry\n")
	envFile := filepath.Join(dir, "edgeagent.env")
	if err := os.WriteFile(envFile, []byte("# provisioning\nGATEWAY_ID=\"gw-0042\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(agentBin, "config", "check", "-c", cfg)
	cmd.Env = append(os.Environ(), "EDGEAGENT_ENV_FILE="+envFile)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "gateway_id: gw-0042") {
		t.Fatalf("config check with the environment file: %v\n%s", err, out)
	}
	cmd = exec.Command(agentBin, "config", "check", "-c", cfg)
	cmd.Env = append(os.Environ(), "EDGEAGENT_ENV_FILE="+envFile, "GATEWAY_ID=gw-from-shell")
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "gateway_id: gw-from-shell") {
		t.Fatalf("the process environment must win: %v\n%s", err, out)
	}
	cmd = exec.Command(agentBin, "config", "check", "-c", cfg)
	cmd.Env = append(os.Environ(), "EDGEAGENT_ENV_FILE=")
	if out, err := cmd.CombinedOutput(); exitCode(err) != exitConfig || !strings.Contains(string(out), "GATEWAY_ID") {
		t.Fatalf("an unset variable must be an error naming it: %v\n%s", err, out)
	}
	// A file that exists but cannot be read (a directory here: a test run
	// as root reads a 0600 file) is named in a note under the errors.
	cmd = exec.Command(agentBin, "config", "check", "-c", cfg)
	cmd.Env = append(os.Environ(), "EDGEAGENT_ENV_FILE="+dir)
	if out, err := cmd.CombinedOutput(); exitCode(err) != exitConfig || !strings.Contains(string(out), "Note: the variables file was skipped (read "+dir) {
		t.Fatalf("an unreadable variables file must be named in a note: %v\n%s", err, out)
	}
	// So is a file EDGEAGENT_ENV_FILE names that does not exist (a typo in
	// the path); only the default file may be absent unremarked.
	missing := filepath.Join(dir, "edgeagnt.env")
	cmd = exec.Command(agentBin, "config", "check", "-c", cfg)
	cmd.Env = append(os.Environ(), "EDGEAGENT_ENV_FILE="+missing)
	if out, err := cmd.CombinedOutput(); exitCode(err) != exitConfig || !strings.Contains(string(out), "Note: the variables file was skipped (open "+missing+": no such file or directory); check EDGEAGENT_ENV_FILE") {
		t.Fatalf("a missing variables file named by EDGEAGENT_ENV_FILE must be named in a note: %v\n%s", err, out)
	}
}

// The same with the devices on the agent's embedded broker, whose QoS1
// acknowledgements are pipelined: a device keeps up to 100 publishes in
// flight on its connection while the agent is killed five times, and every
// publish whose PUBACK it read is in Bronze afterwards. The device is a raw
// MQTT connection, because paho reports a publish it re-queues after a
// reconnect as complete without any PUBACK.
func TestCrashLosesNoAcknowledgedMessageEmbedded(t *testing.T) {
	dir := t.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	cfgPath := writeConfig(t, dir, embeddedAgentConfig("crash-gw", dir, addr)+`
status:
  listen: ""
`)
	p := startAgent(t, "run", "-c", cfgPath)
	p.waitLog(t, "embedded broker listening")

	dev := &rawDevice{addr: addr, stop: make(chan struct{}), done: make(chan struct{})}
	go dev.run()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	for kill := 0; kill < 5; kill++ {
		time.Sleep(time.Duration(200+rng.IntN(400)) * time.Millisecond) // a random moment to crash at, not a wait for a condition
		p.kill()
		p = startAgent(t, "run", "-c", cfgPath)
		p.waitLog(t, "embedded broker listening")
	}
	close(dev.stop)
	<-dev.done
	p.stop(t)
	acked, sent := dev.result()
	if len(acked) < 1000 {
		t.Fatalf("only %d of %d publishes acknowledged; the test proves too little", len(acked), sent)
	}
	var lost []string
	for _, id := range missingIDs(t, filepath.Join(dir, "data", "bronze.db"), sent) {
		if acked[id] {
			lost = append(lost, id)
		}
	}
	if len(lost) > 0 {
		t.Fatalf("%d acknowledged readings missing from bronze, e.g. %v; last agent logs:\n%s", len(lost), lost[:min(5, len(lost))], p.logs)
	}
	t.Logf("%d of %d publishes acknowledged across 5 kills; all of them in bronze", len(acked), sent)
}

// rawDevice publishes readings r-0, r-1, … over a bare MQTT 3.1.1
// connection with up to 100 in flight, reconnecting whenever the
// connection breaks, and records which ones the broker acknowledged.
type rawDevice struct {
	addr       string
	stop, done chan struct{}

	mu    sync.Mutex
	sent  int
	acked map[string]bool
}

func (d *rawDevice) result() (map[string]bool, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.acked, d.sent
}

func (d *rawDevice) run() {
	defer close(d.done)
	d.acked = map[string]bool{}
	for {
		select {
		case <-d.stop:
			return
		default:
		}
		conn, err := net.DialTimeout("tcp", d.addr, time.Second)
		if err != nil {
			time.Sleep(20 * time.Millisecond) // the agent is restarting: retry the dial
			continue
		}
		d.session(conn)
		conn.Close()
	}
}

// session publishes on one connection until it breaks or stop closes.
func (d *rawDevice) session(conn net.Conn) {
	var buf bytes.Buffer
	connect := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 4,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), Clean: true, Keepalive: 60, ClientIdentifier: "raw-device"}}
	if connect.ConnectEncode(&buf) != nil {
		return
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		return
	}
	r := bufio.NewReader(conn)
	if typ, _, err := readPacket(r); err != nil || typ != packets.Connack {
		return
	}
	inflight := map[uint16]string{} // packet id → reading id, on this connection
	slots := make(chan struct{}, 100)
	var mu sync.Mutex
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for {
			typ, body, err := readPacket(r)
			if err != nil {
				return
			}
			if typ != packets.Puback || len(body) < 2 {
				continue
			}
			mu.Lock()
			id, ok := inflight[binary.BigEndian.Uint16(body)]
			delete(inflight, binary.BigEndian.Uint16(body))
			mu.Unlock()
			if ok {
				d.mu.Lock()
				d.acked[id] = true
				d.mu.Unlock()
				<-slots
			}
		}
	}()
	defer func() { conn.Close(); <-readerDone }()
	for pid := uint16(1); ; pid = pid%60000 + 1 {
		select {
		case <-d.stop:
			return
		case <-readerDone:
			return
		case slots <- struct{}{}:
		}
		d.mu.Lock()
		n := d.sent
		d.sent++
		d.mu.Unlock()
		id := fmt.Sprintf("r-%d", n)
		mu.Lock()
		inflight[pid] = id
		mu.Unlock()
		pub := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, ProtocolVersion: 4, PacketID: pid,
			TopicName: fmt.Sprintf("sensors/dev-%d/telemetry", n%10),
			Payload:   fmt.Appendf(nil, `{"id":"%s","ts":%d,"temperature":%d}`, id, 1700000000000+int64(n)*100, n%50)}
		buf.Reset()
		if pub.PublishEncode(&buf) != nil {
			return
		}
		if _, err := conn.Write(buf.Bytes()); err != nil {
			return
		}
	}
}

// readPacket reads one MQTT packet: its type and body.
func readPacket(r *bufio.Reader) (byte, []byte, error) {
	hb, err := r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	n, _, err := packets.DecodeLength(r)
	if err != nil {
		return 0, nil, err
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, err
	}
	return hb >> 4, body, nil
}

// processing.max_procs sets the agent's scheduler threads (default 1, 0 for
// one per CPU); GOMAXPROCS in the environment takes precedence.
func TestMaxProcs(t *testing.T) {
	t.Setenv("GOMAXPROCS", "") // empty is unset, for the runtime and the agent
	cases := []struct {
		name, conf, env, want string
	}{
		{"default", "", "", "max_procs=1 from=processing.max_procs"},
		{"config", "processing: {max_procs: 3}", "", "max_procs=3 from=processing.max_procs"},
		{"one per cpu", "processing: {max_procs: 0}", "", fmt.Sprintf("max_procs=%d from=processing.max_procs", runtime.NumCPU())},
		{"environment", "processing: {max_procs: 3}", "GOMAXPROCS=2", "max_procs=2 from=GOMAXPROCS"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			addr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
			cfgPath := writeConfig(t, dir, embeddedAgentConfig("gw-procs", dir, addr)+"\nstatus: {listen: \"\"}\n"+c.conf+"\n")
			var env []string
			if c.env != "" {
				env = []string{c.env}
			}
			p := startAgentEnv(t, env, "run", "-c", cfgPath)
			p.waitLog(t, "scheduler threads")
			p.stop(t)
			if !strings.Contains(p.logs.String(), c.want) {
				t.Fatalf("want %q in the log:\n%s", c.want, p.logs)
			}
		})
	}
}

// status and inspect read a few keys: a variable unset elsewhere in the
// file (a password only the service's variables file holds) does not stop
// them; one in a key they read does, named, with exit 3.
func TestReadOnlyCommandsWithUnsetVariables(t *testing.T) {
	dir := t.TempDir()
	mqttAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	statusAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	cfgPath := writeConfig(t, dir, fmt.Sprintf(`
gateway_id: ${GW}
data_dir: %s/data
mqtt:
  broker: embedded
  embedded: {listen: "%s"}
  subscriptions: [{topic: "sensors/{device}/telemetry"}]
uplink:
  nats: {url: "${NATS_URL}"}
status: {listen: "%s", token: "${TOKEN}"}
`, dir, mqttAddr, statusAddr))
	p := startAgentEnv(t, []string{"GW=gw-ro", "NATS_URL=nats://127.0.0.1:1", "TOKEN=s3cret", "EDGEAGENT_ENV_FILE="}, "run", "-c", cfgPath)
	p.waitLog(t, "status endpoint listening")
	run := func(env []string, args ...string) (string, int) {
		c := exec.Command(agentBin, args...)
		c.Env = append(os.Environ(), append([]string{"EDGEAGENT_ENV_FILE="}, env...)...)
		out, err := c.CombinedOutput()
		return string(out), exitCode(err)
	}
	// GW and NATS_URL unset: status reads only status.*.
	if out, code := run([]string{"TOKEN=s3cret"}, "status", "-c", cfgPath); code != exitOK || !strings.Contains(out, "gw-ro") {
		t.Errorf("status with unrelated variables unset: exit %d\n%s", code, out)
	}
	if out, code := run([]string{"TOKEN=s3cret", "GW=gw-ro"}, "inspect", "bronze", "-c", cfgPath, "--json"); code != exitOK || !strings.HasPrefix(out, "[") {
		t.Errorf("inspect with an unrelated variable unset: exit %d\n%s", code, out)
	}
	// TOKEN unset: status.token is read, so it is named.
	if out, code := run(nil, "status", "-c", cfgPath); code != exitConfig || !strings.Contains(out, "status.token uses ${TOKEN}, which is not set") {
		t.Errorf("status with its token's variable unset: exit %d\n%s", code, out)
	}
	// run and config check still need every variable.
	if out, code := run([]string{"TOKEN=s3cret"}, "config", "check", "-c", cfgPath); code != exitConfig || !strings.Contains(out, "environment variable GW is not set") {
		t.Errorf("config check with GW unset: exit %d\n%s", code, out)
	}
	p.stop(t)
}

// SIGHUP from a service manager reads the config again: the agent stops
// cleanly and opens again in the same process with the new settings. A
// file with problems, or one the saved state refuses, is logged and the
// agent runs on. A burst of SIGHUPs does not kill it, and a SIGTERM with a
// SIGHUP stops it for good. Go's default had ended the
// process without the drain, which systemd took for a clean exit and left
// stopped (found by an audit; the review found the last three).
func TestSighupReloadsConfig(t *testing.T) {
	dir := t.TempDir()
	statusAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	head := embeddedAgentConfig("hup-gw", dir, fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))) +
		fmt.Sprintf("\nstatus:\n  listen: %q\n", statusAddr)
	cfgPath := writeConfig(t, dir, head+"processing:\n  trigger_interval: 1s\n")
	// As under systemd: no controlling terminal (there SIGHUP is a hangup).
	p := startAgentWith(t, func(c *exec.Cmd) { c.SysProcAttr = &syscall.SysProcAttr{Setsid: true} }, "run", "-c", cfgPath)
	p.waitLog(t, "edgeagent starting")
	var bronzeMax atomic.Int64
	interval := func() float64 {
		resp, err := http.Get("http://" + statusAddr + "/status.json")
		if err != nil {
			return -1 // between the stop and the start again
		}
		defer resp.Body.Close()
		var st struct {
			Window struct {
				TriggerIntervalSeconds float64 `json:"trigger_interval_seconds"`
			} `json:"window"`
			Bronze struct {
				MaxBytes int64 `json:"max_bytes"`
			} `json:"bronze"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			return -1
		}
		bronzeMax.Store(st.Bronze.MaxBytes)
		return st.Window.TriggerIntervalSeconds
	}
	alive := func() {
		t.Helper()
		select {
		case <-p.done:
			t.Fatalf("agent exited after SIGHUP; logs:\n%s", p.logs)
		default:
		}
	}
	starts := func() int { return strings.Count(p.logs.String(), "edgeagent starting") }
	mqtttest.WaitFor(t, 10*time.Second, "status with trigger_interval 1s", func() bool { return interval() == 1 })

	// The reload keeps the data files open (a large Bronze takes seconds
	// to open) and gives Bronze the new config's limits.
	writeConfig(t, dir, head+"processing:\n  trigger_interval: 2s\nstorage:\n  bronze_max_bytes: 123456789\n")
	p.cmd.Process.Signal(syscall.SIGHUP)
	mqtttest.WaitFor(t, 30*time.Second, "status with trigger_interval 2s", func() bool { alive(); return interval() == 2 })
	if n := starts(); n != 2 || !strings.Contains(p.logs.String(), "edgeagent stopped") {
		t.Fatalf("want a clean stop and a second start in the same process; logs:\n%s", p.logs)
	}
	if !strings.Contains(p.logs.String(), "keeping the data files open across the reload") {
		t.Errorf("the reload did not keep the data files open; logs:\n%s", p.logs)
	}
	if got := bronzeMax.Load(); got != 123456789 {
		t.Errorf("Bronze's max_bytes after the reload: %d, want 123456789", got)
	}

	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	// The status says a reload was refused, and why (an audit: only the
	// log did, and the file on disk was not the config in force).
	refused := func() (reason string, warned bool) {
		resp, err := http.Get("http://" + statusAddr + "/status.json")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st struct {
			ReloadRefused string   `json:"reload_refused"`
			Warnings      []string `json:"warnings"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
		return st.ReloadRefused, strings.Contains(strings.Join(st.Warnings, "\n"), "the last reload was refused, and the agent runs the config it started with: "+st.ReloadRefused)
	}
	if r, _ := refused(); r != "" {
		t.Errorf("reload_refused %q after a reload that went through", r)
	}
	for _, bad := range []struct{ body, log, reason string }{
		{head + "processing:\n  trigger_interval: soon\n", "SIGHUP: the config has problems; running on", "processing.trigger_interval"},
		{head + "processing:\n  trigger_interval: 2s\nwindow:\n  size: 5m\n", "SIGHUP: the agent would not start with this config; running on", "window.size"},
		{strings.Replace(head, dir+"/data", dir+"/data2", 1) + "processing:\n  trigger_interval: 2s\n", "data_dir changed", "data_dir changed"},
		{strings.Replace(head, statusAddr, busy.Addr().String(), 1) + "processing:\n  trigger_interval: 2s\n", "status.listen " + busy.Addr().String(), "status.listen"},
	} {
		writeConfig(t, dir, bad.body)
		n := starts()
		p.cmd.Process.Signal(syscall.SIGHUP)
		p.waitLog(t, bad.log)
		if got := interval(); got != 2 || starts() != n {
			t.Errorf("after a SIGHUP with a config the agent refuses: trigger interval %v, %d starts; want the running 2s, %d", got, starts(), n)
		}
		if r, warned := refused(); !strings.Contains(r, bad.reason) || !warned {
			t.Errorf("after a refused reload: reload_refused %q (want it to name %s), warned %v", r, bad.reason, warned)
		}
	}

	// A SIGTERM with a SIGHUP: stopped for good, exit 0 (the reload may
	// open the agent once more when it came first; the SIGTERM is not
	// lost and stops that one).
	writeConfig(t, dir, head+"processing:\n  trigger_interval: 3s\n")
	n := starts()
	p.cmd.Process.Signal(syscall.SIGHUP)
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("agent did not exit within 30s of SIGHUP and SIGTERM; logs:\n%s", p.logs)
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 || starts() > n+1 {
		t.Fatalf("SIGHUP with SIGTERM: exit %d, %d starts; want exit 0 and at most one more start than %d; logs:\n%s", code, starts(), n, p.logs)
	}

	// SIGHUPs in a burst across restarts: none may kill the agent, and a
	// SIGTERM after them still stops it cleanly.
	p = startAgentWith(t, func(c *exec.Cmd) { c.SysProcAttr = &syscall.SysProcAttr{Setsid: true} }, "run", "-c", cfgPath)
	p.waitLog(t, "edgeagent starting")
	tick := time.NewTicker(time.Millisecond)
	for range 50 {
		<-tick.C
		p.cmd.Process.Signal(syscall.SIGHUP)
	}
	tick.Stop()
	mqtttest.WaitFor(t, 30*time.Second, "the agent serving after a burst of SIGHUPs", func() bool { alive(); return interval() == 3 })
	p.stop(t)
}

// `edgeagent run` starts over with GODEBUG's schedtrace and
// memprofilerate set (see sysmon_linux.go, memprofile.go), keeping what
// GODEBUG held; a setting GODEBUG names, schedtrace=0 included, is left
// alone.
func TestRunQuietsSysmon(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the system monitor is quieted on Linux only")
	}
	cases := []struct {
		name, godebug, wantEnv, wantLog string
	}{
		{"unset", "", "GODEBUG=" + quietSchedtrace + "," + noMemProfile, "sysmon=quiet"},
		{"kept", "madvdontneed=1", "GODEBUG=madvdontneed=1," + quietSchedtrace + "," + noMemProfile, "sysmon=quiet"},
		{"turned off", "schedtrace=0", "GODEBUG=schedtrace=0," + noMemProfile, "sysmon=default"},
		{"both named", "schedtrace=0,memprofilerate=4096", "GODEBUG=schedtrace=0,memprofilerate=4096", "sysmon=default"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			addr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
			cfgPath := writeConfig(t, dir, embeddedAgentConfig("gw-sysmon", dir, addr)+"\nstatus: {listen: \"\"}\n")
			p := startAgentWith(t, func(cmd *exec.Cmd) {
				cmd.Env = slices.DeleteFunc(cmd.Env, func(kv string) bool { return strings.HasPrefix(kv, "GODEBUG=") })
				if c.godebug != "" {
					cmd.Env = append(cmd.Env, "GODEBUG="+c.godebug)
				}
			}, "run", "-c", cfgPath)
			p.waitLog(t, "scheduler threads")
			// The process started is the one running: exec keeps the pid.
			environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.cmd.Process.Pid))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, kv := range strings.Split(string(environ), "\x00") {
				if strings.HasPrefix(kv, "GODEBUG=") {
					got = append(got, kv)
				}
			}
			if len(got) != 1 || got[0] != c.wantEnv {
				t.Fatalf("the running agent's GODEBUG: %q, want [%q]", got, c.wantEnv)
			}
			p.stop(t)
			if !strings.Contains(p.logs.String(), c.wantLog) {
				t.Fatalf("want %q in the log:\n%s", c.wantLog, p.logs)
			}
		})
	}
}
