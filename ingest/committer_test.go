package ingest

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/testrig/logbuf"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
)

// The byte budget admits what fits, always one record however large, and
// wakes every waiter on a release.
func TestByteBudget(t *testing.T) {
	b := newByteBudget(10)
	stop := make(chan struct{})
	if !b.acquire(25, stop) {
		t.Fatal("one record larger than the budget must fit when nothing is held")
	}
	done := make(chan int, 2)
	for _, n := range []int{4, 6} {
		go func() {
			if b.acquire(n, stop) {
				done <- n
			}
		}()
	}
	select {
	case n := <-done:
		t.Fatalf("acquired %d bytes while 25 of 10 were held", n)
	case <-time.After(50 * time.Millisecond): // a negative check: nothing may return
	}
	b.release(25)
	got := <-done + <-done
	if got != 10 || b.used != 10 {
		t.Fatalf("after the release: acquired %d, used %d; want both waiters in (10)", got, b.used)
	}
	waiting := make(chan bool, 1)
	go func() { waiting <- b.acquire(1, stop) }()
	close(stop)
	if <-waiting {
		t.Fatal("acquire returned true after stop while the budget was full")
	}
	if b.used != 10 {
		t.Fatalf("a stopped acquire holds bytes: used %d", b.used)
	}
}

// Records are admitted in the order they asked: a small one that would
// fit waits behind a large one that does not yet, which would otherwise
// starve while other connections' small records took every freed byte.
func TestByteBudgetIsFirstComeFirstServed(t *testing.T) {
	b := newByteBudget(10)
	stop := make(chan struct{})
	defer close(stop)
	b.acquire(10, stop)
	waiters := func() int { b.mu.Lock(); defer b.mu.Unlock(); return b.waiting }
	order := make(chan int, 2)
	go func() { b.acquire(8, stop); order <- 8 }()
	mqtttest.WaitFor(t, 5*time.Second, "the large record waiting", func() bool { return waiters() == 1 })
	go func() { b.acquire(1, stop); order <- 1 }()
	mqtttest.WaitFor(t, 5*time.Second, "the small record waiting behind it", func() bool { return waiters() == 2 })
	b.release(5) // room for the small one, not the large one
	select {
	case n := <-order:
		t.Fatalf("the %d-byte record went first, with room for 1 of the 8 the head waits for", n)
	case <-time.After(50 * time.Millisecond): // a negative check: nothing may pass
	}
	// Room for the large one and then none for the small one, so the
	// order of admission is the order of the sends (two goroutines
	// admitted together may send in either order).
	b.release(3)
	if n := <-order; n != 8 {
		t.Fatalf("the %d-byte record went first, want the 8-byte one that asked first", n)
	}
	b.release(1)
	if n := <-order; n != 1 {
		t.Fatalf("then the %d-byte record, want the 1-byte one", n)
	}
}

// While a commit is held, ingest takes no more than maxQueuedBytes of
// messages off the broker connection; then everything commits.
func TestHandleBlocksAtTheByteBudget(t *testing.T) {
	b, held, release := openBronzeHoldingFirstCommit(t)
	in := startIngester(t, b, testConfig(t, "tcp://127.0.0.1:1", "edgeagent-budget", nil))
	const size, n = 1 << 20, 40
	var handed atomic.Int64
	go func() {
		for i := range n {
			rec := buffer.Record{Kind: buffer.KindMessage, Topic: "sensors/d1/telemetry", Payload: bytes.Repeat([]byte{byte(i)}, size-len("sensors/d1/telemetry"))}
			if !in.handle(rec, nil) {
				return
			}
			handed.Add(1)
		}
	}()
	want := int64(maxQueuedBytes / size)
	mqtttest.WaitFor(t, 10*time.Second, fmt.Sprintf("%d MiB handed over", want), func() bool { return held.Load() && handed.Load() >= want })
	time.Sleep(100 * time.Millisecond) // nothing to wait on: this checks that no more pass
	if got := handed.Load(); got > want {
		t.Fatalf("%d MiB handed over while the commit was held, want at most %d", got, want)
	}
	close(release)
	mqtttest.WaitFor(t, 30*time.Second, "every record committed", func() bool { return in.Stats().Committed.Load() == n })
}

// scriptedAppender returns its errors in order, then nil.
type scriptedAppender struct {
	errs  []error
	calls []int // records a call
}

func (a *scriptedAppender) Append(recs []buffer.Record) error {
	a.calls = append(a.calls, len(recs))
	if len(a.errs) == 0 {
		return nil
	}
	err := a.errs[0]
	a.errs = a.errs[1:]
	return err
}

// A batch split because Bronze is full is one episode: counted once, and
// "room again" logged once the whole batch is in, not after its first part.
func TestSplitBatchIsOneFullEpisode(t *testing.T) {
	// Two records, one of which fits at a time: each waits for room in turn.
	app := &scriptedAppender{errs: []error{buffer.ErrFull, buffer.ErrFull, nil, buffer.ErrFull, nil}}
	logs := &logbuf.Buffer{}
	var st Stats
	c := &committer{app: app, log: slog.New(slog.NewTextHandler(logs, nil)), backoff: commitBackoff{time.Millisecond, time.Millisecond},
		stats: &st, budget: newByteBudget(maxQueuedBytes)}
	batch := make([]pending, 2)
	for i := range batch {
		batch[i] = pending{rec: buffer.Record{Kind: buffer.KindMessage, Topic: "sensors/d1/telemetry", Payload: []byte{byte(i)}}}
	}
	if !c.commit(context.Background(), batch, make([]buffer.Record, 0, 2)) {
		t.Fatal("commit gave up")
	}
	if fmt.Sprint(app.calls) != "[2 1 1 1 1]" {
		t.Fatalf("append calls %v, want the batch, then each record refused once and taken", app.calls)
	}
	if n := st.FullTotal.Load(); n != 1 || st.Full.Load() {
		t.Errorf("full_total %d (full now %v), want one episode, over", n, st.Full.Load())
	}
	if n := strings.Count(logs.String(), "bronze is full"); n != 1 {
		t.Errorf("%d 'bronze is full' lines, want 1:\n%s", n, logs)
	}
	if n := strings.Count(logs.String(), "room again"); n != 1 {
		t.Errorf("%d 'room again' lines, want 1:\n%s", n, logs)
	}
}

// timedAppender records when each group commit happened and its size.
type timedAppender struct {
	commits chan timedCommit
}

type timedCommit struct {
	at      time.Time
	records int
}

func (a *timedAppender) Append(recs []buffer.Record) error {
	a.commits <- timedCommit{time.Now(), len(recs)}
	return nil
}

// A group gathers messages for the whole commit interval while they keep
// coming, and commits once they pause after a fifth of it: a burst that
// ends (a broker whose window of unacknowledged messages is full) does not
// wait out the interval, and sustained input gets fewer, larger commits.
func TestGroupCommitLingersOnlyWhileInputFlows(t *testing.T) {
	const interval, quiet = 4 * time.Second, 300 * time.Millisecond
	app := &timedAppender{commits: make(chan timedCommit, 16)}
	c := &committer{app: app, in: make(chan pending, 1000), interval: interval, quiet: quiet, maxBatch: 1000,
		tick: time.Hour, clock: time.Now, log: slog.New(slog.DiscardHandler),
		backoff: commitBackoff{time.Millisecond, time.Millisecond}, stats: &Stats{}, budget: newByteBudget(maxQueuedBytes)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	msg := func() pending {
		return pending{rec: buffer.Record{Kind: buffer.KindMessage, Topic: "sensors/d1/telemetry", Payload: []byte("1")}}
	}
	next := func(what string) timedCommit {
		t.Helper()
		select {
		case cm := <-app.commits:
			return cm
		case <-time.After(3 * interval):
			t.Fatalf("%s: no commit", what)
			return timedCommit{}
		}
	}

	// A burst, then nothing.
	start := time.Now()
	for range 5 {
		c.in <- msg()
	}
	cm := next("burst")
	if waited := cm.at.Sub(start); cm.records != 5 || waited < interval/5 || waited >= interval/2 {
		t.Errorf("a burst of 5 committed %d records after %v, want all 5 after a fifth of the %v interval plus the pause, not the whole interval", cm.records, waited, interval)
	}

	// A message every 10 ms for longer than the interval.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	start = time.Now()
	c.in <- msg()
	for time.Since(start) < interval+2*time.Second {
		<-tick.C
		c.in <- msg()
	}
	cm = next("sustained")
	if waited := cm.at.Sub(start); waited < interval-50*time.Millisecond || waited >= interval+2*time.Second {
		t.Errorf("sustained input committed first after %v (%d records), want after the %v interval, no sooner and not at the input's end", waited, cm.records, interval)
	}
}
