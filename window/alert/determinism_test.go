package alert

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/config"
	"github.com/edgeagent/edgeagent/uplink/local"
)

// determinismConfig exercises every feature: hysteresis with for, a rate
// limit, storms (threshold 5 with 40 devices), an uplink-only rule with
// the default clear, and republished aggregates.
func determinismConfig() Config {
	hot := overheating()
	hot.MinInterval = config.Duration(3 * time.Minute)
	cold := config.AlertRule{Name: "cold", Metric: "temperature", Devices: "press-?[0-4]", When: "min < 20", For: 1, Actions: []string{"uplink"}}
	cfg := testConfig(hot, cold)
	cfg.LocalPublish.StormThreshold = 5
	cfg.LocalPublish.AggregatesTopic = "edgeagent/{gateway_id}/aggregates/{device}/{metric}"
	return cfg
}

// determinismCalls is a fixed pseudo-random sequence: 40 devices, 60
// windows, values flapping around both rules' thresholds, revisions of the
// latest and of older windows, and most devices' windows sharing an
// emission point.
func determinismCalls() []call {
	rng := rand.New(rand.NewPCG(1, 2))
	var calls []call
	for i := range 60 {
		for d := range 40 {
			dev := fmt.Sprintf("press-%02d", d)
			v := func() float64 {
				switch rng.IntN(4) {
				case 0:
					return 10 + rng.Float64()*15 // cold
				case 1:
					return 74 + rng.Float64()*8 // around the hysteresis band
				default:
					if i%10 < 5 {
						return 85 // everyone hot: storms
					}
					return 50
				}
			}
			c := win(dev, "temperature", i, v(), 1)
			c.at += int64(d % 3) // three emission points a window
			calls = append(calls, c)
			if rng.IntN(5) == 0 {
				r := win(dev, "temperature", i, v(), 2)
				r.at = c.at
				calls = append(calls, r)
			}
			if i > 0 && rng.IntN(10) == 0 {
				r := win(dev, "temperature", i-1, v(), 3) // older: ignored
				r.at = c.at
				calls = append(calls, r)
			}
		}
	}
	return calls
}

// stateBytes serialises the engine's buckets.
// localRows sorts the local rows: republished aggregates in order, the
// alert and summary keys.
type localRows struct {
	aggregates []byte
	keys       map[string]int
	alerts     map[string]bool
	summaries  int
}

// outboxSplit returns the uplink's rows, serialised, and the local rows.
func outboxSplit(t testing.TB, db *bolt.DB) ([]byte, localRows) {
	t.Helper()
	var uplink bytes.Buffer
	l := localRows{keys: map[string]int{}, alerts: map[string]bool{}}
	for _, e := range readOutbox(t, db) {
		if e.Kind != outbox.KindLocal {
			fmt.Fprintf(&uplink, "%d|%d|%x\n", e.Kind, e.EmittedAt, e.Data)
			continue
		}
		m, err := local.Decode(e.Data)
		if err != nil {
			t.Fatal(err)
		}
		var j struct{ Type, Key string }
		if err := json.Unmarshal(m.Payload, &j); err != nil {
			t.Fatal(err)
		}
		switch j.Type {
		case TypeAlert:
			l.alerts[j.Key] = true
		case TypeSummary:
			l.summaries++
		default:
			l.aggregates = fmt.Appendf(l.aggregates, "%s|%s\n", m.Topic, m.Payload)
			continue
		}
		l.keys[j.Key]++
	}
	return uplink.Bytes(), l
}

// stateBytes serialises the engine's buckets but the skipped ones.
func stateBytes(t testing.TB, db *bolt.DB, skip ...[]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	err := db.View(func(tx *bolt.Tx) error {
		for _, name := range buckets {
			if slices.ContainsFunc(skip, func(s []byte) bool { return bytes.Equal(s, name) }) {
				continue
			}
			err := tx.Bucket(name).ForEach(func(k, v []byte) error {
				fmt.Fprintf(&buf, "%s|%x|%x\n", name, k, v)
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
	return buf.Bytes()
}

// TestDeterminism feeds the same Emitted sequence three ways — one
// transaction; one transaction per call; random transactions with
// restarts (a new Engine on the same database) and rolled-back attempts in
// between — and requires byte-identical uplink rows, republished
// aggregates and rule state (storm folding aside, below).
func TestDeterminism(t *testing.T) {
	calls := determinismCalls()
	cfg := determinismConfig()

	dbA := openDBOpts(t, "", true)
	eA := newEngine(t, dbA, cfg)
	emit(t, dbA, eA, calls...)
	st := eA.Stats()
	t.Logf("%d calls: %+v", len(calls), st)
	if st.Fired < 50 || st.Cleared < 50 || st.Suppressed == 0 || st.Summaries == 0 || st.IgnoredRevisions == 0 {
		t.Fatalf("the sequence does not exercise the features: %+v", st)
	}

	dbB := openDBOpts(t, "", true)
	eB := newEngine(t, dbB, cfg)
	for _, c := range calls {
		emit(t, dbB, eB, c)
	}

	dbC := openDBOpts(t, "", true)
	eC := newEngine(t, dbC, cfg)
	rng := rand.New(rand.NewPCG(3, 4))
	injected := errors.New("injected")
	for i, chunk := 0, 0; i < len(calls); chunk++ {
		n := min(1+rng.IntN(150), len(calls)-i)
		part := calls[i : i+n]
		if chunk%4 == 3 {
			// A batch that fails after the observer ran: rolled back.
			err := dbC.Update(func(tx *bolt.Tx) error {
				for j := range part {
					if err := eC.Emitted(tx, &part[j].a, part[j].at); err != nil {
						return err
					}
				}
				return injected
			})
			if !errors.Is(err, injected) {
				t.Fatal(err)
			}
		}
		emit(t, dbC, eC, part...)
		if chunk%3 == 2 {
			eC = newEngine(t, dbC, cfg) // restart
		}
		i += n
	}

	// The uplink's rows, the republished aggregates and the rules' state
	// are byte-identical however the calls are split. Storm folding is
	// not: a storm never rewrites what an earlier transaction queued (the
	// local publisher may have sent it), so how a storm spread over
	// transactions is told locally depends on the split. Every local
	// message still has a key of its own, and every individual one stands
	// for a transition the uplink got.
	uplinkA, localA := outboxSplit(t, dbA)
	for name, db := range map[string]*bolt.DB{"one transaction": dbA, "per call": dbB, "split with restarts": dbC} {
		uplink, locals := outboxSplit(t, db)
		if !bytes.Equal(uplink, uplinkA) {
			t.Errorf("%s: uplink rows differ from the single transaction's", name)
		}
		if !bytes.Equal(stateBytes(t, db, bucketStorm), stateBytes(t, dbA, bucketStorm)) {
			t.Errorf("%s: alert state differs from the single transaction's", name)
		}
		if !bytes.Equal(locals.aggregates, localA.aggregates) {
			t.Errorf("%s: republished aggregates differ from the single transaction's", name)
		}
		if locals.summaries == 0 {
			t.Errorf("%s: no storm summary", name)
		}
		for key, n := range locals.keys {
			if n > 1 {
				t.Errorf("%s: local key %s queued %d times", name, key, n)
			}
		}
		sent := map[string]bool{}
		for _, a := range alerts(t, db) {
			sent[a.Key] = true
		}
		for key := range locals.alerts {
			if !sent[key] {
				t.Errorf("%s: local alert %s is no uplink transition", name, key)
			}
		}
	}
	if stB := eB.Stats(); stB.Fired != st.Fired || stB.Firing != st.Firing || stB.Suppressed != st.Suppressed {
		t.Errorf("per-call stats %+v differ from %+v", stB, st)
	}
	if stC := eC.Stats(); stC.Firing != st.Firing || stC.Pending != st.Pending || stC.States != st.States {
		t.Errorf("after restarts: stats %+v, want firing/pending/states of %+v", stC, st)
	}
}
