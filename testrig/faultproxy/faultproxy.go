// Package faultproxy is a TCP proxy on 127.0.0.1 that a test puts between a
// client and a server to inject link faults: a cut, a blackhole, and replies
// lost after the server acted on the request.
package faultproxy

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is what the proxy does with traffic.
type Mode int

// Modes.
const (
	// Forward passes bytes both ways.
	Forward Mode = iota
	// Cutting: every connection is reset and new ones are refused.
	Cutting
	// Blackholing: connections are accepted (and kept) but nothing is
	// forwarded or answered, like a link whose far side vanished.
	Blackholing
	// DroppingReplies: client bytes reach the server, server bytes are
	// swallowed, so the server acts on requests whose answers are lost.
	DroppingReplies
)

func (m Mode) String() string {
	switch m {
	case Forward:
		return "forward"
	case Cutting:
		return "cut"
	case Blackholing:
		return "blackhole"
	case DroppingReplies:
		return "drop-replies"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// dialTimeout bounds the dial to the target.
const dialTimeout = 5 * time.Second

// Proxy forwards connections from Addr to a target, with faults on demand.
type Proxy struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu     sync.Mutex
	mode   Mode
	conns  map[*link]struct{}
	closed bool

	accepted  atomic.Int64
	forwarded [2]atomic.Int64 // bytes client→server, server→client
	dropped   [2]atomic.Int64
}

// link is one proxied connection.
type link struct {
	client net.Conn
	server net.Conn // nil while blackholed from the start
	once   sync.Once
}

func (l *link) close() {
	l.once.Do(func() {
		if tc, ok := l.client.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // reset, as a dropped link looks
		}
		_ = l.client.Close()
		if l.server != nil {
			_ = l.server.Close()
		}
	})
}

// New listens on a free 127.0.0.1 port and forwards to target (host:port).
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{target: target, ln: ln, conns: make(map[*link]struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Mode returns the current mode.
func (p *Proxy) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Cut resets every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = Cutting
	p.closeAllLocked()
}

// Blackhole keeps connections open but forwards and answers nothing, on
// existing and new connections, until Restore.
func (p *Proxy) Blackhole() { p.set(Blackholing) }

// DropServerToClient forwards client bytes but swallows every byte the
// server sends, on existing and new connections, until Restore. For NATS it
// loses the PubAck of a message the stream has stored.
func (p *Proxy) DropServerToClient() { p.set(DroppingReplies) }

// Restore forwards again. Connections that lived through a blackhole or lost
// replies are reset first: their byte streams are no longer whole.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode == Blackholing || p.mode == DroppingReplies {
		p.closeAllLocked()
	}
	p.mode = Forward
}

// Accepted counts the connections accepted so far.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// Forwarded returns the bytes forwarded client→server and server→client.
func (p *Proxy) Forwarded() (toServer, toClient int64) {
	return p.forwarded[0].Load(), p.forwarded[1].Load()
}

// Dropped returns the bytes swallowed client→server and server→client.
func (p *Proxy) Dropped() (toServer, toClient int64) {
	return p.dropped[0].Load(), p.dropped[1].Load()
}

// Close stops listening, resets every connection and waits for the proxy's
// goroutines. It is safe to call twice.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	err := p.ln.Close()
	p.closeAllLocked()
	p.mu.Unlock()
	p.wg.Wait()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("faultproxy: close listener: %w", err)
	}
	return nil
}

func (p *Proxy) set(m Mode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = m
}

func (p *Proxy) closeAllLocked() {
	for l := range p.conns {
		l.close()
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // listener closed
		}
		p.accepted.Add(1)
		p.mu.Lock()
		mode, closed := p.mode, p.closed
		p.mu.Unlock()
		l := &link{client: c}
		if closed || mode == Cutting {
			l.close()
			continue
		}
		if mode != Blackholing {
			// Dial outside the lock; a slow target must not stall Cut.
			s, err := net.DialTimeout("tcp", p.target, dialTimeout)
			if err != nil {
				l.close()
				continue
			}
			l.server = s
		}
		p.mu.Lock()
		if p.closed || p.mode == Cutting {
			p.mu.Unlock()
			l.close()
			continue
		}
		p.conns[l] = struct{}{}
		p.wg.Add(1)
		go p.pump(l, 0)
		if l.server != nil {
			p.wg.Add(1)
			go p.pump(l, 1)
		}
		p.mu.Unlock()
	}
}

// pump copies one direction of a link: 0 is client→server, 1 the reverse.
// Each chunk is forwarded or swallowed by the mode at the moment it arrives.
//
// A server that closes its side while the link is blackholed (a broker
// whose keep-alive deadline passed) goes unseen by the client, as behind
// a real blackhole: the client's side stays open, and its bytes are
// swallowed until the mode changes and the next one finds the server gone.
func (p *Proxy) pump(l *link, dir int) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		silent := dir == 1 && p.mode == Blackholing && !p.closed
		p.mu.Unlock()
		if silent {
			_ = l.server.Close() // the client→server pump ends the link later
			return
		}
		l.close()
		p.mu.Lock()
		delete(p.conns, l)
		p.mu.Unlock()
	}()
	src, dst := l.client, l.server // dst is nil on a link blackholed from the start
	if dir == 1 {
		src, dst = l.server, l.client
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			mode := p.mode
			p.mu.Unlock()
			forward := mode == Forward || (mode == DroppingReplies && dir == 0)
			if forward && dst != nil {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
				p.forwarded[dir].Add(int64(n))
			} else {
				p.dropped[dir].Add(int64(n))
			}
		}
		if err != nil {
			// EOF, a reset or our own close: the link is over either way.
			return
		}
	}
}
