package sim

import (
	"testing"

	"github.com/eclipse/paho.mqtt.golang/packets"
)

func storedPublish(id uint16) *packets.PublishPacket {
	p := packets.NewControlPacket(packets.Publish).(*packets.PublishPacket)
	p.Qos, p.TopicName, p.MessageID, p.Payload = 1, "t/1", id, []byte("21.5")
	return p
}

// The store is settled only when no reconnect is under way and every
// publish the last snapshot held is acknowledged (deleted).
func TestResendStoreSettlesWhenTheSnapshotIsAcknowledged(t *testing.T) {
	s := newResendStore()
	s.Open()
	if !s.settled() {
		t.Fatal("a new store is not settled")
	}
	s.Put("o.1", storedPublish(1))
	s.Put("o.2", storedPublish(2))
	if !s.settled() {
		t.Fatal("publishes made while connected unsettled the store")
	}

	s.reconnecting(nil, nil)
	if s.settled() {
		t.Fatal("settled during a reconnect, before its snapshot")
	}
	if keys := s.All(); len(keys) != 2 {
		t.Fatalf("All = %v, want the two stored publishes", keys)
	}
	if s.settled() {
		t.Fatal("settled with the snapshot's publishes unacknowledged")
	}
	s.Put("o.3", storedPublish(3)) // a publish after the snapshot is not waited for
	s.Del("o.1")
	if s.settled() {
		t.Fatal("settled with o.2 of the snapshot unacknowledged")
	}
	s.Del("o.2")
	if !s.settled() {
		t.Fatal("not settled once the snapshot's publishes are acknowledged")
	}

	s.reconnecting(nil, nil)
	s.Reset()
	if s.settled() {
		t.Fatal("a reset settled a reconnect that has not taken its snapshot")
	}
	s.All()
	if !s.settled() {
		t.Fatal("an empty snapshot left the store unsettled")
	}
}

// Get hands paho a copy: the Dup flag its resend sets must not touch the
// packet its writer may be encoding (paho.mqtt.golang issue 703).
func TestResendStoreGetCopiesPublishes(t *testing.T) {
	s := newResendStore()
	s.Open()
	orig := storedPublish(7)
	s.Put("o.7", orig)
	got, ok := s.Get("o.7").(*packets.PublishPacket)
	if !ok {
		t.Fatalf("Get returned %T, want a publish", s.Get("o.7"))
	}
	if got == orig {
		t.Fatal("Get returned the stored packet itself")
	}
	if got.Qos != 1 || got.TopicName != "t/1" || got.MessageID != 7 || string(got.Payload) != "21.5" || got.MessageType != packets.Publish {
		t.Fatalf("copy differs: %+v", got)
	}
	got.Dup = true
	if orig.Dup {
		t.Fatal("setting Dup on the copy set it on the stored packet")
	}
	if s.Get("o.8") != nil {
		t.Fatal("Get of a missing key returned a packet")
	}
}
