package sim

import (
	"strconv"
	"strings"

	"github.com/fxamacker/cbor/v2"

	"github.com/edgeagent/edgeagent/testrig/scenario"
	"github.com/edgeagent/edgeagent/window"
)

// cborMode sorts map keys so a payload's bytes depend on its content only.
var cborMode = func() cbor.EncMode {
	m, err := cbor.EncOptions{Sort: cbor.SortLengthFirst}.EncMode()
	if err != nil {
		panic(err)
	}
	return m
}()

// encode renders a reading in the device's format. Floats are written in
// their shortest exact form, so the agent parses the very float64 the rig
// computed its truth from.
func (d *deviceGen) encode(r *Reading) []byte {
	if d.grp.Format == scenario.FormatCBOR {
		m := make(map[string]any, len(r.Metrics)+2)
		m["id"] = r.ID
		m["ts"] = r.TS
		for _, mt := range r.Metrics {
			m[mt.Name] = mt.Value
		}
		b, err := cborMode.Marshal(m)
		if err != nil {
			panic("sim: encode cbor: " + err.Error()) // only strings, ints and floats: cannot fail
		}
		return b
	}
	return appendJSON(nil, r)
}

func appendJSON(b []byte, r *Reading) []byte {
	b = append(b, `{"id":`...)
	b = strconv.AppendQuote(b, r.ID)
	b = append(b, `,"ts":`...)
	b = strconv.AppendInt(b, r.TS, 10)
	for _, m := range r.Metrics {
		b = append(b, ',')
		b = strconv.AppendQuote(b, m.Name)
		b = append(b, ':')
		b = strconv.AppendFloat(b, m.Value, 'f', -1, 64)
	}
	return append(b, '}')
}

// malformed builds a message the agent must dead-letter, of variant k
// (0..5; 5 is oversized), modelled on the device's message m.
func (d *deviceGen) malformed(k int, m Message) Message {
	bad := Message{Topic: m.Topic, Kind: KindMalformed}
	id := d.nextID()
	ts := d.p.Base
	if m.Reading != nil && !m.Reading.PTime {
		ts = m.Reading.TS
	}
	if k == 5 {
		// Over ingest.max_payload_bytes: refused by ingest before parsing.
		bad.Kind, bad.Note, bad.Code = KindOversized, "oversized", window.CodeRejected
		pad := strings.Repeat("x", int(d.sc.Agent.MaxPayloadBytes)+512)
		if d.grp.Format == scenario.FormatNumber {
			bad.Payload = []byte("21.5" + strings.Repeat(" ", int(d.sc.Agent.MaxPayloadBytes)+512))
			return bad
		}
		if d.grp.Format == scenario.FormatCBOR {
			bad.Payload, _ = cborMode.Marshal(map[string]any{"id": id, "ts": ts, "v": 1.5, "pad": pad})
			return bad
		}
		bad.Payload = []byte(`{"id":"` + id + `","ts":` + strconv.FormatInt(ts, 10) + `,"v":1.5,"pad":"` + pad + `"}`)
		return bad
	}
	switch d.grp.Format {
	case scenario.FormatNumber:
		bad.Payload = []byte([]string{"abc", "1.2.3", `{"v":1}`, "NaN", "12,5"}[k])
		bad.Note, bad.Code = "not-a-number", window.CodeNotNumber
	case scenario.FormatCBOR:
		var v any
		switch k {
		case 0: // truncated: not CBOR
			full, _ := cborMode.Marshal(map[string]any{"id": id, "ts": ts, "temperature": 21.5})
			bad.Payload, bad.Note, bad.Code = full[:len(full)-3], "truncated-cbor", window.CodeNotCBOR
			return bad
		case 1:
			v, bad.Note, bad.Code = []any{1, 2, 3}, "not-a-map", window.CodeNotObject
		case 2:
			v, bad.Note, bad.Code = map[string]any{"id": id, "temperature": 21.5}, "no-ts", window.CodeTimeMissing
		case 3:
			v, bad.Note, bad.Code = map[string]any{"id": id, "ts": "yesterday", "temperature": 21.5}, "bad-ts", window.CodeTimeInvalid
		default:
			v, bad.Note, bad.Code = map[string]any{"id": id, "ts": ts, "status": "ok"}, "no-metrics", window.CodeNoMetrics
		}
		bad.Payload, _ = cborMode.Marshal(v)
	default:
		tsText := strconv.FormatInt(ts, 10)
		switch k {
		case 0:
			bad.Payload, bad.Note, bad.Code = []byte(`{"id":"`+id+`","ts":`+tsText+`,"temperature":`), "truncated-json", window.CodeNotJSON
		case 1:
			bad.Payload, bad.Note, bad.Code = []byte(`[1,2,3]`), "not-an-object", window.CodeNotObject
		case 2:
			bad.Payload, bad.Note, bad.Code = []byte(`{"id":"`+id+`","temperature":21.5}`), "no-ts", window.CodeTimeMissing
		case 3:
			bad.Payload, bad.Note, bad.Code = []byte(`{"id":"`+id+`","ts":"yesterday","temperature":21.5}`), "bad-ts", window.CodeTimeInvalid
		default:
			bad.Payload, bad.Note, bad.Code = []byte(`{"id":"`+id+`","ts":`+tsText+`,"status":"ok"}`), "no-metrics", window.CodeNoMetrics
		}
	}
	return bad
}
