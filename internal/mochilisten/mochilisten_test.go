package mochilisten

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startBroker serves a mochi broker that allows everything on l.
func startBroker(t *testing.T, l listeners.Listener) *mochi.Server {
	t.Helper()
	srv := mochi.New(&mochi.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatal(err)
	}
	if err := srv.AddListener(l); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	return srv
}

// connectPacket is an MQTT 3.1.1 CONNECT with client id "c" and a clean
// session.
var connectPacket = []byte{0x10, 13, 0, 4, 'M', 'Q', 'T', 'T', 4, 0x02, 0, 60, 0, 1, 'c'}

// connectClient dials addr, sends connectPacket and reads the CONNACK.
func connectClient(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write(connectPacket); err != nil {
		t.Fatal(err)
	}
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	connack := make([]byte, 4)
	if _, err := io.ReadFull(c, connack); err != nil || connack[0] != 0x20 {
		t.Fatalf("CONNACK: % x, %v", connack, err)
	}
	return c
}

// TestCloseEndsEveryConnection: a connection that never sent CONNECT (so
// mochi never registered it) and clients connecting while Close runs
// must not keep Close waiting. With mochi's own TCP listener the first
// alone makes Close wait forever.
func TestCloseEndsEveryConnection(t *testing.T) {
	addr := freeAddr(t)
	srv := startBroker(t, Listen("tcp", addr))

	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	registered := connectClient(t, addr)

	// Clients that keep reconnecting, as an agent does after a restart.
	ctx, cancel := context.WithCancel(context.Background())
	var dialers sync.WaitGroup
	for i := 0; i < 4; i++ {
		dialers.Add(1)
		go func() {
			defer dialers.Done()
			for ctx.Err() == nil {
				c, err := net.DialTimeout("tcp", addr, time.Second)
				if err != nil {
					continue // refused once the listener is closed
				}
				_, _ = c.Write(connectPacket) // may race with Close; either way is the case under test
				_ = c.Close()
			}
		}()
	}
	defer func() { cancel(); dialers.Wait() }()

	closed := make(chan error, 1)
	go func() { closed <- srv.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close still waiting after 10 s for a connection it never ended")
	}
	// Both connections were ended by the broker.
	for name, c := range map[string]net.Conn{"silent": silent, "registered": registered} {
		if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		for {
			_, err := c.Read(buf)
			if err == nil {
				continue // a DISCONNECT the broker sent first
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("%s connection still open after Close", name)
			}
			break
		}
	}
}

// Close ends its connections itself and never waits on mochi's
// closeListenerClients, which in mochi v2.7.9 can block for good (two
// read locks with a client's Delete waiting between them): here it
// blocks for as long as the test runs.
func TestCloseDoesNotWaitOnMochisClientClose(t *testing.T) {
	addr := freeAddr(t)
	l := Listen("tcp", addr)
	srv := startBroker(t, l)
	defer srv.Close()
	c := connectClient(t, addr)
	closeEndsClientWithoutMochi(t, l, c)
}

// closeEndsClientWithoutMochi closes l with a closeListenerClients that
// blocks until the test ends, and checks that Close returns anyway and
// that the client's connection c was ended.
func closeEndsClientWithoutMochi(t *testing.T, l listeners.Listener, c net.Conn) {
	t.Helper()
	stuck := make(chan struct{})
	defer close(stuck)
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		l.Close(func(string) { <-stuck })
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close still waiting after 10 s on mochi's closing of its clients")
	}
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("the client's connection was not ended by Close: %v", err)
	}
}

// failingListener fails its first accepts as a process out of file
// descriptors does.
type failingListener struct {
	net.Listener
	failures atomic.Int32
}

func (l *failingListener) Accept() (net.Conn, error) {
	if l.failures.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// Running out of file descriptors for a moment does not stop the broker
// accepting: the client that connects after it is served.
func TestServeOutlastsTransientAcceptErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &failingListener{Listener: ln}
	fl.failures.Store(3)
	srv := startBroker(t, Serve("tcp", fl))
	defer srv.Close()
	connectClient(t, ln.Addr().String()) // served after the failed accepts
	if n := fl.failures.Load(); n >= 0 {
		t.Fatalf("%d accept failures left: the listener never got past them", n+1)
	}
}

// A guarded mochi listener ends its clients itself on Close, and never
// through mochi's closeListenerClients (here, one that blocks for as long
// as the test runs).
func TestGuardClosesClientsWithoutMochisClientClose(t *testing.T) {
	addr := freeAddr(t)
	srv := mochi.New(&mochi.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatal(err)
	}
	l := Guard(srv, listeners.NewTCP(listeners.Config{ID: "tcp", Address: addr}))
	if err := srv.AddListener(l); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() }) // after the client's connection closes
	c := connectClient(t, addr)
	closeEndsClientWithoutMochi(t, l, c)
}
