package buffer

import (
	"fmt"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// benchRecords returns n message records shaped like the load rig's: one
// topic per device out of 10,000, JSON payloads of about 150 bytes.
func benchRecords(n int) []Record {
	recs := make([]Record, n)
	at := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	for i := range recs {
		dev := i % 10_000
		payload := fmt.Sprintf(`{"id":"%08x","ts":%d,"temperature":%.2f,"humidity":%.1f,"pressure":%.1f,"battery":%.2f,"rssi":%d}`,
			i, at/1e6+int64(i), 20+float64(i%100)/10, 40+float64(i%50)/5, 1000+float64(i%30)/3, 3+float64(i%90)/100, -60-i%30)
		recs[i] = Record{Kind: KindMessage, ReceivedAt: at + int64(i)*1000, Topic: fmt.Sprintf("sensors/dev-%05d/telemetry", dev),
			QoS: 1, Payload: []byte(payload)}
	}
	return recs
}

// openTemp opens a Bronze log in a temporary directory, closed at the
// end of the test or benchmark.
func openTemp(tb testing.TB) *Bronze {
	tb.Helper()
	bz, err := Open(filepath.Join(tb.TempDir(), "bronze.db"), Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { bz.Close() })
	return bz
}

// meter measures a benchmark per message: allocations and bytes (allocs/op
// truncates to an integer, and an op may be a whole group), wall time, and
// the process's CPU time (user + system, GC included), which unlike wall
// time does not count waiting for fdatasync.
type meter struct {
	mem runtime.MemStats
	cpu time.Duration
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startMeter(b *testing.B) *meter {
	m := &meter{}
	runtime.ReadMemStats(&m.mem)
	m.cpu = cpuTime(b)
	return m
}

func (m *meter) report(b *testing.B, msgs int) {
	cpu := cpuTime(b) - m.cpu
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	n := float64(msgs)
	b.ReportMetric(float64(after.Mallocs-m.mem.Mallocs)/n, "allocs/msg")
	b.ReportMetric(float64(after.TotalAlloc-m.mem.TotalAlloc)/n, "B/msg")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/msg")
	b.ReportMetric(float64(cpu.Nanoseconds())/n, "cpu-ns/msg")
}

// BenchmarkAppendRead is the durable-ingest path in Bronze: one op appends a
// group (one transaction, fdatasync) the way the committer does, reusing its
// record slice, and reads the group back from the tail the way the window
// stage does. ns/op is mostly the disk's fdatasync and is noisy; allocs and
// bytes are the stable figures.
func BenchmarkAppendRead(b *testing.B) {
	src := benchRecords(10_000)
	for _, group := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("group=%d", group), func(b *testing.B) {
			bz := openTemp(b)
			recs := make([]Record, 0, group)
			from := uint64(1)
			j := 0
			b.ReportAllocs()
			m := startMeter(b)
			for b.Loop() {
				recs = recs[:0]
				for range group {
					recs = append(recs, src[j])
					j = (j + 1) % len(src)
				}
				if err := bz.Append(recs); err != nil {
					b.Fatal(err)
				}
				got, err := bz.Read(from, 10_000)
				if err != nil {
					b.Fatal(err)
				}
				if len(got) != group {
					b.Fatalf("read %d records from %d, appended %d", len(got), from, group)
				}
				from += uint64(group)
			}
			m.report(b, b.N*group)
		})
	}
}

// BenchmarkReadTail is the window stage's read alone: one op reads 1,000
// records the tail holds.
func BenchmarkReadTail(b *testing.B) {
	bz := openTemp(b)
	src := benchRecords(2_000) // within the 512 KiB tail
	for i := 0; i < len(src); i += 1000 {
		if err := bz.Append(src[i : i+1000]); err != nil {
			b.Fatal(err)
		}
	}
	from := bz.LastSeq() - 1_999
	if bz.tail[0].first > from {
		b.Fatalf("the tail starts at %d, not at %d", bz.tail[0].first, from)
	}
	b.ReportAllocs()
	m := startMeter(b)
	i := 0
	for b.Loop() {
		got, err := bz.Read(from+uint64(i%2)*1000, 1000)
		if err != nil || len(got) != 1000 {
			b.Fatalf("read %d records: %v", len(got), err)
		}
		i++
	}
	m.report(b, b.N*1000)
}
