package verify

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgeagent/edgeagent/uplink/wire"
)

// MQTTConfig configures a Verifier that reads the uplink from an MQTT
// broker (the agent's uplink.mqtt), where batches carry no headers and are
// told apart by their first bytes (docs/wire-format.md, Transport).
type MQTTConfig struct {
	// Broker is the uplink broker (tcp://host:port), reached directly (not
	// through a fault proxy).
	Broker string
	// Topic is the agent's uplink topic with {gateway_id} expanded.
	Topic string
	// ClientID names the verifier's persistent session (default
	// edgerig-verifier). Two verifiers on one broker need distinct ids.
	ClientID string
	Logger   *slog.Logger
	// Clock stamps arrivals; defaults to time.Now.
	Clock func() time.Time
}

// mqttSource is a QoS1 subscriber with a persistent session: what the
// broker accepts for the topic while it is away (a reconnect) is queued for
// it, so nothing published after StartMQTT returns is missed.
type mqttSource struct {
	client     paho.Client
	topic      string
	drainTopic string
	clock      func() time.Time // stamps arrivals
	seq        atomic.Uint64    // arrivals, the Verifier's message sequence
	markers    atomic.Uint64

	mu   sync.Mutex
	seen map[string]chan struct{} // drain markers, closed on arrival
}

// StartMQTT subscribes to the uplink topic and returns once the broker has
// acknowledged the subscription and a marker the verifier published to its
// own drain topic has come back through it. An earlier session of the same client id
// is discarded first (a clean-session connect), so batches a previous run
// left queued are not counted.
func StartMQTT(cfg MQTTConfig) (*Verifier, error) {
	if cfg.Broker == "" || cfg.Topic == "" {
		return nil, fmt.Errorf("%w: Broker and Topic are required", ErrConfig)
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "edgerig-verifier"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	// paho owns the subscriber's goroutines; Close disconnects it.
	v := &Verifier{cfg: Config{Logger: cfg.Logger}, cancel: func() {},
		windows: map[WindowID]*received{}, keys: map[string]wire.Aggregate{}, batches: map[string]bool{}}
	s := &mqttSource{topic: cfg.Topic, drainTopic: "edgerig/verify/" + cfg.ClientID + "/drain", clock: cfg.Clock, seen: map[string]chan struct{}{}}
	if err := discardSession(cfg.Broker, cfg.ClientID); err != nil {
		return nil, fmt.Errorf("verify: discard the old session: %w", err)
	}
	v.mqtt = s
	var err error
	for attempt := 1; ; attempt++ {
		if err = s.connect(cfg, v); err == nil {
			// The broker may still be tearing down the session just
			// discarded: mochi, when that connection's cleanup runs after
			// the new one attached, removes the new client from its
			// registry by their shared id and then routes nothing to it,
			// on a connection that stays up. A marker that comes back
			// proves the subscription; without it, connect again.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err = s.waitDrained(ctx)
			cancel()
			if err == nil {
				return v, nil
			}
			s.client.Disconnect(100)
		}
		if attempt == 3 {
			return nil, fmt.Errorf("verify: %s: %w", cfg.Broker, err)
		}
		cfg.Logger.Warn("verify: mqtt subscription not working; connecting again", "err", err)
	}
}

// connect connects s.client with a persistent session and returns once
// its first subscription is acknowledged (or failed).
func (s *mqttSource) connect(cfg MQTTConfig, v *Verifier) error {
	subscribed := make(chan error, 1)
	var first sync.Once
	onConnect := func(c paho.Client) {
		// Runs on paho's goroutine after every (re)connect: a broker that
		// lost the session (a restart without persistence) loses the
		// subscription with it.
		tok := c.SubscribeMultiple(map[string]byte{s.topic: 1, s.drainTopic: 1}, func(_ paho.Client, m paho.Message) { s.handle(v, m) })
		err := errTimeout(tok, 10*time.Second, "subscribe")
		if err != nil {
			cfg.Logger.Debug("verify: mqtt subscribe failed", "err", err)
		}
		first.Do(func() { subscribed <- err })
	}
	c, err := newMQTTClient(cfg.Broker, cfg.ClientID, false, onConnect)
	if err != nil {
		return err
	}
	s.client = c
	select {
	case err = <-subscribed:
	case <-time.After(15 * time.Second):
		err = fmt.Errorf("subscribe %s: no answer within 15s", s.topic)
	}
	if err != nil {
		c.Disconnect(100)
	}
	return err
}

// discardSession connects with a clean session and disconnects: that
// discards whatever session the broker kept for clientID.
func discardSession(broker, clientID string) error {
	c, err := newMQTTClient(broker, clientID, true, nil)
	if err != nil {
		return err
	}
	c.Disconnect(100)
	return nil
}

// newMQTTClient connects a client that reconnects for ever.
func newMQTTClient(broker, clientID string, clean bool, onConnect paho.OnConnectHandler) (paho.Client, error) {
	o := paho.NewClientOptions().AddBroker(broker).SetClientID(clientID).SetCleanSession(clean).
		SetAutoReconnect(true).SetMaxReconnectInterval(time.Second).SetConnectTimeout(5 * time.Second).
		SetOrderMatters(true) // a drain marker is handled after what the broker queued before it
	if onConnect != nil {
		o.SetOnConnectHandler(onConnect)
	}
	c := paho.NewClient(o)
	if err := errTimeout(c.Connect(), 15*time.Second, "connect "+broker); err != nil {
		return nil, err
	}
	return c, nil
}

func errTimeout(tok paho.Token, d time.Duration, what string) error {
	if !tok.WaitTimeout(d) {
		return fmt.Errorf("%s: no answer within %v", what, d)
	}
	if err := tok.Error(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// handle runs on paho's router, one message at a time in arrival order;
// paho acknowledges the message when it returns.
func (s *mqttSource) handle(v *Verifier, m paho.Message) {
	if m.Topic() == s.drainTopic {
		s.mu.Lock()
		if ch, ok := s.seen[string(m.Payload())]; ok {
			close(ch)
			delete(s.seen, string(m.Payload()))
		}
		s.mu.Unlock()
		return
	}
	v.record(s.seq.Add(1), s.clock(), m.Payload(), wire.DecodeBody)
}

// waitDrained publishes a marker on the verifier's own drain topic and
// waits for it: the broker delivers a session's messages in the order it
// routed them, so everything it had routed for the uplink topic before the
// marker has then been handled. Routed, not acknowledged: mochi sends a
// QoS1 PUBLISH's PUBACK before it routes it, so a marker sent right after
// another client's PUBACK may overtake that message. The rig drains after
// the agent has stopped, seconds after its last publish.
func (s *mqttSource) waitDrained(ctx context.Context) error {
	id := "drain-" + strconv.FormatUint(s.markers.Add(1), 10)
	ch := make(chan struct{})
	s.mu.Lock()
	s.seen[id] = ch
	s.mu.Unlock()
	defer func() { // a marker that never came back leaves nothing behind
		s.mu.Lock()
		delete(s.seen, id)
		s.mu.Unlock()
	}()
	tok := s.client.Publish(s.drainTopic, 1, false, id)
	select {
	case <-tok.Done():
		if err := tok.Error(); err != nil {
			return fmt.Errorf("drain: publish marker: %w", err)
		}
	case <-ctx.Done():
		return fmt.Errorf("drain: publish marker: %w", ctx.Err())
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("drain: marker not received: %w", ctx.Err())
	}
}

// close drops the subscription, so the broker stops queueing for the
// session, and disconnects.
func (s *mqttSource) close() {
	if s.client.IsConnectionOpen() {
		_ = errTimeout(s.client.Unsubscribe(s.topic, s.drainTopic), 2*time.Second, "unsubscribe")
	}
	s.client.Disconnect(250)
}
