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
