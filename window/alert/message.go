package alert

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"

	"github.com/edgeagent/edgeagent/uplink/wire"
)

// Local message types, the "type" field of every local JSON message.
const (
	TypeAlert     = "alert"
	TypeSummary   = "summary"
	TypeAggregate = "aggregate"
)

// Transition states, as in wire.Alert.State.
const (
	StateFired   = "fired"
	StateCleared = "cleared"
)

// AlertMessage is the JSON payload of a local alert message, published on
// local_publish.alerts_topic. Field names follow the wire format's alert.
type AlertMessage struct {
	Type    string `json:"type"` // "alert"
	Gateway string `json:"gateway"`
	Rule    string `json:"rule"`
	Device  string `json:"device"`
	Metric  string `json:"metric"`
	// Start and End bound the window (Unix ms) whose evaluation made the
	// transition.
	Start    int64  `json:"start"`
	End      int64  `json:"end"`
	State    string `json:"state"` // "fired" or "cleared"
	Severity string `json:"severity,omitempty"`
	// Value is the window's aggregate the condition compared; null when it
	// is not a finite number.
	Value *float64 `json:"value"`
	// Condition is the condition that held: the rule's when for fired,
	// its clear_when for cleared.
	Condition string `json:"condition"`
	// Key is the idempotency key, the same as the uplinked alert's.
	Key        string `json:"key"`
	Suppressed uint32 `json:"suppressed"`
	// EmittedAt is the logged clock (Unix ms) when the window was emitted.
	EmittedAt int64 `json:"emitted_at"`
}

// SummaryMessage replaces the local alert messages of a storm: more than
// local_publish.storm_threshold transitions of one rule within
// local_publish.storm_window of its first. It is published on the alerts
// topic with {device} = "_summary".
type SummaryMessage struct {
	Type      string `json:"type"` // "summary"
	Gateway   string `json:"gateway"`
	Rule      string `json:"rule"`
	Metric    string `json:"metric"`
	Severity  string `json:"severity,omitempty"`
	EmittedAt int64  `json:"emitted_at"`
	// Transitions = Fired + Cleared, all sent to the uplink one by one.
	Transitions uint32 `json:"transitions"`
	Fired       uint32 `json:"fired"`
	Cleared     uint32 `json:"cleared"`
	// Devices lists the devices of the first transitions (at most 100),
	// in emission order.
	Devices []string `json:"devices"`
	// Key identifies the storm: gateway/rule/_summary/<the logged time of
	// its first transition>, with /Part appended from part 2 on.
	Key string `json:"key"`
	// Part numbers the summaries of one storm (from 2; absent for the
	// first): once a summary went out, the next counts only the
	// transitions after it, under its own key, and is held until the
	// storm's window ends.
	Part uint32 `json:"part,omitempty"`
}

// AggregateMessage is the JSON payload of a republished aggregate, on
// local_publish.aggregates_topic. Field names are the wire format's; an
// optional aggregate is absent when window.aggregates does not configure
// it or it is not a finite number.
type AggregateMessage struct {
	Type     string   `json:"type"` // "aggregate"
	Gateway  string   `json:"gateway"`
	Device   string   `json:"device"`
	Metric   string   `json:"metric"`
	Start    int64    `json:"start"`
	End      int64    `json:"end"`
	Count    uint64   `json:"count"`
	Sum      *float64 `json:"sum,omitempty"`
	Min      *float64 `json:"min,omitempty"`
	Max      *float64 `json:"max,omitempty"`
	Mean     *float64 `json:"mean,omitempty"`
	First    *float64 `json:"first,omitempty"`
	Last     *float64 `json:"last,omitempty"`
	Rev      uint32   `json:"rev"`
	Key      string   `json:"key"`
	ProcTime bool     `json:"ptime,omitempty"`
}

// AlertKey builds the idempotency key of a transition:
// gateway/rule/device/window start/state.
func AlertKey(gateway, rule, device string, start int64, state string) string {
	return fmt.Sprintf("%s/%s/%s/%d/%s", gateway, rule, device, start, state)
}

// finite returns &v, or nil when v is NaN or infinite (JSON has no such
// numbers, and a marshal error would fail the window batch for ever).
func finite(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

func finitePtr(p *float64) *float64 {
	if p == nil {
		return nil
	}
	return finite(*p)
}

// AggregateMessageOf is a's local message: its JSON form, also the one
// `edgeagent inspect outbox` shows.
func AggregateMessageOf(gateway string, a *wire.Aggregate) AggregateMessage {
	return AggregateMessage{
		Type: TypeAggregate, Gateway: gateway, Device: a.Device, Metric: a.Metric,
		Start: a.Start, End: a.End, Count: a.Count,
		Sum: finitePtr(a.Sum), Min: finitePtr(a.Min), Max: finitePtr(a.Max), Mean: finitePtr(a.Mean),
		First: finitePtr(a.First), Last: finitePtr(a.Last),
		Rev: a.Rev, Key: a.Key, ProcTime: a.ProcTime,
	}
}

// marshal encodes a local message as json.Marshal does, except that <, >
// and & stay literal: the messages go to PLCs and HMIs, never into HTML,
// and a condition should read "mean > 80", not "mean \u003e 80".
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("alert: encode local message: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil // Encode ends each value with a newline
}
