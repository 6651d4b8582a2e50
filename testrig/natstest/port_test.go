package natstest

import (
	"net"
	"testing"
	"time"
)

// holdPort listens on a loopback port until the test ends, as another
// process that took a server's port between its choice and the bind.
func holdPort(t *testing.T) (net.Listener, int) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, l.Addr().(*net.TCPAddr).Port
}

// A server whose port was taken starts on a fresh one, and it is that
// server the test then talks to, not the port's holder.
func TestFirstStartMovesOffATakenPort(t *testing.T) {
	for _, kind := range []string{"in-process", "binary"} {
		t.Run(kind, func(t *testing.T) {
			bin, prepare := "", func(*Server) {}
			if kind == "binary" {
				bin, prepare = BinaryPath(t), (*Server).writeConfig
			}
			held, taken := holdPort(t)
			s := newServer(t, bin, nil)
			s.port = taken
			// The in-process server cannot say why it is not ready: it is
			// given a second before the port is checked.
			s.startTimeout = time.Second
			s.firstStart(func() { prepare(s) })
			t.Cleanup(s.Shutdown)
			if s.port == taken {
				t.Fatalf("the server is on the taken port %d", taken)
			}
			CreateStream(t, s.URL(), "T", []string{"t.>"}, 0)
			if err := held.(*net.TCPListener).SetDeadline(time.Now()); err != nil {
				t.Fatal(err)
			}
			if c, err := held.Accept(); err == nil {
				c.Close()
				t.Fatal("a connection went to the port's holder")
			}
		})
	}
}
