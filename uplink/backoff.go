package uplink

import (
	"context"
	"math"
	"time"
)

// backoffBase is the first reconnect delay.
const backoffBase = 250 * time.Millisecond

// backoff returns the delay before reconnect attempt n (0 for the first
// after a loss): exponential from backoffBase, capped at max, with "equal
// jitter" — a uniform pick in [d/2, d) — so a fleet that lost the same
// server does not come back in lockstep, yet never retries at once.
func backoff(n int, max time.Duration, rnd func() float64) time.Duration {
	d := max
	if n < 30 {
		if e := backoffBase * time.Duration(math.Pow(2, float64(n))); e > 0 && e < max {
			d = e
		}
	}
	half := d / 2
	return half + time.Duration(rnd()*float64(d-half))
}

// tokenBucket limits the bytes sent per second. A send may overdraw it; the
// sender then waits until the debt is paid, so a batch bigger than the
// burst still goes out and the average rate holds.
type tokenBucket struct {
	rate   float64 // bytes per second; 0 is unlimited
	burst  float64
	tokens float64
	last   time.Time
	clock  func() time.Time
}

func newTokenBucket(rate int64, clock func() time.Time) *tokenBucket {
	return &tokenBucket{rate: float64(rate), burst: float64(rate), tokens: float64(rate), last: clock(), clock: clock}
}

// reserve takes n bytes and returns how long the caller must wait before
// sending them.
func (b *tokenBucket) reserve(n int) time.Duration {
	if b.rate <= 0 {
		return 0
	}
	now := b.clock()
	if el := now.Sub(b.last); el > 0 {
		b.tokens = math.Min(b.burst, b.tokens+el.Seconds()*b.rate)
	}
	b.last = now
	b.tokens -= float64(n)
	if b.tokens >= 0 {
		return 0
	}
	return time.Duration(-b.tokens / b.rate * float64(time.Second))
}

// sleepCtx waits d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
