package natstest

import (
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/testrig/freeport"
)

// A server whose port was taken starts on a fresh one, and it is that
// server the test then talks to, not the port's holder.
func TestFirstStartMovesOffATakenPort(t *testing.T) {
	for _, kind := range []string{"in-process", "binary"} {
		t.Run(kind, func(t *testing.T) {
			bin, prepare := "", func(*Server) {}
			if kind == "binary" {
				bin, prepare = BinaryPath(t), (*Server).writeConfig
			}
			taken, reached := freeport.Hold(t)
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
			if reached() {
				t.Fatal("a connection went to the port's holder")
			}
		})
	}
}
