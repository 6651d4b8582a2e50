// Package heapgoal keeps the Go heap's goal from following a passing peak
// of live memory, and from doubling memory the collector never scans.
//
// The runtime sets the next heap goal at 1+GOGC/100 times what the last
// collection found live. When a collection lands while a checkpoint, a
// sealing round or a batch's outputs are held, the goal doubles that peak
// too, and the resident memory follows the goal. The headroom also grows
// with pointer-free memory (the zstd encoder's tables, byte arenas,
// Bronze's buffers), which the collector does not scan. Run sets a soft
// memory limit (debug.SetMemoryLimit) after every collection instead: the
// quietest live heap of the last eight collections and of the last two
// seconds, plus GOGC/100 times its scannable bytes. Marking costs what the
// scannable part holds; the headroom sets how often it runs. Pointer-free bytes got half a share
// until session 29: with Go 1.26's collector, giving them none took load
// mode's peak from 50.4-55.5 to 45.3-51.2 MiB (ten alternated pairs) for
// about 45 more collections a run and the collector's share of the CPU
// from 11-13 to 18-19 % (docs/performance.md).
// A peak costs a few earlier collections instead of resident memory.
package heapgoal

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
	"time"
)

// Pacer turns what each collection found into a soft memory limit.
type Pacer struct {
	live    [64]uint64        // live heap after the last collections, a ring
	scan    [64]uint64        // the scannable part of each, the same ring
	at      [64]time.Duration // when each was recorded, the same ring
	n       int
	gogc    float64 // GOGC/100
	ceiling int64   // a limit set before the pacer (GOMEMLIMIT), or MaxInt64
}

// The quietest collection is looked for among the last quietCollections
// and the ones of the last quietSpan. The span is for bursts: a
// checkpoint's transient (its array of changes, bbolt's dirty pages) makes
// the collector run every 30-40 ms for half a second in load mode, and
// eight collections of it made the limit follow it, 5 MB up (logged: 44.5
// MB against 39); the pacer's purpose is that a passing peak does not set
// the limit. A lasting growth is followed once the span has passed, and
// the floors bound what it costs until then (see Limit).
const (
	quietCollections = 8
	quietSpan        = 2 * time.Second
)

// NewPacer returns a pacer for GOGC gcPercent that never sets a limit
// above ceiling.
func NewPacer(gcPercent int, ceiling int64) *Pacer {
	return &Pacer{gogc: float64(gcPercent) / 100, ceiling: ceiling}
}

// minHeadroom keeps a small heap from collecting back to back (the
// runtime's own smallest goal is 4 MB).
const minHeadroom = 4 << 20

// Limit records that a collection found live bytes of heap at time at
// (monotonic, any origin), of which scan bytes (with stacks and globals)
// are scannable, with overhead bytes of runtime memory outside the heap's
// objects and free pages (stacks, metadata, the unused ends of spans), and
// returns the limit to set until the next one.
func (p *Pacer) Limit(live, scan, overhead uint64, at time.Duration) int64 {
	i := p.n % len(p.live)
	p.live[i], p.scan[i], p.at[i] = live, scan, at
	p.n++
	quiet, quietScan := live, scan
	for k := range min(p.n, len(p.live)) { // k collections back
		j := (i - k + len(p.live)) % len(p.live)
		if k >= quietCollections && at-p.at[j] > quietSpan {
			break
		}
		quiet, quietScan = min(quiet, p.live[j]), min(quietScan, p.scan[j])
	}
	// GOGC's share of the quietest live heap's scannable bytes: the
	// pointer-free ones get none (see the package doc).
	headroom := p.gogc * float64(min(quietScan, quiet))
	// The floors bound what a lasting growth (more devices) costs until
	// the quietest collection catches up with it: a collection per eighth
	// of growth, never back to back. An eighth rather than a quarter: a
	// collection that lands on a batch's or a checkpoint's transient sets
	// the limit from the floor, and the resident memory follows it.
	heap := max(float64(quiet)+headroom, 1.125*float64(live), float64(live+minHeadroom))
	if heap+float64(overhead) >= float64(p.ceiling) {
		return p.ceiling
	}
	return int64(heap) + int64(overhead)
}

var sampleNames = [...]string{
	"/gc/heap/live:bytes",
	"/memory/classes/total:bytes",
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/free:bytes",
	"/memory/classes/heap/released:bytes",
	"/gc/scan/heap:bytes", // what the last collection scanned, plus scannable allocations since
	"/gc/scan/stack:bytes",
	"/gc/scan/globals:bytes",
}

// running is set while a Run paces: the limit is the process's, so one
// pacer at a time.
var running atomic.Bool

// Run paces the heap after every collection until ctx ends, then
// restores the limit it found. With GOGC=off, or while another Run
// paces, it leaves the limit alone and returns at once.
func Run(ctx context.Context) {
	if !running.CompareAndSwap(false, true) {
		return
	}
	defer running.Store(false)
	pct := debug.SetGCPercent(-1)
	debug.SetGCPercent(pct)
	if pct < 0 {
		return
	}
	found := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(found)
	p := NewPacer(pct, found)
	var samples [len(sampleNames)]metrics.Sample
	for i, n := range sampleNames {
		samples[i].Name = n
	}
	collected := make(chan struct{}, 1)
	notifyEachCollection(ctx, collected)
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-collected:
		}
		metrics.Read(samples[:])
		v := func(i int) uint64 { return samples[i].Value.Uint64() }
		live, total, objects, free, released := v(0), v(1), v(2), v(3), v(4)
		scan := v(5) + v(6) + v(7)
		debug.SetMemoryLimit(p.Limit(live, scan, total-objects-free-released, time.Since(start)))
	}
}

// sentinel is allocated only to be collected. Its pointer keeps it out of
// the tiny allocator, whose blocks hold several objects and may never be
// freed.
type sentinel struct {
	_ *int
	_ [8]byte
}

// notifyEachCollection sends on ch (without blocking) after each garbage
// collection until ctx ends: a sentinel's finalizer runs after the cycle
// that found it unreachable, and arms the next sentinel (a finalizer, not
// runtime.AddCleanup, whose generic code cost 1.3 KB of the arm64 budget).
func notifyEachCollection(ctx context.Context, ch chan<- struct{}) {
	var arm func()
	arm = func() {
		runtime.SetFinalizer(new(sentinel), func(*sentinel) {
			if ctx.Err() != nil {
				return
			}
			select {
			case ch <- struct{}{}:
			default:
			}
			arm()
		})
	}
	arm()
}
