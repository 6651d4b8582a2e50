package window

import "hash/maphash"

// devTable is the engine's devices by name: an open-addressing table of
// device pointers (linear probing, at most three quarters full, deletion
// by moving the entries after back). A map[string]*device held 24 bytes
// a slot, the name's header again beside the device's own, every one
// scanned by the collector and given headroom by the heap pacer
// (internal/heapgoal): about 0.4 MB at 10,000 devices, against 128 KB of
// slots here. Names hash with a seed of the process's own, so a publisher
// choosing device names cannot make them collide.
type devTable struct {
	slots []*device // a power of two of them, or none
	n     int
	seed  maphash.Seed
}

func (t *devTable) len() int { return t.n }

func (t *devTable) home(name string) int {
	return int(maphash.String(t.seed, name) & uint64(len(t.slots)-1))
}

// get returns the device of name, or nil.
func (t *devTable) get(name string) *device {
	if t.n == 0 {
		return nil
	}
	return t.slots[t.find(name)]
}

// find returns the slot holding name's device or, if none does, the empty
// slot that ends its probe; the table must have slots.
func (t *devTable) find(name string) int {
	mask := len(t.slots) - 1
	i := t.home(name)
	for t.slots[i] != nil && t.slots[i].name != name {
		i = (i + 1) & mask
	}
	return i
}

// put adds d, whose name the table must not hold.
func (t *devTable) put(d *device) {
	if 4*(t.n+1) > 3*len(t.slots) {
		t.resize(max(16, 2*len(t.slots)))
	}
	t.insert(d)
	t.n++
}

// insert places d in the empty slot that ends its name's probe.
func (t *devTable) insert(d *device) { t.slots[t.find(d.name)] = d }

func (t *devTable) resize(n int) {
	if t.slots == nil {
		t.seed = maphash.MakeSeed()
	}
	old := t.slots
	t.slots = make([]*device, n)
	for _, d := range old {
		if d != nil {
			t.insert(d)
		}
	}
}

// remove deletes the device of name, if the table holds it, and halves
// the table once it is under an eighth full (expired devices leave).
func (t *devTable) remove(name string) {
	if t.n == 0 {
		return
	}
	i := t.find(name)
	if t.slots[i] == nil {
		return
	}
	mask := len(t.slots) - 1
	t.slots[i] = nil
	t.n--
	// An entry after the hole may move into it unless its home lies
	// between the two: a lookup from its home must not meet the hole.
	for j := (i + 1) & mask; t.slots[j] != nil; j = (j + 1) & mask {
		if (j-t.home(t.slots[j].name))&mask >= (j-i)&mask {
			t.slots[i], t.slots[j] = t.slots[j], nil
			i = j
		}
	}
	if len(t.slots) > 16 && 8*t.n < len(t.slots) {
		t.resize(len(t.slots) / 2)
	}
}
