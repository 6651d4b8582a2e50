package ingest

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/buffer"
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
