package exepages

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/edgeagent/edgeagent/internal/boltkv"
)

// madvPopulateRead maps a range's pages in (Linux 5.14).
const madvPopulateRead = 22

func TestDropReleasesTheExecutablesPages(t *testing.T) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	var p Pages
	if err := p.Drop(); err != nil {
		t.Fatal(err)
	}
	if len(p.ranges) == 0 {
		t.Fatal("found none of the executable's mappings")
	}
	// Map all of them, as the agent's start does.
	for i := 0; i < len(p.ranges); i += 2 {
		if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, p.ranges[i], p.ranges[i+1], madvPopulateRead); errno != 0 {
			t.Skipf("madvise(MADV_POPULATE_READ) needs Linux 5.14: %v", errno)
		}
	}
	before, err := boltkv.MappedKiB(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Drop(); err != nil {
		t.Fatal(err)
	}
	after, err := boltkv.MappedKiB(exe)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for i := 1; i < len(p.ranges); i += 2 {
		total += int(p.ranges[i] >> 10)
	}
	t.Logf("%s: %d KiB resident before Drop, %d after; %d KiB read-only", exe, before, after, total)
	if before < total {
		// qemu-user reports its guest's maps itself and ignores
		// MADV_DONTNEED on file pages.
		t.Skipf("MADV_POPULATE_READ mapped %d of %d KiB: pages are not mapped here as on Linux (an emulator?)", before, total)
	}
	// The code that ran since (Drop's return, MappedKiB) faults back in,
	// in 64 KiB blocks (about 1 MiB of a 3 MiB test binary); the rest
	// must not come back.
	if before-after < total/2 {
		t.Errorf("Drop released %d KiB of %d KiB read-only: want at least half", before-after, total)
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
