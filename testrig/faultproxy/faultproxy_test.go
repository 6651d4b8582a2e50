package faultproxy_test

import (
	"bufio"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/testrig/faultproxy"
)

// echoServer answers every line with "echo: <line>" and records what it got.
type echoServer struct {
	ln  net.Listener
	wg  sync.WaitGroup
	mu  sync.Mutex
	got []string
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{ln: ln}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					e.mu.Lock()
					e.got = append(e.got, sc.Text())
					e.mu.Unlock()
					if _, err := c.Write([]byte("echo: " + sc.Text() + "\n")); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		e.wg.Wait()
	})
	return e
}

func (e *echoServer) received(line string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, g := range e.got {
		if g == line {
			return true
		}
	}
	return false
}

func newProxy(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return p
}

type client struct {
	c net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{c, bufio.NewReader(c)}
}

// roundTrip writes a line and reads the answer, waiting at most d.
func (c *client) roundTrip(line string, d time.Duration) (string, error) {
	if _, err := c.c.Write([]byte(line + "\n")); err != nil {
		return "", err
	}
	if err := c.c.SetReadDeadline(time.Now().Add(d)); err != nil {
		return "", err
	}
	s, err := c.r.ReadString('\n')
	return strings.TrimSpace(s), err
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling the condition
	}
}

func TestForward(t *testing.T) {
	e := startEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	got, err := c.roundTrip("hello", 2*time.Second)
	if err != nil || got != "echo: hello" {
		t.Fatalf("round trip = %q, %v", got, err)
	}
	// The counters move just after the bytes do.
	waitFor(t, "the byte counters", func() bool {
		up, down := p.Forwarded()
		return up == int64(len("hello\n")) && down == int64(len("echo: hello\n"))
	})
}

func TestCutResetsAndRefuses(t *testing.T) {
	e := startEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	if _, err := c.roundTrip("before", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	if _, err := c.roundTrip("during", 2*time.Second); err == nil {
		t.Fatal("a cut connection still answered")
	}
	// New connections are accepted and reset at once: the dial itself may
	// see the reset, and nothing is ever answered.
	if c2, err := net.DialTimeout("tcp", p.Addr(), 2*time.Second); err == nil {
		defer c2.Close()
		cl := &client{c2, bufio.NewReader(c2)}
		if got, err := cl.roundTrip("new", 2*time.Second); err == nil {
			t.Fatalf("a connection made during the cut answered %q", got)
		}
	}
	if e.received("during") || e.received("new") {
		t.Fatal("bytes crossed a cut link")
	}
	p.Restore()
	c3 := dial(t, p.Addr())
	if got, err := c3.roundTrip("after", 2*time.Second); err != nil || got != "echo: after" {
		t.Fatalf("after restore: %q, %v", got, err)
	}
}

func TestBlackholeAnswersNothing(t *testing.T) {
	e := startEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	if _, err := c.roundTrip("before", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	if got, err := c.roundTrip("void", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("blackholed existing connection: %q, %v; want a read timeout", got, err)
	}
	c2 := dial(t, p.Addr()) // accepted, not refused
	if got, err := c2.roundTrip("void2", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("blackholed new connection: %q, %v; want a read timeout", got, err)
	}
	waitFor(t, "the blackhole to swallow both lines", func() bool {
		up, _ := p.Dropped()
		return up >= int64(len("void\nvoid2\n"))
	})
	if e.received("void") || e.received("void2") {
		t.Fatal("bytes crossed a blackhole")
	}
	p.Restore()
	if _, err := c.roundTrip("stale", time.Second); err == nil {
		t.Fatal("a connection that lived through the blackhole was not reset")
	}
	c3 := dial(t, p.Addr())
	if got, err := c3.roundTrip("after", 2*time.Second); err != nil || got != "echo: after" {
		t.Fatalf("after restore: %q, %v", got, err)
	}
}

func TestDropServerToClient(t *testing.T) {
	e := startEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	p.DropServerToClient()
	if got, err := c.roundTrip("stored", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("reply was not dropped: %q, %v", got, err)
	}
	// The server acted on the request although the client heard nothing.
	waitFor(t, "the server to receive the request", func() bool { return e.received("stored") })
	waitFor(t, "the reply to be swallowed", func() bool {
		_, down := p.Dropped()
		return down == int64(len("echo: stored\n"))
	})
	p.Restore()
	if _, err := c.roundTrip("stale", time.Second); err == nil {
		t.Fatal("a connection that lost replies was not reset")
	}
}

func TestCloseIdempotentWithOpenConns(t *testing.T) {
	e := startEcho(t)
	p, err := faultproxy.New(e.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr())
	if _, err := c.roundTrip("x", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	dial(t, p.Addr())
	waitFor(t, "two accepted connections", func() bool { return p.Accepted() == 2 })
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("a closed proxy still accepts")
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// A server that closes its side during a blackhole (a broker whose
// keep-alive deadline passed) goes unseen by the client, as behind a real
// blackhole; once restored, the client's next bytes find the server gone.
func TestBlackholeHidesTheServersClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	p := newProxy(t, ln.Addr().String())
	c := dial(t, p.Addr())
	var srv net.Conn
	select {
	case srv = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the proxy did not connect to the server")
	}
	p.Blackhole()
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if got, err := c.roundTrip("anyone?", 500*time.Millisecond); !isTimeout(err) {
		t.Fatalf("the server's close reached the client through the blackhole: %q, %v", got, err)
	}
	p.Restore()
	if _, err := c.roundTrip("stale", time.Second); err == nil {
		t.Fatal("a connection whose server closed during the blackhole still answered")
	}
}
