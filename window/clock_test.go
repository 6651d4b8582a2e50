package window

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"
	"time"

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
	if !res.WholeFrom.Equal(newest.Add(cfg.withDefaults().MaxFutureSkew)) {
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
	if want := time.Unix(0, br.TrimmedNewest()).Add(cfg.withDefaults().MaxFutureSkew).UTC(); !res.WholeFrom.Equal(want) {
		t.Fatalf("whole from %v, want the newest trimmed stamp plus the live skew, %v", res.WholeFrom, want)
	}
}
