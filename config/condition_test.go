package config

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestParseCondition(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Condition
		err  string
	}{
		{"mean > 80", Condition{"mean", ">", 80}, ""},
		{"max>=1e3", Condition{"max", ">=", 1000}, ""},
		{"  min <  -2.5 ", Condition{"min", "<", -2.5}, ""},
		{"count == 0", Condition{"count", "==", 0}, ""},
		{"sum != 1", Condition{"sum", "!=", 1}, ""},
		{"first <= .5", Condition{"first", "<=", 0.5}, ""},
		{"last>0x10", Condition{}, `"0x10" is not a finite number`},
		{"", Condition{}, "empty condition"},
		{"> 3", Condition{}, "write <aggregate> <op> <number>"},
		{"avg > 3", Condition{}, `unknown aggregate "avg"`},
		{"p99 > 80", Condition{}, `unknown aggregate "p99"`},
		{"maen > 3", Condition{}, "did you mean mean?"},
		{"mean 3", Condition{}, "missing comparison operator"},
		{"mean = 3", Condition{}, "missing comparison operator"},
		{"mean >> 3", Condition{}, "unknown operator"},
		{"mean > ", Condition{}, `"" is not a finite number`},
		{"mean > hot", Condition{}, `"hot" is not a finite number`},
		{"mean > inf", Condition{}, "not a finite number"},
		{"mean > NaN", Condition{}, "not a finite number"},
		{"mean > 1 and max < 2", Condition{}, "not a finite number"},
	} {
		got, err := ParseCondition(tc.in)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("ParseCondition(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, ErrCondition)):
			t.Errorf("ParseCondition(%q) = %v; want ErrCondition with %q", tc.in, err, tc.err)
		}
	}
}

func TestConditionHolds(t *testing.T) {
	for _, tc := range []struct {
		cond string
		yes  []float64
		no   []float64
	}{
		{"mean > 80", []float64{80.001, 1e9}, []float64{80, 79, -1e9}},
		{"mean >= 80", []float64{80, 81}, []float64{79.999}},
		{"mean < 0", []float64{-0.1}, []float64{0, 1}},
		{"mean <= 0", []float64{0, -1}, []float64{0.1}},
		{"count == 3", []float64{3}, []float64{2, 4}},
		{"count != 3", []float64{2, 4}, []float64{3}},
	} {
		c, err := ParseCondition(tc.cond)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range tc.yes {
			if !c.Holds(v) {
				t.Errorf("%q.Holds(%v) = false", tc.cond, v)
			}
		}
		for _, v := range append(tc.no, math.NaN()) {
			if c.Holds(v) {
				t.Errorf("%q.Holds(%v) = true", tc.cond, v)
			}
		}
	}
}

// Negate holds exactly where the condition does not, and String parses back.
func TestConditionNegateAndString(t *testing.T) {
	values := []float64{-1e300, -81, -80, -0.5, 0, 0.5, 79.999, 80, 80.001, 1e300, math.Inf(1), math.Inf(-1)}
	for _, op := range ops {
		for _, threshold := range []float64{80, -80, 0, 0.5} {
			c := Condition{Aggregate: "mean", Op: op, Value: threshold}
			n := c.Negate()
			if n.Negate() != c {
				t.Errorf("%v: Negate twice = %v", c, n.Negate())
			}
			for _, v := range values {
				if c.Holds(v) == n.Holds(v) {
					t.Errorf("%v and %v agree at %v", c, n, v)
				}
			}
			if n.Holds(math.NaN()) {
				t.Errorf("%v holds for NaN", n)
			}
			back, err := ParseCondition(c.String())
			if err != nil || back != c {
				t.Errorf("ParseCondition(%q) = %v, %v", c.String(), back, err)
			}
		}
	}
}

func TestConditionOverlap(t *testing.T) {
	for _, tc := range []struct {
		a, b    string
		overlap bool
	}{
		{"mean > 80", "mean < 75", false},
		{"mean > 80", "mean <= 80", false},
		{"mean >= 80", "mean > 75", true},
		{"mean > 80", "mean < 90", true},
		{"mean >= 80", "mean <= 80", true},
		{"mean > 80", "mean > 90", true},
		{"count == 0", "count != 0", false},
		{"count == 0", "count < 1", true},
		{"count != 0", "count != 1", true},
		{"max > 1e300", "max < -1e300", false},
	} {
		a, _ := ParseCondition(tc.a)
		b, _ := ParseCondition(tc.b)
		v, got := overlap(a, b)
		if got != tc.overlap {
			t.Errorf("overlap(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.overlap)
		}
		if got && !(a.Holds(v) && b.Holds(v)) {
			t.Errorf("overlap(%q, %q) returned %v, where they do not both hold", tc.a, tc.b, v)
		}
	}
	// The example value reads as one where both hold: not the float next to
	// a threshold, which prints as the threshold.
	a, _ := ParseCondition("mean > 80")
	b, _ := ParseCondition("mean < 90")
	if v, _ := overlap(a, b); v != 85 {
		t.Errorf("overlap(mean > 80, mean < 90) = %v, want the midpoint 85", v)
	}
}
