package exepages

import (
	_ "embed"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
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

func TestDropReleasesTheExecutablesPages(t *testing.T) {
	pagemap, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Skipf("no pagemap: %v", err)
	}
	defer pagemap.Close()
	var p Pages
	if err := p.Drop(); err != nil {
		t.Fatal(err)
	}
	start := uintptr(unsafe.Pointer(unsafe.StringData(cold)))
	inRange := false
	for i := 0; i < len(p.ranges); i += 2 {
		inRange = inRange || p.ranges[i] <= start && start < p.ranges[i]+p.ranges[i+1]
	}
	if !inRange {
		t.Fatalf("the embedded data at %#x is in none of the ranges found: %#x", start, p.ranges)
	}
	// Map everything in, as the agent's start does.
	for i := 0; i < len(p.ranges); i += 2 {
		if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, p.ranges[i], p.ranges[i+1], madvPopulateRead); errno != 0 {
			t.Skipf("madvise(MADV_POPULATE_READ) needs Linux 5.14: %v", errno)
		}
	}
	// The middle of cold: 64 KiB (fault-around's reach) in from each end.
	page := uintptr(os.Getpagesize())
	lo := (start + 64<<10 + page - 1) &^ (page - 1)
	hi := (start + uintptr(len(cold)) - 64<<10) &^ (page - 1)
	count := func() (n int) {
		for addr := lo; addr < hi; addr += page {
			if mapped(t, pagemap, addr) {
				n++
			}
		}
		return n
	}
	pages := int((hi - lo) / page)
	if n := count(); n != pages {
		// qemu-user keeps its guest's memory behind its own maps.
		t.Skipf("%d of %d pages mapped after MADV_POPULATE_READ: pages are not mapped here as on Linux (an emulator?)", n, pages)
	}
	if err := p.Drop(); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 0 {
		t.Errorf("%d of %d pages of unread data still mapped after Drop, want 0", n, pages)
	}
}

func TestFindKeepsCleanReadOnlyMappingsOfTheExecutable(t *testing.T) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	smaps := "" +
		"00400000-00923000 r-xp 00000000 fe:00 123 " + exe + "\n" +
		"Size:               5260 kB\nRss:                4748 kB\nAnonymous:             0 kB\n" +
		"00923000-00e68000 r--p 00523000 fe:00 123 " + exe + "\n" +
		"Rss:                4564 kB\nAnonymous:             0 kB\n" +
		// Relocated by the dynamic loader, then made read-only (RELRO).
		"00e68000-00e70000 r--p 00a68000 fe:00 123 " + exe + "\n" +
		"Rss:                  32 kB\nAnonymous:            32 kB\n" +
		"00e70000-00ecc000 rw-p 00a70000 fe:00 123 " + exe + "\n" +
		"Anonymous:             0 kB\n" +
		"7f0000000000-7f0000100000 r--p 00000000 fe:00 456 /usr/lib/other.so\n" +
		"Anonymous:             0 kB\n" +
		"7f1000000000-7f1000100000 r--s 00000000 fe:00 789 /var/lib/edgeagent/state.db\n" +
		"Anonymous:             0 kB\n" +
		"7f2000000000-7f2000100000 rw-p 00000000 00:00 0\n" +
		"Anonymous:          1024 kB\n"
	path := filepath.Join(t.TempDir(), "smaps")
	if err := os.WriteFile(path, []byte(smaps), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := find(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []uintptr{0x400000, 0x523000, 0x923000, 0x545000}
	if !slices.Equal(got, want) {
		t.Errorf("find = %#x, want %#x (the executable's text and read-only data only)", got, want)
	}

	if err := os.WriteFile(path, []byte("0040000g-00923000 r-xp 00000000 fe:00 123 "+exe+"\nAnonymous: 0 kB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := find(path); err != errNoRange {
		t.Errorf("find on a range that is not hex: err %v, want %v", err, errNoRange)
	}
	if _, err := find(filepath.Join(t.TempDir(), "missing")); !os.IsNotExist(err) {
		t.Errorf("find on a missing file: err %v, want it not to exist", err)
	}
}
