// Package synthetic generates realistic, steady uplink aggregates — a fleet
// of devices reporting once a second, windowed per minute — for the uplink's
// tests and benchmarks.
package synthetic

import (
	"fmt"
	"math"
	"math/rand"

	"github.com/edgeagent/edgeagent/internal/decsum"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// Metric is one simulated sensor channel.
type Metric struct {
	Name string
	// Base and Spread place each device's starting value uniformly in
	// Base ± Spread/2; the value then random-walks by up to Spread/400 a
	// reading and is rounded to Decimals places, as a sensor reports it.
	Base, Spread float64
	Decimals     int
}

// DefaultMetrics are four typical environmental channels.
var DefaultMetrics = []Metric{
	{Name: "temperature", Base: 21, Spread: 5, Decimals: 2},
	{Name: "humidity", Base: 45, Spread: 15, Decimals: 1},
	{Name: "pressure", Base: 1013, Spread: 10, Decimals: 2},
	{Name: "battery", Base: 3.6, Spread: 0.3, Decimals: 2},
}

// Generator emits aggregates in the order the window stage emits them: by
// window (emission time), then device, then metric.
type Generator struct {
	Gateway string
	Devices int
	Metrics []Metric
	// Start is the first window's start (Unix ms); Window its length.
	Start, Window int64
	// PerWindow is the number of readings a device sends in a window.
	PerWindow int

	r            *rand.Rand
	cur          []float64
	w, dev, metr int
}

// New returns a generator for devices × DefaultMetrics at one reading a
// second in one-minute windows, seeded for repeatable output.
func New(gateway string, devices int, seed int64) *Generator {
	g := &Generator{
		Gateway: gateway, Devices: devices, Metrics: DefaultMetrics,
		Start: 1767225600000, Window: 60_000, PerWindow: 60,
		r: rand.New(rand.NewSource(seed)),
	}
	g.cur = make([]float64, devices*len(g.Metrics))
	for d := 0; d < devices; d++ {
		for m, mm := range g.Metrics {
			g.cur[d*len(g.Metrics)+m] = mm.Base + (g.r.Float64()-0.5)*mm.Spread
		}
	}
	return g
}

// Device names device i.
func Device(i int) string { return fmt.Sprintf("dev-%04d", i) }

// Next fills a with the next aggregate, computed from PerWindow simulated
// readings the way the window stage accumulates them: a plain float64 sum,
// snapped at emission to the decimal it stands for (internal/decsum).
func (g *Generator) Next(a *wire.Aggregate) {
	mm := g.Metrics[g.metr]
	i := g.dev*len(g.Metrics) + g.metr
	p := math.Pow(10, float64(mm.Decimals))
	var sum, lo, hi, first, last float64
	for k := 0; k < g.PerWindow; k++ {
		g.cur[i] += (g.r.Float64() - 0.5) * mm.Spread / 200
		v := math.Round(g.cur[i]*p) / p
		if k == 0 {
			lo, hi, first = v, v, v
		}
		lo, hi, last = math.Min(lo, v), math.Max(hi, v), v
		sum += v
	}
	sum, mean := decsum.Snap(sum, uint64(g.PerWindow), lo, hi)
	start := g.Start + int64(g.w)*g.Window
	dev := Device(g.dev)
	*a = wire.Aggregate{
		Device: dev, Metric: mm.Name, Start: start, End: start + g.Window,
		Count: uint64(g.PerWindow),
		Sum:   wire.F(sum), Min: wire.F(lo), Max: wire.F(hi),
		Mean: wire.F(mean), First: wire.F(first), Last: wire.F(last),
		Rev: 1, Key: wire.AggregateKey(g.Gateway, dev, mm.Name, start, 1),
	}
	if g.metr++; g.metr == len(g.Metrics) {
		g.metr = 0
		if g.dev++; g.dev == g.Devices {
			g.dev = 0
			g.w++
		}
	}
}

// Take returns the next n aggregates.
func (g *Generator) Take(n int) []wire.Aggregate {
	out := make([]wire.Aggregate, n)
	for i := range out {
		g.Next(&out[i])
	}
	return out
}
