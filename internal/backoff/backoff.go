// Package backoff is the retry delay shared by the agent's connections:
// exponential, capped, with jitter, so a fleet that lost the same server
// does not come back in lockstep.
package backoff

import (
	"context"
	"time"
)

// Delay returns the wait before retry n (0 for the first): base doubled n
// times, capped at max, with "equal jitter" — a uniform pick in [d/2, d)
// of that d, from rnd (uniform in [0,1)) — so it never retries at once.
func Delay(n int, base, max time.Duration, rnd func() float64) time.Duration {
	d := max
	if n < 62 {
		if e := base << n; e > 0 && e < max && e>>n == base {
			d = e
		}
	}
	half := d / 2
	return half + time.Duration(rnd()*float64(d-half))
}

// Sleep waits d or until ctx is done, and then returns ctx's error.
func Sleep(ctx context.Context, d time.Duration) error {
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
