package ingest

import (
	"bytes"
	"sync"
	"unsafe"
)

// payloadSlab copies the payloads (and topics) of PUBLISH packets out of
// a connection's read buffer, which the next read overwrites, into chunks
// that are used again once every record copied into them has committed.
// A copy of its own per message was the largest single source of garbage
// after Bronze's arena: in load mode (10,000 devices, about 30,000 messages
// a second) 8 % of what the agent allocated, and with a tight heap goal
// every allocated byte brings the next collection nearer. Bronze encodes
// the records into its own arena, so nothing reads a payload after its
// commit; the committer releases the batch's chunks then
// (payloadSlab.release).
//
// A record that is never released (ingest stopped before its commit) only
// keeps its chunk from being used again: the collector frees it.
type payloadSlab struct {
	mu     sync.Mutex
	cur    *slabChunk            // being filled
	spare  [slabSpare]*slabChunk // emptied, for the next chunk
	nspare int
	_      [0]func() // not comparable: no equality function in the binary
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

// copyMessage returns copies of a PUBLISH packet's topic and payload that
// stay valid until release is called for the chunk returned with them (nil
// when they got copies of their own). The topic shares the payload's
// chunk: its own string per message was the next largest garbage, 3 % of
// all in load mode, and nothing keeps a record's topic past its commit
// either (Bronze encodes it into its arena).
func (s *payloadSlab) copyMessage(topic, p []byte) (string, []byte, *slabChunk) {
	n := len(topic) + len(p)
	if len(p) == 0 || n > slabMaxPayload {
		return string(topic), bytes.Clone(p), nil
	}
	s.mu.Lock()
	c := s.cur
	if c == nil || len(c.buf)+n > cap(c.buf) {
		if c != nil && c.refs == 0 {
			s.recycle(c)
		}
		if s.nspare > 0 {
			s.nspare--
			c = s.spare[s.nspare]
		} else {
			c = &slabChunk{buf: make([]byte, 0, slabChunkBytes)}
		}
		s.cur = c
	}
	at := len(c.buf)
	c.buf = c.buf[:at+n] // fits: checked above
	m := c.buf[at : at+n : at+n]
	copy(m, topic)
	copy(m[len(topic):], p)
	c.refs++
	s.mu.Unlock()
	return unsafe.String(unsafe.SliceData(m), len(topic)), m[len(topic):], c
}

// release drops the batch's holds on their chunks (each record's once: it
// clears the record's chunk). A chunk nothing holds is emptied: the one
// being filled starts over, another goes to the spares.
func (s *payloadSlab) release(batch []pending) {
	s.mu.Lock()
	for i := range batch {
		c := batch[i].chunk
		batch[i].chunk = nil
		if c == nil {
			continue
		}
		if c.refs--; c.refs == 0 {
			if c == s.cur {
				c.buf = c.buf[:0]
			} else {
				s.recycle(c)
			}
		}
	}
	s.mu.Unlock()
}

// recycle empties c, which nothing holds, and keeps it for reuse if there
// is room among the spares; s.mu is held.
func (s *payloadSlab) recycle(c *slabChunk) {
	c.buf = c.buf[:0]
	if s.nspare < slabSpare {
		s.spare[s.nspare] = c
		s.nspare++
	}
}
