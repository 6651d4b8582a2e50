package sim

import (
	"strings"
	"sync"
	"sync/atomic"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
)

// resendStore is a connection's paho session store (an ordered memory
// store) that knows when the resend after a reconnect is over.
//
// On a reconnect paho marks the connection open, then takes a snapshot of
// the store (All) and resends what it holds. Two things go wrong when a
// new publish is made meanwhile:
//   - it can reach the broker before the resends (paho.mqtt.golang issue
//     731), breaking the device's send order the truth assumes;
//   - made before the snapshot, it is in it: paho then sets the Dup flag on
//     the packet its writer goroutine may be encoding at that moment, a
//     data race inside paho (paho.mqtt.golang issue 703) that fails a
//     -race run.
//
// settled says when a new publish can go: no reconnect has started since
// the last snapshot, and every publish that snapshot held is acknowledged.
// Get hands out a copy of a stored publish, so the flag paho sets on it
// never touches a packet already queued for writing.
type resendStore struct {
	paho.Store

	mu        sync.Mutex
	resuming  bool                // a reconnect began and has not taken its snapshot
	unresent  map[string]struct{} // the snapshot's publishes not yet acknowledged
	unsettled atomic.Bool         // resuming || len(unresent) > 0, for the publish path
}

func newResendStore() *resendStore {
	return &resendStore{Store: paho.NewOrderedMemoryStore(), unresent: map[string]struct{}{}}
}

// reconnecting is paho's OnReconnecting hook: it runs on the reconnect's
// goroutine before each attempt, so before the connection opens.
func (s *resendStore) reconnecting(paho.Client, *paho.ClientOptions) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resuming = true
	s.unsettled.Store(true)
}

// settled reports whether a new publish cannot overtake or race a resend.
// Check the connection is open before calling it: the reconnect marks
// itself before it opens the connection.
func (s *resendStore) settled() bool { return !s.unsettled.Load() }

// All is paho's snapshot of the store when a connection opens.
func (s *resendStore) All() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := s.Store.All()
	s.resuming = false
	clear(s.unresent)
	for _, k := range keys {
		if strings.HasPrefix(k, "o.") { // paho's prefix for outbound packets
			s.unresent[k] = struct{}{}
		}
	}
	s.unsettled.Store(len(s.unresent) > 0)
	return keys
}

// Del is paho dropping a packet, an outbound publish once acknowledged.
func (s *resendStore) Del(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Store.Del(key)
	if _, ok := s.unresent[key]; ok {
		delete(s.unresent, key)
		s.unsettled.Store(s.resuming || len(s.unresent) > 0)
	}
}

// Reset is paho clearing the session.
func (s *resendStore) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Store.Reset()
	clear(s.unresent)
	s.unsettled.Store(s.resuming)
}

// Get returns a stored publish as a new packet. Only fields paho's writer
// never writes are read (it writes RemainingLength while encoding).
func (s *resendStore) Get(key string) packets.ControlPacket {
	cp := s.Store.Get(key)
	stored, ok := cp.(*packets.PublishPacket)
	if !ok {
		return cp
	}
	p := packets.NewControlPacket(packets.Publish).(*packets.PublishPacket)
	p.Dup, p.Qos, p.Retain = stored.Dup, stored.Qos, stored.Retain
	p.TopicName, p.MessageID, p.Payload = stored.TopicName, stored.MessageID, stored.Payload
	return p
}
