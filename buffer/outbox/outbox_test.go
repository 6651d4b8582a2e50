package outbox

import (
	"bytes"
	"encoding/binary"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func openDB(t *testing.T) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "state.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Update(Init); err != nil {
		t.Fatal(err)
	}
	return db
}

func TestAppendReadDeleteKeepStats(t *testing.T) {
	db := openDB(t)
	var seqs []uint64
	err := db.Update(func(tx *bolt.Tx) error {
		for i, kind := range []Kind{KindAggregate, KindAlert, KindLocal} {
			seq, err := Append(tx, kind, int64(1000+i), bytes.Repeat([]byte{byte(i)}, 10*(i+1)))
			if err != nil {
				return err
			}
			seqs = append(seqs, seq)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seqs[0] != 1 || seqs[2] != 3 {
		t.Fatalf("sequences %v, want 1..3", seqs)
	}
	err = db.View(func(tx *bolt.Tx) error {
		es, err := Read(tx, 2, 10)
		if err != nil {
			return err
		}
		if len(es) != 2 || es[0].Seq != 2 || es[0].Kind != KindAlert || es[0].EmittedAt != 1001 || len(es[1].Data) != 30 {
			t.Errorf("Read from 2: %+v", es)
		}
		st, err := ReadStats(tx)
		if st.Rows != 3 || st.Oldest != 1000 || st.Bytes == 0 {
			t.Errorf("stats %+v", st)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// Unordered, repeated and absent sequences.
	if err := db.Update(func(tx *bolt.Tx) error { return Delete(tx, 3, 1, 3, 99, 1) }); err != nil {
		t.Fatal(err)
	}
	err = db.View(func(tx *bolt.Tx) error {
		st, err := ReadStats(tx)
		es, _ := Read(tx, 0, 10)
		if st.Rows != 1 || st.Oldest != 1001 || len(es) != 1 || st.Bytes != uint64(8+len(es[0].Data)+1+2) {
			t.Errorf("after delete: stats %+v rows %+v", st, es)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Sequences continue after deletes and across transactions, so a replayed
// series of appends numbers its rows the same way.
func TestSequencesAreStable(t *testing.T) {
	db := openDB(t)
	for i := 0; i < 3; i++ {
		if err := db.Update(func(tx *bolt.Tx) error {
			_, err := Append(tx, KindAggregate, 1, []byte("x"))
			if err == nil {
				err = Delete(tx, uint64(i+1))
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	err := db.Update(func(tx *bolt.Tx) error {
		seq, err := Append(tx, KindAggregate, 1, []byte("y"))
		if seq != 4 {
			t.Errorf("fourth append got seq %d", seq)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Read's entries share buffers; each entry's Data is still its own: it
// outlives the transaction, and appending to one leaves the next alone.
func TestReadDataIsIndependent(t *testing.T) {
	db := openDB(t)
	var want [][]byte
	if err := db.Update(func(tx *bolt.Tx) error {
		for i := range 300 {
			d := bytes.Repeat([]byte{byte(i)}, 1+i*37%500)
			want = append(want, d)
			if _, err := Append(tx, KindAggregate, int64(i), d); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var got []Entry
	if err := db.View(func(tx *bolt.Tx) (err error) {
		got, err = Read(tx, 0, 1000)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("read %d entries, want %d", len(got), len(want))
	}
	for i := range got {
		_ = append(got[i].Data, 0xff, 0xff)
	}
	for i, e := range got {
		if !bytes.Equal(e.Data, want[i]) {
			t.Fatalf("entry %d: data %x, want %x", i, e.Data, want[i])
		}
	}
}

// An Appender and plain Appends interleaved in one transaction number the
// rows in call order and leave counters equal to the rows stored, which a
// full Delete brings back to zero.
func TestAppenderInterleavedKeepsStats(t *testing.T) {
	db := openDB(t)
	err := db.Update(func(tx *bolt.Tx) error {
		a, err := NewAppender(tx, nil)
		if err != nil {
			return err
		}
		for i := range 2000 { // past one arena slab
			data := bytes.Repeat([]byte{byte(i)}, i%40)
			if i%7 == 3 {
				if _, err := Append(tx, KindAlert, int64(i), data); err != nil {
					return err
				}
				continue
			}
			seq, err := a.Append(KindAggregate, int64(i), data)
			if err != nil {
				return err
			}
			if seq != uint64(i+1) {
				t.Fatalf("row %d got sequence %d", i, seq)
			}
		}
		return a.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	err = db.View(func(tx *bolt.Tx) error {
		st, err := ReadStats(tx)
		if err != nil {
			return err
		}
		es, err := Read(tx, 0, 1<<20)
		if err != nil {
			return err
		}
		var stored uint64
		for i, e := range es {
			seqs = append(seqs, e.Seq)
			if e.EmittedAt != int64(i) || len(e.Data) != i%40 || (len(e.Data) > 0 && e.Data[0] != byte(i)) {
				t.Fatalf("row %d read back as %+v", i, e)
			}
			stored += 8 + 1 + uint64(len(binary.AppendVarint(nil, e.EmittedAt))) + uint64(len(e.Data))
		}
		if st.Rows != 2000 || uint64(len(es)) != 2000 || st.Bytes != stored {
			t.Errorf("stats %+v for %d rows of %d bytes", st, len(es), stored)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return Delete(tx, seqs...) }); err != nil {
		t.Fatal(err)
	}
	err = db.View(func(tx *bolt.Tx) error {
		st, err := ReadStats(tx)
		if st.Rows != 0 || st.Bytes != 0 {
			t.Errorf("after deleting every row: stats %+v", st)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestCountKind(t *testing.T) {
	db := openDB(t)
	err := db.Update(func(tx *bolt.Tx) error {
		if err := Init(tx); err != nil {
			return err
		}
		for i, k := range []Kind{KindAggregate, KindLocal, KindAlert, KindLocal, KindLocal} {
			if _, err := Append(tx, k, int64(i), []byte("x")); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = db.View(func(tx *bolt.Tx) error {
		for k, want := range map[Kind]uint64{KindLocal: 3, KindAggregate: 1, KindAlert: 1} {
			if n, err := CountKind(tx, k); err != nil || n != want {
				t.Errorf("CountKind(%v) = %d, %v; want %d", k, n, err, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
