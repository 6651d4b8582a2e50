package window

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/internal/boltkv"
	bolt "go.etcd.io/bbolt"
)

// withChunkBytes splits the test's checkpoints into transactions of about
// n bytes.
func withChunkBytes(t *testing.T, n int) {
	old := chunkBytes
	chunkBytes = n
	t.Cleanup(func() { chunkBytes = old })
}

// versionCounts are the stored versions of a state database's groups.
type versionCounts struct {
	groups   int // with a current row
	versions int // stored keys
	garbage  int // versions above the committed generation
	deleted  int // versions of groups whose current version is a deletion
}

func countVersions(t *testing.T, db *bolt.DB) versionCounts {
	t.Helper()
	var n versionCounts
	err := db.View(func(tx *bolt.Tx) error {
		gen := getU64(tx.Bucket(bucketMeta), keyGen)
		for _, gb := range groupBuckets {
			b := tx.Bucket(gb.name)
			n.versions += b.Stats().KeyN
			var sweep [][]byte
			err := eachGroup(b, gb.keyLen, gen, &sweep, func(k, row []byte) error {
				n.groups++
				return nil
			})
			if err != nil {
				return err
			}
			for _, k := range sweep {
				v, err := parseVersion(k, b.Get(k), gb.keyLen)
				if err != nil {
					return err
				}
				if v.gen > gen {
					n.garbage++
				} else {
					n.deleted++
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestInterruptedCheckpoints: a checkpoint is written in several
// transactions and counts only once its last commits. Checkpoints that
// fail after some of their transactions committed — followed by the
// stage's own reload, or by a restart on the same files, as after a crash
// — leave the outputs byte for byte those of a run without checkpoints,
// and their left-over versions are swept.
func TestInterruptedCheckpoints(t *testing.T) {
	withShards(t, 2) // several devices a group
	withChunkBytes(t, 64)
	cfg := testConfig(t)
	cfg.AllowedLateness = 10 * time.Minute
	dir := t.TempDir()
	bronzePath := writeBronze(t, dir, genStream(41, cfg, genOpts{devices: 6, duration: 90 * time.Minute, period: 20 * time.Second,
		dupRate: 0.1, noIDRate: 0.2, lateRate: 0.1, backlog: 1, grid: time.Second}))

	ref := cfg
	checkpointNever(&ref)
	want := runEvicting(t, bronzePath, filepath.Join(dir, "reference.db"), ref, false)

	errCrash := errors.New("crash between a checkpoint's transactions")
	for _, restart := range firstUnderRace([]bool{true, false}) {
		t.Run(fmt.Sprintf("restart=%v", restart), func(t *testing.T) {
			br, err := openBronzeCopy(t, bronzePath)
			if err != nil {
				t.Fatal(err)
			}
			defer br.Close()
			db := openDB(t, filepath.Join(dir, fmt.Sprintf("state-%v.db", restart)), true)
			cfg := cfg
			cfg.MaxRecordsPerBatch = 13
			checkpointEveryBatch(&cfg)
			rng := rand.New(rand.NewPCG(5, 5))
			var failures, leftOver, chunks, swept int
			afterChunk = func(chunk int) error {
				chunks++
				if rng.IntN(8) == 0 {
					failures++
					return errCrash
				}
				return nil
			}
			defer func() { afterChunk = nil }()
			s, err := New(db, br, cfg)
			if err != nil {
				t.Fatal(err)
			}
			for steps := 0; ; steps++ {
				if steps > 100_000 {
					t.Fatal("the stage never finished")
				}
				res, err := s.Step()
				if errors.Is(err, errCrash) {
					if n := countVersions(t, db); n.garbage > 0 {
						leftOver++ // (a failure after a sweep-only transaction leaves none)
					}
					if restart {
						if s, err = New(db, br, cfg); err != nil {
							t.Fatal(err)
						}
					}
					for _, keys := range s.sweep {
						swept += len(keys)
					}
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if n := countVersions(t, db); n.garbage != 0 {
					t.Fatalf("after a checkpoint: %d versions above the committed generation", n.garbage)
				}
				if res.Records == 0 {
					break
				}
			}
			if failures < 10 || leftOver < 5 || swept == 0 {
				t.Fatalf("%d checkpoints failed, %d leaving versions, %d versions swept: the test exercises little", failures, leftOver, swept)
			}
			afterChunk = nil
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			got, _ := outputBytes(t, db)
			if !bytes.Equal(got, want.out) {
				t.Fatalf("outputs differ from the run without checkpoints\n%s", firstDiff(got, want.out))
			}
			// Deleted groups go at the checkpoint after the one that deleted
			// them; versions never pile up beyond two a group.
			if err := s.Checkpoint(); err != nil {
				t.Fatal(err)
			}
			n := countVersions(t, db)
			if n.garbage != 0 || n.versions > 2*n.groups+n.deleted {
				t.Fatalf("versions after the run: %+v", n)
			}
			t.Logf("%d failures in %d transactions (%d leaving versions), %d versions swept; at the end %+v", failures, chunks, leftOver, swept, n)
		})
	}
}

// TestCheckpointSweepsDeletedGroups: windows pruned past the lateness
// horizon delete their groups; the versions that recorded the deletion
// are gone after the next checkpoint, so a long run keeps no trace of
// old groups.
func TestCheckpointSweepsDeletedGroups(t *testing.T) {
	cfg := testConfig(t)
	checkpointEveryBatch(&cfg)
	cfg.MaxRecordsPerBatch = 20
	db, br := openDB(t, "", true), openBronze(t, "")
	appendAll(t, br, genStream(3, cfg, genOpts{devices: 4, duration: 60 * time.Minute, period: 10 * time.Second}))
	s, err := New(db, br, cfg)
	if err != nil {
		t.Fatal(err)
	}
	maxDeleted := 0
	for {
		res, err := s.Step()
		if err != nil {
			t.Fatal(err)
		}
		n := countVersions(t, db)
		pending := 0
		for _, keys := range s.sweep {
			pending += len(keys)
		}
		if n.deleted > pending {
			t.Fatalf("%d versions of deleted groups stored, %d listed to sweep", n.deleted, pending)
		}
		maxDeleted = max(maxDeleted, n.deleted)
		if res.Records == 0 {
			break
		}
	}
	if maxDeleted == 0 {
		t.Fatal("no group was deleted: the test exercises nothing")
	}
	n := countVersions(t, db)
	if n.versions > 2*n.groups+n.deleted {
		t.Fatalf("versions pile up: %+v", n)
	}
}

// currentRows are the current rows of every group of db, by bucket and key.
func currentRows(t *testing.T, db *bolt.DB) map[string]string {
	t.Helper()
	rows := map[string]string{}
	err := db.View(func(tx *bolt.Tx) error {
		gen := getU64(tx.Bucket(bucketMeta), keyGen)
		for i, gb := range groupBuckets {
			err := eachGroup(tx.Bucket(gb.name), gb.keyLen, gen, nil, func(k, row []byte) error {
				rows[fmt.Sprintf("%d/%x", i, k)] = string(row)
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// TestCutCheckpointsKeepTheCommittedState: wherever a checkpoint's
// transactions are cut — chunk sizes that split a deleted group's sweep
// between its versions included (found by a review: the group's older row
// came back) — the rows that load are the committed checkpoint's, and the
// outputs after restarts are those of a run without checkpoints. Devices
// expire, so whole groups are deleted and swept.
func TestCutCheckpointsKeepTheCommittedState(t *testing.T) {
	errCrash := errors.New("crash between a checkpoint's transactions")
	defer func() { afterChunk = nil }()
	// Four chunk sizes, each with one of two seeds (and shard counts) in
	// turn: all ten pairs of five sizes took 98 s under -race, a sixth of
	// make test; one pair per size of five took 86 s on a slow day, and
	// 49 s without 13, 11's near twin.
	for i, chunk := range firstUnderRace([]int{3, 11, 29, 101}) {
		seed := uint64(i % 2)
		t.Run(fmt.Sprintf("chunk=%d/seed=%d", chunk, seed), func(t *testing.T) {
			withShards(t, uint32(1+seed))
			cfg := testConfig(t)
			cfg.AllowedLateness = 5 * time.Minute
			cfg.IdleTimeout, cfg.DeviceExpiry = 5*time.Minute, 15*time.Minute
			dir := t.TempDir()
			bronzePath := writeBronze(t, dir, genStream(seed+3, cfg, genOpts{devices: 5, duration: 50 * time.Minute, period: 20 * time.Second,
				dupRate: 0.1, lateRate: 0.1, backlog: 1, grid: time.Second}))
			ref := cfg
			checkpointNever(&ref)
			afterChunk = nil
			want := runEvicting(t, bronzePath, filepath.Join(dir, "reference.db"), ref, false)

			withChunkBytes(t, chunk)
			br, err := openBronzeCopy(t, bronzePath)
			if err != nil {
				t.Fatal(err)
			}
			defer br.Close()
			db := openDB(t, filepath.Join(dir, "state.db"), true)
			cfg.MaxRecordsPerBatch = 11
			checkpointEveryBatch(&cfg)
			rng := rand.New(rand.NewPCG(seed, uint64(chunk)))
			afterChunk = func(int) error {
				if rng.IntN(4) == 0 {
					return errCrash
				}
				return nil
			}
			s, err := New(db, br, cfg)
			if err != nil {
				t.Fatal(err)
			}
			committed := currentRows(t, db)
			failures, expired := 0, uint64(0)
			for steps := 0; ; steps++ {
				if steps > 100_000 {
					t.Fatal("the stage never finished")
				}
				res, err := s.Step()
				if errors.Is(err, errCrash) {
					failures++
					if !maps.Equal(currentRows(t, db), committed) {
						t.Fatalf("step %d: after a cut checkpoint the rows that load are not the committed ones", steps)
					}
					if failures%2 == 0 {
						if s, err = New(db, br, cfg); err != nil {
							t.Fatalf("step %d: restart: %v", steps, err)
						}
					}
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				committed = currentRows(t, db)
				expired = s.Stats().DevicesExpired
				if res.Records == 0 {
					break
				}
			}
			afterChunk = nil
			if failures < 10 || expired == 0 {
				t.Fatalf("%d cut checkpoints, %d devices expired: the test exercises little", failures, expired)
			}
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			got, _ := outputBytes(t, db)
			if !bytes.Equal(got, want.out) {
				t.Fatalf("outputs differ from the run without checkpoints\n%s", firstDiff(got, want.out))
			}
		})
	}
}

// TestCheckpointTransactionsBoundChangedPages: a sweep deletes rows for a
// few bytes of keys each, so chunkBytes alone let one transaction change a
// page for every row; its commit reads each changed page's old copy
// through the map (with the kernel's fault-around, 64 KiB each), and one
// such commit mapped 22 MiB of the state file in load mode. The writer
// also commits once chunkNodes pages are changed, and the sweep still
// deletes every key and nothing else.
func TestCheckpointTransactionsBoundChangedPages(t *testing.T) {
	db := openDB(t, "", true)
	bucket := []byte("rows")
	value := bytes.Repeat([]byte("v"), 500)
	const rows = 8_000                      // about 4 MB
	step := db.Info().PageSize / len(value) // a little more than a leaf page's rows
	err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket(bucket)
		if err != nil {
			return err
		}
		for i := range rows {
			if err := b.Put(rowKey(i), value); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var sweep [][]byte
	for i := 0; i < rows; i += step { // one row a page or so
		sweep = append(sweep, rowKey(i))
	}

	nodes := func() int64 { // pages changed by the committed transactions
		st := db.Stats()
		return st.TxStats.GetNodeCount()
	}
	var perTx []int64
	last := nodes()
	endOfTx := func() {
		n := nodes()
		perTx = append(perTx, n-last)
		last = n
	}
	afterChunk = func(int) error {
		endOfTx()
		return nil
	}
	defer func() { afterChunk = nil }()
	old := chunkNodes
	chunkNodes = 32
	defer func() { chunkNodes = old }()
	w := &chunkWriter{db: db, log: slog.New(slog.DiscardHandler), ar: &boltkv.Arena{}}
	if err := w.begin(); err != nil {
		t.Fatal(err)
	}
	defer w.abort()
	if err := sweepGroups(w, bucket, sweep); err != nil {
		t.Fatal(err)
	}
	if err := w.commit(); err != nil {
		t.Fatal(err)
	}
	endOfTx()

	// A delete changes its leaf and, the first time, the branches above
	// it: a transaction ends within a few pages of the bound.
	if min := len(sweep) / 32; len(perTx) < min {
		t.Errorf("%d deletes a page apart in %d transactions, want at least %d", len(sweep), len(perTx), min)
	}
	for i, n := range perTx {
		if n > 32+8 {
			t.Errorf("transaction %d changed %d pages, want at most %d", i, n, 32+8)
		}
	}
	err = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucket)
		for i := range rows {
			if got, want := b.Get(rowKey(i)) != nil, i%step != 0; got != want {
				return fmt.Errorf("row %d present %v, want %v", i, got, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

func rowKey(i int) []byte { return binary.BigEndian.AppendUint32(nil, uint32(i)) }

// A checkpoint lets the parked windows' arena go once their rows are
// written, before its devices' and dedup groups' transactions: the arena
// is fullest right then, and held through them it added to every heap
// peak a checkpoint made (docs/performance.md, session 49).
func TestCheckpointReleasesParkedWindowsAfterTheirRows(t *testing.T) {
	withShards(t, 2)
	withChunkBytes(t, 64)
	cfg := testConfig(t)
	cfg.AllowedLateness = 10 * time.Minute
	dir := t.TempDir()
	bronzePath := writeBronze(t, dir, genStream(43, cfg, genOpts{devices: 6, duration: 60 * time.Minute, period: 20 * time.Second,
		dupRate: 0.1, grid: time.Second}))
	br, err := openBronzeCopy(t, bronzePath)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	db := openDB(t, filepath.Join(dir, "state.db"), true)
	cfg.MaxRecordsPerBatch = 50
	checkpointEveryBatch(&cfg)
	s, err := New(db, br, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var parkedSeen, released bool
	var releases int
	afterChunk = func(int) error {
		e := s.eng
		switch {
		case e.nParked > 0 && released:
			t.Errorf("parked windows again after their release, within one checkpoint")
		case e.nParked > 0:
			parkedSeen = true
		case parkedSeen && !released:
			released = true
			releases++
			if len(e.parkedSers) != 0 || len(e.parkArena.chunks) > 1 {
				t.Errorf("after the windows' rows: %d parked series, %d arena chunks", len(e.parkedSers), len(e.parkArena.chunks))
			}
		}
		return nil
	}
	defer func() { afterChunk = nil }()
	for steps := 0; ; steps++ {
		if steps > 100_000 {
			t.Fatal("the stage never finished")
		}
		parkedSeen, released = false, false
		res, err := s.Step()
		if err != nil {
			t.Fatal(err)
		}
		if res.Records == 0 {
			break
		}
	}
	if releases == 0 {
		t.Fatal("no checkpoint had a transaction after its parked windows were released: the test exercises nothing")
	}
	t.Logf("%d checkpoints released their parked windows before their last transactions", releases)
}
