package config

import (
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"time"
)

// Duration is a time.Duration written in YAML as a Go duration string:
// "10s", "5m", "168h", "1h30m". A bare number is refused, because "30"
// could mean seconds or minutes and a technician should not have to guess.
type Duration time.Duration

// Duration returns d as a time.Duration.
func (d Duration) Duration() time.Duration { return time.Duration(d) }

// String formats d the way it is written in the config: "1h" rather than
// Go's "1h0m0s", so printed configs read like hand-written ones.
func (d Duration) String() string {
	s := time.Duration(d).String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// MarshalText implements encoding.TextMarshaler (JSON output, flag.TextVar).
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with the config syntax.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := parseDuration(string(b))
	if err != nil {
		return fmt.Errorf("config: %s", err)
	}
	*d = v
	return nil
}

func parseDuration(s string) (Duration, error) {
	t := strings.TrimSpace(s)
	v, err := time.ParseDuration(t)
	if err == nil {
		return Duration(v), nil
	}
	msg := fmt.Sprintf("%q is not a duration (write e.g. 10s, 5m or 1h30m)", s)
	switch {
	case t == "":
		msg = "empty duration (write e.g. 10s, 5m or 1h30m)"
	case isDigits(t):
		msg = fmt.Sprintf("%q is not a duration: add a unit, e.g. %ss", s, t)
	case strings.HasSuffix(t, "d") && isDigits(t[:len(t)-1]):
		// Go durations have no day unit; say what to write instead.
		if n, err := strconv.Atoi(t[:len(t)-1]); err == nil && n < 1<<20 {
			msg = fmt.Sprintf("%q is not a duration: days are written in hours, e.g. %dh", s, n*24)
		}
	}
	return 0, &valueError{msg}
}

// Size is a byte count written in YAML as "512MiB", "1GiB", "256KiB",
// "10MB" or a plain number of bytes. Binary units (KiB, MiB, GiB, TiB) are
// powers of 1024, decimal ones (KB, MB, GB, TB) powers of 1000.
type Size int64

// Bytes returns s as a number of bytes.
func (s Size) Bytes() int64 { return int64(s) }

var sizeUnits = []struct {
	name string
	mult int64
}{
	{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3},
	{"B", 1},
}

// String formats s with the largest unit that represents it exactly,
// binary units first: 536870912 → "512MiB", 10000000 → "10MB".
func (s Size) String() string {
	if s > 0 {
		for _, u := range sizeUnits[:len(sizeUnits)-1] {
			if int64(s)%u.mult == 0 {
				return strconv.FormatInt(int64(s)/u.mult, 10) + u.name
			}
		}
	}
	return strconv.FormatInt(int64(s), 10)
}

// MarshalText implements encoding.TextMarshaler.
func (s Size) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with the config syntax.
func (s *Size) UnmarshalText(b []byte) error {
	v, err := parseSize(string(b))
	if err != nil {
		return fmt.Errorf("config: %s", err)
	}
	*s = v
	return nil
}

func parseSize(s string) (Size, error) {
	bad := func(why string) (Size, error) {
		if why == "" {
			why = " (write e.g. 512MiB, 1GiB, 10MB or 1048576 for bytes)"
		}
		return 0, &valueError{fmt.Sprintf("%q is not a size%s", s, why)}
	}
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.' || t[i] == '_') {
		i++
	}
	num := strings.ReplaceAll(t[:i], "_", "")
	unit := strings.TrimSpace(t[i:])
	if num == "" || strings.Count(num, ".") > 1 || num[0] == '.' || num[len(num)-1] == '.' {
		return bad("")
	}
	mult := int64(-1)
	for _, u := range sizeUnits {
		if strings.EqualFold(unit, u.name) {
			mult = u.mult
		}
	}
	switch {
	case unit == "":
		mult = 1
	case mult < 0:
		if len(unit) == 1 && strings.ContainsAny(unit, "kKmMgGtT") {
			return bad(fmt.Sprintf(": %q is ambiguous, write %siB or %sB", unit, strings.ToUpper(unit), strings.ToUpper(unit)))
		}
		return bad(fmt.Sprintf(": unknown unit %q (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)", unit))
	}
	// big.Rat keeps "1.5GiB" exact and catches overflow without float
	// rounding surprises.
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return bad("")
	}
	r.Mul(r, new(big.Rat).SetInt64(mult))
	if !r.IsInt() {
		return bad(": not a whole number of bytes")
	}
	if !r.Num().IsInt64() {
		return bad(": too large")
	}
	return Size(r.Num().Int64()), nil
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// valueError is a problem with one scalar value; the decoder attaches the
// file, line and key.
type valueError struct{ msg string }

func (e *valueError) Error() string { return e.msg }
