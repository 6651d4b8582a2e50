// Package mochilisten is a TCP listener for the mochi MQTT broker whose
// Close ends every connection it accepted. The agent's built-in broker
// stops while devices reconnect, and the rig restarts its broker while the
// agent does, which mochi v2.7.9's own listeners do not survive.
package mochilisten

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Listen returns a listener with mochi id that listens on addr
// (host:port) when mochi initialises it.
func Listen(id, addr string) *Listener { return &Listener{id: id, addr: addr} }

// Serve returns a listener with mochi id that accepts from ln, which it
// closes with the broker.
func Serve(id string, ln net.Listener) *Listener {
	return &Listener{id: id, addr: ln.Addr().String(), listener: ln}
}

// Listener is mochi's TCP listener with a Close that ends every
// connection it accepted before returning, without mochi's help (see
// Close). mochi v2.7.9's own listener closes its registered clients
// before it stops accepting, so a client reconnecting during Close (an
// agent, after a broker restart) can be accepted and never closed: Close
// then waits for it forever (or, in the agent, until its close timeout),
// and its WaitGroup.Add races with Close's Wait (both seen under -race in
// CI).
type Listener struct {
	id, addr string

	log *slog.Logger

	mu       sync.Mutex
	listener net.Listener
	conns    map[net.Conn]struct{}
	closed   bool
	serving  sync.WaitGroup // one per accepted connection's establish call
}

func (l *Listener) ID() string       { return l.id }
func (l *Listener) Address() string  { return l.addr }
func (l *Listener) Protocol() string { return "tcp" }

func (l *Listener) Init(log *slog.Logger) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.log = log
	l.conns = make(map[net.Conn]struct{})
	if l.listener != nil {
		return nil // given to Serve
	}
	ln, err := net.Listen("tcp", l.addr)
	if err != nil {
		return err
	}
	l.listener = ln
	return nil
}

// Serve accepts until Close; each connection is mochi's until it ends.
// Running out of file descriptors or memory for a moment does not end it:
// it waits and accepts again, as net/http's server does (mochi's own
// listeners stopped accepting for good at the first error).
func (l *Listener) Serve(establish listeners.EstablishFn) {
	var pause time.Duration
	for {
		conn, err := l.listener.Accept()
		if err != nil {
			if !transient(err) || l.isClosed() {
				return
			}
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			if l.log != nil {
				l.log.Warn("broker: accepting a connection failed; retrying", "listener", l.id, "err", err, "retry_in", pause)
			}
			time.Sleep(pause)
			continue
		}
		pause = 0
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = conn.Close() // accepted as Close began; nobody will serve it
			continue
		}
		l.conns[conn] = struct{}{}
		l.serving.Add(1)
		l.mu.Unlock()
		go func() {
			defer l.serving.Done()
			// The error is the client's (a bad CONNECT, a dropped link),
			// which mochi has already acted on.
			_ = establish(l.id, conn)
			l.mu.Lock()
			delete(l.conns, conn)
			l.mu.Unlock()
		}()
	}
}

// transient says whether an Accept error passes: the process or the
// system is out of descriptors or buffers, or a client gave up before
// its connection was accepted.
func transient(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (l *Listener) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// Close stops accepting, closes every connection it accepted and waits
// until every establish call has returned, so mochi's own wait that
// follows finds nothing to wait for.
//
// It does not call closeClients (mochi's closeListenerClients): in mochi
// v2.7.9 it takes the clients' read lock twice (Clients.GetByListener
// calls Len under its RLock), and a client leaving or arriving between
// the two (its Delete or Add waiting for the write lock) blocks the second
// one for good: a test's broker hung in its Close for nine minutes in CI.
// Ending the connections does what it would have done for each client
// (its read fails, mochi sends its will and drops an expiring session);
// only MQTT 5 clients miss the DISCONNECT with "server shutting down".
func (l *Listener) Close(listeners.CloseFn) {
	l.mu.Lock()
	already := l.closed
	l.closed = true
	l.mu.Unlock()
	if already {
		return
	}
	if l.listener != nil {
		_ = l.listener.Close() // ends Serve's Accept; nothing to recover
	}
	l.mu.Lock()
	for conn := range l.conns {
		_ = conn.Close() // the connection is being torn down either way
	}
	l.mu.Unlock()
	l.serving.Wait()
}

// Guard wraps one of mochi's own listeners (its WebSocket listener, a
// TCP listener over TLS) so that closing it ends its clients without
// mochi's closeListenerClients, which can block for good (see
// Listener.Close): it disconnects them as mochi would, from one copy of
// the client list taken under a single read lock.
func Guard(srv *mochi.Server, l listeners.Listener) listeners.Listener {
	return guarded{Listener: l, srv: srv}
}

type guarded struct {
	listeners.Listener
	srv *mochi.Server
}

func (g guarded) Close(listeners.CloseFn) {
	g.Listener.Close(func(id string) {
		for _, cl := range g.srv.Clients.GetAll() {
			if cl.Net.Listener == id && !cl.Closed() {
				// The client is being dropped either way; a DISCONNECT it
				// cannot be sent changes nothing.
				_ = g.srv.DisconnectClient(cl, packets.ErrServerShuttingDown)
			}
		}
	})
}
