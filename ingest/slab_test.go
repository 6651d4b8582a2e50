package ingest

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/edgeagent/edgeagent/buffer"
)

// Payloads held by records not yet released stay intact while later
// copies fill, empty and reuse chunks around them.
func TestSlabCopiesStayIntactUntilReleased(t *testing.T) {
	var s payloadSlab
	payload := func(i int) []byte {
		return fmt.Appendf(nil, `{"id":"m%d","v":%d,"pad":"%s"}`, i, i, bytes.Repeat([]byte{'x'}, i%300))
	}
	topic := func(i int) []byte { return fmt.Appendf(nil, "sensors/dev%05d/telemetry", i%997) }
	var held []pending
	var want []buffer.Record
	intact := func(when string) {
		t.Helper()
		for j := range held {
			if r := held[j].rec; r.Topic != want[j].Topic || !bytes.Equal(r.Payload, want[j].Payload) {
				t.Fatalf("message %d: topic %q payload %q %s, want %q %q", j, r.Topic, r.Payload, when, want[j].Topic, want[j].Payload)
			}
		}
	}
	for i := range 20_000 {
		srcTopic, src := topic(i), payload(i)
		gotTopic, got, c := s.copyMessage(srcTopic, src)
		// The connection's buffer is overwritten by its next read.
		clear(srcTopic)
		clear(src)
		held = append(held, pending{rec: buffer.Record{Kind: buffer.KindMessage, Topic: gotTopic, Payload: got}, chunk: c})
		want = append(want, buffer.Record{Topic: string(topic(i)), Payload: payload(i)})
		// Commit in batches of varying size, one in three left for later.
		if len(held) >= 100+i%400 {
			intact("before its release")
			cut := len(held) * 2 / 3
			s.release(held[:cut])
			for j := range cut {
				if held[j].chunk != nil {
					t.Fatalf("message %d: release left its chunk set", j)
				}
			}
			held = append([]pending(nil), held[cut:]...)
			want = append([]buffer.Record(nil), want[cut:]...)
		}
	}
	intact("at the end")
}

// In a steady stream, released chunks are used again: copying allocates
// nothing.
func TestSlabReusesReleasedChunks(t *testing.T) {
	var s payloadSlab
	topic, msg := []byte("sensors/dev00042/telemetry"), bytes.Repeat([]byte("0123456789"), 12)
	batch := make([]pending, 0, 600)
	commit := func() {
		for range 600 {
			tp, p, c := s.copyMessage(topic, msg)
			batch = append(batch, pending{rec: buffer.Record{Kind: buffer.KindMessage, Topic: tp, Payload: p}, chunk: c})
		}
		s.release(batch)
		batch = batch[:0]
	}
	commit() // the first chunks
	if allocs := testing.AllocsPerRun(50, commit); allocs != 0 {
		t.Fatalf("%v allocations a batch of 600 copies after warm-up, want 0", allocs)
	}
}

// Empty and large payloads get copies of their own, outside the chunks.
func TestSlabLeavesLargePayloadsOut(t *testing.T) {
	var s payloadSlab
	topic := []byte("a/b")
	large := bytes.Repeat([]byte{'y'}, slabMaxPayload+1-len(topic))
	tp, got, c := s.copyMessage(topic, large)
	if c != nil || tp != "a/b" || !bytes.Equal(got, large) || &got[0] == &large[0] {
		t.Fatalf("topic and payload of %d bytes: chunk %v, want copies of their own", len(topic)+len(large), c)
	}
	if tp, got, c := s.copyMessage(topic, nil); c != nil || tp != "a/b" || len(got) != 0 {
		t.Fatalf("empty payload: topic %q payload %q in chunk %v, want copies of their own", tp, got, c)
	}
	if s.cur != nil {
		t.Fatal("a chunk was taken for payloads kept out of chunks")
	}
}
