package window

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"math/big"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"
)

// refLeaf is what a reference decoder saw at a path.
type refLeaf struct {
	kind leafKind
	text string
	// alt is the other text a float may have: fxamacker decodes every
	// float to a float64, so a value a single holds exactly may have been
	// a single on the wire, which the scanner writes as its shortest
	// single-precision decimal.
	alt  string
	skip bool // a value the reference represents differently (tagged times, bignums)
}

func fuzzExtractor(metrics ...string) *extractor {
	cfg := Config{EventID: "id", EventTime: "ts", Metrics: metrics}
	return newExtractor(&cfg)
}

// compareLeaves checks the extractor against the reference's member values.
func compareLeaves(t *testing.T, x *extractor, ref map[string]refLeaf) {
	t.Helper()
	check := func(name string, got leaf, path string) {
		want, ok := ref[path]
		if want.skip {
			return
		}
		if !ok {
			if got.kind != kAbsent {
				t.Fatalf("%s: got kind %v %q, reference has nothing", name, got.kind, x.text(got))
			}
			return
		}
		text := string(x.text(got))
		if got.kind != want.kind || (want.kind == kNumber || want.kind == kString || want.kind == kBytes) && text != want.text && (want.alt == "" || text != want.alt) {
			t.Fatalf("%s: got %v %q, reference %v %q", name, got.kind, x.text(got), want.kind, want.text)
		}
	}
	check("id", x.id, "id")
	check("ts", x.tm, "ts")
	if x.tooMany {
		return
	}
	got := map[string]leaf{}
	for _, m := range x.metrics {
		got[string(x.arena[m.pathOff:m.pathEnd])] = m.leaf
	}
	if x.auto {
		for p, l := range ref {
			if p == "id" || p == "ts" || l.skip {
				continue
			}
			if l.kind == kNumber || l.kind == kNonFinite {
				if _, ok := got[p]; !ok {
					t.Fatalf("auto metric %q (%v %q) missing", p, l.kind, l.text)
				}
			}
		}
		for p, g := range got {
			if g.kind != kNumber && g.kind != kNonFinite {
				continue // superseded by a later non-number at the same path
			}
			check("metric "+p, g, p)
		}
		return
	}
	for m := range x.metricSet {
		if g, ok := got[m]; ok {
			check("metric "+m, g, m)
		} else {
			check("metric "+m, leaf{}, m)
		}
	}
}

// refJSON flattens a JSON object with encoding/json's tokenizer: members
// (not array elements) by dot path, last occurrence wins.
func refJSON(data []byte) (map[string]refLeaf, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type frame struct {
		object  bool
		inArray bool   // this container is, or is inside, an array
		prefix  string // this container's member path
		key     string
		wantKey bool
	}
	leaves := map[string]refLeaf{}
	var stack []frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return leaves, nil
		}
		if err != nil {
			return nil, err
		}
		if n := len(stack); n > 0 && stack[n-1].object && stack[n-1].wantKey {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:n-1]
			} else {
				stack[n-1].key, stack[n-1].wantKey = tok.(string), false
			}
			continue
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			continue
		}
		// a value: find its member path, if it has one
		path, member := "", false
		parentInArray := false
		if n := len(stack); n > 0 {
			p := &stack[n-1]
			parentInArray = p.inArray || !p.object
			if !parentInArray {
				path, member = p.key, true
				if p.prefix != "" {
					path = p.prefix + "." + p.key
				}
			}
			if p.object {
				p.wantKey = true
			}
		}
		var l refLeaf
		switch v := tok.(type) {
		case json.Delim:
			l.kind = kObject
			if v == '[' {
				l.kind = kArray
			}
			stack = append(stack, frame{object: v == '{', wantKey: v == '{', inArray: parentInArray || v == '[', prefix: path})
		case json.Number:
			l = refLeaf{kind: kNumber, text: string(v)}
		case string:
			l = refLeaf{kind: kString, text: v}
		case bool:
			l.kind = kBool
		case nil:
			l.kind = kNull
		}
		if member {
			leaves[path] = l
		}
	}
}

func FuzzParseJSON(f *testing.F) {
	for _, s := range []string{
		`{"id":"a","ts":1709294400,"temp":21.5,"env":{"hum":40,"deep":{"x":-1e3}}}`,
		`{"ts":"2024-03-01T12:00:00Z","v":[1,{"a":2}],"s":"x\u00e9\ud83d\ude00","n":null,"b":true}`,
		`{"a":1,"a":{"b":2},"a.b":3}`, `{"t\u0073":1}`, `[1,2]`, `"x"`, `{"a":01}`, `{"a":1,}`,
		`{"a":"\x"}`, "{\"a\":\"\xff\xfe\"}", `{"a" : 1 , "b" : [ ] }`, ` {} `, `{"a":1}x`, `{"a":1e999}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, metrics := range [][]string{nil, {"a", "a.b", "env.hum"}} {
			x := fuzzExtractor(metrics...)
			b := scanJSON(x, data)
			var r reading
			if b == nil {
				x.finish(&r, 1709294400e9, TimeAuto, "t", data) // must not panic
			}
			valid := json.Valid(data)
			if b != nil && strings.Contains(b.msg, "nesting deeper") {
				continue
			}
			if valid != (b == nil || b.code == CodeNotObject) {
				t.Fatalf("json.Valid = %v but scan says %+v for %q", valid, b, data)
			}
			if !valid {
				continue
			}
			isObj := bytes.HasPrefix(bytes.TrimLeft(data, " \t\r\n"), []byte("{"))
			if isObj != (b == nil) {
				t.Fatalf("object %v but scan says %+v", isObj, b)
			}
			if b != nil {
				continue
			}
			ref, err := refJSON(data)
			if err != nil {
				t.Fatalf("reference failed on valid JSON %q: %v", data, err)
			}
			compareLeaves(t, x, ref)
		}
	})
}

// refCBOR flattens a CBOR map decoded by fxamacker/cbor into Go values.
func refCBOR(v any, prefix string, out map[string]refLeaf) bool {
	m, ok := v.(map[any]any)
	if !ok {
		return false
	}
	for k, val := range m {
		ks, ok := k.(string)
		if !ok {
			return false
		}
		p := ks
		if prefix != "" {
			p = prefix + "." + ks
		}
		switch x := val.(type) {
		case map[any]any:
			out[p] = refLeaf{kind: kObject}
			if !refCBOR(x, p, out) {
				return false
			}
		case []any:
			out[p] = refLeaf{kind: kArray}
		case uint64:
			out[p] = refLeaf{kind: kNumber, text: strconv.FormatUint(x, 10)}
		case int64:
			out[p] = refLeaf{kind: kNumber, text: strconv.FormatInt(x, 10)}
		case float64:
			if math.IsNaN(x) || math.IsInf(x, 0) {
				out[p] = refLeaf{kind: kNonFinite}
			} else {
				l := refLeaf{kind: kNumber, text: strconv.FormatFloat(x, 'g', -1, 64)}
				if float64(float32(x)) == x {
					l.alt = strconv.FormatFloat(x, 'g', -1, 32)
				}
				out[p] = l
			}
		case string:
			out[p] = refLeaf{kind: kString, text: x}
		case []byte:
			out[p] = refLeaf{kind: kBytes, text: string(x)}
		case bool:
			out[p] = refLeaf{kind: kBool}
		case nil:
			out[p] = refLeaf{kind: kNull}
		default: // time.Time, big.Int, simple values: represented differently
			out[p] = refLeaf{skip: true}
		}
	}
	return true
}

func FuzzParseCBOR(f *testing.F) {
	enc := func(v any) []byte {
		b, err := cbor.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	f.Add(enc(map[string]any{"id": "x", "ts": 1709294400, "temp": 21.5, "env": map[string]any{"hum": float32(40.5)}}))
	f.Add(enc(map[string]any{"ts": cbor.Tag{Number: 1, Content: 1709294400.5}, "v": []any{1, 2}, "b": []byte{1}, "n": nil, "t": true}))
	f.Add(enc(map[any]any{1: 2}))
	f.Add(enc([]int{1, 2}))
	f.Add([]byte{0xbf, 0x61, 'a', 0x01, 0x7f, 0x61, 'b', 0x61, 'c', 0xff, 0xf9, 0x3c, 0x00, 0xff}) // indefinite map, chunked key, f16
	f.Add([]byte{0xd9, 0xd9, 0xf7, 0xa1, 0x61, 'x', 0x3b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0xa1, 0x61, 'x', 0xf8, 0x10})
	f.Add([]byte{0xff})
	wellformed, err := cbor.DecOptions{MaxNestedLevels: 65535, MaxArrayElements: math.MaxInt32, MaxMapPairs: math.MaxInt32}.DecMode()
	if err != nil {
		f.Fatal(err)
	}
	decode, err := cbor.DecOptions{DupMapKey: cbor.DupMapKeyEnforcedAPF, UnrecognizedTagToAny: cbor.UnrecognizedTagContentToAny}.DecMode()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, metrics := range [][]string{nil, {"temp", "env.hum"}} {
			x := fuzzExtractor(metrics...)
			b := scanCBOR(x, data)
			if b == nil {
				var r reading
				x.finish(&r, 1709294400e9, TimeAuto, "t", data) // must not panic
			}
			if b == nil || b.code == CodeNotObject {
				if err := wellformed.Wellformed(data); err != nil {
					t.Fatalf("scan accepted %x, fxamacker says not well-formed: %v", data, err)
				}
			}
			var v any
			if err := decode.Unmarshal(data, &v); err != nil {
				continue
			}
			ref := map[string]refLeaf{}
			if !refCBOR(v, "", ref) {
				continue
			}
			if b != nil {
				t.Fatalf("fxamacker decodes %x to a text-keyed map, scan says %s: %s", data, b.code, b.msg)
			}
			compareLeaves(t, x, ref)
		}
	})
}

func FuzzParseNumber(f *testing.F) {
	for _, s := range []string{"21.5", " -0 \n", "1e308", "1e309", "NaN", "inf", "0x10", "1_0", "", "01", "1.", "-", "2.5e-3", "+1"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, b := parseNumberPayload(data)
		trimmed := bytes.Trim(data, " \t\r\n")
		isNum := json.Valid(data) && len(trimmed) > 0 && (trimmed[0] == '-' || trimmed[0] >= '0' && trimmed[0] <= '9')
		if !isNum {
			if b == nil {
				t.Fatalf("%q accepted as %v, encoding/json says not a number", data, v)
			}
			return
		}
		want, err := strconv.ParseFloat(string(trimmed), 64)
		if err != nil || math.IsInf(want, 0) {
			if b == nil {
				t.Fatalf("%q accepted as %v but is out of range", data, v)
			}
			return
		}
		if b != nil || v != want {
			t.Fatalf("%q = %v, %+v; want %v", data, v, b, want)
		}
	})
}

var bigExp = regexp.MustCompile(`[eE][+-]?0*\d{4,}`)

// refTimeMs is the slow reference: exact rational arithmetic.
func refTimeMs(lit string, format string) (int64, timeErr) {
	r, ok := new(big.Rat).SetString(lit)
	if !ok {
		return 0, timeBadNum
	}
	abs := new(big.Rat).Abs(r)
	pow := func(n int64) *big.Rat {
		return new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(n), nil))
	}
	var scale *big.Rat
	unit := format
	if unit == TimeAuto {
		switch {
		case abs.Cmp(pow(11)) < 0:
			unit = TimeUnixS
		case abs.Cmp(pow(14)) < 0:
			unit = TimeUnixMs
		case abs.Cmp(pow(17)) < 0:
			unit = "us"
		default:
			unit = TimeUnixNs
		}
	}
	switch unit {
	case TimeUnixS:
		scale = pow(3)
	case TimeUnixMs:
		scale = pow(0)
	case "us":
		scale = new(big.Rat).Inv(pow(3))
	default:
		scale = new(big.Rat).Inv(pow(6))
	}
	v := new(big.Rat).Mul(r, scale)
	q := new(big.Int).Div(v.Num(), v.Denom()) // Euclidean with a positive denominator: floor
	if !q.IsInt64() || q.Int64() < minEventMs || q.Int64() > maxEventMs {
		return 0, timeRange
	}
	return q.Int64(), timeOK
}

func FuzzParseTime(f *testing.F) {
	for _, s := range []string{"1709294400", "1709294400.123", "-1.5", "1.7e9", "1709294400123456789", "0", "-0.0001",
		"99999999999.9999", "2024-03-01T12:00:00Z", "2024-03-01T12:00:00.123456+02:00", "1e-400", "abc", "01"} {
		f.Add(s, uint8(0))
	}
	formats := []string{TimeAuto, TimeUnixS, TimeUnixMs, TimeUnixNs, TimeRFC3339}
	f.Fuzz(func(t *testing.T, lit string, fi uint8) {
		format := formats[int(fi)%len(formats)]
		// strings: RFC 3339 through time.Parse
		ms, te := rfc3339Ms([]byte(lit), format)
		if format != TimeUnixS && format != TimeUnixMs && format != TimeUnixNs {
			// time.Parse is the oracle, with RFC 3339's own rules where
			// Go's differ (rfc3339ForGo; TestTimeFormats pins those).
			std, zoneOK := rfc3339ForGo(lit)
			if tt, err := time.Parse(time.RFC3339Nano, std); !zoneOK {
				if te != timeBadText {
					t.Fatalf("rfc3339 %q = %d, %d; its zone offset is out of range", lit, ms, te)
				}
			} else if err == nil {
				if te != timeOK && te != timeRange || te == timeOK && ms != tt.UnixMilli() {
					t.Fatalf("rfc3339 %q = %d, %d; time.Parse gives %v", lit, ms, te, tt)
				}
			} else if te != timeBadText {
				t.Fatalf("rfc3339 %q = %d, %d; time.Parse fails: %v", lit, ms, te, err)
			}
		}
		// numbers: exact decimal against big.Rat
		got, ge := numericTimeMs([]byte(lit), format)
		isNum := json.Valid([]byte(lit)) && len(lit) > 0 && (lit[0] == '-' || lit[0] >= '0' && lit[0] <= '9')
		if !isNum {
			if ge != timeBadNum && !(format == TimeRFC3339 && ge == timeNotStr) {
				t.Fatalf("numericTimeMs(%q) = %d, %d; not a number literal", lit, got, ge)
			}
			return
		}
		if format == TimeRFC3339 {
			if ge != timeNotStr {
				t.Fatalf("rfc3339 wants a string, got %d", ge)
			}
			return
		}
		if bigExp.MatchString(lit) {
			return // the reference would build a huge integer
		}
		want, we := refTimeMs(lit, format)
		if got != want || ge != we {
			t.Fatalf("numericTimeMs(%q, %s) = %d, %d; reference %d, %d", lit, format, got, ge, want, we)
		}
	})
}
