package window

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/buffer/outbox"
)

// ResetState drops all window state, the late and dead-letter rows, the
// counters, the fingerprint and the offset, so the next New accepts any
// configuration and rebuilds state from the retained Bronze. The outbox is
// kept, and so is the highest revision ever emitted: rebuilt windows are
// numbered above it, so a receiver keeping the highest revision takes the
// rebuilt content. So is the largest max_future_skew run with (Replay).
func ResetState(db *bolt.DB) error {
	err := db.Update(func(tx *bolt.Tx) error {
		// The largest max_future_skew run with stays too: Bronze holds
		// records decided under it (see storedFutureSkew).
		var maxSkew []byte
		if m := tx.Bucket(bucketMeta); m != nil {
			maxSkew = bytes.Clone(m.Get(keyMaxSkew))
		}
		// The row-per-entry layout's buckets too: not yet migrated, they
		// would be at the next New.
		for _, name := range append(slices.Clone(stateBuckets), bucketWindows, bucketDedup, bucketDevices) {
			if string(name) == string(bucketRevs) {
				continue
			}
			if err := tx.DeleteBucket(name); err != nil && !errors.Is(err, bolt.ErrBucketNotFound) {
				return fmt.Errorf("delete bucket %s: %w", name, err)
			}
		}
		if err := createBuckets(tx); err != nil {
			return err
		}
		if maxSkew != nil {
			if err := tx.Bucket(bucketMeta).Put(keyMaxSkew, maxSkew); err != nil {
				return fmt.Errorf("keep the largest max_future_skew: %w", err)
			}
		}
		r := tx.Bucket(bucketRevs)
		return putU64(r, keyRevBase, getU64(r, keyHighRev))
	})
	if err != nil {
		return fmt.Errorf("reset window state: %w", err)
	}
	return nil
}

// replayBatch is how many Bronze records Replay reads at a time, and how
// many aggregates it writes per transaction.
const replayBatch = 10_000

// Replay is the batch path: it recomputes every window whose start is in
// [from, to) from all retained Bronze, parsed with cfg (so records that were
// dead-lettered under an old config count if they parse now), deduplicated
// on (device, event id) over the whole retained log, with no lateness
// cut-off and no device cap. Each window is emitted into the outbox as a new
// revision above the highest ever emitted; the live stage then numbers its
// own later revisions above those. Its result counts the aggregates
// emitted. It does not read or change the live window state.
//
// Memory grows with the number of windows in the range.
//
// How readings are parsed may differ from the saved state's settings (that
// is what a replay is for); what makes a window's identity may not: a
// gateway_id, window.size or window.slide other than the saved state's is
// refused with ErrIncompatibleState, since the windows would carry the
// identities (gateway, device, metric, start) of other windows and
// overwrite them at the receiver.
//
// When Bronze no longer starts at record 1 (trimmed at its retention or
// size bound, or lost), a window may have had readings in the records that
// are gone; replayed from the rest it would replace the whole window at the
// receiver, whose upsert keeps the highest revision. A reading the live
// stage took is at most max_future_skew ahead of its arrival, so only
// windows that start more than the largest skew it ran with after the
// newest trimmed arrival (or the oldest retained, if later) are certainly
// whole: earlier ones are skipped and counted in Partial.
func Replay(db *bolt.DB, src Source, cfg Config, from, to time.Time) (ReplayResult, error) {
	var res ReplayResult
	n, err := replay(db, src, cfg, from, to, &res)
	res.Windows = n
	return res, err
}

// ReplayResult is what Replay did.
type ReplayResult struct {
	// Windows were replayed; Partial were skipped, as Bronze no longer
	// holds every reading they may have had: those starting before
	// WholeFrom, when Bronze's oldest record is not its first.
	Windows, Partial int
	WholeFrom        time.Time
}

func replay(db *bolt.DB, src Source, cfg Config, from, to time.Time, res *ReplayResult) (int, error) {
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	if err := checkIdentity(db, cfg); err != nil {
		return 0, err
	}
	cfg = cfg.withDefaults()
	if !to.After(from) {
		return 0, fmt.Errorf("%w: replay range [%v, %v) is empty", ErrInvalidConfig, from, to)
	}
	fromMs, toMs := from.UnixMilli(), to.UnixMilli()
	liveSkew, err := storedFutureSkew(db, cfg.MaxFutureSkew)
	if err != nil {
		return 0, err
	}
	e := newEngine(&cfg)
	type wkey struct {
		dev, metric string
		start       int64
	}
	wins := map[wkey]*window{}
	devs := map[string]*device{}
	seen := map[string]map[uint64]struct{}{}
	var clock int64
	next := uint64(0)
	wholeMs := int64(math.MinInt64) // windows starting earlier may miss readings
	partial := map[wkey]struct{}{}
	var recs []buffer.Record
	for {
		var err error
		recs, err = src.ReadInto(recs, next, replayBatch)
		if err != nil {
			return 0, fmt.Errorf("replay: read bronze from %d: %w", next, err)
		}
		if next == 0 && len(recs) > 0 && recs[0].Seq > 1 {
			// A reading at most the skew ahead of its arrival is accepted,
			// so a window starting at that very millisecond may hold one.
			wholeMs = floorDiv(trimmedNewest(src, recs[0].ReceivedAt)+int64(liveSkew), 1e6) + 1
			res.WholeFrom = time.UnixMilli(wholeMs).UTC()
		}
		for i := range recs {
			r := &recs[i]
			next = r.Seq + 1
			clock = max(clock, r.ReceivedAt)
			if r.Kind != buffer.KindMessage {
				continue
			}
			devName, prefix, b := e.readMessage(r)
			if b != nil {
				continue
			}
			rd := &e.rd
			ids := seen[devName]
			if rd.hasID {
				if _, dup := ids[rd.id]; dup {
					continue
				}
			}
			used := false
			for _, m := range rd.metrics {
				name := e.metricName(prefix, m.name)
				for s := e.lastStart(rd.t); s > rd.t-e.sizeMs; s -= e.slideMs {
					if s < fromMs || s >= toMs {
						continue
					}
					k := wkey{devName, string(name), s}
					if s < wholeMs {
						partial[k] = struct{}{}
						continue
					}
					w := wins[k]
					if w == nil {
						d := devs[devName]
						if d == nil {
							d = &device{name: devName}
							devs[devName] = d
						}
						ser := &series{dev: d, name: k.metric}
						e.register(ser)
						w = &window{ser: ser.id, start: s}
						wins[k] = w
					}
					w.add(m.v, rd.t, r.Seq, rd.ptime)
					used = true
				}
			}
			if used && rd.hasID {
				if ids == nil {
					ids = map[uint64]struct{}{}
					seen[devName] = ids
				}
				ids[rd.id] = struct{}{}
			}
		}
		if len(recs) == 0 {
			break // a read may stop short of replayBatch at Bronze's byte bound
		}
	}
	all := make([]*window, 0, len(wins))
	for _, w := range wins {
		all = append(all, w)
	}
	slices.SortFunc(all, e.compareWindows)
	at := floorDiv(clock, 1e6)

	var rev uint32
	err = db.Update(func(tx *bolt.Tx) error {
		if err := createBuckets(tx); err != nil {
			return err
		}
		rev = uint32(getU64(tx.Bucket(bucketRevs), keyHighRev))
		if f, ok := src.(revisionFloor); ok {
			// A state.db lost and not yet rebuilt knows fewer revisions
			// than were sent (see raiseToRevisionFloor).
			rev = max(rev, f.RevisionFloor())
		}
		rev++
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("replay: %w", err)
	}
	for len(all) > 0 {
		chunk := all[:min(len(all), replayBatch)]
		all = all[len(chunk):]
		err := db.Update(func(tx *bolt.Tx) error {
			for _, w := range chunk {
				em := e.snapshot(w, rev)
				em.at = at
				a := e.aggregate(&em)
				data, err := encodeAggregate(&a)
				if err != nil {
					return err
				}
				if _, err := outbox.Append(tx, outbox.KindAggregate, at, data); err != nil {
					return fmt.Errorf("append aggregate %s: %w", a.Key, err)
				}
				if cfg.Observer != nil {
					if err := cfg.Observer.Emitted(tx, &a, at); err != nil {
						return fmt.Errorf("observer for %s: %w", a.Key, err)
					}
				}
			}
			r := tx.Bucket(bucketRevs)
			if err := putU64(r, keyHighRev, uint64(rev)); err != nil {
				return err
			}
			return putU64(r, keyRevBase, uint64(rev))
		})
		if err != nil {
			return 0, fmt.Errorf("replay: emit: %w", err)
		}
	}
	res.Partial = len(partial)
	return len(wins), nil
}

// trimmedNewest bounds the received-at of the records Bronze no longer
// holds: the newest it trimmed, and oldestLeft, the oldest record left's,
// for what a log does not say it trimmed (an older build's trims, or a
// lost log), as stamps rise with sequences unless the gateway's clock
// stepped back.
func trimmedNewest(src Source, oldestLeft int64) int64 {
	if t, ok := src.(interface{ TrimmedNewest() int64 }); ok {
		return max(t.TrimmedNewest(), oldestLeft)
	}
	return oldestLeft
}

// storedFutureSkew is the largest readings.max_future_skew the live stage
// has run with since its state began (futureSkewHigh), or def. It, not a
// replay's own (raised to take in readings dead-lettered under a wrong
// clock), bounds how far ahead of its arrival a reading the cloud holds
// may be, and so which windows trimmed records may have had readings in.
func storedFutureSkew(db *bolt.DB, def time.Duration) (time.Duration, error) {
	skew := def
	err := db.View(func(tx *bolt.Tx) error {
		m := tx.Bucket(bucketMeta)
		if m == nil {
			return nil
		}
		high, ok, err := futureSkewHigh(m)
		if ok {
			skew = high
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("replay: read the stored settings: %w", err)
	}
	return skew, nil
}

// futureSkewHigh reads the largest readings.max_future_skew the stage has
// run with (keyMaxSkew), or, in a state from before it was kept, the one
// of its last checkpoint (the stored behaviour); ok is false when the
// state has neither.
func futureSkewHigh(m *bolt.Bucket) (high time.Duration, ok bool, err error) {
	if v := m.Get(keyMaxSkew); v != nil {
		return time.Duration(getU64(m, keyMaxSkew)), true, nil
	}
	if m.Get(keyBehaviour) == nil {
		return 0, false, nil
	}
	items, err := decodeFingerprint(m.Get(keyBehaviour))
	if err != nil {
		return 0, false, err
	}
	for _, it := range items {
		if it.Key == "readings.max_future_skew" {
			d, err := time.ParseDuration(it.Value)
			if err != nil {
				return 0, false, fmt.Errorf("%w: stored readings.max_future_skew %q: %v", ErrCorruptState, it.Value, err)
			}
			return d, true, nil
		}
	}
	return 0, false, nil
}
