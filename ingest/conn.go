package ingest

import (
	"bufio"
	"crypto/tls"
	"net"
	"net/url"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// flushDelay bounds how long a coalesced write (a PUBACK, a PINGREQ) waits
// before it is sent: far below a commit's fsync, which the acks follow.
const flushDelay = time.Millisecond

// bufferedConn is the broker connection under paho. paho reads each
// packet's fixed header a byte at a time straight from the socket and writes
// every PUBACK with its own syscall: together about half the agent's CPU
// under load. Reads go through a buffer; writes are coalesced for at most
// flushDelay, so a group commit's acks leave in a few segments.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader

	mu     sync.Mutex
	w      []byte
	timer  *time.Timer
	err    error // the first write error, returned by every later Write
	closed bool  // Close ran: late PUBACKs are dropped, not buffered
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c *bufferedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if c.closed {
		return 0, net.ErrClosed
	}
	c.w = append(c.w, p...)
	c.scheduleLocked(len(p))
	if c.err != nil {
		return 0, c.err
	}
	return len(p), nil
}

// puback queues the PUBACK for packet id, as paho's Ack would, without
// paho's three goroutine hand-offs per acknowledgement (a third of ingest's
// scheduling under load). Every packet paho writes is one Write call, so
// the PUBACK never lands inside one of paho's packets. On a connection that
// is closed or failed it is dropped: the broker redelivers the message on
// the next connection, where it is stored again and acknowledged there.
func (c *bufferedConn) puback(id uint16) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || c.closed {
		return
	}
	c.w = append(c.w, 0x40, 0x02, byte(id>>8), byte(id))
	c.scheduleLocked(4)
}

// scheduleLocked sends the buffer now when it is large, else makes sure a
// flush is due within flushDelay; n bytes were just appended.
func (c *bufferedConn) scheduleLocked(n int) {
	if len(c.w) >= 32<<10 {
		c.flushLocked()
		return
	}
	if c.timer == nil {
		c.timer = time.AfterFunc(flushDelay, c.flush)
	} else if len(c.w) == n {
		c.timer.Reset(flushDelay)
	}
}

func (c *bufferedConn) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flushLocked()
}

func (c *bufferedConn) flushLocked() {
	if len(c.w) == 0 || c.err != nil {
		return
	}
	_, err := c.Conn.Write(c.w)
	c.w = c.w[:0]
	if err != nil {
		c.err = err
	}
}

// Close sends what is buffered, then closes.
func (c *bufferedConn) Close() error {
	c.mu.Lock()
	if c.timer != nil {
		c.timer.Stop()
	}
	c.flushLocked()
	c.closed = true
	c.mu.Unlock()
	return c.Conn.Close()
}

// bufferedDial opens plain TCP and TLS broker connections for paho through
// a bufferedConn, and tells dialed about each one. WebSocket URLs are left
// to paho (ok is false).
func bufferedDial(scheme string, dialed func(*bufferedConn)) (paho.OpenConnectionFunc, bool) {
	switch scheme {
	case "tcp", "mqtt", "ssl", "tls", "mqtts", "tcps":
	default:
		return nil, false
	}
	return func(uri *url.URL, o paho.ClientOptions) (net.Conn, error) {
		d := &net.Dialer{Timeout: o.ConnectTimeout}
		var c net.Conn
		var err error
		switch uri.Scheme {
		case "tcp", "mqtt":
			c, err = d.Dial("tcp", uri.Host)
		default:
			c, err = tls.DialWithDialer(d, "tcp", uri.Host, o.TLSConfig)
		}
		if err != nil {
			return nil, err
		}
		bc := &bufferedConn{Conn: c, r: bufio.NewReaderSize(c, 32<<10)}
		dialed(bc)
		return bc, nil
	}, true
}
