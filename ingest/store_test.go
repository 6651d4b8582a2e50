package ingest

import (
	"slices"
	"testing"

	"github.com/eclipse/paho.mqtt.golang/packets"
)

func TestSessionStoreSkipsOnlyInboundQoS1Publishes(t *testing.T) {
	s := newSessionStore()
	pub := func(qos byte) *packets.PublishPacket {
		p := packets.NewControlPacket(packets.Publish).(*packets.PublishPacket)
		p.Qos = qos
		return p
	}
	sub := packets.NewControlPacket(packets.Subscribe).(*packets.SubscribePacket)
	s.Put("i.1", pub(1)) // redelivered by the broker if unacknowledged: not kept
	s.Put("i.2", pub(2)) // QoS2 state: kept
	s.Put("o.3", pub(1)) // an outbound publish awaiting its PUBACK: kept
	s.Put("o.4", sub)    // a SUBSCRIBE awaiting its SUBACK: kept
	got := s.All()
	slices.Sort(got)
	if want := []string{"i.2", "o.3", "o.4"}; !slices.Equal(got, want) {
		t.Fatalf("stored keys %v, want %v", got, want)
	}
	if s.Get("o.4") != sub {
		t.Fatal("Get does not return the stored SUBSCRIBE")
	}
	if s.Get("i.1") != nil {
		t.Fatal("an inbound QoS1 publish was stored")
	}
	s.Del("i.1") // paho deletes after sending the PUBACK: a no-op here
	s.Del("o.3")
	if got := s.All(); len(got) != 2 {
		t.Fatalf("after Del: %v", got)
	}
	s.Reset()
	if got := s.All(); len(got) != 0 {
		t.Fatalf("after Reset: %v", got)
	}
}
