package wire

import (
	"encoding/binary"
	"math"
)

// The hand-written encoders below produce the exact bytes encMode makes of
// an Aggregate or an Alert by reflection (FuzzAppendAggregate and
// FuzzAppendAlert compare the two), at a fraction of the cost and with no
// allocation of their own: the window stage encodes every aggregate it
// emits. They follow the struct tags: keys in field order, omitempty fields
// left out when zero (a nil pointer, false, "" or 0), integers in their
// shortest form, finite floats as 9-byte doubles, and NaN and the
// infinities as the 3-byte half floats encMode's defaults convert them to.

// majorSimple is the major type of floats and simple values (true).
const majorSimple = 7

// AppendAggregate appends the CBOR encoding of a, byte for byte what
// EncodeAggregate returns, to dst.
func AppendAggregate(dst []byte, a *Aggregate) []byte {
	pairs := uint64(7)
	if a.ProcTime {
		pairs++
	}
	floats := a.optionalFloats()
	for _, f := range floats {
		if f != nil {
			pairs++
		}
	}
	dst = appendHead(dst, majorMap, pairs)
	dst = appendText(dst, "metric")
	dst = appendText(dst, a.Metric)
	dst = appendText(dst, "start")
	dst = appendInt(dst, a.Start)
	dst = appendText(dst, "end")
	dst = appendInt(dst, a.End)
	dst = appendText(dst, "count")
	dst = appendHead(dst, majorUint, a.Count)
	if a.ProcTime {
		dst = appendText(dst, "ptime")
		dst = append(dst, majorSimple<<5|21) // true
	}
	dst = appendText(dst, "key")
	dst = appendText(dst, a.Key)
	dst = appendText(dst, "device")
	dst = appendText(dst, a.Device)
	dst = appendText(dst, "rev")
	dst = appendHead(dst, majorUint, uint64(a.Rev))
	for i, f := range floats {
		if f != nil {
			dst = appendText(dst, floatKeys[i])
			dst = appendFloat(dst, *f)
		}
	}
	return dst
}

// floatKeys are the keys of Aggregate's optional floats, in the order
// optionalFloats returns them.
var floatKeys = [...]string{"min", "first", "last", "max", "mean", "sum"}

func (a *Aggregate) optionalFloats() [len(floatKeys)]*float64 {
	return [...]*float64{a.Min, a.First, a.Last, a.Max, a.Mean, a.Sum}
}

// aggregateSize is len(AppendAggregate(nil, a)).
func aggregateSize(a *Aggregate) int {
	// The head, and the seven keys always present.
	n := 1 + len("metric") + len("start") + len("end") + len("count") + len("key") + len("device") + len("rev") + 7
	n += textSize(a.Metric) + intSize(a.Start) + intSize(a.End) + headSize(a.Count) +
		textSize(a.Key) + textSize(a.Device) + headSize(uint64(a.Rev))
	if a.ProcTime {
		n += textSize("ptime") + 1
	}
	for i, f := range a.optionalFloats() {
		if f != nil {
			n += textSize(floatKeys[i]) + floatSize(*f)
		}
	}
	return n
}

// AppendAlert appends the CBOR encoding of a, byte for byte what EncodeAlert
// returns, to dst.
func AppendAlert(dst []byte, a *Alert) []byte {
	pairs := uint64(7)
	if a.Severity != "" {
		pairs++
	}
	if a.Suppressed != 0 {
		pairs++
	}
	dst = appendHead(dst, majorMap, pairs)
	dst = appendColdText(dst, "rule")
	dst = appendColdText(dst, a.Rule)
	dst = appendColdText(dst, "device")
	dst = appendColdText(dst, a.Device)
	dst = appendColdText(dst, "metric")
	dst = appendColdText(dst, a.Metric)
	dst = appendColdText(dst, "start")
	dst = appendInt(dst, a.Start)
	dst = appendColdText(dst, "state")
	dst = appendColdText(dst, a.State)
	if a.Severity != "" {
		dst = appendColdText(dst, "severity")
		dst = appendColdText(dst, a.Severity)
	}
	dst = appendColdText(dst, "value")
	dst = appendFloat(dst, a.Value)
	dst = appendColdText(dst, "key")
	dst = appendColdText(dst, a.Key)
	if a.Suppressed != 0 {
		dst = appendColdText(dst, "suppressed")
		dst = appendHead(dst, majorUint, uint64(a.Suppressed))
	}
	return dst
}

// appendColdText is appendText out of line, for alerts: rare next to
// aggregates, and inlined at each of their text items they took 4 KB of
// arm64 code, whose budget is tight (docs/performance.md, Binary size).
//
//go:noinline
func appendColdText(b []byte, s string) []byte { return appendText(b, s) }

// appendInt appends v as a CBOR integer: major type 0 for v >= 0, major
// type 1 with argument -1-v below.
func appendInt(b []byte, v int64) []byte {
	if v >= 0 {
		return appendHead(b, majorUint, uint64(v))
	}
	return appendHead(b, majorNegInt, uint64(-1-v))
}

func intSize(v int64) int {
	if v >= 0 {
		return headSize(uint64(v))
	}
	return headSize(uint64(-1 - v))
}

// appendFloat appends f as encMode does: a double, except NaN (one quiet
// NaN for all) and the infinities, which encMode's default NaNConvert7e00
// and InfConvertFloat16 write as half floats.
func appendFloat(b []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(b, majorSimple<<5|25, 0x7e, 0x00)
	case math.IsInf(f, 1):
		return append(b, majorSimple<<5|25, 0x7c, 0x00)
	case math.IsInf(f, -1):
		return append(b, majorSimple<<5|25, 0xfc, 0x00)
	}
	return binary.BigEndian.AppendUint64(append(b, majorSimple<<5|27), math.Float64bits(f))
}

func floatSize(f float64) int {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 3
	}
	return 9
}
