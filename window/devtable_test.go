package window

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// all returns the table's devices, in slot order.
func (t *devTable) all() []*device {
	var ds []*device
	for _, d := range t.slots {
		if d != nil {
			ds = append(ds, d)
		}
	}
	return ds
}

// TestDevTableMatchesAMap puts and removes devices at random, against a
// map: growth, shrinking and the moves after a removal must leave every
// device findable from its home slot, and nothing else in the table.
func TestDevTableMatchesAMap(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		var tab devTable
		ref := map[string]*device{}
		names := 50 + rng.IntN(2000)
		for step := range 20_000 {
			name := fmt.Sprintf("dev-%d", rng.IntN(names))
			switch d := ref[name]; {
			case d == nil && rng.IntN(3) > 0:
				d = &device{name: name}
				tab.put(d)
				ref[name] = d
			case d != nil && rng.IntN(2) == 0:
				tab.remove(name)
				delete(ref, name)
			}
			if step%97 == 0 || step == 19_999 {
				if tab.len() != len(ref) || len(tab.all()) != len(ref) {
					t.Fatalf("seed %d step %d: the table counts %d and holds %d devices, want %d", seed, step, tab.len(), len(tab.all()), len(ref))
				}
				for n := range names {
					name := fmt.Sprintf("dev-%d", n)
					if got, want := tab.get(name), ref[name]; got != want {
						t.Fatalf("seed %d step %d: get(%q) = %p, want %p", seed, step, name, got, want)
					}
				}
			}
		}
		tab.remove("not there")
		if tab.len() != len(ref) {
			t.Fatalf("seed %d: removing an absent name changed the count", seed)
		}
		// A fleet that leaves gives its slots back.
		for name := range ref {
			tab.remove(name)
		}
		if tab.len() != 0 || len(tab.slots) > 32 {
			t.Fatalf("seed %d: %d slots left for %d devices", seed, len(tab.slots), tab.len())
		}
	}
}
