package ingest

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
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
//
// With publish set, the connection also takes QoS0 and QoS1 PUBLISH packets
// out of the stream paho reads and hands them to publish directly, from
// paho's reading goroutine: paho hands each message through two more
// goroutines before its handler, and allocates five objects for it. paho
// still sees every other packet (CONNACK, SUBACK, PINGRESP, and QoS2's
// exchange), so it keeps the session, keepalive and reconnects.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader

	publish publishFunc
	// maxPayload (max_payload_bytes; 0: no bound) is the largest payload
	// read whole: of a larger one only a prefix is kept and the rest is
	// read past, so one huge message costs no memory (it is dead-lettered
	// with the prefix anyway).
	maxPayload int
	// connack, when set, is told the session-present flag of an accepted
	// CONNACK passing to paho (paho does not tell it on reconnects).
	connack func(sessionPresent bool)
	// oversized, when set, is told the packet id and payload size of a
	// QoS2 PUBLISH whose payload it cut to a prefix (passLargeQoS2).
	oversized func(id uint16, size int)
	pass      []byte // what is left of a packet paho is reading
	passBuf   []byte

	// dropped is why drop closed the connection: what reads return, since
	// paho takes a "closed connection" read error for a disconnect of its
	// own and would not reconnect.
	dropped atomic.Pointer[error]

	mu     sync.Mutex
	w      []byte
	timer  *time.Timer
	err    error // the first write error, returned by every later Write
	closed bool  // Close ran: late PUBACKs are dropped, not buffered
}

// publishFunc receives a PUBLISH taken out of the stream: id is its packet
// id (0 for QoS0), to acknowledge with c.puback once it is durable. topic
// and payload are only valid during the call. size is the payload's length
// on the wire: more than len(payload) when only a prefix was kept.
type publishFunc func(c *bufferedConn, topic []byte, qos byte, retained, dup bool, id uint16, payload []byte, size int)

// oversizedPrefix is how much of a payload over maxPayload is kept: what a
// rejected record stores.
const oversizedPrefix = 256

func (c *bufferedConn) Read(p []byte) (int, error) {
	if c.publish == nil {
		n, err := c.r.Read(p)
		return n, c.readErr(err)
	}
	for len(c.pass) == 0 {
		if err := c.nextPacket(); err != nil {
			return 0, c.readErr(err)
		}
	}
	n := copy(p, c.pass)
	c.pass = c.pass[n:]
	return n, nil
}

// errMalformed is a packet from the broker that breaks MQTT's framing; paho
// treats the read error as a lost connection and reconnects.
var errMalformed = errors.New("malformed packet from broker")

// nextPacket reads one packet: a QoS0/1 PUBLISH goes to publish, anything
// else becomes pass for paho to read.
func (c *bufferedConn) nextPacket() error {
	h, err := c.r.ReadByte()
	if err != nil {
		return err
	}
	var n, lenBytes int
	for shift := 0; ; shift += 7 {
		if lenBytes == 4 {
			return fmt.Errorf("%w: remaining length over 4 bytes", errMalformed)
		}
		b, err := c.r.ReadByte()
		if err != nil {
			return err
		}
		lenBytes++
		n |= int(b&0x7f) << shift
		if b&0x80 == 0 {
			break
		}
	}
	qos := h >> 1 & 3
	if h>>4 == 3 && qos == 3 {
		return fmt.Errorf("%w: PUBLISH with QoS 3", errMalformed)
	}
	if h>>4 == 3 && qos == 2 && c.maxPayload > 0 && n-4 > c.maxPayload {
		return c.passLargeQoS2(h, n)
	}
	if h>>4 != 3 || qos == 2 {
		// MQTT's remaining length is a uvarint (of at most 4 bytes here).
		c.passBuf = binary.AppendUvarint(append(c.passBuf[:0], h), uint64(n))
		if c.passBuf, err = appendN(c.passBuf, c.r, n); err != nil {
			return err
		}
		c.pass = c.passBuf
		if body := c.passBuf[len(c.passBuf)-n:]; h>>4 == 2 && n >= 2 && body[1] == 0 && c.connack != nil {
			c.connack(body[0]&1 == 1)
		}
		return nil
	}
	if n > c.r.Size() {
		return c.readLargePublish(h, n)
	}
	body, err := c.r.Peek(n) // no copy: publish copies what it keeps
	if err != nil {
		return err
	}
	if err := c.dispatch(h, body, -1); err != nil {
		return err
	}
	_, err = c.r.Discard(n)
	return err
}

// readLargePublish reads a QoS0/1 PUBLISH of n bytes that does not fit
// the read buffer. A payload over maxPayload is not read into memory: its
// prefix is kept and the rest discarded as it streams in.
func (c *bufferedConn) readLargePublish(h byte, n int) error {
	head := 2 // topic length
	if h>>1&3 == 1 {
		head += 2 // packet id
	}
	body, err := appendN(nil, c.r, 2) // n is over the read buffer's size
	if err != nil {
		return err
	}
	head += int(body[0])<<8 | int(body[1])
	if c.maxPayload <= 0 || n-head <= c.maxPayload {
		if body, err = appendN(body, c.r, n-len(body)); err != nil {
			return err
		}
		return c.dispatch(h, body, n-head)
	}
	keep := min(n, head+oversizedPrefix) // the topic and id, then the payload's prefix
	if body, err = appendN(body, c.r, keep-len(body)); err != nil {
		return err
	}
	if _, err := c.r.Discard(n - keep); err != nil {
		return err
	}
	return c.dispatch(h, body, n-head)
}

// passLargeQoS2 passes paho a QoS2 PUBLISH of n bytes whose payload may be
// over maxPayload. paho keeps QoS2's exchange (PUBREC, PUBREL, PUBCOMP),
// so the packet still goes to it, but an oversized payload is cut to its
// prefix as it streams in, like readLargePublish's, and its size on the
// wire goes to c.oversized under the packet id, for the handler to
// dead-letter the message as oversized rather than take the prefix for it.
func (c *bufferedConn) passLargeQoS2(h byte, n int) error {
	body, err := appendN(c.passBuf[:0], c.r, 2) // n is at least 5 here
	if err != nil {
		return err
	}
	head := 2 + (int(body[0])<<8 | int(body[1])) + 2 // topic length, topic, packet id
	keep := n
	if n-head > c.maxPayload {
		keep = min(n, head+oversizedPrefix)
	}
	if body, err = appendN(body, c.r, keep-len(body)); err != nil {
		return err
	}
	if keep < n {
		if _, err := c.r.Discard(n - keep); err != nil {
			return err
		}
		if c.oversized != nil {
			c.oversized(binary.BigEndian.Uint16(body[head-2:head]), n-head)
		}
	}
	// The fixed header goes in front: the body was read into passBuf first
	// so that no second buffer of its size is made.
	var fixed [5]byte
	fixed[0] = h
	hl := 1 + binary.PutUvarint(fixed[1:], uint64(keep))
	c.passBuf = append(body, fixed[:hl]...)
	copy(c.passBuf[hl:], c.passBuf[:keep])
	copy(c.passBuf, fixed[:hl])
	c.pass = c.passBuf
	return nil
}

// appendN appends the next n bytes of r to b. It grows b as the bytes
// arrive rather than by n at once, so a corrupt length (up to 256 MiB) on a
// stream that then ends costs no more than the bytes that came.
func appendN(b []byte, r io.Reader, n int) ([]byte, error) {
	for n > 0 {
		b = slices.Grow(b, min(n, 64<<10))
		m, err := io.ReadFull(r, b[len(b):len(b)+min(n, cap(b)-len(b))])
		b, n = b[:len(b)+m], n-m
		if err != nil {
			return b, err
		}
	}
	return b, nil
}

// dispatch parses a QoS0/1 PUBLISH's body and hands it to publish; size is
// the payload's length on the wire, -1 for the payload's own.
func (c *bufferedConn) dispatch(h byte, body []byte, size int) error {
	n, qos := len(body), h>>1&3
	if len(body) < 2 {
		return fmt.Errorf("%w: PUBLISH of %d bytes", errMalformed, n)
	}
	tl := int(body[0])<<8 | int(body[1])
	rest := body[2:]
	if tl > len(rest) {
		return fmt.Errorf("%w: PUBLISH topic of %d bytes in %d", errMalformed, tl, n)
	}
	topic, rest := rest[:tl], rest[tl:]
	var id uint16
	if qos == 1 {
		if len(rest) < 2 {
			return fmt.Errorf("%w: QoS1 PUBLISH without a packet id", errMalformed)
		}
		id, rest = uint16(rest[0])<<8|uint16(rest[1]), rest[2:]
	}
	if size < 0 {
		size = len(rest)
	}
	c.publish(c, topic, qos, h&1 == 1, h&8 != 0, id, rest, size)
	return nil
}

// drop closes the connection for why, which its reads then return.
func (c *bufferedConn) drop(why error) {
	c.dropped.Store(&why)
	c.Close()
}

func (c *bufferedConn) readErr(err error) error {
	if d := c.dropped.Load(); d != nil && err != nil {
		return fmt.Errorf("connection dropped: %w", *d)
	}
	return err
}

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

// puback queues the PUBACK for packet id, for a PUBLISH paho never saw.
// Every packet paho writes is one Write call, so the PUBACK never lands
// inside one of paho's packets. On a connection that is closed or failed it
// is dropped: the broker redelivers the message on the next connection,
// where it is stored again and acknowledged there.
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

// connOptions are what a bufferedConn is opened with: its publish,
// maxPayload and connack, and opened, told of each new connection.
type connOptions struct {
	publish    publishFunc
	maxPayload int
	connack    func(sessionPresent bool)
	oversized  func(id uint16, size int)
	opened     func(*bufferedConn)
}

// dialTLS is tls.DialWithDialer over a connection whose reads are batched
// (batchedReads): the dialer's timeout bounds the dial and the handshake
// together, and an empty ServerName is addr's host.
func dialTLS(d *net.Dialer, addr string, config *tls.Config) (net.Conn, error) {
	ctx := context.Background()
	if d.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout)
		defer cancel()
	}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if config == nil {
		config = new(tls.Config)
	}
	if config.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			raw.Close()
			return nil, err
		}
		config = config.Clone()
		config.ServerName = host
	}
	c := tls.Client(batchedReads(raw), config)
	if err := c.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, err
	}
	return c, nil
}

// bufferedDial opens broker connections for paho — TCP, TLS and WebSocket
// (dialled as paho would: its NewWebsocket, without the URL's user) —
// through a bufferedConn that hands PUBLISH packets to publish. Other
// schemes are left to paho (ok is false).
func bufferedDial(scheme string, co connOptions) (paho.OpenConnectionFunc, bool) {
	switch scheme {
	case "tcp", "mqtt", "ssl", "tls", "mqtts", "tcps", "ws", "wss":
	default:
		return nil, false
	}
	return func(uri *url.URL, o paho.ClientOptions) (net.Conn, error) {
		d := &net.Dialer{Timeout: o.ConnectTimeout}
		var c net.Conn
		var err error
		switch uri.Scheme {
		case "tcp", "mqtt":
			if c, err = d.Dial("tcp", uri.Host); err == nil {
				c = batchedReads(c)
			}
		case "ws", "wss":
			// A WebSocket message is read as it streams in (gorilla's
			// NextReader), so the bounds below hold over it too.
			dialURI := *uri
			dialURI.User = nil
			var tlsc *tls.Config
			if uri.Scheme == "wss" {
				tlsc = o.TLSConfig
			}
			c, err = paho.NewWebsocket(dialURI.String(), tlsc, o.ConnectTimeout, o.HTTPHeaders, o.WebsocketOptions)
		default:
			c, err = dialTLS(d, uri.Host, o.TLSConfig)
		}
		if err != nil {
			return nil, err
		}
		bc := &bufferedConn{Conn: c, r: bufio.NewReaderSize(c, 32<<10), publish: co.publish, maxPayload: co.maxPayload,
			connack: co.connack, oversized: co.oversized}
		if co.opened != nil {
			co.opened(bc)
		}
		return bc, nil
	}, true
}
