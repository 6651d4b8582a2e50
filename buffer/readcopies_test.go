package buffer

import (
	"testing"
	"unsafe"
)

// openPastTail opens a Bronze log holding 20,000 records (about 3 MB), so
// that the first thousands are no longer in the in-memory tail and reads
// of them copy the file's chunks.
func openPastTail(t *testing.T) *Bronze {
	t.Helper()
	b := openTemp(t)
	src := benchRecords(1000)
	for range 20 {
		if err := b.Append(otherRecords(src)); err != nil {
			t.Fatal(err)
		}
	}
	if b.tail[0].first <= 3000 {
		t.Fatalf("the tail still holds record %d; the test does not read from the file", b.tail[0].first)
	}
	return b
}

// readFile reads max records from from, which the tail no longer holds,
// and checks them against the store.
func readFile(t *testing.T, b *Bronze, from uint64, max int) []Record {
	t.Helper()
	got, err := b.ReadInto(nil, from, max)
	if err != nil {
		t.Fatal(err)
	}
	sameRecords(t, "records read from the file", got, readStored(t, b, from, max))
	return got
}

// arenaOf is the arena of the copies readCopies holds that rec's payload
// is in, or nil.
func arenaOf(b *Bronze, rec Record) *byte {
	p := uintptr(unsafe.Pointer(unsafe.SliceData(rec.Payload)))
	b.tailMu.Lock()
	defer b.tailMu.Unlock()
	for _, s := range b.copies.spent {
		base := uintptr(unsafe.Pointer(unsafe.SliceData(s.arena)))
		if p >= base && p < base+uintptr(cap(s.arena)) {
			return unsafe.SliceData(s.arena)
		}
	}
	return nil
}

// TestFileReadCopiesAreReusedAfterRelease: when the reader releases what
// it read, the chunks ReadInto copies from the file go into arenas that
// are reused only once every record returned from them is released; the
// records read meanwhile stay intact, and those read into a reused arena
// are the new ones.
func TestFileReadCopiesAreReusedAfterRelease(t *testing.T) {
	b := openPastTail(t)
	b.ReleaseThrough(0) // the reader releases: copies are recycled from now on

	first := readFile(t, b, 1, 500)
	firstArena := arenaOf(b, first[0])
	if firstArena == nil {
		t.Fatal("the records read from the file are not in a recycled arena")
	}
	want := readStored(t, b, 1, 500)

	b.ReleaseThrough(499) // record 500 is still held
	second := readFile(t, b, 501, 500)
	if arenaOf(b, second[0]) == firstArena {
		t.Fatal("a read reused the arena of records 1-500 while record 500 was held")
	}
	sameRecords(t, "records held across a later read", first, want)

	b.ReleaseThrough(500)
	wantSecond := readStored(t, b, 501, 500)
	third := readFile(t, b, 1001, 500)
	if arenaOf(b, third[0]) != firstArena {
		t.Fatal("the released arena of records 1-500 was not reused by the next read")
	}
	sameRecords(t, "records held while another arena was reused", second, wantSecond)
}

// A reader that never releases keeps Read's promise: every chunk read from
// the file is a copy of its own, which nothing reuses.
func TestFileReadCopiesWithoutReleaseAreNotRecycled(t *testing.T) {
	b := openPastTail(t)
	first := readFile(t, b, 1, 500)
	want := readStored(t, b, 1, 500)
	for from := uint64(501); from < 3000; from += 500 {
		readFile(t, b, from, 500)
	}
	if arenaOf(b, first[0]) != nil || len(b.copies.spent) != 0 || len(b.copies.spare) != 0 {
		t.Fatalf("copies recycled for a reader that never released: %d spent, %d spare", len(b.copies.spent), len(b.copies.spare))
	}
	sameRecords(t, "records kept without a release", first, want)
}

// A read served from the tail again lets the spare arenas go: a reader
// that caught up holds no copies of the file.
func TestTailReadDropsSpareCopies(t *testing.T) {
	b := openPastTail(t)
	b.ReleaseThrough(0)
	recs := readFile(t, b, 1, 500)
	b.ReleaseThrough(recs[len(recs)-1].Seq)
	if len(b.copies.spare) == 0 {
		t.Fatal("no spare arena after the release")
	}
	if _, err := b.ReadInto(nil, b.tail[0].first, 10); err != nil {
		t.Fatal(err)
	}
	if n := len(b.copies.spare); n != 0 {
		t.Fatalf("%d spare arenas kept after a read from the tail, want none", n)
	}
}
