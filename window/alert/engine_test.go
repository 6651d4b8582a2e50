package alert

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/config"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// TestHysteresisAndFor walks a device across and back over the threshold:
// it fires only after two windows in a row above 80, stays firing between
// 75 and 80, clears below 75. Devices outside the glob and other metrics
// never alert.
func TestHysteresisAndFor(t *testing.T) {
	db := openDB(t, "")
	cfg := testConfig(overheating())
	notified := 0
	cfg.OnLocal = func() { notified++ }
	e := newEngine(t, db, cfg)
	means := []float64{70, 85, 79, 85, 86, 78, 77, 74, 90, 91}
	var calls []call
	for i, v := range means {
		calls = append(calls,
			win("press-1", "temperature", i, v, 1),
			win("press-2", "temperature", i, 60, 1),
			win("boiler-1", "temperature", i, v, 1), // outside press-*
			win("press-1", "pressure", i, v, 1),     // another metric
		)
	}
	emit(t, db, e, calls...)

	got := transitions(t, alerts(t, db), "overheating")
	want := strs(
		transition{"press-1", 4, StateFired, 86, 0},
		transition{"press-1", 7, StateCleared, 74, 0},
		transition{"press-1", 9, StateFired, 91, 0},
	)
	if !slices.Equal(got, want) {
		t.Fatalf("transitions\n got %v\nwant %v", got, want)
	}
	// Each transition has its local message with the same key.
	ls := locals(t, db)
	if len(ls) != 3 {
		t.Fatalf("%d local rows, want 3", len(ls))
	}
	as := alerts(t, db)
	for i, l := range ls {
		if l.Msg.Topic != "edgeagent/gw1/alerts/press-1" || l.Msg.QoS != 1 || l.Msg.Retain {
			t.Fatalf("local row %d: topic %q qos %d retain %v", i, l.Msg.Topic, l.Msg.QoS, l.Msg.Retain)
		}
		j := l.JSON
		if j["type"] != TypeAlert || j["key"] != as[i].Key || j["state"] != as[i].State || j["value"] != as[i].Value ||
			j["rule"] != "overheating" || j["metric"] != "temperature" || j["severity"] != "high" || j["gateway"] != "gw1" {
			t.Fatalf("local message %d %v does not match alert %+v", i, j, as[i])
		}
	}
	if c := ls[1].JSON["condition"]; c != "mean < 75" {
		t.Fatalf("cleared message condition %v, want mean < 75", c)
	}
	st := e.Stats()
	if st.Firing != 1 || st.FiringByRule["overheating"] != 1 || st.Fired != 2 || st.Cleared != 1 || st.States != 2 {
		t.Fatalf("stats %+v", st)
	}
	if notified != 1 {
		t.Fatalf("OnLocal called %d times for one commit with local rows", notified)
	}
	emit(t, db, e, win("press-2", "temperature", 10, 60, 1)) // no local rows
	if notified != 1 {
		t.Fatalf("OnLocal called after a commit without local rows")
	}
}

// TestDefaultClearIsNegation: without clear_when the alert clears as soon
// as when stops holding.
func TestDefaultClearIsNegation(t *testing.T) {
	db := openDB(t, "")
	r := overheating()
	r.ClearWhen, r.For = "", 1
	e := newEngine(t, db, testConfig(r))
	emit(t, db, e, win("press-1", "temperature", 0, 81, 1), win("press-1", "temperature", 1, 80, 1))
	got := transitions(t, alerts(t, db), "overheating")
	want := strs(transition{"press-1", 0, StateFired, 81, 0}, transition{"press-1", 1, StateCleared, 80, 0})
	if !slices.Equal(got, want) {
		t.Fatalf("transitions\n got %v\nwant %v", got, want)
	}
}

// TestFlappingRateLimit flaps a device faster than min_interval: the
// changes inside the interval are held back and counted, and the state
// it settles in is sent once the interval has passed — for press-1 by its
// own next window, for press-2 (silent after flapping) by press-3's.
func TestFlappingRateLimit(t *testing.T) {
	db := openDB(t, "")
	r := overheating()
	r.For, r.MinInterval = 1, config.Duration(5*time.Minute)
	e := newEngine(t, db, testConfig(r))
	p1 := []float64{85, 70, 85, 70, 70, 70, 70, 70}
	var calls []call
	for i, v := range p1 {
		calls = append(calls, win("press-1", "temperature", i, v, 1))
		if i < 2 {
			calls = append(calls, win("press-2", "temperature", i, []float64{85, 70}[i], 1))
		}
		calls = append(calls, win("press-3", "temperature", i, 50, 1))
	}
	// Three transactions, to show holding back survives commits.
	emit(t, db, e, calls[:5]...)
	if st := e.Stats(); st.Pending != 2 || st.Suppressed != 2 {
		t.Fatalf("after the flaps: stats %+v, want 2 pending and 2 suppressed", st)
	}
	emit(t, db, e, calls[5:12]...)
	emit(t, db, e, calls[12:]...)

	got := transitions(t, alerts(t, db), "overheating")
	want := strs(
		transition{"press-1", 0, StateFired, 85, 0},
		transition{"press-2", 0, StateFired, 85, 0},
		// At 6:05 (window 5 emitted) the interval since 1:05 has passed.
		// The sweep runs first, at press-1's window: press-2's clear is
		// keyed with its last window (1), press-1's with window 4.
		transition{"press-1", 4, StateCleared, 70, 2},
		transition{"press-2", 1, StateCleared, 70, 0},
	)
	if !slices.Equal(got, want) {
		t.Fatalf("transitions\n got %v\nwant %v", got, want)
	}
	st := e.Stats()
	if st.Firing != 0 || st.Pending != 0 || st.Suppressed != 4 || st.Fired != 2 || st.Cleared != 2 {
		t.Fatalf("final stats %+v", st)
	}
	// The two clears were sent at press-1's window 5 emission point.
	rows := readOutbox(t, db)
	if len(rows) != 8 {
		t.Fatalf("%d outbox rows, want 4 alerts and their 4 local messages", len(rows))
	}
	for _, row := range rows[4:] {
		if row.EmittedAt != win("press-1", "", 5, 0, 1).at {
			t.Fatalf("held-back clear emitted at %d, want window 5's emission %d", row.EmittedAt, win("press-1", "", 5, 0, 1).at)
		}
	}
}

// A transition held back by min_interval and sent with a later window
// whose value sits in the hysteresis band reports the value that made it,
// one that meets the condition it names.
func TestHeldBackTransitionReportsAValueMeetingItsCondition(t *testing.T) {
	db := openDB(t, "")
	r := overheating() // mean > 80, clear mean < 75
	r.For, r.MinInterval = 1, config.Duration(3*time.Minute)
	e := newEngine(t, db, testConfig(r))
	var calls []call
	for i, v := range []float64{85, 70, 77, 77, 77, 77} {
		calls = append(calls, win("press-1", "temperature", i, v, 1))
	}
	emit(t, db, e, calls...)
	got := transitions(t, alerts(t, db), "overheating")
	want := strs(
		transition{"press-1", 0, StateFired, 85, 0},
		transition{"press-1", 2, StateCleared, 70, 0}, // sent with window 2 (77), made by window 1 (70)
	)
	if !slices.Equal(got, want) {
		t.Fatalf("transitions\n got %v\nwant %v", got, want)
	}
	ls := locals(t, db)
	if len(ls) != 2 || ls[1].JSON["value"] != 70.0 || ls[1].JSON["condition"] != "mean < 75" {
		t.Fatalf("local messages %v, want the clear with value 70 and its condition", ls)
	}
}

// A clear_when on another aggregate than when's can hold in the same
// window as when: the alert stays firing there instead of clearing and
// firing again every window.
func TestClearOnAnotherAggregateWhileWhenHolds(t *testing.T) {
	db := openDB(t, "")
	r := overheating()
	r.For, r.When, r.ClearWhen = 1, "max > 95", "mean < 99"
	e := newEngine(t, db, testConfig(r))
	var calls []call
	for i, v := range []float64{96, 96, 96, 50} {
		calls = append(calls, win("press-1", "temperature", i, v, 1))
	}
	emit(t, db, e, calls...)
	got := transitions(t, alerts(t, db), "overheating")
	want := strs(
		transition{"press-1", 0, StateFired, 96, 0},
		transition{"press-1", 3, StateCleared, 50, 0},
	)
	if !slices.Equal(got, want) {
		t.Fatalf("transitions\n got %v\nwant %v", got, want)
	}
}

// TestStormSummary fires 30 devices at one emission point: 30 uplink
// alerts, one local summary. Below the threshold, messages stay individual;
// retained rules are never folded; a storm split over two transactions
// still ends with only the summary in the outbox.
func TestStormSummary(t *testing.T) {
	storm := func(prefix string, n, window int, v float64) []call {
		var cs []call
		at := win("x", "", window, 0, 1).at
		for i := range n {
			cs = append(cs, win(fmt.Sprintf("%s-%02d", prefix, i), "temperature", window, v, 1).atTime(at))
		}
		return cs
	}
	r := overheating()
	r.For = 1
	r.Devices = "*"
	cfg := testConfig(r)
	cfg.LocalPublish.StormThreshold = 20

	t.Run("one transaction", func(t *testing.T) {
		db := openDB(t, "")
		e := newEngine(t, db, cfg)
		emit(t, db, e, storm("press", 30, 0, 90)...)
		if n := len(alerts(t, db)); n != 30 {
			t.Fatalf("%d uplink alerts, want 30", n)
		}
		ls := locals(t, db)
		if len(ls) != 1 {
			t.Fatalf("%d local rows, want one summary", len(ls))
		}
		j := ls[0].JSON
		if ls[0].Msg.Topic != "edgeagent/gw1/alerts/_summary" || j["type"] != TypeSummary || j["transitions"] != 30.0 ||
			j["fired"] != 30.0 || j["cleared"] != 0.0 || len(j["devices"].([]any)) != 30 || j["rule"] != "overheating" {
			t.Fatalf("summary %s: %v", ls[0].Msg.Topic, j)
		}
		// 20 individual messages at the threshold, then one summary: the 20
		// were replaced, and each further transition rewrote the summary.
		if st := e.Stats(); st.Summaries != 1 || st.LocalFolded != 30 || st.LocalMessages != 1 || st.Firing != 30 {
			t.Fatalf("stats %+v", st)
		}

		// The next emission point has 20 clears: exactly the threshold,
		// so 20 individual messages.
		emit(t, db, e, storm("press", 20, 1, 10)...)
		if n := len(locals(t, db)); n != 21 {
			t.Fatalf("%d local rows after 20 clears, want 1 + 20", n)
		}
	})

	// What an earlier transaction queued may be out already (the local
	// publisher reads committed rows): it is never deleted or rewritten,
	// so no key goes out with two contents.
	t.Run("split over two transactions", func(t *testing.T) {
		db := openDB(t, "")
		e := newEngine(t, db, cfg)
		cs := storm("press", 25, 0, 90)
		emit(t, db, e, cs[:15]...)
		if n := len(locals(t, db)); n != 15 {
			t.Fatalf("%d local rows after the first part, want 15", n)
		}
		emit(t, db, e, cs[15:]...)
		ls := locals(t, db)
		if len(ls) != 16 || ls[15].JSON["type"] != TypeSummary || ls[15].JSON["transitions"] != 25.0 {
			t.Fatalf("local rows after the storm: %d, want the first transaction's 15 and a summary of 25", len(ls))
		}
	})

	// The storm goes on after the transaction that queued its summary:
	// the next summary is a new part with its own key and only the
	// transitions after the first, held until the storm ends, never the
	// old key with new contents.
	t.Run("split after the summary was committed", func(t *testing.T) {
		db := openDB(t, "")
		e := newEngine(t, db, cfg)
		cs := storm("press", 40, 0, 90)
		emit(t, db, e, cs[:25]...)
		first := locals(t, db)
		if len(first) != 1 || first[0].JSON["transitions"] != 25.0 || first[0].JSON["part"] != nil {
			t.Fatalf("local rows after the first part: %v", first)
		}
		emit(t, db, e, cs[25:32]...)
		emit(t, db, e, cs[32:]...)
		if ls := locals(t, db); len(ls) != 1 {
			t.Fatalf("%d local rows while the storm's instant lasts, want the first summary only", len(ls))
		}
		// A window emitted at a later instant ends the storm (storm_window
		// 0s: one instant) and releases the held part.
		emit(t, db, e, win("other-1", "temperature", 1, 20, 1))
		ls := locals(t, db)[1:]
		if len(ls) != 1 {
			t.Fatalf("%d local rows after the storm, want the second summary", len(ls))
		}
		j := ls[0].JSON
		wantKey := first[0].JSON["key"].(string) + "/2"
		if j["key"] != wantKey || j["part"] != 2.0 || j["transitions"] != 15.0 || j["fired"] != 15.0 || len(j["devices"].([]any)) != 15 || j["devices"].([]any)[0] != "press-25" {
			t.Fatalf("second summary %v, want key %s, part 2, the 15 transitions after the first", j, wantKey)
		}
		if st := e.Stats(); st.Summaries != 2 || st.LocalMessages != 2 || st.LocalFolded != 40 {
			t.Fatalf("stats %+v, want 2 summaries queued, all 40 transitions folded into them", st)
		}
	})

	t.Run("retained rules are not folded", func(t *testing.T) {
		db := openDB(t, "")
		rr := r
		rr.Retain = true
		e := newEngine(t, db, testConfig(rr))
		emit(t, db, e, storm("press", 25, 0, 90)...)
		ls := locals(t, db)
		if len(ls) != 25 || !ls[0].Msg.Retain {
			t.Fatalf("%d local rows (retain %v), want 25 retained", len(ls), len(ls) > 0 && ls[0].Msg.Retain)
		}
	})

	t.Run("uplink-only rules queue no local rows", func(t *testing.T) {
		db := openDB(t, "")
		ru := r
		ru.Actions = []string{"uplink"}
		e := newEngine(t, db, testConfig(ru))
		emit(t, db, e, storm("press", 25, 0, 90)...)
		if n, m := len(alerts(t, db)), len(locals(t, db)); n != 25 || m != 0 {
			t.Fatalf("%d alerts and %d local rows, want 25 and 0", n, m)
		}
		if e.Local() {
			t.Fatal("Local() with no local action and no aggregates topic")
		}
	})
}

// TestStormWindow: transitions of one rule within storm_window of its
// first are one storm, though emitted at different instants, as a fleet's
// windows close one device at a time. Once the summary went out, the rest
// of the storm is held and queued as one more part when the window ends,
// not as a part per micro-batch. Transitions further apart are no storm.
func TestStormWindow(t *testing.T) {
	r := overheating()
	r.For = 1
	cfg := testConfig(r)
	cfg.LocalPublish.StormWindow = config.Duration(time.Minute)
	at0 := win("x", "", 0, 0, 1).at
	spread := func(from, n int, step int64) []call {
		var cs []call
		for i := range n {
			cs = append(cs, win(fmt.Sprintf("press-%02d", from+i), "temperature", 0, 90, 1).atTime(at0+int64(from+i)*step))
		}
		return cs
	}

	t.Run("spread over the window", func(t *testing.T) {
		db := openDB(t, "")
		e := newEngine(t, db, cfg)
		emit(t, db, e, spread(0, 30, 1000)...)
		ls := locals(t, db)
		if len(alerts(t, db)) != 30 || len(ls) != 1 || ls[0].JSON["type"] != TypeSummary || ls[0].JSON["transitions"] != 30.0 {
			t.Fatalf("%d uplink alerts, local rows %v: want 30 alerts and one summary of 30", len(alerts(t, db)), ls)
		}
		if key := ls[0].JSON["key"]; key != fmt.Sprintf("gw1/overheating/_summary/%d", at0) {
			t.Fatalf("summary key %v, want the storm's first instant", key)
		}
	})

	t.Run("the rest after a published summary waits for the window's end", func(t *testing.T) {
		db := openDB(t, "")
		e := newEngine(t, db, cfg)
		emit(t, db, e, spread(0, 25, 1000)...)
		first := locals(t, db)
		if len(first) != 1 {
			t.Fatalf("local rows after 25 transitions: %v, want one summary", first)
		}
		if err := db.Update(func(tx *bolt.Tx) error { return outbox.Delete(tx, first[0].Seq) }); err != nil {
			t.Fatal(err)
		}
		emit(t, db, e, spread(25, 5, 1000)...)
		emit(t, db, e, spread(30, 10, 1000)...)
		if ls := locals(t, db); len(ls) != 0 {
			t.Fatalf("local rows inside the storm's window after its summary went out: %v, want none yet", ls)
		}
		// Any window emitted after the storm's window ends releases the
		// held part; this one is a device the rule does not watch.
		emit(t, db, e, win("other-1", "temperature", 0, 20, 1).atTime(at0+60_000))
		ls := locals(t, db)
		if len(ls) != 1 {
			t.Fatalf("local rows after the window ended: %v, want the second part", ls)
		}
		j := ls[0].JSON
		if j["key"] != first[0].JSON["key"].(string)+"/2" || j["part"] != 2.0 || j["transitions"] != 15.0 || j["emitted_at"] != float64(at0+60_000) {
			t.Fatalf("second part %v, want key /2, part 2, the 15 transitions after the first summary, emitted at the window's end", j)
		}
		if st := e.Stats(); st.Summaries != 2 || st.LocalFolded != 40 {
			t.Fatalf("stats %+v, want 2 summaries and all 40 transitions folded", st)
		}
	})

	t.Run("further apart is no storm", func(t *testing.T) {
		db := openDB(t, "")
		e := newEngine(t, db, cfg)
		emit(t, db, e, spread(0, 30, 5000)...) // 150 s: 12 in each of the first two minutes, 6 in the third
		if ls := locals(t, db); len(ls) != 30 {
			t.Fatalf("%d local rows, want 30 individual messages", len(ls))
		}
	})
}

func TestDeviceGlob(t *testing.T) {
	cases := []struct {
		glob   string
		device string
		match  bool
	}{
		{"press-*", "press-1", true},
		{"press-*", "press-", true},
		{"press-*", "boiler-1", false},
		{"press-?", "press-12", false},
		{"press-[0-4]", "press-3", true},
		{"press-[0-4]", "press-7", false},
		{"*", "anything", true},
		{"", "anything", true}, // empty means every device
		{"line1-*-temp", "line1-a-temp", true},
	}
	for _, c := range cases {
		t.Run(c.glob+"/"+c.device, func(t *testing.T) {
			db := openDB(t, "")
			r := overheating()
			r.Devices, r.For = c.glob, 1
			e := newEngine(t, db, testConfig(r))
			emit(t, db, e, win(c.device, "temperature", 0, 99, 1))
			if got := len(alerts(t, db)) == 1; got != c.match {
				t.Fatalf("glob %q on %q: alert %v, want %v", c.glob, c.device, got, c.match)
			}
		})
	}
}

// TestRevisions: a revision of the latest window is evaluated again from
// the state before it; one of an older window is ignored; a revision that
// flips a decision already sent at its window start is held to the next
// window, so no key is sent twice.
func TestRevisions(t *testing.T) {
	t.Run("latest window re-evaluated", func(t *testing.T) {
		db := openDB(t, "")
		r := overheating()
		r.For, r.ClearWhen = 1, ""
		e := newEngine(t, db, testConfig(r))
		emit(t, db, e,
			win("press-1", "temperature", 0, 70, 1),
			win("press-1", "temperature", 0, 85, 2), // late data: now fires
			win("press-1", "temperature", 1, 70, 1), // clears
			win("press-1", "temperature", 0, 99, 3), // older than the latest: ignored
			win("press-1", "temperature", 1, 90, 2), // flips window 1 back: held to window 2
			win("press-1", "temperature", 2, 90, 1),
		)
		got := transitions(t, alerts(t, db), "overheating")
		want := strs(
			transition{"press-1", 0, StateFired, 85, 0},
			transition{"press-1", 1, StateCleared, 70, 0},
			transition{"press-1", 2, StateFired, 90, 0},
		)
		if !slices.Equal(got, want) {
			t.Fatalf("transitions\n got %v\nwant %v", got, want)
		}
		if st := e.Stats(); st.IgnoredRevisions != 1 {
			t.Fatalf("ignored revisions %d, want 1", st.IgnoredRevisions)
		}
	})
	t.Run("revision completes a streak", func(t *testing.T) {
		db := openDB(t, "")
		e := newEngine(t, db, testConfig(overheating())) // for: 2
		emit(t, db, e,
			win("press-1", "temperature", 0, 85, 1),
			win("press-1", "temperature", 1, 70, 1),
			win("press-1", "temperature", 1, 82, 2),
			win("press-1", "temperature", 1, 83, 3), // same decision again: nothing new
		)
		got := transitions(t, alerts(t, db), "overheating")
		if want := strs(transition{"press-1", 1, StateFired, 82, 0}); !slices.Equal(got, want) {
			t.Fatalf("transitions\n got %v\nwant %v", got, want)
		}
	})
}

// TestAggregateChoice evaluates count and skips windows that lack the
// aggregate a condition names.
func TestAggregateChoice(t *testing.T) {
	db := openDB(t, "")
	rc := config.AlertRule{Name: "busy", Metric: "temperature", When: "count >= 4", Actions: []string{"uplink"}}
	rm := config.AlertRule{Name: "peak", Metric: "temperature", When: "max > 5", Actions: []string{"uplink"}}
	e := newEngine(t, db, testConfig(rc, rm))
	c := win("press-1", "temperature", 0, 10, 1)
	c.a.Max = nil // window.aggregates without max
	emit(t, db, e, c)
	got := transitions(t, alerts(t, db), "busy")
	if want := strs(transition{"press-1", 0, StateFired, 4, 0}); !slices.Equal(got, want) {
		t.Fatalf("count rule: %v, want %v", got, want)
	}
	if n := len(transitions(t, alerts(t, db), "peak")); n != 0 {
		t.Fatalf("max rule fired %d times on a window without max", n)
	}
	if st := e.Stats(); st.States != 1 {
		t.Fatalf("%d states, want 1 (a window without the aggregate is not evaluated)", st.States)
	}
	// An infinite value goes out as CBOR, and as null in JSON.
	db2 := openDB(t, "")
	r := overheating()
	r.For = 1
	e2 := newEngine(t, db2, testConfig(r))
	inf := win("press-1", "temperature", 0, math.Inf(1), 1)
	emit(t, db2, e2, inf)
	if ls := locals(t, db2); len(ls) != 1 || ls[0].JSON["value"] != nil {
		t.Fatalf("local message of an infinite mean: %v", ls)
	}
	if as := alerts(t, db2); len(as) != 1 || !math.IsInf(as[0].Value, 1) {
		t.Fatalf("uplink alert of an infinite mean: %+v", as)
	}
}

// TestAggregatesTopic republishes every emitted aggregate as JSON with the
// wire format's field names.
func TestAggregatesTopic(t *testing.T) {
	db := openDB(t, "")
	cfg := testConfig()
	cfg.LocalPublish.AggregatesTopic = "edgeagent/{gateway_id}/aggregates/{device}/{metric}"
	e := newEngine(t, db, cfg)
	if !e.Local() {
		t.Fatal("Local() false with an aggregates topic")
	}
	c := win("press-1", "temperature", 3, 21.5, 2)
	c.a.First, c.a.ProcTime = nil, true
	emit(t, db, e, c)
	ls := locals(t, db)
	if len(ls) != 1 || ls[0].Msg.Topic != "edgeagent/gw1/aggregates/press-1/temperature" {
		t.Fatalf("local rows %+v", ls)
	}
	j := ls[0].JSON
	want := map[string]any{
		"type": "aggregate", "gateway": "gw1", "device": "press-1", "metric": "temperature",
		"start": float64(c.a.Start), "end": float64(c.a.End), "count": 4.0,
		"sum": 86.0, "min": 21.5, "max": 21.5, "mean": 21.5, "last": 21.5,
		"rev": 2.0, "key": c.a.Key, "ptime": true,
	}
	if fmt.Sprint(j) != fmt.Sprint(want) {
		t.Fatalf("aggregate message\n got %v\nwant %v", j, want)
	}
}

// TestRollbackReloads: an Emitted call whose transaction rolls back leaves
// no trace; the next transaction sees the committed state.
func TestRollbackReloads(t *testing.T) {
	db := openDB(t, "")
	r := overheating()
	r.For = 1
	e := newEngine(t, db, testConfig(r))
	fire := win("press-1", "temperature", 0, 90, 1)
	injected := errors.New("injected")
	err := db.Update(func(tx *bolt.Tx) error {
		if err := e.Emitted(tx, &fire.a, fire.at); err != nil {
			return err
		}
		return injected
	})
	if !errors.Is(err, injected) {
		t.Fatalf("update: %v", err)
	}
	if st := e.Stats(); st.Fired != 0 || st.Firing != 0 {
		t.Fatalf("stats after a rollback %+v", st)
	}
	emit(t, db, e, fire)
	got := transitions(t, alerts(t, db), "overheating")
	if want := strs(transition{"press-1", 0, StateFired, 90, 0}); !slices.Equal(got, want) {
		t.Fatalf("after retry: %v, want %v", got, want)
	}
}

// TestExpiryAndPrune: quiet states go after Expiry of logged time, firing
// ones stay; New drops the states of removed rules and unmatched devices.
func TestExpiryAndPrune(t *testing.T) {
	db := openDB(t, "")
	r := overheating()
	r.For = 1
	cfg := testConfig(r)
	cfg.Expiry = 2 * time.Hour
	e := newEngine(t, db, cfg)
	emit(t, db, e, win("press-1", "temperature", 0, 90, 1), win("press-2", "temperature", 0, 50, 1))
	if st := e.Stats(); st.States != 2 {
		t.Fatalf("%d states, want 2", st.States)
	}
	emit(t, db, e, win("press-3", "temperature", 181, 50, 1)) // three hours later
	if st := e.Stats(); st.States != 2 || st.Firing != 1 {
		t.Fatalf("after expiry: %+v, want press-1 (firing) and press-3", st)
	}

	// Narrow the glob so press-3 no longer matches, and add a rule.
	r.Devices = "press-[12]"
	other := config.AlertRule{Name: "other", Metric: "temperature", When: "mean > 0", Actions: []string{"uplink"}}
	e2 := newEngine(t, db, testConfig(r, other))
	if st := e2.Stats(); st.States != 1 || st.Firing != 1 || st.Rules != 2 {
		t.Fatalf("after pruning: %+v", st)
	}
	// Remove the overheating rule.
	e3 := newEngine(t, db, testConfig(other))
	if st := e3.Stats(); st.States != 0 || st.Firing != 0 {
		t.Fatalf("after removing the rule: %+v", st)
	}
	if err := db.Update(Reset); err != nil {
		t.Fatal(err)
	}
	if err := db.View(func(tx *bolt.Tx) error {
		for _, b := range buckets {
			if tx.Bucket(b) != nil {
				return fmt.Errorf("bucket %s survived Reset", b)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestConfigErrors(t *testing.T) {
	good := overheating()
	cases := map[string]func(c *Config){
		"no gateway":      func(c *Config) { c.Gateway = "" },
		"no name":         func(c *Config) { c.Rules[0].Name = "" },
		"duplicate name":  func(c *Config) { c.Rules = append(c.Rules, good) },
		"no metric":       func(c *Config) { c.Rules[0].Metric = "" },
		"bad glob":        func(c *Config) { c.Rules[0].Devices = "[" },
		"bad when":        func(c *Config) { c.Rules[0].When = "mean >> 80" },
		"bad clear":       func(c *Config) { c.Rules[0].ClearWhen = "median < 2" },
		"negative for":    func(c *Config) { c.Rules[0].For = -1 },
		"negative minint": func(c *Config) { c.Rules[0].MinInterval = -1 },
		"unknown action":  func(c *Config) { c.Rules[0].Actions = []string{"email"} },
		"local, no topic": func(c *Config) { c.LocalPublish.AlertsTopic = "" },
		"bad topic":       func(c *Config) { c.LocalPublish.AggregatesTopic = "a/{x}" },
		"negative storm":  func(c *Config) { c.LocalPublish.StormThreshold = -1 },
		"negative expiry": func(c *Config) { c.Expiry = -time.Second },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig(good)
			mutate(&cfg)
			if _, err := New(openDB(t, ""), cfg); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("New: %v, want ErrInvalidConfig", err)
			}
		})
	}
}

func TestStateEncoding(t *testing.T) {
	s := &state{evaluated: true, lastStart: -5, lastEnd: 1 << 40, lastAt: 7, streak: 3, baseStreak: 2,
		want: true, firing: true, baseWant: false, value: math.Inf(-1), hasTrans: true, transAt: 9, transStart: -1, suppressed: 4}
	got, err := decodeState(encodeState(s))
	if err != nil || *got != *s {
		t.Fatalf("state round trip: %+v, %v", got, err)
	}
	for _, part := range []uint32{0, 3, 4} {
		g := &group{at: 5, count: 3, fired: 2, cleared: 1, seqs: []uint64{1, 9}, summarySeq: 4, devices: []string{"a", ""}, part: part, held: part == 4}
		g2, err := decodeGroup(encodeGroup(g))
		if err != nil || fmt.Sprint(*g2) != fmt.Sprint(*g) {
			t.Fatalf("group round trip: %+v, %v", g2, err)
		}
	}
	for _, b := range [][]byte{nil, {9}, encodeState(s)[:5], append(encodeState(s), 0)} {
		if _, err := decodeState(b); !errors.Is(err, ErrCorruptState) {
			t.Fatalf("decode %x: %v, want ErrCorruptState", b, err)
		}
	}
	if _, err := decodeGroup([]byte{1, 2}); !errors.Is(err, ErrCorruptState) {
		t.Fatalf("decode short group: %v", err)
	}
}

// TestWireAlertFields checks one uplink alert field by field.
func TestWireAlertFields(t *testing.T) {
	db := openDB(t, "")
	r := overheating()
	r.For = 1
	e := newEngine(t, db, testConfig(r))
	c := win("press-9", "temperature", 2, 88, 1)
	emit(t, db, e, c)
	as := alerts(t, db)
	want := wire.Alert{Rule: "overheating", Device: "press-9", Metric: "temperature", Start: c.a.Start, State: "fired",
		Severity: "high", Value: 88, Key: fmt.Sprintf("gw1/overheating/press-9/%d/fired", c.a.Start)}
	if len(as) != 1 || as[0] != want {
		t.Fatalf("alerts %+v, want %+v", as, want)
	}
	if rows := readOutbox(t, db); rows[0].EmittedAt != c.at {
		t.Fatalf("alert row emitted at %d, want %d", rows[0].EmittedAt, c.at)
	}
}

func TestCompileTopic(t *testing.T) {
	cases := []struct{ tmpl, device, metric, want string }{
		{"edgeagent/{gateway_id}/alerts/{device}", "press-1", "", "edgeagent/gw1/alerts/press-1"},
		{"a/{device}/{metric}/{gateway_id}", "d", "m", "a/d/m/gw1"},
		{"{device}{metric}", "{metric}", "x", "{metric}x"}, // one pass
		{"odd/{x}/{", "d", "m", "odd/{x}/{"},
		{"", "d", "m", ""},
		// A payload key is any string: each name stays one level the
		// broker accepts, and reads back.
		{"agg/{device}/{metric}", "d", "p+q", "agg/d/p%2Bq"},
		{"agg/{device}/{metric}", "d", "a/b#", "agg/d/a%2Fb%23"},
		{"agg/{device}/{metric}", "50%", "x\x00", "agg/50%25/x%00"},
		// What MQTT lets a broker take for a malformed packet (mosquitto
		// drops the connection, and the row was retried for ever): control
		// characters, noncharacters, invalid UTF-8. Other Unicode stays.
		{"agg/{device}/{metric}", "d", "t\x01\t\x7f", "agg/d/t%01%09%7F"},
		{"agg/{device}/{metric}", "d", "a\u0085b\u00a0", "agg/d/a%C2%85b\u00a0"},
		{"agg/{device}/{metric}", "d", "\ufdd0\uffff\U0001fffe\ufffd", "agg/d/%EF%B7%90%EF%BF%BF%F0%9F%BF%BE\ufffd"},
		{"agg/{device}/{metric}", "d\xff", "°C", "agg/d%FF/°C"},
	}
	for _, c := range cases {
		if got := compileTopic(c.tmpl, "gw1").expand(c.device, c.metric); got != c.want {
			t.Errorf("%q with %q, %q: %q, want %q", c.tmpl, c.device, c.metric, got, c.want)
		}
	}
}

func FuzzDecodeState(f *testing.F) {
	f.Add(encodeState(&state{evaluated: true, lastStart: t0, want: true, value: 81}))
	f.Add(encodeGroup(&group{at: t0, count: 2, seqs: []uint64{3}, devices: []string{"d"}}))
	f.Add([]byte{1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		if s, err := decodeState(b); err == nil {
			again, err := decodeState(encodeState(s))
			if err != nil || math.Float64bits(again.value) != math.Float64bits(s.value) {
				t.Fatalf("state not a fixed point: %+v, %v", again, err)
			}
			again.value, s.value = 0, 0
			if *again != *s {
				t.Fatalf("state not a fixed point: %+v then %+v", s, again)
			}
		} else if !errors.Is(err, ErrCorruptState) {
			t.Fatalf("error %v does not wrap ErrCorruptState", err)
		}
		if g, err := decodeGroup(b); err == nil {
			again, err := decodeGroup(encodeGroup(g))
			if err != nil || fmt.Sprint(*again) != fmt.Sprint(*g) {
				t.Fatalf("group not a fixed point: %+v then %+v (%v)", g, again, err)
			}
		} else if !errors.Is(err, ErrCorruptState) {
			t.Fatalf("error %v does not wrap ErrCorruptState", err)
		}
	})
}
