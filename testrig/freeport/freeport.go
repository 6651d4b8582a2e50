// Package freeport hands tests and the rig free loopback TCP ports for servers that
// bind their own listener (mosquitto, nats-server, the agent's built-in
// broker, mochi's WebSocket listener).
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
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

// lowestPort is the floor of the range ports are drawn from: above the
// ports services commonly use.
const lowestPort = 10000

// Take returns n distinct free ports on 127.0.0.1 that no earlier call in
// this process returned, for code without a testing.TB (the rig).
//
// A port is handed out free but bound later, often by a child process, so
// something else may take it in between. Where the kernel says which range
// it draws ephemeral ports from (Linux), ports come from below that range:
// then no outgoing connection (a simulated device's, say) and no listener
// on port 0 in any process can take one, which before this was seen in CI
// as a child's "bind: address already in use". The draw is random, so two
// test processes drawing at once rarely meet.
func Take(n int) ([]int, error) {
	mu.Lock()
	defer mu.Unlock()
	ephemeralLow, ok := ephemeralFloor()
	ports := make([]int, 0, n)
	// Every listener stays open until all ports are chosen, so the kernel
	// cannot return one twice here; ports handed before are skipped.
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			return nil, fmt.Errorf("freeport: no fresh loopback port after %d tries", tries)
		}
		addr := "127.0.0.1:0"
		if ok {
			addr = "127.0.0.1:" + strconv.Itoa(lowestPort+rand.IntN(ephemeralLow-lowestPort))
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			if ok {
				continue // in use: draw again
			}
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

// ephemeralFloor reads the lowest ephemeral port from Linux's
// ip_local_port_range; ok is false where there is no such file or it
// leaves too few ports below it to draw from.
func ephemeralFloor() (low int, ok bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, false
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return 0, false
	}
	low, err = strconv.Atoi(fields[0])
	if err != nil || low-lowestPort < 1000 {
		return 0, false
	}
	return low, true
}

// StartAttempts is how many fresh ports a server's first start tries when
// the one before was taken between its choice and the bind (Take says
// why that can happen). Nothing has connected to the server yet then.
const StartAttempts = 3

// FirstStart starts a server with start on port and returns the port it
// got: when start fails because the port was taken (Taken), it tries a
// fresh one from Port, up to StartAttempts in all. Any other failure, or
// the last, fails the test. name says which server in the log.
func FirstStart(t testing.TB, name string, port int, start func(port int) error) int {
	t.Helper()
	for attempt := 1; ; attempt++ {
		err := start(port)
		if err == nil {
			return port
		}
		if attempt == StartAttempts || !Taken(err.Error()) {
			t.Fatal(err)
		}
		t.Logf("%s: port %d was taken; it starts again on another", name, port)
		port = Port(t)
	}
}

// Hold listens on a loopback port until the test ends, as another process
// that took a server's port between its choice and the bind would, for
// tests of FirstStart's callers. reached reports whether anything
// connected to the port since: a server's clients must not have.
func Hold(t testing.TB) (port int, reached func() bool) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.Addr().(*net.TCPAddr).Port, func() bool {
		// A deadline already passed fails Accept before it looks at the
		// backlog, where a connection made earlier waits: give it a moment.
		if err := l.(*net.TCPListener).SetDeadline(time.Now().Add(100 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		c, err := l.Accept()
		if err == nil {
			c.Close()
		}
		return err == nil
	}
}

// Taken reports whether a server's error or log says that its port was in
// use: mosquitto logs "Error: Address already in use", nats-server and Go
// "bind: address already in use".
func Taken(text string) bool {
	return strings.Contains(strings.ToLower(text), "address already in use")
}
