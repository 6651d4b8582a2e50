package agent

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/cmd/edgeagent/status"
	"github.com/edgeagent/edgeagent/config"
	"github.com/edgeagent/edgeagent/internal/topic"
	"github.com/edgeagent/edgeagent/uplink/wire"
	"github.com/edgeagent/edgeagent/window"
	"github.com/edgeagent/edgeagent/window/alert"
)

// Tables gives read-only views of the agent's tables. The running agent
// serves them on /inspect/…; `edgeagent inspect` opens the files itself when
// the agent is stopped.
type Tables struct {
	Bronze  *buffer.Bronze
	State   *bolt.DB
	Subs    []*topic.Template
	Gateway string
}

// NewTables builds the views over opened files.
func NewTables(cfg *config.Config, bronze *buffer.Bronze, state *bolt.DB) (*Tables, error) {
	t := &Tables{Bronze: bronze, State: state, Gateway: cfg.GatewayID}
	for i, s := range cfg.MQTT.Subscriptions {
		tp, err := s.Template()
		if err != nil {
			return nil, fmt.Errorf("mqtt.subscriptions[%d].topic: %w", i, err)
		}
		t.Subs = append(t.Subs, tp)
	}
	return t, nil
}

// BronzeRow is one Bronze record as shown by inspect.
type BronzeRow struct {
	Seq        uint64    `json:"seq"`
	Kind       string    `json:"kind"`
	ReceivedAt time.Time `json:"received_at"`
	Topic      string    `json:"topic,omitempty"`
	Device     string    `json:"device,omitempty"`
	QoS        byte      `json:"qos"`
	Retained   bool      `json:"retained,omitempty"`
	// Duplicate is the MQTT DUP flag: the broker or device sent it again.
	Duplicate  bool   `json:"duplicate,omitempty"`
	Reason     string `json:"reason,omitempty"`
	Payload    string `json:"payload,omitempty"`
	PayloadLen int    `json:"payload_bytes"`
}

// The rows of every table share one JSON style: snake_case names, times
// in RFC 3339 (UTC), payloads as text (hex when not UTF-8), and the
// aggregates and alerts under the wire format's names.

// LateRow is one late reading as shown by inspect.
type LateRow struct {
	Seq         uint64    `json:"seq"`
	Device      string    `json:"device"`
	Metric      string    `json:"metric"`
	EventTime   time.Time `json:"event_time"`
	WindowStart time.Time `json:"window_start"`
	// Value is null when it is not a finite number (JSON has none).
	Value *float64 `json:"value"`
	// Watermark is the device watermark the lateness was judged against.
	Watermark time.Time `json:"watermark"`
}

// OutboxRow is one unsent outbox entry.
type OutboxRow struct {
	Seq       uint64                  `json:"seq"`
	Kind      string                  `json:"kind"`
	EmittedAt time.Time               `json:"emitted_at"`
	Aggregate *alert.AggregateMessage `json:"aggregate,omitempty"`
	Alert     *OutboxAlert            `json:"alert,omitempty"`
	Bytes     int                     `json:"bytes"`
}

// OutboxAlert is an alert transition waiting in the outbox, under the wire
// format's names.
type OutboxAlert struct {
	Rule       string   `json:"rule"`
	Device     string   `json:"device"`
	Metric     string   `json:"metric"`
	Start      int64    `json:"start"`
	State      string   `json:"state"`
	Severity   string   `json:"severity,omitempty"`
	Value      *float64 `json:"value"`
	Key        string   `json:"key"`
	Suppressed uint32   `json:"suppressed,omitempty"`
}

// CheckReason refuses a dead-letter reason filter that is not a code: a
// typo would list nothing, which reads as "no such dead letters".
func CheckReason(code string) error {
	if code == "" || slices.Contains(window.Codes, code) {
		return nil
	}
	return fmt.Errorf("reason %q is not a dead-letter code (want one of %s)", code, strings.Join(window.Codes, ", "))
}

// Inspect implements status.Source's table views.
func (t *Tables) Inspect(table string, q status.Query) (any, error) {
	if q.Limit <= 0 {
		q.Limit = 100
	}
	// A filter the table does not apply is refused rather than ignored.
	if q.Reason != "" && table != "deadletter" {
		return nil, fmt.Errorf("%w: reason filters dead letters only", status.ErrBadQuery)
	}
	if q.Seq != 0 && (table == "late" || table == "deadletter") {
		return nil, fmt.Errorf("%w: seq applies to bronze and outbox only", status.ErrBadQuery)
	}
	if err := CheckReason(q.Reason); err != nil {
		return nil, fmt.Errorf("%w: %v", status.ErrBadQuery, err)
	}
	switch table {
	case "bronze":
		return t.bronze(q)
	case "late":
		var late []window.Late
		err := t.State.View(func(tx *bolt.Tx) error {
			var err error
			late, err = window.ReadLate(tx, window.Filter{Device: q.Device, From: q.From, To: q.To}, q.Limit)
			return err
		})
		rows := make([]LateRow, len(late))
		for i, l := range late {
			rows[i] = LateRow{Seq: l.Seq, Device: l.Device, Metric: l.Metric,
				EventTime: time.UnixMilli(l.EventTime).UTC(), WindowStart: time.UnixMilli(l.WindowStart).UTC(),
				Value: finite(l.Value), Watermark: time.UnixMilli(l.Watermark).UTC()}
		}
		return rows, err
	case "deadletter":
		var dead []window.DeadLetter
		err := t.State.View(func(tx *bolt.Tx) error {
			var err error
			dead, err = window.ReadDeadLetters(tx, window.Filter{Device: q.Device, From: q.From, To: q.To, Reason: q.Reason}, q.Limit)
			return err
		})
		rows := make([]status.DeadLetter, len(dead))
		for i := range dead {
			rows[i] = deadLetterRow(&dead[i])
		}
		return rows, err
	case "outbox":
		return t.outbox(q)
	}
	return nil, fmt.Errorf("%w: %q", status.ErrUnknownTable, table)
}

// deadLetterRow is a dead letter as inspect and /status.json show it.
func deadLetterRow(d *window.DeadLetter) status.DeadLetter {
	return status.DeadLetter{Seq: d.Seq, Topic: d.Topic, Device: d.Device,
		ReceivedAt: time.Unix(0, d.ReceivedAt).UTC(), Code: d.Code, Reason: d.Reason, Payload: payloadText(d.Payload, len(d.Payload))}
}

// payloadText is up to max bytes of p as text, or in hex when they are not
// UTF-8.
func payloadText(p []byte, max int) string {
	if len(p) > max {
		p = p[:max]
	}
	if utf8.Valid(p) {
		return string(p)
	}
	return fmt.Sprintf("%x", p)
}

// finite returns &v, or nil when v is NaN or infinite.
func finite(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

func (t *Tables) device(topicName string) string {
	for _, s := range t.Subs {
		if d, _, ok := s.Match(topicName); ok {
			return d
		}
	}
	return ""
}

func (t *Tables) bronze(q status.Query) ([]BronzeRow, error) {
	rows := []BronzeRow{}
	err := t.Bronze.Scan(max(q.Seq, 1), func(r buffer.Record) bool {
		at := time.Unix(0, r.ReceivedAt).UTC()
		if (!q.From.IsZero() && at.Before(q.From)) || (!q.To.IsZero() && !at.Before(q.To)) {
			return true
		}
		dev := t.device(r.Topic)
		if q.Device != "" && dev != q.Device {
			return true
		}
		rows = append(rows, BronzeRow{Seq: r.Seq, Kind: r.Kind.String(), ReceivedAt: at, Topic: r.Topic, Device: dev,
			QoS: r.QoS, Retained: r.Retained, Duplicate: r.Duplicate, Reason: r.Reason, Payload: payloadText(r.Payload, 512), PayloadLen: len(r.Payload)})
		return len(rows) < q.Limit
	})
	return rows, err
}

func (t *Tables) outbox(q status.Query) ([]OutboxRow, error) {
	rows := []OutboxRow{}
	err := t.State.View(func(tx *bolt.Tx) error {
		// Page through until limit rows pass the filters.
		for from := q.Seq; len(rows) < q.Limit; {
			entries, err := outbox.Read(tx, from, q.Limit)
			if err != nil || len(entries) == 0 {
				return err
			}
			from = entries[len(entries)-1].Seq + 1
			for _, e := range entries {
				if row, ok, err := t.outboxRow(e, q); err != nil {
					return err
				} else if ok && len(rows) < q.Limit {
					rows = append(rows, row)
				}
			}
		}
		return nil
	})
	return rows, err
}

// outboxRow is e's row, and whether it passes q's filters.
func (t *Tables) outboxRow(e outbox.Entry, q status.Query) (OutboxRow, bool, error) {
	at := time.UnixMilli(e.EmittedAt).UTC()
	if (!q.From.IsZero() && at.Before(q.From)) || (!q.To.IsZero() && !at.Before(q.To)) {
		return OutboxRow{}, false, nil
	}
	row := OutboxRow{Seq: e.Seq, EmittedAt: at, Bytes: len(e.Data)}
	switch e.Kind {
	case outbox.KindAggregate:
		row.Kind = "aggregate"
		var a wire.Aggregate
		if err := wire.DecodeAggregate(e.Data, &a); err != nil {
			return row, false, fmt.Errorf("outbox row %d: %w", e.Seq, err)
		}
		m := alert.AggregateMessageOf(t.Gateway, &a)
		row.Aggregate = &m
		return row, q.Device == "" || a.Device == q.Device, nil
	case outbox.KindAlert:
		row.Kind = "alert"
		var a wire.Alert
		if err := wire.DecodeAlert(e.Data, &a); err != nil {
			return row, false, fmt.Errorf("outbox row %d: %w", e.Seq, err)
		}
		row.Alert = &OutboxAlert{Rule: a.Rule, Device: a.Device, Metric: a.Metric, Start: a.Start, State: a.State,
			Severity: a.Severity, Value: finite(a.Value), Key: a.Key, Suppressed: a.Suppressed}
		return row, q.Device == "" || a.Device == q.Device, nil
	}
	row.Kind = "local"
	return row, q.Device == "", nil
}
