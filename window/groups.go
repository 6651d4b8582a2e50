package window

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/internal/boltkv"
)

// Windows are stored in groups: one state row per (window start, shard of
// the device name) holding the windows of every metric of the devices of
// that shard at that start. A bbolt row costs far more than its bytes: in
// load mode (10,000 devices) a checkpoint wrote about 65,000 window rows,
// and bbolt spent about 900 bytes of heap on each (its inode in a leaf
// node that grows by append until the commit splits it, a cursor stack, a
// key copy, page buffers), the larger part of the checkpoint's CPU and of
// the agent's garbage. With groups that checkpoint writes a few thousand
// rows of about a kilobyte.
//
// A checkpoint merges a group's changed windows into its stored row (the
// row holds evicted windows the engine no longer has in memory), so a
// group is read and rewritten whole; with windowShards shards a group of a
// 10,000-device fleet holds about ten devices, and a small fleet's group is
// a device's metrics at one start. Keys lead with the start, as the
// per-window rows did, so in-order data touches a few adjacent pages.
//
// Row: start (8, order-preserving) | shard (2) → entries sorted by (device,
// metric), each the device and metric as length-prefixed strings and the
// window's encoding (appendWindow) as length-prefixed bytes.

// bucketWindowGroups holds the window groups; bucketWindows is the layout
// before them (a row per window), migrated at open.
var bucketWindowGroups = []byte("window_groups")

// windowShards is part of the stored layout: changing it needs a
// migration. It is a variable only so tests can put several devices in a
// group.
var windowShards uint32 = 1024

// shardOf is the FNV-1a hash of the device name modulo windowShards.
func shardOf(dev string) uint16 {
	h := uint32(2166136261)
	for i := 0; i < len(dev); i++ {
		h ^= uint32(dev[i])
		h *= 16777619
	}
	return uint16(h % windowShards)
}

func appendGroupKey(k []byte, start int64, shard uint16) []byte {
	k = binary.BigEndian.AppendUint64(k, orderedInt(start))
	return binary.BigEndian.AppendUint16(k, shard)
}

func parseGroupKey(k []byte) (start int64, shard uint16, err error) {
	if len(k) != 10 {
		return 0, 0, fmt.Errorf("%w: window group key %x", ErrCorruptState, k)
	}
	return fromOrdered(binary.BigEndian.Uint64(k)), binary.BigEndian.Uint16(k[8:]), nil
}

// groupEntry is one window of a group row; win is its encoding.
type groupEntry struct{ dev, metric, win []byte }

// eachEntry calls fn with each entry of the group row v, in order.
func eachEntry(v []byte, fn func(groupEntry) error) error {
	d := decoder{b: v}
	for len(d.b) > 0 {
		en := groupEntry{dev: d.bytes(), metric: d.bytes(), win: d.bytes()}
		if d.err != nil {
			return fmt.Errorf("%w: window group row: %v", ErrCorruptState, d.err)
		}
		if err := fn(en); err != nil {
			return err
		}
	}
	return nil
}

// findEntry returns the encoding of dev's window of metric in the group row
// v, or nil.
func findEntry(v []byte, dev, metric string) ([]byte, error) {
	var win []byte
	err := eachEntry(v, func(en groupEntry) error {
		if string(en.dev) == dev && string(en.metric) == metric {
			win = en.win
		}
		return nil
	})
	return win, err
}

func appendEntry(b []byte, dev, metric string, win []byte) []byte {
	b = appendString(b, dev)
	b = appendString(b, metric)
	return appendBytes(b, win)
}

// winRef names a stored window the next checkpoint deletes.
type winRef struct {
	start       int64
	dev, metric string
}

// winChange is one window a checkpoint puts (w) or deletes (w nil).
type winChange struct {
	start       int64
	shard       uint16
	dev, metric string
	w           *window
}

func compareChanges(a, b winChange) int {
	if c := cmp.Compare(a.start, b.start); c != 0 {
		return c
	}
	if c := cmp.Compare(a.shard, b.shard); c != 0 {
		return c
	}
	return compareEntry(a.dev, a.metric, b.dev, b.metric)
}

// compareEntry is the order of the entries in a group row.
func compareEntry(devA, metricA, devB, metricB string) int {
	if c := strings.Compare(devA, devB); c != 0 {
		return c
	}
	return strings.Compare(metricA, metricB)
}

// writeWindows merges the checkpoint's window deletes and puts into their
// group rows. A window both deleted and put in one checkpoint ends put, as
// the deletes happened before (an expired device that came back).
func writeWindows(b *bolt.Bucket, e *engine, ar *boltkv.Arena) error {
	changes := make([]winChange, 0, len(e.delWins)+len(e.dirtyWins))
	for _, r := range e.delWins {
		changes = append(changes, winChange{start: r.start, shard: shardOf(r.dev), dev: r.dev, metric: r.metric})
	}
	for _, w := range e.dirtyWins {
		if !w.dead {
			dev := w.ser.dev.name
			changes = append(changes, winChange{start: w.start, shard: shardOf(dev), dev: dev, metric: w.ser.name, w: w})
		}
	}
	// Stable: of the changes to one window, the last (a put) applies.
	slices.SortStableFunc(changes, compareChanges)
	var key, win []byte
	for i := 0; i < len(changes); {
		j := i + 1
		for j < len(changes) && changes[j].start == changes[i].start && changes[j].shard == changes[i].shard {
			j++
		}
		key = appendGroupKey(key[:0], changes[i].start, changes[i].shard)
		old := b.Get(key)
		v := ar.Room(len(old) + (j-i)*(maxWindowBytes+48))
		n := len(v)
		var err error
		v, win, err = mergeGroup(v, win, old, changes[i:j])
		if err != nil {
			return fmt.Errorf("window group at %s: %w", fmtMs(changes[i].start), err)
		}
		switch {
		case len(v) > n:
			if err := b.Put(key, ar.Cut(v)); err != nil {
				return fmt.Errorf("put window group: %w", err)
			}
		case old != nil:
			if err := b.Delete(key); err != nil {
				return fmt.Errorf("delete window group: %w", err)
			}
		}
		i = j
	}
	return nil
}

// mergeGroup appends to out the entries of the stored row old with the
// sorted changes applied; win is scratch for a window's encoding.
func mergeGroup(out, win, old []byte, changes []winChange) ([]byte, []byte, error) {
	d := decoder{b: old}
	var cur groupEntry
	next := func() bool {
		if len(d.b) == 0 {
			return false
		}
		cur = groupEntry{dev: d.bytes(), metric: d.bytes(), win: d.bytes()}
		return d.err == nil
	}
	haveOld := next()
	for k := 0; k < len(changes) || haveOld; {
		if k < len(changes) {
			c := changes[k]
			// The last of the changes to this window applies.
			for k+1 < len(changes) && changes[k+1].dev == c.dev && changes[k+1].metric == c.metric {
				k++
				c = changes[k]
			}
			order := -1
			if haveOld {
				order = compareEntry(c.dev, c.metric, string(cur.dev), string(cur.metric))
			}
			if order <= 0 {
				if c.w != nil {
					win = appendWindow(win[:0], c.w)
					out = appendEntry(out, c.dev, c.metric, win)
				}
				k++
				if order == 0 {
					haveOld = next()
				}
				continue
			}
		}
		out = appendEntry(out, string(cur.dev), string(cur.metric), cur.win)
		haveOld = next()
	}
	if d.err != nil {
		return out, win, fmt.Errorf("%w: window group row: %v", ErrCorruptState, d.err)
	}
	return out, win, nil
}

// migrateWindowRows moves the windows of the layout before groups (a row
// per window, keyed start | device | metric) into group rows and drops its
// bucket; the values are the same window encoding.
func migrateWindowRows(tx *bolt.Tx) error {
	old := tx.Bucket(bucketWindows)
	if old == nil {
		return nil
	}
	type row struct {
		winChange
		v []byte
	}
	var rows []row
	err := old.ForEach(func(k, v []byte) error {
		start, dev, metric, err := parseWindowKey(k)
		if err != nil {
			return err
		}
		rows = append(rows, row{winChange{start: start, shard: shardOf(dev), dev: dev, metric: metric}, bytes.Clone(v)})
		return nil
	})
	if err != nil {
		return fmt.Errorf("migrate window rows: %w", err)
	}
	slices.SortFunc(rows, func(a, b row) int { return compareChanges(a.winChange, b.winChange) })
	groups := tx.Bucket(bucketWindowGroups)
	var key, val []byte
	for i := 0; i < len(rows); {
		val = val[:0]
		j := i
		for ; j < len(rows) && rows[j].start == rows[i].start && rows[j].shard == rows[i].shard; j++ {
			val = appendEntry(val, rows[j].dev, rows[j].metric, rows[j].v)
		}
		key = appendGroupKey(key[:0], rows[i].start, rows[i].shard)
		if err := groups.Put(key, bytes.Clone(val)); err != nil {
			return fmt.Errorf("migrate window rows: put group: %w", err)
		}
		i = j
	}
	if err := tx.DeleteBucket(bucketWindows); err != nil {
		return fmt.Errorf("migrate window rows: drop the old bucket: %w", err)
	}
	return nil
}
