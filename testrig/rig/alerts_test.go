package rig

import (
	"fmt"
	"strings"
	"testing"

	"github.com/edgeagent/edgeagent/testrig/truth"
)

// message is a received MQTT message, for feeding alertWatch directly.
type message struct {
	topic   string
	payload []byte
}

func (m message) Duplicate() bool   { return false }
func (m message) Qos() byte         { return 1 }
func (m message) Retained() bool    { return false }
func (m message) Topic() string     { return m.topic }
func (m message) MessageID() uint16 { return 0 }
func (m message) Payload() []byte   { return m.payload }
func (m message) Ack()              {}

// The alerts check counts a transition once however often its key
// arrives, and fails on a missing one, an extra one, a key that arrives
// with other contents, and a run whose rules never fired.
func TestAlertsCompare(t *testing.T) {
	alert := func(dev string, start int64, state, extra string) message {
		key := fmt.Sprintf("%s/over/%s/%d/%s", Gateway, dev, start, state)
		return message{"edgeagent/rig-gw/alerts/" + dev, fmt.Appendf(nil,
			`{"type":"alert","rule":"over","device":%q,"start":%d,"state":%q,"key":%q%s}`, dev, start, state, key, extra)}
	}
	exp := []truth.Transition{{Rule: "over", Device: "p1", Start: 60_000, State: "fired"}, {Rule: "over", Device: "p1", Start: 180_000, State: "cleared"}}
	w := &alertWatch{byKey: map[string][]byte{}, msgs: map[string]alertMsg{}}
	w.receive(nil, alert("p1", 60_000, "fired", ""))
	w.receive(nil, alert("p1", 60_000, "fired", "")) // published again after a crash
	r := w.compare(exp)
	if r.Expected != 2 || r.Received != 1 || r.Correct != 1 || r.Missing != 1 || r.Extra != 0 || r.Duplicates != 1 || r.Conflicts != 0 || r.complete() {
		t.Fatalf("one of two, delivered twice: %+v", r)
	}
	if f := strings.Join(r.failures(), "\n"); !strings.Contains(f, "1 missing") || !strings.Contains(f, "missing over/p1/180000/cleared") {
		t.Fatalf("failures %q", f)
	}
	w.receive(nil, alert("p1", 180_000, "cleared", ""))
	if r := w.compare(exp); !r.complete() || len(r.failures()) != 0 {
		t.Fatalf("all arrived: %+v %v", r, r.failures())
	}
	w.receive(nil, alert("p2", 60_000, "fired", ""))
	w.receive(nil, alert("p1", 180_000, "cleared", `,"value":1`))
	r = w.compare(exp)
	if f := strings.Join(r.failures(), "\n"); r.Extra != 1 || r.Conflicts != 1 || !strings.Contains(f, "extra "+Gateway+"/over/p2/60000/fired") || !strings.Contains(f, "conflict "+Gateway+"/over/p1/180000/cleared") {
		t.Fatalf("an extra transition and a key with two contents: %+v %q", r, f)
	}
	if f := (&AlertResult{}).failures(); len(f) != 1 || !strings.Contains(f[0], "made no transition") {
		t.Fatalf("no transitions expected: %q", f)
	}
}
