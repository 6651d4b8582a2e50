// Package freeport hands tests and the rig free loopback TCP ports for servers that
// bind their own listener (mosquitto, nats-server, the agent's built-in
// broker, mochi's WebSocket listener).
package freeport

import (
	"fmt"
	"net"
	"sync"
	"testing"
)

var (
	mu     sync.Mutex
	handed = map[int]bool{}
)

// Port returns a free port on 127.0.0.1 that no earlier call in this
// process returned: the kernel may hand a port it just freed out again,
// and two servers given one port fail in ways that look like hangs (a
// WebSocket listener bound in its own goroutine, a TLS client talking to a
// plain broker).
func Port(t testing.TB) int {
	t.Helper()
	return Ports(t, 1)[0]
}

// Ports returns n distinct free ports on 127.0.0.1, as Port does.
func Ports(t testing.TB, n int) []int {
	t.Helper()
	ports, err := Take(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}

// Take returns n distinct free ports on 127.0.0.1 that no earlier call in
// this process returned, for code without a testing.TB (the rig).
func Take(n int) ([]int, error) {
	mu.Lock()
	defer mu.Unlock()
	ports := make([]int, 0, n)
	// Every listener stays open until all ports are chosen, so the kernel
	// cannot return one twice here; ports handed before are skipped.
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			return nil, fmt.Errorf("freeport: no fresh loopback port after %d tries", tries)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("freeport: %w", err)
		}
		defer l.Close()
		p := l.Addr().(*net.TCPAddr).Port
		if handed[p] {
			continue
		}
		handed[p] = true
		ports = append(ports, p)
	}
	return ports, nil
}
