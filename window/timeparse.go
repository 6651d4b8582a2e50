package window

import (
	"math"
	"time"
)

// Event times are held as Unix milliseconds: the wire format's unit. They
// are bounded to years 1..9999 so window arithmetic cannot overflow.
const (
	minEventMs = -62135596800000 // 0001-01-01T00:00:00Z
	maxEventMs = 253402300799999 // 9999-12-31T23:59:59.999Z
)

// timeErr says why a time value was refused; the caller names the field.
type timeErr uint8

const (
	timeOK      timeErr = iota
	timeRange           // outside years 1..9999 or int64
	timeNotNum          // a string where a number is required
	timeNotStr          // a number where an RFC 3339 string is required
	timeBadText         // a string that is not RFC 3339
	timeBadNum          // not a decimal number literal
)

// numericTimeMs converts a decimal number literal (JSON number grammar) to
// Unix milliseconds, exactly and rounding toward negative infinity. format
// is one of the Time* constants; auto picks the unit by magnitude: below
// 1e11 seconds, below 1e14 milliseconds, below 1e17 microseconds, else
// nanoseconds (the same cut-offs as common ingestion tools; they place any
// date between 1973 and 5138 in the right unit).
func numericTimeMs(lit []byte, format string) (int64, timeErr) {
	if format == TimeRFC3339 {
		return 0, timeNotStr
	}
	d, ok := parseDecimal(lit)
	if !ok {
		return 0, timeBadNum
	}
	if len(d.digits) == 0 {
		return 0, timeOK
	}
	var k int64 // power of ten taking the unit to milliseconds
	switch format {
	case TimeUnixS:
		k = 3
	case TimeUnixMs:
		k = 0
	case TimeUnixNs:
		k = -6
	default: // auto
		switch nInt := int64(len(d.digits)) + d.exp; {
		case nInt <= 11:
			k = 3
		case nInt <= 14:
			k = 0
		case nInt <= 17:
			k = -3
		default:
			k = -6
		}
	}
	ms, ok := d.floorScaled(k)
	if !ok || ms < minEventMs || ms > maxEventMs {
		return 0, timeRange
	}
	return ms, timeOK
}

// rfc3339Ms parses an RFC 3339 time string (fractional seconds optional).
func rfc3339Ms(s []byte, format string) (int64, timeErr) {
	switch format {
	case TimeUnixS, TimeUnixMs, TimeUnixNs:
		return 0, timeNotNum
	}
	str, ok := rfc3339ForGo(string(s))
	if !ok {
		return 0, timeBadText
	}
	t, err := time.Parse(time.RFC3339Nano, str)
	if err != nil {
		return 0, timeBadText
	}
	ms := t.UnixMilli()
	if ms < minEventMs || ms > maxEventMs {
		return 0, timeRange
	}
	return ms, timeOK
}

// rfc3339ForGo closes the gaps between RFC 3339 and Go's parser: RFC 3339
// allows a lowercase t and z (its §5.6), which Go refuses, so they are made
// upper case; and Go takes a zone offset of 24 hours or 60 minutes, where
// RFC 3339's run 00–23 and 00–59 (a reading would be moved silently), so
// ok is false for those.
func rfc3339ForGo(str string) (_ string, ok bool) {
	n := len(str)
	if n > 10 && (str[10] == 't' || str[n-1] == 'z') {
		b := []byte(str)
		if b[10] == 't' {
			b[10] = 'T'
		}
		if b[n-1] == 'z' {
			b[n-1] = 'Z'
		}
		str = string(b)
	}
	if n > 6 && (str[n-6] == '+' || str[n-6] == '-') && str[n-3] == ':' && (str[n-5:n-3] > "23" || str[n-2:] > "59") {
		return str, false
	}
	return str, true
}

// decimal is ±digits×10^exp with digits free of leading zeros (empty for 0).
type decimal struct {
	neg    bool
	digits []byte
	exp    int64
}

// parseDecimal parses a JSON number literal. It does not allocate: digits
// alias lit unless the literal has a fraction, when they are copied into a
// small array that escapes only for very long literals.
func parseDecimal(lit []byte) (decimal, bool) {
	var d decimal
	i := 0
	if i < len(lit) && lit[i] == '-' {
		d.neg = true
		i++
	}
	intStart := i
	for i < len(lit) && lit[i] >= '0' && lit[i] <= '9' {
		i++
	}
	intDigits := lit[intStart:i]
	if len(intDigits) == 0 || (len(intDigits) > 1 && intDigits[0] == '0') {
		return d, false
	}
	var frac []byte
	if i < len(lit) && lit[i] == '.' {
		i++
		fs := i
		for i < len(lit) && lit[i] >= '0' && lit[i] <= '9' {
			i++
		}
		frac = lit[fs:i]
		if len(frac) == 0 {
			return d, false
		}
	}
	var exp int64
	if i < len(lit) && (lit[i] == 'e' || lit[i] == 'E') {
		i++
		eneg := false
		if i < len(lit) && (lit[i] == '+' || lit[i] == '-') {
			eneg = lit[i] == '-'
			i++
		}
		es := i
		for i < len(lit) && lit[i] >= '0' && lit[i] <= '9' {
			if exp < 1e12 { // saturate: anything this large is out of range anyway
				exp = exp*10 + int64(lit[i]-'0')
			}
			i++
		}
		if i == es {
			return d, false
		}
		if eneg {
			exp = -exp
		}
	}
	if i != len(lit) {
		return d, false
	}
	digits := intDigits
	if len(frac) > 0 {
		digits = make([]byte, 0, len(intDigits)+len(frac))
		digits = append(append(digits, intDigits...), frac...)
	}
	exp -= int64(len(frac))
	for len(digits) > 0 && digits[0] == '0' {
		digits = digits[1:]
	}
	d.digits, d.exp = digits, exp
	return d, true
}

// floorScaled returns floor(d × 10^k) when it fits in an int64.
func (d decimal) floorScaled(k int64) (int64, bool) {
	e := d.exp + k
	keep := int64(len(d.digits)) + e // digits left of the point after scaling
	if keep > 19 {
		return 0, false
	}
	var intPart []byte
	fracNonZero := false
	if keep <= 0 {
		fracNonZero = len(d.digits) > 0
	} else if e >= 0 {
		intPart = d.digits
	} else {
		intPart = d.digits[:keep]
		for _, c := range d.digits[keep:] {
			if c != '0' {
				fracNonZero = true
				break
			}
		}
	}
	var u uint64
	for _, c := range intPart {
		u = u*10 + uint64(c-'0')
	}
	for ; e > 0; e-- {
		if u > math.MaxUint64/10 {
			return 0, false
		}
		u *= 10
	}
	if d.neg {
		if fracNonZero {
			u++
		}
		if u > 1<<63 {
			return 0, false
		}
		return -int64(u), true
	}
	if u > math.MaxInt64 {
		return 0, false
	}
	return int64(u), true
}
