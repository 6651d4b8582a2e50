package verify

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/edgeagent/edgeagent/testrig/truth"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// DefaultTolerance is the relative tolerance of float comparisons: sums
// depend on the order of additions in their last bits, nothing more.
const DefaultTolerance = 1e-9

// CompareOptions says how to compare.
type CompareOptions struct {
	Gateway string
	// Aggregates are the configured aggregates (count is always compared).
	Aggregates []string
	// AtLeastOnce relaxes processing-time series: their readings carry no
	// event id, so a message the broker delivered twice (after a crash)
	// counts twice. Counts must then be at least the expected ones, min and
	// max equal; sums are not compared.
	AtLeastOnce bool
	Tolerance   float64
	// MaxExamples bounds the problems listed (default 10).
	MaxExamples int
	// Size and Slide are the scenario's window geometry: every window must
	// end Size after its start, on a multiple of Slide, and a
	// processing-time series holds each reading Size/Slide times (zero:
	// not checked, one window a reading).
	Size, Slide time.Duration
}

// geometry describes how a window's bounds differ from the scenario's,
// "" when they match or o sets none.
func (o CompareOptions) geometry(start, end int64) string {
	size, slide := o.Size.Milliseconds(), o.Slide.Milliseconds()
	switch {
	case size > 0 && end-start != size:
		return fmt.Sprintf("end %s is %v after the start, want %v", fmtStart(end), time.Duration(end-start)*time.Millisecond, o.Size)
	case slide > 0 && start%slide != 0:
		return fmt.Sprintf("start not on a multiple of the slide %v", o.Slide)
	}
	return ""
}

// perReading is how many windows hold each reading.
func (o CompareOptions) perReading() uint64 {
	if o.Size <= 0 || o.Slide <= 0 {
		return 1
	}
	return uint64(o.Size / o.Slide)
}

// Result is the comparison of what arrived with the truth.
type Result struct {
	Windows  WindowCounts `json:"windows"`
	PTime    SeriesCounts `json:"ptime_series"`
	Delivery Delivery     `json:"delivery"`
	Latency  Latency      `json:"latency"`
	// Problems lists the first wrong, missing and extra windows.
	Problems []string `json:"problems,omitempty"`
}

// WindowCounts are the event-time windows after the upsert.
type WindowCounts struct {
	Expected int `json:"expected"`
	Received int `json:"received"`
	Correct  int `json:"correct"`
	Wrong    int `json:"wrong"`
	Missing  int `json:"missing"`
	Extra    int `json:"extra"`
	// Revised counts received windows whose highest revision is above 1;
	// RevisionsExpected is the truth's lower bound for it.
	Revised           int `json:"revised"`
	RevisionsExpected int `json:"revisions_expected_at_least"`
	// Overcounted are wrong windows that hold more readings than the
	// truth: a revision only adds readings, so they can never come right.
	Overcounted int `json:"overcounted"`
}

// SeriesCounts are the processing-time series, compared as totals.
type SeriesCounts struct {
	Mode     string `json:"mode"` // exact or at-least-once
	Expected int    `json:"expected"`
	Correct  int    `json:"correct"`
	Wrong    int    `json:"wrong"`
	Missing  int    `json:"missing"`
	Extra    int    `json:"extra"`
}

// Delivery is what the stream carried before the upsert.
type Delivery struct {
	Messages            uint64 `json:"messages"`
	Bytes               uint64 `json:"bytes"`
	Aggregates          uint64 `json:"aggregates"`
	DuplicateAggregates uint64 `json:"duplicate_aggregates"`
	DuplicateBatches    uint64 `json:"duplicate_batches"`
	// KeyConflicts counts aggregates that reused an idempotency key with
	// other contents: a failure (see Progress.KeyConflicts).
	KeyConflicts uint64 `json:"key_conflicts"`
	DecodeErrors uint64 `json:"decode_errors"`
}

// Latency is from a reading's publish to the arrival of the window
// revision that first held the window's final value, over the windows
// whose last reading's publish time is known.
type Latency struct {
	Windows int     `json:"windows"`
	P50Ms   float64 `json:"p50_ms"`
	P99Ms   float64 `json:"p99_ms"`
	MaxMs   float64 `json:"max_ms"`
}

// OK reports whether nothing is missing, wrong or extra.
func (r *Result) OK() bool {
	w, p := r.Windows, r.PTime
	return w.Wrong == 0 && w.Missing == 0 && w.Extra == 0 &&
		p.Wrong == 0 && p.Missing == 0 && p.Extra == 0 && r.Delivery.DecodeErrors == 0 && r.Delivery.KeyConflicts == 0
}

// Settled reports whether waiting can change the outcome no more: every
// window complete, or one that can never come right (more readings than
// the truth, where no reading may arrive twice).
func (r *Result) Settled(o CompareOptions) bool {
	return r.Complete() || !o.AtLeastOnce && r.Windows.Overcounted > 0
}

// Complete reports whether every expected window and series has arrived
// with its final value (extras do not block completion).
func (r *Result) Complete() bool {
	return r.Windows.Wrong == 0 && r.Windows.Missing == 0 && r.PTime.Wrong == 0 && r.PTime.Missing == 0
}

// Compare compares what has arrived so far with exp.
func (v *Verifier) Compare(exp *truth.Expected, o CompareOptions) *Result {
	if o.Tolerance == 0 {
		o.Tolerance = DefaultTolerance
	}
	if o.MaxExamples == 0 {
		o.MaxExamples = 10
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	res := &Result{}
	p := v.progress
	res.Delivery = Delivery{Messages: p.Messages, Bytes: p.Bytes, Aggregates: p.Aggregates,
		DuplicateAggregates: p.DuplicateAggregates, DuplicateBatches: p.DuplicateBatches, DecodeErrors: p.DecodeErrors,
		KeyConflicts: p.KeyConflicts}
	if p.DecodeErrors > 0 {
		res.Problems = append(res.Problems, "undecodable batches, last: "+v.lastErr)
	}
	res.Problems = append(res.Problems, v.conflicts...)
	var wrong, missing, extra []string
	note := func(list *[]string, format string, a ...any) {
		if len(*list) < o.MaxExamples {
			*list = append(*list, fmt.Sprintf(format, a...))
		}
	}
	ptimeDevs := map[string]bool{}
	for k := range exp.PTime {
		ptimeDevs[k.Device] = true
	}
	res.Windows.Expected = len(exp.Windows)
	res.Windows.RevisionsExpected = exp.Revisable
	var lat []float64
	for _, k := range exp.Keys() {
		want := exp.Windows[k]
		got := v.windows[WindowID{o.Gateway, k.Device, k.Metric, k.Start}]
		if got == nil {
			res.Windows.Missing++
			note(&missing, "missing %s/%s@%s: want %s", k.Device, k.Metric, fmtStart(k.Start), fmtWant(want))
			continue
		}
		diff := o.geometry(k.Start, got.best.End)
		if diff == "" {
			diff = diffWindow(&got.best, want, o)
		}
		if diff != "" {
			res.Windows.Wrong++
			if got.best.Count > want.Count {
				res.Windows.Overcounted++
			}
			note(&wrong, "wrong %s/%s@%s rev %d: %s", k.Device, k.Metric, fmtStart(k.Start), got.best.Rev, diff)
			continue
		}
		res.Windows.Correct++
		if want.LastSent > 0 {
			for _, a := range got.revs {
				if diffWindow(&a.agg, want, o) == "" {
					lat = append(lat, float64(a.at.UnixNano()-want.LastSent)/1e6)
					break
				}
			}
		}
	}
	type series struct {
		count         uint64
		sum, min, max float64
		ptimeFlag     bool
		geometry      string // a window's bounds that differ from the scenario's
	}
	got := map[truth.SeriesKey]*series{}
	var extraIDs []WindowID
	for id, r := range v.windows {
		if r.best.Rev > 1 {
			res.Windows.Revised++
		}
		if id.Gateway == o.Gateway && ptimeDevs[id.Device] {
			sk := truth.SeriesKey{Device: id.Device, Metric: id.Metric}
			s := got[sk]
			a := &r.best
			if s == nil {
				s = &series{min: math.Inf(1), max: math.Inf(-1), ptimeFlag: true}
				got[sk] = s
			}
			s.count += a.Count
			s.sum += deref(a.Sum)
			if a.Min != nil {
				s.min = math.Min(s.min, *a.Min)
			}
			if a.Max != nil {
				s.max = math.Max(s.max, *a.Max)
			}
			s.ptimeFlag = s.ptimeFlag && a.ProcTime
			if g := o.geometry(id.Start, a.End); g != "" && s.geometry == "" {
				s.geometry = fmt.Sprintf("window @%s: %s", fmtStart(id.Start), g)
			}
			continue
		}
		res.Windows.Received++
		if _, ok := exp.Windows[truth.Key{Device: id.Device, Metric: id.Metric, Start: id.Start}]; !ok || id.Gateway != o.Gateway {
			res.Windows.Extra++
			extraIDs = append(extraIDs, id)
		}
	}
	// The examples in a stable order, not the map's.
	slices.SortFunc(extraIDs, func(a, b WindowID) int {
		return cmp.Or(cmp.Compare(a.Gateway, b.Gateway), cmp.Compare(a.Device, b.Device), cmp.Compare(a.Metric, b.Metric), cmp.Compare(a.Start, b.Start))
	})
	for _, id := range extraIDs {
		if r := v.windows[id]; id.Gateway != o.Gateway {
			note(&extra, "extra window from gateway %q: %s/%s@%s", id.Gateway, id.Device, id.Metric, fmtStart(id.Start))
		} else {
			note(&extra, "extra %s/%s@%s rev %d count %d", id.Device, id.Metric, fmtStart(id.Start), r.best.Rev, r.best.Count)
		}
	}
	res.PTime.Mode = "exact"
	if o.AtLeastOnce {
		res.PTime.Mode = "at-least-once"
	}
	res.PTime.Expected = len(exp.PTime)
	sk := make([]truth.SeriesKey, 0, len(exp.PTime))
	for k := range exp.PTime {
		sk = append(sk, k)
	}
	sort.Slice(sk, func(i, j int) bool {
		return sk[i].Device < sk[j].Device || sk[i].Device == sk[j].Device && sk[i].Metric < sk[j].Metric
	})
	for _, k := range sk {
		want := exp.PTime[k]
		g := got[k]
		if g == nil {
			res.PTime.Missing++
			note(&missing, "missing series %s/%s: want count %d", k.Device, k.Metric, want.Count)
			continue
		}
		var diff string
		// Summed over the series' windows, each reading counts once a
		// window that holds it.
		n := o.perReading()
		wantCount, wantSum := want.Count*n, want.Sum*float64(n)
		switch {
		case !g.ptimeFlag:
			diff = "a window without the ptime flag"
		case g.geometry != "":
			diff = g.geometry
		case o.AtLeastOnce && g.count < wantCount, !o.AtLeastOnce && g.count != wantCount:
			diff = fmt.Sprintf("count %d, want %d", g.count, wantCount)
		case !o.AtLeastOnce && has(o.Aggregates, "sum") && !closeTo(g.sum, wantSum, o.Tolerance):
			diff = fmt.Sprintf("sum %v, want %v", g.sum, wantSum)
		case has(o.Aggregates, "min") && g.min != want.Min:
			diff = fmt.Sprintf("min %v, want %v", g.min, want.Min)
		case has(o.Aggregates, "max") && g.max != want.Max:
			diff = fmt.Sprintf("max %v, want %v", g.max, want.Max)
		}
		if diff != "" {
			res.PTime.Wrong++
			note(&wrong, "wrong series %s/%s: %s", k.Device, k.Metric, diff)
			continue
		}
		res.PTime.Correct++
	}
	var extraSeries []truth.SeriesKey
	for k := range got {
		if exp.PTime[k] == nil {
			res.PTime.Extra++
			extraSeries = append(extraSeries, k)
		}
	}
	slices.SortFunc(extraSeries, func(a, b truth.SeriesKey) int {
		return cmp.Or(cmp.Compare(a.Device, b.Device), cmp.Compare(a.Metric, b.Metric))
	})
	for _, k := range extraSeries {
		note(&extra, "extra series %s/%s", k.Device, k.Metric)
	}
	res.Problems = append(res.Problems, wrong...)
	res.Problems = append(res.Problems, missing...)
	res.Problems = append(res.Problems, extra...)
	if len(lat) > 0 {
		slices.Sort(lat)
		res.Latency = Latency{Windows: len(lat), P50Ms: quantile(lat, 0.5), P99Ms: quantile(lat, 0.99), MaxMs: lat[len(lat)-1]}
	}
	return res
}

// diffWindow describes how got differs from want, "" when it matches.
func diffWindow(got *wire.Aggregate, want *truth.Window, o CompareOptions) string {
	if got.Count != want.Count {
		return fmt.Sprintf("count %d, want %d", got.Count, want.Count)
	}
	if got.ProcTime {
		return "flagged ptime, want event time"
	}
	checks := []struct {
		name string
		got  *float64
		want float64
	}{
		{"sum", got.Sum, want.Sum}, {"min", got.Min, want.Min}, {"max", got.Max, want.Max},
		{"mean", got.Mean, want.Mean()}, {"first", got.First, want.First}, {"last", got.Last, want.Last},
	}
	for _, c := range checks {
		if !has(o.Aggregates, c.name) {
			if c.got != nil && len(o.Aggregates) > 0 {
				return c.name + " present, but not in window.aggregates"
			}
			continue
		}
		if c.got == nil {
			return c.name + " absent"
		}
		if !closeTo(*c.got, c.want, o.Tolerance) {
			return fmt.Sprintf("%s %v, want %v", c.name, *c.got, c.want)
		}
	}
	return ""
}

func closeTo(a, b, tol float64) bool {
	if a == b {
		return true
	}
	d := math.Abs(a - b)
	return d <= tol*math.Max(math.Abs(a), math.Abs(b)) || d <= tol
}

func has(list []string, s string) bool { return slices.Contains(list, s) }

func deref(p *float64) float64 {
	if p == nil {
		return 0
	}
	return *p
}

func quantile(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func fmtStart(ms int64) string { return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05Z") }

func fmtWant(w *truth.Window) string {
	return fmt.Sprintf("count %d sum %v", w.Count, w.Sum)
}
