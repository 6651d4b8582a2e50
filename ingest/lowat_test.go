package ingest

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			c = nil
		}
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// The mark follows the stream's rate: half of what arrives in a wait, off
// below lowatMin, capped at lowatMax, left alone for small changes, and
// off for good once the kernel refuses it.
func TestLowatMarkFollowsTheRate(t *testing.T) {
	client, _ := tcpPair(t)
	var marks []int
	var refuse error
	c := newLowat(client, func(n int) error {
		if refuse != nil {
			return refuse
		}
		marks = append(marks, n)
		return nil
	})
	now := time.Unix(1_700_000_000, 0)
	c.now = func() time.Time { return now }
	period := func(bytes int) {
		now = now.Add(lowatPeriod)
		c.follow(bytes)
	}
	c.follow(0) // starts the first period

	period(200 << 10) // 2 MiB/s: 20 KiB a wait, half of it
	if c.want != 10<<10 || len(marks) != 1 || marks[0] != 10<<10 {
		t.Fatalf("at 2 MiB/s: want %d, marks %v; want a mark of %d", c.want, marks, 10<<10)
	}
	period(240 << 10) // 20 % faster: not worth a system call
	if len(marks) != 1 {
		t.Fatalf("a 20 %% change of rate set the mark again: %v", marks)
	}
	period(100 << 20) // far faster: capped
	if c.want != lowatMax || marks[len(marks)-1] != lowatMax {
		t.Fatalf("at 1 GiB/s: want %d, marks %v; want the cap %d", c.want, marks, lowatMax)
	}
	period(10 << 10) // 100 KiB/s: 512 bytes a half-wait, under lowatMin
	if c.want != 1 || marks[len(marks)-1] != 1 {
		t.Fatalf("at 100 KiB/s: want %d, marks %v; want the mark off (1)", c.want, marks)
	}

	refuse = errors.New("refused")
	period(200 << 10)
	if !c.broken || c.want != 1 {
		t.Fatalf("after a refused mark: broken %v, want %d; want plain reads", c.broken, c.want)
	}
	n := len(marks)
	period(200 << 10)
	if len(marks) != n || c.want != 1 {
		t.Fatalf("a broken conn set the mark again (%v) or wants one (%d): want plain reads", marks, c.want)
	}
}

// A caller's deadline (paho's connect) holds the batching off and still
// expires as set.
func TestLowatKeepsTheCallersDeadline(t *testing.T) {
	client, _ := tcpPair(t)
	c := newLowat(client, func(int) error { return nil })
	c.want, c.mark = 16<<10, 16<<10
	c.wait = time.Hour // only the caller's deadline can end the read
	if err := c.SetDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 16)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the caller's deadline: %v, want a deadline error", err)
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	if c.external.Load() {
		t.Fatal("a cleared deadline still holds the batching off")
	}
}
