package topic

import (
	"errors"
	"testing"
)

func TestMatch(t *testing.T) {
	cases := []struct {
		tmpl, topic    string
		device, metric string
		ok             bool
	}{
		{"sensors/{device}/telemetry", "sensors/press-1/telemetry", "press-1", "", true},
		{"sensors/{device}/telemetry", "sensors/press-1/other", "", "", false},
		{"sensors/{device}/telemetry", "sensors/press-1/telemetry/x", "", "", false},
		{"sensors/{device}/telemetry", "sensors//telemetry", "", "", false},
		{"sensors/{device}/telemetry", "sensors/press-1", "", "", false},
		{"plant/{device}/{metric}", "plant/d7/temperature", "d7", "temperature", true},
		{"plant/+/{device}/#", "plant/a/d9/x/y", "d9", "", true},
		{"plant/{device}", "plant/d1/", "", "", false},
	}
	for _, c := range cases {
		tp, err := Parse(c.tmpl)
		if err != nil {
			t.Fatalf("Parse(%q): %v", c.tmpl, err)
		}
		d, m, ok := tp.Match(c.topic)
		if d != c.device || m != c.metric || ok != c.ok {
			t.Errorf("%q.Match(%q) = %q, %q, %v; want %q, %q, %v", c.tmpl, c.topic, d, m, ok, c.device, c.metric, c.ok)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, bad := range []string{"", "a/{device}/{device}", "a/x{device}", "a/#/b", "a/b+", "a/{dev}"} {
		if _, err := Parse(bad); !errors.Is(err, ErrTemplate) {
			t.Errorf("Parse(%q) = %v, want ErrTemplate", bad, err)
		}
	}
}

func TestFilter(t *testing.T) {
	tp, err := Parse("sensors/{device}/{metric}")
	if err != nil {
		t.Fatal(err)
	}
	if got := tp.Filter(); got != "sensors/+/+" {
		t.Errorf("Filter = %q", got)
	}
	if got := Expand("edge.{gateway_id}.aggregates", map[string]string{"gateway_id": "gw-01"}); got != "edge.gw-01.aggregates" {
		t.Errorf("Expand = %q", got)
	}
}

func TestExpandIsOnePass(t *testing.T) {
	got := Expand("a/{gateway_id}/{device}", map[string]string{"gateway_id": "gw", "device": "x{gateway_id}"})
	if got != "a/gw/x{gateway_id}" {
		t.Errorf("Expand = %q, want the device value kept literally", got)
	}
}

// InFilter is what a broker delivers on the template's filter: an empty
// level matches a placeholder, and a wildcard first level skips $ topics.
func TestInFilter(t *testing.T) {
	cases := []struct {
		tmpl, topic string
		in          bool
	}{
		{"sensors/{device}/telemetry", "sensors/press-1/telemetry", true},
		{"sensors/{device}/telemetry", "sensors//telemetry", true},
		{"sensors/{device}/telemetry", "sensors/press-1/other", false},
		{"sensors/{device}/telemetry", "sensors/press-1", false},
		{"plant/{device}", "plant/", true},
		{"{device}/telemetry", "$SYS/telemetry", false},
		{"{device}/#", "$share/x", false},
		{"$iot/{device}", "$iot/d1", true},
	}
	for _, c := range cases {
		tp, err := Parse(c.tmpl)
		if err != nil {
			t.Fatalf("Parse(%q): %v", c.tmpl, err)
		}
		if got := tp.InFilter(c.topic); got != c.in {
			t.Errorf("%q.InFilter(%q) = %v, want %v", c.tmpl, c.topic, got, c.in)
		}
	}
}
