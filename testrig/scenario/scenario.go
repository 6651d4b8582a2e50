// Package scenario reads and validates the rig's scenario files: which
// devices to simulate, how they misbehave, which faults to inject when, and
// the agent settings the run needs.
package scenario

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml"

	"github.com/edgeagent/edgeagent/config"
	"github.com/edgeagent/edgeagent/testrig/scenarios"
)

// ErrInvalid is wrapped by every *Errors: the scenario was refused. Each
// problem names the key and, in a file, its line.
var ErrInvalid = errors.New("scenario: invalid")

// ErrNotFound is returned by Lookup for a name that is neither a stock
// scenario nor a readable file.
var ErrNotFound = errors.New("scenario: not found")

// Payload formats a device group may use.
const (
	FormatJSON   = "json"
	FormatCBOR   = "cbor"
	FormatNumber = "number"
)

// Fault kinds.
const (
	// FaultAgentKill sends SIGKILL to the agent and restarts it after Down.
	FaultAgentKill = "agent_kill"
	// FaultAgentRestart stops the agent with SIGTERM and restarts it after Down.
	FaultAgentRestart = "agent_restart"
	// FaultBrokerRestart stops the device broker and starts it after Down.
	FaultBrokerRestart = "broker_restart"
	// FaultNATSRestart stops the NATS server and starts it after Down.
	FaultNATSRestart = "nats_restart"
	// FaultUplinkCut resets the agent's uplink connections and refuses new
	// ones for For.
	FaultUplinkCut = "uplink_cut"
	// FaultUplinkBlackhole swallows the uplink's traffic both ways for For.
	FaultUplinkBlackhole = "uplink_blackhole"
	// FaultUplinkDropAcks delivers the agent's publishes but swallows the
	// server's replies (the acks) for For.
	FaultUplinkDropAcks = "uplink_drop_acks"
	// FaultDiskFull fills the filesystem holding the agent's data_dir for For.
	FaultDiskFull = "disk_full"
)

// FaultKinds lists every fault kind.
var FaultKinds = []string{FaultAgentKill, FaultAgentRestart, FaultBrokerRestart, FaultNATSRestart,
	FaultUplinkCut, FaultUplinkBlackhole, FaultUplinkDropAcks, FaultDiskFull}

// Scenario is one scenario file.
type Scenario struct {
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	// Seed makes the device plan reproducible.
	Seed uint64 `yaml:"seed"`
	// Duration is the wall-clock length of the publishing phase.
	Duration time.Duration `yaml:"duration"`
	// Speed is how many seconds of device (event) time pass per wall second.
	Speed float64 `yaml:"speed"`
	// Connections is how many MQTT connections the devices share; each
	// device always uses the same one, so its order is kept.
	Connections int `yaml:"connections"`
	// SettleTimeout bounds the wait, after the last publish, for every
	// expected window to arrive with its final value.
	SettleTimeout time.Duration `yaml:"settle_timeout"`
	Devices       []DeviceGroup `yaml:"devices"`
	Misbehaviour  Misbehaviour  `yaml:"misbehaviour"`
	Faults        []Fault       `yaml:"faults"`
	Agent         Agent         `yaml:"agent"`
	// Short replaces parts of the scenario for CI (edgerig run --short).
	Short Short `yaml:"short"`
}

// DeviceGroup is a set of devices that share a format and a rate.
type DeviceGroup struct {
	// Prefix names the devices: prefix0000, prefix0001, ...
	Prefix string `yaml:"prefix"`
	Count  int    `yaml:"count"`
	// Format is json, cbor or number (one plain number per metric topic).
	Format string `yaml:"format"`
	// Interval is the event time between two readings of one device.
	Interval time.Duration `yaml:"interval"`
	Metrics  []string      `yaml:"metrics"`
}

// Misbehaviour switches and sizes what devices do wrong. A nil entry is off.
type Misbehaviour struct {
	Offline      *Offline      `yaml:"offline"`
	Pause        *Pause        `yaml:"pause"`
	Duplicates   *Duplicates   `yaml:"duplicates"`
	OutOfOrder   *OutOfOrder   `yaml:"out_of_order"`
	ClockSkew    *ClockSkew    `yaml:"clock_skew"`
	Late         *Late         `yaml:"late"`
	Malformed    *Malformed    `yaml:"malformed"`
	SchemaChange *SchemaChange `yaml:"schema_change"`
	Bursts       *Bursts       `yaml:"bursts"`
}

// Offline devices stop sending for a span of event time, buffer what they
// measure, and flush it in order when they come back.
type Offline struct {
	Devices Fraction `yaml:"devices"`
	// Min and Max bound the offline span, in event time.
	Min time.Duration `yaml:"min"`
	Max time.Duration `yaml:"max"`
	// Within bounds, as two points of the run, when the spans start
	// (uniformly between them); unset, between 10% and 70% of the run.
	// The demo, whose run is a 30-minute horizon, sets it so that devices
	// go offline in its first minute, while a new user is watching.
	Within *[2]At `yaml:"within"`
}

// Pause silences devices for a wall-clock span longer than the idle timeout,
// without buffering: what they would have sent is never measured.
type Pause struct {
	Devices Fraction      `yaml:"devices"`
	At      At            `yaml:"at"`
	For     time.Duration `yaml:"for"`
}

// Duplicates are producer retries: the same message (same event id) sent
// again a few messages later.
type Duplicates struct {
	Readings Fraction `yaml:"readings"`
	// MaxGap is how many of the device's messages may come between a
	// message and its retry.
	MaxGap int `yaml:"max_gap"`
}

// OutOfOrder swaps adjacent readings of a device whose event times are
// within half the watermark delay.
type OutOfOrder struct {
	Readings Fraction `yaml:"readings"`
}

// ClockSkew gives devices a wrong clock. Kinds cycle over the chosen
// devices: slow and fast drift by Drift, behind and ahead are off by Offset,
// future and epoch send a fraction (Glitches) of readings stamped a year
// ahead or in 1970, which are dead-lettered.
type ClockSkew struct {
	Devices  Fraction      `yaml:"devices"`
	Kinds    []string      `yaml:"kinds"`
	Drift    float64       `yaml:"drift"`
	Offset   time.Duration `yaml:"offset"`
	Glitches Fraction      `yaml:"glitches"`
}

// Clock skew kinds.
const (
	SkewSlow   = "slow"
	SkewFast   = "fast"
	SkewBehind = "behind"
	SkewAhead  = "ahead"
	SkewFuture = "future"
	SkewEpoch  = "epoch"
)

// Late adds readings stamped in the past: Within ones land in already
// emitted windows inside the allowed lateness (a revision), Beyond ones far
// past it (the late table).
type Late struct {
	Within Fraction `yaml:"within"`
	Beyond Fraction `yaml:"beyond"`
}

// Malformed inserts messages the agent must dead-letter: broken JSON or
// CBOR, no timestamp, a bad timestamp, no numeric field, a non-number on a
// number topic, and (when Oversized) payloads over ingest.max_payload_bytes.
type Malformed struct {
	Messages  Fraction `yaml:"messages"`
	Oversized bool     `yaml:"oversized"`
}

// SchemaChange renames fields from a point of the run on.
type SchemaChange struct {
	Devices Fraction          `yaml:"devices"`
	At      At                `yaml:"at"`
	Rename  map[string]string `yaml:"rename"`
}

// Bursts make devices send Size extra readings at once, Count times in the
// run, all at the same moments.
type Bursts struct {
	Devices Fraction `yaml:"devices"`
	Count   int      `yaml:"count"`
	Size    int      `yaml:"size"`
}

// Fault is one scheduled fault.
type Fault struct {
	At   At     `yaml:"at"`
	Kind string `yaml:"kind"`
	// For is how long the fault lasts (or how long a stopped process stays
	// down, for the restart kinds).
	For time.Duration `yaml:"for"`
}

// Agent holds the agent settings a scenario needs; zero values take the
// rig's defaults (see Defaults).
type Agent struct {
	Window            Window        `yaml:"window"`
	TriggerInterval   time.Duration `yaml:"trigger_interval"`
	ClockTickInterval time.Duration `yaml:"clock_tick_interval"`
	CommitInterval    time.Duration `yaml:"commit_interval"`
	MaxPayloadBytes   Size          `yaml:"max_payload_bytes"`
	MaxFutureSkew     time.Duration `yaml:"max_future_skew"`
	MaxPastSkew       time.Duration `yaml:"max_past_skew"`
	BronzeMaxBytes    Size          `yaml:"bronze_max_bytes"`
	OutboxMaxBytes    Size          `yaml:"outbox_max_bytes"`
	Uplink            Uplink        `yaml:"uplink"`
	// Alerts are alert rules the agent runs, publishing each transition
	// to the device broker, where the rig checks them against the truth.
	Alerts []AlertRule `yaml:"alerts"`
}

// Window is the agent's window section.
type Window struct {
	Size            time.Duration `yaml:"size"`
	Slide           time.Duration `yaml:"slide"`
	WatermarkDelay  time.Duration `yaml:"watermark_delay"`
	AllowedLateness time.Duration `yaml:"allowed_lateness"`
	IdleTimeout     time.Duration `yaml:"idle_timeout"`
	Aggregates      []string      `yaml:"aggregates"`
	// ZeroDelay and ZeroLateness make a zero delay or lateness explicit
	// (a zero value otherwise takes the default).
	ZeroDelay    bool `yaml:"zero_delay"`
	ZeroLateness bool `yaml:"zero_lateness"`
}

// Uplink is the agent's uplink tuning.
type Uplink struct {
	MaxBatchRecords      int           `yaml:"max_batch_records"`
	MaxBatchBytes        Size          `yaml:"max_batch_bytes"`
	Compression          string        `yaml:"compression"`
	AckTimeout           time.Duration `yaml:"ack_timeout"`
	ReconnectMaxInterval time.Duration `yaml:"reconnect_max_interval"`
}

// Short is what --short changes.
type Short struct {
	Duration time.Duration `yaml:"duration"`
	// DeviceScale multiplies every group's count (at least one device stays).
	DeviceScale float64 `yaml:"device_scale"`
	Speed       float64 `yaml:"speed"`
}

// Fraction is a share, written 0.05 or 5%.
type Fraction float64

// UnmarshalText reads 0.05 or 5%.
func (f *Fraction) UnmarshalText(b []byte) error {
	v, err := parseFraction(string(b))
	if err != nil {
		return err
	}
	*f = Fraction(v)
	return nil
}

func parseFraction(s string) (float64, error) {
	s = strings.TrimSpace(s)
	div := 1.0
	if strings.HasSuffix(s, "%") {
		s, div = strings.TrimSuffix(s, "%"), 100
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) {
		return 0, fmt.Errorf("%q is not a fraction (0.05 or 5%%)", s)
	}
	return v / div, nil
}

// At is a point of the run: a share of the duration (30%) or a wall-clock
// offset (12s).
type At struct {
	Frac   float64
	Offset time.Duration
	IsFrac bool
}

// UnmarshalText reads 30% or 12s.
func (a *At) UnmarshalText(b []byte) error {
	s := strings.TrimSpace(string(b))
	if strings.HasSuffix(s, "%") {
		v, err := parseFraction(s)
		if err != nil {
			return err
		}
		*a = At{Frac: v, IsFrac: true}
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is neither a share of the run (30%%) nor a duration (12s)", s)
	}
	*a = At{Offset: d}
	return nil
}

// MarshalText writes the form UnmarshalText reads.
func (a At) MarshalText() ([]byte, error) {
	if a.IsFrac {
		return []byte(strconv.FormatFloat(a.Frac*100, 'f', -1, 64) + "%"), nil
	}
	return []byte(a.Offset.String()), nil
}

// Resolve turns the point into an offset from the start of a run of length total.
func (a At) Resolve(total time.Duration) time.Duration {
	if a.IsFrac {
		return time.Duration(a.Frac * float64(total))
	}
	return a.Offset
}

// Size is a byte count, written 4096, 4KiB or 1MiB.
type Size int64

// UnmarshalText reads a plain number or one with a KiB, MiB, GiB suffix.
func (s *Size) UnmarshalText(b []byte) error {
	str := strings.TrimSpace(string(b))
	mult := int64(1)
	for _, u := range []struct {
		suf string
		m   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if strings.HasSuffix(str, u.suf) {
			str, mult = strings.TrimSuffix(str, u.suf), u.m
			break
		}
	}
	v, err := strconv.ParseInt(strings.TrimSpace(str), 10, 64)
	if err != nil || v < 0 {
		return fmt.Errorf("%q is not a size (4096, 4KiB, 1MiB)", string(b))
	}
	*s = Size(v * mult)
	return nil
}

// Parse decodes a scenario strictly (unknown keys are errors), fills the
// rig's defaults and validates it. name is used in messages. Every problem
// is returned at once, as *Errors, each as "name:LINE: key: message".
func Parse(name string, data []byte) (*Scenario, error) {
	src, ferr := parseSource(name, data)
	if ferr != nil {
		return nil, &Errors{config.Errors{File: name, List: []*FieldError{ferr}}}
	}
	p := &problems{file: name, src: src}
	if src.check(p); len(p.list) > 0 {
		return nil, p.err()
	}
	var sc Scenario
	if err := yaml.UnmarshalWithOptions(data, &sc, yaml.Strict(), yaml.DisallowUnknownField()); err != nil {
		key, line, msg := src.keyAt(err)
		p.addAt(line, key, "%s", msg)
		return nil, p.err()
	}
	sc.setDefaults()
	sc.validate(p)
	if err := p.err(); err != nil {
		return nil, err
	}
	return &sc, nil
}

// Load reads and parses a scenario file.
func Load(path string) (*Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read scenario: %w", err)
	}
	return Parse(path, data)
}

// Lookup finds a scenario by stock name (steady, chaos, ...) or file path.
func Lookup(nameOrPath string) (*Scenario, error) {
	if data, err := scenarios.Files.ReadFile(nameOrPath + ".yaml"); err == nil {
		return Parse(nameOrPath+".yaml", data)
	}
	if _, err := os.Stat(nameOrPath); err == nil {
		return Load(nameOrPath)
	}
	return nil, fmt.Errorf("%w: %q is neither a stock scenario (%s) nor a file", ErrNotFound, nameOrPath, strings.Join(Names(), ", "))
}

// Names lists the stock scenarios, sorted.
func Names() []string {
	entries, err := scenarios.Files.ReadDir(".")
	if err != nil {
		return nil // the embedded directory always exists
	}
	var names []string
	for _, e := range entries {
		if n, ok := strings.CutSuffix(e.Name(), ".yaml"); ok {
			names = append(names, n)
		}
	}
	return names
}

// Rig defaults for agent settings the scenario leaves out. They keep runs
// short: idle windows close within seconds, the uplink reconnects fast.
const (
	DefaultSize              = time.Minute
	DefaultWatermarkDelay    = 10 * time.Second
	DefaultAllowedLateness   = 10 * time.Minute
	DefaultIdleTimeout       = 3 * time.Second
	DefaultTriggerInterval   = 200 * time.Millisecond
	DefaultClockTickInterval = 200 * time.Millisecond
	DefaultCommitInterval    = 50 * time.Millisecond
	DefaultMaxPayloadBytes   = 256 << 10
	DefaultMaxFutureSkew     = 5 * time.Minute
	DefaultMaxPastSkew       = 720 * time.Hour
	DefaultAckTimeout        = 3 * time.Second
	DefaultReconnectMax      = time.Second
	DefaultSettleTimeout     = 60 * time.Second
)

// AllAggregates are the aggregates the agent can compute.
var AllAggregates = []string{"count", "sum", "min", "max", "mean", "first", "last"}

// Normalize fills the rig's defaults into a scenario built in code (Parse
// does it for files).
func (sc *Scenario) Normalize() { sc.setDefaults() }

func (sc *Scenario) setDefaults() {
	if sc.Speed == 0 {
		sc.Speed = 60
	}
	if sc.Connections == 0 {
		sc.Connections = 8
	}
	if sc.SettleTimeout == 0 {
		sc.SettleTimeout = DefaultSettleTimeout
	}
	a := &sc.Agent
	w := &a.Window
	if w.Size == 0 {
		w.Size = DefaultSize
	}
	if w.Slide == 0 {
		w.Slide = w.Size
	}
	if w.WatermarkDelay == 0 && !w.ZeroDelay {
		w.WatermarkDelay = DefaultWatermarkDelay
	}
	if w.AllowedLateness == 0 && !w.ZeroLateness {
		w.AllowedLateness = DefaultAllowedLateness
	}
	if w.IdleTimeout == 0 {
		w.IdleTimeout = DefaultIdleTimeout
	}
	if len(w.Aggregates) == 0 {
		w.Aggregates = append([]string(nil), AllAggregates...)
	}
	sc.setAlertDefaults()
	if a.TriggerInterval == 0 {
		a.TriggerInterval = DefaultTriggerInterval
	}
	if a.ClockTickInterval == 0 {
		a.ClockTickInterval = min(DefaultClockTickInterval, w.IdleTimeout)
	}
	if a.CommitInterval == 0 {
		a.CommitInterval = DefaultCommitInterval
	}
	if a.MaxPayloadBytes == 0 {
		a.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if a.MaxFutureSkew == 0 {
		a.MaxFutureSkew = DefaultMaxFutureSkew
	}
	if a.MaxPastSkew == 0 {
		a.MaxPastSkew = DefaultMaxPastSkew
	}
	if a.BronzeMaxBytes == 0 {
		a.BronzeMaxBytes = 1 << 30
	}
	if a.OutboxMaxBytes == 0 {
		a.OutboxMaxBytes = 256 << 20
	}
	u := &a.Uplink
	if u.MaxBatchRecords == 0 {
		u.MaxBatchRecords = 500
	}
	if u.MaxBatchBytes == 0 {
		u.MaxBatchBytes = 256 << 10
	}
	if u.Compression == "" {
		u.Compression = "zstd"
	}
	if u.AckTimeout == 0 {
		u.AckTimeout = DefaultAckTimeout
	}
	if u.ReconnectMaxInterval == 0 {
		u.ReconnectMaxInterval = DefaultReconnectMax
	}
	if m := sc.Misbehaviour.Duplicates; m != nil && m.MaxGap == 0 {
		m.MaxGap = 3
	}
	if m := sc.Misbehaviour.ClockSkew; m != nil {
		if len(m.Kinds) == 0 {
			m.Kinds = []string{SkewSlow, SkewFast, SkewBehind, SkewAhead, SkewFuture, SkewEpoch}
		}
		if m.Drift == 0 {
			m.Drift = 0.02
		}
		if m.Offset == 0 {
			m.Offset = 90 * time.Second
		}
		if m.Glitches == 0 {
			m.Glitches = 0.05
		}
	}
}

// WithShort returns a copy with the Short settings applied.
func (sc *Scenario) WithShort() *Scenario {
	c := *sc
	c.Devices = append([]DeviceGroup(nil), sc.Devices...)
	if sc.Short.Duration > 0 {
		c.Duration = sc.Short.Duration
	}
	if sc.Short.Speed > 0 {
		c.Speed = sc.Short.Speed
	}
	if s := sc.Short.DeviceScale; s > 0 {
		for i := range c.Devices {
			c.Devices[i].Count = max(1, int(math.Round(float64(c.Devices[i].Count)*s)))
		}
	}
	return &c
}

// DeviceCount is the number of devices over all groups.
func (sc *Scenario) DeviceCount() int {
	n := 0
	for _, g := range sc.Devices {
		n += g.Count
	}
	return n
}

// AtLeastOnce reports whether a fault of the scenario can make the broker
// deliver a message to the agent twice (a kill between the Bronze commit and
// the PUBACK, a broker restart). Readings without an event id (number
// payloads) are then counted twice, and late, duplicate and dead-letter
// counters may exceed the expected values.
func (sc *Scenario) AtLeastOnce() bool {
	for _, f := range sc.Faults {
		switch f.Kind {
		case FaultAgentKill, FaultAgentRestart, FaultBrokerRestart, FaultDiskFull:
			return true
		}
	}
	return false
}

// Validate checks the scenario; every problem is reported at once, as
// *Errors naming each key.
// minPayloadBytes is the smallest agent.max_payload_bytes a scenario may
// set: its readings stay well under it.
const minPayloadBytes = 1024

// LeadMargin keeps every planned event time this far before the start of
// publishing, so clock offsets, bursts and the agent's future-skew check
// never meet.
const LeadMargin = 3 * time.Minute

// Lead is how far before the start of publishing the plan's event time
// begins: the span of event time stretched by the clock drift, the ahead
// offset, one reading interval and LeadMargin.
func (sc *Scenario) Lead() time.Duration {
	span, drift, ahead := sc.span(), 0.0, time.Duration(0)
	if cs := sc.Misbehaviour.ClockSkew; cs != nil {
		drift, ahead = cs.Drift, cs.Offset
	}
	var maxInterval time.Duration
	for _, g := range sc.Devices {
		maxInterval = max(maxInterval, g.Interval)
	}
	return time.Duration(float64(span)*(1+drift)) + ahead + maxInterval + LeadMargin
}

// span is the event time the scenario covers: duration × speed.
func (sc *Scenario) span() time.Duration { return time.Duration(float64(sc.Duration) * sc.Speed) }

// eventSpan is the event time the scenario covers, and how old its oldest
// reading can be when it arrives: the lead, plus the publishing time for a
// backlog flushed at the end.
func (sc *Scenario) eventSpan() (span, oldest time.Duration) {
	return sc.span(), sc.Lead() + sc.Duration
}

func (sc *Scenario) Validate() error {
	p := &problems{}
	sc.validate(p)
	return p.err()
}

func (sc *Scenario) validate(p *problems) {
	bad := p.add
	if sc.Name == "" {
		bad("name", "required")
	}
	if sc.Duration <= 0 {
		bad("duration", "must be positive")
	}
	if sc.Speed <= 0 {
		bad("speed", "must be positive")
	}
	// The oldest readings arrive as old as the plan's lead before the
	// start (sim.NewPlan) plus a flush at the end of publishing; with an
	// hour to spare they must stay inside max_past_skew, or the agent
	// dead-letters what the truth counts.
	if span, oldest := sc.eventSpan(); oldest+time.Hour > sc.Agent.MaxPastSkew {
		bad("agent.max_past_skew", "%v, but the oldest readings arrive up to %v old (duration × speed is %v of event time): the agent would dead-letter them; raise it to at least %v, or shorten duration or speed",
			sc.Agent.MaxPastSkew, oldest.Round(time.Minute), span, (oldest + time.Hour + time.Minute - 1).Truncate(time.Minute))
	}
	if sc.Agent.MaxPayloadBytes < minPayloadBytes {
		bad("agent.max_payload_bytes", "%d, at least %d: smaller, the agent would refuse the rig's ordinary readings", int64(sc.Agent.MaxPayloadBytes), minPayloadBytes)
	}
	if sc.Connections < 1 {
		bad("connections", "at least 1")
	}
	if len(sc.Devices) == 0 {
		bad("devices", "at least one group")
	}
	prefixes := map[string]bool{}
	for i, g := range sc.Devices {
		k := fmt.Sprintf("devices[%d]", i)
		if g.Prefix == "" || strings.ContainsAny(g.Prefix, "/+#") {
			bad(k+".prefix", "required, without / + #")
		}
		if prefixes[g.Prefix] {
			bad(k+".prefix", "%q used twice", g.Prefix)
		}
		prefixes[g.Prefix] = true
		if g.Count < 1 {
			bad(k+".count", "at least 1")
		}
		switch g.Format {
		case FormatJSON, FormatCBOR, FormatNumber:
		default:
			bad(k+".format", "json, cbor or number, not %q", g.Format)
		}
		if g.Interval < time.Second || g.Interval%time.Millisecond != 0 {
			bad(k+".interval", "at least 1s, whole milliseconds")
		}
		if len(g.Metrics) == 0 {
			bad(k+".metrics", "at least one")
		}
		for j, m := range g.Metrics {
			if m == "" || m == "id" || m == "ts" || strings.ContainsAny(m, "./+#") {
				bad(fmt.Sprintf("%s.metrics[%d]", k, j), "%q is not a valid metric name", m)
			}
		}
	}
	w := sc.Agent.Window
	if w.Size <= 0 || w.Size%time.Millisecond != 0 {
		bad("agent.window.size", "positive, whole milliseconds")
	}
	if w.Slide <= 0 || w.Slide > w.Size || (w.Slide > 0 && w.Size%w.Slide != 0) {
		bad("agent.window.slide", "positive, at most size, and size a multiple of it")
	}
	if w.WatermarkDelay < 0 {
		bad("agent.window.watermark_delay", "must not be negative")
	}
	if w.AllowedLateness < 0 {
		bad("agent.window.allowed_lateness", "must not be negative")
	}
	if sc.Agent.ClockTickInterval > w.IdleTimeout {
		bad("agent.clock_tick_interval", "not longer than window.idle_timeout")
	}
	for i, a := range w.Aggregates {
		if !contains(AllAggregates, a) {
			bad(fmt.Sprintf("agent.window.aggregates[%d]", i), "%q is not one of %s", a, strings.Join(AllAggregates, ", "))
		}
	}
	if !contains(w.Aggregates, "count") {
		bad("agent.window.aggregates", "the rig needs count")
	}
	sc.validateMisbehaviour(p)
	sc.validateFaults(p)
	sc.validateAlerts(p)
}

func (sc *Scenario) validateMisbehaviour(p *problems) {
	bad := p.add
	w := sc.Agent.Window
	m := sc.Misbehaviour
	type share struct {
		key string
		f   Fraction
	}
	var shares []share
	if m.Offline != nil {
		shares = append(shares, share{"offline.devices", m.Offline.Devices})
		if m.Offline.Min <= 0 || m.Offline.Max < m.Offline.Min {
			bad("misbehaviour.offline", "0 < min <= max")
		}
		if wi := m.Offline.Within; wi != nil {
			if from, to := wi[0].Resolve(sc.Duration), wi[1].Resolve(sc.Duration); from < 0 || to < from || to > sc.Duration {
				bad("misbehaviour.offline.within", "[from, to] with 0 <= from <= to <= duration (%v)", sc.Duration)
			}
		}
	}
	if m.Pause != nil {
		shares = append(shares, share{"pause.devices", m.Pause.Devices})
		if m.Pause.For <= w.IdleTimeout {
			bad("misbehaviour.pause.for", "longer than agent.window.idle_timeout (%v), or it pauses nothing", w.IdleTimeout)
		}
	}
	if m.Duplicates != nil {
		shares = append(shares, share{"duplicates.readings", m.Duplicates.Readings})
		if m.Duplicates.MaxGap < 0 {
			bad("misbehaviour.duplicates.max_gap", "not negative")
		}
	}
	if m.OutOfOrder != nil {
		shares = append(shares, share{"out_of_order.readings", m.OutOfOrder.Readings})
		if w.WatermarkDelay < 2*time.Second {
			bad("misbehaviour.out_of_order", "needs agent.window.watermark_delay of at least 2s")
		}
	}
	if m.ClockSkew != nil {
		shares = append(shares, share{"clock_skew.devices", m.ClockSkew.Devices}, share{"clock_skew.glitches", m.ClockSkew.Glitches})
		for i, k := range m.ClockSkew.Kinds {
			if !contains([]string{SkewSlow, SkewFast, SkewBehind, SkewAhead, SkewFuture, SkewEpoch}, k) {
				bad(fmt.Sprintf("misbehaviour.clock_skew.kinds[%d]", i), "unknown kind %q", k)
			}
		}
		if m.ClockSkew.Drift <= 0 || m.ClockSkew.Drift >= 0.5 {
			bad("misbehaviour.clock_skew.drift", "between 0 and 0.5")
		}
		if m.ClockSkew.Offset >= sc.Agent.MaxFutureSkew {
			bad("misbehaviour.clock_skew.offset", "below agent.max_future_skew, or ahead devices are dead-lettered")
		}
	}
	if m.Late != nil {
		shares = append(shares, share{"late.within", m.Late.Within}, share{"late.beyond", m.Late.Beyond})
	}
	if m.Malformed != nil {
		shares = append(shares, share{"malformed.messages", m.Malformed.Messages})
	}
	if m.SchemaChange != nil {
		shares = append(shares, share{"schema_change.devices", m.SchemaChange.Devices})
		if len(m.SchemaChange.Rename) == 0 {
			bad("misbehaviour.schema_change.rename", "at least one field")
		}
	}
	if m.Bursts != nil {
		shares = append(shares, share{"bursts.devices", m.Bursts.Devices})
		if m.Bursts.Count < 1 || m.Bursts.Size < 1 {
			bad("misbehaviour.bursts", "count and size at least 1")
		}
		for i, g := range sc.Devices {
			if int64(g.Interval/time.Millisecond) < int64(m.Bursts.Size+1) {
				bad("misbehaviour.bursts.size", "devices[%d].interval leaves less than 1ms between burst readings", i)
			}
		}
	}
	for _, s := range shares {
		if s.f < 0 || s.f > 1 {
			bad("misbehaviour."+s.key, "a share between 0 and 1")
		}
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
