// Package sim simulates a fleet of devices: it plans, from a scenario and a
// seed, every message each device sends (payload, event time, event id,
// misbehaviour) and when, then publishes the plan over real MQTT
// connections, each device always on the same connection.
package sim

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/edgeagent/edgeagent/testrig/scenario"
	"github.com/edgeagent/edgeagent/window"
)

// Topic templates the rig's agent configuration subscribes to, one per
// payload format.
const (
	TopicJSON   = "sensors/{device}/telemetry"
	TopicCBOR   = "cbor/{device}/telemetry"
	TopicNumber = "num/{device}/{metric}"
)

// Kind says what the agent should make of a message.
type Kind uint8

const (
	// KindReading is a valid reading.
	KindReading Kind = iota + 1
	// KindMalformed cannot be parsed into a reading: dead-lettered.
	KindMalformed
	// KindOversized is over ingest.max_payload_bytes: refused by ingest and
	// dead-lettered.
	KindOversized
	// KindGlitch is stamped far in the future or in 1970 by a broken
	// device clock: dead-lettered.
	KindGlitch
)

func (k Kind) String() string {
	switch k {
	case KindReading:
		return "reading"
	case KindMalformed:
		return "malformed"
	case KindOversized:
		return "oversized"
	case KindGlitch:
		return "glitch"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Message is one planned publish.
type Message struct {
	Topic   string
	Payload []byte
	// SendAt is the wall-clock offset from the start of publishing.
	SendAt time.Duration
	Kind   Kind
	// Reading is what the payload carries when Kind is KindReading.
	Reading *Reading
	// Retry marks a producer retry: a copy of an earlier message.
	Retry bool
	// Note names the misbehaviour that made the message, "" for none.
	Note string
	// Code is the dead-letter reason code the agent must give a message
	// it refuses (window.Code*), "" for a reading.
	Code string
}

// Reading is the content of a valid reading.
type Reading struct {
	ID string
	// TS is the event time in Unix milliseconds; with PTime the agent uses
	// its received-at instead (plain-number payloads carry no time).
	TS      int64
	PTime   bool
	Metrics []Metric
}

// Metric is one named value.
type Metric struct {
	Name  string
	Value float64
}

// Device is one simulated device and its messages in send order.
type Device struct {
	Name   string
	Format string
	// Conn is the index of the connection the device publishes on.
	Conn   int
	Traits []string
	// OfflineFrom and OfflineUntil are the wall-clock offsets between which
	// an offline device buffers instead of sending (both zero: never).
	OfflineFrom, OfflineUntil time.Duration
	Messages                  []Message
}

// Plan is every message of a run.
type Plan struct {
	Scenario string
	// Start is the wall time the plan was made for; event times stay before
	// it, so no reading is refused as stamped in the future.
	Start time.Time
	// Base is the event time (Unix ms) at wall offset 0.
	Base        int64
	Speed       float64
	Duration    time.Duration
	Connections int
	Devices     []Device
}

// Counts summarises a plan.
type Counts struct {
	Devices, Messages, Readings, Retries, Dead int
}

// Counts counts the plan's messages.
func (p *Plan) Counts() Counts {
	c := Counts{Devices: len(p.Devices)}
	for i := range p.Devices {
		for j := range p.Devices[i].Messages {
			m := &p.Devices[i].Messages[j]
			c.Messages++
			switch {
			case m.Kind != KindReading:
				c.Dead++
			case m.Retry:
				c.Retries++
			default:
				c.Readings++
			}
		}
	}
	return c
}

// NewPlan plans a run of sc that starts publishing at start.
func NewPlan(sc *scenario.Scenario, start time.Time) (*Plan, error) {
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	lead := sc.Lead()
	p := &Plan{
		Scenario:    sc.Name,
		Start:       start,
		Base:        start.Add(-lead).UnixMilli(),
		Speed:       sc.Speed,
		Duration:    sc.Duration,
		Connections: sc.Connections,
	}
	g := newPlanner(sc, p)
	g.plan()
	return p, nil
}

// WallOf converts an event-time offset (ms after Base) into the wall-clock
// offset at which it happens.
func (p *Plan) WallOf(trueMs int64) time.Duration {
	return time.Duration(float64(trueMs) / p.Speed * float64(time.Millisecond))
}

// planner holds the state of NewPlan.
type planner struct {
	sc     *scenario.Scenario
	p      *Plan
	spanMs int64
	rng    *rand.Rand
	// selected[misbehaviour] is the set of device indexes it applies to.
	selected map[string]map[int]bool
	bursts   []int64 // event-time offsets of the fleet's bursts
	pause    [2]time.Duration
	schemaAt int64
}

func newPlanner(sc *scenario.Scenario, p *Plan) *planner {
	g := &planner{
		sc:       sc,
		p:        p,
		spanMs:   int64(float64(sc.Duration.Milliseconds()) * sc.Speed),
		rng:      rand.New(rand.NewPCG(sc.Seed, 0x5eed)),
		selected: map[string]map[int]bool{},
	}
	return g
}

func (g *planner) plan() {
	sc := g.sc
	var all, structured []int // structured: JSON and CBOR devices
	idx := 0
	for _, grp := range sc.Devices {
		for i := 0; i < grp.Count; i++ {
			g.p.Devices = append(g.p.Devices, Device{
				Name:   fmt.Sprintf("%s%04d", grp.Prefix, i),
				Format: grp.Format,
				Conn:   idx % sc.Connections,
			})
			all = append(all, idx)
			if grp.Format != scenario.FormatNumber {
				structured = append(structured, idx)
			}
			idx++
		}
	}
	m := sc.Misbehaviour
	if m.Offline != nil {
		g.choose("offline", all, m.Offline.Devices)
	}
	if m.Pause != nil {
		g.choose("pause", all, m.Pause.Devices)
		at := m.Pause.At.Resolve(sc.Duration)
		g.pause = [2]time.Duration{at, at + m.Pause.For}
	}
	if m.ClockSkew != nil {
		g.choose("skew", structured, m.ClockSkew.Devices)
	}
	if m.SchemaChange != nil {
		g.choose("schema", structured, m.SchemaChange.Devices)
		g.schemaAt = int64(float64(m.SchemaChange.At.Resolve(sc.Duration).Milliseconds()) * sc.Speed)
	}
	if m.Bursts != nil {
		g.choose("burst", all, m.Bursts.Devices)
		for i := 0; i < m.Bursts.Count; i++ {
			// Inside the middle of the run, so bursts meet live traffic.
			g.bursts = append(g.bursts, int64(float64(g.spanMs)*(0.15+0.7*g.rng.Float64())))
		}
		slices.Sort(g.bursts)
	}
	skewN := 0
	idx = 0
	for _, grp := range sc.Devices {
		for i := 0; i < grp.Count; i++ {
			d := &g.p.Devices[idx]
			skew := ""
			if g.selected["skew"][idx] {
				kinds := m.ClockSkew.Kinds
				skew = kinds[skewN%len(kinds)]
				skewN++
			}
			dg := &deviceGen{planner: g, dev: d, grp: grp, skew: skew, rng: rand.New(rand.NewPCG(sc.Seed, uint64(idx)+1)), used: map[int64]bool{}}
			dg.generate(idx)
			idx++
		}
	}
}

// choose selects round(frac × len(from)) devices of from.
func (g *planner) choose(what string, from []int, frac scenario.Fraction) {
	n := int(math.Round(float64(frac) * float64(len(from))))
	if frac > 0 && n == 0 && len(from) > 0 {
		n = 1 // a switched-on misbehaviour always hits someone
	}
	perm := g.rng.Perm(len(from))
	set := map[int]bool{}
	for _, i := range perm[:n] {
		set[from[i]] = true
	}
	g.selected[what] = set
}

// deviceGen generates one device's messages.
type deviceGen struct {
	*planner
	dev  *Device
	grp  scenario.DeviceGroup
	skew string
	rng  *rand.Rand
	used map[int64]bool // event times in use, to keep them unique
	nid  int
}

// point is a reading before it becomes messages.
type point struct {
	devMs           int64 // device clock, ms after Base: the event time stamped
	trueMs          int64 // true event time, ms after Base: when it is measured
	sendAt          time.Duration
	renamed, glitch bool
	note            string
}

func (d *deviceGen) generate(idx int) {
	sc := d.sc
	interval := d.grp.Interval.Milliseconds()
	phase := d.rng.Int64N(interval)
	rate, offset := 1.0, int64(0)
	switch d.skew {
	case scenario.SkewSlow:
		rate = 1 - sc.Misbehaviour.ClockSkew.Drift
	case scenario.SkewFast:
		rate = 1 + sc.Misbehaviour.ClockSkew.Drift
	case scenario.SkewBehind:
		offset = -sc.Misbehaviour.ClockSkew.Offset.Milliseconds()
	case scenario.SkewAhead:
		offset = sc.Misbehaviour.ClockSkew.Offset.Milliseconds()
	}
	if d.skew != "" {
		d.dev.Traits = append(d.dev.Traits, "clock:"+d.skew)
	}
	toTrue := func(dc int64) int64 { return int64(math.Round(float64(dc-offset) / rate)) }
	toDev := func(tr int64) int64 { return int64(math.Round(float64(tr)*rate)) + offset }
	var pts []point
	for k := int64(0); ; k++ {
		dc := phase + k*interval
		tr := toTrue(dc)
		if tr > d.spanMs {
			break
		}
		if tr < 0 {
			continue
		}
		pts = append(pts, point{devMs: dc, trueMs: tr})
	}
	for _, pt := range pts {
		d.used[pt.devMs] = true
	}
	if d.selected["burst"][idx] {
		// Size extra readings stamped between the grid reading before the
		// burst and the next one, all sent at the burst's moment.
		size := int64(d.sc.Misbehaviour.Bursts.Size)
		step := interval / (size + 1)
		for _, tb := range d.bursts {
			dcb := toDev(tb)
			grid := phase + floorDiv(dcb-phase, interval)*interval
			for j := int64(1); j <= size; j++ {
				dc := d.unique(d.p.Base+grid+j*step) - d.p.Base
				pts = append(pts, point{devMs: dc, trueMs: tb, note: "burst"})
			}
		}
		d.dev.Traits = append(d.dev.Traits, "bursts")
	}
	slices.SortStableFunc(pts, func(a, b point) int { return cmpInt(a.devMs, b.devMs) })
	var last time.Duration
	for i := range pts {
		pts[i].sendAt = max(d.p.WallOf(pts[i].trueMs), last)
		last = pts[i].sendAt
	}
	if d.selected["pause"][idx] {
		kept := pts[:0]
		for _, pt := range pts {
			if pt.sendAt < d.pause[0] || pt.sendAt >= d.pause[1] {
				kept = append(kept, pt)
			}
		}
		pts = kept
		d.dev.Traits = append(d.dev.Traits, fmt.Sprintf("paused %v", d.pause[1]-d.pause[0]))
	}
	if d.selected["offline"][idx] {
		o := d.sc.Misbehaviour.Offline
		length := o.Min.Milliseconds()
		if o.Max > o.Min {
			length += d.rng.Int64N(o.Max.Milliseconds() - o.Min.Milliseconds() + 1)
		}
		var from int64
		if wi := o.Within; wi != nil {
			lo, hi := d.eventMs(wi[0].Resolve(d.sc.Duration)), d.eventMs(wi[1].Resolve(d.sc.Duration))
			from = lo + int64(float64(hi-lo)*d.rng.Float64())
		} else {
			// Kept as it was, so a seed's plan stays the same.
			from = int64(float64(d.spanMs) * (0.1 + 0.6*d.rng.Float64()))
		}
		back := min(d.p.WallOf(from+length), d.sc.Duration)
		for i := range pts {
			if pts[i].trueMs >= from && pts[i].trueMs < from+length {
				pts[i].sendAt = max(pts[i].sendAt, back)
				pts[i].note = "backlog"
			}
		}
		d.dev.OfflineFrom, d.dev.OfflineUntil = d.p.WallOf(from), back
		d.dev.Traits = append(d.dev.Traits, fmt.Sprintf("offline %v", time.Duration(length)*time.Millisecond))
	}
	if d.selected["schema"][idx] {
		for i := range pts {
			pts[i].renamed = pts[i].trueMs >= d.schemaAt
		}
		d.dev.Traits = append(d.dev.Traits, "schema change")
	}
	if d.skew == scenario.SkewFuture || d.skew == scenario.SkewEpoch {
		for i := range pts {
			pts[i].glitch = d.rng.Float64() < float64(d.sc.Misbehaviour.ClockSkew.Glitches)
		}
	}
	if d.grp.Format == scenario.FormatNumber {
		d.numberMessages(pts)
	} else {
		d.structuredMessages(pts)
	}
	if mf := d.sc.Misbehaviour.Malformed; mf != nil && mf.Messages > 0 {
		d.insertMalformed(float64(mf.Messages), mf.Oversized)
	}
}

// eventMs is the event-time offset reached after wall time w.
func (d *deviceGen) eventMs(w time.Duration) int64 {
	return int64(float64(w.Milliseconds()) * d.sc.Speed)
}

func (d *deviceGen) nextID() string {
	d.nid++
	return d.dev.Name + "-" + strconv.Itoa(d.nid)
}

func (d *deviceGen) metrics(devMs int64, renamed bool) []Metric {
	ms := make([]Metric, len(d.grp.Metrics))
	for i, name := range d.grp.Metrics {
		v := value(name, d.p.Base+devMs, d.rng)
		if renamed {
			if to, ok := d.sc.Misbehaviour.SchemaChange.Rename[name]; ok {
				name = to
			}
		}
		ms[i] = Metric{Name: name, Value: v}
	}
	return ms
}

// value is a plausible reading: a daily-ish wave around a level that
// depends on the metric's name, plus noise, rounded to hundredths so the
// decimal text and the float64 agree.
func value(name string, ts int64, rng *rand.Rand) float64 {
	h := fnv.New32a()
	h.Write([]byte(name))
	s := h.Sum32()
	level := float64(s%1000)/10 + 5
	amp := float64(s%70)/10 + 1
	period := float64(3600_000 * (1 + s%5))
	v := level + amp*math.Sin(2*math.Pi*float64(ts)/period) + rng.NormFloat64()*0.3
	return math.Round(v*100) / 100
}

func (d *deviceGen) structuredMessages(pts []point) {
	topicTmpl := TopicJSON
	if d.grp.Format == scenario.FormatCBOR {
		topicTmpl = TopicCBOR
	}
	topic := expand(topicTmpl, d.dev.Name, "")
	msgs := make([]Message, 0, len(pts))
	for _, pt := range pts {
		r := &Reading{ID: d.nextID(), TS: d.p.Base + pt.devMs, Metrics: d.metrics(pt.devMs, pt.renamed)}
		m := Message{Topic: topic, SendAt: pt.sendAt, Kind: KindReading, Reading: r, Note: pt.note}
		if pt.glitch {
			m.Kind, m.Note, m.Code = KindGlitch, "clock-"+d.skew, window.CodeTimePast
			ts := int64(86_400_000) // 1970-01-02
			if d.skew == scenario.SkewFuture {
				ts, m.Code = d.p.Start.Add(365*24*time.Hour).UnixMilli(), window.CodeTimeFuture
			}
			m.Payload = d.encode(&Reading{ID: r.ID, TS: ts, Metrics: r.Metrics})
			m.Reading = nil
		}
		msgs = append(msgs, m)
	}
	mb := d.sc.Misbehaviour
	delayMs := d.sc.Agent.Window.WatermarkDelay.Milliseconds()
	if oo := mb.OutOfOrder; oo != nil {
		for i := 0; i+1 < len(msgs); i++ {
			a, b := &msgs[i], &msgs[i+1]
			if a.Kind != KindReading || b.Kind != KindReading || d.rng.Float64() >= float64(oo.Readings) {
				continue
			}
			if b.Reading.TS-a.Reading.TS > delayMs/2 {
				continue // keep the swap well inside the watermark delay
			}
			a.Reading, b.Reading = b.Reading, a.Reading
			a.Note, b.Note = "out-of-order", "out-of-order"
			i++
		}
	}
	if lt := mb.Late; lt != nil && (lt.Within > 0 || lt.Beyond > 0) {
		w := d.sc.Agent.Window
		sizeMs, lateMs := w.Size.Milliseconds(), w.AllowedLateness.Milliseconds()
		out := make([]Message, 0, len(msgs)+len(msgs)/10)
		maxTS := int64(math.MinInt64)
		for _, m := range msgs {
			out = append(out, m)
			if m.Kind != KindReading {
				continue
			}
			maxTS = max(maxTS, m.Reading.TS)
			x := d.rng.Float64()
			var back int64
			switch {
			case x < float64(lt.Within):
				// Inside the lateness: the window's end is after the
				// horizon maxTS − delay − lateness by at least a quarter
				// of the lateness, so it is merged (a revision when the
				// window was already emitted).
				back = delayMs + lateMs/2 + d.rng.Int64N(lateMs/4+1)
			case x < float64(lt.Within+lt.Beyond):
				// Far beyond: the window ended more than a window before
				// the horizon, so it goes to the late table.
				back = delayMs + lateMs + 2*sizeMs + d.rng.Int64N(sizeMs+1)
			default:
				continue
			}
			ts := d.unique(maxTS - back)
			note := "late-within"
			if back > delayMs+lateMs {
				note = "late-beyond"
			}
			r := &Reading{ID: d.nextID(), TS: ts, Metrics: d.metrics(ts-d.p.Base, false)}
			out = append(out, Message{Topic: topic, SendAt: m.SendAt, Kind: KindReading, Reading: r, Note: note})
		}
		msgs = out
	}
	if dup := mb.Duplicates; dup != nil && dup.Readings > 0 {
		type ins struct {
			at int
			m  Message
		}
		var adds []ins
		for i, m := range msgs {
			if m.Kind == KindReading && d.rng.Float64() < float64(dup.Readings) {
				at := min(i+1+d.rng.IntN(dup.MaxGap+1), len(msgs))
				c := m
				c.Retry, c.Note = true, "retry"
				adds = append(adds, ins{at, c})
			}
		}
		if len(adds) > 0 {
			slices.SortStableFunc(adds, func(a, b ins) int { return a.at - b.at })
			out := make([]Message, 0, len(msgs)+len(adds))
			k := 0
			for i := 0; i <= len(msgs); i++ {
				for k < len(adds) && adds[k].at == i {
					c := adds[k].m
					c.SendAt = out[len(out)-1].SendAt
					out = append(out, c)
					k++
				}
				if i < len(msgs) {
					out = append(out, msgs[i])
				}
			}
			msgs = out
		}
	}
	// Retries share their original's payload bytes: encode once, here.
	for i := range msgs {
		if msgs[i].Payload == nil && !msgs[i].Retry {
			msgs[i].Payload = d.encode(msgs[i].Reading)
		}
	}
	for i := range msgs {
		if msgs[i].Retry {
			for j := i - 1; j >= 0; j-- {
				if msgs[j].Reading == msgs[i].Reading && !msgs[j].Retry {
					msgs[i].Payload = msgs[j].Payload
					break
				}
			}
		}
	}
	d.dev.Messages = msgs
}

func (d *deviceGen) numberMessages(pts []point) {
	msgs := make([]Message, 0, len(pts)*len(d.grp.Metrics))
	for _, pt := range pts {
		for _, m := range d.metrics(pt.devMs, false) {
			r := &Reading{PTime: true, Metrics: []Metric{m}}
			msgs = append(msgs, Message{
				Topic:   expand(TopicNumber, d.dev.Name, m.Name),
				Payload: []byte(strconv.FormatFloat(m.Value, 'f', -1, 64)),
				SendAt:  pt.sendAt, Kind: KindReading, Reading: r, Note: pt.note,
			})
		}
	}
	d.dev.Messages = msgs
}

// unique returns ts, or the next free millisecond after it, so no two
// readings of a device share an event time and first/last are unambiguous.
func (d *deviceGen) unique(ts int64) int64 {
	for d.used[ts-d.p.Base] {
		ts++
	}
	d.used[ts-d.p.Base] = true
	return ts
}

func (d *deviceGen) insertMalformed(frac float64, oversized bool) {
	msgs := d.dev.Messages
	out := make([]Message, 0, len(msgs)+int(float64(len(msgs))*frac)+1)
	n := 0
	for _, m := range msgs {
		out = append(out, m)
		if d.rng.Float64() >= frac {
			continue
		}
		kinds := 5
		if oversized {
			kinds = 6
		}
		bad := d.malformed(n%kinds, m)
		bad.SendAt = m.SendAt
		out = append(out, bad)
		n++
	}
	d.dev.Messages = out
}

func expand(tmpl, device, metric string) string {
	b := make([]byte, 0, len(tmpl)+len(device))
	for i := 0; i < len(tmpl); {
		switch {
		case hasAt(tmpl, i, "{device}"):
			b = append(b, device...)
			i += len("{device}")
		case hasAt(tmpl, i, "{metric}"):
			b = append(b, metric...)
			i += len("{metric}")
		default:
			b = append(b, tmpl[i])
			i++
		}
	}
	return string(b)
}

func hasAt(s string, i int, sub string) bool { return len(s)-i >= len(sub) && s[i:i+len(sub)] == sub }

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// EventTimeSpread is how far apart in event time the devices got: the
// latest minus the earliest event time among each device's last reading
// the broker acknowledged (sent[d] of device d's messages, as
// Publisher.Sent returns; producer retries, which repeat an earlier
// reading, do not count). Devices stamped by the agent (plain numbers),
// and those that sent no reading, are left out.
func (p *Plan) EventTimeSpread(sent []int) time.Duration {
	lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
	for d := range p.Devices {
		msgs := p.Devices[d].Messages[:min(sent[d], len(p.Devices[d].Messages))]
		for i := len(msgs) - 1; i >= 0; i-- {
			if r := msgs[i].Reading; msgs[i].Kind == KindReading && r != nil && !r.PTime && !msgs[i].Retry {
				lo, hi = min(lo, r.TS), max(hi, r.TS)
				break
			}
		}
	}
	if lo > hi {
		return 0
	}
	return time.Duration(hi-lo) * time.Millisecond
}
