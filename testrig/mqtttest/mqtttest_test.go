package mqtttest

import (
	"strings"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/testrig/freeport"
)

// A mosquitto whose port was taken starts on a fresh one. Before, the
// start waited only for a connection to the port, which the holder
// accepted while mosquitto exited.
func TestMosquittoMovesOffATakenPort(t *testing.T) {
	taken, reached := freeport.Hold(t)
	m := startMosquitto(t, "", taken)
	if m.port == taken {
		t.Fatalf("mosquitto is on the taken port %d", taken)
	}
	if !strings.Contains(m.Log(), "Address already in use") {
		t.Fatalf("mosquitto's log does not show the first start's failure:\n%s", m.Log())
	}
	p := NewPublisher(t, m.URL(), "moved")
	if tok := p.Client.Publish("t", 1, false, "x"); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish to the moved mosquitto: %v", tok.Error())
	}
	if reached() {
		t.Fatal("a connection went to the port's holder")
	}
	// A restart keeps the port the broker moved to.
	m.Stop()
	moved := m.port
	m.Start()
	if m.port != moved {
		t.Fatalf("restarted on %d, want %d", m.port, moved)
	}
}
