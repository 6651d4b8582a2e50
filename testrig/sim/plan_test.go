package sim

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"

	"github.com/edgeagent/edgeagent/testrig/scenario"
)

func chaos(t *testing.T) *scenario.Scenario {
	t.Helper()
	sc, err := scenario.Lookup("chaos")
	if err != nil {
		t.Fatal(err)
	}
	return sc.WithShort()
}

func TestPlanIsReproducible(t *testing.T) {
	sc := chaos(t)
	start := time.Unix(1_800_000_000, 0)
	a, err := NewPlan(sc, start)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewPlan(sc, start)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Devices) != len(b.Devices) {
		t.Fatal("device counts differ")
	}
	for i := range a.Devices {
		ma, mb := a.Devices[i].Messages, b.Devices[i].Messages
		if len(ma) != len(mb) {
			t.Fatalf("device %s: %d vs %d messages", a.Devices[i].Name, len(ma), len(mb))
		}
		for j := range ma {
			if ma[j].SendAt != mb[j].SendAt || !bytes.Equal(ma[j].Payload, mb[j].Payload) {
				t.Fatalf("device %s message %d differs between two plans of the same seed", a.Devices[i].Name, j)
			}
		}
	}
}

// TestPlanInvariants checks what the truth and the verdicts rely on.
func TestPlanInvariants(t *testing.T) {
	sc := chaos(t)
	start := time.Now()
	p, err := NewPlan(sc, start)
	if err != nil {
		t.Fatal(err)
	}
	notes := map[string]int{}
	kinds := map[Kind]int{}
	for _, d := range p.Devices {
		var last time.Duration
		seen := map[int64]string{}
		ids := map[string][]byte{}
		for i, m := range d.Messages {
			kinds[m.Kind]++
			notes[m.Note]++
			if m.SendAt < last {
				t.Fatalf("%s: message %d sent at %v, before the previous one (%v)", d.Name, i, m.SendAt, last)
			}
			last = m.SendAt
			if m.SendAt > sc.Duration {
				t.Fatalf("%s: message %d sent at %v, after the run", d.Name, i, m.SendAt)
			}
			if m.Kind != KindReading {
				continue
			}
			r := m.Reading
			if r.PTime {
				if !strings.HasPrefix(m.Topic, "num/"+d.Name+"/") {
					t.Fatalf("%s: plain number on topic %s", d.Name, m.Topic)
				}
				continue
			}
			if r.TS > start.Add(-2*time.Minute).UnixMilli() {
				t.Fatalf("%s: event time %d is within 2 minutes of the start: the future-skew check could refuse it", d.Name, r.TS)
			}
			if prev, ok := ids[r.ID]; ok {
				if !m.Retry || !bytes.Equal(prev, m.Payload) {
					t.Fatalf("%s: id %s reused by a message that is not a byte-identical retry", d.Name, r.ID)
				}
				continue
			}
			ids[r.ID] = m.Payload
			if other, ok := seen[r.TS]; ok {
				t.Fatalf("%s: readings %s and %s share event time %d", d.Name, other, r.ID, r.TS)
			}
			seen[r.TS] = r.ID
			checkPayload(t, d.Format, m.Payload, r)
		}
	}
	for _, k := range []Kind{KindReading, KindMalformed, KindOversized, KindGlitch} {
		if kinds[k] == 0 {
			t.Errorf("chaos planned no %s message", k)
		}
	}
	for _, n := range []string{"retry", "out-of-order", "late-within", "late-beyond", "backlog", "burst"} {
		if notes[n] == 0 {
			t.Errorf("chaos planned no %s message (notes: %v)", n, notes)
		}
	}
	for _, m := range p.Devices[0].Messages {
		if m.Kind == KindOversized && len(m.Payload) <= int(sc.Agent.MaxPayloadBytes) {
			t.Errorf("oversized payload of %d bytes is within max_payload_bytes", len(m.Payload))
		}
	}
}

// checkPayload decodes a payload as the agent would and compares it with
// the reading the truth uses.
func checkPayload(t *testing.T, format string, payload []byte, r *Reading) {
	t.Helper()
	var m map[string]any
	switch format {
	case scenario.FormatCBOR:
		if err := cbor.Unmarshal(payload, &m); err != nil {
			t.Fatalf("cbor payload: %v", err)
		}
	default:
		d := json.NewDecoder(bytes.NewReader(payload))
		d.UseNumber()
		if err := d.Decode(&m); err != nil {
			t.Fatalf("json payload %s: %v", payload, err)
		}
	}
	if m["id"] != r.ID {
		t.Fatalf("payload id %v, want %s", m["id"], r.ID)
	}
	for _, mt := range r.Metrics {
		var v float64
		switch x := m[mt.Name].(type) {
		case json.Number:
			v, _ = x.Float64()
		case float64:
			v = x
		default:
			t.Fatalf("payload %s: metric %s is %T", payload, mt.Name, m[mt.Name])
		}
		if v != mt.Value {
			t.Fatalf("payload metric %s = %v, the truth has %v", mt.Name, v, mt.Value)
		}
	}
}

func TestOfflineDevicesFlushInOrder(t *testing.T) {
	sc, err := scenario.Lookup("offline-backlog")
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPlan(sc, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	offline := 0
	for _, d := range p.Devices {
		if d.OfflineUntil == 0 {
			continue
		}
		offline++
		var flushed []Message
		for _, m := range d.Messages {
			if m.Note == "backlog" {
				flushed = append(flushed, m)
			}
		}
		if len(flushed) < 2 {
			t.Fatalf("%s: offline but only %d buffered messages", d.Name, len(flushed))
		}
		for i, m := range flushed {
			if m.SendAt != d.OfflineUntil {
				t.Fatalf("%s: buffered message sent at %v, not at reconnect %v", d.Name, m.SendAt, d.OfflineUntil)
			}
			if i > 0 && m.Reading != nil && flushed[i-1].Reading != nil && !m.Reading.PTime && m.Reading.TS < flushed[i-1].Reading.TS {
				t.Fatalf("%s: backlog not flushed in event-time order", d.Name)
			}
		}
	}
	if want := sc.DeviceCount() / 4; offline < want-1 {
		t.Fatalf("%d devices offline, want about %d", offline, want)
	}
}

// TestEventTimeSpread: the spread is between the devices' last
// acknowledged readings, and leaves out agent-stamped devices and those
// that sent none.
func TestEventTimeSpread(t *testing.T) {
	reading := func(ts int64) Message { return Message{Kind: KindReading, Reading: &Reading{TS: ts}} }
	p := &Plan{Devices: []Device{
		{Messages: []Message{reading(1_000), reading(2_000), reading(3_000)}},
		{Messages: []Message{reading(1_500), reading(9_000)}},
		{Messages: []Message{{Kind: KindReading, Reading: &Reading{TS: 0, PTime: true}}}},
		{Messages: []Message{reading(50_000)}},
		{Messages: []Message{reading(4_000), {Kind: KindReading, Reading: &Reading{TS: 500}, Retry: true}}},
	}}
	// Device 0 got to 2,000, device 1 to 1,500, device 2 is stamped by the
	// agent, device 3 sent nothing, device 4's retry repeats 500 after 4,000.
	if got, want := p.EventTimeSpread([]int{2, 1, 1, 0, 2}), 2500*time.Millisecond; got != want {
		t.Fatalf("spread %v, want %v", got, want)
	}
	if got := p.EventTimeSpread([]int{0, 0, 1, 0, 0}); got != 0 {
		t.Fatalf("spread with no stamped reading sent: %v, want 0", got)
	}
}
