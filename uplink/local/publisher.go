package local

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer/outbox"
)

// Sentinel errors of Publisher.
var (
	// ErrInvalidConfig wraps every Config validation failure.
	ErrInvalidConfig = errors.New("local: invalid config")
	// ErrRunning is returned by a second Run.
	ErrRunning = errors.New("local: publisher already running")
)

// Defaults applied by New to zero-valued Config fields.
const (
	DefaultPollInterval = 100 * time.Millisecond
	DefaultMaxBackoff   = 5 * time.Second
	DefaultBatchRows    = 256
	// backoffBase is the delay after the first failed publish.
	backoffBase = 100 * time.Millisecond
	// scanRows is how many outbox rows of any kind one read looks at, so
	// a large uplink backlog is skipped in bounded steps.
	scanRows = 4096
)

// Config configures a Publisher.
type Config struct {
	// Gateway is gateway_id (for logs).
	Gateway string
	// Sink receives every message. Required.
	Sink Sink
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Clock defaults to time.Now; it stamps Stats only.
	Clock func() time.Time
	// PollInterval is how often the outbox is read when Notify is not
	// called (default 100ms).
	PollInterval time.Duration
	// MaxBackoff caps the delay between retries of a failing publish
	// (default 5s); the first retry waits 100ms.
	MaxBackoff time.Duration
	// BatchRows is how many rows are published before their deletion is
	// committed in one transaction (default 256); it bounds what a crash
	// publishes twice.
	BatchRows int
	// OutboxGate, when set, is held for reading while rows are read from
	// the outbox: the window stage holds it for writing from a commit
	// that raises the highest revision until Bronze has recorded it, so
	// no row above Bronze's revision floor is ever sent (see
	// window.Config.SendGate).
	OutboxGate *sync.RWMutex
}

// Stats is a snapshot of a Publisher's progress.
type Stats struct {
	// Published counts messages the sink accepted; Failures failed publish
	// attempts (each retried); Rejected rows that could not be decoded and
	// were dropped.
	Published, Failures, Rejected uint64
	// Pending is the number of local rows read but not yet published, and
	// Oldest the logged emission time of the first of them (zero when none).
	Pending int
	Oldest  time.Time
	// LastError is the last publish failure ("" after a success), at
	// LastErrorAt; LastPublish is when the last message went out.
	LastError   string
	LastErrorAt time.Time
	LastPublish time.Time
}

// Publisher drains the outbox's local rows into a Sink.
type Publisher struct {
	db  *bolt.DB
	cfg Config
	log *slog.Logger

	wake    chan struct{}
	ctx     context.Context
	cancel  context.CancelFunc
	mu      sync.Mutex // guards running, done
	running bool
	done    chan struct{}

	statsMu sync.Mutex
	stats   Stats
}

// New validates cfg and creates the outbox buckets if they do not exist. It
// starts nothing: call Run.
func New(db *bolt.DB, cfg Config) (*Publisher, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: no database", ErrInvalidConfig)
	}
	if cfg.Sink == nil {
		return nil, fmt.Errorf("%w: no sink", ErrInvalidConfig)
	}
	if cfg.PollInterval < 0 || cfg.MaxBackoff < 0 || cfg.BatchRows < 0 {
		return nil, fmt.Errorf("%w: poll interval, max backoff and batch rows must not be negative", ErrInvalidConfig)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.BatchRows == 0 {
		cfg.BatchRows = DefaultBatchRows
	}
	if err := db.Update(outbox.Init); err != nil {
		return nil, fmt.Errorf("local: init outbox: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Publisher{
		db: db, cfg: cfg, log: cfg.Logger,
		wake: make(chan struct{}, 1),
		ctx:  ctx, cancel: cancel,
	}, nil
}

// Notify wakes the publisher now instead of at the next poll; the alert
// engine calls it after a commit that queued local rows. It never blocks.
func (p *Publisher) Notify() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Run publishes local rows until ctx is cancelled or Close is called, and
// then returns nil. A publish in progress is finished (the sink bounds it);
// rows it did not delete are published again by the next Run.
func (p *Publisher) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.running {
		p.mu.Unlock()
		return ErrRunning
	}
	if p.ctx.Err() != nil {
		p.mu.Unlock()
		return nil // closed before it ran
	}
	p.running = true
	p.done = make(chan struct{})
	p.mu.Unlock()
	defer close(p.done)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(p.ctx, cancel)
	defer stop()

	next := uint64(0) // first outbox sequence not yet known to be published
	failures := 0
	for {
		n, err := p.round(ctx, &next)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			failures++
			d := retryDelay(failures, p.cfg.MaxBackoff)
			if failures == 1 || failures%20 == 0 {
				p.log.Warn("local: publish failed, retrying", "err", err, "attempt", failures, "retry_in", d)
			}
			if !sleep(ctx, d, nil) {
				return nil
			}
		case n > 0:
			failures = 0
			// More may be waiting: read again at once.
		default:
			failures = 0
			if !sleep(ctx, p.cfg.PollInterval, p.wake) {
				return nil
			}
		}
	}
}

// round reads local rows from *next, publishes them in order and deletes
// the published ones. It returns how many rows it consumed (published or
// rejected); on a publish error it also returns the error, and *next points
// at the failed row.
func (p *Publisher) round(ctx context.Context, next *uint64) (int, error) {
	var rows []outbox.Entry
	// The gate is held for the read only, not the publishes: a slow local
	// broker would otherwise hold up the window stage's next raise.
	if g := p.cfg.OutboxGate; g != nil {
		g.RLock()
	}
	err := p.db.View(func(tx *bolt.Tx) error {
		seq := *next
		for len(rows) < p.cfg.BatchRows {
			es, err := outbox.Read(tx, seq, scanRows)
			if err != nil {
				return fmt.Errorf("read outbox from %d: %w", seq, err)
			}
			for _, e := range es {
				seq = e.Seq + 1
				if e.Kind == outbox.KindLocal {
					rows = append(rows, e)
					if len(rows) == p.cfg.BatchRows {
						break
					}
				}
			}
			if len(es) < scanRows {
				break
			}
		}
		if len(rows) < p.cfg.BatchRows {
			// Every row up to seq was seen and none left is local.
			*next = seq
		}
		return nil
	})
	if g := p.cfg.OutboxGate; g != nil {
		g.RUnlock()
	}
	if err != nil {
		return 0, fmt.Errorf("local: %w", err)
	}
	p.setPending(rows)
	if len(rows) == 0 {
		return 0, nil
	}
	var done []uint64
	var rejected uint64
	var perr error
	for i, e := range rows {
		if ctx.Err() != nil {
			break
		}
		m, err := Decode(e.Data)
		if err != nil {
			p.log.Error("local: dropping an undecodable outbox row", "seq", e.Seq, "err", err)
			done = append(done, e.Seq)
			rejected++
			continue
		}
		if err := p.cfg.Sink.Publish(m.Topic, m.Payload, m.Retain, m.QoS); err != nil {
			perr = fmt.Errorf("local: publish %s (outbox row %d): %w", m.Topic, e.Seq, err)
			p.recordFailure(perr)
			p.setPending(rows[i:])
			break
		}
		done = append(done, e.Seq)
		p.recordPublish()
	}
	p.statsMu.Lock()
	p.stats.Rejected += rejected
	p.statsMu.Unlock()
	if len(done) == len(rows) {
		p.setPending(nil)
	}
	if len(done) > 0 {
		if err := p.db.Update(func(tx *bolt.Tx) error { return outbox.Delete(tx, done...) }); err != nil {
			// They were published; they will be again after a restart, or
			// after this error, which Run retries from the same row.
			return 0, fmt.Errorf("local: delete %d published rows: %w", len(done), err)
		}
	}
	if len(done) == len(rows) {
		*next = max(*next, rows[len(rows)-1].Seq+1)
	} else {
		*next = rows[len(done)].Seq
	}
	return len(done), perr
}

func (p *Publisher) setPending(rows []outbox.Entry) {
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	p.stats.Pending = len(rows)
	p.stats.Oldest = time.Time{}
	if len(rows) > 0 {
		p.stats.Oldest = time.UnixMilli(rows[0].EmittedAt).UTC()
	}
}

func (p *Publisher) recordPublish() {
	now := p.cfg.Clock()
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	p.stats.Published++
	p.stats.LastPublish = now
	p.stats.LastError = ""
}

func (p *Publisher) recordFailure(err error) {
	now := p.cfg.Clock()
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	p.stats.Failures++
	p.stats.LastError = err.Error()
	p.stats.LastErrorAt = now
}

// Stats returns a snapshot; it is safe to call from any goroutine.
func (p *Publisher) Stats() Stats {
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	return p.stats
}

// Close stops Run and waits for it to return. It is safe to call more than
// once, and before or without Run. It does not close the Sink, which
// belongs to the caller.
func (p *Publisher) Close() error {
	p.cancel()
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done != nil {
		<-done
	}
	return nil
}

// retryDelay is the wait before retry n (1 for the first): exponential from
// backoffBase, capped. No jitter: there is one publisher per local broker.
func retryDelay(n int, maxDelay time.Duration) time.Duration {
	d := backoffBase
	for i := 1; i < n && d < maxDelay; i++ {
		d *= 2
	}
	return min(d, maxDelay)
}

// sleep waits d, or until wake fires (when not nil); it returns false when
// ctx is done.
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-wake:
	case <-ctx.Done():
		return false
	}
	return true
}
