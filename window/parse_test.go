package window

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer"
)

type parsed struct {
	dev     string
	t       int64
	ptime   bool
	hasID   bool
	id      uint64
	metrics map[string]float64
}

// parseRecord runs the stage's parse path (match, parse, skew checks) on
// one record.
func parseRecord(t *testing.T, cfg Config, r buffer.Record) (parsed, *badInput) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg = cfg.withDefaults()
	e := newEngine(&cfg)
	dev, prefix, b := e.readMessage(&r)
	if b != nil {
		return parsed{dev: dev}, b
	}
	p := parsed{dev: dev, t: e.rd.t, ptime: e.rd.ptime, hasID: e.rd.hasID, id: e.rd.id, metrics: map[string]float64{}}
	for _, m := range e.rd.metrics {
		p.metrics[string(e.metricName(prefix, m.name))] = m.v
	}
	return p, nil
}

func TestParseGood(t *testing.T) {
	recv := t0.Add(time.Second)
	cb := func(v any) string {
		b, err := cbor.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	cases := []struct {
		name    string
		tweak   func(*Config)
		rec     buffer.Record
		t       int64
		ptime   bool
		metrics map[string]float64
	}{
		{"json nested", nil,
			msg("sensors/d1/telemetry", `{"id":"a1","ts":1709294400123,"env":{"temp":21.5,"hum":40},"status":"ok","tags":[1,2]}`, recv),
			1709294400123, false, map[string]float64{"env.temp": 21.5, "env.hum": 40}},
		{"json configured metrics", func(c *Config) { c.Metrics = []string{"env.temp", "missing"} },
			msg("sensors/d1/telemetry", `{"ts":1709294400.5,"env":{"temp":-3e1,"hum":40}}`, recv),
			1709294400500, false, map[string]float64{"env.temp": -30}},
		{"json duplicate key last wins", nil,
			msg("sensors/d1/telemetry", `{"ts":1,"ts":"2024-03-01T12:00:00.25Z","v":1,"v":2}`, recv),
			1709294400250, false, map[string]float64{"v": 2}},
		{"json escaped key", nil,
			msg("sensors/d1/telemetry", `{"t\u0073":1709294400,"te\u006dp":1}`, recv),
			1709294400000, false, map[string]float64{"temp": 1}},
		{"cbor nested with tag 1 time", nil,
			msg("cbor/d2/data", cb(map[string]any{"id": 7, "ts": cbor.Tag{Number: 1, Content: 1709294400}, "env": map[string]any{"temp": 20.25}}), recv),
			1709294400000, false, map[string]float64{"env.temp": 20.25}},
		{"cbor float seconds", nil,
			msg("cbor/d2/data", cb(map[string]any{"ts": 1709294400.123, "p": uint64(5), "n": -7}), recv),
			1709294400123, false, map[string]float64{"p": 5, "n": -7}},
		{"number", nil, msg("raw/d3/pressure", " 1013.25\n", recv), recv.UnixMilli(), true, map[string]float64{"pressure": 1013.25}},
		// Found by an audit: a repeated key whose last value is not a
		// number is no metric in auto mode (last value wins), not a
		// dead letter; nor is a number replaced by an object.
		{"json repeated key ending in a string", nil,
			msg("sensors/d1/telemetry", `{"ts":1709294400,"t":1,"t":"x","z":1}`, recv),
			1709294400000, false, map[string]float64{"z": 1}},
		{"cbor repeated key ending in a map", nil,
			msg("cbor/d2/data", "\xa3\x62ts\x1a\x65\xe1\xc3\x40\x61e\x01\x61e\xa1\x61k\x01", recv),
			1709294400000, false, map[string]float64{"e.k": 1}},
		{"json keys that stopped being numbers hold no metric slot", nil,
			msg("sensors/d1/telemetry", `{"ts":1709294400,`+strings.Repeat(`"m":1,"m":"x",`, 1)+manyDropped(64)+`"real":5}`, recv),
			1709294400000, false, map[string]float64{"real": 5}},
		{"cbor float32 event time is its exact value", nil,
			msg("cbor/d2/data", cb(map[string]any{"ts": float32(1709294400), "v": 1}), recv),
			1709294336000, false, map[string]float64{"v": 1}},
		// Tag 1 says seconds, whatever time_format says; a float32 is
		// its shortest decimal as a single (21.7), as in JSON.
		{"cbor tag 1 time under unix_ms", func(c *Config) { c.TimeFormat = TimeUnixMs },
			msg("cbor/d2/data", cb(map[string]any{"ts": cbor.Tag{Number: 1, Content: 1709294400}, "v": float32(21.7)}), recv),
			1709294400000, false, map[string]float64{"v": 21.7}},
		{"no event time configured", func(c *Config) { c.EventTime = "" },
			msg("sensors/d1/telemetry", `{"temp":3}`, recv), recv.UnixMilli(), true, map[string]float64{"temp": 3}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(t)
			if c.tweak != nil {
				c.tweak(&cfg)
			}
			p, b := parseRecord(t, cfg, c.rec)
			if b != nil {
				t.Fatalf("dead-lettered: %s: %s", b.code, b.msg)
			}
			if p.t != c.t || p.ptime != c.ptime {
				t.Errorf("time %d ptime %v, want %d %v", p.t, p.ptime, c.t, c.ptime)
			}
			if len(p.metrics) != len(c.metrics) {
				t.Errorf("metrics %v, want %v", p.metrics, c.metrics)
			}
			for k, v := range c.metrics {
				if got, ok := p.metrics[k]; !ok || got != v {
					t.Errorf("metric %s = %v (present %v), want %v", k, got, ok, v)
				}
			}
		})
	}
}

func TestEventIdentity(t *testing.T) {
	cfg := testConfig(t)
	recv := t0
	a, _ := parseRecord(t, cfg, msg("sensors/d1/telemetry", `{"id":"x","ts":1709294400000,"v":1}`, recv))
	b, _ := parseRecord(t, cfg, msg("sensors/d1/telemetry", `{"v":2,"ts":1709294401000,"id":"x"}`, recv))
	if !a.hasID || a.id != b.id {
		t.Errorf("same event id gave ids %x %x", a.id, b.id)
	}
	c, _ := parseRecord(t, cfg, msg("sensors/d1/telemetry", `{"ts":1709294400000,"v":1}`, recv))
	d, _ := parseRecord(t, cfg, msg("sensors/d1/telemetry", `{"ts":1709294400000,"v":1}`, recv.Add(time.Second)))
	e, _ := parseRecord(t, cfg, msg("sensors/d1/telemetry", `{"ts":1709294400000,"v":2}`, recv))
	if !c.hasID || c.id != d.id || c.id == e.id {
		t.Errorf("content hash: equal payloads %x %x, different %x", c.id, d.id, e.id)
	}
	n, _ := parseRecord(t, cfg, msg("raw/d1/v", `1`, recv))
	if n.hasID {
		t.Error("a plain number payload has no identity but got one")
	}
}

func TestTimeFormats(t *testing.T) {
	cases := []struct {
		format, lit string
		want        int64
		err         timeErr
	}{
		{TimeUnixS, "1709294400", 1709294400000, timeOK},
		{TimeUnixS, "1709294400.0019", 1709294400001, timeOK},
		{TimeUnixS, "-1.5", -1500, timeOK},
		{TimeUnixS, "-0.0001", -1, timeOK},
		{TimeUnixMs, "1709294400123", 1709294400123, timeOK},
		{TimeUnixMs, "1.709294400123e12", 1709294400123, timeOK},
		{TimeUnixNs, "1709294400123456789", 1709294400123, timeOK},
		{TimeAuto, "1709294400", 1709294400000, timeOK},
		{TimeAuto, "1709294400123", 1709294400123, timeOK},
		{TimeAuto, "1709294400123456", 1709294400123, timeOK},
		{TimeAuto, "1709294400123456789", 1709294400123, timeOK},
		{TimeAuto, "99999999999", 99999999999000, timeOK}, // 11 digits: seconds
		{TimeAuto, "100000000000", 100000000000, timeOK},  // 12 digits: milliseconds
		{TimeUnixS, "1e300", 0, timeRange},
		{TimeUnixMs, "9223372036854775807", 0, timeRange},
		{TimeRFC3339, "1709294400", 0, timeNotStr},
	}
	for _, c := range cases {
		got, err := numericTimeMs([]byte(c.lit), c.format)
		if got != c.want || err != c.err {
			t.Errorf("numericTimeMs(%s, %s) = %d, %d; want %d, %d", c.lit, c.format, got, err, c.want, c.err)
		}
	}
	if ms, err := rfc3339Ms([]byte("2024-03-01T13:00:00.5+01:00"), TimeAuto); err != timeOK || ms != 1709294400500 {
		t.Errorf("rfc3339 = %d, %d", ms, err)
	}
	// RFC 3339 §5.6: a lowercase t and z are allowed; zone hours run 00-23
	// (Go's parser refuses the first and takes +24:00, a day's shift).
	for _, c := range []struct {
		lit  string
		want int64
		err  timeErr
	}{
		{"2024-03-01t12:00:00.5z", 1709294400500, timeOK},
		{"2024-03-01t13:00:00+01:00", 1709294400000, timeOK},
		{"2024-03-01T12:00:00+24:00", 0, timeBadText},
		{"2024-03-01T12:00:00-24:00", 0, timeBadText},
		{"2024-03-01T12:00:00+23:60", 0, timeBadText},
		{"2024-03-01T12:00:00+23:59", 1709294400000 - (23*60+59)*60000, timeOK},
	} {
		if ms, err := rfc3339Ms([]byte(c.lit), TimeAuto); err != c.err || ms != c.want {
			t.Errorf("rfc3339Ms(%s) = %d, %d; want %d, %d", c.lit, ms, err, c.want, c.err)
		}
	}
	if _, err := rfc3339Ms([]byte("2024-03-01T12:00:00Z"), TimeUnixMs); err != timeNotNum {
		t.Errorf("rfc3339 with unix_ms = %d, want timeNotNum", err)
	}
}

// TestBadInput checks every bad-input class end to end: its dead-letter
// row (sequence, topic, reason) and its counter.
func TestBadInput(t *testing.T) {
	recv := t0
	ts := recv.UnixMilli()
	ok := func(extra string) string { return `{"id":"1","ts":` + itoa(ts) + extra + `}` }
	cborGarbage := string([]byte{0xa1, 0x62, 't', 's', 0x1b, 0x00}) // map with a truncated uint64
	cases := []struct {
		name     string
		tweak    func(*Config)
		recs     []buffer.Record
		code     string
		reason   string
		device   string
		deadSeqs int
	}{
		{"not json", nil, []buffer.Record{msg("sensors/d1/telemetry", `{"ts":`, recv)}, CodeNotJSON, "payload is not JSON: unexpected end", "d1", 1},
		// A byte order mark: the byte is named, not shown as the Latin-1
		// letter it is not.
		{"byte order mark", nil, []buffer.Record{msg("sensors/d1/telemetry", "\ufeff{\"ts\":1}", recv)}, CodeNotJSON, "payload is not JSON: invalid byte 0xEF at offset 0", "d1", 1},
		{"not an object", nil, []buffer.Record{msg("sensors/d1/telemetry", `[1,2]`, recv)}, CodeNotObject, "payload is not a JSON object", "d1", 1},
		{"ts missing", nil, []buffer.Record{msg("sensors/d1/telemetry", `{"temp":1}`, recv)}, CodeTimeMissing, "field ts missing", "d1", 1},
		{"ts is a string", func(c *Config) { c.TimeFormat = TimeUnixMs },
			[]buffer.Record{msg("sensors/d1/telemetry", `{"ts":"1709294400000","temp":1}`, recv)}, CodeTimeType, "ts is a string", "d1", 1},
		{"ts unparseable", nil, []buffer.Record{msg("sensors/d1/telemetry", `{"ts":"yesterday","temp":1}`, recv)}, CodeTimeInvalid, `ts "yesterday" is not an RFC 3339 time`, "d1", 1},
		{"ts a bool", nil, []buffer.Record{msg("sensors/d1/telemetry", `{"ts":true,"temp":1}`, recv)}, CodeTimeType, "ts is a bool", "d1", 1},
		{"far future", nil, []buffer.Record{msg("sensors/d1/telemetry", `{"ts":`+itoa(ts+int64(time.Hour/time.Millisecond))+`,"temp":1}`, recv)}, CodeTimeFuture, "more than max_future_skew 10m0s after received-at", "d1", 1},
		{"far past", nil, []buffer.Record{msg("sensors/d1/telemetry", `{"ts":`+itoa(ts-30*24*3600*1000)+`,"temp":1}`, recv)}, CodeTimePast, "more than max_past_skew 168h0m0s before received-at", "d1", 1},
		{"metric is a string", func(c *Config) { c.Metrics = []string{"temp"} },
			[]buffer.Record{msg("sensors/d1/telemetry", ok(`,"temp":"21.5"`), recv)}, CodeMetricType, "temp is a string", "d1", 1},
		{"no numeric metrics", nil, []buffer.Record{msg("sensors/d1/telemetry", ok(`,"temp":"21.5","status":"ok"`), recv)}, CodeNoMetrics, "no numeric field (temp is a string)", "d1", 1},
		{"cbor garbage", nil, []buffer.Record{msg("cbor/d1/data", cborGarbage, recv)}, CodeNotCBOR, "payload is not CBOR: unexpected end of data", "d1", 1},
		{"cbor not a map", nil, []buffer.Record{msg("cbor/d1/data", string([]byte{0x83, 1, 2, 3}), recv)}, CodeNotObject, "payload is not a CBOR map", "d1", 1},
		{"number payload not a number", nil, []buffer.Record{msg("raw/d1/temp", `twenty`, recv)}, CodeNotNumber, `payload "twenty" is not a number`, "d1", 1},
		{"unknown topic", nil, []buffer.Record{msg("factory/line1", ok(`,"v":1`), recv)}, CodeUnknownTopic, "no subscription matches topic factory/line1", "", 1},
		{"too many devices", func(c *Config) { c.MaxDevices = 1 },
			[]buffer.Record{msg("sensors/d1/telemetry", ok(`,"v":1`), recv), msg("sensors/d2/telemetry", ok(`,"v":1`), recv)}, CodeTooManyDevices, "window.max_devices reached", "d2", 2},
		{"device name too long", nil, []buffer.Record{msg("sensors/"+strings.Repeat("d", 300)+"/telemetry", ok(`,"v":1`), recv)}, CodeNameTooLong, "device name of 300 bytes, at most 256", "", 1},
		{"metric name too long", nil, []buffer.Record{msg("sensors/d1/telemetry", ok(`,"`+strings.Repeat("m", 300)+`":1`), recv)}, CodeNameTooLong, "metric name of 300 bytes, at most 256", "d1", 1},
		{"rejected by ingest", nil, []buffer.Record{{Kind: buffer.KindRejected, Topic: "sensors/d1/telemetry", ReceivedAt: recv.UnixNano(), Reason: "payload of 70000 bytes over max_payload_bytes", Payload: []byte("{...")}},
			CodeRejected, "refused by ingest: payload of 70000 bytes over max_payload_bytes", "d1", 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(t)
			if c.tweak != nil {
				c.tweak(&cfg)
			}
			db, br := openDB(t, "", true), openBronze(t, "")
			appendAll(t, br, c.recs)
			s, err := New(db, br, cfg)
			if err != nil {
				t.Fatal(err)
			}
			res, err := s.Step()
			if err != nil {
				t.Fatal(err)
			}
			if res.DeadLetters != 1 || res.Records != len(c.recs) {
				t.Errorf("step: %d dead letters of %d records, want 1 of %d", res.DeadLetters, res.Records, len(c.recs))
			}
			rows := readDead(t, db)
			if len(rows) != 1 {
				t.Fatalf("%d dead-letter rows, want 1: %+v", len(rows), rows)
			}
			r := rows[0]
			want := c.recs[len(c.recs)-1]
			if r.Code != c.code || !strings.Contains(r.Reason, c.reason) || r.Seq != uint64(c.deadSeqs) || r.Topic != want.Topic || r.Device != c.device || r.ReceivedAt != want.ReceivedAt {
				t.Errorf("row %+v\nwant code %s, reason containing %q, seq %d, topic %s, device %q", r, c.code, c.reason, c.deadSeqs, want.Topic, c.device)
			}
			if wp := want.Payload[:min(len(want.Payload), DeadLetterPayloadBytes)]; string(r.Payload) != string(wp) {
				t.Errorf("payload %q, want %q", r.Payload, wp)
			}
			st := s.Stats()
			for code, n := range st.DeadLetters {
				if wantN := map[bool]uint64{true: 1, false: 0}[code == c.code]; n != wantN {
					t.Errorf("counter %s = %d, want %d", code, n, wantN)
				}
			}
			if st.DeadLetterRows != 1 {
				t.Errorf("DeadLetterRows = %d", st.DeadLetterRows)
			}
		})
	}
}

func TestBadInputFilterAndCap(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxDeadLetterRows = 3
	db, br := openDB(t, "", true), openBronze(t, "")
	var recs []buffer.Record
	for i := range 5 {
		recs = append(recs, msg("sensors/d"+itoa(int64(i%2))+"/telemetry", `not json`, t0.Add(time.Duration(i)*time.Second)))
	}
	recs = append(recs, msg("raw/d0/x", `nan`, t0.Add(10*time.Second)))
	appendAll(t, br, recs)
	s, err := New(db, br, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, s)
	rows := readDead(t, db)
	if len(rows) != 3 || rows[0].Seq != 4 || rows[2].Seq != 6 {
		t.Fatalf("rows after cap: %+v", rows)
	}
	st := s.Stats()
	if st.DeadLettersEvicted != 3 || st.DeadLetterRows != 3 || st.DeadLetters[CodeNotJSON] != 5 || st.DeadLetters[CodeNotNumber] != 1 {
		t.Errorf("stats: evicted %d rows %d counts %v", st.DeadLettersEvicted, st.DeadLetterRows, st.DeadLetters)
	}
	var got []DeadLetter
	err = db.View(func(tx *bolt.Tx) error {
		got, err = ReadDeadLetters(tx, Filter{Device: "d0", Reason: CodeNotJSON, From: t0.Add(time.Second)}, 10)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Seq != 5 {
		t.Errorf("filtered rows %+v, want seq 5 only", got)
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

func TestFloat16(t *testing.T) {
	for _, c := range []struct {
		bits uint16
		want float64
	}{{0x3c00, 1}, {0xc000, -2}, {0x7bff, 65504}, {0x0001, 5.960464477539063e-08}, {0x7c00, math.Inf(1)}} {
		if got := float16(c.bits); got != c.want {
			t.Errorf("float16(%#x) = %v, want %v", c.bits, got, c.want)
		}
	}
	if !math.IsNaN(float16(0x7e00)) {
		t.Error("float16 NaN")
	}
}

// manyDropped writes n keys that are numbers first and strings last: in
// auto mode none is a metric.
func manyDropped(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `"d%d":1,"d%d":"x",`, i, i)
	}
	return b.String()
}

// TestMaxMetricsPerDevice: a reading that would give its device more
// series than window.max_metrics_per_device is dead-lettered whole
// (too_many_metrics); readings of the metrics it holds go on, and once its
// windows are final and pruned a new metric is taken.
func TestMaxMetricsPerDevice(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxMetricsPerDevice = 3
	p := newStepper(t, cfg)
	at := func(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }
	reading := func(sec int, id, metrics string) buffer.Record {
		return msg("sensors/d1/telemetry", fmt.Sprintf(`{"id":%q,"ts":%d,%s}`, id, at(sec).UnixMilli(), metrics), at(sec))
	}
	p.feed(reading(1, "1", `"a":1,"b":2`), reading(2, "2", `"c":3`))
	p.feed(reading(3, "3", `"a":4,"d":5`), reading(4, "4", `"a":6,"b":7,"c":8`))
	dead := readDead(t, p.db)
	if len(dead) != 1 || dead[0].Code != CodeTooManyMetrics || dead[0].Seq != 3 ||
		!strings.Contains(dead[0].Reason, "window.max_metrics_per_device reached: the device holds 3 metrics in state, and the reading adds 1") {
		t.Fatalf("dead letters %+v, want reading 3 as too_many_metrics", dead)
	}
	// A reading past the window, its delay and lateness prunes the three
	// series; then d is a metric like any other.
	aggs := p.feed(reading(200, "5", `"a":9`), reading(201, "6", `"d":9`), tick(at(400)))
	var metrics []string
	for _, a := range aggs {
		metrics = append(metrics, fmt.Sprintf("%s@%d:%d", a.Metric, (a.Start-t0.UnixMilli())/1000, a.Count))
	}
	if got := strings.Join(metrics, " "); !strings.Contains(got, "d@180:1") || !strings.Contains(got, "a@0:2") || !strings.Contains(got, "a@180:1") {
		t.Fatalf("aggregates %s, want a's first window with readings 1 and 4, and d's later one", got)
	}
	if n := len(readDead(t, p.db)); n != 1 {
		t.Fatalf("%d dead letters after the series were pruned, want 1", n)
	}
	// A new device whose first reading is over the bound is refused
	// before it exists: nothing of it is in the state to differ after a
	// restart (a review).
	p.feed(msg("sensors/d2/telemetry", fmt.Sprintf(`{"id":"x","ts":%d,"a":1,"b":2,"c":3,"d":4}`, at(402).UnixMilli()), at(402)))
	if p.s.eng.devices.get("d2") != nil || len(readDead(t, p.db)) != 2 {
		t.Fatalf("d2 tracked (%v) or not dead-lettered: %+v", p.s.eng.devices.get("d2") != nil, readDead(t, p.db))
	}
	// A bound lowered below what a device holds refuses new metrics only:
	// the ones it has go on (a review: every reading was refused).
	p.feed(reading(403, "7", `"a":1,"b":2`))
	if err := p.s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	cfg.MaxMetricsPerDevice = 1
	p.restart(cfg)
	p.feed(reading(404, "8", `"a":2`), reading(405, "9", `"b":3,"a":4`), reading(406, "10", `"e":3`))
	if dead := readDead(t, p.db); len(dead) != 3 || dead[2].Seq != p.br.LastSeq() {
		t.Fatalf("dead letters %+v, want only the reading of a new metric e", dead)
	}
}

// Scanning a CBOR reading reuses the extractor's scratch space from one
// record to the next, integers' text included: once warm, it allocates
// nothing (each integer field was an allocation a reading in load mode).
func TestScanCBORAllocatesNothingOnceWarm(t *testing.T) {
	cfg := testConfig(t).withDefaults()
	x := newExtractor(&cfg)
	data, err := cbor.Marshal(map[string]any{"id": 12345, "ts": int64(1_700_000_000_000), "m0": 21, "m1": -4, "nested": map[string]any{"v": 7}})
	if err != nil {
		t.Fatal(err)
	}
	scan := func() {
		x.reset()
		if b := scanCBOR(x, data); b != nil {
			t.Fatalf("scan: %s", b.msg)
		}
	}
	scan()
	if n := testing.AllocsPerRun(100, scan); n != 0 {
		t.Fatalf("%.1f allocations a scan once warm, want 0", n)
	}
}
