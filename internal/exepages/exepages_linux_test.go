package exepages

import (
	_ "embed"
	"encoding/binary"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"
)

// madvPopulateRead maps a range's pages in (Linux 5.14).
const madvPopulateRead = 22

// cold is 384 KiB of the test binary's read-only data that nothing reads,
// so no fault maps its middle back once Drop has released it.
//
//go:embed testdata/cold.txt
var cold string

// mapped says whether the page holding addr is in the process's page
// table (bit 63 of its /proc/self/pagemap entry).
func mapped(t *testing.T, pagemap *os.File, addr uintptr) bool {
	t.Helper()
	var entry [8]byte
	if _, err := pagemap.ReadAt(entry[:], int64(addr/uintptr(os.Getpagesize()))*8); err != nil {
		t.Fatal(err)
	}
	return binary.LittleEndian.Uint64(entry[:])>>63 == 1
}

// readOnly finds the executable's read-only ranges and checks that it
// found code, and cold in its data.
func readOnly(t *testing.T) *Pages {
	t.Helper()
	p := Find()
	if p.err == errDisagree {
		// qemu-user 7.2 (make test-armv7): smaps is the host's. Find
		// must then keep nothing, and the first Drop say why.
		if len(p.ranges) != 0 {
			t.Fatalf("smaps and maps disagree, yet Find kept %#x", p.ranges)
		}
		if err := p.Drop(false); err != errDisagree {
			t.Fatalf("first Drop where smaps and maps disagree: %v, want %v", err, errDisagree)
		}
		t.Skip("smaps and maps list the executable differently here (an emulator): nothing to drop")
	}
	if p.err != nil {
		t.Fatal(p.err)
	}
	start := uintptr(unsafe.Pointer(unsafe.StringData(cold)))
	for i := 0; i < len(p.ranges); i += 4 {
		if p.ranges[i+2] == 0 && p.ranges[i] <= start && start < p.ranges[i]+p.ranges[i+1] {
			return p
		}
	}
	t.Fatalf("the embedded data at %#x is in none of the data ranges found: %#x", start, p.ranges)
	return nil
}

// coldPages counts the mapped pages of cold's middle, 64 KiB (fault-
// around's reach) in from each end, after mapping all of p's ranges in as
// the agent's start does; it skips the test where that does not map them.
func coldPages(t *testing.T, p *Pages) (count func() int, pages int) {
	t.Helper()
	pagemap, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Skipf("no pagemap: %v", err)
	}
	t.Cleanup(func() { pagemap.Close() })
	for i := 0; i < len(p.ranges); i += 4 {
		if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, p.ranges[i], p.ranges[i+1], madvPopulateRead); errno != 0 {
			t.Skipf("madvise(MADV_POPULATE_READ) needs Linux 5.14: %v", errno)
		}
	}
	start := uintptr(unsafe.Pointer(unsafe.StringData(cold)))
	page := uintptr(os.Getpagesize())
	lo := (start + 64<<10 + page - 1) &^ (page - 1)
	hi := (start + uintptr(len(cold)) - 64<<10) &^ (page - 1)
	count = func() (n int) {
		for addr := lo; addr < hi; addr += page {
			if mapped(t, pagemap, addr) {
				n++
			}
		}
		return n
	}
	pages = int((hi - lo) / page)
	if n := count(); n != pages {
		// qemu-user keeps its guest's memory behind its own maps.
		t.Skipf("%d of %d pages mapped after MADV_POPULATE_READ: pages are not mapped here as on Linux (an emulator?)", n, pages)
	}
	return count, pages
}

func TestDropReleasesTheExecutablesPages(t *testing.T) {
	p := readOnly(t)
	count, pages := coldPages(t, p)
	codes := 0
	for i := 2; i < len(p.ranges); i += 4 {
		codes += int(p.ranges[i])
	}
	if codes == 0 {
		t.Fatalf("found no code mapping: %#x", p.ranges)
	}
	code := codePages(t, p)
	before := code()
	if err := p.Drop(false); err != nil {
		t.Fatal(err)
	}
	// What runs between the drop and the count faults back with the code
	// around it: far less than the test binary's code.
	after := code()
	if n := count(); n != 0 {
		t.Errorf("%d of %d pages of unread data still mapped after Drop, want 0", n, pages)
	}
	if after > before/2 {
		t.Errorf("%d of the %d pages of code mapped before Drop are still mapped after it, want at most half", after, before)
	}
}

// codePages returns a count of p's code pages in the page table (bit 63
// of their pagemap entries), read at once: what a count runs faults its
// code back in, with the 64 KiB around each page.
func codePages(t *testing.T, p *Pages) func() int {
	t.Helper()
	pagemap, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Skipf("no pagemap: %v", err)
	}
	t.Cleanup(func() { pagemap.Close() })
	page := uintptr(os.Getpagesize())
	var entries []byte
	return func() (n int) {
		for i := 0; i < len(p.ranges); i += 4 {
			if p.ranges[i+2] == 1 {
				entries = slices.Grow(entries[:0], int(p.ranges[i+1]/page*8))[:p.ranges[i+1]/page*8]
				if _, err := pagemap.ReadAt(entries, int64(p.ranges[i]/page*8)); err != nil {
					t.Fatal(err)
				}
				for j := 0; j < len(entries); j += 8 {
					n += int(binary.NativeEndian.Uint64(entries[j:]) >> 63)
				}
			}
		}
		return n
	}
}

// TestDropLeavesCodeWithAPrivatePage: a debugger's breakpoint or a uprobe
// is a private copy of a page of code. Drop, which runs every 250 ms, must
// leave a mapping holding one, or it would bring the file's bytes back.
func TestDropLeavesCodeWithAPrivatePage(t *testing.T) {
	p := readOnly(t)
	// Skips where pages are not mapped as on Linux: qemu-user answers the
	// guest's pagemap reads from its own process.
	coldPages(t, p)
	pagemap, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Skipf("no pagemap: %v", err)
	}
	defer pagemap.Close()
	entry := func(addr uintptr) uint64 {
		var e [8]byte
		if _, err := pagemap.ReadAt(e[:], int64(addr/uintptr(os.Getpagesize()))*8); err != nil {
			t.Fatal(err)
		}
		return binary.NativeEndian.Uint64(e[:])
	}
	// Rewrite a byte of code with its own value through /proc/self/mem,
	// as a debugger writes a breakpoint: its page becomes the process's
	// own copy.
	addr := reflect.ValueOf(codePages).Pointer()
	mem, err := os.OpenFile("/proc/self/mem", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no /proc/self/mem: %v", err)
	}
	defer mem.Close()
	b := make([]byte, 1)
	if _, err := mem.ReadAt(b, int64(addr)); err != nil {
		t.Fatal(err)
	}
	if _, err := mem.WriteAt(b, int64(addr)); err != nil {
		t.Skipf("writing code through /proc/self/mem: %v", err)
	}
	page := uintptr(os.Getpagesize())
	t.Cleanup(func() { // the file's page back, for the tests after this one
		if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, addr&^(page-1), page, syscall.MADV_DONTNEED); errno != 0 {
			t.Error(errno)
		}
	})
	if e := entry(addr); e>>63 != 1 || e>>61&1 != 0 {
		t.Skipf("the written page of code is not a private copy in pagemap (%#x): pages are not mapped here as on Linux (an emulator?)", e)
	}
	if err := p.Drop(false); err != nil {
		t.Fatal(err)
	}
	if e := entry(addr); e>>63 != 1 || e>>61&1 != 0 {
		t.Fatalf("the private page of code is %#x in pagemap after Drop, want present and not the file's: Drop brought the file's bytes back", e)
	}
}

// TestStartDropEvictsTheData: the start's Drop takes the data's unmapped
// pages out of the page cache and turns off read-around for its mappings,
// code and data, so that a fault maps only pages in use, not the 64 KiB
// around them.
func TestStartDropEvictsTheData(t *testing.T) {
	p := readOnly(t)
	_, pages := coldPages(t, p)
	start := uintptr(unsafe.Pointer(unsafe.StringData(cold)))
	page := uintptr(os.Getpagesize())
	lo := (start + 64<<10 + page - 1) &^ (page - 1)
	cached := func() (n int) {
		vec := make([]byte, pages)
		if _, _, errno := syscall.Syscall(syscall.SYS_MINCORE, lo, uintptr(pages)*page, uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
			t.Fatalf("mincore: %v", errno)
		}
		for _, v := range vec {
			n += int(v & 1)
		}
		return n
	}
	if n := cached(); n != pages {
		t.Fatalf("%d of %d pages of cold in the page cache after they were mapped, want all", n, pages)
	}
	if err := p.Drop(true); err != nil {
		t.Fatal(err)
	}
	// The kernel evicts whole folios; one that also holds data in use
	// stays.
	if n := cached(); n > pages/4 {
		t.Errorf("%d of %d pages of unread data still in the page cache after the start's Drop, want at most a quarter", n, pages)
	}
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	// The code's mapping too: each function the test binary runs would
	// map the 64 KiB around it again.
	for name, at := range map[string]uintptr{"cold's mapping": start, "the code's mapping": reflect.ValueOf(codePages).Pointer()} {
		var in, found bool
		for line := range strings.Lines(string(smaps)) {
			if f := strings.Fields(line); len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
				lohi := strings.SplitN(f[0], "-", 2)
				a, _ := strconv.ParseUint(lohi[0], 16, 64)
				b, _ := strconv.ParseUint(lohi[1], 16, 64)
				in = uintptr(a) <= at && at < uintptr(b)
			} else if in && strings.HasPrefix(line, "VmFlags:") {
				found = true
				if !slices.Contains(strings.Fields(line)[1:], "rr") {
					t.Errorf("%s has %q, want the random-read flag rr (MADV_RANDOM)", name, strings.TrimSpace(line))
				}
			}
		}
		if !found {
			t.Fatalf("no mapping in /proc/self/smaps holds %s at %#x", name, at)
		}
	}
}

// TestFindLeavesPrivateCopiesOut: a debugger's breakpoint or a uprobe
// writes a private copy of a page of code; a mapping holding one when Find
// runs is left out, so Drop does not bring the file's bytes back in its
// place.
func TestFindLeavesPrivateCopiesOut(t *testing.T) {
	count, pages := coldPages(t, readOnly(t))
	page := os.Getpagesize()
	start := uintptr(unsafe.Pointer(unsafe.StringData(cold)))
	// A page-aligned page of cold, 128 KiB into it.
	at := int((start+uintptr(page)-1)&^uintptr(page-1)-start) + 128<<10
	mem := unsafe.Slice(unsafe.StringData(cold), len(cold))[at : at+page]
	if err := syscall.Mprotect(mem, syscall.PROT_READ|syscall.PROT_WRITE); err != nil {
		t.Fatal(err)
	}
	was := mem[0]
	mem[0] = '#'
	if err := syscall.Mprotect(mem, syscall.PROT_READ); err != nil {
		t.Fatal(err)
	}
	// Dropping the copy itself brings the file's page back, for the
	// tests after this one.
	t.Cleanup(func() {
		if err := syscall.Madvise(mem, syscall.MADV_DONTNEED); err != nil {
			t.Error(err)
		}
		if mem[0] != was {
			t.Errorf("cold's byte is %q after the cleanup, want %q", mem[0], was)
		}
	})
	p := Find()
	if err := p.Drop(true); err != nil {
		t.Fatal(err)
	}
	if mem[0] != '#' {
		t.Fatalf("the private copy's byte is %q after Drop, want '#': Drop brought the file's page back", mem[0])
	}
	// The mapping that holds the copy keeps its pages; the rest goes.
	t.Logf("%d of %d pages of cold mapped after Drop, beside a private copy", count(), pages)
}

func TestFindKeepsCleanReadOnlyMappingsOfTheExecutable(t *testing.T) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	smaps := "" +
		"00400000-00923000 r-xp 00000000 fe:00 123 " + exe + "\n" +
		"Size:               5260 kB\nRss:                4748 kB\nAnonymous:             0 kB\nSwap:                  0 kB\n" +
		"VmFlags: rd ex mr mw me\n" +
		"00923000-00e68000 r--p 00523000 fe:00 123 " + exe + "\n" +
		"Rss:                4564 kB\nAnonymous:             0 kB\nSwap:                  0 kB\n" +
		// Relocated by the dynamic loader, then made read-only (RELRO).
		"00e68000-00e70000 r--p 00a68000 fe:00 123 " + exe + "\n" +
		"Rss:                  32 kB\nAnonymous:            32 kB\nSwap:                  0 kB\n" +
		// The same, its private pages swapped out: Anonymous counts
		// resident pages only.
		"00e70000-00e78000 r--p 00a70000 fe:00 123 " + exe + "\n" +
		"Rss:                   0 kB\nAnonymous:             0 kB\nSwap:                 32 kB\n" +
		"00e78000-00ecc000 rw-p 00a78000 fe:00 123 " + exe + "\n" +
		"Anonymous:             0 kB\nSwap:                  0 kB\n" +
		"7f0000000000-7f0000100000 r--p 00000000 fe:00 456 /usr/lib/other.so\n" +
		"Anonymous:             0 kB\nSwap:                  0 kB\n" +
		// A file whose path only starts like the executable's.
		"7f0800000000-7f0800100000 r--p 00000000 fe:00 457 " + exe + ".old\n" +
		"Anonymous:             0 kB\nSwap:                  0 kB\n" +
		"7f1000000000-7f1000100000 r--s 00000000 fe:00 789 /var/lib/edgeagent/state.db\n" +
		"Anonymous:             0 kB\nSwap:                  0 kB\n" +
		"7f2000000000-7f2000100000 rw-p 00000000 00:00 0\n" +
		"Anonymous:          1024 kB\nSwap:                  0 kB\n"
	path := filepath.Join(t.TempDir(), "smaps")
	if err := os.WriteFile(path, []byte(smaps), 0o600); err != nil {
		t.Fatal(err)
	}
	// maps lists the same mappings, without the statistics.
	var maps strings.Builder
	for _, line := range strings.Split(smaps, "\n") {
		if f := strings.Fields(line); len(f) >= 5 && strings.Contains(f[0], "-") {
			maps.WriteString(line + "\n")
		}
	}
	mapsPath := filepath.Join(t.TempDir(), "maps")
	if err := os.WriteFile(mapsPath, []byte(maps.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := find(path, mapsPath)
	if err != nil {
		t.Fatal(err)
	}
	if want := []uintptr{0x400000, 0x523000, 1, 0, 0x923000, 0x545000, 0, 0x523000}; !slices.Equal(got.ranges, want) {
		t.Errorf("find = %#x, want %#x (the executable's code and clean read-only data only)", got.ranges, want)
	}

	// qemu-user 7.2: smaps is the host's, 4 KiB above the guest's maps,
	// and shows code as r--p. Dropping its ranges would drop the first
	// page of the writable data.
	shifted := strings.NewReplacer("00400000-00923000 r-xp", "00401000-00924000 r--p").Replace(maps.String())
	if err := os.WriteFile(mapsPath, []byte(shifted), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := find(path, mapsPath); err != errDisagree || len(got.ranges) != 0 {
		t.Errorf("find with maps unlike smaps = %#x, %v; want no ranges and %v", got.ranges, err, errDisagree)
	}

	if err := os.WriteFile(path, []byte("0040000g-00923000 r-xp 00000000 fe:00 123 "+exe+"\nAnonymous: 0 kB\nSwap: 0 kB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := find(path, path); err != errNoRange {
		t.Errorf("find on a range that is not hex: err %v, want %v", err, errNoRange)
	}
	if err := os.WriteFile(path, []byte("00400000-00923000 r-xp 0000000x fe:00 123 "+exe+"\nAnonymous: 0 kB\nSwap: 0 kB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := find(path, path); err != errNoRange {
		t.Errorf("find on an offset that is not hex: err %v, want %v", err, errNoRange)
	}
	missing, err := find(filepath.Join(t.TempDir(), "missing"), mapsPath)
	if !os.IsNotExist(err) {
		t.Errorf("find on a missing file: err %v, want it not to exist", err)
	}
	// As Find hands it on: the first Drop reports the error, later ones
	// drop nothing and say nothing.
	missing.err = err
	if err := missing.Drop(true); !os.IsNotExist(err) {
		t.Errorf("first Drop after a failed find: err %v, want find's", err)
	}
	if err := missing.Drop(true); err != nil || len(missing.ranges) != 0 {
		t.Errorf("second Drop after a failed find: err %v, ranges %#x, want nothing", err, missing.ranges)
	}
}

// BenchmarkDrop: what the agent spends every 250 ms (the advice; the
// faults that bring the pages in use back come after).
func BenchmarkDrop(b *testing.B) {
	p := Find()
	if p.err != nil {
		b.Fatal(p.err)
	}
	for b.Loop() {
		if err := p.Drop(false); err != nil {
			b.Fatal(err)
		}
	}
}
