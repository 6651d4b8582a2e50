package uplink

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgeagent/edgeagent/testrig/faultproxy"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

const testTopic = "edge/" + testGateway + "/aggregates"

// mqttCollector is a cloud-side subscriber that keeps every body it gets.
type mqttCollector struct {
	mu     sync.Mutex
	bodies [][]byte
}

// collectMQTT subscribes with QoS 1 on a persistent session directly at the
// broker (not through the test's proxy), resubscribing after reconnects.
func collectMQTT(t *testing.T, url string) *mqttCollector {
	t.Helper()
	c := &mqttCollector{}
	ready := make(chan struct{}, 1)
	opts := paho.NewClientOptions().AddBroker(url).SetClientID(fmt.Sprintf("cloud-%d", time.Now().UnixNano())).
		SetCleanSession(false).SetAutoReconnect(true).SetConnectRetry(true).
		SetConnectRetryInterval(50 * time.Millisecond).SetMaxReconnectInterval(200 * time.Millisecond).
		SetOnConnectHandler(func(cl paho.Client) {
			tok := cl.Subscribe(testTopic, 1, func(_ paho.Client, m paho.Message) {
				c.mu.Lock()
				c.bodies = append(c.bodies, append([]byte(nil), m.Payload()...))
				c.mu.Unlock()
			})
			go func() {
				// Wait for SUBACK off the client's callback goroutine.
				if tok.WaitTimeout(10*time.Second) && tok.Error() == nil {
					select {
					case ready <- struct{}{}:
					default:
					}
				}
			}()
		})
	cl := paho.NewClient(opts)
	if tok := cl.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("collector connect: %v", tok.Error())
	}
	t.Cleanup(func() { cl.Disconnect(100) })
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("collector did not subscribe")
	}
	return c
}

// receiver decodes every body so far with the header-less sniffing decoder.
func (c *mqttCollector) receiver(t *testing.T) *receiver {
	t.Helper()
	c.mu.Lock()
	bodies := append([][]byte(nil), c.bodies...)
	c.mu.Unlock()
	r := newReceiver()
	for i, body := range bodies {
		b, err := wire.DecodeBody(body)
		if err != nil {
			t.Fatalf("mqtt body %d: %v", i, err)
		}
		r.take(t, b)
	}
	return r
}

func mqttConfig(broker string) Config {
	return Config{
		MQTT:            &MQTTConfig{Broker: broker, Topic: "edge/{gateway_id}/aggregates"},
		MaxBatchRecords: 50,
		AckTimeout:      time.Second,
		ReconnectMax:    200 * time.Millisecond,
	}
}

// TestMQTT runs the uplink against mochi (in process) and Debian's mosquitto
// through a fault proxy: a clean drain, a cut link, and lost PUBACKs for
// messages the broker delivered. The receiver, upserting by key, ends with
// every window exactly once whatever was delivered twice.
func TestMQTT(t *testing.T) {
	brokers := []struct {
		name  string
		start func(t *testing.T) (url string, restart func())
	}{
		{"mochi", func(t *testing.T) (string, func()) { return mqtttest.StartMochi(t), nil }},
		{"mosquitto", func(t *testing.T) (string, func()) {
			m := mqtttest.StartMosquitto(t, "")
			return m.URL(), func() { m.Stop(); m.Start() }
		}},
	}
	faults := []struct {
		name   string
		inject func(p *faultproxy.Proxy)
	}{
		{"clean", nil},
		{"cut", (*faultproxy.Proxy).Cut},
		{"lost-puback", (*faultproxy.Proxy).DropServerToClient},
		{"broker-restart", nil},
	}
	for _, br := range brokers {
		for _, f := range faults {
			if f.name == "broker-restart" && br.name == "mochi" {
				continue // the in-process broker keeps no sessions across a restart
			}
			t.Run(br.name+"/"+f.name, func(t *testing.T) {
				url, restart := br.start(t)
				collector := collectMQTT(t, url)
				proxy := newProxy(t, strings.TrimPrefix(url, "tcp://"))
				db := openDB(t)
				fx := makeFixture(t, 10, 8)
				half := len(fx.rows) / 2
				fill(t, db, fx.rows[:half], 100)
				u := startUplink(t, db, mqttConfig("tcp://"+proxy.Addr()))
				waitFor(t, 10*time.Second, "a few batches acknowledged", func() bool { return u.Stats().BatchesSent >= 2 })

				switch {
				case f.inject != nil:
					f.inject(proxy)
				case restart != nil && f.name == "broker-restart":
					restart()
				}
				fill(t, db, fx.rows[half:], 100)
				u.Notify()
				switch f.name {
				case "cut":
					waitFor(t, 10*time.Second, "the link to go down", func() bool { return u.Stats().Link != LinkUp })
				case "lost-puback":
					u.waitAckTimeout(t)
				}
				proxy.Restore()
				u.waitDelivered(t, fx, 30*time.Second)

				tr := fx.truth(t)
				waitFor(t, 10*time.Second, "the receiver to hold every window", func() bool {
					r := collector.receiver(t)
					return len(r.aggregates) == fx.aggs && len(r.alerts) == fx.alerts
				})
				r := collector.receiver(t)
				r.check(t, tr)
				checkOutboxLeft(t, db, tr)
				st := u.Stats()
				if f.name == "clean" && (len(r.duplicateBatches()) > 0 || st.Resends > 0) {
					t.Errorf("a clean run delivered batches twice: %v, %+v", r.duplicateBatches(), st)
				}
				if f.name != "clean" && st.Reconnects == 0 {
					t.Errorf("no reconnect after the fault: %+v", st)
				}
				t.Logf("%d batches, %d resends, %d delivered twice, %d reconnects", st.BatchesSent, st.Resends, len(r.duplicateBatches()), st.Reconnects)
			})
		}
	}
}

// TestMQTTKeepAliveFitsSixteenBits: the keep-alive follows ack_timeout but
// never exceeds what MQTT's 16 bits of seconds carry (65536 s would go out
// as 0, which turns keep-alive off), nor drops below 2 s.
func TestMQTTKeepAliveFitsSixteenBits(t *testing.T) {
	for _, tc := range []struct{ ack, want time.Duration }{
		{time.Second, 2 * time.Second},
		{10 * time.Second, 10 * time.Second},
		{65535 * time.Second, 65535 * time.Second},
		{65536 * time.Second, 65535 * time.Second},
		{100 * time.Hour, 65535 * time.Second},
	} {
		o, err := mqttOptions(Config{MQTT: &MQTTConfig{Broker: "tcp://127.0.0.1:1883", ClientID: "c"}, AckTimeout: tc.ack})
		if err != nil {
			t.Fatal(err)
		}
		if got := time.Duration(o.KeepAlive) * time.Second; got != tc.want {
			t.Errorf("ack_timeout %v: keep-alive %v, want %v", tc.ack, got, tc.want)
		}
	}
}
