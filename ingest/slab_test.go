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
	var held []pending
	var want [][]byte
	for i := range 20_000 {
		src := payload(i)
		got, c := s.copy(src)
		clear(src) // the connection's buffer is overwritten by its next read
		held = append(held, pending{rec: recWithPayload(got), chunk: c})
		want = append(want, payload(i))
		// Commit in batches of varying size, one in three left for later.
		if len(held) >= 100+i%400 {
			for j := range held {
				if !bytes.Equal(held[j].rec.Payload, want[j]) {
					t.Fatalf("message %d: payload %q before its release, want %q", j, held[j].rec.Payload, want[j])
				}
			}
			cut := len(held) * 2 / 3
			s.release(held[:cut])
			for j := range cut {
				if held[j].chunk != nil {
					t.Fatalf("message %d: release left its chunk set", j)
				}
			}
			held = append([]pending(nil), held[cut:]...)
			want = append([][]byte(nil), want[cut:]...)
		}
	}
	for j := range held {
		if !bytes.Equal(held[j].rec.Payload, want[j]) {
			t.Fatalf("message %d: payload %q at the end, want %q", j, held[j].rec.Payload, want[j])
		}
	}
}

func recWithPayload(p []byte) buffer.Record {
	return buffer.Record{Kind: buffer.KindMessage, Payload: p}
}

// In a steady stream, released chunks are used again: copying allocates
// nothing.
func TestSlabReusesReleasedChunks(t *testing.T) {
	var s payloadSlab
	msg := bytes.Repeat([]byte("0123456789"), 12)
	batch := make([]pending, 0, 600)
	commit := func() {
		for range 600 {
			p, c := s.copy(msg)
			batch = append(batch, pending{rec: recWithPayload(p), chunk: c})
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
	large := bytes.Repeat([]byte{'y'}, slabMaxPayload+1)
	got, c := s.copy(large)
	if c != nil || !bytes.Equal(got, large) || &got[0] == &large[0] {
		t.Fatalf("payload of %d bytes: chunk %v, want its own copy", len(large), c)
	}
	if got, c := s.copy(nil); c != nil || len(got) != 0 {
		t.Fatalf("empty payload: %q in chunk %v, want an empty copy of its own", got, c)
	}
	if s.cur != nil {
		t.Fatal("a chunk was taken for payloads kept out of chunks")
	}
}
