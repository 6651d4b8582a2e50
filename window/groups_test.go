package window

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer"
)

// toRowPerWindow rewrites the state database's window groups in the layout
// before them, a row per window keyed start | device | metric, and returns
// how many rows it wrote.
func toRowPerWindow(t *testing.T, db *bolt.DB) int {
	t.Helper()
	n := 0
	err := db.Update(func(tx *bolt.Tx) error {
		old, err := tx.CreateBucket(bucketWindows)
		if err != nil {
			return err
		}
		err = tx.Bucket(bucketWindowGroups).ForEach(func(k, v []byte) error {
			start, _, err := parseGroupKey(k)
			if err != nil {
				return err
			}
			return eachEntry(v, func(en groupEntry) error {
				key := binary.BigEndian.AppendUint64(nil, orderedInt(start))
				key = appendBytes(key, en.dev)
				key = append(key, en.metric...)
				n++
				return old.Put(key, bytes.Clone(en.win))
			})
		})
		if err != nil {
			return err
		}
		if err := tx.DeleteBucket(bucketWindowGroups); err != nil {
			return err
		}
		_, err = tx.CreateBucket(bucketWindowGroups)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestWindowRowsMigrate: a state database in the layout before window
// groups (a row per window), written halfway through a stream with
// evicted windows, opens into groups and the stage goes on to write byte
// for byte the outputs of a run that never changed layout.
func TestWindowRowsMigrate(t *testing.T) {
	withShards(t, 2) // several devices a group
	cfg := testConfig(t)
	cfg.AllowedLateness = 10 * time.Minute
	dir := t.TempDir()
	bronzePath := filepath.Join(dir, "bronze.db")
	br := openBronze(t, bronzePath)
	appendAll(t, br, genStream(33, cfg, genOpts{devices: 6, duration: 90 * time.Minute, period: 20 * time.Second,
		dupRate: 0.1, lateRate: 0.1, backlog: 1, grid: time.Second}))
	last := br.LastSeq()
	br.Close()

	ref := cfg
	checkpointNever(&ref)
	want := runEvicting(t, bronzePath, filepath.Join(dir, "reference.db"), ref, false)

	cfg.MaxRecordsPerBatch = 50
	checkpointEveryBatch(&cfg)
	br, err := buffer.Open(bronzePath, buffer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	db := openDB(t, filepath.Join(dir, "state.db"), true)
	s, err := New(db, br, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for s.eng.offset < last/2 {
		if _, err := s.Step(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	evicted := s.Stats().EvictedWindows
	rows := toRowPerWindow(t, db)
	if rows == 0 || evicted == 0 {
		t.Fatalf("%d window rows, %d evicted windows at the switch: the test exercises nothing", rows, evicted)
	}

	if s, err = New(db, br, cfg); err != nil {
		t.Fatal(err)
	}
	err = db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketWindows) != nil {
			t.Error("the bucket of the old layout is still there after the migration")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(windowRows(t, db)); got != rows {
		t.Fatalf("%d windows in groups after the migration, want the %d rows before it", got, rows)
	}
	runToEnd(t, s)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	got, _ := outputBytes(t, db)
	if !bytes.Equal(got, want.out) {
		t.Fatalf("outputs after the migration differ from the run without it\n%s", firstDiff(got, want.out))
	}
	t.Logf("%d window rows migrated with %d windows evicted", rows, evicted)
}

// TestMergeGroup: the entries of a group row stay sorted by (device,
// metric) through puts, deletes and a delete followed by a put of one
// window in the same checkpoint.
func TestMergeGroup(t *testing.T) {
	w := func(count uint64) *window { return &window{count: count, sum: float64(count)} }
	var old []byte
	old = appendEntry(old, "a", "t", appendWindow(nil, w(1)))
	old = appendEntry(old, "c", "t", appendWindow(nil, w(2)))
	old = appendEntry(old, "c", "u", appendWindow(nil, w(3)))
	changes := []winChange{
		{dev: "a", metric: "t"},          // delete
		{dev: "b", metric: "t", w: w(4)}, // insert between
		{dev: "c", metric: "u"},          // delete ...
		{dev: "c", metric: "u", w: w(5)}, // ... then put
		{dev: "d", metric: "t", w: w(6)}, // append
		{dev: "e", metric: "t"},          // delete of a window not stored
	}
	out, _, err := mergeGroup(nil, nil, old, changes)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	err = eachEntry(out, func(en groupEntry) error {
		var win window
		if err := decodeWindow(en.win, &win); err != nil {
			return err
		}
		got = append(got, fmt.Sprintf("%s/%s=%d", en.dev, en.metric, win.count))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"b/t=4", "c/t=2", "c/u=5", "d/t=6"}
	if len(got) != len(want) {
		t.Fatalf("entries %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("entries %v, want %v", got, want)
		}
	}
	if _, _, err := mergeGroup(nil, nil, old[:len(old)-3], nil); err == nil {
		t.Fatal("a truncated group row merged without an error")
	}
}
