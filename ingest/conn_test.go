package ingest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.mqtt.golang/packets"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/testrig/logbuf"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
)

type published struct {
	topic         string
	qos           byte
	retained, dup bool
	id            uint16
	payload       string
}

// filteredStream wraps stream in a bufferedConn whose reader buffer is
// bufSize bytes, collecting what it takes out of paho's stream.
func filteredStream(stream []byte, bufSize int, got *[]published) *bufferedConn {
	return &bufferedConn{
		r: bufio.NewReaderSize(bytes.NewReader(stream), bufSize),
		publish: func(_ *bufferedConn, topic []byte, qos byte, retained, dup bool, id uint16, payload []byte, _ int) {
			*got = append(*got, published{string(topic), qos, retained, dup, id, string(payload)})
		},
	}
}

// readAsPaho reads packets through c with paho's packet reader until the
// stream ends, handing each to got.
func readAsPaho(t *testing.T, c *bufferedConn, got func(packets.ControlPacket)) {
	t.Helper()
	for {
		p, err := packets.ReadPacket(c)
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("paho reading through the connection: %v", err)
		}
		got(p)
	}
}

func encodePacket(t *testing.T, w io.Writer, p packets.ControlPacket) {
	t.Helper()
	if err := p.Write(w); err != nil {
		t.Fatal(err)
	}
}

func publishPacket(topic string, qos byte, retained, dup bool, id uint16, payload []byte) *packets.PublishPacket {
	p := packets.NewControlPacket(packets.Publish).(*packets.PublishPacket)
	p.TopicName, p.Qos, p.Retain, p.Dup, p.MessageID, p.Payload = topic, qos, retained, dup, id, payload
	return p
}

// The connection takes QoS0 and QoS1 PUBLISH packets, encoded by paho's
// own packet code, out of the stream and passes every other packet to paho
// unchanged and in order, whatever the packet's size against the buffer.
func TestConnTakesPublishesOutOfPahosStream(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 300) // two-byte remaining length, over the small buffer
	want := []published{
		{"sensors/a/telemetry", 0, false, false, 0, `{"v":1}`},
		{"sensors/b/telemetry", 1, true, true, 7, string(big)},
		{"sensors/c/telemetry", 1, false, false, 65535, ""},
	}
	var stream, passed bytes.Buffer
	connack := packets.NewControlPacket(packets.Connack).(*packets.ConnackPacket)
	connack.SessionPresent = true
	suback := packets.NewControlPacket(packets.Suback).(*packets.SubackPacket)
	suback.MessageID, suback.ReturnCodes = 1, []byte{1}
	qos2 := publishPacket("sensors/q2/telemetry", 2, false, false, 9, []byte("two"))
	pingresp := packets.NewControlPacket(packets.Pingresp)
	for _, p := range []packets.ControlPacket{connack, suback, qos2, pingresp} {
		encodePacket(t, &passed, p)
	}
	encodePacket(t, &stream, connack)
	encodePacket(t, &stream, publishPacket(want[0].topic, 0, false, false, 0, []byte(want[0].payload)))
	encodePacket(t, &stream, suback)
	encodePacket(t, &stream, publishPacket(want[1].topic, 1, true, true, 7, big))
	encodePacket(t, &stream, qos2)
	encodePacket(t, &stream, publishPacket(want[2].topic, 1, false, false, 65535, nil))
	encodePacket(t, &stream, pingresp)

	for _, size := range []int{16, 32 << 10} {
		t.Run(fmt.Sprintf("buffer %d", size), func(t *testing.T) {
			var got []published
			c := filteredStream(stream.Bytes(), size, &got)
			var toPaho bytes.Buffer
			readAsPaho(t, c, func(p packets.ControlPacket) { encodePacket(t, &toPaho, p) })
			if !bytes.Equal(toPaho.Bytes(), passed.Bytes()) {
				t.Errorf("paho read %x\nwant      %x", toPaho.Bytes(), passed.Bytes())
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("taken out:\n%v\nwant\n%v", got, want)
			}
		})
	}
}

// A payload over maxPayload is not read into memory: a prefix is kept, the
// rest is read past, the size on the wire is reported, and the packets
// after it come through intact.
func TestConnKeepsOnlyAPrefixOfAnOversizedPayload(t *testing.T) {
	huge := bytes.Repeat([]byte("x"), 8<<20)
	var stream bytes.Buffer
	encodePacket(t, &stream, publishPacket("sensors/big/telemetry", 1, false, false, 5, huge))
	encodePacket(t, &stream, publishPacket("sensors/small/telemetry", 1, false, false, 6, []byte(`{"v":1}`)))
	encodePacket(t, &stream, publishPacket("sensors/limit/telemetry", 0, false, false, 0, huge[:40<<10]))
	var got []published
	var sizes []int
	c := &bufferedConn{
		r:          bufio.NewReaderSize(bytes.NewReader(stream.Bytes()), 32<<10),
		maxPayload: 40 << 10,
		publish: func(_ *bufferedConn, topic []byte, qos byte, retained, dup bool, id uint16, payload []byte, size int) {
			got = append(got, published{string(topic), qos, retained, dup, id, string(payload)})
			sizes = append(sizes, size)
		},
	}
	if _, err := io.ReadAll(c); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].topic != "sensors/big/telemetry" || got[0].id != 5 || len(got[0].payload) != oversizedPrefix ||
		got[1].payload != `{"v":1}` || got[1].id != 6 || len(got[2].payload) != 40<<10 {
		t.Fatalf("taken out: %d messages, first %q id %d with %d payload bytes", len(got), got[0].topic, got[0].id, len(got[0].payload))
	}
	if want := []int{8 << 20, 7, 40 << 10}; fmt.Sprint(sizes) != fmt.Sprint(want) {
		t.Errorf("sizes %v, want %v", sizes, want)
	}
}

// A QoS2 PUBLISH goes to paho, which keeps QoS2's exchange, but one over
// maxPayload is cut to its prefix as it streams in (paho read it whole
// before), with its size told under its packet id; one within the bound,
// and every packet after, pass unchanged.
func TestConnCutsAnOversizedQoS2Payload(t *testing.T) {
	huge := bytes.Repeat([]byte("x"), 8<<20)
	big := publishPacket("sensors/big/telemetry", 2, false, true, 9, huge)
	atLimit := publishPacket("sensors/limit/telemetry", 2, false, false, 10, huge[:40<<10])
	small := publishPacket("sensors/small/telemetry", 2, false, false, 11, []byte(`{"v":1}`))
	var stream bytes.Buffer
	for _, p := range []packets.ControlPacket{big, atLimit, small} {
		encodePacket(t, &stream, p)
	}
	cut := map[uint16]int{}
	c := &bufferedConn{
		r:          bufio.NewReaderSize(bytes.NewReader(stream.Bytes()), 32<<10),
		maxPayload: 40 << 10,
		publish: func(*bufferedConn, []byte, byte, bool, bool, uint16, []byte, int) {
			t.Error("a QoS2 PUBLISH was taken out of paho's stream")
		},
		oversized: func(id uint16, size int) { cut[id] = size },
	}
	var got []*packets.PublishPacket
	largest := 0
	readAsPaho(t, c, func(p packets.ControlPacket) {
		got = append(got, p.(*packets.PublishPacket))
		largest = max(largest, cap(c.passBuf))
	})
	if len(got) != 3 {
		t.Fatalf("paho read %d packets, want 3", len(got))
	}
	if g := got[0]; g.TopicName != big.TopicName || g.MessageID != 9 || g.Qos != 2 || !g.Dup || !bytes.Equal(g.Payload, huge[:oversizedPrefix]) {
		t.Errorf("the oversized packet reached paho as %s id %d qos %d dup %v with %d payload bytes, want its %d-byte prefix",
			g.TopicName, g.MessageID, g.Qos, g.Dup, len(g.Payload), oversizedPrefix)
	}
	if g := got[1]; g.MessageID != 10 || len(g.Payload) != 40<<10 {
		t.Errorf("the packet at the limit reached paho with id %d and %d payload bytes, want 10 and all %d", g.MessageID, len(g.Payload), 40<<10)
	}
	if g := got[2]; g.MessageID != 11 || string(g.Payload) != `{"v":1}` {
		t.Errorf("the small packet reached paho as id %d %q", g.MessageID, g.Payload)
	}
	if want := map[uint16]int{9: 8 << 20}; fmt.Sprint(cut) != fmt.Sprint(want) {
		t.Errorf("sizes told %v, want %v", cut, want)
	}
	if largest > 1<<20 {
		t.Errorf("the connection held a %d-byte buffer: the oversized payload was read whole", largest)
	}
}

// A PUBLISH that breaks MQTT's framing is a read error (paho reconnects),
// not a panic or a message with bytes from the next packet; one cut short
// by the connection's end is no message.
func TestConnRejectsMalformedPublish(t *testing.T) {
	for name, stream := range map[string][]byte{
		"topic longer than packet": {0x30, 0x03, 0x00, 0x09, 'a'},
		"qos1 without packet id":   {0x32, 0x03, 0x00, 0x01, 'a'},
		"five-byte length":         {0x30, 0xff, 0xff, 0xff, 0xff, 0x01},
		"qos 3":                    {0x36, 0x05, 0x00, 0x01, 'a', 0x00, 0x01},
		"cut short":                {0x30, 0x05, 0x00, 0x01, 'a'},
	} {
		t.Run(name, func(t *testing.T) {
			var got []published
			_, err := io.ReadAll(filteredStream(stream, 64, &got))
			if len(got) != 0 {
				t.Fatalf("%d messages from a malformed stream: %+v", len(got), got)
			}
			if name != "cut short" && !errors.Is(err, errMalformed) {
				t.Fatalf("err %v, want errMalformed", err)
			}
		})
	}
}

// Any byte stream: no panic, and what is taken out lies within the packet.
func FuzzConnStream(f *testing.F) {
	var seed bytes.Buffer
	_ = publishPacket("a/b", 1, false, false, 3, []byte("hi")).Write(&seed)
	_ = packets.NewControlPacket(packets.Pingresp).Write(&seed)
	f.Add(seed.Bytes())
	f.Add([]byte{0x30, 0x80, 0x01})
	f.Fuzz(func(t *testing.T, stream []byte) {
		var got []published
		_, _ = io.ReadAll(filteredStream(stream, 16, &got))
		for _, m := range got {
			if len(m.topic)+len(m.payload) > len(stream) || m.qos > 1 {
				t.Fatalf("message %+v from %d bytes", m, len(stream))
			}
		}
	})
}

// A broker that never answers a SUBSCRIBE: the agent drops the connection
// and subscribes again on a new one, instead of waiting connected and
// subscribed to nothing.
func TestSubscribeTimeoutReconnects(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var subscribes atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for {
					p, err := packets.ReadPacket(c)
					if err != nil {
						return
					}
					switch p.(type) {
					case *packets.ConnectPacket:
						if _, err := c.Write([]byte{0x20, 0x02, 0x00, 0x00}); err != nil {
							return
						}
					case *packets.SubscribePacket:
						subscribes.Add(1) // never answered
					}
				}
			}()
		}
	}()
	logs := &logbuf.Buffer{}
	cfg := testConfig(t, "tcp://"+ln.Addr().String(), "edgeagent-nosuback", logs)
	cfg.ConnectTimeout = 300 * time.Millisecond
	startIngester(t, openBronze(t, buffer.Options{}), cfg)
	mqtttest.WaitFor(t, 20*time.Second, "a SUBSCRIBE on a second connection", func() bool { return subscribes.Load() >= 2 })
	if !strings.Contains(logs.String(), "subscribe timed out; reconnecting") {
		t.Errorf("no log of the timeout:\n%s", logs.String())
	}
}
