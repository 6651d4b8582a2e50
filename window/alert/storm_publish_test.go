package alert

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/config"
	"github.com/edgeagent/edgeagent/uplink/local"
)

// The local publisher takes a storm's summary while the next micro-batch
// of the storm runs: the summary it has in hand is not rewritten under its
// key (that key would go out with two contents); the rest of the storm
// goes into a part of its own. Found by an audit: the summary used to be
// rewritten while the outbox still held it, which it does while the
// publisher sends it.
func TestStormSummaryInFlightIsNotRewritten(t *testing.T) {
	r := overheating()
	r.For = 1
	cfg := testConfig(r)
	cfg.LocalPublish.StormWindow = config.Duration(time.Minute)
	db := openDB(t, "")
	e := newEngine(t, db, cfg)
	at0 := win("x", "", 0, 0, 1).at
	spread := func(from, n int) []call {
		var cs []call
		for i := range n {
			cs = append(cs, win(fmt.Sprintf("press-%02d", from+i), "temperature", 0, 90, 1).atTime(at0+int64(from+i)*1000))
		}
		return cs
	}
	emit(t, db, e, spread(0, 25)...) // a summary of 25, queued

	inSink, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	byKey := map[string][]float64{}
	var first sync.Once
	sink := local.SinkFunc(func(_ string, payload []byte, _ bool, _ byte) error {
		var m struct {
			Key         string
			Transitions float64
		}
		if err := json.Unmarshal(payload, &m); err != nil {
			return err
		}
		mu.Lock()
		byKey[m.Key] = append(byKey[m.Key], m.Transitions)
		mu.Unlock()
		first.Do(func() { close(inSink); <-release })
		return nil
	})
	p, err := local.New(db, local.Config{Sink: sink, PollInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	<-inSink                         // the publisher is sending the summary of 25
	emit(t, db, e, spread(25, 3)...) // the storm's next micro-batch
	close(release)
	// The window ends: the held part is queued, and the publisher sends it.
	emit(t, db, e, win("other-1", "temperature", 0, 20, 1).atTime(at0+60_000))
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n uint64
		if err := db.View(func(tx *bolt.Tx) (err error) { n, err = outbox.CountKind(tx, outbox.KindLocal); return err }); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d local rows still queued after 10s", n)
		}
		time.Sleep(time.Millisecond) // poll interval
	}
	mu.Lock()
	defer mu.Unlock()
	for k, v := range byKey {
		if len(v) != 1 {
			t.Errorf("key %s published %d times, with transitions %v", k, len(v), v)
		}
	}
	if len(byKey) != 2 || byKey[fmt.Sprintf("gw1/overheating/_summary/%d", at0)][0] != 25 || byKey[fmt.Sprintf("gw1/overheating/_summary/%d/2", at0)][0] != 3 {
		t.Errorf("published %v, want the summary of 25 and a second part of 3", byKey)
	}
}
