package window

import "encoding/binary"

// parkArena holds the encodings of the windows parked since the last
// checkpoint (see engine.park). They go into chunks that never move, and
// each series links its own entries, newest first, from series.parked:
// there is no slice per series, so tens of thousands of series carry no
// growth slack (a slice each held a third more than its entries), and a
// series costs four bytes for them.
//
// An entry is its window's start (8 bytes), the series' previous entry (4,
// a parkRef), its length (1, with parkDropped once read back or deleted)
// and the window's encoding (appendWindow, at most maxWindowBytes).
type parkArena struct {
	chunks [][]byte
}

// parkRef locates an entry: its chunk plus one in the high 16 bits, its
// offset in the low 16. Zero is no entry.
type parkRef uint32

const (
	parkChunkBytes = 1 << 16
	parkHeader     = 13
	parkDropped    = 0x80
)

// full says whether the arena has no room for a chunk more: refs name
// 65,535 chunks (4 GiB, where a checkpoint comes at maxDeltaRows changes).
func (a *parkArena) full() bool { return len(a.chunks) == 1<<16-1 }

// add appends an entry and returns its ref; the arena must not be full.
func (a *parkArena) add(start int64, prev parkRef, enc []byte) parkRef {
	n := len(a.chunks)
	if n == 0 || len(a.chunks[n-1])+parkHeader+len(enc) > parkChunkBytes {
		a.chunks = append(a.chunks, make([]byte, 0, parkChunkBytes))
		n++
	}
	c := a.chunks[n-1]
	ref := parkRef(n<<16 | len(c))
	c = binary.LittleEndian.AppendUint64(c, uint64(start))
	c = binary.LittleEndian.AppendUint32(c, uint32(prev))
	c = append(c, byte(len(enc)))
	a.chunks[n-1] = append(c, enc...)
	return ref
}

// entry returns the bytes of the entry at ref, from its header on.
func (a *parkArena) entry(ref parkRef) []byte {
	return a.chunks[int(ref>>16)-1][ref&0xffff:]
}

// find returns the encoding and ref of the live entry of start in the
// list that begins at head, or a zero ref.
func (a *parkArena) find(head parkRef, start int64) ([]byte, parkRef) {
	for r := head; r != 0; {
		b := a.entry(r)
		if b[12]&parkDropped == 0 && int64(binary.LittleEndian.Uint64(b)) == start {
			return b[parkHeader : parkHeader+int(b[12])], r
		}
		r = parkRef(binary.LittleEndian.Uint32(b[8:]))
	}
	return nil, 0
}

// encoding returns the encoding of the entry at ref.
func (a *parkArena) encoding(ref parkRef) []byte {
	b := a.entry(ref)
	return b[parkHeader : parkHeader+int(b[12]&^parkDropped)]
}

// drop marks the live entry of start in the list at head as gone; it
// reports whether there was one.
func (a *parkArena) drop(head parkRef, start int64) bool {
	_, r := a.find(head, start)
	if r != 0 {
		a.dropAt(r)
	}
	return r != 0
}

// dropAt marks the entry at ref, which find returned, as gone.
func (a *parkArena) dropAt(ref parkRef) { a.entry(ref)[12] |= parkDropped }

// each calls fn with the start and ref of each live entry in the list at
// head.
func (a *parkArena) each(head parkRef, fn func(start int64, ref parkRef)) {
	for r := head; r != 0; {
		b := a.entry(r)
		if b[12]&parkDropped == 0 {
			fn(int64(binary.LittleEndian.Uint64(b)), r)
		}
		r = parkRef(binary.LittleEndian.Uint32(b[8:]))
	}
}

// reset empties the arena once a checkpoint wrote its entries, keeping
// one chunk for the next: what a large catch-up parked is not kept.
func (a *parkArena) reset() {
	if len(a.chunks) == 0 {
		return
	}
	clear(a.chunks[1:])
	a.chunks = a.chunks[:1]
	a.chunks[0] = a.chunks[0][:0]
}
