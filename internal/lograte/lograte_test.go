package lograte

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestRepeatedErrorsAreThrottled(t *testing.T) {
	var buf bytes.Buffer
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	log := slog.New(New(slog.NewTextHandler(&buf, nil), 10*time.Second, func() time.Time { return now }))
	for i := 0; i < 5; i++ {
		log.Error("bronze commit failed", "err", "disk full")
		log.Info("tick")
		now = now.Add(time.Second)
	}
	now = now.Add(10 * time.Second)
	log.With("component", "ingest").Error("bronze commit failed", "err", "disk full")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	var errs []string
	for _, l := range lines {
		if strings.Contains(l, "bronze commit failed") {
			errs = append(errs, l)
		}
	}
	if len(errs) != 2 {
		t.Fatalf("logged %d error lines, want 2 (first, then one after the interval):\n%s", len(errs), buf.String())
	}
	if !strings.Contains(errs[1], "repeated=4") || !strings.Contains(errs[1], "component=ingest") {
		t.Errorf("second line should count the 4 suppressed repeats and keep attributes: %s", errs[1])
	}
	if n := strings.Count(buf.String(), "msg=tick"); n != 5 {
		t.Errorf("info lines must pass through: %d of 5", n)
	}
}

// A new cause under the same message is logged at once; the same cause
// with other ids and numbers is throttled (an audit saw the link's "no
// servers available" hidden for 20 s behind an earlier, other error).
func TestNewCauseIsNotThrottled(t *testing.T) {
	var buf bytes.Buffer
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	log := slog.New(New(slog.NewTextHandler(&buf, nil), time.Minute, func() time.Time { return now }))
	log.Warn("uplink: link down; reconnecting", "err", "ack batch gw-1-100-598744fc849dc781: nats: no response from stream")
	log.Warn("uplink: link down; reconnecting", "err", "ack batch gw-101-200-0a9f44fc849dc7e2: nats: no response from stream")
	log.Warn("uplink: link down; reconnecting", "err", "connect to nats nats://127.0.0.1:14222: nats: no servers available for connection")
	log.Warn("uplink: link down; reconnecting", "err", "connect to nats nats://127.0.0.1:14223: nats: no servers available for connection")
	got := buf.String()
	if n := strings.Count(got, "link down"); n != 2 {
		t.Fatalf("logged %d lines, want 2 (one for each cause):\n%s", n, got)
	}
	if !strings.Contains(got, "no servers available") {
		t.Errorf("the new cause was throttled:\n%s", got)
	}
}

// A full table drops the entries whose interval passed, not the ones
// still throttling: a flood of distinct causes does not lift the throttle
// of a message that repeats.
func TestFullTableKeepsLiveEntries(t *testing.T) {
	var buf bytes.Buffer
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	log := slog.New(New(slog.NewTextHandler(&buf, nil), time.Minute, func() time.Time { return now }))
	log.Error("bronze commit failed", "err", "disk full")
	now = now.Add(2 * time.Minute)
	log.Error("bronze commit failed", "err", "disk full") // logged again: a new interval
	for i := range maxKeys {
		log.Warn("device topic refused", "err", "topic "+strings.Repeat("x", i%50)+string(rune('a'+i%26))+string(rune('a'+i/26%26)))
	}
	before := strings.Count(buf.String(), "bronze commit failed")
	log.Error("bronze commit failed", "err", "disk full")
	if after := strings.Count(buf.String(), "bronze commit failed"); after != before {
		t.Errorf("a table full of other causes let a throttled error through (%d lines, then %d)", before, after)
	}
	// A new cause with no room in the full table is throttled by its
	// message: once, not on every repeat.
	for range 100 {
		log.Error("state commit failed", "err", "input/output error")
	}
	if n := strings.Count(buf.String(), "state commit failed"); n != 1 {
		t.Errorf("a new error with the table full logged %d times, want 1", n)
	}
}
