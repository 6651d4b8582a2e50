package agent

import (
	"encoding/json"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/cmd/edgeagent/status"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// The outbox view pages past rows its filters drop, shows aggregates and
// alerts under the wire format's names (a non-finite value as null, which
// JSON can encode), and refuses filters the table does not apply.
func TestInspectOutbox(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "state.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	base := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC).UnixMilli()
	sum := 21.5
	err = db.Update(func(tx *bolt.Tx) error {
		if err := outbox.Init(tx); err != nil {
			return err
		}
		// 150 rows of device a, then one aggregate and one alert of b.
		for i := range 150 {
			a := wire.Aggregate{Device: "a", Metric: "t", Start: base, End: base + 60_000, Count: 1, Rev: 1, Key: "k", Sum: &sum}
			if _, err := outbox.Append(tx, outbox.KindAggregate, base+int64(i), wire.AppendAggregate(nil, &a)); err != nil {
				return err
			}
		}
		nan := math.NaN()
		b := wire.Aggregate{Device: "b", Metric: "t", Start: base, End: base + 60_000, Count: 2, Rev: 3, Key: "kb", Sum: &nan}
		if _, err := outbox.Append(tx, outbox.KindAggregate, base+200, wire.AppendAggregate(nil, &b)); err != nil {
			return err
		}
		al := wire.Alert{Rule: "hot", Device: "b", Metric: "t", Start: base, State: "fired", Value: math.Inf(1), Key: "ka"}
		_, err := outbox.Append(tx, outbox.KindAlert, base+201, wire.AppendAlert(nil, &al))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	tables := &Tables{State: db, Gateway: "gw-1"}

	got, err := tables.Inspect("outbox", status.Query{Device: "b", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	rows := got.([]OutboxRow)
	if len(rows) != 2 || rows[0].Aggregate == nil || rows[1].Alert == nil {
		t.Fatalf("device b's rows behind 150 of device a: %+v", rows)
	}
	raw, err := json.Marshal(rows)
	if err != nil {
		t.Fatalf("rows with non-finite values must encode: %v", err)
	}
	var back []struct {
		Aggregate map[string]any `json:"aggregate"`
		Alert     map[string]any `json:"alert"`
	}
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	agg, al := back[0].Aggregate, back[1].Alert
	if agg["device"] != "b" || agg["rev"] != 3.0 || agg["gateway"] != "gw-1" || agg["sum"] != nil {
		t.Errorf("aggregate row %s", raw)
	}
	if v, ok := al["value"]; !ok || v != nil || al["rule"] != "hot" || al["state"] != "fired" {
		t.Errorf("alert row %s", raw)
	}

	got, err = tables.Inspect("outbox", status.Query{From: time.UnixMilli(base + 100), To: time.UnixMilli(base + 110), Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if rows := got.([]OutboxRow); len(rows) != 10 || rows[0].Seq != 101 {
		t.Errorf("emitted_at in [base+100, base+110): %d rows, first %+v", len(rows), rows[0])
	}
	got, err = tables.Inspect("outbox", status.Query{Limit: 120})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(got.([]OutboxRow)); n != 120 {
		t.Errorf("limit 120: %d rows", n)
	}

	for _, tc := range []struct {
		table string
		q     status.Query
	}{{"outbox", status.Query{Reason: "not_json"}}, {"bronze", status.Query{Reason: "not_json"}}, {"late", status.Query{Seq: 5}}, {"deadletter", status.Query{Seq: 5}}, {"deadletter", status.Query{Reason: "time-past"}}} {
		if _, err := tables.Inspect(tc.table, tc.q); !errors.Is(err, status.ErrBadQuery) {
			t.Errorf("%s with %+v: %v, want ErrBadQuery", tc.table, tc.q, err)
		}
	}
}

// The Bronze view shows the flags a record was stored with: retained, and
// the DUP of a redelivery (an audit had to read the file to see it).
func TestInspectBronzeShowsFlags(t *testing.T) {
	b, err := buffer.Open(filepath.Join(t.TempDir(), "bronze.db"), buffer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	at := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC).UnixNano()
	if err := b.Append([]buffer.Record{
		{Kind: buffer.KindMessage, ReceivedAt: at, Topic: "s/d1/t", QoS: 1, Payload: []byte("1")},
		{Kind: buffer.KindMessage, ReceivedAt: at, Topic: "s/d1/t", QoS: 1, Duplicate: true, Retained: true, Payload: []byte("1")},
	}); err != nil {
		t.Fatal(err)
	}
	got, err := (&Tables{Bronze: b, Gateway: "gw-1"}).Inspect("bronze", status.Query{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	rows := got.([]BronzeRow)
	if len(rows) != 2 || rows[0].Duplicate || rows[0].Retained || !rows[1].Duplicate || !rows[1].Retained {
		t.Fatalf("rows %+v, want the second a retained redelivery", rows)
	}
	raw, err := json.Marshal(rows[1])
	if err != nil || !strings.Contains(string(raw), `"duplicate":true`) {
		t.Fatalf("row %s (%v), want \"duplicate\":true", raw, err)
	}
}
