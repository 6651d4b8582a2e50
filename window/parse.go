package window

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
)

// Dead-letter reason codes: a small fixed set, each a counter. The human
// message in the row says more ("field ts missing").
const (
	CodeUnknownTopic   = "unknown_topic"
	CodeRejected       = "rejected"
	CodeNotJSON        = "not_json"
	CodeNotCBOR        = "not_cbor"
	CodeNotNumber      = "not_number"
	CodeNotObject      = "not_object"
	CodeTimeMissing    = "time_missing"
	CodeTimeType       = "time_type"
	CodeTimeInvalid    = "time_invalid"
	CodeTimeFuture     = "time_future"
	CodeTimePast       = "time_past"
	CodeMetricType     = "metric_type"
	CodeNoMetrics      = "no_metrics"
	CodeTooManyMetrics = "too_many_metrics"
	CodeTooManyDevices = "too_many_devices"
	CodeNameTooLong    = "name_too_long"
)

// Codes lists every dead-letter reason code, in counter order.
var Codes = append([]string(nil), codeIndex[:]...)

// maxNameLen bounds device and metric names: they are part of state keys
// and idempotency keys, and bbolt keys are limited.
const maxNameLen = 256

// badInput is why a record could not become a reading.
type badInput struct{ code, msg string }

func bad(code, format string, a ...any) *badInput {
	return &badInput{code: code, msg: fmt.Sprintf(format, a...)}
}

// maxDepth bounds payload nesting; deeper payloads are refused rather than
// recursed into.
const maxDepth = 64

// leafKind is the type of a value found at a path.
type leafKind uint8

const (
	kAbsent leafKind = iota
	kNumber          // text is a decimal literal (JSON number grammar)
	kString          // text is the decoded string
	kBool
	kNull
	kObject
	kArray
	kBytes     // CBOR byte string; text is the bytes
	kNonFinite // CBOR NaN or ±Inf
	kOther     // CBOR simple value or undefined
)

func (k leafKind) String() string {
	switch k {
	case kNumber:
		return "a number"
	case kString:
		return "a string"
	case kBool:
		return "a bool"
	case kNull:
		return "null"
	case kObject:
		return "an object"
	case kArray:
		return "an array"
	case kBytes:
		return "a byte string"
	case kNonFinite:
		return "not finite"
	}
	return "not a number"
}

// leaf is the last value seen at an interesting path. off/end index the
// extractor's arena.
type leaf struct {
	kind     leafKind
	off, end int
}

// metricLeaf is a metric candidate: its path and value in the arena.
type metricLeaf struct {
	pathOff, pathEnd int
	leaf
}

// extractor collects the event id, event time and metrics from the leaves a
// payload scanner reports. It keeps the last value of each path, as
// encoding/json does for duplicate keys, and is reused across records.
type extractor struct {
	idPath, timePath string
	metricSet        map[string]struct{} // nil: every numeric field
	auto             bool

	arena   []byte
	id, tm  leaf
	metrics []metricLeaf
	// hint is the path of a string that holds a number, for the message
	// when no numeric field is found.
	hintOff, hintEnd int
	tooMany          bool
	// epochNext says the number visited next carries CBOR tag 1 (epoch
	// seconds, whatever time_format says); tmEpoch that the time leaf did.
	epochNext, tmEpoch bool
	// pathBuf, strBuf and numBuf are scratch space the scanners reuse
	// across records (numBuf: the CBOR scanner's integers as text, an
	// allocation a CBOR reading before).
	pathBuf, strBuf, numBuf []byte
}

func newExtractor(cfg *Config) *extractor {
	x := &extractor{idPath: cfg.EventID, timePath: cfg.EventTime, auto: len(cfg.Metrics) == 0}
	if !x.auto {
		x.metricSet = make(map[string]struct{}, len(cfg.Metrics))
		for _, m := range cfg.Metrics {
			x.metricSet[m] = struct{}{}
		}
	}
	return x
}

func (x *extractor) reset() {
	x.arena = x.arena[:0]
	x.id, x.tm = leaf{}, leaf{}
	x.metrics = x.metrics[:0]
	x.hintOff, x.hintEnd = 0, 0
	x.tooMany = false
	x.epochNext, x.tmEpoch = false, false
}

func (x *extractor) store(kind leafKind, text []byte) leaf {
	off := len(x.arena)
	x.arena = append(x.arena, text...)
	return leaf{kind: kind, off: off, end: len(x.arena)}
}

func (x *extractor) text(l leaf) []byte { return x.arena[l.off:l.end] }

// wants reports whether a value at path is of interest, so scanners can
// skip decoding strings nobody reads.
func (x *extractor) wants(path []byte) bool {
	if x.auto {
		return true
	}
	if x.idPath != "" && string(path) == x.idPath || x.timePath != "" && string(path) == x.timePath {
		return true
	}
	_, ok := x.metricSet[string(path)]
	return ok
}

// visit records the value at path (an object member, never inside an array).
func (x *extractor) visit(path []byte, kind leafKind, text []byte) {
	epoch := x.epochNext
	x.epochNext = false
	switch {
	case x.idPath != "" && string(path) == x.idPath:
		x.id = x.store(kind, text)
		return
	case x.timePath != "" && string(path) == x.timePath:
		x.tm, x.tmEpoch = x.store(kind, text), epoch && kind == kNumber
		return
	}
	if !x.auto {
		if _, ok := x.metricSet[string(path)]; !ok {
			return
		}
	} else if kind == kString && x.hintEnd == 0 && looksNumeric(text) {
		x.hintOff = len(x.arena)
		x.arena = append(x.arena, path...)
		x.hintEnd = len(x.arena)
	}
	for i := range x.metrics {
		m := &x.metrics[i]
		if bytes.Equal(x.arena[m.pathOff:m.pathEnd], path) {
			if x.auto && kind != kNumber && kind != kNonFinite {
				// The path's last value is not a number: in auto mode
				// that path is no metric (last value wins), not a
				// metric of the wrong type.
				m.leaf = leaf{kind: kAbsent}
				return
			}
			m.leaf = x.store(kind, text)
			return
		}
	}
	if x.auto && kind != kNumber && kind != kNonFinite {
		return // in auto mode only numbers are metrics; a later number at the same path is added then
	}
	if len(x.metrics) == maxMetricsPerReading {
		// A path whose last value stopped being a number holds a slot
		// that is no metric: give it to this one.
		for i := range x.metrics {
			if m := &x.metrics[i]; m.kind == kAbsent {
				m.pathOff = len(x.arena)
				x.arena = append(x.arena, path...)
				m.pathEnd = len(x.arena)
				m.leaf = x.store(kind, text)
				return
			}
		}
		x.tooMany = true
		return
	}
	po := len(x.arena)
	x.arena = append(x.arena, path...)
	m := metricLeaf{pathOff: po, pathEnd: len(x.arena)}
	m.leaf = x.store(kind, text)
	x.metrics = append(x.metrics, m)
}

func looksNumeric(s []byte) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	_, err := strconv.ParseFloat(string(s), 64)
	return err == nil
}

// reading is one parsed record: event time, identity and metric values.
type reading struct {
	hasID   bool
	id      uint64
	t       int64 // unix ms
	ptime   bool  // t is the received-at: the payload carried no event time
	metrics []metricVal
}

type metricVal struct {
	name []byte
	v    float64
}

// finish turns the collected leaves into r (metric names alias the arena;
// prefix, when set, is the topic's {metric} level). receivedAt is the
// record's Bronze stamp (ns) and hashInput the content for a content-hash id.
func (x *extractor) finish(r *reading, receivedAt int64, format string, topic string, payload []byte) *badInput {
	r.metrics = r.metrics[:0]
	r.hasID, r.ptime = false, false
	if x.timePath == "" {
		r.t, r.ptime = floorDiv(receivedAt, 1e6), true
	} else {
		if b := x.timeOf(r, format); b != nil {
			return b
		}
	}
	if x.tooMany {
		return bad(CodeTooManyMetrics, "more than %d metrics in one payload", maxMetricsPerReading)
	}
	for i := range x.metrics {
		m := &x.metrics[i]
		name := x.arena[m.pathOff:m.pathEnd]
		switch m.kind {
		case kNumber:
			v, err := strconv.ParseFloat(string(x.text(m.leaf)), 64)
			if err != nil || math.IsInf(v, 0) {
				return bad(CodeMetricType, "%s %s is out of range", name, x.text(m.leaf))
			}
			r.metrics = append(r.metrics, metricVal{name: name, v: v})
		case kNull, kAbsent:
			// a configured metric may be absent from a given payload
		default:
			return bad(CodeMetricType, "%s is %s", name, m.kind)
		}
	}
	if len(r.metrics) == 0 {
		switch {
		case !x.auto:
			return bad(CodeNoMetrics, "none of the configured metrics is present")
		case x.hintEnd > 0:
			return bad(CodeNoMetrics, "no numeric field (%s is a string)", x.arena[x.hintOff:x.hintEnd])
		default:
			return bad(CodeNoMetrics, "no numeric field")
		}
	}
	switch x.id.kind {
	case kNumber, kString, kBytes:
		r.hasID, r.id = true, hashBytes(fnvOffset, x.text(x.id))
	default:
		// Without an id a reading is identified by its content, but only
		// when it carries its own event time: two readings with equal
		// content and equal event time are the same reading, while equal
		// values at different received-at stamps are not.
		if !r.ptime {
			h := hashBytes(fnvOffset, []byte(topic))
			h = hashBytes(h, []byte{0})
			r.hasID, r.id = true, hashBytes(h, payload)
		}
	}
	return nil
}

func (x *extractor) timeOf(r *reading, format string) *badInput {
	p := x.timePath
	var ms int64
	var te timeErr
	switch x.tm.kind {
	case kAbsent:
		return bad(CodeTimeMissing, "field %s missing", p)
	case kNull:
		return bad(CodeTimeMissing, "field %s is null", p)
	case kNumber:
		if x.tmEpoch {
			format = TimeUnixS // CBOR tag 1 says seconds itself
		}
		ms, te = numericTimeMs(x.text(x.tm), format)
	case kString:
		ms, te = rfc3339Ms(x.text(x.tm), format)
	default:
		return bad(CodeTimeType, "%s is %s", p, x.tm.kind)
	}
	switch te {
	case timeOK:
		r.t = ms
		return nil
	case timeNotNum:
		return bad(CodeTimeType, "%s is a string, %s wants a number", p, format)
	case timeNotStr:
		return bad(CodeTimeType, "%s is a number, rfc3339 wants a string", p)
	case timeBadText:
		return bad(CodeTimeInvalid, "%s %q is not an RFC 3339 time", p, truncate(x.text(x.tm), 40))
	default:
		return bad(CodeTimeInvalid, "%s %s is out of range", p, truncate(x.text(x.tm), 40))
	}
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// hashBytes is 64-bit FNV-1a: stable across processes and versions, which
// the persisted dedup state needs.
func hashBytes(h uint64, b []byte) uint64 {
	for _, c := range b {
		h ^= uint64(c)
		h *= fnvPrime
	}
	return h
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// scanJSON walks a JSON payload, reporting the members of the top-level
// object (nested objects as dot paths) to x. Arrays are validated but not
// descended into. It accepts exactly what encoding/json accepts, up to
// maxDepth levels of nesting.
func scanJSON(x *extractor, data []byte) *badInput {
	s := jsonScanner{data: data, x: x, path: x.pathBuf[:0], buf: x.strBuf[:0]}
	defer func() { x.pathBuf, x.strBuf = s.path, s.buf }()
	s.ws()
	if s.pos < len(s.data) && s.data[s.pos] == '{' {
		s.object(0, true)
	} else {
		s.value(0, false)
		if s.err == nil {
			s.ws()
			if s.pos != len(s.data) {
				s.fail("invalid character %q after top-level value", s.data[s.pos])
			} else {
				return bad(CodeNotObject, "payload is not a JSON object")
			}
		}
	}
	if s.err == nil {
		s.ws()
		if s.pos != len(s.data) {
			s.fail("invalid character %q after top-level value", s.data[s.pos])
		}
	}
	if s.err != nil {
		return bad(CodeNotJSON, "payload is not JSON: %s", s.err.msg)
	}
	return nil
}

type jsonScanner struct {
	data []byte
	pos  int
	x    *extractor
	path []byte
	err  *badInput
	buf  []byte
}

func (s *jsonScanner) fail(format string, a ...any) {
	if s.err == nil {
		s.err = &badInput{msg: fmt.Sprintf(format, a...) + fmt.Sprintf(" at offset %d", s.pos)}
	}
	s.pos = len(s.data)
}

func (s *jsonScanner) ws() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

func (s *jsonScanner) unexpected() {
	if s.pos >= len(s.data) {
		s.fail("unexpected end of input")
		return
	}
	if c := s.data[s.pos]; c >= 0x80 {
		// A byte, not a character: %q would show a Latin-1 letter the
		// payload does not hold (a UTF-8 byte order mark showed as 'ï').
		s.fail("invalid byte 0x%02X", c)
		return
	}
	s.fail("invalid character %q", s.data[s.pos])
}

// value scans one value. extract says whether it sits at an object member
// path the extractor should see.
func (s *jsonScanner) value(depth int, extract bool) {
	if s.pos >= len(s.data) {
		s.unexpected()
		return
	}
	switch c := s.data[s.pos]; {
	case c == '{':
		if extract {
			s.x.visit(s.path, kObject, nil)
		}
		s.object(depth, extract)
	case c == '[':
		if extract {
			s.x.visit(s.path, kArray, nil)
		}
		s.array(depth)
	case c == '"':
		want := extract && s.x.wants(s.path)
		str, ok := s.str(want)
		if ok && want {
			s.x.visit(s.path, kString, str)
		}
	case c == '-' || c >= '0' && c <= '9':
		start := s.pos
		s.number()
		if s.err == nil && extract {
			s.x.visit(s.path, kNumber, s.data[start:s.pos])
		}
	case c == 't':
		if s.lit("true") && extract {
			s.x.visit(s.path, kBool, nil)
		}
	case c == 'f':
		if s.lit("false") && extract {
			s.x.visit(s.path, kBool, nil)
		}
	case c == 'n':
		if s.lit("null") && extract {
			s.x.visit(s.path, kNull, nil)
		}
	default:
		s.unexpected()
	}
}

func (s *jsonScanner) lit(word string) bool {
	if !bytes.HasPrefix(s.data[s.pos:], []byte(word)) {
		// advance to the first wrong byte for the message
		for i := 0; i < len(word) && s.pos < len(s.data) && s.data[s.pos] == word[i]; i++ {
			s.pos++
		}
		s.unexpected()
		return false
	}
	s.pos += len(word)
	return true
}

func (s *jsonScanner) object(depth int, extract bool) {
	if depth >= maxDepth {
		s.fail("nesting deeper than %d", maxDepth)
		return
	}
	s.pos++ // '{'
	s.ws()
	if s.pos < len(s.data) && s.data[s.pos] == '}' {
		s.pos++
		return
	}
	base := len(s.path)
	for {
		if s.pos >= len(s.data) || s.data[s.pos] != '"' {
			s.unexpected()
			return
		}
		key, ok := s.str(extract)
		if !ok {
			return
		}
		if extract {
			s.path = s.path[:base]
			if base > 0 {
				s.path = append(s.path, '.')
			}
			s.path = append(s.path, key...)
		}
		s.ws()
		if s.pos >= len(s.data) || s.data[s.pos] != ':' {
			s.unexpected()
			return
		}
		s.pos++
		s.ws()
		s.value(depth+1, extract)
		if s.err != nil {
			return
		}
		s.ws()
		if s.pos >= len(s.data) {
			s.unexpected()
			return
		}
		switch s.data[s.pos] {
		case ',':
			s.pos++
			s.ws()
		case '}':
			s.pos++
			s.path = s.path[:base]
			return
		default:
			s.unexpected()
			return
		}
	}
}

func (s *jsonScanner) array(depth int) {
	if depth >= maxDepth {
		s.fail("nesting deeper than %d", maxDepth)
		return
	}
	s.pos++ // '['
	s.ws()
	if s.pos < len(s.data) && s.data[s.pos] == ']' {
		s.pos++
		return
	}
	for {
		s.value(depth+1, false)
		if s.err != nil {
			return
		}
		s.ws()
		if s.pos >= len(s.data) {
			s.unexpected()
			return
		}
		switch s.data[s.pos] {
		case ',':
			s.pos++
			s.ws()
		case ']':
			s.pos++
			return
		default:
			s.unexpected()
			return
		}
	}
}

// str scans a string at s.pos ('"'). With decode it returns the decoded
// contents (aliasing the input when no unescaping is needed).
func (s *jsonScanner) str(decode bool) ([]byte, bool) {
	start := s.pos
	s.pos++
	simple := true
	for {
		if s.pos >= len(s.data) {
			s.fail("unexpected end of input in string")
			return nil, false
		}
		c := s.data[s.pos]
		switch {
		case c == '"':
			s.pos++
			raw := s.data[start+1 : s.pos-1]
			if !decode {
				return nil, true
			}
			if simple || utf8.Valid(raw) && bytes.IndexByte(raw, '\\') < 0 {
				return raw, true
			}
			// Escapes or invalid UTF-8: let encoding/json decode the token
			// so surrogates and replacement characters match it exactly.
			var out string
			if err := json.Unmarshal(s.data[start:s.pos], &out); err != nil {
				s.fail("invalid string: %v", err)
				return nil, false
			}
			s.buf = append(s.buf[:0], out...)
			return s.buf, true
		case c == '\\':
			simple = false
			s.pos++
			if s.pos >= len(s.data) {
				s.fail("unexpected end of input in string escape")
				return nil, false
			}
			switch s.data[s.pos] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.pos++
			case 'u':
				s.pos++
				for i := 0; i < 4; i++ {
					if s.pos >= len(s.data) || !isHex(s.data[s.pos]) {
						s.unexpected()
						return nil, false
					}
					s.pos++
				}
			default:
				s.fail("invalid escape %q in string", s.data[s.pos])
				return nil, false
			}
		case c < 0x20:
			s.fail("invalid control character %q in string", c)
			return nil, false
		case c >= 0x80:
			simple = false
			s.pos++
		default:
			s.pos++
		}
	}
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func (s *jsonScanner) number() {
	d := s.data
	if d[s.pos] == '-' {
		s.pos++
	}
	switch {
	case s.pos < len(d) && d[s.pos] == '0':
		s.pos++
	case s.pos < len(d) && d[s.pos] >= '1' && d[s.pos] <= '9':
		for s.pos < len(d) && d[s.pos] >= '0' && d[s.pos] <= '9' {
			s.pos++
		}
	default:
		s.unexpected()
		return
	}
	if s.pos < len(d) && d[s.pos] == '.' {
		s.pos++
		if s.pos >= len(d) || d[s.pos] < '0' || d[s.pos] > '9' {
			s.unexpected()
			return
		}
		for s.pos < len(d) && d[s.pos] >= '0' && d[s.pos] <= '9' {
			s.pos++
		}
	}
	if s.pos < len(d) && (d[s.pos] == 'e' || d[s.pos] == 'E') {
		s.pos++
		if s.pos < len(d) && (d[s.pos] == '+' || d[s.pos] == '-') {
			s.pos++
		}
		if s.pos >= len(d) || d[s.pos] < '0' || d[s.pos] > '9' {
			s.unexpected()
			return
		}
		for s.pos < len(d) && d[s.pos] >= '0' && d[s.pos] <= '9' {
			s.pos++
		}
	}
}

// parseNumberPayload parses a `number` payload: one JSON number literal,
// optionally surrounded by whitespace.
func parseNumberPayload(p []byte) (float64, *badInput) {
	s := jsonScanner{data: p}
	s.ws()
	start := s.pos
	if s.pos >= len(p) || !(p[s.pos] == '-' || p[s.pos] >= '0' && p[s.pos] <= '9') {
		return 0, bad(CodeNotNumber, "payload %q is not a number", truncate(p, 40))
	}
	s.number()
	end := s.pos
	s.ws()
	if s.err != nil || s.pos != len(p) {
		return 0, bad(CodeNotNumber, "payload %q is not a number", truncate(p, 40))
	}
	v, err := strconv.ParseFloat(string(p[start:end]), 64)
	if err != nil || math.IsInf(v, 0) {
		return 0, bad(CodeNotNumber, "payload %q is out of range", truncate(p, 40))
	}
	return v, nil
}
