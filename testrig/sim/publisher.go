package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// ErrUnacked is returned by Run when some publishes were never
// acknowledged: whether the agent got them is unknown.
var ErrUnacked = errors.New("sim: publishes left unacknowledged")

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Broker is the MQTT URL (tcp://127.0.0.1:1883).
	Broker string
	// ClientPrefix prefixes the connections' client ids.
	ClientPrefix string
	// MaxInflight bounds unacknowledged publishes per connection (default 256).
	MaxInflight int
	// Unpaced ignores SendAt and publishes as fast as the broker (and Gate)
	// allow; load mode uses it.
	Unpaced bool
	// Gate, when set, is backpressure: publishing pauses while more than
	// GateWindow messages have been published and not yet counted by Gate
	// (a consumer's receive or ack count).
	Gate       func() uint64
	GateWindow uint64
	// Lockstep, when above zero with Unpaced, keeps the connections
	// together: none publishes a message planned more than Lockstep after
	// the next message of the connection furthest behind. Unpaced
	// connections otherwise race, and the devices of a fast one get minutes
	// of event time ahead of a slow one's, which a live fleet, whose
	// devices all stamp about the same now, does not do.
	Lockstep time.Duration
	// AckTimeout bounds the wait for one acknowledgement before the message
	// is sent again as a producer retry (default 30s).
	AckTimeout time.Duration
	// DrainTimeout bounds the wait for outstanding acknowledgements after
	// the context ends (default 15s).
	DrainTimeout time.Duration
	// OnStart, when set, is called with the start of publishing, the
	// reference point of SendAt, once every connection is up.
	OnStart func(time.Time)
	Logger  *slog.Logger
}

// Publisher publishes a plan over Plan.Connections MQTT connections.
type Publisher struct {
	plan *Plan
	cfg  PublisherConfig

	// sentAt[d][i] is when message i of device d was handed to the client
	// (unix ns, the last attempt for a retried publish); acked[d] is how
	// many of device d's messages are acknowledged (always a prefix).
	sentAt [][]int64
	acked  []atomic.Int64

	total                      int
	published, acks, republish atomic.Uint64
	started                    atomic.Int64
	unacked                    atomic.Int64
	paused                     atomic.Bool
	lock                       *lockstep // nil without Lockstep
	// sessions[c] is connection c's session store (see resendStore).
	sessions []*resendStore
}

// Progress is a snapshot of a Publisher.
type Progress struct {
	Total, Published, Acked, Republished uint64
}

// NewPublisher prepares a publisher for plan. It connects nothing.
func NewPublisher(plan *Plan, cfg PublisherConfig) *Publisher {
	if cfg.MaxInflight <= 0 {
		cfg.MaxInflight = 256
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = 30 * time.Second
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 15 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ClientPrefix == "" {
		cfg.ClientPrefix = "edgerig-sim"
	}
	p := &Publisher{plan: plan, cfg: cfg, sentAt: make([][]int64, len(plan.Devices)), acked: make([]atomic.Int64, len(plan.Devices))}
	for i := range plan.Devices {
		p.sentAt[i] = make([]int64, len(plan.Devices[i].Messages))
		p.total += len(plan.Devices[i].Messages)
	}
	return p
}

// Progress reports how far publishing got.
func (p *Publisher) Progress() Progress {
	return Progress{Total: uint64(p.total), Published: p.published.Load(), Acked: p.acks.Load(), Republished: p.republish.Load()}
}

// Started is when publishing started (zero before Run).
func (p *Publisher) Started() time.Time {
	if ns := p.started.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// Sent returns, per device, how many of its messages were acknowledged by
// the broker: a prefix of its plan. Call it after Run returned.
func (p *Publisher) Sent() []int {
	out := make([]int, len(p.acked))
	for i := range p.acked {
		out[i] = int(p.acked[i].Load())
	}
	return out
}

// SentAt returns when each message was published (unix ns). Call it after
// Run returned.
func (p *Publisher) SentAt() [][]int64 { return p.sentAt }

// Pause stops publishing new messages until Resume; publishes in flight
// still complete. Paced messages due meanwhile go out at once on Resume.
func (p *Publisher) Pause() { p.paused.Store(true) }

// Resume undoes Pause.
func (p *Publisher) Resume() { p.paused.Store(false) }

// Unacked is the number of publishes whose acknowledgement never came.
func (p *Publisher) Unacked() int64 { return p.unacked.Load() }

// Run connects, publishes the plan and waits for every acknowledgement.
// When ctx ends it stops publishing, waits up to DrainTimeout for what is
// in flight and returns ctx's error. Messages never acknowledged make it
// return ErrUnacked.
func (p *Publisher) Run(ctx context.Context) error {
	n := p.plan.Connections
	clients := make([]paho.Client, n)
	p.sessions = make([]*resendStore, n)
	defer func() {
		for _, c := range clients {
			if c != nil {
				c.Disconnect(250)
			}
		}
	}()
	for i := range clients {
		c, err := p.connect(ctx, i)
		if err != nil {
			return err
		}
		clients[i] = c
	}
	if p.cfg.Unpaced && p.cfg.Lockstep > 0 {
		p.lock = newLockstep(n, p.cfg.Lockstep)
		defer context.AfterFunc(ctx, p.lock.wake)()
	}
	start := time.Now()
	p.started.Store(start.UnixNano())
	if p.cfg.OnStart != nil {
		p.cfg.OnStart(start)
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.runConn(ctx, clients[i], i, start)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if u := p.unacked.Load(); u > 0 {
		return fmt.Errorf("%w: %d", ErrUnacked, u)
	}
	return ctx.Err()
}

func (p *Publisher) connect(ctx context.Context, i int) (paho.Client, error) {
	// A persistent session and an ordered store: after a broker restart
	// paho resends the unacknowledged publishes in their original order.
	// runConn holds new publishes until those resends are acknowledged
	// (resendStore says when).
	p.sessions[i] = newResendStore()
	opts := paho.NewClientOptions().AddBroker(p.cfg.Broker).
		SetClientID(fmt.Sprintf("%s-%d", p.cfg.ClientPrefix, i)).
		SetCleanSession(false).
		SetStore(p.sessions[i]).
		SetReconnectingHandler(p.sessions[i].reconnecting).
		SetAutoReconnect(true).
		SetConnectRetry(true).
		SetConnectRetryInterval(100 * time.Millisecond).
		SetMaxReconnectInterval(500 * time.Millisecond).
		SetConnectTimeout(5 * time.Second).
		SetKeepAlive(10 * time.Second).
		SetWriteTimeout(30 * time.Second)
	c := paho.NewClient(opts)
	tok := c.Connect()
	select {
	case <-tok.Done():
		if err := tok.Error(); err != nil {
			return nil, fmt.Errorf("sim: connect %s: %w", p.cfg.Broker, err)
		}
	case <-ctx.Done():
		c.Disconnect(0)
		return nil, ctx.Err()
	case <-time.After(30 * time.Second):
		c.Disconnect(0)
		return nil, fmt.Errorf("sim: connect %s: no connection within 30s", p.cfg.Broker)
	}
	return c, nil
}

// lockstep holds unpaced connections within a span of plan time of each
// other (PublisherConfig.Lockstep).
type lockstep struct {
	mu   sync.Mutex
	cond sync.Cond
	// next[c] is the plan time of connection c's next message;
	// math.MaxInt64 once it has no more.
	next []time.Duration
	span time.Duration
}

func newLockstep(conns int, span time.Duration) *lockstep {
	l := &lockstep{next: make([]time.Duration, conns), span: span}
	l.cond.L = &l.mu
	return l
}

// wait records that conn's next message is planned at at, and returns
// once at is within the span of the connection furthest behind, or ctx
// ended.
func (l *lockstep) wait(ctx context.Context, conn int, at time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.set(conn, at)
	for at > l.slowest()+l.span && ctx.Err() == nil {
		l.cond.Wait()
	}
}

// done takes conn out: it publishes no more.
func (l *lockstep) done(conn int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.set(conn, math.MaxInt64)
}

// set moves conn's next plan time, waking the waiters when conn was the
// one furthest behind (the only move that can let another go on).
func (l *lockstep) set(conn int, at time.Duration) {
	was := l.next[conn] <= l.slowest()
	l.next[conn] = at
	if was {
		l.cond.Broadcast()
	}
}

func (l *lockstep) slowest() time.Duration { return slices.Min(l.next) }

// wake wakes every waiter, to see that their context ended.
func (l *lockstep) wake() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cond.Broadcast()
}

// item is one message in a connection's schedule.
type item struct {
	dev, idx int
	at       time.Duration
}

type pending struct {
	item
	tok paho.Token
}

func (p *Publisher) runConn(ctx context.Context, c paho.Client, conn int, start time.Time) error {
	var sched []item
	for d := range p.plan.Devices {
		if p.plan.Devices[d].Conn != conn {
			continue
		}
		for i, m := range p.plan.Devices[d].Messages {
			sched = append(sched, item{d, i, m.SendAt})
		}
	}
	// Stable by time, then device, then index: a device's messages keep
	// their planned order because their SendAt never decreases.
	slices.SortStableFunc(sched, func(a, b item) int {
		switch {
		case a.at != b.at:
			return cmpInt(int64(a.at), int64(b.at))
		case a.dev != b.dev:
			return a.dev - b.dev
		}
		return a.idx - b.idx
	})
	var inflight []pending
	timer := time.NewTimer(0)
	defer timer.Stop()
	if p.lock != nil {
		defer p.lock.done(conn)
	}
	for _, it := range sched {
		if ctx.Err() != nil {
			break
		}
		if p.lock != nil {
			p.lock.wait(ctx, conn, it.at)
		}
		if !p.cfg.Unpaced {
			if wait := time.Until(start.Add(it.at)); wait > 0 {
				timer.Reset(wait)
				select {
				case <-timer.C:
				case <-ctx.Done():
				}
				if ctx.Err() != nil {
					break
				}
			}
		}
		for p.paused.Load() && ctx.Err() == nil {
			inflight = p.reap(ctx, c, inflight)
			time.Sleep(5 * time.Millisecond) // Resume has no channel to wait on
		}
		if p.cfg.Gate != nil {
			for p.published.Load() > p.cfg.Gate()+p.cfg.GateWindow && ctx.Err() == nil {
				time.Sleep(time.Millisecond) // the consumer's count has no event to wait on
			}
		}
		for len(inflight) >= p.cfg.MaxInflight && ctx.Err() == nil {
			if err := p.await(ctx, c, &inflight[0]); err != nil {
				if ctx.Err() != nil {
					break // stopping: what is in flight is drained below
				}
				return err
			}
			inflight = inflight[1:]
		}
		if ctx.Err() != nil {
			break
		}
		if !c.IsConnectionOpen() || !p.sessions[conn].settled() {
			if err := p.resumeInOrder(ctx, c, p.sessions[conn]); err != nil {
				break // stopping: what is in flight is drained below
			}
		}
		inflight = p.reap(ctx, c, append(inflight, p.publish(c, it)))
	}
	// What is in flight is waited for while ctx lives and DrainTimeout
	// after it ends: the plan can run out just before ctx does, and a broker
	// that acknowledges after a commit (the agent's embedded one) still has
	// acknowledgements coming.
	waitCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(p.cfg.DrainTimeout, cancel) })
	defer stop()
	for i := range inflight {
		if err := p.await(waitCtx, c, &inflight[i]); err != nil {
			if waitCtx.Err() != nil {
				p.unacked.Add(int64(len(inflight) - i))
				return nil
			}
			return err
		}
	}
	return nil
}

// resumeInOrder waits, after a connection loss, until the connection is
// open again and paho's resends of what was in flight are acknowledged: a
// new publish made meanwhile could reach the broker before them, and each
// device's messages must reach it in their planned order across broker
// restarts, which the truth assumes (a chaos run saw a device's last
// backlog message overtake the rest of it, and its readings judged late
// against it). It returns ctx's error if ctx ends first.
func (p *Publisher) resumeInOrder(ctx context.Context, c paho.Client, session *resendStore) error {
	// Open first, then settled: the reconnect marks the session unsettled
	// before it opens the connection.
	for !c.IsConnectionOpen() || !session.settled() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond): // paho's reconnect and acks have no channel to wait on
		}
	}
	return nil
}

// reap counts the acknowledgements already in, oldest first, so Progress
// and Sent stay current without waiting for the window to fill.
func (p *Publisher) reap(ctx context.Context, c paho.Client, inflight []pending) []pending {
	for len(inflight) > 0 && isDone(inflight[0].tok) {
		if err := p.await(ctx, c, &inflight[0]); err != nil {
			break
		}
		inflight = inflight[1:]
	}
	return inflight
}

func isDone(t paho.Token) bool {
	select {
	case <-t.Done():
		return true
	default:
		return false
	}
}

func (p *Publisher) publish(c paho.Client, it item) pending {
	m := &p.plan.Devices[it.dev].Messages[it.idx]
	p.sentAt[it.dev][it.idx] = time.Now().UnixNano()
	tok := c.Publish(m.Topic, 1, false, m.Payload)
	p.published.Add(1)
	return pending{it, tok}
}

// await waits for one acknowledgement; a publish that failed or timed out
// is sent again, as a device's retry would.
func (p *Publisher) await(ctx context.Context, c paho.Client, pd *pending) error {
	for {
		select {
		case <-pd.tok.Done():
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(p.cfg.AckTimeout):
		}
		select {
		case <-pd.tok.Done():
			if err := pd.tok.Error(); err == nil {
				p.acks.Add(1)
				p.acked[pd.dev].Add(1)
				return nil
			} else {
				p.cfg.Logger.Warn("sim: publish failed; sending it again", "err", err)
			}
		default:
			p.cfg.Logger.Warn("sim: no acknowledgement; sending it again", "after", p.cfg.AckTimeout)
		}
		p.republish.Add(1)
		*pd = p.publish(c, pd.item)
		p.published.Add(^uint64(0)) // a retry is not a new message
	}
}
