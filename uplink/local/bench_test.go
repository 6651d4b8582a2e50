package local

import (
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer/outbox"
)

// BenchmarkDrain publishes a backlog of 10,000 local rows (a 1-minute
// aggregates republish of a large fleet) through the embedded-style inline
// publish of a real mochi broker with one subscriber, deleting them in
// rounds of BatchRows.
func BenchmarkDrain(b *testing.B) {
	const rows = 10_000
	srv, url := startInlineMochi(b)
	sub := subscribe(b, url, "bench-sub", "edgeagent/#")
	var total time.Duration
	for b.Loop() {
		b.StopTimer()
		db := openDB(b, "")
		appendLocal(b, db, numbered("edgeagent/gw1/aggregates", 0, rows))
		p, err := New(db, Config{Gateway: "gw1", Sink: SinkFunc(srv.Publish), Logger: testLogger()})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		errc := make(chan error, 1)
		go func() { errc <- p.Run(b.Context()) }()
		for p.Stats().Published < rows {
			time.Sleep(time.Millisecond) // polling the drain's progress
		}
		total += time.Since(start)
		p.Close()
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*rows)/total.Seconds(), "rows/s")
	_ = sub
}

// BenchmarkNotifyLatency is the time from the commit of one local row (an
// alert the window stage just queued) to its publish on the broker, with
// Notify called as the engine's OnLocal does; the poll interval is an hour
// so only Notify can wake the publisher.
func BenchmarkNotifyLatency(b *testing.B) {
	srv, _ := startInlineMochi(b)
	got := make(chan struct{}, 1)
	sink := SinkFunc(func(topic string, payload []byte, retain bool, qos byte) error {
		err := srv.Publish(topic, payload, retain, qos)
		got <- struct{}{}
		return err
	})
	db := openDB(b, "")
	p, err := New(db, Config{Gateway: "gw1", Sink: sink, Logger: testLogger(), PollInterval: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- p.Run(b.Context()) }()
	defer func() {
		p.Close()
		if err := <-errc; err != nil {
			b.Error(err)
		}
	}()
	msg := Encode(Message{Topic: "edgeagent/gw1/alerts/press-1", Payload: []byte(`{"state":"fired"}`), QoS: 1})
	var total time.Duration
	for b.Loop() {
		start := time.Now()
		err := db.Update(func(tx *bolt.Tx) error {
			_, err := outbox.Append(tx, outbox.KindLocal, 0, msg)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		p.Notify()
		<-got
		total += time.Since(start)
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/alert")
}
