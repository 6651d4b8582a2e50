package local

import (
	"testing"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
)

// The sink's session store keeps no outbound PUBLISH, so a reconnect has
// nothing to resend behind the outbox's back; what else paho stores (a
// SUBSCRIBE awaiting its SUBACK, an inbound QoS2 publish) is kept.
func TestOutboxBackedStoreKeepsNoOutboundPublish(t *testing.T) {
	s := outboxBackedStore{paho.NewMemoryStore()}
	s.Open()
	defer s.Close()
	pub := packets.NewControlPacket(packets.Publish).(*packets.PublishPacket)
	pub.Qos, pub.MessageID, pub.TopicName = 1, 7, "edgeagent/gw1/alerts/press-1"
	sub := packets.NewControlPacket(packets.Subscribe).(*packets.SubscribePacket)
	sub.MessageID = 8
	in := packets.NewControlPacket(packets.Publish).(*packets.PublishPacket)
	in.Qos, in.MessageID = 2, 9
	s.Put("o.7", pub)
	s.Put("o.8", sub)
	s.Put("i.9", in)
	if s.Get("o.7") != nil {
		t.Error("an outbound publish was stored: a reconnect would resend it")
	}
	if s.Get("o.8") == nil || s.Get("i.9") == nil {
		t.Errorf("stored keys %v, want o.8 and i.9", s.All())
	}
}
