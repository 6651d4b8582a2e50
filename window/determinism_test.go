package window

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer"
)

const childEnv = "WINDOW_TEST_CHILD"

func determinismStream(t testing.TB, cfg Config) []buffer.Record {
	return genStream(11, cfg, genOpts{devices: 15, duration: 150 * time.Minute, period: 25 * time.Second,
		dupRate: 0.1, noIDRate: 0.2, lateRate: 0.05, backlog: 2})
}

// runStage processes all of the Bronze at bronzePath into a fresh state DB
// at statePath with the given batch size, in this process.
func runStage(t *testing.T, bronzePath, statePath string, batch int, noSync bool) []byte {
	t.Helper()
	br, err := openBronzeCopy(t, bronzePath)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	db := openDB(t, statePath, noSync)
	cfg := testConfig(t)
	cfg.MaxRecordsPerBatch = batch
	s, err := New(db, br, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, s)
	out, _ := outputBytes(t, db)
	return out
}

// runStageRestarting is runStage with the Stage rebuilt from the database
// after every batch, so every batch boundary is a restart.
func runStageRestarting(t *testing.T, bronzePath, statePath string, batch int) []byte {
	t.Helper()
	br, err := openBronzeCopy(t, bronzePath)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	db := openDB(t, statePath, true)
	cfg := testConfig(t)
	cfg.MaxRecordsPerBatch = batch
	for {
		s, err := New(db, br, cfg)
		if err != nil {
			t.Fatal(err)
		}
		res, err := s.Step()
		if err != nil {
			t.Fatal(err)
		}
		if res.Records == 0 {
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	out, _ := outputBytes(t, db)
	return out
}

// TestChildProcess is the body of the child processes that
// TestDeterminismAcrossKills kills; it does nothing in a normal run.
func TestChildProcess(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("helper process for TestDeterminismAcrossKills")
	}
	batch, err := strconv.Atoi(os.Getenv("WINDOW_BATCH"))
	if err != nil {
		t.Fatal(err)
	}
	br, err := buffer.Open(os.Getenv("WINDOW_BRONZE"), buffer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(os.Getenv("WINDOW_STATE"), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.MaxRecordsPerBatch = batch
	if os.Getenv("WINDOW_CHECKPOINT_EVERY_BATCH") != "" {
		checkpointEveryBatch(&cfg)
		// Each checkpoint in many transactions, so that kills land
		// between them too.
		chunkBytes = 256
	}
	s, err := New(db, br, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for {
		res, err := s.Step()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("step %d %d\n", res.Offset, res.Records)
		if res.Records == 0 {
			break
		}
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	fmt.Println("done")
	db.Close()
	br.Close()
}

// TestDeterminismAcrossKills processes the same Bronze uninterrupted, and
// again in child processes killed with SIGKILL at random points and
// restarted; the outputs (outbox, late and dead-letter rows) must be byte-identical (DESIGN invariants 2, 3).
func TestDeterminismAcrossKills(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns child processes")
	}
	dir := t.TempDir()
	bronzePath := filepath.Join(dir, "bronze.db")
	br, err := buffer.Open(bronzePath, buffer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	appendAll(t, br, determinismStream(t, testConfig(t)))
	br.Close()

	const batch = 97
	want := runStage(t, bronzePath, filepath.Join(dir, "uninterrupted.db"), batch, false)
	if len(want) == 0 {
		t.Fatal("uninterrupted run emitted nothing")
	}

	statePath := filepath.Join(dir, "killed.db")
	rng := rand.New(rand.NewPCG(7, 7))
	kills := 0
	for attempt := 0; ; attempt++ {
		if attempt > 40 {
			t.Fatalf("child never finished after %d kills", kills)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestChildProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), childEnv+"=1", "WINDOW_BRONZE="+bronzePath, "WINDOW_STATE="+statePath,
			"WINDOW_BATCH="+strconv.Itoa(batch))
		if attempt%2 == 1 {
			// Every other child checkpoints, and so evicts emitted windows,
			// with every batch, each in many transactions; the others
			// replay from older checkpoints.
			cmd.Env = append(cmd.Env, "WINDOW_CHECKPOINT_EVERY_BATCH=1")
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		killAfter := -1
		if kills < 6 {
			killAfter = 1 + rng.IntN(12)
		}
		steps, done, killed := 0, false, false
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "step ") {
				steps++
			}
			if line == "done" {
				done = true
			}
			if steps == killAfter && !done {
				if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				killed = true
				break
			}
		}
		err = cmd.Wait()
		switch {
		case killed:
			kills++
		case done:
			if err != nil {
				t.Fatalf("child: %v\n%s", err, stderr.String())
			}
		default:
			t.Fatalf("child exited early: %v\n%s", err, stderr.String())
		}
		if done && !killed {
			break
		}
	}
	if kills < 5 {
		t.Fatalf("only %d kills", kills)
	}
	db := openDB(t, statePath, false)
	got, lateRows := outputBytes(t, db)
	if lateRows == 0 {
		t.Fatal("the stream made no late rows: the test would not see them written twice")
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("outputs after %d kills differ from the uninterrupted run (%d vs %d bytes)\n%s", kills, len(got), len(want), firstDiff(got, want))
	}
	t.Logf("%d kills, outputs of %d bytes identical", kills, len(got))
}

// TestDeterminismAcrossBatchSizes: how records are split into micro-batches
// must not change the outbox.
func TestDeterminismAcrossBatchSizes(t *testing.T) {
	unbounded := determinismAcrossBatchSizes(t)
	if raceDetector {
		// The two settings below change nothing the detector could
		// find; make test runs them without it (firstUnderRace).
		return
	}
	// Idle closes in portions (idleCloseMax) leave devices for the next
	// clock advance: the same outputs whatever the batches and restarts.
	orig := idleCloseMax
	defer func() { idleCloseMax = orig }()
	idleCloseMax = 1
	if bytes.Equal(determinismAcrossBatchSizes(t), unbounded) {
		t.Fatal("the stream has no clock advance that closes two idle windows: portions of one change nothing")
	}
	// Checkpoints that write their window changes a start at a time load
	// back to the same state.
	idleCloseMax = orig
	defer func(was int) { windowPortion = was }(windowPortion)
	windowPortion = 1
	if got := determinismAcrossBatchSizes(t); !bytes.Equal(got, unbounded) {
		t.Fatalf("with window changes written a start at a time, outputs differ\n%s", firstDiff(got, unbounded))
	}
}

// determinismAcrossBatchSizes processes one stream with several batch
// sizes, and restarting after every batch, checks the outputs are the
// same each time and returns them.
func determinismAcrossBatchSizes(t *testing.T) []byte {
	dir := t.TempDir()
	bronzePath := filepath.Join(dir, "bronze.db")
	br, err := buffer.Open(bronzePath, buffer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	appendAll(t, br, genStream(12, cfg, genOpts{devices: 8, duration: 140 * time.Minute, period: 50 * time.Second,
		dupRate: 0.1, noIDRate: 0.2, lateRate: 0.08, backlog: 2, grid: time.Second}))
	br.Close()
	runs := []struct {
		name    string
		batch   int
		restart bool
	}{{"batch=100000", 100_000, false}, {"batch=1", 1, false}, {"batch=7", 7, false}, {"batch=250", 250, false},
		{"restart-every-3", 3, true}, {"restart-every-40", 40, true}}
	outs := make([][]byte, len(runs))
	inParallel(t, len(runs), func(i int) string { return runs[i].name }, func(t *testing.T, i int) {
		path := filepath.Join(dir, runs[i].name+".db")
		if runs[i].restart {
			outs[i] = runStageRestarting(t, bronzePath, path, runs[i].batch)
		} else {
			outs[i] = runStage(t, bronzePath, path, runs[i].batch, true)
		}
	})
	want := outs[0]
	for i, got := range outs[1:] {
		if !bytes.Equal(got, want) {
			t.Fatalf("%s (restarting after every batch: %v) gives a different outbox\n%s", runs[i+1].name, runs[i+1].restart, firstDiff(got, want))
		}
	}
	return want
}

// inParallel runs run(t, 0) … run(t, n-1) as parallel subtests named by
// name, and returns once all are done, failing t if one failed. The runs of
// one stream at several batch sizes are independent (each reads its own
// copy of Bronze into its own state file) and were the package's longest
// tests under -race, one after another.
func inParallel(t *testing.T, n int, name func(int) string, run func(t *testing.T, i int)) {
	t.Helper()
	t.Run("runs", func(t *testing.T) {
		for i := range n {
			t.Run(name(i), func(t *testing.T) {
				t.Parallel()
				run(t, i)
			})
		}
	})
	if t.Failed() {
		t.FailNow()
	}
}

func firstDiff(got, want []byte) string {
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := 0; i < len(g) && i < len(w); i++ {
		if g[i] != w[i] {
			return fmt.Sprintf("line %d:\n got  %.200s\n want %.200s", i, g[i], w[i])
		}
	}
	return fmt.Sprintf("one is a prefix of the other (%d vs %d lines)", len(g), len(w))
}

// TestBronzeRetentionWaitsForStateCheckpoint: Bronze may trim only what a
// restart will not replay, so the stage reports the offset of its state
// checkpoint to Bronze, not how far it has processed.
func TestBronzeRetentionWaitsForStateCheckpoint(t *testing.T) {
	dir := t.TempDir()
	br, err := buffer.Open(filepath.Join(dir, "bronze.db"), buffer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	appendAll(t, br, determinismStream(t, testConfig(t)))
	db := openDB(t, filepath.Join(dir, "state.db"), true)
	cfg := testConfig(t)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cfg.Clock = func() time.Time { return now } // no checkpoint falls due by time
	cfg.CheckpointInterval = time.Hour
	s, err := New(db, br, cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Step()
	if err != nil {
		t.Fatal(err)
	}
	if res.Records == 0 || res.Offset == 0 {
		t.Fatalf("the first step processed nothing: %+v", res)
	}
	if got := br.Checkpoint(); got != 0 {
		t.Fatalf("after a step without a state checkpoint Bronze may trim through %d; want 0", got)
	}
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if got := br.Checkpoint(); got != res.Offset {
		t.Fatalf("after the checkpoint Bronze may trim through %d; want %d", got, res.Offset)
	}
}
