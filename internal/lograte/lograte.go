// Package lograte wraps a slog.Handler so that a warning or error repeated
// with the same message logs once per interval, with the number of repeats
// it stood for, instead of flooding a gateway's journal during an outage.
package lograte

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// Handler passes records below Warn through unchanged and throttles the
// rest per message and cause (see throttleKey).
type Handler struct {
	next     slog.Handler
	interval time.Duration
	now      func() time.Time
	state    *state
}

type state struct {
	mu   sync.Mutex
	seen map[string]*entry
}

type entry struct {
	last       time.Time
	suppressed int
}

// maxKeys bounds the table: messages are constant strings in this program,
// but their causes (the err's shape) are not.
const maxKeys = 1024

// New wraps next. now defaults to time.Now.
func New(next slog.Handler, interval time.Duration, now func() time.Time) *Handler {
	if now == nil {
		now = time.Now
	}
	return &Handler{next: next, interval: interval, now: now, state: &state{seen: map[string]*entry{}}}
}

// Enabled reports whether the wrapped handler handles level.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

// Handle logs r unless the same warning or error was logged less than the
// interval ago; the next one logged carries "repeated" = the count skipped.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn || h.interval <= 0 {
		return h.next.Handle(ctx, r)
	}
	now := h.now()
	key := throttleKey(r)
	h.state.mu.Lock()
	e := h.state.seen[key]
	if e == nil && len(h.state.seen) >= maxKeys {
		h.state.evict(now, h.interval)
		if len(h.state.seen) >= maxKeys {
			// A table full of causes still throttling: this one is
			// throttled by its message alone rather than lifting
			// theirs. Messages are constants, so these keys add few.
			key = r.Message
			e = h.state.seen[key]
		}
	}
	if e != nil && now.Sub(e.last) < h.interval {
		e.suppressed++
		h.state.mu.Unlock()
		return nil
	}
	repeated := 0
	if e == nil {
		e = &entry{}
		h.state.seen[key] = e
	}
	repeated, e.suppressed, e.last = e.suppressed, 0, now
	h.state.mu.Unlock()
	if repeated > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("repeated", repeated))
	}
	return h.next.Handle(ctx, r)
}

// evict makes room in a full table: the entries whose interval has passed
// go (they throttle nothing; a suppressed count among them is lost, as
// its repeats stopped a while ago).
func (st *state) evict(now time.Time, interval time.Duration) {
	for k, e := range st.seen {
		if now.Sub(e.last) >= interval {
			delete(st.seen, k)
		}
	}
}

// throttleKey is the message and the shape of its "err": a new cause under
// the same message (the link down for another reason) is logged at once,
// not hidden for an interval behind the old one, while the same cause with
// other batch ids, addresses or durations stays one key. The shape is the
// text with every run of letters and digits that holds a digit made "#".
func throttleKey(r slog.Record) string {
	key := r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key != "err" {
			return true
		}
		var b strings.Builder
		b.WriteString(key)
		b.WriteByte(0)
		text := a.Value.Resolve().String()
		for i := 0; i < len(text) && b.Len() < maxKeyLen; {
			j := i
			digit := false
			for j < len(text) && isAlnum(text[j]) {
				digit = digit || '0' <= text[j] && text[j] <= '9'
				j++
			}
			switch {
			case j == i:
				b.WriteByte(text[i])
				j++
			case digit:
				b.WriteByte('#')
			default:
				b.WriteString(text[i:j])
			}
			i = j
		}
		key = b.String()
		return false
	})
	return key
}

// maxKeyLen bounds a key: the start of an error names its cause.
const maxKeyLen = 256

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// WithAttrs returns a handler sharing this one's throttle table.
func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &Handler{next: h.next.WithAttrs(as), interval: h.interval, now: h.now, state: h.state}
}

// WithGroup returns a handler sharing this one's throttle table.
func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{next: h.next.WithGroup(name), interval: h.interval, now: h.now, state: h.state}
}
