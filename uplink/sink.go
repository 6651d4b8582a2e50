package uplink

import (
	"context"
	"errors"
)

// sink is one cloud connection: NATS JetStream or MQTT. A sink is used for
// one connection only; the uplink makes a new one to reconnect, and resends
// whatever was not acknowledged from its sealed store.
type sink interface {
	// connect dials and handshakes, bounded by ctx and the sink's own
	// connect timeout.
	connect(ctx context.Context) error
	// publish sends one batch and returns its pending acknowledgement.
	publish(ctx context.Context, m *message) (pendingAck, error)
	// lost is closed when the connection is gone.
	lost() <-chan struct{}
	// close ends the connection; pending acknowledgements never complete.
	close() error
}

// message is one sealed batch on its way out.
type message struct {
	id       string
	encoding string // wire.EncodingZstd or wire.EncodingNone
	body     []byte
}

// pendingAck is the server's answer to one publish, when it comes.
type pendingAck interface {
	done() <-chan struct{}
	// result is valid once done is closed. dup reports that the server
	// already held a message with this id (JetStream only).
	result() (dup bool, err error)
}

// Sentinel errors the sender reports in Stats.LastError and the log.
var (
	// ErrAckTimeout means no acknowledgement came within AckTimeout.
	ErrAckTimeout = errors.New("uplink: acknowledgement timed out")
	// ErrLinkLost means the connection dropped.
	ErrLinkLost = errors.New("uplink: connection lost")
	// ErrClosed is returned by Run after Close.
	ErrClosed = errors.New("uplink: closed")
	// ErrRunning is returned by a second, concurrent Run.
	ErrRunning = errors.New("uplink: already running")
)
