package heapgoal

import (
	"context"
	"math"
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

const mb = 1 << 20

// collect gives p a collection 10 s after the last one: the last
// quietCollections count, and no more.
func collect(p *Pacer, live, scan, overhead uint64) int64 {
	return p.Limit(live, scan, overhead, time.Duration(p.n)*10*time.Second)
}

// feed gives p one collection per live value, of a heap made only of
// pointers, 10 s apart, and returns the last limit.
func feed(p *Pacer, overhead uint64, lives ...uint64) int64 {
	var limit int64
	for _, l := range lives {
		limit = collect(p, l, l, overhead)
	}
	return limit
}

func TestSteadyHeapGetsTheGOGCGoal(t *testing.T) {
	p := NewPacer(100, math.MaxInt64)
	if got, want := feed(p, 3*mb, 20*mb, 20*mb, 20*mb), int64(43*mb); got != want {
		t.Fatalf("limit %d, want %d (twice the live heap plus the overhead)", got, want)
	}
	p = NewPacer(50, math.MaxInt64)
	if got, want := feed(p, 3*mb, 20*mb, 20*mb), int64(33*mb); got != want {
		t.Fatalf("GOGC=50: limit %d, want %d", got, want)
	}
}

func TestPointerFreeMemoryGetsNoHeadroom(t *testing.T) {
	p := NewPacer(100, math.MaxInt64)
	// 20 MB live, of which 12 MB is pointer-free (tables, byte arenas):
	// the headroom is the 8 MB the collector scans.
	var limit int64
	for range 3 {
		limit = collect(p, 20*mb, 8*mb, 3*mb)
	}
	if want := int64(31 * mb); limit != want {
		t.Fatalf("limit %d, want %d (live, its scannable part, the overhead)", limit, want)
	}
	p = NewPacer(50, math.MaxInt64)
	if got, want := collect(p, 20*mb, 8*mb, 0), int64(24*mb); got != want {
		t.Fatalf("GOGC=50: limit %d, want %d", got, want)
	}
	// All pointer-free, the heap still gets the floor's eighth.
	p = NewPacer(100, math.MaxInt64)
	if got, want := collect(p, 40*mb, 0, 0), int64(45*mb); got != want {
		t.Fatalf("40 MB live, none scannable: limit %d, want %d (the floor)", got, want)
	}
}

func TestPeakDoesNotRaiseTheLimit(t *testing.T) {
	p := NewPacer(100, math.MaxInt64)
	steady := feed(p, 3*mb, 20*mb, 21*mb, 20*mb)
	// The runtime's own goal after the peak would be 60 MB.
	if got := feed(p, 3*mb, 30*mb); got != steady {
		t.Fatalf("after a 30 MB peak: limit %d, want the steady %d", got, steady)
	}
	if got := feed(p, 3*mb, 20*mb); got != steady {
		t.Fatalf("after the peak passed: limit %d, want %d", got, steady)
	}
}

func TestLastingGrowthRaisesTheLimit(t *testing.T) {
	p := NewPacer(100, math.MaxInt64)
	feed(p, 0, 20*mb, 20*mb)
	if got, want := feed(p, 0, 40*mb), int64(45*mb); got != want {
		t.Fatalf("first collection at 40 MB: limit %d, want %d (an eighth of headroom)", got, want)
	}
	// Once every collection the pacer remembers is at 40 MB, the goal is
	// GOGC's again.
	if got, want := feed(p, 0, 40*mb, 40*mb, 40*mb, 40*mb, 40*mb, 40*mb, 40*mb), int64(80*mb); got != want {
		t.Fatalf("eight collections at 40 MB: limit %d, want %d", got, want)
	}
}

// TestBurstOfCollectionsDoesNotRaiseTheLimit: a checkpoint's transient
// makes the collector run every few tens of milliseconds; the quietest
// collection of the last two seconds still sets the limit, and a level
// that lasts longer than that is followed.
func TestBurstOfCollectionsDoesNotRaiseTheLimit(t *testing.T) {
	p := NewPacer(100, math.MaxInt64)
	at := time.Duration(0)
	tick := func(gap time.Duration, live uint64) int64 {
		at += gap
		return p.Limit(live, live, 3*mb, at)
	}
	var steady int64
	for range 10 {
		steady = tick(200*time.Millisecond, 20*mb)
	}
	if want := int64(43 * mb); steady != want {
		t.Fatalf("steady at 20 MB: limit %d, want %d", steady, want)
	}
	// Twelve collections at 24 MB, 35 ms apart: the 20 MB ones are within
	// the span. 24 MB's eighth is under the headroom, so the limit holds.
	for i := range 12 {
		if got := tick(35*time.Millisecond, 24*mb); got != steady {
			t.Fatalf("collection %d of the burst: limit %d, want the steady %d", i+1, got, steady)
		}
	}
	// The level lasts: once the 20 MB collections are older than the span
	// and the last eight, GOGC's goal of 24 MB.
	var got int64
	for range 12 {
		got = tick(200*time.Millisecond, 24*mb)
	}
	if want := int64(51 * mb); got != want {
		t.Fatalf("24 MB for 2.4 s: limit %d, want %d", got, want)
	}
}

func TestSmallHeapKeepsHeadroom(t *testing.T) {
	p := NewPacer(100, math.MaxInt64)
	if got, want := feed(p, mb, mb), int64(6*mb); got != want {
		t.Fatalf("1 MB live: limit %d, want %d (4 MiB of headroom)", got, want)
	}
}

func TestLimitStaysUnderTheUsersLimit(t *testing.T) {
	p := NewPacer(100, 30*mb)
	if got := feed(p, 3*mb, 20*mb); got != 30*mb {
		t.Fatalf("limit %d above the ceiling %d", got, 30*mb)
	}
	if got, want := feed(p, 3*mb, 10*mb), int64(23*mb); got != want {
		t.Fatalf("under the ceiling: limit %d, want %d", got, want)
	}
}

// waitFor polls cond until it holds or the deadline passes, collecting
// garbage in between so that the pacer runs.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.GC()
		runtime.Gosched()
	}
}

// usersLimit stands for a GOMEMLIMIT: tests set it, and want it back.
const usersLimit = 1 << 40

// goRun starts Run(ctx) and returns a channel closed when it returns.
func goRun(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx)
	}()
	return done
}

// wantReturn fails t unless done closes soon.
func wantReturn(t *testing.T, done <-chan struct{}, why string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal(why)
	}
}

// wantUsersLimit fails t unless the limit is usersLimit.
func wantUsersLimit(t *testing.T, when string) {
	t.Helper()
	if got := debug.SetMemoryLimit(-1); got != usersLimit {
		t.Fatalf("%s: limit %d, want the user's %d", when, got, int64(usersLimit))
	}
}

func TestRunSetsAndRestoresTheLimit(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(usersLimit))
	ctx, cancel := context.WithCancel(context.Background())
	done := goRun(ctx)
	var set int64
	waitFor(t, "the pacer to set a limit", func() bool {
		set = debug.SetMemoryLimit(-1)
		return set != usersLimit
	})
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if set <= int64(ms.HeapAlloc) || set > usersLimit {
		t.Fatalf("limit %d: want above the heap (%d) and at most the user's %d", set, ms.HeapAlloc, int64(usersLimit))
	}
	cancel()
	<-done
	wantUsersLimit(t, "after Run")
}

func TestOnePacerAtATime(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(usersLimit))
	ctx, cancel := context.WithCancel(context.Background())
	first := goRun(ctx)
	waitFor(t, "the first pacer to set a limit", func() bool { return debug.SetMemoryLimit(-1) != usersLimit })
	wantReturn(t, goRun(context.Background()), "a second Run kept running beside the first")
	cancel()
	<-first
	wantUsersLimit(t, "after both")
}

func TestRunLeavesGOGCOffAlone(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(usersLimit))
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	wantReturn(t, goRun(context.Background()), "Run kept running with GOGC=off")
	wantUsersLimit(t, "with GOGC=off")
}

func TestNotifiedAfterEveryCollection(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := make(chan struct{}, 1)
	notifyEachCollection(ctx, ch)
	// Each notification arms the next sentinel; a collection that starts
	// before it is allocated does not see it, so collect until notified.
	for i := range 3 {
		waitFor(t, "a notification", func() bool {
			select {
			case <-ch:
				return true
			default:
				return false
			}
		})
		t.Logf("notification %d", i+1)
	}
}
