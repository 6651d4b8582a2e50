package uplink

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/uplink/internal/synthetic"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// envDrainAggs sets the backlog size of BenchmarkDrain. The full 24-hour
// backlog of 1000 devices × 4 metrics × 1-minute windows is 5760000; the
// default is a tenth of an hour's worth of it so routine runs stay short.
const envDrainAggs = "EDGEAGENT_BENCH_DRAIN_AGGS"

func drainAggs(b *testing.B) int {
	n := 240_000
	if v := os.Getenv(envDrainAggs); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 0 {
			b.Fatalf("%s=%q: want a positive count", envDrainAggs, v)
		}
	}
	return n
}

// fillSynthetic appends n steady aggregates (1000 devices × 4 metrics) to
// the outbox, one minute's emission a transaction, as the window stage would.
func fillSynthetic(b testing.TB, db *bolt.DB, n int) {
	b.Helper()
	g := synthetic.New(testGateway, 1000, 1)
	perTx := 1000 * len(g.Metrics)
	var a wire.Aggregate
	for done := 0; done < n; {
		k := min(perTx, n-done)
		if err := db.Update(func(tx *bolt.Tx) error {
			for i := 0; i < k; i++ {
				g.Next(&a)
				raw, err := wire.EncodeAggregate(&a)
				if err != nil {
					return err
				}
				if _, err := outbox.Append(tx, outbox.KindAggregate, a.End+5_000, raw); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		done += k
	}
}

// BenchmarkDrain measures how fast a backlog drains to an in-process NATS
// JetStream server with file storage, at 500 aggregates a batch.
//
//   - after-outage: the backlog built up while the link was down, so the
//     uplink sealed (compressed) full batches as rows arrived, the way a
//     gateway spends a day-long outage; the clock runs from the link's return
//     until the last ack.
//   - from-rows: the rows are all in the outbox when the uplink starts (say,
//     after an upgrade from an agent that did not seal ahead), so sealing is
//     part of the drain.
//
// Set EDGEAGENT_BENCH_DRAIN_AGGS=5760000 for the full 24-hour backlog.
func BenchmarkDrain(b *testing.B) {
	n := drainAggs(b)
	for _, mode := range []string{"after-outage", "from-rows"} {
		b.Run(fmt.Sprintf("%s/aggs=%d", mode, n), func(b *testing.B) {
			var drain time.Duration
			var st Stats
			var sealedBytes uint64
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				srv := startNATS(b, "in-process", 0)
				proxy := newProxy(b, srv.Addr())
				db := openDB(b)
				cfg := natsConfig("nats://" + proxy.Addr())
				cfg.MaxBatchRecords = 500
				cfg.AckTimeout = 30 * time.Second
				var u *started
				if mode == "after-outage" {
					proxy.Cut()
					u = startUplink(b, db, cfg)
					fillSynthetic(b, db, n)
					u.Notify()
					waitFor(b, 30*time.Minute, "full batches sealed during the outage", func() bool {
						return u.Stats().SealedBatches == uint64(n/cfg.MaxBatchRecords)
					})
					sealedBytes = u.Stats().SealedBytes
				} else {
					fillSynthetic(b, db, n)
				}
				b.StartTimer()
				start := time.Now()
				if mode == "after-outage" {
					proxy.Restore()
				} else {
					u = startUplink(b, db, cfg)
				}
				waitFor(b, 30*time.Minute, "the backlog to drain", func() bool {
					s := u.Stats()
					return s.AggregatesSent == uint64(n) && s.SealedBatches == 0
				})
				drain = time.Since(start)
				b.StopTimer()
				st = u.Stats()
				if err := u.Close(); err != nil {
					b.Fatal(err)
				}
			}
			rate := float64(n) / drain.Seconds()
			b.ReportMetric(rate, "aggs/s")
			b.ReportMetric(5_760_000/rate, "s/24h-backlog")
			b.ReportMetric(float64(st.BytesSent)/float64(n), "wire-B/agg")
			b.ReportMetric(float64(st.BatchesSent), "batches")
			if sealedBytes > 0 {
				b.ReportMetric(float64(sealedBytes)/float64(n), "sealed-B/agg")
			}
		})
	}
}

// BenchmarkSealRound measures one sealing round without a link: plan 4000
// outbox rows (8 batches of 500) in a read transaction, build the batches
// (sort, frame, compress), and apply them in a write transaction. Filling
// the outbox and removing the sealed batches are not timed.
func BenchmarkSealRound(b *testing.B) {
	const batches, per = 8, 500
	db := openDB(b)
	cfg := natsConfig("nats://127.0.0.1:1")
	cfg.Gateway = testGateway
	cfg.Logger = testLogger()
	cfg.MaxBatchRecords = per
	u, err := New(db, cfg)
	if err != nil {
		b.Fatal(err)
	}
	g := synthetic.New(testGateway, 1000, 1)
	rows := make([][]byte, batches*per)
	var a wire.Aggregate
	for i := range rows {
		g.Next(&a)
		if rows[i], err = wire.EncodeAggregate(&a); err != nil {
			b.Fatal(err)
		}
	}
	var from uint64
	for b.Loop() {
		b.StopTimer()
		if err := db.Update(func(tx *bolt.Tx) error {
			for _, r := range rows {
				if _, err := outbox.Append(tx, outbox.KindAggregate, 1767225600000, r); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		p := planRound(b, u, from, sealPerRound, true)
		if err := p.build(u); err != nil {
			b.Fatal(err)
		}
		if err := db.Update(func(tx *bolt.Tx) error { return apply(tx, &p) }); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if len(p.batches) != batches {
			b.Fatalf("sealed %d batches, want %d", len(p.batches), batches)
		}
		from = p.next
		firsts := make([]uint64, len(p.batches))
		for i := range p.batches {
			firsts[i] = p.batches[i].first
		}
		if err := db.Update(func(tx *bolt.Tx) error { return deleteSealed(tx, firsts...) }); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batches*per), "ns/agg")
}
