package buffer

import "bytes"

// readCopies are the arenas ReadInto copies the file's chunks into when
// the reader releases what it read (ReleaseThrough): a reader behind the
// in-memory tail (the window stage catching up, or after a checkpoint held
// it back) reads every record from the file, and each chunk was copied
// into a new 2 KiB allocation: in load mode 6 % of all the agent
// allocated, and most of what a catch-up allocates. An arena goes back
// into use once every record returned from it is released, as the tail's
// arenas do (arenaRecycler).
type readCopies struct {
	spent []spentCopy // bounded by maxReadSpent; the oldest is dropped
	spare [][]byte    // bounded by maxReadSpare
}

// spentCopy is an arena records were returned from, up to sequence last.
type spentCopy struct {
	arena []byte
	last  uint64
}

const (
	// readCopyBytes is one arena's size: a read slice of the window stage
	// (1,024 records of about 110 bytes in load mode) fits in one. A
	// chunk larger than this (a large message's) is copied on its own.
	readCopyBytes = 128 << 10
	// maxReadSpent bounds the arenas waiting for their release: the stage
	// releases after each slice it read, so one or two wait at a time.
	maxReadSpent = 4
	// maxReadSpare bounds the arenas kept for reuse (256 KiB). They go
	// when a read is served from the tail again, so a stage that caught
	// up holds none.
	maxReadSpare = 2
)

// release makes the spent arenas whose records all are at or below seq
// spare.
func (c *readCopies) release(seq uint64) {
	kept := c.spent[:0]
	for _, s := range c.spent {
		if s.last > seq {
			kept = append(kept, s)
			continue
		}
		if len(c.spare) < maxReadSpare {
			c.spare = append(c.spare, s.arena[:0])
		}
	}
	clear(c.spent[len(kept):])
	c.spent = kept
}

// dropSpare lets the spare arenas go: reads are served from the tail.
func (c *readCopies) dropSpare() {
	clear(c.spare)
	c.spare = c.spare[:0]
}

// chunkCopier copies the chunks of one ReadInto. Without a reader that
// releases, every chunk gets a copy of its own, valid for as long as its
// records are kept (Read's promise).
type chunkCopier struct {
	b        *Bronze
	recycled bool   // the reader releases: copy into readCopies' arenas
	arena    []byte // the arena being filled
	inArena  bool   // the chunk being read was copied into arena
	used     bool   // a record was returned from arena
	last     uint64 // the last such record
}

func (b *Bronze) newChunkCopier() *chunkCopier {
	b.tailMu.Lock()
	defer b.tailMu.Unlock()
	return &chunkCopier{b: b, recycled: b.recycle.on}
}

// copy returns a copy of the chunk v whose records the reader may keep.
func (c *chunkCopier) copy(v []byte) []byte {
	c.inArena = c.recycled && len(v) <= readCopyBytes
	if !c.inArena {
		return bytes.Clone(v)
	}
	if cap(c.arena)-len(c.arena) < len(v) {
		c.retire()
		c.arena = c.take()
	}
	start := len(c.arena)
	c.arena = append(c.arena, v...)
	return c.arena[start:len(c.arena):len(c.arena)]
}

// returned notes that the record seq, of the chunk copied last, was
// returned to the reader.
func (c *chunkCopier) returned(seq uint64) {
	if c.inArena {
		c.used, c.last = true, seq
	}
}

// done hands the arena being filled back at the end of the read.
func (c *chunkCopier) done() { c.retire() }

// take returns a spare arena, or a new one.
func (c *chunkCopier) take() []byte {
	c.b.tailMu.Lock()
	defer c.b.tailMu.Unlock()
	spare := &c.b.copies.spare
	if n := len(*spare); n > 0 {
		a := (*spare)[n-1]
		(*spare)[n-1] = nil
		*spare = (*spare)[:n-1]
		return a
	}
	return make([]byte, 0, readCopyBytes)
}

// retire hands the arena to readCopies: spent until its records are
// released, or spare at once when none was returned from it.
func (c *chunkCopier) retire() {
	if c.arena == nil {
		return
	}
	c.b.tailMu.Lock()
	defer c.b.tailMu.Unlock()
	cp := &c.b.copies
	switch {
	case c.used:
		cp.spent = appendBounded(cp.spent, spentCopy{arena: c.arena, last: c.last}, maxReadSpent)
	case len(cp.spare) < maxReadSpare:
		cp.spare = append(cp.spare, c.arena[:0])
	}
	c.arena, c.used, c.last = nil, false, 0
}
