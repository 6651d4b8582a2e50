package alert

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/config"
	"github.com/edgeagent/edgeagent/uplink/local"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// t0 is the start of every generated stream (Unix ms).
var t0 = time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC).UnixMilli()

const minute = int64(60_000)

func testLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// openDB opens a real state database in a temp dir (or at path) and checks
// its consistency when the test ends.
func openDB(t testing.TB, path string) *bolt.DB {
	t.Helper()
	return openDBOpts(t, path, false)
}

// openDBOpts is openDB, optionally without fsync (for tests that check
// content, not durability, and commit thousands of transactions).
func openDBOpts(t testing.TB, path string, noSync bool) *bolt.DB {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "state.db")
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 10 * time.Second, NoSync: noSync})
	if err != nil {
		t.Fatalf("open state db: %v", err)
	}
	t.Cleanup(func() {
		err := db.View(func(tx *bolt.Tx) error {
			for err := range tx.Check() {
				return err
			}
			return nil
		})
		if err != nil {
			t.Errorf("state db inconsistent: %v", err)
		}
		db.Close()
	})
	return db
}

// overheating is the rule of the issue, with min_interval 0 unless a test
// sets it.
func overheating() config.AlertRule {
	return config.AlertRule{
		Name: "overheating", Metric: "temperature", Devices: "press-*",
		When: "mean > 80", For: 2, ClearWhen: "mean < 75", Severity: "high",
		Actions: []string{"uplink", "local"},
	}
}

func testConfig(rules ...config.AlertRule) Config {
	return Config{
		Gateway: "gw1",
		Rules:   rules,
		LocalPublish: config.LocalPublish{
			AlertsTopic:    "edgeagent/{gateway_id}/alerts/{device}",
			StormThreshold: 20,
		},
		Logger: testLogger(),
	}
}

func newEngine(t testing.TB, db *bolt.DB, cfg Config) *Engine {
	t.Helper()
	e, err := New(db, cfg)
	if err != nil {
		t.Fatalf("new engine: %v", err)
	}
	return e
}

// call is one Emitted call.
type call struct {
	a  wire.Aggregate
	at int64
}

// win builds the aggregate of minute window i of device/metric whose
// readings all equal v (so every aggregate is v), emitted 5s after its end.
func win(device, metric string, i int, v float64, rev uint32) call {
	start := t0 + int64(i)*minute
	a := wire.Aggregate{
		Device: device, Metric: metric, Start: start, End: start + minute, Count: 4,
		Sum: wire.F(4 * v), Min: wire.F(v), Max: wire.F(v), Mean: wire.F(v), First: wire.F(v), Last: wire.F(v),
		Rev: rev, Key: wire.AggregateKey("gw1", device, metric, start, rev),
	}
	return call{a: a, at: start + minute + 5_000}
}

// at returns c emitted at logged time ms instead.
func (c call) atTime(ms int64) call { c.at = ms; return c }

// emit runs calls through e in one transaction.
func emit(t testing.TB, db *bolt.DB, e *Engine, calls ...call) {
	t.Helper()
	err := db.Update(func(tx *bolt.Tx) error {
		for i := range calls {
			if err := e.Emitted(tx, &calls[i].a, calls[i].at); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("emit: %v", err)
	}
}

func readOutbox(t testing.TB, db *bolt.DB) []outbox.Entry {
	t.Helper()
	var out []outbox.Entry
	err := db.View(func(tx *bolt.Tx) error {
		var err error
		out, err = outbox.Read(tx, 0, 1<<30)
		return err
	})
	if err != nil {
		t.Fatalf("read outbox: %v", err)
	}
	return out
}

// outboxBytes serialises the whole outbox, for byte-for-byte comparison.
func outboxBytes(t testing.TB, db *bolt.DB) []byte {
	t.Helper()
	var buf bytes.Buffer
	for _, e := range readOutbox(t, db) {
		fmt.Fprintf(&buf, "%d|%d|%d|%x\n", e.Seq, e.Kind, e.EmittedAt, e.Data)
	}
	return buf.Bytes()
}

// alerts decodes the outbox's uplink alert rows.
func alerts(t testing.TB, db *bolt.DB) []wire.Alert {
	t.Helper()
	var out []wire.Alert
	for _, e := range readOutbox(t, db) {
		if e.Kind != outbox.KindAlert {
			continue
		}
		var a wire.Alert
		if err := wire.DecodeAlert(e.Data, &a); err != nil {
			t.Fatalf("decode alert row %d: %v", e.Seq, err)
		}
		out = append(out, a)
	}
	return out
}

// localRow is a decoded local outbox row.
type localRow struct {
	Seq  uint64
	Msg  local.Message
	JSON map[string]any
}

func locals(t testing.TB, db *bolt.DB) []localRow {
	t.Helper()
	var out []localRow
	for _, e := range readOutbox(t, db) {
		if e.Kind != outbox.KindLocal {
			continue
		}
		m, err := local.Decode(e.Data)
		if err != nil {
			t.Fatalf("decode local row %d: %v", e.Seq, err)
		}
		var j map[string]any
		if err := json.Unmarshal(m.Payload, &j); err != nil {
			t.Fatalf("local row %d payload %q: %v", e.Seq, m.Payload, err)
		}
		out = append(out, localRow{e.Seq, m, j})
	}
	return out
}

// transition is what a test expects of one uplink alert.
type transition struct {
	Device     string
	Window     int // minute index of the window start
	State      string
	Value      float64
	Suppressed uint32
}

func (tr transition) String() string {
	return fmt.Sprintf("%s@%d %s v=%g sup=%d", tr.Device, tr.Window, tr.State, tr.Value, tr.Suppressed)
}

// transitions summarises uplink alerts of rule for comparison.
func transitions(t testing.TB, as []wire.Alert, rule string) []string {
	t.Helper()
	var out []string
	for _, a := range as {
		if a.Rule != rule {
			continue
		}
		if want := AlertKey("gw1", a.Rule, a.Device, a.Start, a.State); a.Key != want {
			t.Fatalf("alert key %q, want %q", a.Key, want)
		}
		out = append(out, transition{a.Device, int((a.Start - t0) / minute), a.State, a.Value, a.Suppressed}.String())
	}
	return out
}

func strs(ts ...transition) []string {
	out := make([]string, len(ts))
	for i, tr := range ts {
		out[i] = tr.String()
	}
	return out
}
