package window

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/internal/topic"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// Sentinel errors.
var (
	// ErrInvalidConfig wraps every Config validation failure; the message
	// names the configuration key.
	ErrInvalidConfig = errors.New("window: invalid config")
	// ErrIncompatibleState is returned by New when the saved state was built
	// with a configuration that changes how state is shaped (see
	// Fingerprint). The message names the change and the recovery command.
	ErrIncompatibleState = errors.New("window: saved state is incompatible with the configuration")
	// ErrBlocked is returned by RunOnce when the outbox is over its byte
	// bound, so the stage cannot advance until the uplink drains it.
	ErrBlocked = errors.New("window: blocked by a full outbox")
	// ErrCorruptState is returned when a stored state row cannot be decoded.
	ErrCorruptState = errors.New("window: corrupt state")
)

// Source is where the stage reads Bronze from; *buffer.Bronze satisfies it.
type Source interface {
	// ReadInto returns up to max records from from on, in dst's array.
	ReadInto(dst []buffer.Record, from uint64, max int) ([]buffer.Record, error)
	SetCheckpoint(seq uint64)
}

// Observer sees each emitted aggregate inside the batch transaction (the
// alert engine and the local republisher implement it). An error aborts the
// batch, which is retried by the next Step.
type Observer interface {
	Emitted(tx *bolt.Tx, a *wire.Aggregate, emittedAtMs int64) error
}

// Subscription is one configured MQTT subscription: its topic template and
// the payload format of the messages it receives.
type Subscription struct {
	Template *topic.Template
	// Format is "json", "cbor" or "number".
	Format string
}

// Payload formats.
const (
	FormatJSON   = "json"
	FormatCBOR   = "cbor"
	FormatNumber = "number"
)

// Time formats for readings.time_format.
const (
	TimeAuto    = "auto"
	TimeUnixS   = "unix_s"
	TimeUnixMs  = "unix_ms"
	TimeUnixNs  = "unix_ns"
	TimeRFC3339 = "rfc3339"
)

// AllAggregates lists the aggregate names window.aggregates accepts, in wire order.
var AllAggregates = []string{"count", "sum", "min", "max", "mean", "first", "last"}

// Defaults applied by New to zero-valued Config fields.
const (
	DefaultTimeFormat         = TimeAuto
	DefaultMaxFutureSkew      = 10 * time.Minute
	DefaultMaxPastSkew        = 7 * 24 * time.Hour
	DefaultSize               = time.Minute
	DefaultMaxDevices         = 10_000
	DefaultMaxMetrics         = 1_000
	DefaultDeviceExpiry       = 24 * time.Hour
	DefaultTriggerInterval    = time.Second
	DefaultMaxRecordsPerBatch = 10_000
	DefaultCheckpointInterval = 10 * time.Second
	DefaultOutboxMaxBytes     = 256 << 20
	DefaultMaxLateRows        = 100_000
	DefaultMaxDeadLetterRows  = 100_000
	// maxMetricsPerReading bounds how many metrics one payload may carry, so
	// a publisher sending objects with random keys cannot create unbounded
	// windows from a single message.
	maxMetricsPerReading = 64
	// DeadLetterPayloadBytes is how much of a dead-lettered payload its
	// row keeps.
	DeadLetterPayloadBytes = 256
)

// Config configures the window stage. Zero values take the documented
// defaults; WatermarkDelay and AllowedLateness may legitimately be zero.
type Config struct {
	// Gateway is gateway_id, the first part of every idempotency key.
	Gateway string
	// Subscriptions map topics to devices and payload formats. The first
	// template that matches a topic wins. Each must name {device}.
	Subscriptions []Subscription

	// EventID is readings.event_id, a dot path; empty uses a content hash.
	EventID string
	// EventTime is readings.event_time, a dot path; empty windows every
	// reading by its Bronze received-at (flagged as processing time).
	EventTime string
	// TimeFormat is readings.time_format: unix_s, unix_ms, unix_ns, rfc3339
	// or auto (default).
	TimeFormat string
	// Metrics is readings.metrics (dot paths); empty takes every numeric field.
	Metrics []string
	// MaxFutureSkew and MaxPastSkew bound event time against received-at
	// (defaults 10m and 168h); readings outside are dead-lettered.
	MaxFutureSkew, MaxPastSkew time.Duration

	// Size is window.size (default 1m); Slide is window.slide (default Size;
	// smaller than Size makes hopping windows). Both whole milliseconds.
	Size, Slide time.Duration
	// WatermarkDelay is window.watermark_delay (default 0).
	WatermarkDelay time.Duration
	// AllowedLateness is window.allowed_lateness (default 0).
	AllowedLateness time.Duration
	// IdleTimeout is window.idle_timeout (default Size + WatermarkDelay).
	IdleTimeout time.Duration
	// Aggregates is window.aggregates; empty means all seven.
	Aggregates []string
	// MaxDevices is window.max_devices (default 10,000).
	MaxDevices int
	// MaxMetricsPerDevice is window.max_metrics_per_device (default
	// 1,000): a reading that would give its device more series is
	// dead-lettered (too_many_metrics).
	MaxMetricsPerDevice int
	// DeviceExpiry is window.device_expiry (default 24h; at least IdleTimeout).
	DeviceExpiry time.Duration

	// TriggerInterval is processing.trigger_interval (default 1s).
	TriggerInterval time.Duration
	// MaxRecordsPerBatch is processing.max_records_per_batch (default 10,000).
	MaxRecordsPerBatch int
	// CheckpointInterval is processing.checkpoint_interval (default 10s):
	// how often the window state delta is written. Outputs are written every
	// batch; a restart replays Bronze from the last checkpoint to rebuild
	// the state, writing no output twice.
	CheckpointInterval time.Duration
	// HeapPaced is processing.heap_pacing: the process keeps the heap's
	// goal off passing peaks (internal/heapgoal), so a large checkpoint
	// is not collected around (see collectAround).
	HeapPaced bool
	// OutboxMaxBytes is storage.outbox_max_bytes (default 256 MiB): at or
	// above it the stage stops consuming Bronze until the uplink drains.
	OutboxMaxBytes int64
	// OutboxBytes measures the outbox against OutboxMaxBytes. The default
	// counts the outbox rows; the agent passes uplink.BacklogBytes, which
	// also counts batches sealed from them but not yet acknowledged.
	OutboxBytes func(tx *bolt.Tx) (uint64, error)
	// MaxLateRows and MaxDeadLetterRows bound the late and dead-letter
	// tables (default 100,000 each); the oldest rows are evicted and counted.
	MaxLateRows, MaxDeadLetterRows int

	// Observer sees every emitted aggregate inside the batch transaction; may be nil.
	Observer Observer
	// Committed, when set, is called after a batch that emitted aggregates
	// has committed, outside the transaction: the uplink's Notify, so the
	// outbox is read at once instead of at its next poll. It must not block.
	Committed func()
	// SendGate, when set, is held for writing from a commit that raises
	// the highest revision until Bronze has recorded it (the source's
	// SetRevisionFloor); the uplink and the local publisher hold it for
	// reading while they read the outbox. So no row above Bronze's floor
	// is ever sent, and a crash between the two writes changes nothing:
	// the restart records the state's highest revision before anything
	// is sent (see raiseToRevisionFloor).
	SendGate *sync.RWMutex
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Clock defaults to time.Now. It feeds only the wall-clock lag metric
	// and batch durations, never window logic.
	Clock func() time.Time
	// ConfigPath, when set, is named in the recovery command of
	// ErrIncompatibleState messages.
	ConfigPath string
}

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.TimeFormat == "" {
		c.TimeFormat = DefaultTimeFormat
	}
	if c.MaxFutureSkew == 0 {
		c.MaxFutureSkew = DefaultMaxFutureSkew
	}
	if c.MaxPastSkew == 0 {
		c.MaxPastSkew = DefaultMaxPastSkew
	}
	if c.Size == 0 {
		c.Size = DefaultSize
	}
	if c.Slide == 0 {
		c.Slide = c.Size
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = c.Size + c.WatermarkDelay
	}
	if len(c.Aggregates) == 0 {
		c.Aggregates = AllAggregates
	}
	if c.MaxDevices == 0 {
		c.MaxDevices = DefaultMaxDevices
	}
	if c.MaxMetricsPerDevice == 0 {
		c.MaxMetricsPerDevice = DefaultMaxMetrics
	}
	if c.DeviceExpiry == 0 {
		c.DeviceExpiry = max(DefaultDeviceExpiry, c.IdleTimeout)
	}
	if c.TriggerInterval == 0 {
		c.TriggerInterval = DefaultTriggerInterval
	}
	if c.MaxRecordsPerBatch == 0 {
		c.MaxRecordsPerBatch = DefaultMaxRecordsPerBatch
	}
	if c.CheckpointInterval == 0 {
		c.CheckpointInterval = DefaultCheckpointInterval
	}
	if c.OutboxBytes == nil {
		c.OutboxBytes = func(tx *bolt.Tx) (uint64, error) {
			st, err := outbox.ReadStats(tx)
			return st.Bytes, err
		}
	}
	if c.OutboxMaxBytes == 0 {
		c.OutboxMaxBytes = DefaultOutboxMaxBytes
	}
	if c.MaxLateRows == 0 {
		c.MaxLateRows = DefaultMaxLateRows
	}
	if c.MaxDeadLetterRows == 0 {
		c.MaxDeadLetterRows = DefaultMaxDeadLetterRows
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	return c
}

// Validate reports the first invalid field of c (after defaults), naming its
// configuration key.
// invalidConfig is Validate's error. Not inlined: inlined into each of
// Validate's thirty checks it took 4 KB of the arm64 binary, which has
// little room under its budget.
//
//go:noinline
func invalidConfig(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...)
}

func (c Config) Validate() error {
	c = c.withDefaults()
	bad := invalidConfig
	if c.Gateway == "" {
		return bad("gateway_id is empty")
	}
	if strings.Contains(c.Gateway, "/") {
		return bad("gateway_id %q contains '/', which the idempotency key uses as separator", c.Gateway)
	}
	if len(c.Subscriptions) == 0 {
		return bad("subscriptions: none configured")
	}
	for i, s := range c.Subscriptions {
		if s.Template == nil {
			return bad("subscriptions[%d]: no topic template", i)
		}
		if !s.Template.HasDevice() {
			return bad("subscriptions[%d]: topic %q has no {device} level", i, s.Template)
		}
		switch s.Format {
		case FormatJSON, FormatCBOR, FormatNumber:
		default:
			return bad("subscriptions[%d]: format %q: want json, cbor or number", i, s.Format)
		}
	}
	for _, p := range append([]string{c.EventID, c.EventTime}, c.Metrics...) {
		if p != "" && (strings.HasPrefix(p, ".") || strings.HasSuffix(p, ".") || strings.Contains(p, "..")) {
			return bad("readings: path %q has an empty segment", p)
		}
	}
	for i, m := range c.Metrics {
		if m == "" {
			return bad("readings.metrics[%d] is empty", i)
		}
		if m == c.EventID || m == c.EventTime {
			return bad("readings.metrics[%d] %q is also the event id or event time field", i, m)
		}
	}
	if len(c.Metrics) > maxMetricsPerReading {
		return bad("readings.metrics lists %d paths, at most %d", len(c.Metrics), maxMetricsPerReading)
	}
	switch c.TimeFormat {
	case TimeAuto, TimeUnixS, TimeUnixMs, TimeUnixNs, TimeRFC3339:
	default:
		return bad("readings.time_format %q: want unix_s, unix_ms, unix_ns, rfc3339 or auto", c.TimeFormat)
	}
	if c.MaxFutureSkew < 0 || c.MaxPastSkew < 0 {
		return bad("readings.max_future_skew and max_past_skew must not be negative")
	}
	if c.Size < time.Millisecond || c.Size%time.Millisecond != 0 {
		return bad("window.size %v must be a positive whole number of milliseconds", c.Size)
	}
	if c.Slide < time.Millisecond || c.Slide%time.Millisecond != 0 || c.Slide > c.Size {
		return bad("window.slide %v must be whole milliseconds, positive and at most window.size (%v)", c.Slide, c.Size)
	}
	if c.Size/c.Slide > 100 {
		return bad("window.slide %v is too small for window.size %v: at most 100 windows per reading", c.Slide, c.Size)
	}
	if c.WatermarkDelay < 0 {
		return bad("window.watermark_delay %v is negative", c.WatermarkDelay)
	}
	if c.AllowedLateness < 0 {
		return bad("window.allowed_lateness %v is negative", c.AllowedLateness)
	}
	if c.IdleTimeout <= 0 {
		return bad("window.idle_timeout %v must be positive", c.IdleTimeout)
	}
	seen := map[string]bool{}
	for _, a := range c.Aggregates {
		if !slices.Contains(AllAggregates, a) {
			return bad("window.aggregates: unknown aggregate %q (want %s)", a, strings.Join(AllAggregates, ", "))
		}
		if seen[a] {
			return bad("window.aggregates: %q listed twice", a)
		}
		seen[a] = true
	}
	if c.MaxDevices < 0 || c.MaxMetricsPerDevice < 0 {
		return bad("window.max_devices %d or window.max_metrics_per_device %d is negative", c.MaxDevices, c.MaxMetricsPerDevice)
	}
	if c.DeviceExpiry < c.IdleTimeout {
		return bad("window.device_expiry %v is shorter than window.idle_timeout %v", c.DeviceExpiry, c.IdleTimeout)
	}
	if c.TriggerInterval < time.Millisecond {
		return bad("processing.trigger_interval %v is below 1ms", c.TriggerInterval)
	}
	if c.CheckpointInterval < 0 {
		return bad("processing.checkpoint_interval %v is negative", c.CheckpointInterval)
	}
	if c.MaxRecordsPerBatch < 0 {
		return bad("processing.max_records_per_batch %d is negative", c.MaxRecordsPerBatch)
	}
	if c.OutboxMaxBytes < 0 {
		return bad("storage.outbox_max_bytes %d is negative", c.OutboxMaxBytes)
	}
	if c.MaxLateRows < 0 || c.MaxDeadLetterRows < 0 {
		return bad("late and dead-letter row caps must not be negative")
	}
	return nil
}

// stateFormat is bumped when the stored state layout changes so that an
// older build must not run on it. 2: the state may hold what builds of
// format 1 would ignore and then break "a key names one content" with —
// the tombstone floor (a device whose tombstone was dropped would restart
// an emitted window at rev 1) and the logged clock's last stamp. 3: the
// outbox holds its entries in packs (buffer/outbox), which builds of
// format 2 would take for rows of an unknown kind and never send. A build
// adopts a format in adoptedFormats (rewriting it at its first start); an
// older build refuses a newer one, naming reset-state.
const stateFormat = "3"

var adoptedFormats = []string{"1", "2"}

// fingerprintItem is one state-shaping setting, named by its config key.
type fingerprintItem struct{ Key, Value string }

// fingerprint lists the settings the saved state depends on, in a fixed
// order. Changing any of them makes New refuse the state:
//
//   - gateway_id: emitted keys of open windows would move to another gateway;
//   - window.size and window.slide: window bounds change;
//   - readings.event_id: dedup entries are hashes of the old ids;
//   - readings.event_time and readings.time_format: windows were assigned by
//     the old interpretation of time;
//   - window.aggregates: the aggregates are the shape of what the receiver
//     stores; a revision of a window emitted under other ones would replace
//     its figures with a different set. The state keeps every aggregate, so
//     this is a choice for the receiver's sake, not the state's: reset-state
//     and a replay move every window to the new set together.
//
// Metrics, lateness, watermark delay, idle timeout, caps and the trigger
// interval are not in it: the lateness horizon is stored per device, so
// those changes apply from the next record without corrupting emitted
// windows.
func (c Config) fingerprint() []fingerprintItem {
	c = c.withDefaults()
	eid := c.EventID
	if eid == "" {
		eid = "(content hash)"
	}
	et := c.EventTime
	if et == "" {
		et = "(received-at)"
	}
	return []fingerprintItem{
		{"state format", stateFormat},
		{"gateway_id", c.Gateway},
		{"window.size", c.Size.String()},
		{"window.slide", c.Slide.String()},
		{"readings.event_id", eid},
		{"readings.event_time", et},
		{"readings.time_format", c.TimeFormat},
		{"window.aggregates", c.aggregateSet()},
	}
}

// aggregateSet is window.aggregates in wire order, so that listing the
// same aggregates in another order is no change.
func (c Config) aggregateSet() string {
	var set []string
	for _, a := range AllAggregates {
		if slices.Contains(c.Aggregates, a) {
			set = append(set, a)
		}
	}
	return strings.Join(set, ",")
}

// laterKeys are fingerprint settings added after states were first saved:
// a stored fingerprint without one was written before it counted, and
// takes the current value (checkFingerprint stores it).
var laterKeys = []string{"window.aggregates"}

// behaviour encodes every setting, besides the fingerprint's, that decides
// what the engine emits and when: they may change at a restart, and the
// stage stores them with each checkpoint to tell whether outputs already
// written were decided under other ones (see engine.deferReplayed).
// Batch size and checkpoint interval are not among them: emission points
// never depend on them (DESIGN invariant 3).
func (c Config) behaviour() []byte {
	c = c.withDefaults()
	items := []fingerprintItem{
		{"readings.metrics", strings.Join(c.Metrics, ",")},
		{"readings.max_future_skew", c.MaxFutureSkew.String()},
		{"readings.max_past_skew", c.MaxPastSkew.String()},
		{"window.watermark_delay", c.WatermarkDelay.String()},
		{"window.allowed_lateness", c.AllowedLateness.String()},
		{"window.idle_timeout", c.IdleTimeout.String()},
		{"window.aggregates", c.aggregateSet()},
		{"window.max_devices", strconv.Itoa(c.MaxDevices)},
		{"window.device_expiry", c.DeviceExpiry.String()},
		{"processing.trigger_interval", c.TriggerInterval.String()},
	}
	if c.MaxMetricsPerDevice != DefaultMaxMetrics {
		// Only when set: states saved before the key existed match.
		items = append(items, fingerprintItem{"window.max_metrics_per_device", strconv.Itoa(c.MaxMetricsPerDevice)})
	}
	for _, s := range c.Subscriptions {
		items = append(items, fingerprintItem{"subscription " + s.Template.String(), s.Format})
	}
	return encodeFingerprint(items)
}

func encodeFingerprint(items []fingerprintItem) []byte {
	var b []byte
	for _, it := range items {
		b = appendString(b, it.Key)
		b = appendString(b, it.Value)
	}
	return b
}

func decodeFingerprint(b []byte) ([]fingerprintItem, error) {
	var out []fingerprintItem
	d := decoder{b: b}
	for len(d.b) > 0 {
		k, v := d.string(), d.string()
		if d.err != nil {
			return nil, fmt.Errorf("%w: fingerprint", ErrCorruptState)
		}
		out = append(out, fingerprintItem{k, v})
	}
	return out, nil
}

// compareFingerprint returns an ErrIncompatibleState error naming every
// changed setting, or nil.
func compareFingerprint(stored, current []fingerprintItem, configPath string) error {
	old := map[string]string{}
	for _, it := range stored {
		old[it.Key] = it.Value
	}
	var changes []string
	for _, it := range current {
		v, ok := old[it.Key]
		if !ok && slices.Contains(laterKeys, it.Key) {
			continue
		}
		if it.Key == "state format" && slices.Contains(adoptedFormats, v) {
			continue
		}
		if !ok || v != it.Value {
			changes = append(changes, fmt.Sprintf("%s changed from %s to %s", it.Key, orNone(v, ok), it.Value))
		}
	}
	if len(changes) == 0 {
		return nil
	}
	if configPath == "" {
		configPath = "<config>"
	}
	return fmt.Errorf("%w: %s; run `edgeagent reset-state -c %s` to drop the window state and rebuild it from Bronze (Bronze and the outbox are kept, revisions continue above the highest one emitted)",
		ErrIncompatibleState, strings.Join(changes, "; "), configPath)
}

func orNone(v string, ok bool) string {
	if !ok {
		return "(unset)"
	}
	return v
}
