package config

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// ErrInvalid is wrapped by every *Errors: the configuration was refused.
var ErrInvalid = errors.New("config: invalid")

// ErrCondition is wrapped by ParseCondition errors.
var ErrCondition = errors.New("config: invalid condition")

// maxErrors bounds the list so a pathological file (an alias repeated
// thousands of times) cannot produce an unbounded report.
const maxErrors = 200

// FieldError is one problem in a configuration: which key, where, and why.
type FieldError struct {
	File   string // as given to Parse or Load; "" for configs built in code
	Line   int    // 1-based; 0 when the key is not written in the file
	Column int    // 1-based; 0 when unknown
	Key    string // full key path, e.g. "mqtt.subscriptions[0].qos"; "" for syntax errors
	Msg    string
	// at, when set, is the key whose line the problem is reported on: the
	// other key of a rule between two, when only that one is written.
	at string
}

// Error formats the problem as "file:line: key: message", leaving out the
// parts that are unknown.
func (e *FieldError) Error() string {
	var b strings.Builder
	switch {
	case e.File != "" && e.Line > 0:
		b.WriteString(e.File + ":" + strconv.Itoa(e.Line) + ": ")
	case e.File != "":
		b.WriteString(e.File + ": ")
	case e.Line > 0:
		b.WriteString("line " + strconv.Itoa(e.Line) + ": ")
	}
	if e.Key != "" {
		b.WriteString(e.Key + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem found in one configuration. It is returned as a
// whole so a technician can fix the file in one pass.
type Errors struct {
	File string
	List []*FieldError
}

// Error prints one line per problem.
func (e *Errors) Error() string {
	lines := make([]string, len(e.List))
	for i, fe := range e.List {
		lines[i] = fe.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *Errors) Unwrap() error { return ErrInvalid }

// sortAndDedup orders problems by line (problems without a line last, in
// the order found) and drops exact repeats, which aliases can produce.
func (e *Errors) sortAndDedup() {
	seen := make(map[string]bool, len(e.List))
	out := e.List[:0]
	for _, fe := range e.List {
		k := fmt.Sprintf("%d\x00%s\x00%s", fe.Line, fe.Key, fe.Msg)
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, fe)
	}
	e.List = out
	sort.SliceStable(e.List, func(i, j int) bool {
		a, b := e.List[i].Line, e.List[j].Line
		if a == 0 || b == 0 {
			return a != 0 && b == 0
		}
		return a < b
	})
	if len(e.List) > maxErrors {
		n := len(e.List) - maxErrors
		e.List = append(e.List[:maxErrors], &FieldError{File: e.File, Msg: fmt.Sprintf("and %d more problems", n)})
	}
}
