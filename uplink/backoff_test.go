package uplink

import (
	"testing"
	"time"
)

// fakeClock is a clock the test moves.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time          { return c.now }
func (c *fakeClock) Advance(d time.Duration) { c.now = c.now.Add(d) }

func TestTokenBucket(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	b := newTokenBucket(1000, clk.Now) // 1000 B/s, 1000 B burst
	if d := b.reserve(600); d != 0 {
		t.Fatalf("within the burst: wait %v", d)
	}
	if d := b.reserve(600); d != 200*time.Millisecond {
		t.Fatalf("200 B over: wait %v, want 200ms", d)
	}
	clk.Advance(200 * time.Millisecond)
	if d := b.reserve(0); d != 0 {
		t.Fatalf("debt repaid: wait %v", d)
	}
	// A send larger than the burst goes out after its debt is paid.
	if d := b.reserve(5000); d != 5*time.Second {
		t.Fatalf("oversize send: wait %v, want 5s", d)
	}
	// Over a long run the average holds: 100 sends of 250 B at the pace
	// the bucket dictates take 25 s, less the initial burst.
	clk.Advance(10 * time.Second) // refill (capped at the burst)
	start := clk.now
	for i := 0; i < 100; i++ {
		clk.Advance(b.reserve(250))
	}
	if el := clk.now.Sub(start); el < 24*time.Second || el > 25*time.Second {
		t.Fatalf("100 × 250 B at 1000 B/s took %v of fake time, want 24-25 s", el)
	}
	unlimited := newTokenBucket(0, clk.Now)
	if d := unlimited.reserve(1 << 30); d != 0 {
		t.Fatalf("unlimited bucket waits %v", d)
	}
}
