package verify

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgeagent/edgeagent/testrig/mqtttest"
	"github.com/edgeagent/edgeagent/testrig/truth"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

const mqttTopic = "edge/gw/aggregates"

// body encodes one batch as the agent's MQTT sink sends it.
func body(t *testing.T, id, enc string, aggs ...wire.Aggregate) []byte {
	t.Helper()
	b, err := wire.EncodeBatch(&wire.Batch{V: wire.Version, Gateway: gw, Batch: id, Aggregates: aggs}, enc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestMQTTUplink reads batches from a real broker: zstd and plain CBOR told
// apart by their first bytes, a perturbed value reported wrong, a QoS1
// redelivery counted before the upsert, a body that is no batch counted as
// undecodable, and a drain that waits for everything the broker accepted.
func TestMQTTUplink(t *testing.T) {
	url := mqtttest.StartMochi(t)
	v, err := StartMQTT(MQTTConfig{Broker: url, Topic: mqttTopic, ClientID: "verify-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	pub := mqtttest.NewPublisher(t, url, "agent-uplink")
	wrong := agg("b", "t", 0, 1, 7)
	*wrong.Sum += 0.5 // the value the truth does not expect
	b2 := body(t, "b2", wire.EncodingNone, agg("a", "t", 60_000, 1, 3, 4, 5))
	pub.PublishAll(t, mqttTopic, 1, [][]byte{
		body(t, "b1", wire.EncodingZstd, agg("a", "t", 0, 1, 1, 2), wrong),
		b2,
		b2, // a redelivery
		[]byte("not a batch"),
	})
	publishedAndDrained(t, v, 4)
	exp := &truth.Expected{Windows: map[truth.Key]*truth.Window{
		{Device: "a", Metric: "t", Start: 0}:      window(1, 2),
		{Device: "a", Metric: "t", Start: 60_000}: window(3, 4, 5),
		{Device: "b", Metric: "t", Start: 0}:      window(7),
	}, PTime: map[truth.SeriesKey]*truth.Series{}}
	r := v.Compare(exp, CompareOptions{Gateway: gw, Aggregates: all})
	if w := r.Windows; w.Expected != 3 || w.Correct != 2 || w.Wrong != 1 || w.Missing != 0 || w.Extra != 0 {
		t.Fatalf("windows %+v, want 3 expected, 2 correct, 1 wrong", w)
	}
	d := r.Delivery
	if d.Messages != 4 || d.Aggregates != 4 || d.DuplicateBatches != 1 || d.DuplicateAggregates != 1 || d.DecodeErrors != 1 || d.Bytes == 0 {
		t.Fatalf("delivery %+v, want 4 messages, 4 aggregates, 1 duplicate batch and aggregate, 1 undecodable", d)
	}
	if r.OK() {
		t.Fatal("a wrong window must fail the comparison")
	}
	if text := strings.Join(r.Problems, "\n"); !strings.Contains(text, "wrong b/t") {
		t.Fatalf("problems do not name the wrong window:\n%s", text)
	}
}

// TestMQTTUplinkFreshSession runs against mosquitto, as an external
// --uplink-broker would be: a batch queued for the verifier's client id by
// an earlier run is not counted, and a batch published while the verifier
// is connected arrives.
func TestMQTTUplinkFreshSession(t *testing.T) {
	m := mqtttest.StartMosquitto(t, "")
	const id = "verify-fresh"
	// An earlier run's session: subscribed, then gone, with a batch queued.
	old := paho.NewClient(paho.NewClientOptions().AddBroker(m.URL()).SetClientID(id).SetCleanSession(false))
	if tok := old.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	if tok := old.Subscribe(mqttTopic, 1, nil); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	old.Disconnect(100)
	pub := mqtttest.NewPublisher(t, m.URL(), "agent-uplink")
	pub.Publish(t, mqttTopic, 1, body(t, "stale", wire.EncodingZstd, agg("s", "t", 0, 1, 1)))

	v, err := StartMQTT(MQTTConfig{Broker: m.URL(), Topic: mqttTopic, ClientID: id})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	pub.Publish(t, mqttTopic, 1, body(t, "new", wire.EncodingZstd, agg("a", "t", 0, 1, 1)))
	publishedAndDrained(t, v, 1)
	if p := v.Progress(); p.Messages != 1 || p.Windows != 1 {
		t.Fatalf("progress %+v, want only the new batch", p)
	}
}

// deafFirstSession plays a broker that acknowledges the verifier's first
// session's subscription but routes nothing to it, as mochi does when the
// cleanup of the session StartMQTT discarded runs after the new connection
// attached (it drops the new client from its registry by their shared id).
type deafFirstSession struct {
	mochi.HookBase
	clientID    string
	connections atomic.Int32
}

func (h *deafFirstSession) ID() string { return "deaf-first-session" }

func (h *deafFirstSession) Provides(b byte) bool {
	return b == mochi.OnConnect || b == mochi.OnSubscribe
}

// OnConnect runs before the broker answers the connect, so the count is
// up to date before the client can subscribe.
func (h *deafFirstSession) OnConnect(cl *mochi.Client, pk packets.Packet) error {
	if cl.ID == h.clientID && !pk.Connect.Clean { // not StartMQTT's discarding connect
		h.connections.Add(1)
	}
	return nil
}

// OnSubscribe moves the first session's filters where nothing is
// published: the broker acknowledges them and routes the verifier nothing.
func (h *deafFirstSession) OnSubscribe(cl *mochi.Client, pk packets.Packet) packets.Packet {
	if cl.ID == h.clientID && h.connections.Load() == 1 {
		for i := range pk.Filters {
			pk.Filters[i].Filter = "deaf/" + pk.Filters[i].Filter
		}
	}
	return pk
}

// TestMQTTStartProvesItsSubscription: a first session that receives
// nothing is found out by StartMQTT's marker, and the verifier connects
// again; the batches published after it starts then all arrive. Without
// the marker the verifier would wait out the run with nothing (a CI run
// lost 2,114 windows so).
func TestMQTTStartProvesItsSubscription(t *testing.T) {
	const id = "verify-deaf"
	hook := &deafFirstSession{clientID: id}
	url := mqtttest.StartMochiWith(t, new(auth.AllowHook), hook)
	v, err := StartMQTT(MQTTConfig{Broker: url, Topic: mqttTopic, ClientID: id})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	if n := hook.connections.Load(); n < 2 {
		t.Fatalf("%d sessions of the verifier, want a second after the deaf first", n)
	}
	pub := mqtttest.NewPublisher(t, url, "agent-uplink")
	pub.PublishAll(t, mqttTopic, 1, [][]byte{body(t, "b1", wire.EncodingNone, agg("a", "t", 0, 1, 1, 2))})
	publishedAndDrained(t, v, 1)
	r := v.Compare(&truth.Expected{Windows: map[truth.Key]*truth.Window{{Device: "a", Metric: "t", Start: 0}: window(1, 2)},
		PTime: map[truth.SeriesKey]*truth.Series{}}, CompareOptions{Gateway: gw, Aggregates: all})
	if w := r.Windows; w.Correct != 1 || w.Missing != 0 {
		t.Fatalf("windows %+v, want the one published window correct (progress %+v, %d sessions, last error %q)", w, v.Progress(), hook.connections.Load(), v.LastError())
	}
}
