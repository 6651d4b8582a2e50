package ingest

import (
	"strings"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/testrig/faultproxy"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
)

func TestPingTimeout(t *testing.T) {
	for keepAlive, want := range map[time.Duration]time.Duration{
		time.Second:      5 * time.Second, // the floor: PINGRESP may queue behind held PUBLISHes
		12 * time.Second: 6 * time.Second,
		30 * time.Second: 10 * time.Second, // paho's own, the ceiling
		time.Hour:        10 * time.Second,
	} {
		if got := pingTimeout(keepAlive); got != want {
			t.Errorf("keep_alive %v: ping timeout %v, want %v", keepAlive, got, want)
		}
	}
}

// A broker that stops answering without closing the connection (a
// blackhole: a NAT entry gone, a cable pulled upstream) is noticed by the
// keep-alive, and the agent reconnects once it answers again.
func TestBlackholedBrokerIsNoticed(t *testing.T) {
	url := mqtttest.StartMochi(t)
	proxy, err := faultproxy.New(strings.TrimPrefix(url, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	b := openBronze(t, buffer.Options{})
	cfg := testConfig(t, "tcp://"+proxy.Addr(), "edgeagent-blackhole", nil)
	cfg.KeepAlive = time.Second
	in := startIngester(t, b, cfg)
	mqtttest.WaitFor(t, 10*time.Second, "connected", in.Connected)

	proxy.Blackhole()
	blackholed := time.Now()
	// keep_alive plus the ping timeout (1 s + 5 s); the deadline is wide
	// for a loaded machine, the time taken is logged.
	mqtttest.WaitFor(t, 30*time.Second, "the dead link noticed", func() bool { return in.Stats().Reconnects.Load() >= 1 })
	t.Logf("a blackholed broker noticed after %v", time.Since(blackholed).Round(100*time.Millisecond))
	proxy.Restore()
	mqtttest.WaitFor(t, 20*time.Second, "reconnected", in.Connected)
	pub := mqtttest.NewPublisher(t, url, "device-pub")
	msgs := payloads("after", 10)
	pub.PublishAll(t, "sensors/d1/telemetry", 1, msgs)
	waitForMessages(t, b, msgs)
}
