package testrig_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgeagent/edgeagent/testrig/agentproc"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
)

// The benchmarks here run the real agent binary as a child process and
// report its peak RSS (VmHWM), which in-process benchmarks cannot: the
// ingest and window benchmarks measure their own package's code inside the
// test binary.

// benchAgent starts the agent on the config body (data under dir) with a
// status endpoint, and waits until it answers.
func benchAgent(b *testing.B, dir, body string) (*agentproc.Process, string) {
	b.Helper()
	statusAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(b))
	cfg := filepath.Join(dir, "agent.yaml")
	full := fmt.Sprintf("gateway_id: bench-gw\ndata_dir: %q\nstatus: {listen: %q}\n%s", filepath.Join(dir, "data"), statusAddr, body)
	if err := os.WriteFile(cfg, []byte(full), 0o600); err != nil {
		b.Fatal(err)
	}
	p := agentproc.New(agent(b), cfg, filepath.Join(dir, "agent.log"))
	if err := p.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Kill() })
	mqtttest.WaitFor(b, 30*time.Second, "the agent's status endpoint", func() bool {
		_, err := agentproc.FetchStatus(context.Background(), statusAddr)
		return err == nil
	})
	return p, statusAddr
}

func benchStatus(b *testing.B, addr string) *agentproc.Status {
	b.Helper()
	st, err := agentproc.FetchStatus(context.Background(), addr)
	if err != nil {
		b.Fatal(err)
	}
	return st
}

// BenchmarkAgentIngest is the ingest issue's measurement with the agent
// process against a local mosquitto, side by side with a bare paho
// subscriber that acks at once: live (publisher running) and draining a
// backlog queued while the consumer was down, as msgs/s and ratios, the
// agent's Bronze commits (fsyncs) per second, and its peak RSS. The agent
// runs its window stage too, for 100 devices.
func BenchmarkAgentIngest(b *testing.B) {
	mosq := mqtttest.StartMosquitto(b, "")
	live, backlog := 100_000, 200_000
	if testing.Short() {
		live, backlog = 5_000, 10_000
	}
	// Readings the window stage takes: 100 devices in turn, each with a
	// reading every 100 ms of event time, from an hour ago: the run's
	// 600,000 readings (the bare subscriber's phases count too) cover 10
	// minutes of it, never in the future, where readings are dead letters
	// (at a reading a second they reached 40 minutes ahead: the agent's
	// phases measured a flood of dead letters). Ids unique; windows close
	// as the run goes.
	const benchDevices = 100
	var seq atomic.Int64
	start := time.Now().Add(-time.Hour).UnixMilli()
	publish := func(n int) {
		pub := mqtttest.NewPublisher(b, mosq.URL(), fmt.Sprintf("bench-pub-%d", time.Now().UnixNano()))
		var last paho.Token
		for i := range n {
			k := seq.Add(1)
			dev, ts := k%benchDevices, start+k/benchDevices*100
			payload := fmt.Appendf(nil, `{"id":"%08d","ts":%d,"temperature":21.5,"humidity":40}`, k, ts)
			last = pub.Client.Publish(fmt.Sprintf("sensors/bench-%03d/telemetry", dev), 1, false, payload)
			if i%1000 == 999 {
				last.Wait() // bound the publisher's in-flight window
			}
		}
		last.Wait()
		pub.Client.Disconnect(100)
	}
	// bare subscribes with a persistent session and counts what it gets.
	bare := func(id string) (count *atomic.Uint64, stop func()) {
		count = new(atomic.Uint64)
		opts := paho.NewClientOptions().AddBroker(mosq.URL()).SetClientID(id).SetCleanSession(false)
		c := paho.NewClient(opts)
		if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			b.Fatalf("bare connect: %v", tok.Error())
		}
		if tok := c.Subscribe("sensors/+/telemetry", 1, func(paho.Client, paho.Message) { count.Add(1) }); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			b.Fatalf("bare subscribe: %v", tok.Error())
		}
		return count, func() { c.Disconnect(100) }
	}
	// timed waits until got reaches n, and returns the rate since start.
	timed := func(start time.Time, n int, what string, got func() uint64) float64 {
		mqtttest.WaitFor(b, 5*time.Minute, what, func() bool { return got() >= uint64(n) })
		return float64(n) / time.Since(start).Seconds()
	}
	for i := 0; i < b.N; i++ {
		n, stop := bare(fmt.Sprintf("bare-live-%d", i))
		start := time.Now()
		go publish(live)
		bareLive := timed(start, live, "bare live", n.Load)
		stop()
		_, stop = bare(fmt.Sprintf("bare-backlog-%d", i)) // its session queues the backlog
		stop()
		publish(backlog)
		start = time.Now() // the broker sends the backlog as soon as the session resumes
		n, stop = bare(fmt.Sprintf("bare-backlog-%d", i))
		bareBacklog := timed(start, backlog, "bare backlog", n.Load)
		stop()

		dir := b.TempDir()
		body := fmt.Sprintf(`mqtt:
  broker: %q
  client_id: bench-agent-%d
  subscriptions: [{topic: "sensors/{device}/telemetry", qos: 1}]
`, mosq.URL(), i)
		p, addr := benchAgent(b, dir, body)
		committed := func() uint64 { return benchStatus(b, addr).Ingest.CommittedTotal }
		mqtttest.WaitFor(b, 30*time.Second, "the agent connected", func() bool { return benchStatus(b, addr).Ingest.Connected })
		start = time.Now()
		// Live, both rates follow the publisher, which shares the machine:
		// the agent's own work slows it (and mosquitto) more than the bare
		// subscriber's does. The tail, from the publisher's last message to
		// the agent's commit of it, says whether the agent kept up.
		var published atomic.Int64
		go func() { publish(live); published.Store(time.Now().UnixNano()) }()
		agentLive := timed(start, live, "agent live", committed)
		var tail time.Duration // 0: all committed before the publisher returned
		if at := published.Load(); at != 0 {
			tail = time.Since(time.Unix(0, at))
		}
		commitsLive := float64(benchStatus(b, addr).Ingest.CommitsTotal) / time.Since(start).Seconds()
		if _, err := p.Terminate(30 * time.Second); err != nil {
			b.Fatal(err)
		}
		publish(backlog)
		start = time.Now() // the agent's start is part of the drain
		p, addr = benchAgent(b, dir, body)
		agentBacklog := timed(start, backlog, "agent backlog", func() uint64 { return benchStatus(b, addr).Ingest.CommittedTotal })
		commitsBacklog := float64(benchStatus(b, addr).Ingest.CommitsTotal) / time.Since(start).Seconds()
		// The peak includes the window stage's share of the drain.
		mqtttest.WaitFor(b, 5*time.Minute, "the window stage through the backlog", func() bool { return benchStatus(b, addr).Bronze.BacklogRecords == 0 })
		if w := benchStatus(b, addr).Window; w.DeadLettersTotal != 0 || w.LateTotal != 0 || w.DuplicatesTotal != 0 {
			b.Fatalf("the backlog's readings should all go into windows: %d dead letters, %d late, %d duplicates", w.DeadLettersTotal, w.LateTotal, w.DuplicatesTotal)
		}
		u := p.Usage()
		if _, err := p.Terminate(30 * time.Second); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(bareLive, "bare-live-msgs/s")
		b.ReportMetric(agentLive, "agent-live-msgs/s")
		b.ReportMetric(100*agentLive/bareLive, "live-ratio-%")
		b.ReportMetric(float64(tail.Milliseconds()), "agent-live-tail-ms")
		b.ReportMetric(commitsLive, "agent-live-commits/s")
		b.ReportMetric(bareBacklog, "bare-backlog-msgs/s")
		b.ReportMetric(agentBacklog, "agent-backlog-msgs/s")
		b.ReportMetric(100*agentBacklog/bareBacklog, "backlog-ratio-%")
		b.ReportMetric(commitsBacklog, "agent-backlog-commits/s")
		b.ReportMetric(float64(u.PeakRSSBytes)/(1<<20), "agent-peak-RSS-MiB")
	}
}

// BenchmarkAgentOpenWindows is the window issue's memory measurement: the
// agent process holding 10,000 devices × 4 metrics of open windows (one
// reading each, through its embedded broker), and its peak RSS.
func BenchmarkAgentOpenWindows(b *testing.B) {
	devices := 10_000
	if testing.Short() {
		devices = 1_000
	}
	for i := 0; i < b.N; i++ {
		dir := b.TempDir()
		mqttAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(b))
		p, addr := benchAgent(b, dir, fmt.Sprintf(`mqtt:
  broker: embedded
  embedded: {listen: %q}
  subscriptions: [{topic: "sensors/{device}/telemetry", qos: 1}]
window: {size: 1m, idle_timeout: 1h}
`, mqttAddr))
		ts := time.Now().UnixMilli()
		const conns = 8
		done := make(chan struct{}, conns)
		for c := range conns {
			go func() {
				defer func() { done <- struct{}{} }()
				pub := mqtttest.NewPublisher(b, "tcp://"+mqttAddr, fmt.Sprintf("bench-line-%d", c))
				var last paho.Token
				for d := c; d < devices; d += conns {
					last = pub.Client.Publish(fmt.Sprintf("sensors/dev-%05d/telemetry", d), 1, false,
						fmt.Appendf(nil, `{"id":"%d","ts":%d,"temperature":21.5,"humidity":40,"pressure":1013,"vibration":0.2}`, d, ts))
					if d%(100*conns) == c {
						last.Wait()
					}
				}
				last.Wait()
			}()
		}
		for range conns {
			<-done
		}
		mqtttest.WaitFor(b, 2*time.Minute, "every reading in an open window", func() bool {
			return benchStatus(b, addr).Window.OpenWindows >= uint64(4*devices)
		})
		st := benchStatus(b, addr)
		u := p.Usage()
		if _, err := p.Terminate(30 * time.Second); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(st.Window.OpenWindows), "open-windows")
		b.ReportMetric(float64(u.PeakRSSBytes)/(1<<20), "agent-peak-RSS-MiB")
	}
}
