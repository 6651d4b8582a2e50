package freeport

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
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

// fatalTB records a Fatal and stops the call under test, as testing.T's
// Fatal stops its goroutine.
type fatalTB struct {
	testing.TB
	fatal string
}

type stopped struct{}

func (f *fatalTB) Fatal(args ...any) { f.fatal = fmt.Sprint(args...); panic(stopped{}) }

func (f *fatalTB) Logf(string, ...any) {}

// firstStart runs FirstStart with start and reports the port it returned
// and the ports start was called with, or the Fatal that stopped it.
func firstStart(t *testing.T, start func(port int) error) (got int, tried []int, fatal string) {
	tb := &fatalTB{TB: t}
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(stopped); !ok {
				panic(r)
			}
			fatal = tb.fatal
		}
	}()
	got = FirstStart(tb, "test server", 10001, func(port int) error {
		tried = append(tried, port)
		return start(port)
	})
	return got, tried, ""
}

// A taken port is left for a fresh one, up to StartAttempts; any other
// failure ends the start at once.
func TestFirstStart(t *testing.T) {
	taken := errors.New("listen tcp 127.0.0.1:10001: bind: address already in use")
	got, tried, fatal := firstStart(t, func(port int) error {
		if port == 10001 {
			return taken
		}
		return nil
	})
	if fatal != "" || len(tried) != 2 || got != tried[1] || got == 10001 {
		t.Errorf("a taken port: got %d after %v (fatal %q), want the second port", got, tried, fatal)
	}
	_, tried, fatal = firstStart(t, func(int) error { return taken })
	if len(tried) != StartAttempts || !strings.Contains(fatal, "address already in use") {
		t.Errorf("every port taken: tried %v, fatal %q; want %d tries and the last error", tried, fatal, StartAttempts)
	}
	_, tried, fatal = firstStart(t, func(int) error { return errors.New("config refused") })
	if len(tried) != 1 || fatal != "config refused" {
		t.Errorf("another failure: tried %v, fatal %q; want one try", tried, fatal)
	}
}

// Hold's check sees a connection made to the held port, and only one.
func TestHold(t *testing.T) {
	port, reached := Hold(t)
	if reached() {
		t.Fatal("reached before anything connected")
	}
	c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !reached() {
		t.Fatal("a connection to the held port was not seen")
	}
	if reached() {
		t.Fatal("one connection was seen twice")
	}
}
