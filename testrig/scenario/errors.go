package scenario

import (
	"fmt"
	"sort"

	"github.com/edgeagent/edgeagent/config"
)

// FieldError is one problem in a scenario: the file, line and key, and
// why. It is the agent's config error (config.FieldError), so that a
// scenario and an agent config read alike: "FILE:LINE: key: message", the
// parts that are unknown left out. Column is not set.
type FieldError = config.FieldError

// Errors is every problem found in one scenario, one a line (List), so a
// file can be fixed in one pass. It prints as the agent's config errors do;
// errors.Is(err, ErrInvalid) holds.
type Errors struct {
	config.Errors
}

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *Errors) Unwrap() error { return ErrInvalid }

// problems collects FieldErrors for one scenario.
type problems struct {
	file string
	src  *source // nil for a scenario built in code: no lines
	list []*FieldError
}

// add records a problem with key, placed at the key's line (or its
// nearest ancestor's) when the scenario came from a file.
func (p *problems) add(key, format string, a ...any) {
	fe := &FieldError{File: p.file, Key: key, Msg: fmt.Sprintf(format, a...)}
	if p.src != nil {
		fe.Line = p.src.lineOf(key)
	}
	p.list = append(p.list, fe)
}

// addAt records a problem at a known line.
func (p *problems) addAt(line int, key, format string, a ...any) {
	p.list = append(p.list, &FieldError{File: p.file, Line: line, Key: key, Msg: fmt.Sprintf(format, a...)})
}

// err returns the problems ordered by line (those without a line last, in
// the order found), or nil when there are none.
func (p *problems) err() error {
	if len(p.list) == 0 {
		return nil
	}
	sort.SliceStable(p.list, func(i, j int) bool {
		a, b := p.list[i].Line, p.list[j].Line
		if a == 0 || b == 0 {
			return a != 0 && b == 0
		}
		return a < b
	})
	return &Errors{config.Errors{File: p.file, List: p.list}}
}
