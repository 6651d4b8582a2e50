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
