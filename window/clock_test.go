package window

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer"
)

// steppedBackStream is a device reporting every 10 s for three hours of
// event time, with a reading for the window before each minute's that
// arrives within its lateness (a revision), received by a gateway whose
// clock ran an hour ahead until NTP stepped it back at the 30th minute.
func steppedBackStream() []buffer.Record {
	var recs []buffer.Record
	for i := range 3 * 360 {
		et := t0.Add(time.Duration(i) * 10 * time.Second)
		recv := et.Add(time.Second)
		if i < 180 {
			recv = recv.Add(time.Hour)
		}
		// Event time a whole hour behind the stamps is within the skews.
		recs = append(recs, telemetry("d1", fmt.Sprint(i), et, recv, float64(i)))
		if i%6 == 2 && i > 6 {
			recs = append(recs, telemetry("d1", fmt.Sprint("again", i), et.Add(-70*time.Second), recv.Add(time.Millisecond), 1))
		}
	}
	return recs
}

// TestSteppedBackClockKeepsTheClockGoing: after the gateway's clock steps
// back an hour, revisions keep going out at their trigger boundaries
// instead of waiting for the clock to pass its old high mark, and the
// logged clock meets the stamps again after twice the step.
func TestSteppedBackClockKeepsTheClockGoing(t *testing.T) {
	cfg := testConfig(t) // size 1m, delay 5s, lateness 30s, trigger 1s
	cfg.AllowedLateness = 2 * time.Minute
	p := newStepper(t, cfg)
	recs := steppedBackStream()
	step := 0
	for i, r := range recs {
		p.feed(r)
		if r.ReceivedAt < recs[max(i-1, 0)].ReceivedAt-int64(time.Minute) {
			step = i
		}
		if step > 0 && i > step+20 {
			if n := p.s.Stats().PendingRevisions; n > 2 {
				t.Fatalf("record %d, %v after the step: %d revisions pending", i, time.Duration(r.ReceivedAt-recs[step].ReceivedAt), n)
			}
		}
	}
	if step == 0 {
		t.Fatal("the stream has no step back")
	}
	if st := p.s.Stats(); st.Revisions < 100 {
		t.Fatalf("%d revisions emitted, want one a minute", st.Revisions)
	}
	// Two hours and a half of stamps after a one-hour step: caught up.
	if e := p.s.eng; e.clock != e.lastStamp {
		t.Fatalf("logged clock %v, last stamp %v: not caught up", time.Unix(0, e.clock).UTC(), time.Unix(0, e.lastStamp).UTC())
	}
}

// TestSteppedBackClockIsDeterministic: the logged clock after a step back
// is a function of Bronze, whatever the batches and restarts.
func TestSteppedBackClockIsDeterministic(t *testing.T) {
	cfg := testConfig(t)
	cfg.AllowedLateness = 2 * time.Minute
	dir := t.TempDir()
	bronzePath := writeBronze(t, dir, steppedBackStream())
	var want []byte
	for i, batch := range []int{5000, 7, 100} {
		c := cfg
		c.MaxRecordsPerBatch = batch
		checkpointEveryBatch(&c)
		got := runChecked(t, bronzePath, filepath.Join(dir, fmt.Sprintf("s%d.db", batch)), c, batch == 100)
		if i == 0 {
			want = got
		} else if !bytes.Equal(got, want) {
			t.Fatalf("batch %d: outputs differ\n%s", batch, firstDiff(got, want))
		}
	}
}

// TestReplayAfterAStepBackSkipsWhatTrimmedRecordsHeld: readings without a
// timestamp take their arrival stamp, which ran an hour ahead until the
// clock stepped back. Once Bronze trimmed the stamped-ahead records, the
// oldest record left is older than what was trimmed: windows are whole
// only from the newest trimmed stamp on (an audit: replay replaced a
// window of six readings in the cloud with another six).
func TestReplayAfterAStepBackSkipsWhatTrimmedRecordsHeld(t *testing.T) {
	cfg := testConfig(t) // raw/{device}/{metric}: a number, stamped
	var recs []buffer.Record
	for i := range 360 {
		recv := t0.Add(30*time.Minute + time.Duration(i%180)*10*time.Second)
		if i < 180 {
			recv = recv.Add(30 * time.Minute) // an hour ahead of the second half
		}
		recs = append(recs, msg("raw/d1/temp", fmt.Sprint(i), recv))
	}
	br := openBronze(t, "")
	appendAll(t, br, recs)
	db, s := runFresh(t, br, cfg)
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	st, err := br.Stats()
	if err != nil {
		t.Fatal(err)
	}
	br.SetLimits(0, st.Bytes/3) // the stamped-ahead half and some of the rest go
	if n, err := br.Trim(0); err != nil || n <= 180 {
		t.Fatalf("trimmed %d records: %v", n, err)
	}
	fresh := openDB(t, "", true)
	res, err := Replay(fresh, br, cfg, t0, t0.Add(3*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	newest := time.Unix(0, br.TrimmedNewest()).UTC()
	if want := t0.Add(time.Hour + 179*10*time.Second); !newest.Equal(want) {
		t.Fatalf("Bronze says the newest trimmed stamp is %v, want %v", newest, want)
	}
	// A reading exactly the skew ahead of its arrival is accepted: whole
	// from the millisecond after.
	if !res.WholeFrom.Equal(newest.Add(cfg.withDefaults().MaxFutureSkew + time.Millisecond)) {
		t.Fatalf("replay takes windows as whole from %v; the newest trimmed stamp is %v", res.WholeFrom, newest)
	}
	// Replay counts readings the live stage found late: a window it sends
	// is whole only if no trimmed record may have had readings in it.
	whole := newest.Add(cfg.withDefaults().MaxFutureSkew).UnixMilli()
	for _, a := range decodeOutbox(t, fresh) {
		if a.Start < whole {
			t.Fatalf("replayed %s (count %d), a window the trimmed records had readings in", a.Key, a.Count)
		}
	}
	if len(decodeOutbox(t, db)) == 0 || res.Partial == 0 {
		t.Fatalf("the live stage emitted nothing, or replay skipped nothing: %+v", res)
	}
}

// TestReplayRecoversReadingsOfAClockBehind: a gateway that booted with its
// clock three days behind (fake-hwclock after three days off) dead-letters
// its devices' readings as time_future; a replay with the skew raised takes
// them in. Which windows trimmed records may have had readings in is
// bounded by the skew the live stage decided under, not the replay's own:
// with 9000h, every window had been skipped (an audit).
func TestReplayRecoversReadingsOfAClockBehind(t *testing.T) {
	cfg := testConfig(t)
	off := 72 * time.Hour
	var recs []buffer.Record
	for i := range 720 { // two hours, every 10 s
		et := t0.Add(time.Duration(i) * 10 * time.Second)
		recv := et
		if i >= 360 {
			recv = et.Add(-off) // the second hour stamped three days behind
		}
		recs = append(recs, telemetry("d1", fmt.Sprint(i), et, recv, float64(i)))
	}
	br := openBronze(t, "")
	appendAll(t, br, recs)
	db, s := runFresh(t, br, cfg)
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if n := s.Stats().DeadLetters[CodeTimeFuture]; n != 360 {
		t.Fatalf("%d readings dead-lettered time_future, want 360", n)
	}
	st, err := br.Stats()
	if err != nil {
		t.Fatal(err)
	}
	br.SetLimits(0, st.Bytes*3/4) // some of the first hour goes
	if n, err := br.Trim(0); err != nil || n == 0 || n >= 360 {
		t.Fatalf("trimmed %d records: %v", n, err)
	}
	raised := cfg
	raised.MaxFutureSkew = 9000 * time.Hour
	res, err := Replay(db, br, raised, t0.Add(time.Hour), t0.Add(2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if res.Windows != 60 || res.Partial != 0 {
		t.Fatalf("replayed %+v, want the second hour's 60 windows", res)
	}
	// The oldest record left is ten seconds after the newest trimmed.
	left, err := br.Read(0, 1)
	if err != nil || len(left) != 1 {
		t.Fatalf("read the oldest record left: %v", err)
	}
	if want := time.Unix(0, max(br.TrimmedNewest(), left[0].ReceivedAt)).Add(cfg.withDefaults().MaxFutureSkew + time.Millisecond).UTC(); !res.WholeFrom.Equal(want) {
		t.Fatalf("whole from %v, want the oldest stamp left plus the live skew, %v", res.WholeFrom, want)
	}
}

// TestSlewAfterA1970Reboot: during a step back's catch-up (the logged
// clock ahead of the stamps) the gateway reboots with its clock in 1970,
// then NTP sets it: the stamps jump forward by decades but stay behind the
// logged clock, which must not follow half of that jump (a review: it
// went to 2051).
func TestSlewAfterA1970Reboot(t *testing.T) {
	cfg := testConfig(t)
	p := newStepper(t, cfg)
	ahead := time.Hour
	i := 0
	feed := func(recv time.Time) {
		i++
		p.feed(telemetry("d1", fmt.Sprint(i), recv.Add(-ahead), recv, 1)) // event time within skews
	}
	for s := range 30 { // clock an hour ahead
		feed(t0.Add(ahead + time.Duration(s)*10*time.Second))
	}
	for s := range 10 { // NTP steps it back an hour: catch-up in progress
		feed(t0.Add(5*time.Minute + time.Duration(s)*10*time.Second))
	}
	// reboot: 1970 for 30 s (readings dead-lettered as time_past/future, but the clock sees the stamps)
	for s := range 3 {
		i++
		p.feed(tick(time.Unix(int64(20+10*s), 0)))
	}
	// NTP sets the real time, 7 minutes after the last stamp before the reboot.
	real := t0.Add(14 * time.Minute)
	p.feed(tick(real))
	got := time.Unix(0, p.s.eng.clock).UTC()
	if got.After(t0.Add(ahead + 30*time.Minute)) {
		t.Fatalf("logged clock jumped to %v (stamps at %v)", got, real)
	}
}

// TestReplayWholeFromBoundary: a trimmed record's reading may be exactly
// max_future_skew after its arrival (accepted: only "more than" is
// dead-lettered), so the window starting at that millisecond may hold it
// and is not whole (a review: replay replaced a window of two readings
// with one).
func TestReplayWholeFromBoundary(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxFutureSkew = 5 * time.Minute
	br := openBronze(t, "")
	R := t0.Add(time.Minute)
	appendAll(t, br, []buffer.Record{telemetry("d1", "a", R.Add(5*time.Minute), R, 1)})
	appendAll(t, br, []buffer.Record{telemetry("d1", "b", R.Add(5*time.Minute+10*time.Second), R.Add(5*time.Minute+11*time.Second), 2),
		tick(R.Add(20 * time.Minute))})
	db, s := runFresh(t, br, cfg)
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	trimFirstAndReplay(t, db, br, cfg, t0.Add(time.Hour))
}

// TestReplayAfterSkewLowered: records trimmed were decided under an
// earlier, larger max_future_skew than the last checkpoint's; replay
// bounds their readings by the largest the stage ran with (a review: the
// last one let replay replace a window of two readings with one).
func TestReplayAfterSkewLowered(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxFutureSkew = time.Hour
	br := openBronze(t, "")
	R := t0
	W := R.Add(50 * time.Minute) // event time 50 min after arrival
	appendAll(t, br, []buffer.Record{telemetry("d1", "a", W.Add(5*time.Second), R, 1)})
	appendAll(t, br, []buffer.Record{telemetry("d1", "b", W.Add(6*time.Second), W.Add(7*time.Second), 2), tick(W.Add(10 * time.Minute))})
	db, s := runFresh(t, br, cfg)
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	low := cfg
	low.MaxFutureSkew = 5 * time.Minute // the operator lowers it; the agent runs on
	appendAll(t, br, []buffer.Record{tick(W.Add(11 * time.Minute))})
	s2, err := New(db, br, low)
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, s2)
	if err := s2.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	trimFirstAndReplay(t, db, br, low, t0.Add(3*time.Hour))
	// reset-state keeps the largest skew: Bronze holds records decided
	// under it.
	if err := ResetState(db); err != nil {
		t.Fatal(err)
	}
	if skew, err := storedFutureSkew(db, low.MaxFutureSkew); err != nil || skew != time.Hour {
		t.Fatalf("after reset-state the largest max_future_skew is %v (%v), want 1h", skew, err)
	}
}

// trimFirstAndReplay trims Bronze's first record (alone in its chunk) and
// replays [t0, to) into db: the window that record's reading was in must
// be skipped, and no window the live stage sent may change its count.
func trimFirstAndReplay(t *testing.T, db *bolt.DB, br *buffer.Bronze, cfg Config, to time.Time) {
	t.Helper()
	st, err := br.Stats()
	if err != nil {
		t.Fatal(err)
	}
	br.SetLimits(0, st.Bytes-1)
	if n, err := br.Trim(0); err != nil || n != 1 {
		t.Fatalf("trimmed %d records (%v), want the first", n, err)
	}
	live := upsert(t, decodeOutbox(t, db))
	if res, err := Replay(db, br, cfg, t0, to); err != nil || res.Partial == 0 {
		t.Fatalf("replay %+v (%v): the window the trimmed reading was in should be skipped", res, err)
	}
	for id, a := range upsert(t, decodeOutbox(t, db)) {
		if b, ok := live[id]; ok && a.Count != b.Count {
			t.Errorf("replay replaced %s/%s@%v count %d (live) with count %d (rev %d)", id.Device, id.Metric, time.UnixMilli(id.Start).UTC(), b.Count, a.Count, a.Rev)
		}
	}
}
