// Package topic turns subscription templates such as
// "sensors/{device}/{metric}" into MQTT filters and extracts the named
// segments from a received topic.
package topic

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// ErrTemplate is wrapped by every template parsing error.
var ErrTemplate = errors.New("topic: invalid template")

// Template is a parsed subscription template.
type Template struct {
	raw      string
	segments []string // literal, "+", "#", or "" for a named placeholder
	device   int      // index of {device}, -1 when absent
	metric   int      // index of {metric}, -1 when absent
	filter   string
}

// Parse parses a template. Placeholders {device} and {metric} each take one
// whole topic level; plain MQTT wildcards + and # are allowed too.
func Parse(tmpl string) (*Template, error) {
	if tmpl == "" {
		return nil, fmt.Errorf("%w: empty", ErrTemplate)
	}
	if !utf8.ValidString(tmpl) {
		return nil, fmt.Errorf("%w: %q is not UTF-8", ErrTemplate, tmpl)
	}
	t := &Template{raw: tmpl, device: -1, metric: -1}
	levels := strings.Split(tmpl, "/")
	filter := make([]string, len(levels))
	for i, l := range levels {
		switch {
		case l == "{device}" || l == "{metric}":
			idx := &t.device
			if l == "{metric}" {
				idx = &t.metric
			}
			if *idx >= 0 {
				return nil, fmt.Errorf("%w: %q names %s twice", ErrTemplate, tmpl, l)
			}
			*idx = i
			filter[i] = "+"
			t.segments = append(t.segments, "")
		case strings.ContainsAny(l, "{}"):
			return nil, fmt.Errorf("%w: %q: level %q: a placeholder must be a whole level, {device} or {metric}", ErrTemplate, tmpl, l)
		case l == "#":
			if i != len(levels)-1 {
				return nil, fmt.Errorf("%w: %q: # must be the last level", ErrTemplate, tmpl)
			}
			filter[i] = l
			t.segments = append(t.segments, l)
		case strings.ContainsAny(l, "+#") && l != "+":
			return nil, fmt.Errorf("%w: %q: level %q mixes a wildcard with text", ErrTemplate, tmpl, l)
		default:
			filter[i] = l
			t.segments = append(t.segments, l)
		}
	}
	t.filter = strings.Join(filter, "/")
	return t, nil
}

// String is the template as written.
func (t *Template) String() string { return t.raw }

// Filter is the MQTT subscription filter (placeholders become +).
func (t *Template) Filter() string { return t.filter }

// HasDevice reports whether the template names a {device} level.
func (t *Template) HasDevice() bool { return t.device >= 0 }

// HasMetric reports whether the template names a {metric} level.
func (t *Template) HasMetric() bool { return t.metric >= 0 }

// Match reports whether topic matches the template and returns its
// {device} and {metric} levels ("" when the template has none). A
// placeholder does not match an empty level.
func (t *Template) Match(topic string) (device, metric string, ok bool) {
	return t.match(topic, false)
}

// InFilter reports whether a broker would deliver topic on the template's
// filter: as Match, but a placeholder matches an empty level too (as + does),
// and a wildcard first level does not match a topic that starts with $.
// Such a topic is the subscription's, yet names no device.
func (t *Template) InFilter(topic string) bool {
	if strings.HasPrefix(topic, "$") && len(t.segments) > 0 && (t.segments[0] == "" || t.segments[0] == "+" || t.segments[0] == "#") {
		return false
	}
	_, _, ok := t.match(topic, true)
	return ok
}

func (t *Template) match(topic string, emptyOK bool) (device, metric string, ok bool) {
	rest := topic
	for i, seg := range t.segments {
		if seg == "#" {
			return device, metric, true
		}
		if i > 0 {
			j := strings.IndexByte(rest, '/')
			if j < 0 {
				return "", "", false // topic has fewer levels
			}
			rest = rest[j+1:]
		}
		level := rest
		if j := strings.IndexByte(rest, '/'); j >= 0 {
			level = rest[:j]
		}
		switch {
		case seg == "":
			if level == "" && !emptyOK {
				return "", "", false
			}
			if i == t.device {
				device = level
			} else {
				metric = level
			}
		case seg == "+":
		case seg != level:
			return "", "", false
		}
	}
	if strings.IndexByte(rest, '/') >= 0 {
		return "", "", false // topic has more levels
	}
	return device, metric, true
}

// Expand replaces {name} placeholders in s with the given values, for
// output topics and subjects such as "edge.{gateway_id}.aggregates". It is
// one pass, so a value that itself contains a placeholder stays literal.
func Expand(s string, values map[string]string) string {
	pairs := make([]string, 0, 2*len(values))
	for k, v := range values {
		pairs = append(pairs, "{"+k+"}", v)
	}
	return strings.NewReplacer(pairs...).Replace(s)
}
