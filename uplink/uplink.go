package uplink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/internal/boltkv"
)

const (
	// pollInterval is how often the outbox is looked at without a Notify.
	pollInterval = 200 * time.Millisecond
	// maxInFlight batches are sent before the oldest is acknowledged: on a
	// 300 ms cellular round trip, one at a time would cap a drain at a few
	// batches a second.
	maxInFlight = 8
	// sealPerRound bounds the batches one sealing transaction writes: more
	// a round means fewer commits (each an fsync) during a drain.
	sealPerRound = 32
	// shutdownGrace bounds the wait for in-flight acks at shutdown.
	shutdownGrace = 2 * time.Second
)

// LinkState is the state of the cloud connection.
type LinkState string

// Link states.
const (
	LinkConnecting LinkState = "connecting"
	LinkUp         LinkState = "up"
	LinkDown       LinkState = "down"
)

// Stats are the uplink's figures for the status endpoint.
type Stats struct {
	Link      LinkState
	LinkSince time.Time
	// NotUpSince is when the link was last up (or the uplink started, if
	// it never was), zero while it is up: reconnect attempts move Link
	// between down and connecting, but the outage is the whole span.
	NotUpSince time.Time
	// FailingSince is when sending last went wrong — a publish or an ack
	// failed, or the link dropped — with no batch acknowledged since; zero
	// after an acknowledgement. Unlike NotUpSince it survives a reconnect:
	// a server that refuses a batch (over its size limit, no stream) lets
	// the link come up and fail again, never down for long.
	FailingSince time.Time
	// Reconnects counts connections made after the first.
	Reconnects  uint64
	LastError   string
	LastErrorAt time.Time

	// BatchesSent, AggregatesSent and AlertsSent count acknowledged
	// batches and their contents.
	BatchesSent    uint64
	AggregatesSent uint64
	AlertsSent     uint64
	// BytesSent counts the message bytes (body and headers) of every
	// publish, resends included: what the data plan pays for, less the
	// protocol and TLS framing.
	BytesSent uint64
	// Resends counts publishes of a batch this process had published
	// before (after a lost ack or a dropped link). A batch left in flight
	// by a previous process is not counted: that is not known.
	Resends uint64
	// Duplicates counts acks in which JetStream said it already held the
	// batch: the resend was deduplicated by Nats-Msg-Id.
	Duplicates uint64
	// AckTimeouts counts batches whose ack did not come within AckTimeout
	// (each one ended its connection).
	AckTimeouts    uint64
	LastAckLatency time.Duration

	// SealedBatches and SealedBytes are the sealed, unacknowledged batches
	// (their bytes count towards storage.outbox_max_bytes, see
	// BacklogBytes).
	SealedBatches uint64
	SealedBytes   uint64
	// OldestUnsent is the EmittedAt (Unix ms) of the oldest aggregate or
	// alert not yet acknowledged, sealed or not; 0 when none is known.
	OldestUnsent int64
	// RejectedRows counts outbox rows that did not decode; they are moved
	// to the uplink_rejected bucket.
	RejectedRows uint64
}

// Uplink drains the outbox to the cloud. See the package documentation.
type Uplink struct {
	db  *bolt.DB
	cfg Config
	log *slog.Logger
	enc string

	// Seams for tests: the sink factory and the wait used by the backoff
	// and the rate limit.
	newSink func() sink
	sleep   func(ctx context.Context, d time.Duration) error
	bucket  *tokenBucket

	// sealRows and sealEntries hold the outbox rows a sealing round reads,
	// reused round after round (sealLoop's goroutine only).
	sealRows    boltkv.Arena
	sealEntries []outbox.Entry

	notifyCh chan struct{}
	sealedCh chan struct{} // sealer → sender: a batch was sealed
	roomCh   chan struct{} // sender → sealer: batches were acked, or the link came up

	runMu   sync.Mutex
	running bool
	closed  chan struct{}
	once    sync.Once
	wg      sync.WaitGroup

	mu            sync.Mutex
	stats         Stats
	sealedOldest  int64
	pendingOldest int64
	connects      uint64
	sentIDs       map[string]struct{} // published, unacknowledged batch ids
}

// New validates cfg and returns an Uplink over the state database db. It
// starts nothing and writes nothing; Run does.
func New(db *bolt.DB, cfg Config) (*Uplink, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil database", ErrConfig)
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	u := &Uplink{
		db:       db,
		cfg:      cfg,
		log:      cfg.Logger.With("component", "uplink"),
		enc:      cfg.encoding(),
		sleep:    sleepCtx,
		bucket:   newTokenBucket(cfg.MaxBytesPerSecond, cfg.Clock),
		notifyCh: make(chan struct{}, 1),
		sealedCh: make(chan struct{}, 1),
		roomCh:   make(chan struct{}, 1),
		closed:   make(chan struct{}),
	}
	switch {
	case cfg.NATS != nil:
		// Build the TLS config once, so a bad file is reported now.
		if _, err := natsOptions(cfg); err != nil {
			return nil, err
		}
		u.newSink = func() sink { return newNATSSink(u.cfg, u.log) }
	default:
		if _, err := mqttOptions(cfg); err != nil {
			return nil, err
		}
		u.newSink = func() sink { return newMQTTSink(u.cfg, u.log) }
	}
	u.stats.Link = LinkDown
	u.stats.LinkSince = cfg.Clock()
	u.stats.NotUpSince = u.stats.LinkSince
	if !cfg.NotUpSince.IsZero() {
		u.stats.NotUpSince = cfg.NotUpSince
	}
	u.stats.FailingSince = cfg.FailingSince
	return u, nil
}

// Notify hints that the outbox has new rows. It never blocks; the uplink
// also polls, so a lost hint costs at most the poll interval.
func (u *Uplink) Notify() { signal(u.notifyCh) }

// Stats returns a snapshot of the figures; safe from any goroutine.
func (u *Uplink) Stats() Stats {
	u.mu.Lock()
	defer u.mu.Unlock()
	s := u.stats
	s.OldestUnsent = u.sealedOldest
	if s.OldestUnsent == 0 || (u.pendingOldest != 0 && u.pendingOldest < s.OldestUnsent) {
		s.OldestUnsent = u.pendingOldest
	}
	return s
}

// Close stops Run, waits for it and its goroutines, and is safe to call more
// than once, before Run, or concurrently with it.
func (u *Uplink) Close() error {
	u.runMu.Lock()
	u.once.Do(func() { close(u.closed) })
	u.runMu.Unlock()
	u.wg.Wait()
	return nil
}

// Run connects, seals, sends, waits for acks and deletes, and reconnects
// when the link fails, until ctx is cancelled or Close is called; then it
// waits briefly for in-flight acks and returns nil. Errors of the link, and
// of the database once running, are retried (and reported in Stats and the
// log), not returned: the outbox is durable, so the uplink keeps trying. Run
// returns an error only when it cannot create its buckets at the start, or
// with ErrClosed or ErrRunning.
func (u *Uplink) Run(ctx context.Context) error {
	u.runMu.Lock()
	select {
	case <-u.closed:
		u.runMu.Unlock()
		return ErrClosed
	default:
	}
	if u.running {
		u.runMu.Unlock()
		return ErrRunning
	}
	u.running = true
	u.wg.Add(1)
	u.runMu.Unlock()
	defer u.wg.Done()
	defer func() {
		u.runMu.Lock()
		u.running = false
		u.runMu.Unlock()
	}()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-u.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	defer wg.Wait()

	if err := u.db.Update(func(tx *bolt.Tx) error {
		if err := Init(tx); err != nil {
			return err
		}
		return u.refreshBacklog(tx)
	}); err != nil {
		cancel()
		return fmt.Errorf("uplink: init state: %w", err)
	}

	wg.Add(2)
	go func() {
		defer wg.Done()
		u.sealLoop(ctx)
	}()
	go func() {
		defer wg.Done()
		u.sendLoop(ctx)
	}()
	<-ctx.Done()
	return nil
}

// sealLoop turns outbox rows into sealed batches in two overlapping stages:
// planning (reading, encoding and compressing, in read transactions) and
// applying (one write transaction a round). While round n is written, round
// n+1 is compressed, which is what keeps a drain from raw rows near the
// compression speed.
func (u *Uplink) sealLoop(ctx context.Context) {
	plans := make(chan sealPlan, 1) // plan one round ahead of the writes
	var gen atomic.Uint64           // bumped when a plan fails; later plans are stale
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		u.applyLoop(ctx, plans, &gen)
	}()
	defer wg.Wait()
	defer close(plans)

	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	var from uint64
	seen := gen.Load()
	failures := 0
	for ctx.Err() == nil {
		if g := gen.Load(); g != seen {
			// A round failed: its rows are still in the outbox, so read
			// again from the start.
			seen, from = g, 0
		}
		u.mu.Lock()
		partial := u.stats.Link == LinkUp && u.stats.SealedBatches < maxInFlight
		u.mu.Unlock()
		var p sealPlan
		// The last round's rows are no longer used: its batches are built,
		// its rejected rows copied.
		u.sealRows.Reset()
		if g := u.cfg.OutboxGate; g != nil {
			g.RLock()
		}
		err := u.db.View(func(tx *bolt.Tx) error {
			var err error
			p, err = u.plan(tx, from, sealPerRound, partial)
			return err
		})
		if g := u.cfg.OutboxGate; g != nil {
			g.RUnlock()
		}
		u.releaseMapped() // the read mapped its pages, failed or not
		if err == nil {
			err = p.build(u)
		}
		if err != nil {
			u.setError(fmt.Errorf("seal: %w", err))
			u.log.Error("uplink: sealing failed; retrying", "err", err)
			if u.sleep(ctx, backoff(failures, u.cfg.ReconnectMax, u.cfg.Rand)) != nil {
				return
			}
			failures++
			continue
		}
		failures = 0
		u.mu.Lock()
		u.pendingOldest = p.pendingOldest
		u.mu.Unlock()
		if len(p.consumed) > 0 {
			p.gen = seen
			select {
			case plans <- p:
			case <-ctx.Done():
				return
			}
			from = p.next
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-u.notifyCh:
		case <-u.roomCh:
		case <-tick.C:
		}
	}
}

// applyLoop writes the plans sealLoop makes, in order.
func (u *Uplink) applyLoop(ctx context.Context, plans <-chan sealPlan, gen *atomic.Uint64) {
	failures := 0
	for p := range plans {
		if p.gen != gen.Load() {
			continue // planned on top of a round that failed
		}
		err := u.db.Update(func(tx *bolt.Tx) error {
			if err := apply(tx, &p); err != nil {
				return err
			}
			return u.refreshBacklog(tx)
		})
		u.releaseMapped()
		if err != nil {
			gen.Add(1)
			if !errors.Is(err, errConflict) {
				u.setError(fmt.Errorf("seal: %w", err))
				u.log.Error("uplink: writing sealed batches failed; retrying", "err", err)
				_ = u.sleep(ctx, backoff(failures, u.cfg.ReconnectMax, u.cfg.Rand))
				failures++
			}
			continue
		}
		failures = 0
		for _, r := range p.rejected {
			u.log.Error("uplink: outbox row is not one CBOR map; moved to uplink_rejected", "seq", r.entry.Seq, "kind", r.entry.Kind, "reason", r.reason)
		}
		u.mu.Lock()
		u.stats.RejectedRows += uint64(len(p.rejected))
		u.mu.Unlock()
		if len(p.batches) > 0 {
			signal(u.sealedCh)
		}
	}
}

// releaseMapped takes the state file's pages out of the resident set (see
// boltkv.DropMapped) after a round's read or write: a round reads up to
// sealRoundBytes of rows through the map, and the kernel's fault-around
// maps their cached neighbours too, 2-3 MiB of the state file at load
// mode's peak between the agent's 250 ms drops (1.2-1.8 with these).
func (u *Uplink) releaseMapped() { boltkv.ReleaseMapped(u.db, u.log) }

// refreshBacklog copies the sealed backlog figures into the stats. It runs
// inside the write transaction that changed them, so two writers' updates
// cannot land out of order.
func (u *Uplink) refreshBacklog(tx *bolt.Tx) error {
	bl, err := ReadBacklog(tx)
	if err != nil {
		return err
	}
	u.mu.Lock()
	u.stats.SealedBatches, u.stats.SealedBytes, u.sealedOldest = bl.Batches, bl.Bytes, bl.Oldest
	u.mu.Unlock()
	return nil
}

// sendLoop owns the connection: connect, pump, and reconnect with backoff.
func (u *Uplink) sendLoop(ctx context.Context) {
	attempt := 0
	// refusedAfterConnect: the last connection came up and then failed
	// with nothing acknowledged — a server refusing the oldest batch,
	// which repeats at every reconnect; those reconnects log at debug
	// level (the warning below, throttled, says why it goes on).
	refusedAfterConnect := false
	for ctx.Err() == nil {
		u.setLink(LinkConnecting)
		s := u.newSink()
		err := s.connect(ctx)
		if err == nil {
			u.mu.Lock()
			u.connects++
			if u.connects > 1 {
				u.stats.Reconnects++
			}
			u.mu.Unlock()
			u.setLink(LinkUp)
			if refusedAfterConnect {
				u.log.Debug("uplink: connected")
			} else {
				u.log.Info("uplink: connected")
			}
			signal(u.roomCh) // the sealer may now seal partial batches
			err = u.pump(ctx, s, &attempt)
			refusedAfterConnect = err != nil && !u.Stats().FailingSince.IsZero()
		} else {
			refusedAfterConnect = false
		}
		if cerr := s.close(); cerr != nil {
			u.log.Debug("uplink: close connection", "err", cerr)
		}
		if ctx.Err() != nil {
			break
		}
		u.setError(err)
		u.mu.Lock()
		// Failing is about batches: a link lost with none sealed (a quiet
		// gateway whose server restarted) is down, which NotUpSince shows,
		// not failing (an audit: failing_seconds grew on a healthy link).
		if u.stats.FailingSince.IsZero() && u.stats.SealedBatches > 0 {
			u.stats.FailingSince = u.cfg.Clock()
		}
		u.mu.Unlock()
		u.setLink(LinkDown)
		d := backoff(attempt, u.cfg.ReconnectMax, u.cfg.Rand)
		attempt++
		u.log.Warn("uplink: link down; reconnecting", "err", err, "in", d.Round(time.Millisecond))
		if u.sleep(ctx, d) != nil {
			break
		}
	}
	u.setLink(LinkDown)
}

// flight is a published batch waiting for its ack.
type flight struct {
	s      sealed
	ack    pendingAck
	sentAt time.Time // wall clock, for the ack timeout
	clock  time.Time // Config.Clock, for the reported latency
}

// pump sends sealed batches oldest first, up to maxInFlight at a time, and
// deletes each once acknowledged, in order. It returns the error that ended
// the connection, or nil when ctx is done.
func (u *Uplink) pump(ctx context.Context, s sink, attempt *int) error {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	var inflight []flight
	var next uint64
	for {
		if len(inflight) < maxInFlight {
			var batches []sealed
			if err := u.db.View(func(tx *bolt.Tx) error {
				var err error
				batches, err = readSealed(tx, next, maxInFlight-len(inflight))
				return err
			}); err != nil {
				return fmt.Errorf("read sealed batches: %w", err)
			}
			for _, b := range batches {
				m := &message{id: b.id, encoding: b.encoding, body: b.body}
				n := messageBytes(m)
				if err := u.sleep(ctx, u.bucket.reserve(n)); err != nil {
					u.settle(s, inflight)
					return nil
				}
				ack, err := s.publish(ctx, m)
				if err != nil {
					return fmt.Errorf("publish batch %s: %w", b.id, err)
				}
				u.mu.Lock()
				u.stats.BytesSent += uint64(n)
				if u.isResend(b.id) {
					u.stats.Resends++
				}
				u.mu.Unlock()
				inflight = append(inflight, flight{s: b, ack: ack, sentAt: time.Now(), clock: u.cfg.Clock()})
				next = b.first + 1
			}
		}
		if len(inflight) == 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-s.lost():
				return ErrLinkLost
			case <-u.sealedCh:
			case <-tick.C:
			}
			continue
		}
		head := &inflight[0]
		wait := time.NewTimer(u.cfg.AckTimeout - time.Since(head.sentAt))
		select {
		case <-ctx.Done():
			wait.Stop()
			u.settle(s, inflight)
			return nil
		case <-s.lost():
			wait.Stop()
			return fmt.Errorf("%w with %d batches unacknowledged", ErrLinkLost, len(inflight))
		case <-wait.C:
			if isDone(head.ack) {
				// The publishes above waited on the token bucket past the
				// head's deadline while its ack came in: an ack that is
				// here is no timeout, though the select may pick the timer
				// (on a metered link it did half the time, and batches the
				// server held were sent again).
				break
			}
			u.mu.Lock()
			u.stats.AckTimeouts++
			u.mu.Unlock()
			if ae, ok := s.(interface{ asyncError() error }); ok && ae.asyncError() != nil {
				return fmt.Errorf("%w: batch %s after %v; the server said: %v", ErrAckTimeout, head.s.id, u.cfg.AckTimeout, ae.asyncError())
			}
			return fmt.Errorf("%w: batch %s after %v", ErrAckTimeout, head.s.id, u.cfg.AckTimeout)
		case <-u.sealedCh:
			wait.Stop()
			continue
		case <-tick.C:
			wait.Stop()
			continue
		case <-head.ack.done():
			wait.Stop()
		}
		k, err := u.acked(inflight)
		if k > 0 {
			*attempt = 0
			inflight = inflight[k:]
		}
		if err != nil {
			return err
		}
	}
}

// acked deletes the leading run of acknowledged batches in one transaction
// and returns how many it deleted; a failed ack ends the connection.
func (u *Uplink) acked(inflight []flight) (int, error) {
	k, dups := 0, 0
	var ackErr error
	for ; k < len(inflight) && isDone(inflight[k].ack); k++ {
		dup, err := inflight[k].ack.result()
		if err != nil {
			ackErr = fmt.Errorf("ack batch %s: %w", inflight[k].s.id, err)
			break
		}
		if dup {
			dups++
		}
	}
	if k == 0 {
		return 0, ackErr
	}
	firsts := make([]uint64, k)
	for i, f := range inflight[:k] {
		firsts[i] = f.s.first
	}
	if err := u.db.Update(func(tx *bolt.Tx) error {
		if err := deleteSealed(tx, firsts...); err != nil {
			return err
		}
		return u.refreshBacklog(tx)
	}); err != nil {
		// The batches stay sealed and are sent again after the reconnect:
		// safe, since the receiver deduplicates.
		return 0, fmt.Errorf("delete acknowledged batches: %w", err)
	}
	now := u.cfg.Clock()
	u.mu.Lock()
	for _, f := range inflight[:k] {
		u.stats.BatchesSent++
		u.stats.AggregatesSent += uint64(f.s.aggregates)
		u.stats.AlertsSent += uint64(f.s.alerts)
	}
	u.stats.Duplicates += uint64(dups)
	if !u.stats.FailingSince.IsZero() {
		// The reconnects of a refusal logged at debug level: say it ended.
		u.log.Info("uplink: delivering again", "failing_for", now.Sub(u.stats.FailingSince).Round(time.Second))
	}
	u.stats.FailingSince = time.Time{}
	for _, f := range inflight[:k] {
		delete(u.sentIDs, f.s.id)
	}
	u.stats.LastAckLatency = now.Sub(inflight[k-1].clock)
	u.mu.Unlock()
	signal(u.roomCh)
	return k, ackErr
}

// settle waits up to shutdownGrace for the in-flight acks at shutdown and
// deletes the batches acknowledged in order; the rest are resent next time.
func (u *Uplink) settle(s sink, inflight []flight) {
	if len(inflight) == 0 {
		return
	}
	grace := min(shutdownGrace, u.cfg.AckTimeout)
	t := time.NewTimer(grace)
	defer t.Stop()
	for len(inflight) > 0 {
		select {
		case <-inflight[0].ack.done():
		case <-s.lost():
			return
		case <-t.C:
			return
		}
		k, err := u.acked(inflight)
		if err != nil || k == 0 {
			return
		}
		inflight = inflight[k:]
	}
}

// isResend records that id was published and reports whether it had been
// before by this process and not yet acknowledged. Call with u.mu held.
func (u *Uplink) isResend(id string) bool {
	if u.sentIDs == nil {
		u.sentIDs = make(map[string]struct{})
	}
	_, seen := u.sentIDs[id]
	u.sentIDs[id] = struct{}{}
	return seen
}

func (u *Uplink) setLink(st LinkState) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.stats.Link != st {
		now := u.cfg.Clock()
		switch {
		case st == LinkUp:
			u.stats.NotUpSince = time.Time{}
		case u.stats.Link == LinkUp:
			u.stats.NotUpSince = now
		}
		u.stats.Link, u.stats.LinkSince = st, now
	}
}

func (u *Uplink) setError(err error) {
	if err == nil {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.stats.LastError = err.Error()
	u.stats.LastErrorAt = u.cfg.Clock()
}

// messageBytes is what one publish costs against the rate limit: the body
// and the headers.
func messageBytes(m *message) int {
	return len(m.body) + len(m.id) + len(m.encoding) + 96
}

func isDone(a pendingAck) bool {
	select {
	case <-a.done():
		return true
	default:
		return false
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
