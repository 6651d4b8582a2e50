package outbox

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/internal/boltkv"
)

// modelEntry is what the test expects the outbox to hold for a sequence.
type modelEntry struct {
	kind Kind
	at   int64
	data []byte
}

// checkModel compares every way of reading the outbox with the model.
func checkModel(t *testing.T, db *bolt.DB, model map[uint64]modelEntry, top uint64) {
	t.Helper()
	seqs := make([]uint64, 0, len(model))
	var bytesWant uint64
	kinds := map[Kind]uint64{}
	for s, m := range model {
		seqs = append(seqs, s)
		bytesWant += 8 + 1 + uint64(len(binary.AppendVarint(nil, m.at))) + uint64(len(m.data))
		kinds[m.kind]++
	}
	slices.Sort(seqs)
	err := db.View(func(tx *bolt.Tx) error {
		st, err := ReadStats(tx)
		if err != nil {
			return err
		}
		if st.Rows != uint64(len(seqs)) || st.Bytes != bytesWant {
			t.Fatalf("stats %+v, want %d rows of %d bytes", st, len(seqs), bytesWant)
		}
		if len(seqs) > 0 && st.Oldest != model[seqs[0]].at {
			t.Fatalf("oldest %d, want %d", st.Oldest, model[seqs[0]].at)
		}
		for k, want := range kinds {
			if n, err := CountKind(tx, k); err != nil || n != want {
				t.Fatalf("CountKind(%d) = %d, %v; want %d", k, n, err, want)
			}
		}
		for s := uint64(0); s <= top+1; s++ {
			_, held := model[s]
			if Has(tx, s) != held {
				t.Fatalf("Has(%d) = %v, want %v", s, !held, held)
			}
		}
		// Reads from every sequence, in rounds of a few rows as the
		// sealer's, reusing the array and slab.
		var slab boltkv.Arena
		var dst []Entry
		for from := uint64(0); from <= top+1; from += 1 + from%7 {
			i, _ := slices.BinarySearch(seqs, from)
			want := seqs[i:]
			var got []uint64
			for next := from; ; {
				slab.Reset()
				dst, err = ReadIn(tx, next, 5, &slab, dst)
				if err != nil {
					return err
				}
				if len(dst) == 0 {
					break
				}
				for _, e := range dst {
					m := model[e.Seq]
					if e.Kind != m.kind || e.EmittedAt != m.at || !bytes.Equal(e.Data, m.data) {
						t.Fatalf("read from %d: seq %d is %+v, want %+v", from, e.Seq, e, m)
					}
					got = append(got, e.Seq)
				}
				next = dst[len(dst)-1].Seq + 1
			}
			if !slices.Equal(got, want) {
				t.Fatalf("read from %d: sequences %v, want %v", from, got, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Packs behave as rows of their own would: random rounds of an Appender
// interleaved with plain Appends (as the alert engine's observer does
// inside the window stage's transaction), entries past a pack's size, and
// deletes of random subsets — a pack's first, middle or last entries, in
// any order, with repeats and absent sequences — leave exactly the model's
// entries, read from any sequence, with counters to match.
func TestPacksMatchModel(t *testing.T) {
	db := openDB(t)
	rng := rand.New(rand.NewPCG(1, 2))
	model := map[uint64]modelEntry{}
	var top uint64
	for round := range 40 {
		err := db.Update(func(tx *bolt.Tx) error {
			a, err := NewAppender(tx, nil)
			if err != nil {
				return err
			}
			for range rng.IntN(400) {
				size := rng.IntN(300)
				if rng.IntN(50) == 0 {
					size = packMaxBytes + rng.IntN(3000) // a pack of its own
				}
				m := modelEntry{kind: Kind(1 + rng.IntN(3)), at: rng.Int64N(1<<40) - 1<<39, data: make([]byte, size)}
				for i := range m.data {
					m.data[i] = byte(rng.Uint32())
				}
				var seq uint64
				if rng.IntN(10) == 0 {
					seq, err = Append(tx, m.kind, m.at, m.data)
				} else {
					seq, err = a.Append(m.kind, m.at, m.data)
				}
				if err != nil {
					return err
				}
				if seq != top+1 {
					t.Fatalf("round %d: sequence %d after %d", round, seq, top)
				}
				top = seq
				model[seq] = m
			}
			return a.Close()
		})
		if err != nil {
			t.Fatal(err)
		}
		var drop []uint64
		for s := range model {
			if rng.IntN(3) == 0 {
				drop = append(drop, s)
			}
		}
		if rng.IntN(2) == 0 {
			slices.Sort(drop)
		}
		drop = append(drop, top+5, 0) // absent
		if len(drop) > 2 {
			drop = append(drop, drop[0]) // repeated
		}
		before := slices.Clone(drop)
		if err := db.Update(func(tx *bolt.Tx) error { return Delete(tx, drop...) }); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(drop, before) {
			t.Fatal("Delete reordered its caller's sequences")
		}
		for _, s := range drop {
			delete(model, s)
		}
		if round%8 == 0 || round == 39 {
			checkModel(t, db, model, top)
		}
	}
}

// Rows stored one entry to a row, as before packs, are read, counted and
// deleted beside packs.
func TestRowsBeforePacksStillRead(t *testing.T) {
	db := openDB(t)
	model := map[uint64]modelEntry{}
	err := db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRows)
		var size int64
		for seq := uint64(1); seq <= 5; seq++ {
			m := modelEntry{kind: KindAggregate, at: int64(seq) * 1000, data: bytes.Repeat([]byte{byte(seq)}, int(seq))}
			v := binary.AppendVarint([]byte{byte(m.kind)}, m.at)
			v = append(v, m.data...)
			if err := b.Put(boltkv.Key(seq), v); err != nil {
				return err
			}
			if err := b.SetSequence(seq); err != nil {
				return err
			}
			size += int64(8 + len(v))
			model[seq] = m
		}
		if err := addMeta(tx, 5, size); err != nil {
			return err
		}
		for seq := uint64(6); seq <= 9; seq++ {
			m := modelEntry{kind: KindAlert, at: int64(seq) * 1000, data: []byte("alert")}
			if _, err := Append(tx, m.kind, m.at, m.data); err != nil {
				return err
			}
			model[seq] = m
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checkModel(t, db, model, 9)
	if err := db.Update(func(tx *bolt.Tx) error { return Delete(tx, 2, 7, 1) }); err != nil {
		t.Fatal(err)
	}
	for _, s := range []uint64{1, 2, 7} {
		delete(model, s)
	}
	checkModel(t, db, model, 9)
}

// A pack that does not decode is reported as corrupt, not read past.
func TestCorruptPackIsReported(t *testing.T) {
	db := openDB(t)
	err := db.Update(func(tx *bolt.Tx) error {
		// A pack whose one entry claims more data than it holds.
		v := []byte{packMarker, 1, byte(KindAggregate), 2, 50, 'x'}
		return tx.Bucket(bucketRows).Put(boltkv.Key(1), v)
	})
	if err != nil {
		t.Fatal(err)
	}
	err = db.View(func(tx *bolt.Tx) error {
		if _, err := Read(tx, 0, 10); !errors.Is(err, ErrCorrupt) {
			t.Errorf("Read: %v, want ErrCorrupt", err)
		}
		if _, err := CountKind(tx, KindAggregate); !errors.Is(err, ErrCorrupt) {
			t.Errorf("CountKind: %v, want ErrCorrupt", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return Delete(tx, 1) }); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Delete: %v, want ErrCorrupt", err)
	}
}
