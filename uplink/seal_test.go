package uplink

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/internal/boltkv"

	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

func newTestUplink(t *testing.T, db *bolt.DB, edit func(*Config)) *Uplink {
	t.Helper()
	cfg := natsConfig("nats://127.0.0.1:1")
	cfg.Gateway = testGateway
	cfg.Logger = testLogger()
	if edit != nil {
		edit(&cfg)
	}
	u, err := New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// sealAll seals everything (partial batches too) round after round.
func sealAll(t *testing.T, u *Uplink) []sealed {
	t.Helper()
	var from uint64
	for {
		p := planRound(t, u, from, sealPerRound, true)
		if err := p.build(u); err != nil {
			t.Fatal(err)
		}
		if len(p.consumed) == 0 {
			break
		}
		if err := u.db.Update(func(tx *bolt.Tx) error { return apply(tx, &p) }); err != nil {
			t.Fatal(err)
		}
		from = p.next
	}
	var out []sealed
	if err := u.db.View(func(tx *bolt.Tx) (err error) {
		out, err = readSealed(tx, 0, 1<<20)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSealGroupsRowsInOrder(t *testing.T) {
	for _, bound := range []string{"records", "bytes"} {
		t.Run(bound, func(t *testing.T) {
			db := openDB(t)
			fx := makeFixture(t, 10, 6)
			fill(t, db, fx.rows, 100)
			u := newTestUplink(t, db, func(c *Config) {
				if bound == "bytes" {
					c.MaxBatchRecords = 10_000
					c.MaxBatchBytes = 4 << 10
				}
			})
			batches := sealAll(t, u)
			var gotAggs, wantAggs, gotAlerts, wantAlerts [][]byte
			aggRows := 0
			for _, r := range fx.rows {
				switch r.kind {
				case outbox.KindAggregate:
					aggRows++
				case outbox.KindAlert:
					wantAlerts = append(wantAlerts, r.data)
				}
			}
			prevLast := uint64(0)
			for _, s := range batches {
				if s.first <= prevLast || s.last < s.first {
					t.Fatalf("batch %s out of order after %d", s.id, prevLast)
				}
				prevLast = s.last
				if !strings.HasPrefix(s.id, testGateway+"-") {
					t.Fatalf("batch id %q", s.id)
				}
				raw, err := wire.DecodeBody(s.body)
				if err != nil {
					t.Fatalf("batch %s: %v", s.id, err)
				}
				if raw.Batch != s.id || len(raw.Aggregates) != s.aggregates || len(raw.Alerts) != s.alerts {
					t.Fatalf("batch %s: body says %s with %d/%d", s.id, raw.Batch, len(raw.Aggregates), len(raw.Alerts))
				}
				if n := s.aggregates + s.alerts; n > u.cfg.MaxBatchRecords || n == 0 {
					t.Fatalf("batch %s holds %d rows", s.id, n)
				}
				plain, err := wire.EncodeBatch(raw, wire.EncodingNone)
				if err != nil {
					t.Fatal(err)
				}
				if len(plain) > u.cfg.MaxBatchBytes {
					t.Fatalf("batch %s: %d bytes of CBOR, bound %d", s.id, len(plain), u.cfg.MaxBatchBytes)
				}
				// Within a batch the aggregates are in wire order: the
				// batch's outbox rows (sequences first..last), sorted.
				var inRange [][]byte
				for _, r := range fx.rows[s.first-1 : s.last] {
					if r.kind == outbox.KindAggregate {
						inRange = append(inRange, r.data)
					}
				}
				wire.SortAggregates(inRange)
				wantAggs = append(wantAggs, inRange...)
				for i := range raw.Aggregates {
					b, err := wire.EncodeAggregate(&raw.Aggregates[i])
					if err != nil {
						t.Fatal(err)
					}
					gotAggs = append(gotAggs, b)
				}
				for i := range raw.Alerts {
					b, err := wire.EncodeAlert(&raw.Alerts[i])
					if err != nil {
						t.Fatal(err)
					}
					gotAlerts = append(gotAlerts, b)
				}
			}
			if len(wantAggs) != aggRows || !reflect.DeepEqual(gotAggs, wantAggs) || !reflect.DeepEqual(gotAlerts, wantAlerts) {
				t.Fatalf("batches hold %d aggregates and %d alerts, not the %d and %d rows of their outbox ranges (aggregates in wire order)",
					len(gotAggs), len(gotAlerts), aggRows, len(wantAlerts))
			}
			if bound == "bytes" && len(batches) < 10 {
				t.Fatalf("only %d batches under a 4 KiB bound", len(batches))
			}
			checkOutboxLeftSealed(t, db, fx)
		})
	}
}

// checkOutboxLeftSealed: only local rows remain after sealing.
func checkOutboxLeftSealed(t *testing.T, db *bolt.DB, fx fixture) {
	t.Helper()
	if err := db.View(func(tx *bolt.Tx) error {
		st, err := outbox.ReadStats(tx)
		if err != nil {
			return err
		}
		if st.Rows != uint64(fx.locals) {
			t.Errorf("outbox holds %d rows, want the %d local ones", st.Rows, fx.locals)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestSealIsDeterministic(t *testing.T) {
	fx := makeFixture(t, 8, 4)
	var runs [2][]sealed
	for i := range runs {
		db := openDB(t)
		fill(t, db, fx.rows, 37) // different commit boundaries do not matter
		runs[i] = sealAll(t, newTestUplink(t, db, nil))
	}
	if len(runs[0]) != len(runs[1]) {
		t.Fatalf("%d vs %d batches", len(runs[0]), len(runs[1]))
	}
	for i := range runs[0] {
		a, b := runs[0][i], runs[1][i]
		if a.id != b.id || !bytes.Equal(a.body, b.body) {
			t.Fatalf("batch %d differs: %s vs %s", i, a.id, b.id)
		}
	}
	// A different batch over the same sequence range gets another id: a
	// state database that was reset cannot reuse an id inside the
	// duplicate window.
	other := makeFixture(t, 9, 4)
	db := openDB(t)
	fill(t, db, other.rows, 100)
	b := sealAll(t, newTestUplink(t, db, nil))
	if b[0].first == runs[0][0].first && b[0].last == runs[0][0].last && b[0].id == runs[0][0].id {
		t.Fatalf("different rows, same id %s", b[0].id)
	}
}

func TestSealPartialOnlyWhenAllowed(t *testing.T) {
	db := openDB(t)
	fx := makeFixture(t, 10, 3) // 120 windows + revisions + an alert
	fill(t, db, fx.rows, 100)
	u := newTestUplink(t, db, nil) // 50 records a batch
	p := planRound(t, u, 0, sealPerRound, false)
	total := fx.aggs + fx.alerts
	if err := p.build(u); err != nil {
		t.Fatal(err)
	}
	if len(p.batches) != total/50 {
		t.Fatalf("link down: %d batches sealed, want the %d full ones", len(p.batches), total/50)
	}
	if p.pendingOldest == 0 {
		t.Fatal("rows left unsealed but no oldest reported")
	}
	p = planRound(t, u, 0, sealPerRound, true)
	if err := p.build(u); err != nil {
		t.Fatal(err)
	}
	if len(p.batches) != (total+49)/50 {
		t.Fatalf("link up: %d batches, want %d", len(p.batches), (total+49)/50)
	}
	// A round stops at maxBatches and resumes where it stopped.
	p = planRound(t, u, 0, 1, true)
	if err := p.build(u); err != nil {
		t.Fatal(err)
	}
	if len(p.batches) != 1 || p.next != p.batches[0].last+1 {
		t.Fatalf("one-batch round: %d batches, next %d", len(p.batches), p.next)
	}
}

func TestSealOversizeRowTravelsAlone(t *testing.T) {
	db := openDB(t)
	big := wire.Aggregate{Device: strings.Repeat("d", 3000), Metric: "m", Count: 1, Rev: 1, Key: "k"}
	small := wire.Aggregate{Device: "d", Metric: "m", Count: 1, Rev: 1, Key: "k2"}
	fill(t, db, []row{
		{outbox.KindAggregate, 1, mustEncode(t, &small)},
		{outbox.KindAggregate, 2, mustEncode(t, &big)},
		{outbox.KindAggregate, 3, mustEncode(t, &small)},
	}, 10)
	batches := sealAll(t, newTestUplink(t, db, func(c *Config) { c.MaxBatchBytes = 1024 }))
	if len(batches) != 3 {
		t.Fatalf("%d batches, want 3 (the oversize row alone)", len(batches))
	}
}

func TestSealRejectsBadRowsAndLeavesLocalOnes(t *testing.T) {
	srv := startNATS(t, "in-process", 0)
	db := openDB(t)
	good := wire.Aggregate{Device: "d", Metric: "m", Count: 1, Rev: 1, Key: "k"}
	goodRaw := mustEncode(t, &good)
	fill(t, db, []row{
		{outbox.KindLocal, 1, []byte("local before")},
		{outbox.KindAggregate, 2, []byte{0xff, 0x00}},                      // not CBOR
		{outbox.KindAggregate, 3, goodRaw},                                 // fine
		{outbox.KindAggregate, 4, []byte{0x80}},                            // an array, not a map
		{outbox.KindAlert, 5, goodRaw[:len(goodRaw)-2]},                    // truncated
		{outbox.KindAggregate, 6, append(append([]byte{}, goodRaw...), 0)}, // trailing byte
		{outbox.Kind(9), 7, []byte("from a newer stage")},
		{outbox.KindLocal, 8, []byte("local after")},
	}, 10)
	u := startUplink(t, db, natsConfig(srv.URL()))
	waitFor(t, 10*time.Second, "the good row to be acknowledged", func() bool { return u.Stats().AggregatesSent == 1 })
	waitFor(t, 10*time.Second, "the bad rows to be counted", func() bool { return u.Stats().RejectedRows == 4 })
	if err := db.View(func(tx *bolt.Tx) error {
		rows, err := outbox.Read(tx, 0, 100)
		if err != nil {
			return err
		}
		var kinds []outbox.Kind
		for _, e := range rows {
			kinds = append(kinds, e.Kind)
		}
		if !reflect.DeepEqual(kinds, []outbox.Kind{outbox.KindLocal, 9, outbox.KindLocal}) {
			t.Errorf("outbox kinds left: %v", kinds)
		}
		if n := tx.Bucket(bucketRejected).Stats().KeyN; n != 4 {
			t.Errorf("%d rows kept in uplink_rejected, want 4", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	r := streamReceiver(t, srv.URL())
	if len(r.aggregates) != 1 || r.aggregates["k"] != 1 {
		t.Fatalf("receiver got %v", r.aggregates)
	}
}

// A round's rejected rows are applied while the next round reads its rows
// into the same buffers: they must be copies.
func TestRejectedRowsOutliveTheNextRound(t *testing.T) {
	db := openDB(t)
	good := wire.Aggregate{Device: "d", Metric: "m", Count: 1, Rev: 1, Key: "k"}
	goodRaw := mustEncode(t, &good)
	bad := []byte{0xff, 0x00}
	fill(t, db, []row{
		{outbox.KindAggregate, 1, bad},
		{outbox.KindAggregate, 2, goodRaw},
		{outbox.KindAggregate, 3, goodRaw},
		{outbox.KindAggregate, 4, goodRaw},
		{outbox.KindAggregate, 5, goodRaw},
	}, 10)
	u := newTestUplink(t, db, func(c *Config) { c.MaxBatchRecords = 2 })
	first := planRound(t, u, 0, 1, true)
	if len(first.rejected) != 1 || len(first.closed) != 1 {
		t.Fatalf("first round: %d rejected, %d batches; want 1 and 1", len(first.rejected), len(first.closed))
	}
	u.sealRows.Reset() // as sealLoop does before each round
	if next := planRound(t, u, first.next, 1, true); len(next.closed) != 1 {
		t.Fatalf("second round: %d batches, want 1", len(next.closed))
	}
	if got := first.rejected[0].entry.Data; !bytes.Equal(got, bad) {
		t.Fatalf("the first round's rejected row reads % x after the next round, want % x", got, bad)
	}
}

func TestBacklogBytesCountsSealedBatches(t *testing.T) {
	db := openDB(t)
	fx := makeFixture(t, 20, 4)
	fill(t, db, fx.rows, 100)
	var before, after, sealedOnly uint64
	var localBytes uint64
	read := func(dst *uint64) {
		if err := db.View(func(tx *bolt.Tx) (err error) {
			*dst, err = BacklogBytes(tx)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	read(&before)
	sealAll(t, newTestUplink(t, db, nil))
	read(&after)
	if err := db.View(func(tx *bolt.Tx) error {
		st, err := outbox.ReadStats(tx)
		localBytes = st.Bytes
		bl, err2 := ReadBacklog(tx)
		sealedOnly = bl.Bytes
		if err == nil {
			err = err2
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if after != localBytes+sealedOnly || sealedOnly == 0 {
		t.Fatalf("BacklogBytes %d, want local %d + sealed %d", after, localBytes, sealedOnly)
	}
	if after*3 > before {
		t.Fatalf("sealing shrank the backlog only from %d to %d bytes", before, after)
	}
	t.Logf("backlog %d bytes as rows, %d sealed (%.1fx)", before, after, float64(before)/float64(after))
}

func TestSealedRecordRoundTrip(t *testing.T) {
	s := sealed{first: 7, last: 900, oldest: -5, aggregates: 3, alerts: 1, id: "gw-7-900-00", encoding: "zstd", body: []byte{1, 2, 3}}
	got, err := unmarshalSealed(boltkv.Key(7), s.marshal())
	if err != nil || !reflect.DeepEqual(got, s) {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	v := s.marshal()
	for i := 0; i < len(v)-len(s.body); i++ {
		if _, err := unmarshalSealed(boltkv.Key(7), v[:i]); err == nil {
			t.Fatalf("truncated record of %d bytes decoded", i)
		}
	}
}

// build writes the stored form in one buffer; it must equal marshal's, and
// the id and body must be what the format says: the SHA-256 id of the
// sorted rows, and EncodeBatchRaw's body.
func TestBuildMatchesReference(t *testing.T) {
	fx := makeFixture(t, 20, 3)
	var aggs, alerts [][]byte
	for _, r := range fx.rows {
		switch r.kind {
		case outbox.KindAggregate:
			aggs = append(aggs, r.data)
		case outbox.KindAlert:
			alerts = append(alerts, r.data)
		}
	}
	if len(alerts) == 0 {
		t.Fatal("the fixture has no alerts")
	}
	for _, comp := range []string{"zstd", "none"} {
		u := newTestUplink(t, openDB(t), func(c *Config) { c.Compression = comp })
		b := batchBuilder{aggs: slices.Clone(aggs), alerts: alerts, first: 3, last: 9000, oldest: -7}
		s, err := u.build(&b)
		if err != nil {
			t.Fatal(err)
		}
		sorted := slices.Clone(aggs)
		wire.SortAggregates(sorted)
		h := sha256.New()
		for _, list := range [][][]byte{sorted, alerts} {
			h.Write(binary.AppendUvarint(nil, uint64(len(list))))
			for _, item := range list {
				h.Write(item)
			}
		}
		wantID := fmt.Sprintf("%s-3-9000-%x", testGateway, h.Sum(nil)[:8])
		if s.id != wantID {
			t.Fatalf("%s: id %q, want %q", comp, s.id, wantID)
		}
		body, err := wire.EncodeBatchRaw(testGateway, wantID, sorted, alerts, u.enc)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(s.body, body) {
			t.Fatalf("%s: body differs from EncodeBatchRaw's", comp)
		}
		plain := s
		plain.stored = nil
		if !bytes.Equal(s.marshal(), plain.marshal()) {
			t.Fatalf("%s: build's stored form differs from marshal's", comp)
		}
	}
}

// NotUpSince spans a whole outage: reconnect attempts move the link
// between down and connecting, which must not restart it.
func TestNotUpSinceSpansReconnectAttempts(t *testing.T) {
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	u := newTestUplink(t, openDB(t), func(c *Config) { c.Clock = func() time.Time { return now } })
	start := u.Stats().NotUpSince
	if !start.Equal(now) {
		t.Fatalf("before any connection NotUpSince = %v, want the start %v", start, now)
	}
	step := func(st LinkState) { now = now.Add(time.Minute); u.setLink(st) }
	step(LinkConnecting)
	step(LinkDown)
	step(LinkConnecting)
	if got := u.Stats().NotUpSince; !got.Equal(start) {
		t.Errorf("after reconnect attempts NotUpSince = %v, want %v", got, start)
	}
	step(LinkUp)
	if got := u.Stats().NotUpSince; !got.IsZero() {
		t.Errorf("while up NotUpSince = %v, want zero", got)
	}
	step(LinkDown)
	wentDown := now
	step(LinkConnecting)
	if got := u.Stats().NotUpSince; !got.Equal(wentDown) {
		t.Errorf("after the link dropped NotUpSince = %v, want %v", got, wentDown)
	}
}

// A sealing round holds its rows until its batches are written: it stops
// at about sealRoundBytes of them, before sealPerRound batches, and the
// next round goes on from where it stopped.
func TestSealRoundIsBoundedByBytes(t *testing.T) {
	db := openDB(t)
	fillSynthetic(t, db, 20_000) // about 4 MB of rows
	u := newTestUplink(t, db, nil)
	u.cfg.MaxBatchRecords = 500
	p := planRound(t, u, 0, sealPerRound, true)
	var held, largest int
	for _, b := range p.closed {
		held += b.itemBytes
		largest = max(largest, b.itemBytes)
	}
	if len(p.closed) == 0 || len(p.closed) >= sealPerRound || held > sealRoundBytes+largest {
		t.Fatalf("a round closed %d batches holding %d bytes of rows, want fewer than %d batches and at most %d bytes",
			len(p.closed), held, sealPerRound, sealRoundBytes+largest)
	}
	next := planRound(t, u, p.next, sealPerRound, true)
	want := p.closed[len(p.closed)-1].last + 1
	if len(next.closed) == 0 || next.closed[0].first != want {
		t.Fatalf("the next round (%d batches) does not start at row %d", len(next.closed), want)
	}
}

// planRound plans a sealing round of u from outbox row from in a read
// transaction.
func planRound(t testing.TB, u *Uplink, from uint64, maxBatches int, partial bool) sealPlan {
	t.Helper()
	var p sealPlan
	if err := u.db.View(func(tx *bolt.Tx) (err error) {
		p, err = u.plan(tx, from, maxBatches, partial)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return p
}
