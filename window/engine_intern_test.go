package window

import (
	"fmt"
	"testing"
	"unsafe"
)

// Series of one metric share its name; past maxMetricNames distinct names
// the table stops growing and names are still right.
func TestInternMetricSharesAndStaysBounded(t *testing.T) {
	cfg := testConfig(t).withDefaults()
	e := newEngine(&cfg)
	a, b := e.internMetric([]byte("temperature")), e.internMetric([]byte("temperature"))
	if a != "temperature" || unsafe.StringData(a) != unsafe.StringData(b) {
		t.Fatalf("two series of temperature got %q at %p and %q at %p, want one shared name", a, unsafe.StringData(a), b, unsafe.StringData(b))
	}
	for i := range maxMetricNames + 100 {
		name := fmt.Sprintf("m%d", i)
		if got := e.internMetric([]byte(name)); got != name {
			t.Fatalf("internMetric(%q) = %q", name, got)
		}
	}
	if len(e.metricNames) != maxMetricNames {
		t.Fatalf("%d names interned, want the bound %d", len(e.metricNames), maxMetricNames)
	}
}
