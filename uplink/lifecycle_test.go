package uplink

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func TestLifecycle(t *testing.T) {
	db := openDB(t)
	srv := startNATS(t, "in-process", 0)
	u := newTestUplink(t, db, func(c *Config) { c.NATS.URL = srv.URL() })
	if err := u.Close(); err != nil { // before Run
		t.Fatal(err)
	}
	if err := u.Close(); err != nil { // twice
		t.Fatal(err)
	}
	if err := u.Run(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Run after Close = %v, want ErrClosed", err)
	}

	u = newTestUplink(t, db, func(c *Config) { c.NATS.URL = srv.URL() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(1)
	go func() {
		defer wg.Done()
		errs <- u.Run(ctx)
	}()
	waitFor(t, 10*time.Second, "the link to come up", func() bool { return u.Stats().Link == LinkUp })
	if err := u.Run(ctx); !errors.Is(err, ErrRunning) {
		t.Fatalf("second Run = %v, want ErrRunning", err)
	}
	// Close from another goroutine while Run runs, twice at once.
	var cw sync.WaitGroup
	for i := 0; i < 2; i++ {
		cw.Add(1)
		go func() {
			defer cw.Done()
			if err := u.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		}()
	}
	cw.Wait()
	wg.Wait()
	if err := <-errs; err != nil {
		t.Fatalf("Run returned %v after Close", err)
	}
	if st := u.Stats(); st.Link != LinkDown {
		t.Fatalf("link %s after Close", st.Link)
	}
}

// lockedClock is a fake clock that the uplink's goroutines may read.
type lockedClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *lockedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *lockedClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestRateLimit drains a backlog through a real server with the token bucket
// on an injected clock: the waits the uplink asks for add up to the bytes
// it sent at max_bytes_per_second, less the one-second burst, and nothing is
// lost while new rows queue behind the drain.
func TestRateLimit(t *testing.T) {
	srv := startNATS(t, "in-process", 0)
	db := openDB(t)
	fx := makeFixture(t, 20, 6)
	half := len(fx.rows) / 2
	fill(t, db, fx.rows[:half], 100)
	clk := &lockedClock{now: time.Unix(1_767_225_600, 0)}
	var slept time.Duration
	var mu sync.Mutex
	cfg := natsConfig(srv.URL())
	cfg.MaxBytesPerSecond = 2048
	cfg.Clock = clk.Now
	u := startUplink(t, db, cfg, func(u *Uplink) {
		u.sleep = func(ctx context.Context, d time.Duration) error {
			// Time passes at once on the fake clock.
			mu.Lock()
			slept += d
			mu.Unlock()
			clk.Advance(d)
			return ctx.Err()
		}
	})
	waitFor(t, 10*time.Second, "the drain to start", func() bool { return u.Stats().BatchesSent > 0 })
	fill(t, db, fx.rows[half:], 100)
	u.Notify()
	u.waitDelivered(t, fx, 30*time.Second)
	streamReceiver(t, srv.URL()).check(t, fx.truth(t))

	st := u.Stats()
	mu.Lock()
	defer mu.Unlock()
	want := time.Duration(float64(int64(st.BytesSent)-cfg.MaxBytesPerSecond) / float64(cfg.MaxBytesPerSecond) * float64(time.Second))
	if slept < want-10*time.Millisecond || slept > want+time.Second {
		t.Fatalf("sent %d bytes at %d B/s and waited %v of fake time, want about %v", st.BytesSent, cfg.MaxBytesPerSecond, slept, want)
	}
	t.Logf("%d bytes in %d batches, %v of waits at %d B/s", st.BytesSent, st.BatchesSent, slept, cfg.MaxBytesPerSecond)
}

// TestRateLimitedAcksAreNotTimeouts: with a bucket slow enough that
// publishing a round of in-flight batches outlasts ack_timeout, the acks
// that came in meanwhile are acks. The select that waits for the head's
// ack had its timer and the ack both ready and picked either: half the
// rounds ended in a false "acknowledgement timed out", a reconnect and the
// round sent again (found by an audit at max_bytes_per_second 1024: 2.2×
// the bytes of the backlog).
func TestRateLimitedAcksAreNotTimeouts(t *testing.T) {
	srv := startNATS(t, "in-process", 0)
	db := openDB(t)
	fx := makeFixture(t, 24, 4)
	cfg := natsConfig(srv.URL())
	cfg.MaxBatchRecords = max(1, fx.aggs/(3*maxInFlight)) // about three rounds
	cfg.MaxBytesPerSecond = 1024
	cfg.AckTimeout = 500 * time.Millisecond
	fill(t, db, fx.rows, 100)
	u := startUplink(t, db, cfg, func(u *Uplink) {
		u.sleep = func(ctx context.Context, d time.Duration) error {
			if d <= 0 {
				return ctx.Err()
			}
			// Each wait the bucket asks for takes a fifth of the ack
			// timeout of real time: a round of eight outlasts it.
			return sleepCtx(ctx, cfg.AckTimeout/5)
		}
	})
	u.waitDelivered(t, fx, 60*time.Second)
	streamReceiver(t, srv.URL()).check(t, fx.truth(t))
	st := u.Stats()
	if st.BatchesSent < 2*maxInFlight {
		t.Fatalf("%d batches sent: fewer than two rounds, nothing was tested", st.BatchesSent)
	}
	if st.AckTimeouts != 0 || st.Resends != 0 || st.Reconnects != 0 {
		t.Errorf("%d batches: %d ack timeouts, %d resends, %d reconnects; want none (every ack came)",
			st.BatchesSent, st.AckTimeouts, st.Resends, st.Reconnects)
	}
}
