package freeport

import (
	"net"
	"strconv"
	"testing"
)

// Ports never repeats a port within the process, and each is bindable.
func TestPortsAreDistinctAndFree(t *testing.T) {
	seen := map[int]bool{}
	for i := 0; i < 50; i++ {
		for _, p := range append(Ports(t, 3), Port(t)) {
			if seen[p] {
				t.Fatalf("port %d handed out twice", p)
			}
			seen[p] = true
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(Port(t)))
	if err != nil {
		t.Fatalf("a handed port is not free: %v", err)
	}
	l.Close()
}

// Where the kernel names its ephemeral range, ports come from below it, so
// no outgoing connection can hold one before its server binds it.
func TestPortsComeFromBelowTheEphemeralRange(t *testing.T) {
	low, ok := ephemeralFloor()
	if !ok {
		t.Skip("this system does not say which ports are ephemeral")
	}
	for _, p := range Ports(t, 20) {
		if p < lowestPort || p >= low {
			t.Fatalf("port %d is outside [%d, %d)", p, lowestPort, low)
		}
	}
}
