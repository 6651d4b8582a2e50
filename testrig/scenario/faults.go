package scenario

import (
	"fmt"
	"strings"
	"time"
)

// FaultGap is the least time between the end of a fault and the start of
// the next one on the same component: the rig restarts what the first one
// stopped in that time (the agent may take a second to come up).
const FaultGap = time.Second

// faultComponent names what a fault kind acts on. Two faults on one
// component must not overlap: the second would find the agent already
// stopped, or the proxy restored under it.
func faultComponent(kind string) string {
	switch kind {
	case FaultAgentKill, FaultAgentRestart:
		return "the agent"
	case FaultBrokerRestart:
		return "the device broker"
	case FaultNATSRestart:
		return "the NATS server"
	case FaultUplinkCut, FaultUplinkBlackhole, FaultUplinkDropAcks:
		return "the uplink proxy"
	case FaultDiskFull:
		return "the disk"
	}
	return ""
}

func (sc *Scenario) validateFaults(p *problems) {
	for i, f := range sc.Faults {
		k := fmt.Sprintf("faults[%d]", i)
		if !contains(FaultKinds, f.Kind) {
			p.add(k+".kind", "%q is not one of %s", f.Kind, strings.Join(FaultKinds, ", "))
		}
		if at := f.At.Resolve(sc.Duration); at < 0 || at > sc.Duration {
			p.add(k+".at", "inside the run (0 to %v)", sc.Duration)
		}
		if f.For < 0 {
			p.add(k+".for", "not negative")
		}
	}
	// Shares of the run move with --short: check both lengths.
	runs := []struct {
		total time.Duration
		note  string
	}{{sc.Duration, ""}}
	if d := sc.Short.Duration; d > 0 && d != sc.Duration {
		runs = append(runs, struct {
			total time.Duration
			note  string
		}{d, fmt.Sprintf(" (with --short, a %v run)", d)})
	}
	reported := map[int]bool{}
	for _, r := range runs {
		for i, a := range sc.Faults {
			for j := i + 1; j < len(sc.Faults); j++ {
				b := sc.Faults[j]
				comp := faultComponent(a.Kind)
				if comp == "" || comp != faultComponent(b.Kind) {
					continue
				}
				first, second := i, j
				if b.At.Resolve(r.total) < a.At.Resolve(r.total) {
					first, second = j, i
				}
				f, g := sc.Faults[first], sc.Faults[second]
				fAt, gAt := f.At.Resolve(r.total), g.At.Resolve(r.total)
				if gAt >= fAt+f.For+FaultGap || reported[second] {
					continue
				}
				reported[second] = true
				p.add(fmt.Sprintf("faults[%d]", second),
					"%s at %v overlaps the %s of faults[%d] (at %v for %v)%s: two faults on %s must not overlap; the next begins at least %v after the previous ends (here at %v or later)",
					g.Kind, round(gAt), f.Kind, first, round(fAt), f.For, r.note, comp, FaultGap, round(fAt+f.For+FaultGap))
			}
		}
	}
}

// round keeps a resolved share of the run readable (2.4s, not 2.400000001s).
func round(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
