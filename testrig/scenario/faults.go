package scenario

import (
	"fmt"
	"strings"
)

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
}
