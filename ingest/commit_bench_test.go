package ingest

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
)

// benchMessage is a received QoS1 message as paho hands it over.
type benchMessage struct {
	topic   string
	payload []byte
	acked   *atomic.Uint64
}

func (m *benchMessage) Duplicate() bool   { return false }
func (m *benchMessage) Qos() byte         { return 1 }
func (m *benchMessage) Retained() bool    { return false }
func (m *benchMessage) Topic() string     { return m.topic }
func (m *benchMessage) MessageID() uint16 { return 1 }
func (m *benchMessage) Payload() []byte   { return m.payload }
func (m *benchMessage) Ack()              { m.acked.Add(1) }

func benchCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkHandleCommit is the durable-ingest path without the network:
// paho's handler (classify, hand over), the committer's group commit to a
// real Bronze file and the acknowledgement. One op is one message. Under
// this unthrottled producer the groups are full (max_commit_records), so
// the per-commit cost is spread thinly; ns/op includes fdatasync and is
// noisy, allocs and bytes are the stable figures.
func BenchmarkHandleCommit(b *testing.B) { benchHandleCommit(b, 5*time.Millisecond, 0) }

// BenchmarkHandleCommitPaced feeds 20,000 messages a second, about the
// load rig's rate, in bursts of 20 a millisecond, so the commit interval
// decides the group size: it shows what a longer linger saves per message
// (CPU) and what it costs (ack latency, about interval + commit).
func BenchmarkHandleCommitPaced(b *testing.B) {
	for _, iv := range []time.Duration{2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond} {
		b.Run(fmt.Sprintf("interval=%s", iv), func(b *testing.B) { benchHandleCommit(b, iv, 20) })
	}
}

// benchHandleCommit runs b.N messages through, perMilli a millisecond (0:
// as fast as the committer takes them).
func benchHandleCommit(b *testing.B, interval time.Duration, perMilli int) {
	bz, err := buffer.Open(filepath.Join(b.TempDir(), "bronze.db"), buffer.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer bz.Close()
	cfg := testConfig(b, "tcp://127.0.0.1:1", "bench", nil)
	cfg.MaxCommitRecords = 1000
	cfg.CommitInterval = interval
	in, err := New(bz, cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { in.com.run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	src := &pahoSource{in: in}

	var acked atomic.Uint64
	msgs := make([]benchMessage, 10_000)
	for i := range msgs {
		msgs[i] = benchMessage{topic: fmt.Sprintf("sensors/dev-%05d/telemetry", i),
			payload: fmt.Appendf(nil, `{"id":"%08x","ts":%d,"temperature":%.2f,"humidity":%.1f,"pressure":%.1f,"battery":%.2f,"rssi":%d}`,
				i, 1735689600000+int64(i), 20+float64(i%100)/10, 40+float64(i%50)/5, 1000+float64(i%30)/3, 3+float64(i%90)/100, -60-i%30),
			acked: &acked}
	}
	var mem runtime.MemStats
	runtime.ReadMemStats(&mem)
	cpu := benchCPU(b)
	commits := in.stats.Commits.Load()
	b.ReportAllocs()
	b.ResetTimer()
	var tick <-chan time.Time
	if perMilli > 0 {
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		tick = t.C
	}
	for i := range b.N {
		if tick != nil && i%perMilli == 0 {
			<-tick
		}
		src.onMessage(nil, &msgs[i%len(msgs)])
	}
	// The last group waits out its linger before it commits.
	mqtttest.WaitFor(b, 30*time.Second, "every message acknowledged", func() bool { return acked.Load() >= uint64(b.N) })
	b.StopTimer()
	after := mem
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.Mallocs-mem.Mallocs)/float64(b.N), "allocs/msg")
	b.ReportMetric(float64((benchCPU(b)-cpu).Nanoseconds())/float64(b.N), "cpu-ns/msg")
	n := max(in.stats.Commits.Load()-commits, 1)
	b.ReportMetric(float64(b.N)/float64(n), "msgs/commit")
	b.ReportMetric(float64(in.stats.CommitNanos.Load())/float64(in.stats.Commits.Load())/1e6, "ms/commit")
}
