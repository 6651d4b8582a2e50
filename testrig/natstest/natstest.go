// Package natstest starts real NATS servers with JetStream for tests — in
// process, or Debian's nats-server binary as a child process — on free
// loopback ports, and reads back what reached a stream.
package natstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeagent/edgeagent/testrig/freeport"
	"github.com/edgeagent/edgeagent/testrig/procattr"
)

// startTimeout bounds a server start.
const startTimeout = 15 * time.Second

// Option adjusts a server before it starts.
type Option func(*options)

type options struct {
	inProcess []func(*server.Options)
	confLines []string
}

// WithOptions edits the in-process server's options (ignored by
// StartBinary), e.g. to set SyncAlways or MaxPayload.
func WithOptions(f func(*server.Options)) Option {
	return func(o *options) { o.inProcess = append(o.inProcess, f) }
}

// WithConfigLines appends lines to the binary server's configuration file
// (ignored by Start).
func WithConfigLines(lines ...string) Option {
	return func(o *options) { o.confLines = append(o.confLines, lines...) }
}

// Server is a running NATS server with JetStream, file storage in a
// temporary directory that survives Restart.
type Server struct {
	t    testing.TB
	opts options
	port int
	dir  string
	bin  string // "" for an in-process server

	startTimeout time.Duration

	mu     sync.Mutex
	srv    *server.Server
	cmd    *exec.Cmd
	exited chan error
}

// Start runs an in-process nats-server with JetStream on a free 127.0.0.1
// port until the test ends.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s := newServer(t, "", opts)
	s.firstStart(func() {})
	t.Cleanup(s.Shutdown)
	return s
}

// BinaryPath returns Debian's nats-server, or skips the test with a clear
// message when it is not installed.
func BinaryPath(t testing.TB) string {
	t.Helper()
	for _, p := range []string{"nats-server", "/usr/sbin/nats-server", "/usr/bin/nats-server"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Skip("natstest: nats-server is not installed (apt-get install nats-server); skipping the test against the binary")
	return ""
}

// StartBinary runs Debian's nats-server binary with JetStream (nats-server
// -c with a generated config) on a free 127.0.0.1 port until the test ends.
// It skips the test when the binary is absent.
func StartBinary(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s := newServer(t, BinaryPath(t), opts)
	s.firstStart(s.writeConfig)
	t.Cleanup(s.Shutdown)
	return s
}

// writeConfig writes the binary server's configuration for its port.
func (s *Server) writeConfig() {
	s.t.Helper()
	conf := fmt.Sprintf("listen: 127.0.0.1:%d\nhttp: 0\njetstream {\n  store_dir: %q\n}\nlog_file: %q\n",
		s.port, filepath.Join(s.dir, "js"), filepath.Join(s.dir, "nats-server.log"))
	for _, l := range s.opts.confLines {
		conf += l + "\n"
	}
	if err := os.WriteFile(filepath.Join(s.dir, "nats-server.conf"), []byte(conf), 0o600); err != nil {
		s.t.Fatalf("natstest: write config: %v", err)
	}
}

// firstStart starts the server, after prepare has written what names its
// port; when the port was taken between its choice and the bind, it does
// so again on a fresh one.
func (s *Server) firstStart(prepare func()) {
	s.t.Helper()
	s.port = freeport.FirstStart(s.t, "natstest", s.port, func(port int) error {
		s.port = port
		prepare()
		return s.start()
	})
}

func newServer(t testing.TB, bin string, opts []Option) *Server {
	s := &Server{t: t, port: FreePort(t), dir: t.TempDir(), bin: bin, startTimeout: startTimeout}
	for _, o := range opts {
		o(&s.opts)
	}
	return s
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	return freeport.Port(t)
}

// URL is nats://127.0.0.1:port.
func (s *Server) URL() string { return "nats://" + s.Addr() }

// Addr is 127.0.0.1:port, for a proxy in front of the server.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Start starts the server (again, after Shutdown) on the same port and
// store directory, and waits until it accepts connections.
func (s *Server) Start() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatal(err)
	}
}

// natsReady is the line nats-server logs once its listeners are bound.
const natsReady = "Server is ready"

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil || s.cmd != nil {
		return nil
	}
	if s.bin == "" {
		o := &server.Options{
			Host: "127.0.0.1", Port: s.port,
			JetStream: true, StoreDir: filepath.Join(s.dir, "js"),
			NoLog: true, NoSigs: true,
		}
		for _, f := range s.opts.inProcess {
			f(o)
		}
		srv, err := server.NewServer(o)
		if err != nil {
			return fmt.Errorf("natstest: new server: %w", err)
		}
		srv.Start()
		if !srv.ReadyForConnections(s.startTimeout) {
			srv.Shutdown()
			srv.WaitForShutdown()
			// Without a log, the listener's error is not at hand: a
			// listen of our own says whether the port was the reason.
			why := "not ready"
			if l, err := net.Listen("tcp", s.Addr()); err != nil {
				why = err.Error()
			} else {
				l.Close()
			}
			return fmt.Errorf("natstest: in-process server on %s: %s after %v", s.Addr(), why, s.startTimeout)
		}
		s.srv = srv
		return nil
	}
	readies := strings.Count(s.Log(), natsReady)
	cmd := exec.Command(s.bin, "-c", filepath.Join(s.dir, "nats-server.conf"))
	// A test binary killed by its timeout leaves no server behind.
	cmd.SysProcAttr = procattr.Child()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("natstest: start %s: %w", s.bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(s.startTimeout)
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("natstest: %s on %s exited during start: %v; log:\n%s", s.bin, s.Addr(), err, s.Log())
		default:
		}
		// Only once this server says it is ready: before, a connection
		// could reach another process holding the port.
		if strings.Count(s.Log(), natsReady) > readies {
			if nc, err := nats.Connect(s.URL(), nats.Timeout(time.Second)); err == nil {
				ok := jetStreamReady(nc)
				nc.Close()
				if ok {
					s.cmd, s.exited = cmd, exited
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("natstest: %s not ready on %s after %v; log:\n%s", s.bin, s.Addr(), s.startTimeout, s.Log())
		}
		time.Sleep(20 * time.Millisecond) // polling a port that has no event to wait on
	}
}

func jetStreamReady(nc *nats.Conn) bool {
	js, err := jetstream.New(nc)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err == nil
}

// Shutdown stops the server (the binary with SIGTERM, then SIGKILL after a
// few seconds). The store directory is kept for Start or Restart.
func (s *Server) Shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		s.srv.Shutdown()
		s.srv.WaitForShutdown()
		s.srv = nil
	}
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(5 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
		s.cmd, s.exited = nil, nil
	}
}

// Restart stops and starts the server on the same port and store.
func (s *Server) Restart() {
	s.t.Helper()
	s.Shutdown()
	s.Start()
}

// Log returns the binary server's log file (empty for in-process servers).
func (s *Server) Log() string {
	b, err := os.ReadFile(filepath.Join(s.dir, "nats-server.log"))
	if err != nil {
		return ""
	}
	return string(b)
}

// Connect opens a client connection that is closed when the test ends.
func Connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("natstest: connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// CreateStream creates a file-storage stream over subjects with the given
// duplicate window (0 keeps the server default of 2 minutes).
func CreateStream(t testing.TB, url, name string, subjects []string, duplicates time.Duration) {
	t.Helper()
	js := jetStream(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: subjects, Storage: jetstream.FileStorage, Duplicates: duplicates,
	}); err != nil {
		t.Fatalf("natstest: create stream %s: %v", name, err)
	}
}

// Msg is one stored stream message.
type Msg struct {
	Seq     uint64
	Subject string
	Header  nats.Header
	Data    []byte
	Time    time.Time
}

// StreamMessages returns every message stored in a stream, in stream order.
func StreamMessages(t testing.TB, url, stream string) []Msg {
	t.Helper()
	js := jetStream(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("natstest: stream %s: %v", stream, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatalf("natstest: stream %s info: %v", stream, err)
	}
	var out []Msg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // deleted
		}
		if err != nil {
			t.Fatalf("natstest: stream %s get %d: %v", stream, seq, err)
		}
		out = append(out, Msg{Seq: m.Sequence, Subject: m.Subject, Header: m.Header, Data: m.Data, Time: m.Time})
	}
	return out
}

// WaitDuplicateWindowPassed returns once every message id a stream stored
// before the call has left its duplicate window, as the server itself sees
// it: it stores a probe on probeSubject (which the stream must cover) with a
// fresh id and republishes it until the server no longer calls it a
// duplicate. The server forgets ids oldest first, so by then it has forgotten
// every earlier one. The stream gains one or two probe messages.
func WaitDuplicateWindowPassed(t testing.TB, url, probeSubject string, timeout time.Duration) {
	t.Helper()
	js := jetStream(t, url)
	id := fmt.Sprintf("natstest-probe-%d", time.Now().UnixNano())
	deadline := time.Now().Add(timeout)
	for first := true; ; first = false {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ack, err := js.Publish(ctx, probeSubject, []byte("probe"), jetstream.WithMsgID(id))
		cancel()
		if err != nil {
			t.Fatalf("natstest: publish probe: %v", err)
		}
		if !first && !ack.Duplicate {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("natstest: duplicate window did not pass within %v", timeout)
		}
		time.Sleep(25 * time.Millisecond) // the server's purge timer has no event to wait on
	}
}

func jetStream(t testing.TB, url string) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(Connect(t, url))
	if err != nil {
		t.Fatalf("natstest: jetstream: %v", err)
	}
	return js
}
