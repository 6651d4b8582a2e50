package backoff

import (
	"context"
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	const base, max = 250 * time.Millisecond, 30 * time.Second
	lo := func() float64 { return 0 }
	hi := func() float64 { return 0.999999 }
	prevLo := time.Duration(0)
	for n := 0; n < 100; n++ {
		a, b := Delay(n, base, max, lo), Delay(n, base, max, hi)
		if a > b {
			t.Fatalf("retry %d: jitter range inverted: %v > %v", n, a, b)
		}
		if b > max {
			t.Fatalf("retry %d: %v exceeds the cap %v", n, b, max)
		}
		if a < prevLo {
			t.Fatalf("retry %d: lower bound fell from %v to %v", n, prevLo, a)
		}
		if a <= 0 {
			t.Fatalf("retry %d: no wait at all", n)
		}
		prevLo = a
	}
	for n, want := range []time.Duration{base / 2, base, 2 * base, 4 * base} {
		if got := Delay(n, base, max, lo); got != want {
			t.Errorf("retry %d: lower bound %v, want %v", n, got, want)
		}
	}
	if got := Delay(100, base, max, lo); got != max/2 {
		t.Fatalf("capped lower bound = %v, want %v", got, max/2)
	}
	// A cap below the base still waits, within the cap.
	if got := Delay(0, base, 100*time.Millisecond, hi); got > 100*time.Millisecond || got < 50*time.Millisecond {
		t.Fatalf("small cap: %v", got)
	}
}

func TestSleepEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, time.Hour); err != context.Canceled {
		t.Fatalf("Sleep on a cancelled context: %v, want context.Canceled", err)
	}
	if err := Sleep(context.Background(), time.Millisecond); err != nil {
		t.Fatalf("Sleep of 1 ms: %v", err)
	}
}
