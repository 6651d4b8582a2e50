// Package verify is the rig's cloud side: it consumes the agent's uplink
// from a real NATS JetStream stream or an MQTT broker, decodes each batch with the documented
// wire format, upserts the aggregates on (gateway, device, metric, start)
// keeping the highest revision, and compares the result with the truth.
package verify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeagent/edgeagent/uplink/wire"
)

// ErrConfig wraps configuration errors.
var ErrConfig = errors.New("verify: invalid config")

// Config configures a Verifier.
type Config struct {
	// URL is the NATS server, reached directly (not through a fault proxy).
	URL     string
	Stream  string
	Subject string
	Logger  *slog.Logger
	// AfterSeq makes the verifier read only the messages after this
	// stream sequence: a stream that outlives a run (an external NATS, a
	// reused run directory) holds an earlier run's aggregates, under the
	// same idempotency keys, which this run's truth knows nothing of.
	AfterSeq uint64
	// Hold makes Start connect without consuming until Release: a load
	// run keeps the verifier's decoding and upserts (and the collector's
	// scans of what they hold) off the machine while it measures the
	// agent against a ceiling that carries no verifier. The stream keeps
	// what arrives meanwhile, and arrival times are the stream's own.
	Hold bool
}

// WindowID is the receiver's upsert key.
type WindowID struct {
	Gateway, Device, Metric string
	Start                   int64
}

// arrival is one revision of a window as it arrived.
type arrival struct {
	agg wire.Aggregate
	at  time.Time
}

// received is the upserted state of one window.
type received struct {
	best wire.Aggregate
	revs []arrival
}

// Progress is a snapshot of what has arrived.
type Progress struct {
	// Messages and Bytes count stream messages and their body bytes.
	Messages, Bytes uint64
	// Aggregates counts aggregates in those messages; Windows the distinct
	// windows after the upsert, PTimeWindows those of them flagged
	// processing-time (plain numbers), which a report counts apart.
	Aggregates   uint64
	Windows      int
	PTimeWindows int
	// Revised counts windows whose highest revision is above 1.
	Revised int
	// DuplicateAggregates counts aggregates whose idempotency key had
	// arrived before with the same contents (a resend JetStream did not
	// deduplicate), and DuplicateBatches messages whose batch id had.
	DuplicateAggregates, DuplicateBatches uint64
	// KeyConflicts counts aggregates whose idempotency key had arrived
	// before with other contents. A key names one content for ever
	// (DESIGN invariant 6): a receiver that upserts on it would keep
	// whichever copy it saw first, so this is a failure, not a duplicate.
	KeyConflicts uint64
	DecodeErrors uint64
	LastSeq      uint64
	LastArrival  time.Time
}

// Verifier consumes the stream in the background from its first message
// (or from Config.AfterSeq).
type Verifier struct {
	cfg    Config
	nc     *nats.Conn
	js     jetstream.JetStream
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
	// released is closed by Release; a verifier started without Hold
	// starts released.
	released    chan struct{}
	releaseOnce sync.Once
	// mqtt is the subscriber when the uplink is read over MQTT (StartMQTT).
	mqtt *mqttSource

	mu      sync.Mutex
	windows map[WindowID]*received
	// keys holds the first aggregate that arrived with each idempotency
	// key, to tell a resend from a key reused with other contents.
	keys      map[string]wire.Aggregate
	conflicts []string // the first few key conflicts, described
	batches   map[string]bool
	progress  Progress
	lastErr   string
}

// Start connects to NATS and starts consuming. The stream must exist.
func Start(ctx context.Context, cfg Config) (*Verifier, error) {
	if cfg.URL == "" || cfg.Stream == "" {
		return nil, fmt.Errorf("%w: URL and Stream are required", ErrConfig)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	// Reconnect for ever: the rig restarts the server under us.
	nc, err := nats.Connect(cfg.URL, nats.Timeout(5*time.Second), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		return nil, fmt.Errorf("verify: connect %s: %w", cfg.URL, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("verify: jetstream: %w", err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	v := &Verifier{cfg: cfg, nc: nc, js: js, cancel: cancel,
		windows: map[WindowID]*received{}, keys: map[string]wire.Aggregate{}, batches: map[string]bool{},
		released: make(chan struct{})}
	v.progress.LastSeq = cfg.AfterSeq // consumeOnce starts after it
	if !cfg.Hold {
		v.Release()
	}
	v.wg.Add(1)
	go func() {
		defer v.wg.Done()
		select {
		case <-v.released:
			v.consume(ctx)
		case <-ctx.Done():
		}
	}()
	return v, nil
}

// Release starts the consumption of a verifier started with Config.Hold.
// Safe to call more than once, and on any verifier.
func (v *Verifier) Release() {
	if v.released != nil {
		v.releaseOnce.Do(func() { close(v.released) })
	}
}

// Close stops consuming and disconnects. Safe to call twice.
func (v *Verifier) Close() error {
	v.once.Do(func() {
		v.cancel()
		v.wg.Wait()
		if v.nc != nil {
			v.nc.Close()
		}
		if v.mqtt != nil {
			v.mqtt.close()
		}
	})
	return nil
}

// consume reads the stream with an ordered consumer, recreating it from
// the next stream sequence whenever it fails (a server restart).
func (v *Verifier) consume(ctx context.Context) {
	for ctx.Err() == nil {
		if err := v.consumeOnce(ctx); err != nil && ctx.Err() == nil {
			v.setErr(err)
			v.cfg.Logger.Debug("verify: consumer failed; recreating", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond): // retry back-off
			}
		}
	}
}

func (v *Verifier) consumeOnce(ctx context.Context) error {
	v.mu.Lock()
	next := v.progress.LastSeq + 1
	v.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: next}
	if v.cfg.Subject != "" {
		cfg.FilterSubjects = []string{v.cfg.Subject}
	}
	cons, err := v.js.OrderedConsumer(cctx, v.cfg.Stream, cfg)
	cancel()
	if err != nil {
		return fmt.Errorf("create consumer at %d: %w", next, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	for {
		msg, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) && ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("next message: %w", err)
		}
		v.handle(msg)
	}
}

func (v *Verifier) setErr(err error) {
	v.mu.Lock()
	v.lastErr = err.Error()
	v.mu.Unlock()
}

func (v *Verifier) handle(msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		v.setErr(fmt.Errorf("message metadata: %w", err))
		return
	}
	enc := msg.Headers().Get("Content-Encoding")
	// The stream's time is the window's arrival in the cloud, whenever
	// the verifier reads it (see Config.Hold).
	v.record(meta.Sequence.Stream, meta.Timestamp, msg.Data(), func(b []byte) (*wire.Batch, error) { return wire.DecodeBatch(b, enc) })
}

// record upserts one uplink message. seq numbers the messages of the
// transport: the JetStream stream sequence, or the arrival count over MQTT.
// now is its arrival: the time JetStream stored it, or the MQTT
// subscriber's clock when it arrived. decode is the transport's decoder:
// by the Content-Encoding header on NATS, by the body's first bytes on
// MQTT (which has no headers).
func (v *Verifier) record(seq uint64, now time.Time, data []byte, decode func([]byte) (*wire.Batch, error)) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if seq <= v.progress.LastSeq {
		return // redelivered by a consumer reset
	}
	v.progress.LastSeq = seq
	v.progress.LastArrival = now
	v.progress.Messages++
	v.progress.Bytes += uint64(len(data))
	b, err := decode(data)
	if err != nil {
		v.progress.DecodeErrors++
		v.lastErr = fmt.Sprintf("message %d: %v", seq, err)
		return
	}
	if v.batches[b.Batch] {
		v.progress.DuplicateBatches++
	}
	v.batches[b.Batch] = true
	for _, a := range b.Aggregates {
		v.progress.Aggregates++
		if first, seen := v.keys[a.Key]; !seen {
			v.keys[a.Key] = a
		} else if d := diffAggregate(&first, &a); d == "" {
			v.progress.DuplicateAggregates++
		} else {
			v.progress.KeyConflicts++
			if len(v.conflicts) < maxConflictExamples {
				v.conflicts = append(v.conflicts, fmt.Sprintf("key %s arrived again with other contents (message seq %d): %s", a.Key, seq, d))
			}
		}
		id := WindowID{b.Gateway, a.Device, a.Metric, a.Start}
		r := v.windows[id]
		if r == nil {
			r = &received{best: a}
			v.windows[id] = r
			if a.ProcTime {
				v.progress.PTimeWindows++
			}
			if a.Rev > 1 {
				v.progress.Revised++
			}
		} else if a.Rev > r.best.Rev {
			if r.best.Rev <= 1 {
				v.progress.Revised++
			}
			r.best = a
		}
		r.revs = append(r.revs, arrival{agg: a, at: now})
	}
	v.progress.Windows = len(v.windows)
}

// maxConflictExamples bounds the key conflicts kept to describe.
const maxConflictExamples = 10

// diffAggregate describes how b differs from a, field by field, "" when
// they carry the same contents. Floats compare by their bits: a resend is
// the same bytes, so the same value, NaN included.
func diffAggregate(a, b *wire.Aggregate) string {
	var d []string
	str := func(name, x, y string) {
		if x != y {
			d = append(d, fmt.Sprintf("%s %s (earlier copy %s)", name, y, x))
		}
	}
	str("device", a.Device, b.Device)
	str("metric", a.Metric, b.Metric)
	str("start", fmt.Sprint(a.Start), fmt.Sprint(b.Start))
	str("end", fmt.Sprint(a.End), fmt.Sprint(b.End))
	str("rev", fmt.Sprint(a.Rev), fmt.Sprint(b.Rev))
	str("count", fmt.Sprint(a.Count), fmt.Sprint(b.Count))
	str("ptime", fmt.Sprint(a.ProcTime), fmt.Sprint(b.ProcTime))
	for _, f := range []struct {
		name string
		x, y *float64
	}{{"sum", a.Sum, b.Sum}, {"min", a.Min, b.Min}, {"max", a.Max, b.Max},
		{"mean", a.Mean, b.Mean}, {"first", a.First, b.First}, {"last", a.Last, b.Last}} {
		if !sameFloat(f.x, f.y) {
			str(f.name, fmtFloat(f.x), fmtFloat(f.y))
		}
	}
	return strings.Join(d, ", ")
}

func sameFloat(x, y *float64) bool {
	if x == nil || y == nil {
		return x == y
	}
	return math.Float64bits(*x) == math.Float64bits(*y)
}

func fmtFloat(p *float64) string {
	if p == nil {
		return "absent"
	}
	return fmt.Sprint(*p)
}

// Progress reports what has arrived so far.
func (v *Verifier) Progress() Progress {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.progress
}

// LastError is the consumer's last error ("" when none), for diagnosis.
func (v *Verifier) LastError() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.lastErr
}

// StreamLastSeq asks the server for the stream's last sequence.
func (v *Verifier) StreamLastSeq(ctx context.Context) (uint64, error) {
	if v.js == nil {
		return 0, errors.New("verify: no stream: the uplink is read over MQTT")
	}
	st, err := v.js.Stream(ctx, v.cfg.Stream)
	if err != nil {
		return 0, fmt.Errorf("verify: stream %s: %w", v.cfg.Stream, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("verify: stream %s info: %w", v.cfg.Stream, err)
	}
	return info.State.LastSeq, nil
}

// WaitDrained returns once everything the stream (or the MQTT broker) held
// when it was called has been consumed, or ctx ends.
func (v *Verifier) WaitDrained(ctx context.Context) error {
	if v.mqtt != nil {
		if err := v.mqtt.waitDrained(ctx); err != nil {
			return fmt.Errorf("verify: %w", err) // StartMQTT adds its own
		}
		return nil
	}
	var last uint64
	for {
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		seq, err := v.StreamLastSeq(qctx)
		cancel()
		if err == nil {
			last = seq
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("verify: drain: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond): // server restarting
		}
	}
	for v.Progress().LastSeq < last {
		select {
		case <-ctx.Done():
			return fmt.Errorf("verify: drain: consumed %d of %d: %w", v.Progress().LastSeq, last, ctx.Err())
		case <-time.After(20 * time.Millisecond): // the consumer has no event to wait on
		}
	}
	return nil
}
