package local

import (
	"bytes"
	"errors"
	"testing"
)

func TestMessageRoundTrip(t *testing.T) {
	cases := []Message{
		{Topic: "edgeagent/gw1/alerts/press-1", Payload: []byte(`{"state":"fired"}`), QoS: 1},
		{Topic: "t", Payload: nil, Retain: true, QoS: 0},
		{Topic: "a/ü/c", Payload: bytes.Repeat([]byte{0}, 300), Retain: true, QoS: 2},
	}
	for _, m := range cases {
		b := Encode(m)
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("decode %+v: %v", m, err)
		}
		if got.Topic != m.Topic || !bytes.Equal(got.Payload, m.Payload) || got.Retain != m.Retain || got.QoS != m.QoS {
			t.Fatalf("round trip: got %+v, want %+v", got, m)
		}
		if !bytes.Equal(Encode(got), b) {
			t.Fatalf("re-encoding %+v changed its bytes", m)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	good := Encode(Message{Topic: "a/b", Payload: []byte("x"), QoS: 1})
	cases := map[string][]byte{
		"empty":          nil,
		"short":          good[:3],
		"version":        append([]byte{9}, good[1:]...),
		"flags":          append([]byte{1, 0x80}, good[2:]...),
		"qos":            append([]byte{1, 0, 3}, good[3:]...),
		"empty topic":    {1, 0, 1, 0, 'x'},
		"topic too long": {1, 0, 1, 9, 'a', 'b'},
		"topic not utf8": {1, 0, 1, 1, 0xff},
	}
	for name, b := range cases {
		if _, err := Decode(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: got %v, want ErrCorrupt", name, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Encode(Message{Topic: "edgeagent/gw1/alerts/d", Payload: []byte(`{"a":1}`), QoS: 1}))
	f.Add(Encode(Message{Topic: "x", Retain: true}))
	f.Add([]byte{})
	f.Add([]byte{1, 1, 2, 0x80, 0x80, 0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		again, err := Decode(Encode(m))
		if err != nil {
			t.Fatalf("decode of re-encoded %+v: %v", m, err)
		}
		if again.Topic != m.Topic || !bytes.Equal(again.Payload, m.Payload) || again.Retain != m.Retain || again.QoS != m.QoS {
			t.Fatalf("not a fixed point: %+v then %+v", m, again)
		}
	})
}
