package wire_test

import (
	"cmp"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/internal/decsum"
	"github.com/edgeagent/edgeagent/testrig/scenario"
	"github.com/edgeagent/edgeagent/testrig/sim"
	"github.com/edgeagent/edgeagent/testrig/truth"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// rigGateway is the gateway id the rig configures its agent with.
const rigGateway = "rig-gw"

// steadyAggregates returns the aggregates an agent emits for the rig's
// steady scenario (testrig/scenarios/steady.yaml) with its device groups
// scaled to about `devices` devices, run for span at real speed: the
// readings come from the rig's simulator (testrig/sim), the windows' values
// from its ground truth (testrig/truth), and the order is the window
// stage's emission order — each device's windows as its watermark passes
// them, in the order the devices' readings arrive. Only whole windows of
// the span are kept, as an agent that runs for days emits them.
//
// Plain-number devices carry no event time; the agent windows them by
// their arrival, which here is the publish time of the plan.
func steadyAggregates(tb testing.TB, devices int, span time.Duration) []wire.Aggregate {
	tb.Helper()
	sc, err := scenario.Lookup("steady")
	if err != nil {
		tb.Fatal(err)
	}
	scale := float64(devices) / float64(sc.DeviceCount())
	for i := range sc.Devices {
		sc.Devices[i].Count = max(1, int(math.Round(float64(sc.Devices[i].Count)*scale)))
	}
	sc.Duration, sc.Speed = span, 1
	start := time.Date(2026, 1, 5, 8, 0, 0, 0, time.UTC)
	plan, err := sim.NewPlan(sc, start)
	if err != nil {
		tb.Fatal(err)
	}
	w := sc.Agent.Window
	exp := truth.Compute(plan, nil, nil, truth.Settings{
		Size: w.Size, Slide: w.Slide, WatermarkDelay: w.WatermarkDelay, AllowedLateness: w.AllowedLateness,
	})
	sizeMs, delayMs := w.Size.Milliseconds(), w.WatermarkDelay.Milliseconds()

	// Whole windows only: [from, to) in event time, and in arrival time for
	// the plain-number devices.
	whole := func(lo, hi int64) (int64, int64) { return (lo + sizeMs - 1) / sizeMs * sizeMs, hi / sizeMs * sizeMs }
	evFrom, evTo := whole(plan.Base, plan.Base+span.Milliseconds())
	ptFrom, ptTo := whole(start.UnixMilli(), start.Add(span).UnixMilli())

	type arrival struct {
		at       time.Duration
		dev, msg int
	}
	var arrivals []arrival
	for d := range plan.Devices {
		for i := range plan.Devices[d].Messages {
			arrivals = append(arrivals, arrival{plan.Devices[d].Messages[i].SendAt, d, i})
		}
	}
	slices.SortStableFunc(arrivals, func(a, b arrival) int { return cmp.Compare(a.at, b.at) })

	type win struct {
		metric string
		start  int64
	}
	type devState struct {
		maxT  int64
		open  []win
		ptime map[win]*truth.Window // plain-number windows, by arrival
	}
	states := make([]devState, len(plan.Devices))
	var out []wire.Aggregate
	emit := func(dev string, ptime bool, st *devState, ws []win) {
		slices.SortFunc(ws, func(a, b win) int {
			return cmp.Or(cmp.Compare(a.metric, b.metric), cmp.Compare(a.start, b.start))
		})
		for _, k := range ws {
			var tw *truth.Window
			from, to := evFrom, evTo
			if ptime {
				tw, from, to = st.ptime[k], ptFrom, ptTo
			} else {
				tw = exp.Windows[truth.Key{Device: dev, Metric: k.metric, Start: k.start}]
			}
			if k.start < from || k.start+sizeMs > to {
				continue
			}
			// The window stage snaps the plain sum (truth's, summed in the
			// same order) to the decimal it stands for.
			sum, mean := decsum.Snap(tw.Sum, tw.Count, tw.Min, tw.Max)
			out = append(out, wire.Aggregate{
				Device: dev, Metric: k.metric, Start: k.start, End: k.start + sizeMs, Count: tw.Count,
				Sum: wire.F(sum), Min: wire.F(tw.Min), Max: wire.F(tw.Max), Mean: wire.F(mean),
				First: wire.F(tw.First), Last: wire.F(tw.Last),
				Rev: 1, Key: wire.AggregateKey(rigGateway, dev, k.metric, k.start, 1), ProcTime: ptime,
			})
		}
	}
	for _, a := range arrivals {
		dev := &plan.Devices[a.dev]
		m := &dev.Messages[a.msg]
		if m.Kind != sim.KindReading || m.Retry {
			continue
		}
		st := &states[a.dev]
		t := m.Reading.TS
		if m.Reading.PTime {
			t = start.Add(m.SendAt).UnixMilli()
			if st.ptime == nil {
				st.ptime = map[win]*truth.Window{}
			}
		}
		ws := t / sizeMs * sizeMs
		for _, mt := range m.Reading.Metrics {
			k := win{mt.Name, ws}
			if !slices.Contains(st.open, k) {
				st.open = append(st.open, k)
			}
			if st.ptime == nil {
				continue
			}
			tw := st.ptime[k]
			if tw == nil {
				tw = &truth.Window{Min: mt.Value, Max: mt.Value, First: mt.Value}
				st.ptime[k] = tw
			}
			tw.Count++
			tw.Sum += mt.Value
			tw.Min, tw.Max, tw.Last = math.Min(tw.Min, mt.Value), math.Max(tw.Max, mt.Value), mt.Value
		}
		st.maxT = max(st.maxT, t)
		var due, kept []win
		for _, k := range st.open {
			if k.start+sizeMs <= st.maxT-delayMs {
				due = append(due, k)
			} else {
				kept = append(kept, k)
			}
		}
		st.open = kept
		emit(dev.Name, st.ptime != nil, st, due)
	}
	// The rest close when the devices fall idle, all at once.
	for d := range plan.Devices {
		emit(plan.Devices[d].Name, states[d].ptime != nil, &states[d], states[d].open)
	}
	return out
}
