package window

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"unsafe"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/internal/boltkv"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// Bucket layout in the state database. Window and dedup keys lead with the
// (order-preserving) time, so a batch of in-order data touches a few
// adjacent pages instead of one page per device.
var (
	// window_meta: offset, logged clock, counters, fingerprint.
	bucketMeta = []byte("window_meta")
	// window_revs: highest revision ever emitted and the revision base.
	// ResetState keeps it so revisions stay monotonic.
	bucketRevs = []byte("window_revs")
	// window_devices: device name → watermark, horizon, last seen, idle
	// flag; the layout before window_device_groups (groups.go).
	bucketDevices = []byte("window_devices")
	// window_windows: start(8) | len+device | metric → aggregates; the
	// layout before window_groups (groups.go), migrated at open.
	bucketWindows = []byte("window_windows")
	// window_dedup: lastEnd(8) | len+device → the event-id hashes (8 bytes
	// each) whose last window ends at lastEnd; the layout before
	// window_dedup_groups (groups.go).
	bucketDedup = []byte("window_dedup")
	// window_tombstones: device name → lateness horizon of an expired device.
	bucketTombstones = []byte("window_tombstones")
	// window_late and window_deadletter: sequence → row.
	bucketLate = []byte("window_late")
	bucketDead = []byte("window_deadletter")

	stateBuckets = [][]byte{bucketMeta, bucketRevs, bucketDeviceGroups, bucketWindowGroups, bucketDedupGroups, bucketTombstones, bucketLate, bucketDead}

	keyOffset      = []byte("offset")
	keyClock       = []byte("clock")
	keyCounters    = []byte("counters")
	keyFingerprint = []byte("fingerprint")
	keyHighRev     = []byte("high")
	keyRevBase     = []byte("base")
	keyProgress    = []byte("progress")
	keyBehaviour   = []byte("behaviour")
	keyGen         = []byte("gen")
	// keyTombFloor holds engine.tombFloor while there is one.
	keyTombFloor = []byte("tombfloor")
	// keyLastStamp holds engine.lastStamp (absent before it was kept: the
	// logged clock stands in).
	keyLastStamp = []byte("stamp")
	// keyMaxSkew holds the largest readings.max_future_skew the stage has
	// run with (Stage.recordSkewHigh).
	keyMaxSkew = []byte("maxskew")
)

func createBuckets(tx *bolt.Tx) error {
	if err := outbox.Init(tx); err != nil {
		return err
	}
	for _, name := range stateBuckets {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}

func parseWindowKey(k []byte) (start int64, dev, metric string, err error) {
	if len(k) < 9 {
		return 0, "", "", fmt.Errorf("%w: window key %x", ErrCorruptState, k)
	}
	d := decoder{b: k[8:]}
	dev = d.string()
	if d.err != nil {
		return 0, "", "", fmt.Errorf("%w: window key %x", ErrCorruptState, k)
	}
	return fromOrdered(binary.BigEndian.Uint64(k)), dev, string(d.b), nil
}

// decodeDedupIDs decodes a dedup row's value (its length is a multiple of 8).
func decodeDedupIDs(v []byte) []uint64 {
	ids := make([]uint64, 0, len(v)/8)
	for ; len(v) >= 8; v = v[8:] {
		ids = append(ids, binary.BigEndian.Uint64(v))
	}
	return ids
}

func appendWindow(b []byte, w *window) []byte {
	var flags byte
	if w.emitted {
		flags |= 1
	}
	if w.pending {
		flags |= 2
	}
	if w.ptime {
		flags |= 4
	}
	b = binary.AppendUvarint(b, uint64(w.rev))
	b = append(b, flags)
	b = binary.AppendUvarint(b, w.count)
	for _, f := range [...]float64{w.sum, w.min, w.max, w.first, w.last} {
		b = appendFloat(b, f)
	}
	b = binary.AppendVarint(b, w.firstT)
	b = binary.AppendVarint(b, w.lastT)
	b = binary.AppendUvarint(b, w.firstSeq)
	return binary.AppendUvarint(b, w.lastSeq)
}

func decodeWindow(v []byte, w *window) error {
	d := decoder{b: v}
	w.rev = uint32(d.uvarint())
	if len(d.b) < 1 {
		return fmt.Errorf("%w: window row", ErrCorruptState)
	}
	flags := d.b[0]
	d.b = d.b[1:]
	w.emitted, w.pending, w.ptime = flags&1 != 0, flags&2 != 0, flags&4 != 0
	w.count = d.uvarint()
	w.sum, w.min, w.max, w.first, w.last = d.float(), d.float(), d.float(), d.float(), d.float()
	w.firstT, w.lastT = d.varint(), d.varint()
	w.firstSeq, w.lastSeq = d.uvarint(), d.uvarint()
	if d.err != nil {
		return fmt.Errorf("%w: window row: %v", ErrCorruptState, d.err)
	}
	return nil
}

func appendDevice(b []byte, d *device) []byte {
	var flags byte
	if d.hasMax {
		flags |= 1
	}
	if d.idle {
		flags |= 2
	}
	b = append(b, flags)
	b = binary.AppendVarint(b, d.maxT)
	b = binary.AppendVarint(b, d.finalBefore)
	return binary.AppendVarint(b, d.lastSeen)
}

func decodeDevice(v []byte, d *device) error {
	if len(v) < 1 {
		return fmt.Errorf("%w: device row", ErrCorruptState)
	}
	dec := decoder{b: v[1:]}
	d.hasMax, d.idle = v[0]&1 != 0, v[0]&2 != 0
	d.maxT, d.finalBefore, d.lastSeen = dec.varint(), dec.varint(), dec.varint()
	if dec.err != nil {
		return fmt.Errorf("%w: device row: %v", ErrCorruptState, dec.err)
	}
	return nil
}

func appendCounters(b []byte, c *counters) []byte {
	for _, v := range []uint64{c.Records, c.Ticks, c.Readings, c.Emitted, c.Revisions, c.Late, c.LateEvicted,
		c.Duplicates, c.DeadEvicted, c.LateRows, c.DeadRows, c.DevicesExpired} {
		b = binary.AppendUvarint(b, v)
	}
	b = binary.AppendVarint(b, c.MaxEventTime)
	b = binary.AppendUvarint(b, uint64(len(c.Dead)))
	for _, v := range c.Dead {
		b = binary.AppendUvarint(b, v)
	}
	return binary.AppendUvarint(b, c.TombstonesDropped)
}

func decodeCounters(v []byte, c *counters) error {
	d := decoder{b: v}
	for _, p := range []*uint64{&c.Records, &c.Ticks, &c.Readings, &c.Emitted, &c.Revisions, &c.Late, &c.LateEvicted,
		&c.Duplicates, &c.DeadEvicted, &c.LateRows, &c.DeadRows, &c.DevicesExpired} {
		*p = d.uvarint()
	}
	c.MaxEventTime = d.varint()
	n := d.uvarint()
	for i := uint64(0); i < n && d.err == nil; i++ {
		v := d.uvarint()
		if i < uint64(len(c.Dead)) {
			c.Dead[i] = v
		}
	}
	if len(d.b) > 0 {
		c.TombstonesDropped = d.uvarint()
	}
	if d.err != nil {
		return fmt.Errorf("%w: counters: %v", ErrCorruptState, d.err)
	}
	return nil
}

// appendProgress encodes the progress record: the last Bronze sequence
// whose outputs are committed and the counters of the output tables, which
// describe the tables and not the replayable state.
func appendProgress(b []byte, e *engine) []byte {
	// Mid-replay the outputs stay written through suppressThrough.
	for _, v := range [...]uint64{max(e.offset, e.suppressThrough), e.c.LateRows, e.c.DeadRows, e.c.LateEvicted, e.c.DeadEvicted} {
		b = binary.AppendUvarint(b, v)
	}
	return b
}

// applyProgress makes e write no outputs for records up to the progress
// offset. The table counters it carries are not read back: loadEngine
// counts the rows themselves (a checkpoint stores its counters before its
// own batch's rows, so neither record alone was right after a restart).
func applyProgress(v []byte, e *engine) error {
	d := decoder{b: v}
	through := d.uvarint()
	for range 4 {
		d.uvarint()
	}
	if d.err != nil {
		return fmt.Errorf("%w: progress: %v", ErrCorruptState, d.err)
	}
	if through > e.offset {
		e.suppressThrough = through
	}
	return nil
}

func putU64(b *bolt.Bucket, k []byte, v uint64) error {
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], v)
	if err := b.Put(k, buf[:]); err != nil {
		return fmt.Errorf("put %s: %w", k, err)
	}
	return nil
}

func getU64(b *bolt.Bucket, k []byte) uint64 {
	if b == nil {
		return 0
	}
	v := b.Get(k)
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

// CheckState reports whether New would accept cfg over the state in db:
// the config is valid and matches the stored fingerprint (an error
// matching ErrIncompatibleState if not). It reads only; a reload checks a
// config with it before it stops the running stage.
func CheckState(db *bolt.DB, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	return db.View(func(tx *bolt.Tx) error {
		m := tx.Bucket(bucketMeta)
		if m == nil {
			return nil
		}
		_, err := compareStored(m, &cfg)
		return err
	})
}

// identityKeys are the fingerprint's settings that make a window's
// identity at the receiver (gateway, device, metric, start).
var identityKeys = []string{"gateway_id", "window.size", "window.slide"}

// checkIdentity compares cfg's identity settings with the saved state's,
// if it has a fingerprint.
func checkIdentity(db *bolt.DB, cfg Config) error {
	identity := func(items []fingerprintItem) []fingerprintItem {
		return slices.DeleteFunc(items, func(it fingerprintItem) bool { return !slices.Contains(identityKeys, it.Key) })
	}
	return db.View(func(tx *bolt.Tx) error {
		m := tx.Bucket(bucketMeta)
		if m == nil {
			return nil
		}
		raw := m.Get(keyFingerprint)
		if raw == nil {
			return nil
		}
		old, err := decodeFingerprint(raw)
		if err != nil {
			return err
		}
		return compareFingerprint(identity(old), identity(cfg.fingerprint()), cfg.ConfigPath)
	})
}

// compareStored compares cfg with the fingerprint stored in m, if one is
// (stored says so).
func compareStored(m *bolt.Bucket, cfg *Config) (stored bool, err error) {
	raw := m.Get(keyFingerprint)
	if raw == nil {
		return false, nil
	}
	old, err := decodeFingerprint(raw)
	if err != nil {
		return true, err
	}
	return true, compareFingerprint(old, cfg.fingerprint(), cfg.ConfigPath)
}

// checkFingerprint stores the fingerprint on first use and refuses a
// changed one. A stored fingerprint that matches but is not the current
// one byte for byte was saved before one of laterKeys counted: it is
// stored again, with them.
func checkFingerprint(tx *bolt.Tx, cfg *Config) error {
	m := tx.Bucket(bucketMeta)
	if _, err := compareStored(m, cfg); err != nil {
		return err
	}
	cur := encodeFingerprint(cfg.fingerprint())
	if bytes.Equal(m.Get(keyFingerprint), cur) {
		return nil
	}
	if err := m.Put(keyFingerprint, cur); err != nil {
		return fmt.Errorf("store fingerprint: %w", err)
	}
	return nil
}

// loadEngine builds an engine from the stored state. With a load hook,
// emitted windows without pending changes stay on disk, registered as
// evicted: most are never touched again.
//
// The group versions that no longer serve (see slotted) are listed in
// sweep, for the next checkpoint to delete.
func loadEngine(tx *bolt.Tx, cfg *Config, load func(dev, metric string, start int64) (*window, error),
	loadDedup func(dev string, end int64) ([]uint64, error), sweep *groupSweep) (*engine, error) {
	e := newEngine(cfg)
	e.load, e.loadDedup = load, loadDedup
	m := tx.Bucket(bucketMeta)
	e.gen = getU64(m, keyGen)
	e.offset = getU64(m, keyOffset)
	e.clock = int64(getU64(m, keyClock))
	e.lastStamp = e.clock
	if m.Get(keyLastStamp) != nil {
		e.lastStamp = int64(getU64(m, keyLastStamp))
	}
	if v := m.Get(keyCounters); v != nil {
		if err := decodeCounters(v, &e.c); err != nil {
			return nil, err
		}
	}
	if v := m.Get(keyProgress); v != nil {
		if err := applyProgress(v, e); err != nil {
			return nil, err
		}
	}
	// The bounds evict by these counts: taken from the rows themselves,
	// which states saved by earlier builds counted a checkpoint's own rows
	// short, once per restart.
	e.c.LateRows = uint64(tx.Bucket(bucketLate).Stats().KeyN)
	e.c.DeadRows = uint64(tx.Bucket(bucketDead).Stats().KeyN)
	e.c.deriveEvicted()
	r := tx.Bucket(bucketRevs)
	e.highRev = uint32(getU64(r, keyHighRev))
	e.revBase = uint32(getU64(r, keyRevBase))
	if e.suppressThrough > e.offset && !bytes.Equal(m.Get(keyBehaviour), cfg.behaviour()) {
		// The outputs through suppressThrough were decided under other
		// settings (or ones this build did not record): see deferReplayed.
		e.deferReplayed = true
		e.revBase = max(e.revBase, e.highRev)
		e.clearRows, e.clearRowsAfter = true, e.offset
	}
	var devs []*device
	err := eachGroup(tx.Bucket(bucketDeviceGroups), deviceKeyLen, e.gen, &sweep[sweepDevices], func(_, v []byte) error {
		return eachEntry(v, func(en groupEntry) error {
			name := string(en.dev)
			d := &device{name: name, nextEmit: endless, nextPrune: endless, shard: shardOf(name)}
			if err := decodeDevice(en.payload, d); err != nil {
				return fmt.Errorf("device %q: %w", en.dev, err)
			}
			e.devices.put(d)
			devs = append(devs, d)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	err = eachTimedEntry(tx.Bucket(bucketWindowGroups), e.gen, &sweep[sweepWindows], func(start int64, en groupEntry) error {
		d := e.devices.get(string(en.dev))
		if d == nil {
			// Its device expired, and the delete of this final window
			// waits for the group's last (see deferDeletes).
			return nil
		}
		ser := e.seriesOf(d, en.metric)
		if ser == nil {
			ser = e.addSeries(d, en.metric)
		}
		var w window
		if err := decodeWindow(en.payload, &w); err != nil {
			return err
		}
		e.nWindows++
		if load != nil && w.emitted && !w.pending {
			ser.evicted.add(start, e.slideMs)
			e.nEvicted++
			return nil
		}
		w.ser, w.start = ser.id, start
		wp := new(window) // only these go to the heap
		*wp = w
		ser.windows = append(ser.windows, wp)
		if w.pending {
			e.pending[wp] = struct{}{}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = eachTimedEntry(tx.Bucket(bucketDedupGroups), e.gen, &sweep[sweepDedup], func(le int64, en groupEntry) error {
		d := e.devices.get(string(en.dev))
		if d == nil {
			// Its device expired, and its delete waits for the row's last
			// group in state (see deferDeletes).
			return nil
		}
		if len(en.payload)%8 != 0 {
			return fmt.Errorf("%w: dedup group of %q at %s", ErrCorruptState, en.dev, fmtMs(le))
		}
		ids := decodeDedupIDs(en.payload)
		// Groups the watermark has passed are cold, as a checkpoint
		// leaves them (see dedupSet).
		if loadDedup != nil && le <= e.coldThrough(d) {
			d.dedup.loadCold(le, ids)
		} else {
			d.dedup.load(le, ids)
		}
		e.nDedup += len(ids)
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = tx.Bucket(bucketTombstones).ForEach(func(k, v []byte) error {
		h, n := binary.Varint(v)
		if n <= 0 {
			return fmt.Errorf("%w: tombstone %q", ErrCorruptState, k)
		}
		e.tombstones[string(k)] = h
		return nil
	})
	if err != nil {
		return nil, err
	}
	if v := m.Get(keyTombFloor); v != nil {
		h, n := binary.Varint(v)
		if n <= 0 {
			return nil, fmt.Errorf("%w: tombstone floor", ErrCorruptState)
		}
		e.tombFloor = h
	}
	if len(e.tombstones) > e.cfg.MaxDevices {
		// Saved under a larger window.max_devices.
		before := e.c.TombstonesDropped
		e.dropTombstones()
		e.droppedAtLoad = e.c.TombstonesDropped - before
	}
	// Lists are ordered by last seen, as the uninterrupted run built them.
	slices.SortFunc(devs, func(a, b *device) int {
		if a.lastSeen != b.lastSeen {
			if a.lastSeen < b.lastSeen {
				return -1
			}
			return 1
		}
		return strings.Compare(a.name, b.name)
	})
	// A dedup group max_past_skew has passed holds no reading the agent
	// takes (older ones are dead letters before dedup), and a dropped one
	// may wait in its row (see deferDeletes) until a device of the same
	// name comes back, its ids counting anew: such groups go now.
	pastCut := floorDiv(e.clock-e.pasNs, 1e6)
	for _, d := range devs {
		if d.idle {
			e.idleList.push(d)
		} else {
			e.active.push(d)
		}
		if pastCut >= d.dedup.minEnd() {
			e.pruneDedup(d, pastCut)
		}
		e.pruneDevice(d) // recomputes due points; prunes nothing that is not already prunable
	}
	// Pruning at load may have queued deletes of rows already final; the
	// next batch writes them.
	return e, nil
}

// writeOutputs writes the batch's outputs in tx: outbox entries (and
// their observer), late and dead-letter rows, the highest revision, and the
// progress record that says through which Bronze record they are written.
func (s *Stage) writeOutputs(tx *bolt.Tx) error {
	e := s.eng
	ob, err := outbox.NewAppender(tx, &s.arena)
	if err != nil {
		return err
	}
	for i := range e.out {
		em := &e.out[i]
		var a *wire.Aggregate
		if s.cfg.Observer != nil {
			// The observer may keep it past the batch: figures of its own.
			a = e.detachedAggregate(*em)
		} else {
			// One for the batch: a local would escape, an allocation
			// per emission. So would its key, a string only until the
			// encoding below copies it (2 % of load mode's allocations).
			s.keyBuf = e.appendKey(s.keyBuf[:0], em)
			s.agg = e.aggregateKeyed(em, unsafe.String(unsafe.SliceData(s.keyBuf), len(s.keyBuf)))
			a = &s.agg
		}
		s.encBuf = wire.AppendAggregate(s.encBuf[:0], a)
		if _, err := ob.Append(outbox.KindAggregate, em.at, s.encBuf); err != nil {
			return fmt.Errorf("append aggregate %s: %w", a.Key, err)
		}
		if s.cfg.Observer != nil {
			if err := s.cfg.Observer.Emitted(tx, a, em.at); err != nil {
				return fmt.Errorf("observer for %s: %w", a.Key, err)
			}
		}
	}
	if err := ob.Close(); err != nil {
		return err
	}
	if err := writeRows(tx, e, &s.arena); err != nil {
		return err
	}
	if e.revsDirty {
		r := tx.Bucket(bucketRevs)
		if err := putU64(r, keyHighRev, uint64(e.highRev)); err != nil {
			return err
		}
	}
	if err := tx.Bucket(bucketMeta).Put(keyProgress, appendProgress(nil, e)); err != nil {
		return fmt.Errorf("put progress: %w", err)
	}
	return nil
}

// writeCheckpoint writes the state delta since the last checkpoint as
// generation e.gen+1 through w, whose open transaction must then commit
// for it to count (see slotted), with the offset, clock and counters it
// corresponds to. A restart loads this state and replays Bronze after its
// offset. It first deletes the group versions in sweep, and returns those
// that stop serving once it commits.
func writeCheckpoint(w *chunkWriter, e *engine, sweep *groupSweep) (groupSweep, error) {
	for i, keys := range sweep {
		if err := sweepGroups(w, groupBuckets[i].name, keys); err != nil {
			return groupSweep{}, err
		}
	}
	gen := e.gen + 1
	var next groupSweep
	// Time-led group keys come in key order, so most inserts extend a run
	// of keys: bbolt's default half-full splits would leave twice the pages
	// to write now and to hold in memory whenever a later checkpoint
	// touches them. Windows go first, in portions of start times in key
	// order (see windowPortion); the others then reuse their array (a
	// load-mode checkpoint's three arrays took 7 MB together).
	// One array for all, made at the size the largest needs: grown by
	// appends, every doubling left the array before it as garbage (load
	// mode: 4 % of all the agent allocated).
	deferWindows := func(c []rowChange) []rowChange { return e.deferDeletes(c, e.holdsWindow) }
	ends, largest := windowPortions(e)
	changes := make([]rowChange, 0, max(largest, e.dedupRows, len(e.delDevs)+len(e.dirtyDevs)))
	lo := int64(math.MinInt64)
	for _, hi := range ends {
		changes = windowChanges(changes[:0], e, lo, hi)
		if err := writeGroups(w, bucketWindowGroups, stateFill, changes, gen, e.gen, &next[sweepWindows], deferWindows); err != nil {
			return groupSweep{}, err
		}
		lo = hi + 1
	}
	// The parked windows are in their rows now (committed, or in w.tx as
	// copies): nothing reads their arena again, so it goes before the
	// devices' and dedup groups' rows and pages are held. It was fullest
	// right here, and a collection during the rest of the checkpoint set
	// the heap's floor from both (docs/performance.md, session 49). A
	// failed checkpoint reloads the engine from the file (Stage.rollback).
	e.releaseParked()
	changes = deviceChanges(changes[:0], e)
	if err := writeGroups(w, bucketDeviceGroups, 0, changes, gen, e.gen, &next[sweepDevices], nil); err != nil {
		return groupSweep{}, err
	}
	if err := writeGroups(w, bucketDedupGroups, stateFill, dedupChanges(changes[:0], e), gen, e.gen, &next[sweepDedup],
		func(c []rowChange) []rowChange { return e.deferDeletes(c, holdsDedup) }); err != nil {
		return groupSweep{}, err
	}

	// The rest is small and goes in the last transaction, which makes the
	// generation count.
	tx := w.tx
	m := tx.Bucket(bucketMeta)
	if err := putU64(m, keyGen, gen); err != nil {
		return groupSweep{}, err
	}
	if err := putU64(m, keyOffset, e.offset); err != nil {
		return groupSweep{}, err
	}
	if err := putU64(m, keyClock, uint64(e.clock)); err != nil {
		return groupSweep{}, err
	}
	if err := putU64(m, keyLastStamp, uint64(e.lastStamp)); err != nil {
		return groupSweep{}, err
	}
	if err := m.Put(keyCounters, appendCounters(nil, &e.c)); err != nil {
		return groupSweep{}, fmt.Errorf("put counters: %w", err)
	}
	// The settings the outputs from here on are decided under — only once
	// a catch-up is done: a checkpoint in its middle (shutdown, a large
	// delta, a full Bronze) must leave the old ones, or the next start
	// would take the rest of the catch-up for written under these — and
	// the revision floor a deferred catch-up may have raised.
	if e.offset >= e.suppressThrough {
		if err := m.Put(keyBehaviour, e.cfg.behaviour()); err != nil {
			return groupSweep{}, fmt.Errorf("put behaviour: %w", err)
		}
	}
	if err := putU64(tx.Bucket(bucketRevs), keyRevBase, uint64(e.revBase)); err != nil {
		return groupSweep{}, err
	}
	tb := tx.Bucket(bucketTombstones)
	for _, name := range e.tombDel {
		if err := tb.Delete([]byte(name)); err != nil {
			return groupSweep{}, fmt.Errorf("delete tombstone: %w", err)
		}
	}
	for _, name := range e.tombPut {
		if h, ok := e.tombstones[name]; ok {
			if err := tb.Put([]byte(name), binary.AppendVarint(nil, h)); err != nil {
				return groupSweep{}, fmt.Errorf("put tombstone: %w", err)
			}
		}
	}
	if e.tombFloorDirty {
		var err error
		if e.tombFloor == noTime {
			err = m.Delete(keyTombFloor)
		} else {
			err = m.Put(keyTombFloor, binary.AppendVarint(nil, e.tombFloor))
		}
		if err != nil {
			return groupSweep{}, fmt.Errorf("write tombstone floor: %w", err)
		}
	}
	return next, nil
}

func encodeAggregate(a *wire.Aggregate) ([]byte, error) {
	data, err := wire.EncodeAggregate(a)
	if err != nil {
		return nil, fmt.Errorf("encode aggregate %s: %w", a.Key, err)
	}
	return data, nil
}

// writeRows appends the batch's late and dead-letter rows, cut from ar,
// and evicts the oldest beyond the caps.
func writeRows(tx *bolt.Tx, e *engine, ar *boltkv.Arena) error {
	lb := tx.Bucket(bucketLate)
	if e.clearRows {
		if err := deleteRowsAfter(lb, e.clearRowsAfter, &e.c.LateRows); err != nil {
			return fmt.Errorf("delete the late rows the catch-up writes again: %w", err)
		}
		if err := deleteRowsAfter(tx.Bucket(bucketDead), e.clearRowsAfter, &e.c.DeadRows); err != nil {
			return fmt.Errorf("delete the dead-letter rows the catch-up writes again: %w", err)
		}
		e.clearRows = false // a failed commit reloads the state, which sets it again
	}
	for i := range e.lates {
		if err := putRow(lb, ar.Cut(appendLate(ar.Room(128), &e.lates[i]))); err != nil {
			return fmt.Errorf("put late row: %w", err)
		}
	}
	e.c.LateRows += uint64(len(e.lates))
	if err := evict(lb, &e.c.LateRows, uint64(e.cfg.MaxLateRows)); err != nil {
		return fmt.Errorf("evict late rows: %w", err)
	}
	db := tx.Bucket(bucketDead)
	for i := range e.dls {
		if err := putRow(db, ar.Cut(appendDead(ar.Room(256), &e.dls[i]))); err != nil {
			return fmt.Errorf("put dead-letter row: %w", err)
		}
	}
	e.c.DeadRows += uint64(len(e.dls))
	if err := evict(db, &e.c.DeadRows, uint64(e.cfg.MaxDeadLetterRows)); err != nil {
		return fmt.Errorf("evict dead-letter rows: %w", err)
	}
	e.c.deriveEvicted()
	return nil
}

// deriveEvicted sets the evicted counts from what they must be: every late
// reading and dead letter was written as a row, so those not in the table
// were evicted. Counted one by one instead, a catch-up under changed
// settings counted again the evictions since the checkpoint, whose rows
// it deletes and writes anew (an audit: 5 late readings, 2 rows, 6
// evicted). During a catch-up Late and Dead are below the rows until it
// is done.
func (c *counters) deriveEvicted() {
	var dead uint64
	for _, n := range c.Dead {
		dead += n
	}
	c.LateEvicted = c.Late - min(c.Late, c.LateRows)
	c.DeadEvicted = dead - min(dead, c.DeadRows)
}

// stateFill is how full bbolt packs the window and dedup buckets' pages.
const stateFill = 0.9

// Upper bounds of an encoded window and device value (Arena.Room hints: a longer
// value is still cut correctly, from a fresh chunk).
const (
	maxWindowBytes = binary.MaxVarintLen32 + 1 + 5*8 + 5*binary.MaxVarintLen64
	maxDeviceBytes = 1 + 3*binary.MaxVarintLen64
)

func putRow(b *bolt.Bucket, v []byte) error {
	seq, err := b.NextSequence()
	if err != nil {
		return err
	}
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	return b.Put(k[:], v)
}

// deleteRowsAfter deletes the late or dead-letter rows of Bronze records
// after seq and takes them off *rows, as evict does. Rows are appended in
// Bronze order (a catch-up's after the deletion that precedes it), so they
// are the bucket's last.
func deleteRowsAfter(b *bolt.Bucket, seq uint64, rows *uint64) error {
	var keys [][]byte
	c := b.Cursor()
	for k, v := c.Last(); k != nil; k, v = c.Prev() {
		// Both rows' encodings begin with the record's sequence.
		if s, n := binary.Uvarint(v); n <= 0 || s <= seq {
			break
		}
		keys = append(keys, bytes.Clone(k))
	}
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return err
		}
		*rows -= min(1, *rows)
	}
	return nil
}

// evict deletes the oldest rows while *rows, their count, is over limit.
func evict(b *bolt.Bucket, rows *uint64, limit uint64) error {
	c := b.Cursor()
	for *rows > limit {
		k, _ := c.First()
		if k == nil {
			*rows = 0
			break
		}
		if err := c.Delete(); err != nil {
			return err
		}
		*rows--
	}
	return nil
}
