package agent

import (
	"fmt"
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
)

// Tables gives read-only views of the agent's tables. The running agent
// serves them on /inspect/…; `edgeagent inspect` opens the files itself when
// the agent is stopped.
type Tables struct {
	Bronze *buffer.Bronze
	State  *bolt.DB
	Subs   []*topic.Template
}

// NewTables builds the views over opened files.
func NewTables(cfg *config.Config, bronze *buffer.Bronze, state *bolt.DB) (*Tables, error) {
	t := &Tables{Bronze: bronze, State: state}
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
	Reason     string    `json:"reason,omitempty"`
	Payload    string    `json:"payload,omitempty"`
	PayloadLen int       `json:"payload_bytes"`
}

// OutboxRow is one unsent outbox entry.
type OutboxRow struct {
	Seq       uint64          `json:"seq"`
	Kind      string          `json:"kind"`
	EmittedAt time.Time       `json:"emitted_at"`
	Aggregate *wire.Aggregate `json:"aggregate,omitempty"`
	Alert     *wire.Alert     `json:"alert,omitempty"`
	Bytes     int             `json:"bytes"`
}

// Inspect implements status.Source's table views.
func (t *Tables) Inspect(table string, q status.Query) (any, error) {
	if q.Limit <= 0 {
		q.Limit = 100
	}
	switch table {
	case "bronze":
		return t.bronze(q)
	case "late":
		var rows []window.Late
		err := t.State.View(func(tx *bolt.Tx) error {
			var err error
			rows, err = window.ReadLate(tx, window.Filter{Device: q.Device, From: q.From, To: q.To}, q.Limit)
			return err
		})
		return nonNil(rows), err
	case "deadletter":
		var rows []window.DeadLetter
		err := t.State.View(func(tx *bolt.Tx) error {
			var err error
			rows, err = window.ReadDeadLetters(tx, window.Filter{Device: q.Device, From: q.From, To: q.To, Reason: q.Reason}, q.Limit)
			return err
		})
		return nonNil(rows), err
	case "outbox":
		return t.outbox(q)
	}
	return nil, fmt.Errorf("%w: %q", status.ErrUnknownTable, table)
}

func nonNil[T any](rows []T) []T {
	if rows == nil {
		return []T{}
	}
	return rows
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
		row := BronzeRow{Seq: r.Seq, Kind: r.Kind.String(), ReceivedAt: at, Topic: r.Topic, Device: dev,
			QoS: r.QoS, Retained: r.Retained, Reason: r.Reason, PayloadLen: len(r.Payload)}
		p := r.Payload
		if len(p) > 512 {
			p = p[:512]
		}
		if utf8.Valid(p) {
			row.Payload = string(p)
		} else {
			row.Payload = fmt.Sprintf("%x", p)
		}
		rows = append(rows, row)
		return len(rows) < q.Limit
	})
	return rows, err
}

func (t *Tables) outbox(q status.Query) ([]OutboxRow, error) {
	rows := []OutboxRow{}
	err := t.State.View(func(tx *bolt.Tx) error {
		entries, err := outbox.Read(tx, q.Seq, q.Limit)
		if err != nil {
			return err
		}
		for _, e := range entries {
			row := OutboxRow{Seq: e.Seq, EmittedAt: time.UnixMilli(e.EmittedAt).UTC(), Bytes: len(e.Data)}
			switch e.Kind {
			case outbox.KindAggregate:
				row.Kind = "aggregate"
				var a wire.Aggregate
				if err := wire.DecodeAggregate(e.Data, &a); err != nil {
					return fmt.Errorf("outbox row %d: %w", e.Seq, err)
				}
				if q.Device != "" && a.Device != q.Device {
					continue
				}
				row.Aggregate = &a
			case outbox.KindAlert:
				row.Kind = "alert"
				var a wire.Alert
				if err := wire.DecodeAlert(e.Data, &a); err != nil {
					return fmt.Errorf("outbox row %d: %w", e.Seq, err)
				}
				if q.Device != "" && a.Device != q.Device {
					continue
				}
				row.Alert = &a
			default:
				row.Kind = "local"
			}
			rows = append(rows, row)
		}
		return nil
	})
	return rows, err
}
