package uplink

import (
	"math"
	"time"

	ibackoff "github.com/edgeagent/edgeagent/internal/backoff"
)

// backoffBase is the first reconnect delay.
const backoffBase = 250 * time.Millisecond

// backoff returns the delay before reconnect attempt n (0 for the first
// after a loss): see backoff.Delay.
func backoff(n int, max time.Duration, rnd func() float64) time.Duration {
	return ibackoff.Delay(n, backoffBase, max, rnd)
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
var sleepCtx = ibackoff.Sleep
