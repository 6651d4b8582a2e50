// Package jsapi makes the few NATS JetStream calls the uplink needs — an
// asynchronous publish that waits for the stream's PubAck, a stream
// lookup and a stream creation — as plain requests over a core nats.go
// connection.
//
// It stands in for nats.go's jetstream package, whose API (consumers,
// key-value and object stores, ordered iterators …) the agent never
// calls but would carry in its binary. The wire behaviour is that
// package's: a JetStream publish is a core publish with a reply subject
// to a stream subject, answered on that subject with a JSON PubAck
// ({"stream":…,"seq":…,"duplicate":true}) or API error
// ({"error":{"code":…,"err_code":…,"description":…}}); with no stream
// on the subject the server answers "503 no responders", and the publish
// is retried twice, a quarter of a second apart (jetstream's defaults),
// before it fails with ErrNoStreamResponse. Stream calls are requests to
// $JS.API.STREAM.INFO.<name> and $JS.API.STREAM.CREATE.<name>. Error
// texts are jetstream's, so logs and status read as they did.
//
// # Caveats
//
//   - No API prefix or domain: the default $JS.API account only.
//   - A publish has no timer of its own. Its Future completes on the
//     answer; the caller bounds the wait and closes the connection when it
//     gives up, as the uplink does.
//   - After Close, pending futures never complete.
package jsapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// MsgIDHeader carries a message's deduplication id.
const MsgIDHeader = nats.MsgIdHdr

const (
	// statusHeader and statusNoResponders mark the server's answer to a
	// request nobody subscribes to: no stream holds the subject.
	statusHeader       = "Status"
	statusNoResponders = "503"

	// As jetstream's DefaultPubRetryAttempts and DefaultPubRetryWait: a
	// stream whose leader is being elected answers "no responders" for a
	// moment.
	noResponderRetries = 2
	noResponderWait    = 250 * time.Millisecond

	// JetStream API error codes (err_code) the agent tells apart.
	errCodeStreamNotFound  = uint16(nats.JSErrCodeStreamNotFound)
	errCodeStreamNameInUse = uint16(nats.JSErrCodeStreamNameInUse)
	// errCodeSubjectsOverlap is the server's JSStreamSubjectOverlapErr
	// (nats.go names no constant for it).
	errCodeSubjectsOverlap = uint16(10065)
)

// Errors, worded as nats.go's jetstream package words them.
var (
	// ErrNoStreamResponse: no stream answered a publish (none holds the
	// subject), after the retries.
	ErrNoStreamResponse = errors.New("nats: no response from stream")
	// ErrInvalidAck: the answer to a publish was not a PubAck.
	ErrInvalidAck = errors.New("nats: invalid jetstream publish response")
	// ErrInvalidResponse: the answer to a stream request was not one.
	ErrInvalidResponse = errors.New("nats: invalid jetstream response")
	// ErrStreamNotFound matches the API error of a stream that does not
	// exist (errors.Is).
	ErrStreamNotFound = &APIError{Code: 404, ErrCode: errCodeStreamNotFound, Description: "stream not found"}
	// ErrStreamNameInUse matches the API error of a create for a name that
	// a stream with another configuration holds (errors.Is).
	ErrStreamNameInUse = &APIError{Code: 400, ErrCode: errCodeStreamNameInUse, Description: "stream name already in use"}
	// ErrSubjectsOverlap matches the API error of a create whose subjects
	// another stream already captures (errors.Is).
	ErrSubjectsOverlap = &APIError{Code: 400, ErrCode: errCodeSubjectsOverlap, Description: "subjects overlap with an existing stream"}
	// ErrClosed is returned by Publish after Close.
	ErrClosed = errors.New("jsapi: publisher closed")
)

// APIError is an error the JetStream API answered with.
type APIError struct {
	Code        int    `json:"code"`
	ErrCode     uint16 `json:"err_code"`
	Description string `json:"description,omitempty"`
}

func (e *APIError) Error() string {
	return fmt.Sprintf("nats: API error: code=%d err_code=%d description=%s", e.Code, e.ErrCode, e.Description)
}

// Is reports whether target is an APIError with the same err_code.
func (e *APIError) Is(target error) bool {
	t, ok := target.(*APIError)
	return ok && e != nil && t != nil && e.ErrCode == t.ErrCode
}

// PubAck is the stream's acknowledgement of a stored message. Duplicate
// reports that the stream already held a message with this Nats-Msg-Id
// inside its duplicate window, and did not store it again.
type PubAck = nats.PubAck

// response is any JetStream API answer: a PubAck, stream info, or an error.
type response struct {
	Error *APIError `json:"error,omitempty"`
	PubAck
	// Config is present in stream info.
	Config json.RawMessage `json:"config,omitempty"`
}

// ParseAck decodes the answer to a publish, as jetstream does: an API
// error, or a PubAck naming its stream.
func ParseAck(data []byte) (PubAck, error) {
	var r response
	if err := json.Unmarshal(data, &r); err != nil {
		return PubAck{}, ErrInvalidAck
	}
	if r.Error != nil {
		return PubAck{}, r.Error
	}
	if r.Stream == "" {
		return PubAck{}, ErrInvalidAck
	}
	return r.PubAck, nil
}

// Future is a publish waiting for its PubAck.
type Future struct {
	msg     *nats.Msg
	token   string
	retries int // no-responder answers so far; guarded by the Publisher

	done chan struct{}
	ack  PubAck
	err  error
}

// Done is closed when the answer has come.
func (f *Future) Done() <-chan struct{} { return f.done }

// Result is the PubAck or the error; valid once Done is closed.
func (f *Future) Result() (PubAck, error) { return f.ack, f.err }

func (f *Future) complete(ack PubAck, err error) {
	f.ack, f.err = ack, err
	close(f.done)
}

// Publisher publishes to streams on one connection and matches each
// answer to its Future through one wildcard reply subscription.
type Publisher struct {
	nc     *nats.Conn
	prefix string // reply subjects are prefix + token
	sub    *nats.Subscription
	wait   time.Duration // between no-responder retries

	// onRetry, when set (tests), is called as a retry is scheduled.
	onRetry func()

	mu      sync.Mutex
	next    uint64
	pending map[string]*Future // by reply token
	closed  bool
}

// NewPublisher subscribes to its replies on nc.
func NewPublisher(nc *nats.Conn) (*Publisher, error) {
	p := &Publisher{nc: nc, prefix: nc.NewInbox() + ".", wait: noResponderWait, pending: make(map[string]*Future)}
	sub, err := nc.Subscribe(p.prefix+"*", p.handle)
	if err != nil {
		return nil, fmt.Errorf("subscribe to publish acknowledgements: %w", err)
	}
	p.sub = sub
	return p, nil
}

// Publish sends m (its Subject, Header and Data; Reply must be empty) and
// returns the Future of its PubAck. An error means m was not sent.
func (p *Publisher) Publish(m *nats.Msg) (*Future, error) {
	if m.Reply != "" {
		return nil, errors.New("jsapi: reply subject should be empty")
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	p.next++
	f := &Future{msg: m, token: strconv.FormatUint(p.next, 36), done: make(chan struct{})}
	p.pending[f.token] = f
	p.mu.Unlock()
	if err := p.send(f); err != nil {
		p.take(f.token)
		return nil, err
	}
	return f, nil
}

func (p *Publisher) send(f *Future) error {
	return p.nc.PublishMsg(&nats.Msg{Subject: f.msg.Subject, Reply: p.prefix + f.token, Header: f.msg.Header, Data: f.msg.Data})
}

// take removes and returns the pending future of token, if any.
func (p *Publisher) take(token string) *Future {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.pending[token]
	delete(p.pending, token)
	return f
}

// handle receives an answer on the reply subscription.
func (p *Publisher) handle(m *nats.Msg) {
	token, ok := strings.CutPrefix(m.Subject, p.prefix)
	if !ok {
		return
	}
	if len(m.Data) == 0 && m.Header.Get(statusHeader) == statusNoResponders {
		p.mu.Lock()
		f := p.pending[token]
		if f == nil {
			p.mu.Unlock()
			return
		}
		if f.retries < noResponderRetries {
			f.retries++
			hook := p.onRetry
			p.mu.Unlock()
			if hook != nil {
				hook()
			}
			time.AfterFunc(p.wait, func() { p.retry(token) })
			return
		}
		delete(p.pending, token)
		p.mu.Unlock()
		f.complete(PubAck{}, ErrNoStreamResponse)
		return
	}
	f := p.take(token)
	if f == nil {
		return // an answer after Close, or a second one
	}
	f.complete(ParseAck(m.Data))
}

// retry sends a publish again after a no-responders answer.
func (p *Publisher) retry(token string) {
	p.mu.Lock()
	f := p.pending[token]
	p.mu.Unlock()
	if f == nil {
		return
	}
	if err := p.send(f); err != nil {
		if f := p.take(token); f != nil {
			f.complete(PubAck{}, err)
		}
	}
}

// Close stops matching answers; pending futures never complete. It does
// not close the connection. Close is safe to call twice.
func (p *Publisher) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.pending = make(map[string]*Future)
	p.mu.Unlock()
	_ = p.sub.Unsubscribe() // fails only when the connection is gone
}
