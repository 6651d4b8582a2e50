package ingest

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgeagent/edgeagent/buffer"
)

// Appender is where the committer writes: *buffer.Bronze.
type Appender interface {
	Append(recs []buffer.Record) error
}

// acker acknowledges one message to its broker: a paho.Message itself, so
// the handler hands it over without allocating a method value per message.
type acker interface{ Ack() }

// ackFunc adapts a function to acker.
type ackFunc func()

func (f ackFunc) Ack() { f() }

// pending is one received message waiting for its group commit.
type pending struct {
	rec buffer.Record
	// ack acknowledges the message to its broker; nil for QoS0 and ticks.
	ack acker
	// puback, instead of ack, acknowledges a QoS1 PUBLISH taken out of
	// paho's stream, with packet id pubackID, on the connection it arrived
	// on: an acker would be an allocation per message.
	puback   *bufferedConn
	pubackID uint16
	// stored is set once the record committed (and was acknowledged), so a
	// batch split by a full Bronze is not stored twice at shutdown.
	stored bool
	// chunk is the payloadSlab chunk holding the payload, nil if none.
	chunk *slabChunk
}

// committer group-commits pending messages to Bronze and acknowledges them,
// in arrival order, only after the transaction holding them committed
// (DESIGN invariant 1).
type committer struct {
	app      Appender
	in       chan pending
	interval time.Duration
	// quiet is how long the input must have paused for a group to commit
	// before its interval, once a fifth of the interval has passed (see
	// run): a tenth of the interval unless a test sets it.
	quiet    time.Duration
	maxBatch int
	tick     time.Duration
	clock    func() time.Time
	log      *slog.Logger
	backoff  commitBackoff

	// signalled when a batch committed, for tests and the status view.
	stats *Stats
	// budget bounds the bytes handed over and not yet committed.
	budget *byteBudget
	// slab holds the payloads copied out of connections' read buffers
	// until their commit.
	slab payloadSlab
}

// maxQueuedBytes bounds the message bytes ingest holds between reading
// them and their commit (the records queued for the committer and the
// batch it commits). Past it, handing over blocks, and with it the read
// from the broker, as a full queue does: a backlog of large messages
// drains through a bounded amount of memory (measured: 1000 queued 200 KB
// messages took the agent to 669 MB RSS before; the count bound,
// 2 × max_commit_records, allowed 400 MB of them).
const maxQueuedBytes = 16 << 20

// byteBudget is a counting bound that blocks, for bytes in flight. One
// record always fits, however large, so a message up to
// max_payload_bytes is never stuck; and records are admitted in the order
// they asked (a ticket each), so a large one is not starved by small ones
// from other connections that would fit in the room it waits for.
type byteBudget struct {
	mu    sync.Mutex
	used  int
	max   int
	freed chan struct{} // closed and replaced at each release and admission
	// next is the ticket the next caller takes, serving the one admitted
	// next; waiting counts the callers blocked (no wake-up without one:
	// the common case admits at once and allocates nothing).
	next, serving uint64
	waiting       int
}

func newByteBudget(max int) *byteBudget {
	return &byteBudget{max: max, freed: make(chan struct{})}
}

// acquire takes n bytes, waiting its turn and for releases while they do
// not fit; it returns false when stop closes first. After a false return
// the budget admits no one behind the caller: stop is the ingester's
// shutdown, after which nothing acquires.
func (b *byteBudget) acquire(n int, stop <-chan struct{}) bool {
	b.mu.Lock()
	ticket := b.next
	b.next++
	for {
		if ticket == b.serving && (b.used == 0 || b.used+n <= b.max) {
			b.used += n
			b.serving++
			b.wakeLocked() // the next ticket may fit too
			b.mu.Unlock()
			return true
		}
		wait := b.freed
		b.waiting++
		b.mu.Unlock()
		select {
		case <-wait:
		case <-stop:
			return false // waiting stays counted: nothing acquires after stop
		}
		b.mu.Lock()
		b.waiting--
	}
}

// wakeLocked wakes every waiter, if there is one; b.mu is held.
func (b *byteBudget) wakeLocked() {
	if b.waiting == 0 {
		return
	}
	close(b.freed)
	b.freed = make(chan struct{})
}

func (b *byteBudget) release(n int) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	b.wakeLocked()
	b.mu.Unlock()
}

// commitBackoff bounds the retry delay after a failed commit.
type commitBackoff struct{ min, max time.Duration }

func (b commitBackoff) next(d time.Duration) time.Duration {
	if d == 0 {
		return b.min
	}
	return min(2*d, b.max)
}

// Stats are ingest's counters, safe to read from any goroutine.
type Stats struct {
	Received       atomic.Uint64 // messages handed to the committer
	Committed      atomic.Uint64 // messages durably in Bronze
	Acked          atomic.Uint64
	Commits        atomic.Uint64 // transactions
	CommitFailures atomic.Uint64
	CommitNanos    atomic.Uint64 // total commit latency
	LastCommitNano atomic.Int64  // latency of the last commit
	Ticks          atomic.Uint64
	Full           atomic.Bool // Bronze refused for lack of room
	// FullTotal counts the times Bronze became full: a configured bound
	// (storage.bronze_max_bytes), not a commit failure.
	FullTotal atomic.Uint64
	// CommitFailing is set while commits fail for another reason (disk
	// full, I/O error) and cleared by the next successful commit.
	CommitFailing atomic.Bool
	Connected     atomic.Bool
	Reconnects    atomic.Uint64
	// BrokerDropped counts messages the embedded broker dropped for a
	// connected client whose write queue (mqtt.embedded.max_pending_writes)
	// was full.
	BrokerDropped atomic.Uint64
	// SessionsLost counts connects on which the broker had no session for
	// the agent where it should have kept one: what it had queued for the
	// agent is gone.
	SessionsLost atomic.Uint64
	// SessionLostAt is when the last one was seen (Unix ns, 0 for never).
	SessionLostAt atomic.Int64

	mu sync.Mutex
	// subscribeErr says which subscriptions the broker refused or
	// downgraded on the last connect, "" when it granted them all;
	// subscribeRefused whether it refused any.
	subscribeErr     string
	subscribeRefused bool
	rejected         map[string]uint64
	lastErr          string // commit or connection
	// lastCommitErr is the error of the commits failing now (CommitFailing).
	lastCommitErr string
}

func (s *Stats) reject(reason string) {
	s.mu.Lock()
	if s.rejected == nil {
		s.rejected = map[string]uint64{}
	}
	s.rejected[reason]++
	s.mu.Unlock()
}

func (s *Stats) setErr(err error) {
	s.mu.Lock()
	if err == nil {
		s.lastErr = ""
	} else {
		s.lastErr = err.Error()
	}
	s.mu.Unlock()
}

// Rejected returns the count of refused messages by reason code. Every
// code is there, at zero until counted, so that a series exists (and a
// Prometheus rate() works) before the first rejection.
func (s *Stats) Rejected() map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]uint64{ReasonOversized: 0, ReasonBadTopic: 0, ReasonNoTemplate: 0}
	for k, v := range s.rejected {
		out[k] = v
	}
	return out
}

// LastError is the last commit or connection error, "" after a success.
func (s *Stats) LastError() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}

// SubscribeError says which subscriptions the broker refused or granted
// at a lower QoS on the last connect ("" when it granted them all), and
// whether it refused any.
func (s *Stats) SubscribeError() (msg string, refused bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.subscribeErr, s.subscribeRefused
}

func (s *Stats) setSubscribeErr(msg string, refused bool) {
	s.mu.Lock()
	s.subscribeErr, s.subscribeRefused = msg, refused
	s.mu.Unlock()
}

// LastCommitError is why Bronze commits are failing, "" while they are not.
func (s *Stats) LastCommitError() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastCommitErr
}

func (s *Stats) setCommitErr(err error) {
	s.mu.Lock()
	s.lastCommitErr = ""
	if err != nil {
		s.lastCommitErr = err.Error()
	}
	s.mu.Unlock()
	s.setErr(err)
}

// run commits until ctx is cancelled and in is drained of what was handed
// over before that; messages whose commit never succeeded stay unacknowledged,
// so the broker redelivers them.
func (c *committer) run(ctx context.Context) {
	batch := make([]pending, 0, c.maxBatch)
	recs := make([]buffer.Record, 0, c.maxBatch)
	idle := time.NewTimer(c.tick)
	defer idle.Stop()
	var linger *time.Timer
	var lingerC <-chan time.Time
	// Under sustained input a group takes the whole commit interval: fewer
	// commits, two fsyncs each, for the same messages. When the input pauses
	// (a lull, or a broker whose window of unacknowledged messages is full and
	// sends nothing until the agent acknowledges) waiting longer only delays
	// the acknowledgements, so from a fifth of the interval on a group commits
	// once no message came for a tenth of it. Load mode at 25,000 msgs/s: 54-66
	// Bronze commits a second with the 10 ms fixed linger of before, 34 with
	// this at 50 ms, 26 with a fixed 50 ms (docs/performance.md, session 40),
	// which would hold a 20-message broker window for 50 ms a round.
	var first, last time.Time
	for {
		flush := false
		select {
		case <-ctx.Done():
			c.drain(batch, recs)
			return
		case p := <-c.in:
			batch = append(batch, p)
			if len(batch) == 1 && c.interval > 0 {
				first = time.Now()
				linger = time.NewTimer(c.interval / 5)
				lingerC = linger.C
			}
			// Take what is already queued without waiting: under load the
			// batch fills at once; when quiet the linger bounds the wait.
		more:
			for len(batch) < c.maxBatch {
				select {
				case p := <-c.in:
					batch = append(batch, p)
				default:
					break more
				}
			}
			last = time.Now()
			flush = len(batch) >= c.maxBatch || c.interval == 0
		case now := <-lingerC:
			wait := min(c.quiet-now.Sub(last), c.interval-now.Sub(first))
			if flush = wait <= 0; !flush {
				linger.Reset(wait)
			}
		case <-idle.C:
			if len(batch) == 0 {
				now := c.clock()
				batch = append(batch, pending{rec: buffer.Record{Kind: buffer.KindTick, ReceivedAt: now.UnixNano()}})
				c.stats.Ticks.Add(1)
			}
			flush = true
		}
		if !flush {
			continue
		}
		if linger != nil {
			linger.Stop()
			linger, lingerC = nil, nil
		}
		if !c.commit(ctx, batch, recs) {
			c.drain(batch, recs)
			return
		}
		// Reused, the arrays would keep the last batch's payloads
		// reachable while the agent idles: after a backlog of large
		// messages, tens of MB.
		clear(batch)
		clear(recs[:min(len(batch), cap(recs))])
		batch, recs = batch[:0], recs[:0]
		idle.Reset(c.tick)
	}
}

// commit appends the batch, retrying with backoff until it succeeds (true)
// or ctx ends (false, nothing acknowledged). Then it acknowledges in order.
// A batch larger than the room a full Bronze has left is split, so the
// records that fit go through instead of the whole batch waiting forever.
func (c *committer) commit(ctx context.Context, batch []pending, recs []buffer.Record) bool {
	if !c.commitParts(ctx, batch, recs) {
		return false
	}
	// Only once the whole batch is in: a split batch whose first part fit
	// logged "room again" and then "full" within milliseconds, and counted
	// the one episode twice.
	if c.stats.Full.Swap(false) {
		c.log.Info("bronze has room again; acknowledging resumes")
	}
	return true
}

// commitParts is commit, splitting the batch while Bronze is full.
func (c *committer) commitParts(ctx context.Context, batch []pending, recs []buffer.Record) bool {
	var delay time.Duration
	for {
		recs = recs[:0]
		for i := range batch {
			recs = append(recs, batch[i].rec)
		}
		start := time.Now()
		err := c.app.Append(recs)
		lat := time.Since(start)
		if err == nil {
			c.stats.Commits.Add(1)
			c.stats.CommitNanos.Add(uint64(lat))
			c.stats.LastCommitNano.Store(int64(lat))
			// Messages only: a logged clock tick is not one.
			msgs := 0
			for i := range batch {
				if batch[i].rec.Kind != buffer.KindTick {
					msgs++
				}
			}
			c.stats.Committed.Add(uint64(msgs))
			if c.stats.CommitFailing.Swap(false) {
				c.log.Info("bronze commit recovered", "records", len(batch))
				c.stats.setCommitErr(nil)
			}
			break
		}
		full := errors.Is(err, buffer.ErrFull)
		if full && len(batch) > 1 {
			h := len(batch) / 2
			return c.commitParts(ctx, batch[:h], recs) && c.commitParts(ctx, batch[h:], recs)
		}
		delay = c.backoff.next(delay)
		if full {
			// The configured bound, with its own flag, warning and count:
			// not a failure of the disk.
			if !c.stats.Full.Swap(true) {
				c.stats.FullTotal.Add(1)
				c.log.Warn("bronze is full of unprocessed records; holding acknowledgements so the broker keeps queueing")
			}
		} else {
			c.stats.CommitFailures.Add(1)
			c.stats.setCommitErr(err)
			c.stats.CommitFailing.Store(true)
			// Logged on every retry, but the delay doubles up to its cap, so a
			// long failure logs about once per backoff.max.
			c.log.Error("bronze commit failed; not acknowledging, will retry", "records", len(batch), "retry_in", delay, "err", err)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(delay):
		}
	}
	freed := 0
	for i := range batch {
		batch[i].stored = true
		freed += batch[i].rec.HeldBytes()
		switch p := &batch[i]; {
		case p.puback != nil:
			p.puback.puback(p.pubackID)
			c.stats.Acked.Add(1)
		case p.ack != nil:
			p.ack.Ack()
			c.stats.Acked.Add(1)
		}
	}
	c.budget.release(freed)
	c.slab.release(batch) // Bronze holds its own copy now
	return true
}

// drain commits what is in hand and what was already queued, once, at
// shutdown. Failure leaves it unacknowledged for redelivery.
func (c *committer) drain(in []pending, recs []buffer.Record) {
	var batch []pending
	for _, p := range in {
		if !p.stored {
			batch = append(batch, p)
		}
	}
	for {
		select {
		case p := <-c.in:
			batch = append(batch, p)
			continue
		default:
		}
		break
	}
	if len(batch) == 0 {
		return
	}
	done, cancel := context.WithCancel(context.Background())
	cancel() // one attempt only: commit returns false instead of sleeping
	if !c.commit(done, batch, recs) {
		c.log.Warn("shutdown: last batch not committed or acknowledged; the devices or the broker send it again", "records", len(batch))
	}
}
