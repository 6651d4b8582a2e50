package window

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/internal/topic"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// t0 is the start of every generated stream.
var t0 = time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)

// openDB opens a real state database in a temp dir, with the agent's
// page size, and checks its consistency when the test ends.
func openDB(t testing.TB, path string, noSync bool) *bolt.DB {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "state.db")
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second, NoSync: noSync, PageSize: StatePageSize})
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

// openBronze opens a real Bronze log in a temp dir.
func openBronze(t testing.TB, path string) *buffer.Bronze {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "bronze.db")
	}
	b, err := buffer.Open(path, buffer.Options{})
	if err != nil {
		t.Fatalf("open bronze: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func mustTemplate(t testing.TB, s string) *topic.Template {
	t.Helper()
	tp, err := topic.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return tp
}

// testConfig is a small configuration: JSON telemetry with ts and id, a
// number topic, a CBOR topic.
func testConfig(t testing.TB) Config {
	return Config{
		Gateway: "gw1",
		Subscriptions: []Subscription{
			{Template: mustTemplate(t, "sensors/{device}/telemetry"), Format: FormatJSON},
			{Template: mustTemplate(t, "raw/{device}/{metric}"), Format: FormatNumber},
			{Template: mustTemplate(t, "cbor/{device}/data"), Format: FormatCBOR},
		},
		EventID:            "id",
		EventTime:          "ts",
		TimeFormat:         TimeAuto,
		Size:               time.Minute,
		WatermarkDelay:     5 * time.Second,
		AllowedLateness:    30 * time.Second,
		IdleTimeout:        2 * time.Minute,
		DeviceExpiry:       1000 * time.Hour,
		TriggerInterval:    time.Second,
		MaxRecordsPerBatch: 500,
		Logger:             slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

func msg(topic string, payload string, at time.Time) buffer.Record {
	return buffer.Record{Kind: buffer.KindMessage, Topic: topic, QoS: 1, ReceivedAt: at.UnixNano(), Payload: []byte(payload)}
}

func tick(at time.Time) buffer.Record {
	return buffer.Record{Kind: buffer.KindTick, ReceivedAt: at.UnixNano()}
}

// writeBronze writes recs to a Bronze log at dir/bronze.db, closes it and
// returns its path, for runs that each open it again.
// openBronzeCopy opens a copy of the log at path, for a run of its own:
// a stage records its revision floor in the log, so a second run with a
// fresh state database on the same file would be a run after the state
// was lost, with its revisions above the first run's.
func openBronzeCopy(t testing.TB, path string) (*buffer.Bronze, error) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(t.TempDir(), "bronze.db")
	if err := os.WriteFile(cp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return buffer.Open(cp, buffer.Options{})
}

func writeBronze(t testing.TB, dir string, recs []buffer.Record) string {
	t.Helper()
	path := filepath.Join(dir, "bronze.db")
	br := openBronze(t, path)
	appendAll(t, br, recs)
	if err := br.Close(); err != nil {
		t.Fatalf("close bronze: %v", err)
	}
	return path
}

func appendAll(t testing.TB, b *buffer.Bronze, recs []buffer.Record) {
	t.Helper()
	for len(recs) > 0 {
		n := min(len(recs), 2000)
		if err := b.Append(recs[:n]); err != nil {
			t.Fatalf("append bronze: %v", err)
		}
		recs = recs[n:]
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
	var buf bytes.Buffer
	for _, e := range readOutbox(t, db) {
		fmt.Fprintf(&buf, "%d|%d|%d|%x\n", e.Seq, e.Kind, e.EmittedAt, e.Data)
	}
	return buf.Bytes()
}

// outputBytes serialises every output of the stage — the outbox, then the
// late and dead-letter tables — for byte-for-byte comparison, and says how
// many late rows there are so a test can check its stream exercised them.
func outputBytes(t testing.TB, db *bolt.DB) (out []byte, lateRows int) {
	t.Helper()
	buf := bytes.NewBuffer(outboxBytes(t, db))
	err := db.View(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketLate, bucketDead} {
			fmt.Fprintf(buf, "%s\n", name)
			err := tx.Bucket(name).ForEach(func(k, v []byte) error {
				if string(name) == string(bucketLate) {
					lateRows++
				}
				fmt.Fprintf(buf, "%x|%x\n", k, v)
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), lateRows
}

func decodeOutbox(t testing.TB, db *bolt.DB) []wire.Aggregate {
	t.Helper()
	var out []wire.Aggregate
	for _, e := range readOutbox(t, db) {
		if e.Kind != outbox.KindAggregate {
			t.Fatalf("outbox entry %d has kind %d", e.Seq, e.Kind)
		}
		var a wire.Aggregate
		if err := wire.DecodeAggregate(e.Data, &a); err != nil {
			t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}

type winID struct {
	Device, Metric string
	Start          int64
}

// upsert applies the cloud's rule: keep the highest revision per window. It
// fails the test if one key carries two different contents.
func upsert(t testing.TB, aggs []wire.Aggregate) map[winID]wire.Aggregate {
	t.Helper()
	out := map[winID]wire.Aggregate{}
	byKey := map[string]wire.Aggregate{}
	for _, a := range aggs {
		if want := wire.AggregateKey("gw1", a.Device, a.Metric, a.Start, a.Rev); a.Key != want {
			t.Fatalf("key %q, want %q", a.Key, want)
		}
		if prev, ok := byKey[a.Key]; ok && fmt.Sprint(prev) != fmt.Sprint(a) {
			t.Fatalf("key %s carries two contents:\n%+v\n%+v", a.Key, show(prev), show(a))
		}
		byKey[a.Key] = a
		id := winID{a.Device, a.Metric, a.Start}
		if cur, ok := out[id]; !ok || a.Rev > cur.Rev {
			out[id] = a
		}
	}
	return out
}

func show(a wire.Aggregate) string {
	f := func(p *float64) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprint(*p)
	}
	return fmt.Sprintf("%s/%s/%d rev=%d n=%d sum=%s min=%s max=%s mean=%s first=%s last=%s ptime=%v",
		a.Device, a.Metric, a.Start, a.Rev, a.Count, f(a.Sum), f(a.Min), f(a.Max), f(a.Mean), f(a.First), f(a.Last), a.ProcTime)
}

func readDead(t testing.TB, db *bolt.DB) []DeadLetter {
	t.Helper()
	var out []DeadLetter
	err := db.View(func(tx *bolt.Tx) error {
		var err error
		out, err = ReadDeadLetters(tx, Filter{}, 1<<30)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out
}

func readLate(t testing.TB, db *bolt.DB) []Late {
	t.Helper()
	var out []Late
	err := db.View(func(tx *bolt.Tx) error {
		var err error
		out, err = ReadLate(tx, Filter{}, 1<<30)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// runToEnd steps until Bronze is consumed, then flushes.
// runFresh processes all of src into a new state database.
func runFresh(t testing.TB, src Source, cfg Config) (*bolt.DB, *Stage) {
	t.Helper()
	db := openDB(t, "", true)
	s, err := New(db, src, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, s)
	return db, s
}

func runToEnd(t testing.TB, s *Stage) {
	t.Helper()
	if err := s.RunOnce(); err != nil {
		t.Fatalf("run once: %v", err)
	}
}

// stepToEnd steps s to the end of Bronze without the checkpoint RunOnce's
// Flush writes: dropping s then is a crash.
func stepToEnd(t testing.TB, s *Stage) {
	t.Helper()
	for {
		res, err := s.Step()
		if err != nil {
			t.Fatal(err)
		}
		if res.Records == 0 {
			return
		}
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// firstUnderRace returns cases, or only the first of them under the race
// detector. The stream tests that replay one stream under many settings
// drive the stage from one goroutine, where the detector has nothing more
// to find in a second case of the same code, and it makes them six times
// slower: they were two thirds of the package's time under -race. make
// test runs the package again without it, every case in full.
func firstUnderRace[T any](cases []T) []T {
	if raceDetector {
		return cases[:1]
	}
	return cases
}
