package uplink

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// readChunk is how many outbox rows one read takes.
const readChunk = 1024

// sealRoundBytes bounds the rows a sealing round holds, besides its
// count of batches (sealPerRound): the rows stay in memory until the
// round's batches are written, and the round after it is planned
// meanwhile. 32 batches of 500 aggregates are about 3 MB of rows, which
// the heap's goal then doubled in load mode; 1 MiB is 10 or so batches
// of the rig's aggregates, a commit (an fsync) per 5,000 rows in a drain.
const sealRoundBytes = 1 << 20

// rejectedRow is an outbox row of the uplink's kinds that does not decode.
type rejectedRow struct {
	entry  outbox.Entry
	reason string
}

// sealPlan is what one sealing round will write: built in a read
// transaction (decoding and compressing take milliseconds, and the window
// stage must not wait for them), applied in a write transaction.
type sealPlan struct {
	batches  []sealed
	consumed []uint64 // uplink rows that go into batches or are rejected
	rejected []rejectedRow
	// next is where the next round starts reading: past the last sealed
	// row, so local rows before it are not read again.
	next uint64
	// pendingOldest is the oldest EmittedAt of uplink rows left unsealed.
	pendingOldest int64
	// foreign counts rows of kinds the uplink does not know (not local).
	foreign int
	// gen is the sealer generation the plan was made in.
	gen uint64
	// closed are the batches' rows, copied out of the read transaction;
	// build turns them into batches after it, so that compression does not
	// hold a read transaction open (a long reader makes bbolt's writers
	// grow the file instead of reusing pages, and stalls their remaps).
	closed []batchBuilder
}

// build encodes and compresses the planned batches.
func (p *sealPlan) build(u *Uplink) error {
	if len(p.closed) == 0 {
		return nil
	}
	var err error
	p.batches, err = u.buildAll(p.closed)
	p.closed = nil
	return err
}

// batchBuilder accumulates rows into one batch.
type batchBuilder struct {
	aggs, alerts [][]byte
	itemBytes    int
	first, last  uint64
	oldest       int64
	seqs         []uint64
}

func (b *batchBuilder) records() int { return len(b.aggs) + len(b.alerts) }

// plan reads outbox rows from `from` on and groups the uplink's rows into at
// most maxBatches batches. Full batches (MaxBatchRecords rows, or as many as
// fit in MaxBatchBytes) are always sealed; a last, partial batch only when
// partial is true — while the link is down, rows wait to fill whole batches,
// which compress better and cost fewer round trips later.
func (u *Uplink) plan(tx *bolt.Tx, from uint64, maxBatches int, partial bool) (p sealPlan, err error) {
	p = sealPlan{next: from}
	var cur batchBuilder
	var closed []batchBuilder
	// The id's length is not known until the batch is closed; size the
	// body with the longest id it can have so the bound always holds.
	longestID := strings.Repeat("x", len(u.cfg.Gateway)+2*20+16+3)
	var roundBytes int
	finish := func() {
		roundBytes += cur.itemBytes
		closed = append(closed, cur)
		p.consumed = append(p.consumed, cur.seqs...)
		p.next = cur.last + 1
		cur = batchBuilder{}
	}
	defer func() { p.closed = closed }()
	roundFull := func() bool { return len(closed) == maxBatches || roundBytes >= sealRoundBytes }
	seq := from
	for !roundFull() {
		rows, rerr := outbox.ReadIn(tx, seq, readChunk, &u.sealRows, u.sealEntries)
		if rerr != nil {
			return p, fmt.Errorf("read outbox: %w", rerr)
		}
		u.sealEntries = rows
		if len(rows) == 0 {
			break
		}
		for i, e := range rows {
			seq = e.Seq + 1
			if e.Kind != outbox.KindAggregate && e.Kind != outbox.KindAlert {
				if e.Kind != outbox.KindLocal {
					p.foreign++
				}
				continue
			}
			if reason := validateRow(e); reason != "" {
				// Copied: the plan is applied while the next round reuses
				// the rows' buffers.
				e.Data = bytes.Clone(e.Data)
				p.rejected = append(p.rejected, rejectedRow{e, reason})
				p.consumed = append(p.consumed, e.Seq)
				continue
			}
			size := len(e.Data)
			if cur.records() > 0 {
				aggs, alerts := len(cur.aggs), len(cur.alerts)
				if e.Kind == outbox.KindAggregate {
					aggs++
				} else {
					alerts++
				}
				if wire.BatchRawSize(u.cfg.Gateway, longestID, aggs, alerts, cur.itemBytes+size) > u.cfg.MaxBatchBytes {
					finish()
					if roundFull() {
						// Leave this row for the next round.
						return p, nil
					}
				}
			}
			if cur.records() == 0 {
				cur.first, cur.oldest = e.Seq, e.EmittedAt
				// Room for a whole batch, or for the rest of the rows
				// read if fewer, not ten reallocations a batch.
				n := min(u.cfg.MaxBatchRecords, len(rows)-i)
				cur.aggs, cur.seqs = make([][]byte, 0, n), make([]uint64, 0, n)
			}
			if e.Kind == outbox.KindAggregate {
				cur.aggs = append(cur.aggs, e.Data)
			} else {
				cur.alerts = append(cur.alerts, e.Data)
			}
			cur.itemBytes += size
			cur.last = e.Seq
			cur.oldest = min(cur.oldest, e.EmittedAt)
			cur.seqs = append(cur.seqs, e.Seq)
			if cur.records() >= u.cfg.MaxBatchRecords {
				finish()
				if roundFull() {
					return p, nil
				}
			}
		}
	}
	if cur.records() > 0 {
		if partial {
			finish()
		} else {
			p.pendingOldest = cur.oldest
		}
	}
	return p, nil
}

// buildAll builds the closed batches of a round, in parallel: compression
// is most of the sealing cost, and a drain after an outage is bound by it.
func (u *Uplink) buildAll(bs []batchBuilder) ([]sealed, error) {
	out := make([]sealed, len(bs))
	errs := make([]error, len(bs))
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < min(len(bs), runtime.GOMAXPROCS(0)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < len(bs); i = int(next.Add(1)) - 1 {
				out[i], errs[i] = u.build(&bs[i])
			}
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// build encodes and compresses one batch and names it.
//
// The batch id is "<gateway>-<first seq>-<last seq>-<16 hex digits>": the
// outbox sequence range for people reading logs, and the first 8 bytes of a
// SHA-256 over the batch's rows so that a state database that was reset (and
// numbers its rows from 1 again) cannot reuse the id of a different batch
// inside the stream's duplicate window. Equal rows give an equal id.
func (u *Uplink) build(b *batchBuilder) (sealed, error) {
	// The body's order, which depends on the rows only: the id below and
	// the body are the same whenever the same rows are sealed.
	wire.SortAggregates(b.aggs)
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, list := range [][][]byte{b.aggs, b.alerts} {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(list)))])
		for _, item := range list {
			h.Write(item)
		}
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	id := make([]byte, 0, len(u.cfg.Gateway)+2*20+16+3)
	id = append(id, u.cfg.Gateway...)
	id = strconv.AppendUint(append(id, '-'), b.first, 10)
	id = strconv.AppendUint(append(id, '-'), b.last, 10)
	id = hex.AppendEncode(append(id, '-'), sum[:8])
	s := sealed{
		first: b.first, last: b.last, oldest: b.oldest,
		aggregates: len(b.aggs), alerts: len(b.alerts),
		id: string(id), encoding: u.enc,
	}
	// The stored form is built here, the body right after its header, so
	// that storing the batch does not copy the body again.
	v := s.appendHeader(make([]byte, 0, 64+len(s.id)+len(s.encoding)))
	hdr := len(v)
	v, err := wire.AppendBatchBody(v, u.cfg.Gateway, s.id, b.aggs, b.alerts, u.enc)
	if err != nil {
		return sealed{}, fmt.Errorf("seal batch %s: %w", s.id, err)
	}
	s.stored, s.body = v, v[hdr:]
	return s, nil
}

// validateRow checks that a row is one well-formed CBOR map, the property
// the batch body relies on: a malformed row would make the whole batch
// undecodable at the receiver, so it is set aside here instead. It does not
// decode the row into its Go type (that costs 2 µs a row, a third of the
// sealing budget); rows come from wire.EncodeAggregate and EncodeAlert.
func validateRow(e outbox.Entry) string {
	if len(e.Data) == 0 || e.Data[0]>>5 != 5 {
		return "not a CBOR map"
	}
	if err := wire.WellFormedItem(e.Data); err != nil {
		return err.Error()
	}
	return ""
}

// errConflict means the outbox changed under a sealing plan (rows it meant
// to seal were gone); the plan is dropped and made again.
var errConflict = errors.New("uplink: outbox changed while sealing")

// apply writes a plan: the sealed batches, the rejected rows, and the
// deletion of every consumed row, in one transaction, so a row is either in
// the outbox or in exactly one sealed batch, whatever instant power fails.
func apply(tx *bolt.Tx, p *sealPlan) error {
	before, err := outbox.ReadStats(tx)
	if err != nil {
		return fmt.Errorf("outbox stats: %w", err)
	}
	if err := outbox.Delete(tx, p.consumed...); err != nil {
		return fmt.Errorf("delete sealed rows: %w", err)
	}
	after, err := outbox.ReadStats(tx)
	if err != nil {
		return fmt.Errorf("outbox stats: %w", err)
	}
	if before.Rows-after.Rows != uint64(len(p.consumed)) {
		return errConflict
	}
	for i := range p.batches {
		if err := putSealed(tx, &p.batches[i]); err != nil {
			return err
		}
	}
	for _, r := range p.rejected {
		if err := putRejected(tx, r.entry, r.reason); err != nil {
			return err
		}
	}
	return nil
}
