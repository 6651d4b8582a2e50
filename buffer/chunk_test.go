package buffer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// appendChunks appends one chunk per size, each record received at its
// sequence number of seconds after t0, and returns every record stored.
func appendChunks(t *testing.T, b *Bronze, t0 time.Time, sizes ...int) []Record {
	t.Helper()
	var all []Record
	for _, n := range sizes {
		recs := make([]Record, n)
		for i := range recs {
			seq := len(all) + i + 1
			recs[i] = Record{Kind: KindMessage, ReceivedAt: t0.Add(time.Duration(seq) * time.Second).UnixNano(),
				Topic: fmt.Sprintf("d/%d/t", seq), QoS: 1, Payload: []byte(fmt.Sprintf(`{"n":%d}`, seq))}
		}
		if err := b.Append(recs); err != nil {
			t.Fatal(err)
		}
		all = append(all, recs...)
	}
	return all
}

// TestScanFromEverySequence: Scan starts at the asked sequence whether it
// opens a chunk, sits inside one or ends one, before the first and past
// the last.
func TestScanFromEverySequence(t *testing.T) {
	b, err := Open(filepath.Join(t.TempDir(), "bronze.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	all := appendChunks(t, b, time.Unix(1000, 0), 1, 3, 1, 7, 2)
	for from := uint64(0); from <= uint64(len(all))+2; from++ {
		first := max(from, 1)
		var want []Record
		if first <= uint64(len(all)) {
			want = all[first-1:]
		}
		sameRecords(t, fmt.Sprintf("Scan(%d)", from), readStored(t, b, from, 1000), want)
		if len(want) > 2 { // and stopping early, inside a chunk
			sameRecords(t, fmt.Sprintf("Scan(%d) for 2", from), readStored(t, b, from, 2), want[:2])
		}
	}
}

// TestTrimTakesWholeCheckpointedChunks: retention by bytes and by age
// deletes a chunk only when every record in it is checkpointed (and, by
// age, older than the cutoff), so no record the window stage still needs
// goes, and the counters follow what was deleted.
func TestTrimTakesWholeCheckpointedChunks(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0
	b, err := Open(filepath.Join(t.TempDir(), "bronze.db"), Options{MaxBytes: 1, Retention: time.Hour,
		Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.opts.MaxBytes = 0 // fill first, bound below
	all := appendChunks(t, b, t0, 3, 3, 3)
	b.opts.MaxBytes = 1

	b.SetCheckpoint(5) // inside the second chunk
	n, err := b.Trim(0)
	if err != nil || n != 3 {
		t.Fatalf("Trim with the checkpoint inside chunk 2 deleted %d (%v), want chunk 1's 3", n, err)
	}
	st, err := b.Stats()
	if err != nil || st.FirstSeq != 4 || st.Records != 6 {
		t.Fatalf("after trim: first %d, %d records (%v); want 4 and 6", st.FirstSeq, st.Records, err)
	}
	sameRecords(t, "after trim", readStored(t, b, 1, 100), all[3:])

	// By age: the last chunk's newest record (seq 9) is received at t0+9s.
	b.opts.MaxBytes = 0
	b.SetCheckpoint(9)
	now = t0.Add(time.Hour + 8*time.Second) // cutoff t0+8s: seq 9 is newer
	if n, err := b.Trim(0); err != nil || n != 3 {
		t.Fatalf("Trim by age deleted %d (%v), want chunk 2's 3", n, err)
	}
	if n, err := b.Trim(0); err != nil || n != 0 {
		t.Fatalf("Trim by age deleted %d (%v) of a chunk holding a record inside the retention", n, err)
	}
	now = t0.Add(time.Hour + 10*time.Second)
	if n, err := b.Trim(0); err != nil || n != 3 {
		t.Fatalf("Trim by age deleted %d (%v), want the last chunk's 3", n, err)
	}
	if st, err := b.Stats(); err != nil || st.Records != 0 || st.Bytes != 0 || st.FirstSeq != 0 {
		t.Fatalf("after trimming everything: %+v (%v)", st, err)
	}
	// Sequences go on after the log emptied.
	more := appendChunks(t, b, now, 2)
	if more[0].Seq != 10 {
		t.Fatalf("first sequence after the trim is %d, want 10", more[0].Seq)
	}
}

// TestOpenRefusesOtherFormats: a log written one record per key (format 1,
// never released) is refused with a message that says so, not misread.
func TestOpenRefusesOtherFormats(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bronze.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		log, err := tx.CreateBucket(bucketLog)
		if err != nil {
			return err
		}
		if _, err := tx.CreateBucket(bucketMeta); err != nil {
			return err
		}
		r := Record{Kind: KindMessage, Topic: "d/1/t", Payload: []byte("1")}
		return log.Put([]byte{0, 0, 0, 0, 0, 0, 0, 1}, r.AppendEncode(nil))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = Open(path, Options{})
	if err == nil || !strings.Contains(err.Error(), "format 1") || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open of a format-1 log: %v; want an error naming the file and its format", err)
	}
}

// FuzzEachRecord: any stored chunk either splits into records that encode
// back to exactly its bytes, or fails with ErrCorruptRecord; never a panic.
func FuzzEachRecord(f *testing.F) {
	var chunk []byte
	for _, r := range []Record{{Kind: KindMessage, Topic: "a/b", Payload: []byte("{}")}, {Kind: KindTick, ReceivedAt: 99}} {
		chunk = binary.AppendUvarint(chunk, uint64(r.EncodedSize()))
		chunk = r.AppendEncode(chunk)
	}
	f.Add(chunk)
	f.Add([]byte{})
	f.Add([]byte{0x80})
	f.Fuzz(func(t *testing.T, chunk []byte) {
		var again []byte
		err := eachRecord(7, chunk, func(seq uint64, rec []byte) (bool, error) {
			r, err := DecodeRecord(seq, rec)
			if err != nil {
				return false, err
			}
			again = binary.AppendUvarint(again, uint64(r.EncodedSize()))
			again = r.AppendEncode(again)
			return true, nil
		})
		if err != nil {
			if !errors.Is(err, ErrCorruptRecord) {
				t.Fatalf("error %v is not ErrCorruptRecord", err)
			}
			return
		}
		// Uvarint lengths may be padded (non-minimal) in fuzzed input:
		// compare record by record instead when the bytes differ.
		if !bytes.Equal(again, chunk) {
			var n1, n2 int
			_ = eachRecord(0, chunk, func(uint64, []byte) (bool, error) { n1++; return true, nil })
			_ = eachRecord(0, again, func(uint64, []byte) (bool, error) { n2++; return true, nil })
			if n1 != n2 {
				t.Fatalf("%d records re-encode as %d", n1, n2)
			}
		}
	})
}

// TestStoredReadsOutliveTheTransaction: Read past the in-memory tail
// decodes from a copy of each chunk, topics aliasing it; the records stay
// intact after the read transaction, more appends, a reopen and
// collections.
func TestStoredReadsOutliveTheTransaction(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bronze.db")
	b, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := appendChunks(t, b, time.Unix(1000, 0), 5, 1, 9)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if b, err = Open(path, Options{}); err != nil { // an empty tail: Read goes to bbolt
		t.Fatal(err)
	}
	defer b.Close()
	held, err := b.Read(3, 10)
	if err != nil {
		t.Fatal(err)
	}
	appendChunks(t, b, time.Unix(5000, 0), 50, 50)
	runtime.GC()
	sameRecords(t, "records read from bbolt, held", held, want[2:12])
}

// TestAppendWritesPageSizedChunks: an Append stores its records in chunks
// of at most chunkBytes (a larger record alone), keyed by their first
// sequence and back to back; Scan returns them all; and a commit allocates
// pages for little more than its records, where one value per commit made
// bbolt rewrite the last leaf's previous chunks with every commit (4.5
// times the records' bytes).
func TestAppendWritesPageSizedChunks(t *testing.T) {
	b, err := Open(filepath.Join(t.TempDir(), "bronze.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.chunkMax < 1000 || b.chunkMax > b.db.Info().PageSize {
		t.Fatalf("chunkMax %d for page size %d", b.chunkMax, b.db.Info().PageSize)
	}
	batch := func(n, big int) []Record {
		recs := make([]Record, n)
		for i := range recs {
			payload := strings.Repeat("x", 100)
			if i == big {
				payload = strings.Repeat("y", 3*b.chunkMax)
			}
			recs[i] = Record{Kind: KindMessage, ReceivedAt: int64(i), Topic: "d/1/t", QoS: 1, Payload: []byte(payload)}
		}
		return recs
	}
	var all []Record
	first := batch(500, 250)
	if err := b.Append(first); err != nil {
		t.Fatal(err)
	}
	all = append(all, first...)
	var recBytes int
	before := b.db.Stats()
	for range 10 {
		recs := batch(500, -1)
		for i := range recs {
			recBytes += recs[i].EncodedSize()
		}
		if err := b.Append(recs); err != nil {
			t.Fatal(err)
		}
		all = append(all, recs...)
	}
	after := b.db.Stats()
	diff := after.Sub(&before)
	alloc := diff.TxStats.GetPageAlloc()
	if ratio := float64(alloc) / float64(recBytes); ratio > 1.5 {
		t.Errorf("commits allocated %d bytes of pages for %d bytes of records (%.2f×)", alloc, recBytes, ratio)
	}

	next := uint64(1)
	chunks := 0
	err = b.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketLog).ForEach(func(k, v []byte) error {
			if got := binary.BigEndian.Uint64(k); got != next {
				return fmt.Errorf("chunk at %d, want %d", got, next)
			}
			n := 0
			err := eachRecord(next, v, func(uint64, []byte) (bool, error) { n++; return true, nil })
			if err != nil {
				return err
			}
			if len(v) > b.chunkMax && n > 1 {
				return fmt.Errorf("chunk at %d holds %d records in %d bytes, over %d", next, n, len(v), b.chunkMax)
			}
			next += uint64(n)
			chunks++
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if next != uint64(len(all))+1 || chunks < 11*500*100/b.chunkMax {
		t.Fatalf("%d chunks up to %d for %d records", chunks, next-1, len(all))
	}
	sameRecords(t, "all", readStored(t, b, 1, len(all)+1), all)
}

// TestSkipTo: after SkipTo(n) the next record is n+1, also after a
// reopen, and a SkipTo behind the log's end changes nothing.
func TestSkipTo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bronze.db")
	b, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_700_000_000, 0)
	appendChunks(t, b, t0, 3)
	if moved, err := b.SkipTo(2); err != nil || moved {
		t.Fatalf("SkipTo behind the end: moved %v, %v", moved, err)
	}
	if moved, err := b.SkipTo(500); err != nil || !moved || b.LastSeq() != 500 {
		t.Fatalf("SkipTo(500): moved %v, %v, last %d", moved, err, b.LastSeq())
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if b, err = Open(path, Options{}); err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	rec := []Record{{Kind: KindMessage, ReceivedAt: t0.UnixNano(), Topic: "d/x/t", QoS: 1, Payload: []byte("{}")}}
	if err := b.Append(rec); err != nil {
		t.Fatal(err)
	}
	if rec[0].Seq != 501 {
		t.Fatalf("the record after SkipTo(500) and a reopen is %d, want 501", rec[0].Seq)
	}
	got, err := b.Read(4, 10)
	if err != nil || len(got) != 1 || got[0].Seq != 501 {
		t.Fatalf("Read(4) = %+v, %v: want record 501 alone", got, err)
	}
	st, err := b.Stats()
	if err != nil || st.FirstSeq != 1 || st.LastSeq != 501 || st.Records != 4 {
		t.Fatalf("Stats = %+v, %v", st, err)
	}
}

// TestTrimRecordsTheNewestStampItDeleted: Trim and an Append over the byte
// bound keep the newest received-at they deleted, across a reopen; stamps
// need not rise with sequences (a gateway clock stepped back), so it is
// the newest of all deleted, not the last.
func TestTrimRecordsTheNewestStampItDeleted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bronze.db")
	b, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(10_000, 0)
	stamp := func(d time.Duration) int64 { return t0.Add(d).UnixNano() }
	appendChunks(t, b, t0.Add(-time.Hour), 3) // t0-1h+1s … +3s
	appendChunks(t, b, t0, 3)                 // t0+1s … t0+3s
	appendChunks(t, b, t0.Add(-2*time.Hour), 3)
	if b.TrimmedNewest() != 0 {
		t.Fatalf("TrimmedNewest %d before any trim", b.TrimmedNewest())
	}
	b.SetCheckpoint(9)
	st, err := b.Stats()
	if err != nil {
		t.Fatal(err)
	}
	b.SetLimits(0, st.Bytes-1) // the first chunk goes
	if n, err := b.Trim(0); err != nil || n != 3 || b.TrimmedNewest() != stamp(-time.Hour+3*time.Second) {
		t.Fatalf("Trim deleted %d (%v), TrimmedNewest %v; want the first chunk's 3 and newest", n, err, time.Unix(0, b.TrimmedNewest()))
	}
	// An Append over the bound trims the second chunk, then Trim the
	// third, stamped older: the newest is the second chunk's.
	b.SetLimits(0, st.Bytes/2)
	appendChunks(t, b, t0.Add(-3*time.Hour), 1)
	if b.TrimmedNewest() != stamp(3*time.Second) {
		t.Fatalf("after the Append's trim TrimmedNewest %v, want the second chunk's newest", time.Unix(0, b.TrimmedNewest()))
	}
	b.SetCheckpoint(10)
	b.SetLimits(0, 1)
	if n, err := b.Trim(0); err != nil || n == 0 || b.TrimmedNewest() != stamp(3*time.Second) {
		t.Fatalf("Trim deleted %d (%v), TrimmedNewest %v; want the second chunk's newest kept", n, err, time.Unix(0, b.TrimmedNewest()))
	}
	b = reopen(t, b, Options{})
	if b.TrimmedNewest() != stamp(3*time.Second) {
		t.Fatalf("reopened: TrimmedNewest %v", time.Unix(0, b.TrimmedNewest()))
	}
}

// TestTrimKeepsWhatThisProcessAppendedWithinTheRetention: a gateway that
// booted with its clock in 1970 stamps its first records so; once NTP
// steps the clock, their stamps say they are decades old, but this
// process appended them moments ago (Go's monotonic clock), so retention
// keeps them for a replay to recover. A later process goes by the stamps.
func TestTrimKeepsWhatThisProcessAppendedWithinTheRetention(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bronze.db")
	b, err := Open(path, Options{Retention: 7 * 24 * time.Hour}) // the real clock
	if err != nil {
		t.Fatal(err)
	}
	appendChunks(t, b, time.Unix(0, 0), 3, 3) // stamped in January 1970
	b.SetCheckpoint(6)
	if n, err := b.Trim(0); err != nil || n != 0 {
		t.Fatalf("Trim deleted %d (%v) of the records this process appended moments ago", n, err)
	}
	b = reopen(t, b, Options{Retention: 7 * 24 * time.Hour})
	b.SetCheckpoint(6)
	if n, err := b.Trim(0); err != nil || n != 6 {
		t.Fatalf("after a restart Trim deleted %d (%v), want all 6 by their stamps", n, err)
	}
}

// reopen closes b and opens its file again with opts, closed at the end
// of the test.
func reopen(t *testing.T, b *Bronze, opts Options) *Bronze {
	t.Helper()
	path := b.Path()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestTrimKeepsYoungRecordsLongAfterTheStart: the records are kept for
// the retention from when they were appended, not from the start (a
// review: records stamped 1970 appended 90 minutes after the start were
// trimmed at once with a retention of an hour).
func TestTrimKeepsYoungRecordsLongAfterTheStart(t *testing.T) {
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	now := start
	b, err := Open(filepath.Join(t.TempDir(), "bronze.db"), Options{Retention: time.Hour, Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	appendChunks(t, b, start, 3) // stamped right
	now = start.Add(90 * time.Minute)
	appendChunks(t, b, time.Unix(0, 0), 3) // stamped in 1970
	b.SetCheckpoint(6)
	now = start.Add(2 * time.Hour)
	if n, err := b.Trim(0); err != nil || n != 3 {
		t.Fatalf("two hours in, Trim deleted %d (%v); want the first 3, two hours old, and not the 3 appended 30 minutes ago", n, err)
	}
	now = start.Add(2*time.Hour + 31*time.Minute)
	if n, err := b.Trim(0); err != nil || n != 3 {
		t.Fatalf("an hour after they were appended, Trim deleted %d (%v) of the 3 stamped 1970", n, err)
	}
}

// TestRetentionRaisedByAReloadKeepsYoungRecords: a reload that raises the
// retention (or sets one where there was none) keeps what this run
// appended for the new retention: the marks kept for the old one no
// longer say (a review: records stamped 1970 appended 75 minutes earlier
// were trimmed at once after a raise from 1h to 24h, and 10 minutes
// earlier after one from 0 to 1h).
func TestRetentionRaisedByAReloadKeepsYoungRecords(t *testing.T) {
	for _, c := range []struct {
		name     string
		from, to time.Duration
		after    time.Duration
	}{{"raised", time.Hour, 24 * time.Hour, 75 * time.Minute}, {"set", 0, time.Hour, 10 * time.Minute}} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
			now := start
			b, err := Open(filepath.Join(t.TempDir(), "bronze.db"), Options{Retention: c.from, Clock: func() time.Time { return now }})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			appendChunks(t, b, time.Unix(0, 0), 3) // stamped 1970 at the start
			if c.from > 0 {
				now = start.Add(70 * time.Minute)
				appendChunks(t, b, now, 3) // stamped right; the first mark goes with a retention of 1h
			}
			b.SetCheckpoint(6)
			now = start.Add(c.after)
			b.SetLimits(c.to, 0)
			if n, err := b.Trim(0); err != nil || n != 0 {
				t.Fatalf("Trim deleted %d (%v) records appended within the new retention", n, err)
			}
		})
	}
}
