package ingest

import (
	"errors"
	"net"
	"os"
	"sync/atomic"
	"time"
)

// lowatConn is a broker TCP connection whose reads wake once a batch of
// bytes has arrived, not on every segment. Under load the broker's stream
// arrives a few messages at a time, and each wake-up cost an epoll wait, a
// read and a context switch: 800-2,700 a second at 25,000 msgs/s, which on
// a virtual machine's costly system calls was about a tenth of the agent's
// CPU.
//
// While the stream runs fast, the socket's receive low-water mark
// (SO_RCVLOWAT, Linux) is set to half of what arrives in wait at the
// stream's rate, so the kernel wakes the reader only once that much is
// queued; each read waits at most wait for it, and then takes whatever is
// there. An ack, a PINGRESP or the tail of a burst is never held longer
// than wait. A slow stream (under lowatMin bytes a wait) reads as before:
// no mark, no deadline.
//
// Reads come from one goroutine (paho's reader, through the bufio.Reader);
// the deadlines a caller sets (paho's connect) turn the batching off until
// they are cleared.
type lowatConn struct {
	*net.TCPConn
	setMark func(n int) error // sets SO_RCVLOWAT
	now     func() time.Time
	wait    time.Duration

	mark int // the socket's mark; 1 is the kernel's default
	want int // the mark the stream's rate calls for; 1 is none
	// external is set while the caller holds a deadline of its own.
	external atomic.Bool

	periodStart time.Time
	periodBytes int
	broken      bool // setting the mark failed once: reads stay plain
}

const (
	// lowatWait bounds how long a read waits for the mark. At 25,000
	// msgs/s the broker socket's reads fell from 800-2,000 a second to
	// about 320 (docs/performance.md, session 44), for at most 10 ms more
	// before a message's commit.
	lowatWait = 10 * time.Millisecond
	// lowatPeriod is how often the mark follows the stream's rate.
	lowatPeriod = 100 * time.Millisecond
	// The mark is off below lowatMin bytes and capped at lowatMax (the
	// bufio.Reader's buffer is 32 KiB).
	lowatMin = 2 << 10
	lowatMax = 32 << 10
)

func newLowat(tc *net.TCPConn, setMark func(int) error) *lowatConn {
	return &lowatConn{TCPConn: tc, setMark: setMark, now: time.Now, wait: lowatWait, mark: 1, want: 1}
}

func (c *lowatConn) Read(p []byte) (int, error) {
	if c.want <= 1 || c.external.Load() {
		n, err := c.TCPConn.Read(p)
		c.follow(n)
		return n, err
	}
	if err := c.TCPConn.SetReadDeadline(c.now().Add(c.wait)); err != nil {
		return 0, err
	}
	n, err := c.TCPConn.Read(p)
	if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) && !c.external.Load() {
		// Under the mark for a whole wait: take what is there, or wait
		// for the next byte as a plain read does. Lowering the mark
		// wakes the poller if anything is queued.
		c.setTo(1)
		if err := c.TCPConn.SetReadDeadline(time.Time{}); err != nil {
			return 0, err
		}
		n, err = c.TCPConn.Read(p)
		c.setTo(c.want)
	}
	c.follow(n)
	return n, err
}

// follow counts n bytes read and, once a period has passed, sets the mark
// the period's rate calls for.
func (c *lowatConn) follow(n int) {
	if c.broken {
		return // plain reads for good: no deadlines either
	}
	c.periodBytes += n
	now := c.now()
	if c.periodStart.IsZero() {
		c.periodStart = now
		return
	}
	elapsed := now.Sub(c.periodStart)
	if elapsed < lowatPeriod {
		return
	}
	want := int(float64(c.periodBytes) * float64(c.wait) / float64(elapsed) / 2)
	c.periodStart, c.periodBytes = now, 0
	switch {
	case want < lowatMin:
		want = 1
	case want > lowatMax:
		want = lowatMax
	}
	// Small changes of rate leave the mark alone: each change is a
	// system call.
	if want == c.want || want > 1 && c.want > 1 && want < c.want*3/2 && want > c.want*2/3 {
		return
	}
	c.want = want
	c.setTo(want)
	if c.want == 1 && !c.external.Load() {
		// The batching is off (or the kernel refused the mark): no
		// deadline of the last read is left to expire on a plain one.
		// It fails only on a closed connection, which the next read
		// reports.
		_ = c.TCPConn.SetReadDeadline(time.Time{})
	}
}

// setTo sets the socket's mark to n.
func (c *lowatConn) setTo(n int) {
	if c.broken || n == c.mark {
		return
	}
	if err := c.setMark(n); err != nil {
		// The kernel refused it: plain reads from now on.
		c.broken, c.want = true, 1
		return
	}
	c.mark = n
}

// SetDeadline and SetReadDeadline pass a caller's deadline through and
// hold the batching off while one is set.
func (c *lowatConn) SetDeadline(t time.Time) error {
	c.external.Store(!t.IsZero())
	return c.TCPConn.SetDeadline(t)
}

func (c *lowatConn) SetReadDeadline(t time.Time) error {
	c.external.Store(!t.IsZero())
	return c.TCPConn.SetReadDeadline(t)
}
