package wire

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"slices"
	"sort"
	"sync"
)

// SortAggregates puts encoded aggregates (one CBOR map each, as
// EncodeAggregate makes them) in the order a batch carries them: by metric,
// device, window start and rev, then by their bytes. Rows of one metric sit
// together, where their similar values and keys compress best (measured: 4 to
// 5 % fewer bytes on the wire than emission order). The order depends on the
// rows only, never on the order they came in, so a batch sealed again from
// the same rows is byte-identical. Receivers must not rely on the order
// within a batch (docs/wire-format.md); rows that are not aggregate maps go
// last, by their bytes.
func SortAggregates(rows [][]byte) {
	if len(rows) < 2 {
		return
	}
	kp := sortKeyPool.Get().(*[]sortKey)
	keyed := slices.Grow((*kp)[:0], len(rows))
	for _, r := range rows {
		keyed = append(keyed, aggregateSortKey(r))
	}
	// sort.Sort, not slices.SortFunc: a generic sort of a struct type
	// instantiates about 10 KB of code, and the arm64 binary has little
	// room under its budget (docs/performance.md, Binary size).
	sort.Sort(byKey(keyed))
	for i := range keyed {
		rows[i] = keyed[i].row
	}
	// The keys point into the rows: drop them before pooling the slice,
	// so the pool does not keep the rows alive.
	clear(keyed)
	*kp = keyed[:0]
	sortKeyPool.Put(kp)
}

// sortKeyPool keeps SortAggregates' key slices (96 bytes a row) between
// batches.
var sortKeyPool = sync.Pool{New: func() any { return new([]sortKey) }}

// sortKey is what SortAggregates orders a row by.
type sortKey struct {
	metric, device []byte
	start          int64
	rev            uint64
	ok             bool // the row is a map with text metric and device
	row            []byte
}

// byKey orders sort keys with compareSortKeys.
type byKey []sortKey

func (k byKey) Len() int           { return len(k) }
func (k byKey) Less(i, j int) bool { return compareSortKeys(k[i], k[j]) < 0 }
func (k byKey) Swap(i, j int)      { k[i], k[j] = k[j], k[i] }

func compareSortKeys(a, b sortKey) int {
	if a.ok != b.ok {
		if a.ok {
			return -1
		}
		return 1
	}
	if a.ok {
		if c := cmp.Or(bytes.Compare(a.metric, b.metric), bytes.Compare(a.device, b.device),
			cmp.Compare(a.start, b.start), cmp.Compare(a.rev, b.rev)); c != 0 {
			return c
		}
	}
	return bytes.Compare(a.row, b.row)
}

// aggregateSortKey reads metric, device, start and rev from an encoded
// aggregate without decoding the rest, whatever the order of its keys.
func aggregateSortKey(row []byte) sortKey {
	k := sortKey{row: row}
	major, pairs, n, ok := readHead(row)
	if !ok || major != majorMap {
		return k
	}
	b := row[n:]
	var haveMetric, haveDevice bool
	for ; pairs > 0; pairs-- {
		major, size, n, ok := readHead(b)
		if !ok || major != majorText || uint64(len(b)-n) < size {
			return k
		}
		name := b[n : n+int(size)]
		b = b[n+int(size):]
		vmajor, arg, vn, ok := readHead(b)
		if !ok {
			return k
		}
		switch string(name) {
		case "metric", "device":
			if vmajor != majorText || uint64(len(b)-vn) < arg {
				return k
			}
			if name[0] == 'm' {
				k.metric, haveMetric = b[vn:vn+int(arg)], true
			} else {
				k.device, haveDevice = b[vn:vn+int(arg)], true
			}
		case "start":
			switch {
			case vmajor == majorUint && arg <= 1<<63-1:
				k.start = int64(arg)
			case vmajor == majorNegInt && arg <= 1<<63-1:
				k.start = -1 - int64(arg)
			}
		case "rev":
			if vmajor == majorUint {
				k.rev = arg
			}
		}
		skip, ok := itemSize(b, 0)
		if !ok {
			return k
		}
		b = b[skip:]
	}
	k.ok = haveMetric && haveDevice
	return k
}

const majorNegInt = 1

// readHead reads the head of the CBOR data item at b: its major type, its
// argument (a length, a count or a value) and the head's length. Indefinite
// lengths and reserved values are not ok.
func readHead(b []byte) (major byte, arg uint64, n int, ok bool) {
	if len(b) == 0 {
		return 0, 0, 0, false
	}
	major, ai := b[0]>>5, b[0]&0x1f
	switch {
	case ai < 24:
		return major, uint64(ai), 1, true
	case ai == 24 && len(b) >= 2:
		return major, uint64(b[1]), 2, true
	case ai == 25 && len(b) >= 3:
		return major, uint64(binary.BigEndian.Uint16(b[1:])), 3, true
	case ai == 26 && len(b) >= 5:
		return major, uint64(binary.BigEndian.Uint32(b[1:])), 5, true
	case ai == 27 && len(b) >= 9:
		return major, binary.BigEndian.Uint64(b[1:]), 9, true
	}
	return 0, 0, 0, false
}

// itemSize is the length of the data item at the start of b.
func itemSize(b []byte, depth int) (int, bool) {
	major, arg, n, ok := readHead(b)
	if !ok || depth > 16 {
		return 0, false
	}
	switch major {
	case 2, majorText:
		if uint64(len(b)-n) < arg {
			return 0, false
		}
		return n + int(arg), true
	case majorArray, majorMap:
		if arg > uint64(len(b)) { // every item takes a byte at least
			return 0, false
		}
		items := arg
		if major == majorMap {
			items *= 2
		}
		for ; items > 0; items-- {
			m, ok := itemSize(b[n:], depth+1)
			if !ok {
				return 0, false
			}
			n += m
		}
		return n, true
	case 6: // a tag: its head, then the tagged item
		m, ok := itemSize(b[n:], depth+1)
		return n + m, ok
	}
	return n, true // integers and simple values / floats: the head is all
}
