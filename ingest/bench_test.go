package ingest

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
)

// The ingest benchmark measures, side by side against the same mosquitto,
// the QoS1 receive rate of a bare paho subscriber that acks at once (the
// ceiling) and the agent's durable ingest (ack after the Bronze commit), live
// and draining a backlog queued while the subscriber was down.

const benchTopic = "sensors/bench-1/telemetry"

// consumer is either side of the comparison.
type consumer interface {
	start(b *testing.B)
	received() uint64
	stop()
}

type bareConsumer struct {
	url, id string
	n       atomic.Uint64
	c       paho.Client
}

func (c *bareConsumer) start(b *testing.B) {
	opts := paho.NewClientOptions().AddBroker(c.url).SetClientID(c.id).SetCleanSession(false).SetOrderMatters(true)
	opts.SetDefaultPublishHandler(func(paho.Client, paho.Message) { c.n.Add(1) })
	subscribed := make(chan struct{}, 1)
	opts.SetOnConnectHandler(func(cl paho.Client) {
		cl.Subscribe("sensors/+/telemetry", 1, func(paho.Client, paho.Message) { c.n.Add(1) }).Wait()
		subscribed <- struct{}{}
	})
	c.c = paho.NewClient(opts)
	if tok := c.c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		b.Fatalf("bare connect: %v", tok.Error())
	}
	select {
	case <-subscribed:
	case <-time.After(10 * time.Second):
		b.Fatal("bare subscriber: no subscription within 10s")
	}
}
func (c *bareConsumer) received() uint64 { return c.n.Load() }
func (c *bareConsumer) stop()            { c.c.Disconnect(100) }

type durableConsumer struct {
	cfg Config
	dir string
	bz  *buffer.Bronze
	in  *Ingester
}

func (c *durableConsumer) start(b *testing.B) {
	var err error
	c.bz, err = buffer.Open(filepath.Join(c.dir, "bronze.db"), buffer.Options{})
	if err != nil {
		b.Fatal(err)
	}
	c.in, err = New(c.bz, c.cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := c.in.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	mqtttest.WaitFor(b, 10*time.Second, "durable consumer connected", c.in.Connected)
}
func (c *durableConsumer) received() uint64 { return c.in.Stats().Acked.Load() }
func (c *durableConsumer) stop() {
	c.in.Close()
	c.bz.Close()
}

func publish(b *testing.B, url string, n int) {
	pub := mqtttest.NewPublisher(b, url, fmt.Sprintf("bench-pub-%d", time.Now().UnixNano()))
	payload := []byte(`{"id":"00000000","ts":1700000000000,"temperature":21.5,"humidity":40}`)
	var last paho.Token
	for i := 0; i < n; i++ {
		last = pub.Client.Publish(benchTopic, 1, false, payload)
		if i%1000 == 999 {
			last.Wait() // bound the publisher's in-flight window
		}
	}
	last.Wait()
}

// measureLive runs the publisher while c consumes; returns msgs/s.
func measureLive(b *testing.B, url string, c consumer, n int) float64 {
	c.start(b)
	defer c.stop()
	base := c.received()
	start := time.Now()
	go publish(b, url, n)
	mqtttest.WaitFor(b, 5*time.Minute, "live messages", func() bool { return c.received()-base >= uint64(n) })
	return float64(n) / time.Since(start).Seconds()
}

// measureBacklog queues n messages for c's session while it is down, then
// times the drain.
func measureBacklog(b *testing.B, url string, c consumer, n int) float64 {
	c.start(b) // create the persistent session
	c.stop()
	publish(b, url, n)
	start := time.Now()
	c.start(b)
	defer c.stop()
	mqtttest.WaitFor(b, 5*time.Minute, fmt.Sprintf("backlog drained (%T)", c), func() bool { return c.received() >= uint64(n) })
	return float64(n) / time.Since(start).Seconds()
}

func BenchmarkIngestVsBare(b *testing.B) {
	mosq := mqtttest.StartMosquitto(b, "")
	live, backlog := 100_000, 200_000
	if testing.Short() {
		live, backlog = 5_000, 10_000
	}
	tmpl := testConfigForBench(b, mosq.URL())
	for i := 0; i < b.N; i++ {
		bareLive := measureLive(b, mosq.URL(), &bareConsumer{url: mosq.URL(), id: "bare-live"}, live)
		dur := &durableConsumer{cfg: tmpl("durable-live"), dir: b.TempDir()}
		durLive := measureLive(b, mosq.URL(), dur, live)
		commitsLive := dur.in.Stats().Commits.Load()

		bareBacklog := measureBacklog(b, mosq.URL(), &bareConsumer{url: mosq.URL(), id: "bare-backlog"}, backlog)
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		durB := &durableConsumer{cfg: tmpl("durable-backlog"), dir: b.TempDir()}
		durBacklog := measureBacklog(b, mosq.URL(), durB, backlog)
		var after runtime.MemStats
		runtime.ReadMemStats(&after)

		b.ReportMetric(bareLive, "bare-live-msgs/s")
		b.ReportMetric(durLive, "durable-live-msgs/s")
		b.ReportMetric(100*durLive/bareLive, "live-ratio-%")
		b.ReportMetric(float64(live)/float64(max(commitsLive, 1)), "live-msgs/commit")
		b.ReportMetric(bareBacklog, "bare-backlog-msgs/s")
		b.ReportMetric(durBacklog, "durable-backlog-msgs/s")
		b.ReportMetric(100*durBacklog/bareBacklog, "backlog-ratio-%")
		drainSeconds := float64(backlog) / durBacklog
		b.ReportMetric(float64(durB.in.Stats().Commits.Load())/drainSeconds, "backlog-commits/s")
		b.ReportMetric(float64(after.Sys)/(1<<20), "go-sys-MB")
	}
}

func testConfigForBench(b *testing.B, url string) func(id string) Config {
	return func(id string) Config {
		c := testConfig(b, url, id, nil)
		c.MaxCommitRecords = 1000
		c.CommitInterval = 2 * time.Millisecond
		c.ClockTick = time.Second
		return c
	}
}

// BenchmarkIngestPaths drains the same backlog from mosquitto through each
// of the agent's two receive paths, side by side: the connection taking
// QoS1 PUBLISH packets out of paho's stream and writing their PUBACKs
// itself (every broker since session 22), and paho's own (WebSocket
// brokers until session 22; every broker before session 7). It reports each path's rate, the process's CPU
// per message while draining (the publisher has finished by then, and
// mosquitto is another process), and paho's CPU over the connection's.
func BenchmarkIngestPaths(b *testing.B) {
	mosq := mqtttest.StartMosquitto(b, "")
	n := 200_000
	if testing.Short() {
		n = 10_000
	}
	tmpl := testConfigForBench(b, mosq.URL())
	for i := 0; i < b.N; i++ {
		cpu := map[string]float64{}
		for _, path := range []string{"connection", "paho"} {
			cfg := tmpl(fmt.Sprintf("durable-%s-%d", path, i))
			cfg.viaPaho = path == "paho"
			rate, seconds := drainBacklog(b, mosq.URL(), &durableConsumer{cfg: cfg, dir: b.TempDir()}, n)
			cpu[path] = seconds
			b.ReportMetric(rate, path+"-msgs/s")
			b.ReportMetric(1e6*seconds/float64(n), path+"-CPU-µs/msg")
		}
		b.ReportMetric(cpu["paho"]/cpu["connection"], "paho/connection-CPU")
	}
}

// drainBacklog queues n messages for c's session while it is down, then
// returns the drain's rate and the process's CPU seconds during it.
func drainBacklog(b *testing.B, url string, c *durableConsumer, n int) (rate, cpu float64) {
	c.start(b) // create the persistent session
	c.stop()
	publish(b, url, n)
	cpu0 := cpuSeconds(b)
	start := time.Now()
	c.start(b)
	defer c.stop()
	mqtttest.WaitFor(b, 5*time.Minute, "backlog drained", func() bool { return c.received() >= uint64(n) })
	return float64(n) / time.Since(start).Seconds(), cpuSeconds(b) - cpu0
}

// cpuSeconds is the process's user and system CPU time so far.
func cpuSeconds(b *testing.B) float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
