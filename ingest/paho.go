package ingest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgeagent/edgeagent/internal/backoff"
	"github.com/edgeagent/edgeagent/internal/secret"
)

// mqttClient is the part of paho ingest uses: a seam for tests and a
// record of what we rely on.
type mqttClient interface {
	Connect() paho.Token
	Disconnect(quiesce uint)
	IsConnectionOpen() bool
	Subscribe(topic string, qos byte, callback paho.MessageHandler) paho.Token
}

// pahoSource subscribes with a persistent session (clean session off, stable
// client id), so the broker queues QoS1 messages while the agent is down,
// and disables paho's auto-ack: Ingester.handle acknowledges after commit.
type pahoSource struct {
	in     *Ingester
	client mqttClient
	up     atomic.Bool
	// conn is the broker connection in use (nil for a scheme paho dials
	// itself, none today); sessionPresent is its CONNACK's flag,
	// sessionKnown whether it was seen.
	conn           atomic.Pointer[bufferedConn]
	sessionPresent atomic.Bool
	sessionKnown   atomic.Bool
	connects       atomic.Uint64
	// hadSession: SessionFile named this broker and client id at start,
	// so the broker should have kept the session; recorded: it does now.
	hadSession bool
	recorded   atomic.Bool
	// retryCtx ends a first-connect back-off when stop begins (not with
	// the ingest's context, which ends first: paho would retry at once
	// while the committer drains).
	retryCtx    context.Context
	cancelRetry context.CancelFunc
	// oversizedQoS2 is the payload size of each QoS2 message the
	// connection cut to a prefix, by packet id, until its handler runs.
	oversizedMu   sync.Mutex
	oversizedQoS2 map[uint16]int
}

func (p *pahoSource) start(ctx context.Context) error {
	cfg := p.in.cfg
	log := p.in.com.log
	shown := secret.URL(cfg.Broker, false) // for logs
	p.readSession()
	p.retryCtx, p.cancelRetry = context.WithCancel(context.Background())
	opts := paho.NewClientOptions().
		AddBroker(cfg.Broker).
		SetClientID(cfg.ClientID).
		SetCleanSession(false).
		SetAutoAckDisabled(true).
		SetOrderMatters(true). // one handler at a time, in arrival order
		SetKeepAlive(cfg.KeepAlive).
		SetPingTimeout(pingTimeout(cfg.KeepAlive)).
		SetConnectTimeout(cfg.ConnectTimeout).
		SetAutoReconnect(true).
		SetConnectRetry(true).
		// paho's pause between first-connect attempts is fixed; the
		// back-off is the notification handler's (connectWait, below).
		SetConnectRetryInterval(time.Millisecond).
		SetMaxReconnectInterval(cfg.ReconnectMax).
		SetStore(newSessionStore())
	if cfg.Username != "" {
		opts.SetUsername(cfg.Username)
		opts.SetPassword(cfg.Password)
	}
	if cfg.TLS != nil {
		opts.SetTLSConfig(cfg.TLS)
	}
	if u, err := url.Parse(cfg.Broker); err == nil {
		publish := p.onPublish
		if cfg.viaPaho {
			publish = nil
		}
		if dial, ok := bufferedDial(u.Scheme, connOptions{
			publish: publish, maxPayload: cfg.MaxPayloadBytes,
			connack:   func(present bool) { p.sessionPresent.Store(present); p.sessionKnown.Store(true) },
			oversized: p.noteOversized,
			opened: func(c *bufferedConn) {
				p.sessionKnown.Store(false)
				p.conn.Store(c)
			},
		}); ok {
			opts.SetCustomOpenConnectionFn(dial)
		}
	}
	opts.SetDefaultPublishHandler(p.onMessage)
	opts.SetOnConnectHandler(func(c paho.Client) {
		p.checkSession()
		// Subscribe on every connect: with a persistent session the broker
		// usually remembers, but not after it lost its own state.
		var problems []string
		refused := false
		for _, s := range cfg.Subscriptions {
			// No per-filter callback: every message goes to the default
			// handler, so paho does not split each topic to match routes.
			filter := s.Template.Filter()
			tok := c.Subscribe(filter, s.QoS, nil)
			if !tok.WaitTimeout(cfg.ConnectTimeout) {
				// Nothing arrives on a filter never subscribed: drop the
				// connection, and paho's reconnect subscribes again.
				log.Error("subscribe timed out; reconnecting", "filter", filter, "timeout", cfg.ConnectTimeout)
				err := fmt.Errorf("subscribe to %s timed out", filter)
				p.in.stats.setErr(err)
				p.dropConnection(err)
				return
			}
			if err := tok.Error(); err != nil {
				log.Error("subscribe failed; reconnecting", "filter", filter, "err", err)
				err = fmt.Errorf("subscribe to %s: %w", filter, err)
				p.in.stats.setErr(err)
				p.dropConnection(err)
				return
			}
			// paho reports a refusal (0x80) only in the result, not as an
			// error.
			if st, ok := tok.(*paho.SubscribeToken); ok {
				switch granted, ok := st.Result()[filter]; {
				case !ok:
				case granted == 0x80:
					problems = append(problems, fmt.Sprintf("%s refused", filter))
					refused = true
					log.Error("the broker refused a subscription: nothing on it will arrive (check the broker's ACL for this client)", "filter", filter, "client_id", cfg.ClientID)
				case granted < s.QoS:
					problems = append(problems, fmt.Sprintf("%s granted QoS %d of %d", filter, granted, s.QoS))
					log.Warn("the broker granted a subscription a lower QoS: its messages are not kept for the agent while it is away", "filter", filter, "asked", s.QoS, "granted", granted)
				}
			}
		}
		p.in.stats.setSubscribeErr(strings.Join(problems, "; "), refused)
		p.recordSession()
		if p.up.Swap(true) {
			return
		}
		p.in.stats.Connected.Store(true)
		log.Info("connected to broker", "broker", shown, "client_id", cfg.ClientID, "subscriptions", filters(cfg.Subscriptions))
	})
	opts.SetConnectionLostHandler(func(_ paho.Client, err error) {
		p.up.Store(false)
		p.in.stats.Connected.Store(false)
		p.in.stats.Reconnects.Add(1)
		p.in.stats.setErr(fmt.Errorf("broker connection lost: %w", err))
		log.Warn("broker connection lost; reconnecting with backoff", "broker", shown, "err", err)
	})
	opts.SetReconnectingHandler(func(_ paho.Client, _ *paho.ClientOptions) {
		log.Debug("reconnecting to broker", "broker", shown)
	})
	// paho retries a failed connect (refused login, TLS, unreachable) by
	// itself and logs why only at debug: say it, once a minute at most
	// (the agent's logger throttles a repeated warning).
	// Only the attempt's notification: paho also sends one per broker
	// (BrokerFailed), and with one broker that counted each attempt twice
	// in the log's repeated=N.
	opts.SetConnectionNotificationHandler(func(_ paho.Client, n paho.ConnectionNotification) {
		switch n := n.(type) {
		case paho.ConnectionNotificationFailed:
			if n.Reason != nil {
				log.Warn("broker connect failed; retrying", "broker", shown, "err", n.Reason)
			}
		case paho.ConnectionNotificationConnecting:
			// paho's reconnects back off by themselves (up to
			// ReconnectMax); its first connect retries at a fixed
			// interval, so a fleet started against a broker that is down
			// would knock every second, in step. It backs off here, in
			// paho's connect goroutine, before the attempt.
			if !n.IsReconnect && n.Attempt > 0 {
				_ = cfg.connectWait(p.retryCtx, backoff.Delay(n.Attempt-1, time.Second, cfg.ReconnectMax, cfg.rand))
			}
		}
	})
	p.client = paho.NewClient(opts)
	// With ConnectRetry the token completes only once connected; do not wait
	// for it, so the agent starts (and Bronze keeps its clock) with the
	// broker down.
	tok := p.client.Connect()
	p.in.wg.Add(1)
	go func() {
		defer p.in.wg.Done()
		select {
		case <-tok.Done():
			if err := tok.Error(); err != nil {
				log.Error("broker connect failed", "broker", shown, "err", err)
			}
		case <-ctx.Done():
		}
	}()
	log.Info("connecting to broker", "broker", shown)
	return nil
}

// checkSession warns when the broker kept no session for the agent where
// it should have: on a reconnect, or on a first connect when an earlier
// run subscribed at this broker under this client id (SessionFile). What
// it had queued for the agent is lost.
func (p *pahoSource) checkSession() {
	n := p.connects.Add(1)
	if !p.sessionKnown.Load() || p.sessionPresent.Load() || (n == 1 && !p.hadSession) {
		return
	}
	// Logged before it is counted: whoever sees the count finds the line.
	p.in.com.log.Warn("the broker had no session for the agent: messages it queued while the agent was away are lost (keep sessions across broker restarts: mosquitto's persistence true; check persistent_client_expiration)",
		"broker", secret.URL(p.in.cfg.Broker, false), "client_id", p.in.cfg.ClientID)
	p.in.stats.SessionLostAt.Store(p.in.cfg.Clock().UnixNano())
	p.in.stats.SessionsLost.Add(1)
}

// sessionID is what SessionFile holds: the session's broker and client id.
func (p *pahoSource) sessionID() string {
	return secret.URL(p.in.cfg.Broker, false) + "\n" + p.in.cfg.ClientID + "\n"
}

// readSession reads SessionFile once, at start.
func (p *pahoSource) readSession() {
	if f := p.in.cfg.SessionFile; f != "" {
		b, err := os.ReadFile(f)
		p.hadSession = err == nil && string(b) == p.sessionID()
		p.recorded.Store(p.hadSession)
	}
}

// recordSession writes SessionFile after the first connect that
// subscribed, if it did not already name this session. A failure only
// costs the warning about a lost session at the next start.
func (p *pahoSource) recordSession() {
	f := p.in.cfg.SessionFile
	if f == "" || p.recorded.Swap(true) {
		return
	}
	tmp := f + ".tmp"
	err := os.WriteFile(tmp, []byte(p.sessionID()), 0o600)
	if err == nil {
		err = os.Rename(tmp, f)
	}
	if err != nil {
		p.in.com.log.Warn("could not record the broker session (only the warning about a session the broker lost depends on it)", "file", f, "err", err)
	}
}

// dropConnection closes the broker connection in use, so paho reconnects.
func (p *pahoSource) dropConnection(why error) {
	if c := p.conn.Load(); c != nil {
		c.drop(why)
	}
}

// onPublish hands a QoS0 or QoS1 message the connection took out of
// paho's stream to the committer, which acknowledges it on that connection.
func (p *pahoSource) onPublish(c *bufferedConn, topic []byte, qos byte, retained, dup bool, id uint16, payload []byte, size int) {
	topicName, payload, chunk := p.in.com.slab.copyMessage(topic, payload)
	m := pending{rec: p.in.classify(topicName, qos, retained, dup, payload, size), chunk: chunk}
	if qos == 1 {
		m.puback, m.pubackID = c, id
	}
	p.in.handlePending(m) // not taken at shutdown: unacknowledged, redelivered
}

// onMessage hands a message paho received to the committer: QoS2 messages
// (and every message in the side-by-side benchmark's viaPaho mode).
func (p *pahoSource) onMessage(_ paho.Client, m paho.Message) {
	size := len(m.Payload())
	if n, ok := p.takeOversized(m); ok {
		size = n // the payload is its prefix: dead-lettered as oversized
	}
	rec := p.in.classify(m.Topic(), m.Qos(), m.Retained(), m.Duplicate(), m.Payload(), size)
	var ack acker // a nil interface for QoS0, not a nil paho.Message
	if m.Qos() > 0 {
		ack = m
	}
	p.in.handle(rec, ack) // not taken at shutdown: unacknowledged, redelivered
}

// noteOversized records the size of a QoS2 payload the connection cut to
// its prefix, until takeOversized finds it for the message.
func (p *pahoSource) noteOversized(id uint16, size int) {
	p.oversizedMu.Lock()
	defer p.oversizedMu.Unlock()
	if p.oversizedQoS2 == nil {
		p.oversizedQoS2 = map[uint16]int{}
	}
	p.oversizedQoS2[id] = size
}

// takeOversized returns the size noteOversized recorded for m, if any.
func (p *pahoSource) takeOversized(m paho.Message) (int, bool) {
	if m.Qos() != 2 {
		return 0, false
	}
	p.oversizedMu.Lock()
	defer p.oversizedMu.Unlock()
	n, ok := p.oversizedQoS2[m.MessageID()]
	delete(p.oversizedQoS2, m.MessageID())
	return n, ok
}

func (p *pahoSource) stop() {
	if p.cancelRetry != nil {
		p.cancelRetry()
	}
	if p.client != nil {
		p.client.Disconnect(250)
	}
	p.up.Store(false)
	p.in.stats.Connected.Store(false)
}

func (p *pahoSource) connected() bool { return p.up.Load() && p.client.IsConnectionOpen() }

func filters(subs []Subscription) string {
	f := make([]string, len(subs))
	for i, s := range subs {
		f[i] = s.Template.Filter()
	}
	return strings.Join(f, ",")
}

// pingTimeout is how long the client waits for a PINGRESP: a dead link
// shows after keep_alive plus this. Paho's fixed 10 s hid a 6 s blackhole
// from an agent with keep_alive 2s. Not below 5 s: PINGRESP queues behind
// PUBLISHes the reader holds while Bronze is slow (an SD card's fsync
// stall).
func pingTimeout(keepAlive time.Duration) time.Duration {
	return min(max(keepAlive/2, 5*time.Second), 10*time.Second)
}
