package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// aggregateNames are the aggregates a window can compute, in wire order.
var aggregateNames = []string{"count", "sum", "min", "max", "mean", "first", "last"}

// ops lists the comparison operators, two-character ones first so that
// ">=" is not read as ">" followed by "=80".
var ops = []string{">=", "<=", "==", "!=", ">", "<"}

// Condition is an alert threshold such as "mean > 80": a comparison of one
// window aggregate against a constant.
type Condition struct {
	Aggregate string  // one of count, sum, min, max, mean, first, last
	Op        string  // one of > >= < <= == !=
	Value     float64 // finite
}

// ParseCondition parses "<aggregate> <op> <number>", e.g. "mean > 80" or
// "max>=1e3". Errors wrap ErrCondition.
func ParseCondition(s string) (Condition, error) {
	c, msg := parseCondition(s)
	if msg != "" {
		return Condition{}, fmt.Errorf("%w: %s", ErrCondition, msg)
	}
	return c, nil
}

// parseCondition returns the problem as a message so Validate can print it
// after the key without the sentinel's prefix.
func parseCondition(s string) (Condition, string) {
	const form = "write <aggregate> <op> <number>, e.g. \"mean > 80\""
	t := strings.TrimSpace(s)
	if t == "" {
		return Condition{}, "empty condition: " + form
	}
	i := 0
	// Digits too, so "p99 > 80" names p99 as the unknown aggregate.
	for i < len(t) && (t[i] >= 'a' && t[i] <= 'z' || t[i] >= 'A' && t[i] <= 'Z' || t[i] == '_' || i > 0 && t[i] >= '0' && t[i] <= '9') {
		i++
	}
	agg := t[:i]
	rest := strings.TrimSpace(t[i:])
	if agg == "" {
		return Condition{}, fmt.Sprintf("%q: %s", s, form)
	}
	known := false
	for _, a := range aggregateNames {
		known = known || a == agg
	}
	if !known {
		msg := fmt.Sprintf("%q: unknown aggregate %q (one of %s)", s, agg, strings.Join(aggregateNames, ", "))
		if sug := suggest(agg, aggregateNames); sug != "" {
			msg += "; did you mean " + sug + "?"
		}
		return Condition{}, msg
	}
	op := ""
	for _, o := range ops {
		if strings.HasPrefix(rest, o) {
			op = o
			break
		}
	}
	if op == "" {
		return Condition{}, fmt.Sprintf("%q: missing comparison operator (one of %s)", s, strings.Join(ops, " "))
	}
	num := strings.TrimSpace(rest[len(op):])
	if num != "" && strings.ContainsRune("<>=!", rune(num[0])) {
		return Condition{}, fmt.Sprintf("%q: unknown operator (one of %s)", s, strings.Join(ops, " "))
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
		return Condition{}, fmt.Sprintf("%q: %q is not a finite number", s, num)
	}
	return Condition{Aggregate: agg, Op: op, Value: v}, ""
}

// Holds reports whether v satisfies the condition. NaN satisfies nothing,
// not even "!=", so a NaN aggregate neither fires nor clears an alert.
func (c Condition) Holds(v float64) bool {
	if math.IsNaN(v) {
		return false
	}
	switch c.Op {
	case ">":
		return v > c.Value
	case ">=":
		return v >= c.Value
	case "<":
		return v < c.Value
	case "<=":
		return v <= c.Value
	case "==":
		return v == c.Value
	case "!=":
		return v != c.Value
	}
	return false
}

// Negate returns the condition that holds exactly when c does not (for
// every non-NaN value): "mean > 80" becomes "mean <= 80".
func (c Condition) Negate() Condition {
	neg := map[string]string{">": "<=", "<=": ">", "<": ">=", ">=": "<", "==": "!=", "!=": "=="}
	c.Op = neg[c.Op]
	return c
}

// String formats c so that ParseCondition(c.String()) == c.
func (c Condition) String() string {
	return c.Aggregate + " " + c.Op + " " + strconv.FormatFloat(c.Value, 'g', -1, 64)
}

// overlap returns a value at which both conditions hold, if there is one.
// Both must compare the same aggregate. The answer is exact for these
// one-sided comparisons: if the sets intersect, they intersect at or right
// next to one of the two thresholds, or far out on one side.
func overlap(a, b Condition) (float64, bool) {
	// The midpoint first: it makes a readable example ("both hold at 85"
	// for > 80 and < 90, where the next float above 80 prints as 80).
	cands := []float64{(a.Value + b.Value) / 2}
	for _, t := range []float64{a.Value, b.Value} {
		cands = append(cands, t, math.Nextafter(t, math.Inf(1)), math.Nextafter(t, math.Inf(-1)))
	}
	cands = append(cands, -math.MaxFloat64, math.MaxFloat64)
	for _, v := range cands {
		if a.Holds(v) && b.Holds(v) {
			return v, true
		}
	}
	return 0, false
}
