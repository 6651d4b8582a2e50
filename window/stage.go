package window

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/metrics"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/internal/boltkv"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// Stage is the window stage: it reads Bronze in micro-batches from its
// checkpoint and commits each batch's state delta, outbox entries, late and
// dead-letter rows and the new offset in one bbolt transaction.
//
// Step, Flush, Run and RunOnce must not run concurrently with each other
// (they serialise on a mutex); Stats may be called from any goroutine.
type Stage struct {
	db   *bolt.DB
	src  Source
	recs []buffer.Record // the array each Step reads its batch into, a slice at a time
	cfg  Config
	log  *slog.Logger

	mu  sync.Mutex // one batch at a time
	eng *engine
	// checkpointAt is when the state delta was last written (Config.Clock),
	// checkpointOffset the Bronze sequence it covers.
	checkpointAt     time.Time
	checkpointOffset uint64
	// sweep are the group versions the next checkpoint deletes.
	sweep   groupSweep
	blocked bool
	// stale is set when a failed batch could not be rolled back (its
	// reload failed): the engine holds the batch's effects, which were not
	// committed, so nothing may run on it or checkpoint it until a reload
	// succeeds.
	stale  bool
	encBuf []byte         // an aggregate's encoding on its way to the outbox
	agg    wire.Aggregate // an aggregate on its way to encBuf
	keyBuf []byte         // agg's key (see writeOutputs)
	// arena holds the values of the write transaction in progress (outbox,
	// late and dead-letter rows, a checkpoint's rows); it is reset when
	// one begins.
	arena boltkv.Arena
	// gateHeld: the stage holds Config.SendGate because a committed
	// revision is above Bronze's floor and not yet recorded there (see
	// recordFloor); floorFailing: recording it failed, and was logged.
	gateHeld, floorFailing bool
	capLogged              bool // the device cap was hit and logged; cleared by a batch without

	statsMu     sync.Mutex
	checkpoints [len(checkpointReasons)]uint64 // by checkpointReason, under statsMu
	stats       Stats
}

// StepResult describes one micro-batch.
type StepResult struct {
	// Records is the number of Bronze records consumed (all kinds).
	Records int
	// Emitted counts aggregates written to the outbox (first emissions and
	// revisions); Late counts late rows; DeadLetters dead-letter rows.
	Emitted, Late, Duplicates, DeadLetters int
	// Offset is the last Bronze sequence committed.
	Offset uint64
	// Blocked is true when the outbox was over its bound and nothing was consumed.
	Blocked bool
	// More is true when the read stopped at the batch's bound (records,
	// bytes or aggregates), so Bronze may hold more right away.
	More     bool
	Duration time.Duration
}

// Stats is a snapshot of the stage's position, state size and counters.
type Stats struct {
	Offset uint64
	// WrittenThrough is the last Bronze sequence whose outputs are
	// written: past Offset after a crash, until the catch-up replays to it.
	WrittenThrough uint64
	// Records counts Bronze records processed (messages, ticks, rejected);
	// Readings those that became readings (after dedup; one a message).
	Records, Readings uint64
	Batches           uint64
	// Emitted counts aggregates emitted; Revisions the ones that were
	// revisions of an already emitted window.
	Emitted, Revisions uint64
	// OpenWindows counts the windows in state: not yet final, so data
	// can still change them. EvictedWindows counts those of them that are
	// emitted without pending changes and held only in the state database
	// (late data reads one back); the rest are in memory.
	OpenWindows      int
	EvictedWindows   int
	PendingRevisions int
	DedupEntries     int
	Devices          int
	Tombstones       int
	// TombstonesDropped counts tombstones dropped to keep them within
	// max_devices; TombstoneFloor is the newest horizon among
	// them (zero when none is in force): windows of devices not seen
	// before that end by then take no more readings.
	TombstonesDropped uint64
	TombstoneFloor    time.Time
	// StateBytes estimates the memory the state takes.
	StateBytes  int64
	Late        uint64
	LateRows    uint64
	LateEvicted uint64
	Duplicates  uint64
	// DeadLetters counts dead letters by reason code.
	DeadLetters        map[string]uint64
	DeadLetterRows     uint64
	DeadLettersEvicted uint64
	DevicesExpired     uint64
	// LatestEventTime is the newest event time of an accepted reading;
	// LoggedClock the newest received-at or tick.
	LatestEventTime time.Time
	LoggedClock     time.Time
	// Lag is wall clock (Config.Clock) minus LatestEventTime.
	Lag               time.Duration
	Blocked           bool
	BlockedTotal      uint64
	LastBatchDuration time.Duration
	LastBatchRecords  int
	// Failing is set while batches fail (Run retries them); LastError is
	// the last failure, Failures counts them.
	Failing   bool
	LastError string
	Failures  uint64
	// Checkpoints counts the checkpoints this process wrote, by what made
	// them due (checkpointReasons): under a heavy load the delta's bound,
	// not the interval, sets how often the state is written.
	Checkpoints map[string]uint64
}

// checkpointReason is why a commit also writes the state delta.
type checkpointReason uint8

const (
	noCheckpoint checkpointReason = iota
	checkpointInterval
	checkpointDelta    // the delta reached maxDeltaRows
	checkpointCaughtUp // a replay after a restart caught up
	checkpointBronzeFull
	checkpointStop // shutdown, Flush (run --once)
)

// checkpointReasons name the reasons in Stats.Checkpoints and the
// edgeagent_window_checkpoints_total metric.
var checkpointReasons = [...]string{
	checkpointInterval:   "interval",
	checkpointDelta:      "delta",
	checkpointCaughtUp:   "caught_up",
	checkpointBronzeFull: "bronze_full",
	checkpointStop:       "stop",
}

// New validates cfg, creates the stage's buckets (and the outbox's), checks
// the state fingerprint, loads the state and sets src's checkpoint to the
// stored offset.
func New(db *bolt.DB, src Source, cfg Config) (*Stage, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Stage{db: db, src: src, cfg: cfg, log: cfg.Logger}
	err := db.Update(func(tx *bolt.Tx) error {
		if err := createBuckets(tx); err != nil {
			return err
		}
		if err := migrateRows(tx); err != nil {
			return err
		}
		return checkFingerprint(tx, &s.cfg)
	})
	if err != nil {
		return nil, fmt.Errorf("open window state: %w", err)
	}
	if err := s.reload(); err != nil {
		return nil, err
	}
	// Logged here, not by every reload: a rollback before the first
	// checkpoint reloads the same tombstones and drops them again.
	s.logTombstonesDropped(s.eng.droppedAtLoad)
	if err := s.raiseToRevisionFloor(); err != nil {
		return nil, err
	}
	if err := s.recordSkewHigh(); err != nil {
		return nil, err
	}
	if err := s.recordBehaviour(); err != nil {
		return nil, err
	}
	src.SetCheckpoint(s.eng.offset)
	s.checkpointAt = s.cfg.Clock()
	s.publish(StepResult{}, false)
	return s, nil
}

// recordBehaviour stores the settings outputs are decided under from now
// on, unless a catch-up must first replay outputs decided under the stored
// ones (then the checkpoint after it stores them; see deferReplayed).
func (s *Stage) recordBehaviour() error {
	e := s.eng
	if e.suppressThrough > e.offset {
		return nil
	}
	cur := s.cfg.behaviour()
	err := s.db.Update(func(tx *bolt.Tx) error {
		m := tx.Bucket(bucketMeta)
		if bytes.Equal(m.Get(keyBehaviour), cur) {
			return nil
		}
		return m.Put(keyBehaviour, cur)
	})
	if err != nil {
		return fmt.Errorf("record window settings: %w", err)
	}
	return nil
}

// recordSkewHigh keeps the largest readings.max_future_skew the stage has
// run with, for Replay: records it decided under a larger one than today's
// may have put readings that far ahead of their arrival into windows.
func (s *Stage) recordSkewHigh() error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		m := tx.Bucket(bucketMeta)
		high, _, err := futureSkewHigh(m)
		if err != nil {
			return err
		}
		if m.Get(keyMaxSkew) != nil && high >= s.cfg.MaxFutureSkew {
			return nil
		}
		return putU64(m, keyMaxSkew, uint64(max(high, s.cfg.MaxFutureSkew)))
	})
	if err != nil {
		return fmt.Errorf("record window settings: %w", err)
	}
	return nil
}

// revisionFloor is a Source that keeps the highest committed revision
// (buffer.Bronze): it outlives a lost or damaged state database.
type revisionFloor interface {
	SetRevisionFloor(rev uint32) error
	RevisionFloor() uint32
}

// releaser is a Source that reuses the memory of the records a reader
// has released (buffer.Bronze).
type releaser interface {
	ReleaseThrough(seq uint64)
}

// releaseRecords tells the source which records the stage no longer
// holds: every one processed, but for the dead letters waiting for the
// commit, whose topics (and device names cut from them) are the records'.
// Released after every slice, not every commit, Bronze's arenas are free
// again as they leave its tail, and few wait for reuse.
func (s *Stage) releaseRecords() {
	r, ok := s.src.(releaser)
	if !ok {
		return
	}
	through := s.eng.offset
	if len(s.eng.dls) > 0 {
		through = min(through, s.eng.dls[0].Seq-1)
	}
	r.ReleaseThrough(through)
}

// raiseToRevisionFloor makes revisions continue above the source's floor
// when the state database knows fewer: it was lost, damaged and moved
// aside, or restored from an older copy. Windows rebuilt from Bronze then
// go out above every revision already sent, so the cloud's upsert takes
// them instead of keeping stale ones.
func (s *Stage) raiseToRevisionFloor() error {
	src, ok := s.src.(revisionFloor)
	if !ok {
		return nil
	}
	floor, e := src.RevisionFloor(), s.eng
	if floor <= e.highRev {
		// A Bronze file newer than this state's revisions, or revisions a
		// replay wrote with the agent stopped: recorded before the uplink
		// can send them.
		return src.SetRevisionFloor(e.highRev)
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		r := tx.Bucket(bucketRevs)
		if err := putU64(r, keyHighRev, uint64(floor)); err != nil {
			return err
		}
		return putU64(r, keyRevBase, uint64(max(floor, e.revBase)))
	})
	if err != nil {
		return fmt.Errorf("raise revisions to Bronze's floor %d: %w", floor, err)
	}
	s.log.Warn("window: the state database knows fewer revisions than Bronze recorded (it was lost or restored from an older copy): new revisions continue above Bronze's",
		"state_highest_revision", e.highRev, "bronze_revision_floor", floor)
	e.highRev, e.revBase = floor, max(floor, e.revBase)
	return nil
}

// recordFloor writes the highest committed revision to Bronze when it is
// above Bronze's floor, then opens Config.SendGate. While the write fails
// the gate stays shut, so the rows above the floor wait; every Step
// retries.
func (s *Stage) recordFloor() {
	if floor, ok := s.src.(revisionFloor); ok && s.eng.highRev > floor.RevisionFloor() {
		if err := floor.SetRevisionFloor(s.eng.highRev); err != nil {
			if !s.floorFailing {
				s.log.Error("window: recording the highest revision in Bronze failed; the uplink waits, retried at every batch", "err", err)
			}
			s.floorFailing = true
			return
		}
	}
	s.floorFailing = false
	s.releaseGate()
}

func (s *Stage) releaseGate() {
	if s.gateHeld {
		s.cfg.SendGate.Unlock()
		s.gateHeld = false
	}
}

// rollback drops the in-memory effects of a failed batch by reloading the
// state from the last checkpoint; if that fails too, the stage is stale
// until fresh succeeds.
func (s *Stage) rollback() error {
	if err := s.reload(); err != nil {
		s.stale = true
		return err
	}
	s.wentBack()
	return nil
}

// wentBack tells Bronze, after a reload, that the stage holds no record
// past its checkpoint: it reads the ones after it again, which it had
// released, and their memory (the tail's arenas, reused as they leave it)
// must not be reused while it holds them anew.
func (s *Stage) wentBack() { s.releaseRecords() }

// fresh reloads a stale stage; it must succeed before a batch or a
// checkpoint, which would otherwise build on, or write, uncommitted effects.
func (s *Stage) fresh() error {
	if !s.stale {
		return nil
	}
	if err := s.reload(); err != nil {
		return fmt.Errorf("window state not yet reloaded after a failed batch: %w", err)
	}
	s.stale = false
	s.wentBack()
	return nil
}

// reload replaces the in-memory state with the stored one; after a failed
// commit it discards the batch that was not written.
func (s *Stage) reload() error {
	err := s.db.View(func(tx *bolt.Tx) error {
		var sweep groupSweep
		e, err := loadEngine(tx, &s.cfg, s.loadWindow, s.loadDedup, &sweep)
		if err != nil {
			return err
		}
		s.eng, s.sweep = e, sweep
		s.checkpointOffset = e.offset
		return nil
	})
	if err != nil {
		return fmt.Errorf("load window state: %w", err)
	}
	return nil
}

// logTombstonesDropped warns of tombstones dropped for max_devices, by a
// batch or by the load of a state saved under a larger bound.
func (s *Stage) logTombstonesDropped(dropped uint64) {
	if dropped > 0 {
		s.log.Warn("window: more expired devices than window.max_devices; the oldest tombstones were dropped, and devices not seen before take no readings for windows ending by their newest horizon",
			"dropped", dropped, "horizon", time.UnixMilli(s.eng.tombFloor).UTC())
	}
}

// loadWindow reads an evicted window's entry back from the state
// database. The entry is current: a window parked since the last
// checkpoint is read back from its encoding instead (restore), and an
// evicted one is not written again until it is read back.
func (s *Stage) loadWindow(dev, metric string, start int64) (*window, error) {
	w := &window{}
	err := s.readEntry(bucketWindowGroups, start, dev, metric, func(win []byte) error { return decodeWindow(win, w) })
	if err != nil {
		return nil, err // the engine names the window
	}
	return w, nil
}

// loadDedup reads a cold dedup group's ids back from the state database;
// like an evicted window's, its entry is current.
func (s *Stage) loadDedup(dev string, end int64) ([]uint64, error) {
	var ids []uint64
	err := s.readEntry(bucketDedupGroups, end, dev, "", func(v []byte) error {
		if len(v)%8 != 0 {
			return fmt.Errorf("%w: %d bytes of ids", ErrCorruptState, len(v))
		}
		ids = decodeDedupIDs(v)
		return nil
	})
	if err != nil {
		return nil, err // the engine names the group
	}
	return ids, nil
}

// readEntry calls decode with the payload of the entry (dev, metric) in the
// group row of bucket at time at, inside the read transaction.
func (s *Stage) readEntry(bucket []byte, at int64, dev, metric string, decode func([]byte) error) error {
	return s.db.View(func(tx *bolt.Tx) error {
		g, err := readGroup(tx.Bucket(bucket), appendGroupKey(nil, at, shardOf(dev)), s.eng.gen)
		if err != nil {
			return err
		}
		payload, err := findEntry(g.row(), dev, metric)
		if err != nil {
			return err
		}
		if payload == nil {
			return fmt.Errorf("%w: no entry in its group row", ErrCorruptState)
		}
		return decode(payload)
	})
}

// Step runs one micro-batch: at most MaxRecordsPerBatch records after the
// checkpoint. It consumes nothing while the outbox is at its byte bound.
func (s *Stage) Step() (StepResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fresh(); err != nil {
		return StepResult{}, err
	}
	if s.gateHeld {
		s.recordFloor()
	}
	start := s.cfg.Clock()
	res := StepResult{Offset: s.eng.offset}
	var full bool
	err := s.db.View(func(tx *bolt.Tx) error {
		n, err := s.cfg.OutboxBytes(tx)
		full = int64(n) >= s.cfg.OutboxMaxBytes
		return err
	})
	if err != nil {
		return res, fmt.Errorf("read outbox stats: %w", err)
	}
	s.setBlocked(full)
	if full {
		res.Blocked = true
		s.publish(res, true)
		return res, nil
	}
	e := s.eng
	before := e.c
	// The batch comes in slices of readSlice records, each processed and
	// cleared before the next is read: nothing keeps a record past its
	// processing, so the array the stage keeps between Steps (and the
	// collector scans, a record holding pointers) is a slice's, not a
	// batch's (10,000 records, 880 KB, in load mode).
	//
	// The batch keeps ReadInto's bounds as a whole: MaxRecordsPerBatch,
	// and buffer.ReadMaxBytes (up to twice over: each slice stops at it
	// on its own, and the batch after the slice that reaches it).
	records, held, more := 0, 0, false
	for {
		want, after := min(readSlice, s.cfg.MaxRecordsPerBatch-records), e.offset
		recs, err := s.src.ReadInto(s.recs, after+1, want)
		for i := range recs {
			held += recs[i].HeldBytes()
			e.process(&recs[i])
			if e.loadErr != nil {
				break
			}
		}
		records += len(recs)
		more = buffer.ReadFull(recs, want)
		clear(recs)
		s.recs = recs[:0]
		if e.loadErr == nil {
			s.releaseRecords()
		}
		if err != nil {
			err = fmt.Errorf("read bronze after %d: %w", after, err)
		} else {
			err = e.loadErr
		}
		if err != nil {
			if records == 0 {
				return res, err // nothing of the batch was processed
			}
			// The batch is half done: drop it and go back to the
			// checkpoint, as after a failed commit; the next Step redoes it.
			if rerr := s.rollback(); rerr != nil {
				return res, fmt.Errorf("window batch: %w (and %v)", err, rerr)
			}
			return res, fmt.Errorf("window batch: %w", err)
		}
		if !more || records >= s.cfg.MaxRecordsPerBatch || held >= buffer.ReadMaxBytes || len(e.out) >= maxBatchEmissions {
			break
		}
	}
	if records == 0 {
		// Records processed since the checkpoint keep their room in Bronze
		// until it moves; when Bronze is full no new record comes to carry
		// a checkpoint, so an idle Step writes the one that is due.
		if e.offset > s.checkpointOffset {
			if ck := s.checkpointDue(); ck != noCheckpoint {
				if err := s.commit(ck); err != nil {
					return res, err
				}
			}
		}
		s.publish(res, false)
		return res, nil
	}
	e.replaying = false
	e.pruneTombstones()
	res.Emitted = len(e.out)
	if err := s.commit(s.checkpointDue()); err != nil {
		return res, err
	}
	if res.Emitted > 0 && s.cfg.Committed != nil {
		s.cfg.Committed()
	}
	capped := e.c.Dead[codeIdx(CodeTooManyDevices)] - before.Dead[codeIdx(CodeTooManyDevices)]
	if capped > 0 && !s.capLogged {
		s.log.Warn("window: max_devices reached, readings of new devices are dead-lettered", "max_devices", s.cfg.MaxDevices, "refused", capped)
	}
	s.capLogged = capped > 0
	s.logTombstonesDropped(e.c.TombstonesDropped - before.TombstonesDropped)
	res.Records = records
	res.More = more
	res.Late = int(e.c.Late - before.Late)
	res.Duplicates = int(e.c.Duplicates - before.Duplicates)
	for i := range e.c.Dead {
		res.DeadLetters += int(e.c.Dead[i] - before.Dead[i])
	}
	res.Offset = e.offset
	res.Duration = s.cfg.Clock().Sub(start)
	s.publish(res, true)
	return res, nil
}

// checkpointDue says whether this batch's commit also writes the state
// delta, and why: every CheckpointInterval, when the delta has grown large,
// when a replay has caught up, and when Bronze is full (its retention waits
// for the checkpoint).
func (s *Stage) checkpointDue() checkpointReason {
	e := s.eng
	if e.deltaSize() >= maxDeltaRows {
		return checkpointDelta
	}
	// A replay after a restart has just caught up: checkpoint at once, so
	// that restarts more frequent than the interval still make progress.
	if e.suppressThrough > s.checkpointOffset && e.offset >= e.suppressThrough {
		return checkpointCaughtUp
	}
	if f, ok := s.src.(interface{ Full() bool }); ok && f.Full() {
		return checkpointBronzeFull
	}
	if s.cfg.Clock().Sub(s.checkpointAt) >= s.cfg.CheckpointInterval {
		return checkpointInterval
	}
	return noCheckpoint
}

// readSlice is how many records a Step reads at a time (see Step).
const readSlice = 1024

// maxBatchEmissions ends a batch after the slice whose records took its
// emissions to this many. A batch holds its emissions, and the outbox rows
// and bbolt pages they become, until its commit: where many devices' windows
// close together (a fleet in step; load mode's devices cross a window
// boundary every 2.4 s), 10,000 records emitted about 20,000 aggregates and
// the live heap rose by 6-10 MB for them. 2,048 rather than 4,096: about 1
// MiB less peak RSS in load mode (four pairs paced, four not), the CPU the
// same.
const maxBatchEmissions = 2048

// maxDeltaRows bounds the state delta held between checkpoints. A
// checkpoint holds its rows and the bbolt pages they touch in memory until
// it commits, so this also bounds the heap's peak when event time runs fast
// (a backlog flush, the rig's load mode). Measured in load mode, 10,000
// devices, two runs each: 200,000 rows 165-171 MiB peak RSS, 100,000 rows
// 138-153 MiB at the same CPU per reading, 50,000 rows no lower and up to
// a quarter more CPU.
const maxDeltaRows = 100_000

// commit writes the batch's outputs and, unless ck is noCheckpoint, the
// state delta; on failure the in-memory state is reloaded from the last
// checkpoint, and the batch is redone by the next Step.
func (s *Stage) commit(ck checkpointReason) error {
	e := s.eng
	checkpoint := ck != noCheckpoint
	lateEvicted, deadEvicted := e.c.LateEvicted, e.c.DeadEvicted
	rows := e.deltaSize()
	collect := checkpoint && !s.cfg.HeapPaced && collectAround(rows, heapLive())
	if collect {
		// Collected right before, the heap starts the checkpoint at what
		// is live, so the checkpoint's transient fits under the goal and
		// no cycle marks it (see collectAround).
		runtime.GC()
	}
	// A revision above Bronze's floor is recorded there before anything
	// can read the rows that carry it (see Config.SendGate, recordFloor).
	if floor, ok := s.src.(revisionFloor); ok && !s.gateHeld && s.cfg.SendGate != nil && e.highRev > floor.RevisionFloor() {
		s.cfg.SendGate.Lock()
		s.gateHeld = true
	}
	defer s.recordFloor() // after a rollback too: e.highRev is then the committed one
	var err error
	if checkpoint {
		err = s.writeCheckpoint()
	} else {
		s.arena.Reset()
		err = s.db.Update(s.writeOutputs)
		// Its reads mapped the outbox's last pages and the late and
		// dead-letter tables' (see chunkWriter.release).
		boltkv.ReleaseMapped(s.db, s.log)
	}
	if err != nil {
		if rerr := s.rollback(); rerr != nil {
			return fmt.Errorf("commit window batch: %w (and %v)", err, rerr)
		}
		return fmt.Errorf("commit window batch: %w", err)
	}
	if lateEvicted == 0 && e.c.LateEvicted > 0 {
		s.log.Warn("window: late table full, evicting oldest rows", "max_rows", s.cfg.MaxLateRows)
	}
	if deadEvicted == 0 && e.c.DeadEvicted > 0 {
		s.log.Warn("window: dead-letter table full, evicting oldest rows", "max_rows", s.cfg.MaxDeadLetterRows)
	}
	e.resetOutputs()
	s.releaseRecords()
	if checkpoint {
		e.resetDelta()
		s.checkpointAt, s.checkpointOffset = s.cfg.Clock(), e.offset
		s.src.SetCheckpoint(e.offset)
		s.statsMu.Lock()
		s.checkpoints[ck]++
		s.statsMu.Unlock()
		if collect {
			// Twice: bbolt returned the commit's page buffers to its
			// sync.Pool, which a collection only moves to the pool's
			// victim cache, still live; the second frees them.
			runtime.GC()
			runtime.GC()
		}
	}
	return nil
}

// writeCheckpoint writes the batch's outputs and the state delta as the
// next generation, in transactions of about chunkBytes (see slotted).
func (s *Stage) writeCheckpoint() error {
	w := &chunkWriter{db: s.db, log: s.log, parked: &s.eng.parkArena, ar: &s.arena}
	if err := w.begin(); err != nil {
		return err
	}
	defer w.abort()
	sweep, err := writeCheckpoint(w, s.eng, &s.sweep)
	if err != nil {
		return err
	}
	if err := s.writeOutputs(w.tx); err != nil {
		return err
	}
	if err := w.commit(); err != nil {
		return err
	}
	s.sweep = sweep
	s.eng.gen++
	return nil
}

// collectAround says whether a checkpoint of rows changes is worth three
// full collections: one right before it and two right after its commit.
// A checkpoint holds its arrays of changes (24 bytes a change) and,
// per transaction, about chunkBytes of new rows and the bbolt pages they
// dirty; until session 16 it held all its rows and pages at once (load
// mode, 10,000 devices: 20-27 MB for 78,000-104,000 changes, against 24-29
// MB live). A collection during it set the heap's next goal from that
// peak, and the heap grew to twice it before the next; collecting after
// the commit sets the goal from what stays. The second collection after
// it frees bbolt's page buffers, which go back to a sync.Pool and outlive
// the first in its victim cache. The one before starts the checkpoint from
// what is live, so its transient mostly fits under the current goal.
//
// It pays where the transient is a fair part of the live heap. A large
// gateway whose heap holds ten times a checkpoint's transient would pay
// three collections of that heap per checkpoint for a goal barely higher,
// and a steady gateway's checkpoints are small.
//
// Load mode, alternated pairs: with one collection after, peak RSS
// 122-134 MiB against 131-145 MiB without (three pairs, session 7); with
// the second after, 89-96 against 93-102 MiB (five pairs); with the one
// before too, 79-89 against 85-98 MiB (five pairs), heap peaks 55-64
// against 62-82 MB. CPU stayed within the runs' noise. With checkpoints in
// chunks (session 16), 92.6-98.5 against 98.4-101.7 MiB (three triples
// with the build before chunks, 86.2-102.8), CPU within the noise: kept.
// Under heap pacing (session 20) the pacer's limit already keeps the goal
// off the transient: 62.3-63.4 MiB without the collections against
// 61.3-62.7 with them, and 10.2-11.0 against 11.0-11.6 s of CPU per
// million readings (three pairs), so a paced stage skips them.
func collectAround(rows int, live uint64) bool {
	transient := uint64(rows) * checkpointRowBytes
	return rows >= gcAfterRows && transient >= live/4
}

const (
	gcAfterRows = 20_000
	// checkpointRowBytes was a change's share of the transient when a
	// checkpoint was one transaction; the threshold stays as measured.
	checkpointRowBytes = 250
)

// heapLive is the heap marked live by the last collection.
func heapLive() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0 // unsupported: collect by the row count alone
	}
	return s[0].Value.Uint64()
}

// Checkpoint writes the state delta now if there is one, so a restart
// replays nothing (called at shutdown).
func (s *Stage) Checkpoint() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checkpointNow()
}

func (s *Stage) checkpointNow() error {
	if err := s.fresh(); err != nil {
		return err
	}
	if s.eng.deltaSize() == 0 && s.eng.offset == s.checkpointOffset {
		return nil
	}
	return s.commit(checkpointStop)
}

func (s *Stage) setBlocked(b bool) {
	if b == s.blocked {
		return
	}
	s.blocked = b
	s.statsMu.Lock()
	if b {
		s.stats.BlockedTotal++
	}
	s.statsMu.Unlock()
	if b {
		s.log.Warn("window: outbox full, not consuming Bronze until the uplink drains it", "outbox_max_bytes", s.cfg.OutboxMaxBytes)
	} else {
		s.log.Info("window: outbox below its bound, consuming Bronze again")
	}
}

// Flush emits every pending revision now and commits. Its emission point
// depends on when it is called, so only RunOnce (at the end of Bronze) and
// shutdown paths that accept that should call it.
func (s *Stage) Flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fresh(); err != nil {
		return err
	}
	if len(s.eng.pending) == 0 {
		return s.checkpointNow()
	}
	// Flushed revisions depend on when Flush runs, which a replay cannot
	// reproduce: they go out with a checkpoint.
	s.eng.flushPending()
	if err := s.commit(checkpointStop); err != nil {
		return err
	}
	s.publish(StepResult{Offset: s.eng.offset}, false)
	return nil
}

// RunOnce steps until the stage has caught up with src, then flushes
// pending revisions (edgeagent run --once). It returns ErrBlocked when the
// outbox is full.
func (s *Stage) RunOnce() error {
	for {
		res, err := s.Step()
		if err != nil {
			return err
		}
		if res.Blocked {
			return fmt.Errorf("%w: outbox at or above %d bytes", ErrBlocked, s.cfg.OutboxMaxBytes)
		}
		if !res.More {
			break
		}
	}
	return s.Flush()
}

// Run steps every TriggerInterval, and again at once while batches come
// back full, until ctx is cancelled; it then returns nil after the batch in
// hand has committed, or the final checkpoint's error.
//
// A failed Step (a full disk under the state database, an I/O error) is
// retried with backoff, from TriggerInterval up to maxRetryDelay, and
// shown in Stats: the batch was rolled back, so a retry is safe, and a
// stage that stays up keeps the status endpoint and ingest running (Bronze
// keeps accepting until it is full), where an exit would restart into the
// same error until systemd gave up.
func (s *Stage) Run(ctx context.Context) error {
	t := time.NewTimer(0)
	defer t.Stop()
	var delay time.Duration
	for {
		select {
		case <-ctx.Done():
			err := s.Checkpoint()
			// Stopping: the uplink must not wait on the gate to stop. A
			// restart records the floor before anything is sent.
			s.mu.Lock()
			s.releaseGate()
			s.mu.Unlock()
			return err
		case <-t.C:
		}
		var err error
		for {
			var res StepResult
			if res, err = s.Step(); err != nil {
				break
			}
			if res.Blocked || !res.More || ctx.Err() != nil {
				break
			}
		}
		if err != nil {
			delay = min(max(2*delay, s.cfg.TriggerInterval), maxRetryDelay)
			if s.setFailure(err) {
				s.log.Error("window batch failed; retrying with backoff", "retry_in", delay, "err", err)
			}
			t.Reset(delay)
			continue
		}
		if delay > 0 {
			delay = 0
			s.setFailure(nil)
			s.log.Info("window batches recovered")
		}
		t.Reset(s.cfg.TriggerInterval)
	}
}

// maxRetryDelay caps the backoff of failed batches.
const maxRetryDelay = 30 * time.Second

// setFailure records err in Stats (nil: recovered) and reports whether it
// is worth a log line: a new error, not the same one again.
func (s *Stage) setFailure(err error) bool {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	if err == nil {
		s.stats.Failing, s.stats.LastError = false, ""
		return false
	}
	s.stats.Failures++
	msg := err.Error()
	changed := !s.stats.Failing || s.stats.LastError != msg
	s.stats.Failing, s.stats.LastError = true, msg
	return changed
}

// publish refreshes the Stats snapshot (called with s.mu held).
func (s *Stage) publish(res StepResult, batch bool) {
	e := s.eng
	// Every code, at zero until counted (New publishes first): its series
	// exists from the start.
	dead := make(map[string]uint64, len(codeIndex))
	for i, c := range codeIndex {
		dead[c] = e.c.Dead[i]
	}
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	st := &s.stats
	if batch && res.Records > 0 {
		st.Batches++
		st.LastBatchDuration = res.Duration
		st.LastBatchRecords = res.Records
	}
	st.Offset = e.offset
	st.WrittenThrough = max(e.offset, e.suppressThrough)
	st.Records, st.Readings = e.c.Records, e.c.Readings
	st.Emitted, st.Revisions = e.c.Emitted, e.c.Revisions
	// Parked windows wait in memory, encoded, for the next checkpoint.
	st.OpenWindows, st.EvictedWindows, st.PendingRevisions = e.nWindows, e.nEvicted-e.nParked, len(e.pending)
	st.DedupEntries, st.Devices, st.Tombstones = e.nDedup, e.devices.len(), len(e.tombstones)
	st.TombstonesDropped, st.TombstoneFloor = e.c.TombstonesDropped, time.Time{}
	if e.tombFloor != noTime {
		st.TombstoneFloor = time.UnixMilli(e.tombFloor).UTC()
	}
	st.StateBytes = e.stateBytes()
	st.Late, st.LateRows, st.LateEvicted = e.c.Late, e.c.LateRows, e.c.LateEvicted
	st.Duplicates = e.c.Duplicates
	st.DeadLetters, st.DeadLetterRows, st.DeadLettersEvicted = dead, e.c.DeadRows, e.c.DeadEvicted
	st.DevicesExpired = e.c.DevicesExpired
	st.LatestEventTime = time.Time{}
	if e.c.MaxEventTime != 0 {
		st.LatestEventTime = time.UnixMilli(e.c.MaxEventTime).UTC()
	}
	st.LoggedClock = time.Time{}
	if e.clock != 0 {
		st.LoggedClock = time.Unix(0, e.clock).UTC()
	}
	st.Blocked = s.blocked
}

// Stats returns a snapshot; it is safe to call from any goroutine.
func (s *Stage) Stats() Stats {
	s.statsMu.Lock()
	st := s.stats
	st.DeadLetters = make(map[string]uint64, len(s.stats.DeadLetters))
	for k, v := range s.stats.DeadLetters {
		st.DeadLetters[k] = v
	}
	st.Checkpoints = make(map[string]uint64, len(checkpointReasons)-1)
	for ck, name := range checkpointReasons {
		if name != "" {
			st.Checkpoints[name] = s.checkpoints[ck]
		}
	}
	s.statsMu.Unlock()
	if !st.LatestEventTime.IsZero() {
		st.Lag = s.cfg.Clock().Sub(st.LatestEventTime)
	}
	return st
}
