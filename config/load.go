package config

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

// Load reads the configuration file at path and parses it with the
// process environment; see Parse.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(path, data, os.LookupEnv)
}

// Parse parses a configuration: it substitutes ${NAME} references with
// env (os.LookupEnv when nil), decodes the YAML strictly over Default(),
// fills derived defaults (ApplyDerived) and validates the result.
//
// On any problem it returns a nil Config and an *Errors listing every
// unknown key, type error, unset variable and invalid value at once, each
// naming filename, line and key. A YAML syntax error stops the parse, so it
// is reported alone.
func Parse(filename string, data []byte, env func(string) (string, bool)) (*Config, error) {
	return parse(filename, data, env, parseOptions{})
}

// ParseCheckingFiles is Parse followed by CheckFiles, with the files'
// problems listed next to the rest, so one pass shows everything wrong.
func ParseCheckingFiles(filename string, data []byte, env func(string) (string, bool)) (*Config, error) {
	return parse(filename, data, env, parseOptions{checkFiles: true})
}

type parseOptions struct{ readOnly, checkFiles bool }

// ParseReadOnly is Parse for commands that read a few keys and start
// nothing (status, inspect): a key whose ${NAME} variable is not set is
// left empty and unchecked instead of failing the whole file, and
// Unresolved names it. The variables often live in a file only root and
// the service read, and a technician's status check should not need them.
func ParseReadOnly(filename string, data []byte, env func(string) (string, bool)) (*Config, error) {
	return parse(filename, data, env, parseOptions{readOnly: true})
}

// Unresolved returns the variables that key, or a key under it, references
// and that were unset in a ParseReadOnly, or nil.
func (c *Config) Unresolved(key string) []string {
	if c.src == nil {
		return nil
	}
	var names []string
	for k, vars := range c.src.unset {
		if k == key || strings.HasPrefix(k, key+".") || strings.HasPrefix(k, key+"[") {
			names = append(names, vars...)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// namesUnset reports whether a cross-key error's message names a key whose
// value a ParseReadOnly left unknown ("mqtt.password: needs mqtt.username"
// with mqtt.username: ${UNSET}): the check cannot hold either way.
func (s *source) namesUnset(msg string) bool {
	for k := range s.unset {
		if strings.Contains(msg, k) {
			return true
		}
	}
	return false
}

func parse(filename string, data []byte, env func(string) (string, bool), o parseOptions) (*Config, error) {
	if env == nil {
		env = os.LookupEnv
	}
	src := &source{file: filename, pos: make(map[string]position), bad: make(map[string]bool)}
	text, refs, err := markRefs(string(data))
	d := &decoder{src: src, env: env, refs: refs, readOnly: o.readOnly}
	c := Default()
	if err != nil {
		d.fail(position{}, "", "%v", err)
	} else if f, err := parseYAML(text); err != nil {
		d.syntaxError(err)
	} else if d.decodeFile(f, c) {
		c.src = src
		c.ApplyDerived()
		var verr *Errors
		if err := c.Validate(); errors.As(err, &verr) {
			for _, fe := range verr.List {
				if !src.suppressed(fe.Key) && !src.namesUnset(fe.Msg) {
					d.errs = append(d.errs, fe)
				}
			}
		}
		if o.checkFiles {
			if err := c.CheckFiles(); errors.As(err, &verr) {
				d.errs = append(d.errs, verr.List...)
			}
		}
	}
	if len(d.errs) > 0 {
		errs := &Errors{File: filename, List: d.errs}
		errs.sortAndDedup()
		return nil, errs
	}
	return c, nil
}
