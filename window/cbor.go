package window

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
)

// scanCBOR walks a CBOR payload (RFC 8949) whose top-level item is a map
// with text keys, reporting members to x as scanJSON does: nested maps give
// dot paths, arrays are validated but not descended into, tags are
// transparent (so tag 0 and tag 1 times work), integers and floats become
// decimal literals. Text strings must be valid UTF-8.
func scanCBOR(x *extractor, data []byte) *badInput {
	s := cborScanner{data: data, x: x, path: x.pathBuf[:0], buf: x.strBuf[:0], num: x.numBuf[:0]}
	defer func() { x.pathBuf, x.strBuf, x.numBuf = s.path, s.buf, s.num }()
	// Skip leading tags (55799, "self-described CBOR", is common).
	s.skipTags()
	isMap := s.err == nil && s.pos < len(data) && data[s.pos]>>5 == 5
	if s.err == nil {
		s.item(0, isMap)
	}
	if s.err == nil && s.pos != len(data) {
		s.fail("%d bytes of extra data", len(data)-s.pos)
	}
	if s.err != nil {
		return bad(CodeNotCBOR, "payload is not CBOR: %s", s.err.msg)
	}
	if !isMap {
		return bad(CodeNotObject, "payload is not a CBOR map")
	}
	return nil
}

type cborScanner struct {
	data []byte
	pos  int
	x    *extractor
	path []byte
	err  *badInput
	buf  []byte
	num  []byte
	// epoch: the next item is the content of tag 1.
	epoch bool
}

func (s *cborScanner) fail(format string, a ...any) {
	if s.err == nil {
		s.err = &badInput{msg: fmt.Sprintf(format, a...) + fmt.Sprintf(" at offset %d", s.pos)}
	}
	s.pos = len(s.data)
}

// head reads an item head: major type, additional info and argument
// (the length, value or simple/float bits).
func (s *cborScanner) head() (major, ai byte, arg uint64, ok bool) {
	if s.pos >= len(s.data) {
		s.fail("unexpected end of data")
		return 0, 0, 0, false
	}
	ib := s.data[s.pos]
	s.pos++
	major, ai = ib>>5, ib&31
	var n int
	switch {
	case ai < 24:
		return major, ai, uint64(ai), true
	case ai == 24:
		n = 1
	case ai == 25:
		n = 2
	case ai == 26:
		n = 4
	case ai == 27:
		n = 8
	case ai == 31:
		return major, ai, 0, true
	default:
		s.pos--
		s.fail("reserved additional information %d", ai)
		return 0, 0, 0, false
	}
	if len(s.data)-s.pos < n {
		s.fail("unexpected end of data")
		return 0, 0, 0, false
	}
	b := s.data[s.pos : s.pos+n]
	s.pos += n
	switch n {
	case 1:
		arg = uint64(b[0])
		if major == 7 && arg < 32 {
			s.fail("invalid simple value %d", arg)
			return 0, 0, 0, false
		}
	case 2:
		arg = uint64(binary.BigEndian.Uint16(b))
	case 4:
		arg = uint64(binary.BigEndian.Uint32(b))
	case 8:
		arg = binary.BigEndian.Uint64(b)
	}
	return major, ai, arg, true
}

// skipTags consumes tag heads before an item.
func (s *cborScanner) skipTags() {
	for s.err == nil && s.pos < len(s.data) && s.data[s.pos]>>5 == 6 {
		if s.data[s.pos]&31 == 31 {
			s.fail("indefinite length for a tag")
			return
		}
		s.head()
	}
}

func (s *cborScanner) visit(extract bool, kind leafKind, text []byte) {
	if extract {
		s.x.visit(s.path, kind, text)
	}
}

// item scans one data item; extract says whether it is an object member
// the extractor should see.
func (s *cborScanner) item(depth int, extract bool) {
	epoch := s.epoch // this item is tag 1's content
	s.epoch = false
	major, ai, arg, ok := s.head()
	if !ok {
		return
	}
	if extract && epoch && (major == 0 || major == 1 || major == 7) {
		s.x.epochNext = true
	}
	if ai == 31 {
		switch major {
		case 2, 3, 4, 5:
		case 7:
			s.pos--
			s.fail("unexpected break")
			return
		default:
			s.pos--
			s.fail("indefinite length for major type %d", major)
			return
		}
	}
	switch major {
	case 0:
		s.num = strconv.AppendUint(s.num[:0], arg, 10)
		s.visit(extract, kNumber, s.num)
	case 1:
		// -1 - arg, which may be below math.MinInt64.
		s.num = append(s.num[:0], '-')
		if arg == math.MaxUint64 {
			s.num = append(s.num, "18446744073709551616"...)
		} else {
			s.num = strconv.AppendUint(s.num, arg+1, 10)
		}
		s.visit(extract, kNumber, s.num)
	case 2, 3:
		str, ok := s.str(major, ai, arg)
		if !ok {
			return
		}
		if major == 2 {
			s.visit(extract, kBytes, str)
		} else {
			s.visit(extract, kString, str)
		}
	case 4:
		if depth >= maxDepth {
			s.fail("nesting deeper than %d", maxDepth)
			return
		}
		s.visit(extract, kArray, nil)
		if ai == 31 {
			for !s.isBreak() {
				s.item(depth+1, false)
				if s.err != nil {
					return
				}
			}
			return
		}
		if arg > uint64(len(s.data)-s.pos) {
			s.fail("array of %d items exceeds the data", arg)
			return
		}
		for i := uint64(0); i < arg && s.err == nil; i++ {
			s.item(depth+1, false)
		}
	case 5:
		if depth >= maxDepth {
			s.fail("nesting deeper than %d", maxDepth)
			return
		}
		s.visit(extract, kObject, nil)
		if ai != 31 && arg > uint64(len(s.data)-s.pos)/2 {
			s.fail("map of %d pairs exceeds the data", arg)
			return
		}
		base := len(s.path)
		for i := uint64(0); ai == 31 || i < arg; i++ {
			if ai == 31 && s.isBreak() {
				break
			}
			if !s.key(extract, base) {
				return
			}
			s.item(depth+1, extract)
			if s.err != nil {
				return
			}
		}
		s.path = s.path[:base]
	case 6:
		if depth >= maxDepth {
			s.fail("nesting deeper than %d", maxDepth)
			return
		}
		// Tags are transparent, but tag 1 (epoch time) says its number
		// is seconds, which an event time read as milliseconds must know.
		s.epoch = arg == 1
		s.item(depth+1, extract)
	case 7:
		switch {
		case ai == 20 || ai == 21:
			s.visit(extract, kBool, nil)
		case ai == 22 || ai == 23: // null, undefined
			s.visit(extract, kNull, nil)
		case ai == 25 || ai == 26 || ai == 27:
			var f float64
			bits := 64
			switch ai {
			case 25:
				f = float16(uint16(arg))
			case 26:
				f = float64(math.Float32frombits(uint32(arg)))
				if string(s.path) != s.x.timePath {
					bits = 32
				}
			default:
				f = math.Float64frombits(arg)
			}
			if math.IsNaN(f) || math.IsInf(f, 0) {
				s.visit(extract, kNonFinite, nil)
				return
			}
			// A single-precision value is its shortest decimal as a
			// single (21.7, what the device meant), not the double it
			// widens to (21.700000762939453): so it aggregates as the
			// same reading in JSON does, and an id 0.1 is "0.1". Not an
			// event time: at 1.7e9 s a single is 128 s coarse, and its
			// exact value is the nearer one.
			s.num = strconv.AppendFloat(s.num[:0], f, 'g', -1, bits)
			s.visit(extract, kNumber, s.num)
		default:
			s.visit(extract, kOther, nil)
		}
	}
}

// isBreak consumes a break byte if one is next.
func (s *cborScanner) isBreak() bool {
	if s.pos >= len(s.data) {
		s.fail("unexpected end of data in indefinite-length item")
		return true
	}
	if s.data[s.pos] == 0xff {
		s.pos++
		return true
	}
	return false
}

// key reads a map key, which must be a text string (tags before it are
// skipped), and sets the member path.
func (s *cborScanner) key(extract bool, base int) bool {
	s.skipTags()
	if s.err != nil {
		return false
	}
	at := s.pos
	major, ai, arg, ok := s.head()
	if !ok {
		return false
	}
	if major != 3 {
		s.pos = at
		s.fail("map key is not a text string")
		return false
	}
	k, ok := s.str(major, ai, arg)
	if !ok {
		return false
	}
	if extract {
		s.path = s.path[:base]
		if base > 0 {
			s.path = append(s.path, '.')
		}
		s.path = append(s.path, k...)
	}
	return true
}

// str reads a byte or text string whose head was just read. The result
// aliases the input for definite lengths.
func (s *cborScanner) str(major, ai byte, arg uint64) ([]byte, bool) {
	if ai != 31 {
		if arg > uint64(len(s.data)-s.pos) {
			s.fail("string of %d bytes exceeds the data", arg)
			return nil, false
		}
		b := s.data[s.pos : s.pos+int(arg)]
		s.pos += int(arg)
		if major == 3 && !utf8.Valid(b) {
			s.fail("text string is not UTF-8")
			return nil, false
		}
		return b, true
	}
	s.buf = s.buf[:0]
	for !s.isBreak() {
		at := s.pos
		m, cai, n, ok := s.head()
		if !ok {
			return nil, false
		}
		if m != major || cai == 31 {
			s.pos = at
			s.fail("bad chunk in indefinite-length string")
			return nil, false
		}
		if n > uint64(len(s.data)-s.pos) {
			s.fail("string chunk of %d bytes exceeds the data", n)
			return nil, false
		}
		s.buf = append(s.buf, s.data[s.pos:s.pos+int(n)]...)
		s.pos += int(n)
	}
	if s.err != nil {
		return nil, false
	}
	if major == 3 && !utf8.Valid(s.buf) {
		s.fail("text string is not UTF-8")
		return nil, false
	}
	return s.buf, true
}

// float16 decodes an IEEE 754 half-precision value.
func float16(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	mant := float64(h & 0x3ff)
	switch exp {
	case 0:
		return sign * math.Ldexp(mant, -24)
	case 0x1f:
		if mant == 0 {
			return math.Inf(int(sign))
		}
		return math.NaN()
	}
	return sign * math.Ldexp(mant+1024, exp-25)
}
