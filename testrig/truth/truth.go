// Package truth computes, from what the simulator sent and in each device's
// send order, what a correct agent must deliver: the final value of every
// event-time window, the totals of processing-time series, and how many
// readings end in the late, duplicate and dead-letter counters.
//
// It is a second, independent statement of the window semantics of
// docs/windows.md (DESIGN invariants 4 and 5): per-device watermark = the
// device's max event time − watermark_delay; a reading is merged while its
// window's end is after max event time − delay − allowed_lateness at the
// moment it is processed, otherwise it is late; duplicates are readings
// whose event id the device already had accepted within that horizon.
//
// # Caveats
//
//   - Plain-number readings are windowed by the agent's received-at, which
//     the rig cannot know to the millisecond. They are checked as totals per
//     (device, metric) instead of per window.
//   - Readings are assumed to reach the agent in each device's send order.
//     The simulator keeps each device on one connection, and after a
//     broker restart holds new publishes until paho's resends of what was
//     in flight are acknowledged, which makes that so.
package truth

import (
	"math"
	"sort"
	"time"

	"github.com/edgeagent/edgeagent/testrig/scenario"
	"github.com/edgeagent/edgeagent/testrig/sim"
	"github.com/edgeagent/edgeagent/window"
)

// Settings are the agent's window settings the truth depends on.
type Settings struct {
	Size, Slide     time.Duration
	WatermarkDelay  time.Duration
	AllowedLateness time.Duration
}

// Key identifies a window: the receiver's upsert key without the gateway.
type Key struct {
	Device, Metric string
	Start          int64
}

// SeriesKey identifies a (device, metric) series.
type SeriesKey struct {
	Device, Metric string
}

// Window is the expected final content of one window.
type Window struct {
	Count                      uint64
	Sum, Min, Max, First, Last float64
	firstT, lastT              int64
	// LastSent is when the last reading merged into the window was
	// published (unix ns; 0 when unknown).
	LastSent int64
}

// Mean is Sum / Count.
func (w *Window) Mean() float64 { return w.Sum / float64(w.Count) }

// Series is the expected total of a processing-time series.
type Series struct {
	Count         uint64
	Sum, Min, Max float64
}

// Expected is everything the agent should deliver for a run.
type Expected struct {
	Settings Settings
	Windows  map[Key]*Window
	// PTime are the processing-time (plain-number) series.
	PTime map[SeriesKey]*Series
	// Messages, Readings: what was sent (Readings excludes retries and
	// dead-lettered messages).
	Messages, Readings uint64
	// Late counts late (reading, metric, window) entries, as the agent's
	// late counter does; LateReadings the readings with at least one.
	Late, LateReadings uint64
	// Duplicates counts readings dropped as already seen.
	Duplicates uint64
	// Dead counts messages the agent must dead-letter, by sim.Kind name
	// and note ("malformed/no-ts").
	Dead       uint64
	DeadByNote map[string]uint64
	// LateRows and DeadRows are the rows the agent's late and dead-letter
	// tables must hold, with how many of each (a retry of a late reading
	// is late again).
	LateRows map[LateRow]int
	DeadRows map[DeadRow]int
	// Revisable counts windows that receive data after the watermark
	// passed them: each must arrive with rev > 1. It is a lower bound:
	// idle closes emit windows early at points that depend on wall time.
	Revisable int
}

// LateRow is a late-table row as the rig compares it.
type LateRow struct {
	Device, Metric         string
	EventTime, WindowStart int64 // Unix ms
	Value                  float64
}

// DeadRow is a dead-letter row as the rig compares it: the topic, the
// payload's first window.DeadLetterPayloadBytes, which is what the table
// keeps, and the reason code.
type DeadRow struct {
	Topic, Payload string
	Code           string // the reason code (window.Code*)
}

// devState mirrors the agent's per-device state.
type devState struct {
	hasMax      bool
	maxT        int64
	finalBefore int64
	// dedup maps an event id to the end of its reading's last window.
	dedup map[string]int64
	// emitted is true for windows the watermark has passed (their first
	// emission) and no later data has reached yet; open lists the windows
	// the watermark has not passed.
	emitted map[Key]bool
	open    []Key
}

const noTime = math.MinInt64

// Compute derives the expectation from the plan. sent, when not nil, is
// per device how many of its messages were actually sent (a prefix, as the
// publisher reports it); sentAt, when not nil, the publish times.
func Compute(plan *sim.Plan, sent []int, sentAt [][]int64, s Settings) *Expected {
	if s.Slide == 0 {
		s.Slide = s.Size
	}
	e := &Expected{Settings: s, Windows: map[Key]*Window{}, PTime: map[SeriesKey]*Series{}, DeadByNote: map[string]uint64{},
		LateRows: map[LateRow]int{}, DeadRows: map[DeadRow]int{}}
	sizeMs, slideMs := s.Size.Milliseconds(), s.Slide.Milliseconds()
	delayMs, lateMs := s.WatermarkDelay.Milliseconds(), s.AllowedLateness.Milliseconds()
	for d := range plan.Devices {
		dev := &plan.Devices[d]
		n := len(dev.Messages)
		if sent != nil {
			n = min(n, sent[d])
		}
		st := &devState{finalBefore: noTime, dedup: map[string]int64{}, emitted: map[Key]bool{}}
		for i := 0; i < n; i++ {
			m := &dev.Messages[i]
			e.Messages++
			var at int64
			if sentAt != nil {
				at = sentAt[d][i]
			}
			if m.Kind != sim.KindReading {
				e.Dead++
				e.DeadByNote[m.Kind.String()+"/"+m.Note]++
				e.DeadRows[DeadRow{m.Topic, string(m.Payload[:min(len(m.Payload), window.DeadLetterPayloadBytes)]), m.Code}]++
				continue
			}
			if !m.Retry {
				e.Readings++
			}
			r := m.Reading
			if r.PTime {
				for _, mt := range r.Metrics {
					k := SeriesKey{dev.Name, mt.Name}
					ser := e.PTime[k]
					if ser == nil {
						ser = &Series{Min: mt.Value, Max: mt.Value}
						e.PTime[k] = ser
					}
					ser.Count++
					ser.Sum += mt.Value
					ser.Min = math.Min(ser.Min, mt.Value)
					ser.Max = math.Max(ser.Max, mt.Value)
				}
				continue
			}
			if le, ok := st.dedup[r.ID]; ok && le > st.finalBefore {
				e.Duplicates++
				continue
			}
			t := r.TS
			last := floorDiv(t, slideMs) * slideMs
			accepted, late := false, false
			for _, mt := range r.Metrics {
				for start := last; start > t-sizeMs; start -= slideMs {
					end := start + sizeMs
					if end <= st.finalBefore {
						e.Late++
						e.LateRows[LateRow{dev.Name, mt.Name, t, start, mt.Value}]++
						late = true
						continue
					}
					k := Key{dev.Name, mt.Name, start}
					w := e.Windows[k]
					if w == nil {
						w = &Window{Min: mt.Value, Max: mt.Value, First: mt.Value, Last: mt.Value, firstT: t, lastT: t}
						e.Windows[k] = w
					} else {
						w.Min = math.Min(w.Min, mt.Value)
						w.Max = math.Max(w.Max, mt.Value)
						if t < w.firstT {
							w.First, w.firstT = mt.Value, t
						}
						if t > w.lastT {
							w.Last, w.lastT = mt.Value, t
						}
					}
					w.Count++
					w.Sum += mt.Value
					w.LastSent = max(w.LastSent, at)
					if em, seen := st.emitted[k]; !seen {
						st.emitted[k] = false
						st.open = append(st.open, k)
					} else if em {
						e.Revisable++
						st.emitted[k] = false // count each window once
					}
					accepted = true
				}
			}
			if late {
				e.LateReadings++
			}
			if accepted {
				st.dedup[r.ID] = last + sizeMs
			}
			if !st.hasMax || t > st.maxT {
				st.hasMax, st.maxT = true, t
				st.finalBefore = max(st.finalBefore, t-delayMs-lateMs)
			}
			// Windows the watermark has passed are emitted by now; data
			// that reaches them later makes a revision.
			wm := st.maxT - delayMs
			kept := st.open[:0]
			for _, k := range st.open {
				if k.Start+sizeMs <= wm {
					st.emitted[k] = true
				} else {
					kept = append(kept, k)
				}
			}
			st.open = kept
		}
	}
	return e
}

// Keys returns the expected windows' keys, sorted.
func (e *Expected) Keys() []Key {
	keys := make([]Key, 0, len(e.Windows))
	for k := range e.Windows {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return Less(keys[i], keys[j]) })
	return keys
}

// Less orders keys by device, metric, start.
func Less(a, b Key) bool {
	if a.Device != b.Device {
		return a.Device < b.Device
	}
	if a.Metric != b.Metric {
		return a.Metric < b.Metric
	}
	return a.Start < b.Start
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// Transition is an alert rule's state change, as the agent publishes it
// locally: fired or cleared, keyed by the window that made it.
type Transition struct {
	Rule, Device string
	Start        int64
	State        string // fired | cleared
}

// Transitions are the transitions the agent's alert rules must make over
// the expected windows, in the order of the agent's evaluation (each
// device's windows of the rule's metric by start), with the rules run as
// the rig configures them: every change sent (min_interval 0s), none
// folded. It is valid when every window is emitted once with its final
// value (no late data, no idle close before the last reading), as in the
// rig's alerts scenario.
func (e *Expected) Transitions(rules []scenario.AlertRule) []Transition {
	type series struct{ device, metric string }
	starts := map[series][]int64{}
	for k := range e.Windows {
		s := series{k.Device, k.Metric}
		starts[s] = append(starts[s], k.Start)
	}
	keys := make([]series, 0, len(starts))
	for s := range starts {
		keys = append(keys, s)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].device < keys[j].device || keys[i].device == keys[j].device && keys[i].metric < keys[j].metric
	})
	var out []Transition
	for _, r := range rules {
		when, clear := r.Conditions()
		for _, s := range keys {
			if !r.Matches(s.device, s.metric) {
				continue
			}
			ss := starts[s]
			sort.Slice(ss, func(i, j int) bool { return ss[i] < ss[j] })
			firing, streak := false, 0
			for _, start := range ss {
				w := e.Windows[Key{s.device, s.metric, start}]
				switch {
				case !firing && when.Holds(w.aggregate(when.Aggregate)):
					if streak++; streak >= r.For {
						firing, streak = true, 0
						out = append(out, Transition{r.Name, s.device, start, "fired"})
					}
				case !firing:
					streak = 0
				case clear.Holds(w.aggregate(clear.Aggregate)) && !when.Holds(w.aggregate(when.Aggregate)):
					// Hysteresis: only clear_when clears, and not while
					// when still holds (an alert on two aggregates).
					firing = false
					out = append(out, Transition{r.Name, s.device, start, "cleared"})
				}
			}
		}
	}
	return out
}

// aggregate is the window's named aggregate.
func (w *Window) aggregate(name string) float64 {
	switch name {
	case "count":
		return float64(w.Count)
	case "sum":
		return w.Sum
	case "min":
		return w.Min
	case "max":
		return w.Max
	case "mean":
		return w.Mean()
	case "first":
		return w.First
	default:
		return w.Last
	}
}
