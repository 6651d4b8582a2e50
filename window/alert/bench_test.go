package alert

import (
	"fmt"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/config"
)

// BenchmarkEmitted measures the engine's cost inside the window stage's
// transaction: one hour of 1-minute windows of 1000 devices (60,000
// aggregates), one transaction per minute, two rules matching every
// device, with a tenth of the devices flapping across the threshold and a
// rate limit holding most of their changes back.
func BenchmarkEmitted(b *testing.B) {
	for _, tc := range []struct {
		name      string
		aggTopic  string
		flapEvery int
	}{
		{"steady", "", 0},
		{"flapping", "", 10},
		{"flapping+aggregates_topic", "edgeagent/{gateway_id}/aggregates/{device}/{metric}", 10},
	} {
		b.Run(tc.name, func(b *testing.B) {
			const devices, minutes = 1000, 60
			hot := overheating()
			hot.Devices, hot.For, hot.MinInterval = "*", 1, config.Duration(5*time.Minute)
			cold := config.AlertRule{Name: "cold", Metric: "temperature", When: "min < 0", For: 3, Actions: []string{"uplink", "local"}}
			cfg := testConfig(hot, cold)
			cfg.LocalPublish.AggregatesTopic = tc.aggTopic
			names := make([]string, devices)
			for d := range names {
				names[d] = fmt.Sprintf("dev-%04d", d)
			}
			var total time.Duration
			var transitions uint64
			for b.Loop() {
				b.StopTimer()
				db := openDBOpts(b, "", true)
				e := newEngine(b, db, cfg)
				b.StartTimer()
				start := time.Now()
				for m := range minutes {
					err := db.Update(func(tx *bolt.Tx) error {
						for d, name := range names {
							v := 50.0
							if tc.flapEvery > 0 && d%tc.flapEvery == 0 && m%2 == 0 {
								v = 90
							}
							c := win(name, "temperature", m, v, 1)
							if err := e.Emitted(tx, &c.a, c.at); err != nil {
								return err
							}
						}
						return nil
					})
					if err != nil {
						b.Fatal(err)
					}
				}
				total += time.Since(start)
				st := e.Stats()
				transitions += st.Fired + st.Cleared
			}
			n := float64(b.N * devices * minutes)
			b.ReportMetric(n/total.Seconds(), "aggs/s")
			b.ReportMetric(float64(total.Nanoseconds())/n, "ns/agg")
			b.ReportMetric(float64(transitions)/float64(b.N), "transitions/op")
		})
	}
}
