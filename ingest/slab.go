package ingest

import (
	"bytes"
	"sync"
)

// payloadSlab copies the payloads of PUBLISH packets out of a connection's
// read buffer, which the next read overwrites, into chunks that are used
// again once every record copied into them has committed. A copy of its
// own per message was the largest single source of garbage after Bronze's
// arena: in load mode (10,000 devices, about 30,000 messages a second) 8 %
// of what the agent allocated, and with a tight heap goal every allocated
// byte brings the next collection nearer. Bronze encodes the records into
// its own arena, so nothing reads a payload after its commit; the
// committer releases the batch's chunks then (payloadSlab.release).
//
// A record that is never released (ingest stopped before its commit) only
// keeps its chunk from being used again: the collector frees it.
type payloadSlab struct {
	mu    sync.Mutex
	cur   *slabChunk   // being filled
	spare []*slabChunk // emptied, for the next chunk
}

// slabChunk holds payloads back to back; refs counts the records that
// still hold one of them.
type slabChunk struct {
	buf  []byte
	refs int
}

const (
	// slabChunkBytes is a chunk's size: about 600 of the load's messages,
	// a group commit's worth.
	slabChunkBytes = 64 << 10
	// slabMaxPayload is the largest payload copied into a chunk; larger
	// ones get a copy of their own, so one large message does not pin a
	// chunk nor waste the rest of one.
	slabMaxPayload = slabChunkBytes / 16
	// slabSpare is how many emptied chunks wait for reuse. Messages in
	// flight (queued, in the batch committing, in the next one filling)
	// spread over a few chunks; past that they go to the collector.
	slabSpare = 2
)

// copy returns a copy of p that stays valid until release is called for
// the chunk returned with it (nil when p got a copy of its own).
func (s *payloadSlab) copy(p []byte) ([]byte, *slabChunk) {
	if len(p) == 0 || len(p) > slabMaxPayload {
		return bytes.Clone(p), nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.cur
	if c == nil || len(c.buf)+len(p) > cap(c.buf) {
		if c != nil && c.refs == 0 {
			s.recycleLocked(c)
		}
		c = s.takeLocked()
		s.cur = c
	}
	n := len(c.buf)
	c.buf = append(c.buf, p...)
	c.refs++
	return c.buf[n:len(c.buf):len(c.buf)], c
}

// release drops the batch's holds on their chunks (each record's once: it
// clears the record's chunk). A chunk nothing holds is emptied: the one
// being filled starts over, another goes to the spares.
func (s *payloadSlab) release(batch []pending) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range batch {
		c := batch[i].chunk
		if c == nil {
			continue
		}
		batch[i].chunk = nil
		c.refs--
		if c.refs > 0 {
			continue
		}
		if c == s.cur {
			c.buf = c.buf[:0]
		} else {
			s.recycleLocked(c)
		}
	}
}

func (s *payloadSlab) takeLocked() *slabChunk {
	if n := len(s.spare); n > 0 {
		c := s.spare[n-1]
		s.spare[n-1] = nil
		s.spare = s.spare[:n-1]
		return c
	}
	return &slabChunk{buf: make([]byte, 0, slabChunkBytes)}
}

func (s *payloadSlab) recycleLocked(c *slabChunk) {
	c.buf = c.buf[:0]
	if len(s.spare) < slabSpare {
		s.spare = append(s.spare, c)
	}
}
