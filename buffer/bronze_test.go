package buffer

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"unsafe"
)

// readStored reads like Read but always through bbolt, never the tail.
func readStored(t *testing.T, b *Bronze, from uint64, max int) []Record {
	t.Helper()
	var out []Record
	err := b.Scan(from, func(r Record) bool {
		r.Payload = bytes.Clone(r.Payload)
		out = append(out, r)
		return len(out) < max
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameRecords(t *testing.T, what string, got, want []Record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d records, stored %d", what, len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Seq != w.Seq || g.Kind != w.Kind || g.ReceivedAt != w.ReceivedAt || g.Topic != w.Topic ||
			g.QoS != w.QoS || g.Retained != w.Retained || g.Duplicate != w.Duplicate || g.Reason != w.Reason ||
			!bytes.Equal(g.Payload, w.Payload) {
			t.Fatalf("%s: record %d is %+v, stored %+v", what, i, g, w)
		}
	}
}

// TestReadFromTailMatchesStore: reads served from the in-memory tail are
// exactly what bbolt holds, across chunk boundaries, after the tail dropped
// its oldest chunks, and after a reopen (empty tail).
func TestReadFromTailMatchesStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bronze.db")
	b, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	payload := bytes.Repeat([]byte("x"), 900)
	var total uint64
	for batch := 0; batch < 150; batch++ { // about 6.7 MB: more than the tail keeps
		recs := make([]Record, 100)
		for i := range recs {
			recs[i] = Record{Kind: KindMessage, ReceivedAt: int64(batch*1000 + i), Topic: fmt.Sprintf("d/%d/t", i),
				QoS: byte(i % 2), Duplicate: i%7 == 0, Payload: append([]byte(fmt.Sprint(batch, i)), payload[:i*9]...)}
		}
		recs[3] = Record{Kind: KindRejected, ReceivedAt: 5, Topic: "bad", Reason: "too big"}
		if err := b.Append(recs); err != nil {
			t.Fatal(err)
		}
		total += uint64(len(recs))
	}
	if b.tail[0].first == 1 {
		t.Fatal("the tail kept every record; the test does not reach eviction")
	}
	oldest := b.tail[0].first
	var dst []Record
	for _, c := range []struct {
		from uint64
		max  int
	}{{oldest, 10_000}, {oldest + 1, 150}, {oldest + 99, 2}, {total - 5, 100}, {total, 1}, {total + 1, 10}, {oldest - 1, 50}, {1, 120}} {
		got, err := b.Read(c.from, c.max)
		if err != nil {
			t.Fatal(err)
		}
		want := readStored(t, b, c.from, c.max)
		sameRecords(t, fmt.Sprintf("Read(%d, %d)", c.from, c.max), got, want)
		// ReadInto over the previous case's records: the same records, in
		// the same array when it is large enough.
		into, err := b.ReadInto(dst, c.from, c.max)
		if err != nil {
			t.Fatal(err)
		}
		sameRecords(t, fmt.Sprintf("ReadInto(%d, %d)", c.from, c.max), into, want)
		if len(into) > 0 && cap(dst) >= len(into) && &into[0] != &dst[:1][0] {
			t.Errorf("ReadInto(%d, %d) allocated although dst held %d", c.from, c.max, cap(dst))
		}
		dst = into
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got, err := b.Read(total-10, 100)
	if err != nil {
		t.Fatal(err)
	}
	sameRecords(t, "after reopen", got, readStored(t, b, total-10, 100))
}

// openHoldingFirstAppend opens a Bronze log in a temporary directory,
// appends the first 100 of src (benchRecords(1000)) in one append and
// reads them back from the tail: held, and want as bbolt stores them.
func openHoldingFirstAppend(t *testing.T) (b *Bronze, src, held, want []Record) {
	t.Helper()
	b, err := Open(filepath.Join(t.TempDir(), "bronze.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	src = benchRecords(1000)
	if err := b.Append(src[:100]); err != nil {
		t.Fatal(err)
	}
	if held, err = b.Read(1, 100); err != nil {
		t.Fatal(err)
	}
	return b, src, held, readStored(t, b, 1, 100)
}

// otherRecords is a copy of recs with other topics and payloads of the
// same sizes.
func otherRecords(recs []Record) []Record {
	recs = append([]Record(nil), recs...)
	for i := range recs {
		recs[i].Topic = fmt.Sprintf("other/%d/x", i)
		recs[i].Payload = bytes.Repeat([]byte{'z'}, len(recs[i].Payload))
	}
	return recs
}

// TestTailRecordsOutliveEviction: records read from the tail alias its
// arenas, strings included; they stay intact after the tail dropped those
// arenas and later appends and collections ran.
func TestTailRecordsOutliveEviction(t *testing.T) {
	b, src, held, want := openHoldingFirstAppend(t)
	for b.tail[0].first == 1 { // push the first chunk out of the tail
		if err := b.Append(otherRecords(src)); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	sameRecords(t, "records held across eviction", held, want)
}

// TestReleasedArenasAreReused: an arena that left the tail is reused by a
// later Append only once every record in it is released, and the records
// read from the reused arena are the new ones, intact.
func TestReleasedArenasAreReused(t *testing.T) {
	b, src, held, want := openHoldingFirstAppend(t)
	first := unsafe.SliceData(b.tail[0].arena)
	b.ReleaseThrough(99) // the last record is still held
	other := func(n int) []Record { return otherRecords(src[:n]) }
	appendOther := func(n int) {
		t.Helper()
		if err := b.Append(other(n)); err != nil {
			t.Fatal(err)
		}
		if got := unsafe.SliceData(b.tail[len(b.tail)-1].arena); got == first {
			t.Fatalf("an append reused the arena of records 1-100 while record 100 was held")
		}
	}
	for b.tail[0].first == 1 {
		appendOther(1000)
	}
	appendOther(50)
	sameRecords(t, "records held after a partial release", held, want)

	b.ReleaseThrough(100)
	if err := b.Append(other(50)); err != nil {
		t.Fatal(err)
	}
	last := b.tail[len(b.tail)-1]
	if unsafe.SliceData(last.arena) != first {
		t.Fatal("the released arena of records 1-100 was not reused by an append that fits in it")
	}
	got, err := b.Read(last.first, 50)
	if err != nil {
		t.Fatal(err)
	}
	sameRecords(t, "records in a reused arena", got, readStored(t, b, last.first, 50))
}

// The Bronze file is created group-readable and never world-accessible
// (given the usual umask 022 or the unit's 0027), so members of the
// service's group can inspect a stopped agent.
func TestBronzeFileMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bronze.db")
	b, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if m := st.Mode().Perm(); m&0o040 == 0 || m&0o007 != 0 {
		t.Errorf("bronze.db mode %v, want group-readable and nothing for others", m)
	}
}

// A commit larger than the whole tail is not kept in memory (it held the
// payloads of a backlog of large messages for as long as the agent then
// idled); its records are read from the file, and the tail starts again
// with the next commit.
func TestLargeCommitSkipsTheTail(t *testing.T) {
	b, err := Open(filepath.Join(t.TempDir(), "bronze.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	big := make([]Record, 10)
	for i := range big {
		big[i] = Record{Kind: KindMessage, ReceivedAt: int64(i), Topic: "d/1/t", Payload: bytes.Repeat([]byte{'a' + byte(i)}, 200<<10)}
	}
	if err := b.Append(big); err != nil {
		t.Fatal(err)
	}
	if len(b.tail) != 0 || b.tailBytes != 0 {
		t.Fatalf("the tail holds %d chunks, %d bytes after a 2 MB commit", len(b.tail), b.tailBytes)
	}
	got, err := b.Read(1, 100)
	if err != nil || len(got) != 10 || !bytes.Equal(got[9].Payload, big[9].Payload) {
		t.Fatalf("read back %d records (%v)", len(got), err)
	}
	if err := b.Append([]Record{{Kind: KindMessage, ReceivedAt: 11, Topic: "d/1/t", Payload: []byte("small")}}); err != nil {
		t.Fatal(err)
	}
	if len(b.tail) != 1 || b.tail[0].first != 11 {
		t.Fatalf("the tail after a small commit: %+v", b.tail)
	}
	if got, err := b.Read(11, 1); err != nil || len(got) != 1 || string(got[0].Payload) != "small" {
		t.Fatalf("read from the tail: %v %v", got, err)
	}
}

// TestRevisionFloorIsDurableAtOnce: the floor is on disk when
// SetRevisionFloor returns, with no append after it (the window stage sends
// rows above the old floor right after), and it never goes down.
func TestRevisionFloorIsDurableAtOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bronze.db")
	b, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, rev := range []uint32{3, 7, 5} {
		if err := b.SetRevisionFloor(rev); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.SetRevisionFloor(9); err == nil {
		t.Fatal("a closed log recorded a floor")
	}
	b, err = Open(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if got := b.RevisionFloor(); got != 7 {
		t.Fatalf("reopened floor %d, want 7", got)
	}
}

// A reader that goes back (the window stage reloading its checkpoint after
// a failed commit) says so with a lower ReleaseThrough, and reads records
// it had released before: the arena they are in is not reused when it
// leaves the tail while the reader holds them again.
func TestReleaseThroughGoesBack(t *testing.T) {
	b, src, _, want := openHoldingFirstAppend(t)
	first := unsafe.SliceData(b.tail[0].arena)
	b.ReleaseThrough(100)
	b.ReleaseThrough(0) // back to the start: records 1-100 are read again
	again, err := b.Read(1, 100)
	if err != nil {
		t.Fatal(err)
	}
	for b.tail[0].first == 1 { // push the first arena out of the tail
		if err := b.Append(otherRecords(src)); err != nil {
			t.Fatal(err)
		}
		if got := unsafe.SliceData(b.tail[len(b.tail)-1].arena); got == first {
			t.Fatal("an append reused the arena of records 1-100 while they were held again")
		}
	}
	if err := b.Append(otherRecords(src[:50])); err != nil {
		t.Fatal(err)
	}
	if got := unsafe.SliceData(b.tail[len(b.tail)-1].arena); got == first {
		t.Fatal("an append reused the arena of records 1-100 while they were held again")
	}
	sameRecords(t, "records read again after going back", again, want)
}
