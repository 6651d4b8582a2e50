package exepages

import (
	"encoding/binary"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

var (
	errNoRange = errors.New("a range or offset in /proc/self/smaps is not hex")
	errDrop    = errors.New("madvise refused a range of the executable")
	errEvict   = errors.New("posix_fadvise(POSIX_FADV_DONTNEED) refused a range of the executable")
	// errDisagree: an emulator's /proc (qemu-user 7.2 passes smaps through
	// from the host, at the host's addresses, but emulates maps).
	errDisagree = errors.New("/proc/self/smaps and /proc/self/maps list the executable's mappings differently; its pages are left alone")
)

// Pages is the executable's clean read-only mappings: its code, and its
// read-only data (the function tables the collector reads as it scans
// stacks, type descriptors, constants).
type Pages struct {
	ranges  []uintptr // start, length, 1 for code or 0 for data, file offset, start, …
	err     error     // Find's, for the first Drop to return
	flags   []byte    // the code's pagemap entries, read before each drop
	pagemap *os.File  // /proc/self/pagemap, once read
}

// Find reads the executable's mappings from /proc/self/smaps. They do not
// move while the process runs, but a mapping may stop being a clean copy
// of the file: a debugger's breakpoint or a uprobe is a private copy of a
// page of code. A mapping holding such a page when Find runs is left out.
// If Find fails, the first Drop returns its error (and drops what Find
// read before it).
func Find() *Pages {
	p, err := find("/proc/self/smaps", "/proc/self/maps")
	p.err = err
	return p
}

// Drop takes the executable's code and read-only data out of the
// resident set; what the agent runs faults back at once. Code with a page
// of its own is left alone: a debugger's breakpoint or a uprobe is a
// private copy of a page of code, and dropping it would bring the file's
// bytes back, silently removing the probe. Before each drop of code, Drop
// reads the code's pages' flags in /proc/self/pagemap and skips a mapping
// that holds such a page (a probe placed between that read and the drop,
// a few microseconds, would still be lost).
//
// With start, Drop also evicts the pages from the page cache and turns
// off the kernel's read-around for the mappings (MADV_RANDOM): a fault
// maps the 64 KiB around its page that the page cache holds, so with the
// whole file cached each function table the collector reads as it scans
// stacks brought its neighbours in too (4.1-4.8 MiB of the 5.3 resident
// under load, 1.8-2.7 evicted, measured), and each function the agent
// runs brought the code around it. Evicted, a page of data the agent uses
// is read from storage once, alone, and only the pages in use come back.
// Code is read ahead regardless on recent kernels (see the package doc).
func (p *Pages) Drop(start bool) (err error) {
	err, p.err = p.err, nil
	var exe *os.File
	var evict error // why the pages stay in the page cache, if they do: the drops go on
	if start {
		if exe, evict = os.Open("/proc/self/exe"); evict == nil {
			defer exe.Close()
			// Pages not yet written back stay cached: a binary built or
			// installed just before the start (make bench, an upgrade).
			evict = exe.Sync()
		}
	}
	for i := 0; i < len(p.ranges); i += 4 {
		at, n, code := p.ranges[i], p.ranges[i+1], p.ranges[i+2] == 1
		if code && !start && p.private(at, n) {
			continue
		}
		if start {
			if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, at, n, syscall.MADV_RANDOM); errno != 0 {
				return errDrop
			}
		}
		if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, at, n, syscall.MADV_DONTNEED); errno != 0 {
			return errDrop
		}
		if start && evict == nil {
			// x/sys/unix: each architecture's system call takes its own
			// argument order (32-bit ARM's arm_fadvise64_64).
			if unix.Fadvise(int(exe.Fd()), int64(p.ranges[i+3]), int64(n), unix.FADV_DONTNEED) != nil {
				evict = errEvict
			}
		}
	}
	if err == nil {
		err = evict
	}
	return err
}

// private reports whether the mapping at, n holds a page of its own,
// resident or swapped (pagemap bits 63 and 62), that is not the file's
// (bit 61), or whether its flags cannot be read (then nothing is known).
// The pagemap stays open: opening it costs a check of the process's
// access to itself, four times a second.
func (p *Pages) private(at, n uintptr) bool {
	if p.pagemap == nil {
		f, err := os.Open("/proc/self/pagemap")
		if err != nil {
			return true
		}
		p.pagemap = f
	}
	page := uintptr(os.Getpagesize())
	p.flags = slices.Grow(p.flags[:0], int(n/page)*8)[:n/page*8]
	if _, err := p.pagemap.ReadAt(p.flags, int64(at/page*8)); err != nil {
		return true
	}
	for i := 0; i < len(p.flags); i += 8 {
		if e := binary.NativeEndian.Uint64(p.flags[i:]); e&(3<<62) != 0 && e&(1<<61) == 0 {
			return true
		}
	}
	return false
}

// find reads the executable's mappings from smaps (/proc/self/smaps but
// in tests), keeping each private read-only mapping of the executable's
// file (matched by the end of the line: its path may hold spaces, or end
// in " (deleted)" once an upgrade replaced it, as /proc/self/exe's does)
// with no page of its own, in memory or in swap (Anonymous and Swap 0).
// Such a page (one the dynamic loader relocated, RELRO; a breakpoint) is
// not a copy of the file, and dropping it would bring the file's bytes
// back. With an error, it returns the mappings read before it, all valid.
//
// Each of the executable's mappings in smaps must be in maps (the same
// range, permissions and offset), or find keeps none. Under qemu-user
// 7.2, smaps is the host's, its addresses shifted by the emulator's base,
// and maps the guest's: madvise on smaps' ranges reached the first page
// of the executable's writable data, which went back to the file's bytes
// (the runtime's poller lost its descriptor, and the agent could not
// listen). The kernel lists the same mappings in both.
func find(smaps, maps string) (*Pages, error) {
	p := &Pages{}
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return p, err
	}
	exe = " " + exe // how its mappings' first lines end
	m, err := os.ReadFile(maps)
	if err != nil {
		return p, err
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(string(m), "\n") {
		if key := exeMapping(line, exe, strings.Fields(line)); key != "" {
			listed[key] = true
		}
	}
	b, err := os.ReadFile(smaps)
	if err != nil {
		return p, err
	}
	var candidate string
	var code, offset uintptr
	for rest := string(b); rest != ""; {
		var line string
		line, rest, _ = strings.Cut(rest, "\n")
		fields := strings.Fields(line)
		key := exeMapping(line, exe, fields)
		switch { // every mapping's lines end with Anonymous, then Swap
		case len(fields) == 3 && fields[1] != "0" && (fields[0] == "Anonymous:" || fields[0] == "Swap:"):
			candidate = "" // pages of its own
		case len(fields) == 3 && fields[0] == "Swap:" && candidate != "":
			lo, hi, _ := strings.Cut(candidate, "-")
			start, err1 := strconv.ParseUint(lo, 16, 64)
			end, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 != nil || err2 != nil {
				return p, errNoRange
			}
			p.ranges = append(p.ranges, uintptr(start), uintptr(end-start), code, offset)
			candidate = ""
		case key != "" && !listed[key]:
			return &Pages{}, errDisagree
		case key != "" && (fields[1] == "r-xp" || fields[1] == "r--p"):
			off, err := strconv.ParseUint(fields[2], 16, 64)
			if err != nil {
				return p, errNoRange
			}
			candidate, code, offset = fields[0], 0, uintptr(off)
			if fields[1] == "r-xp" {
				code = 1
			}
		}
	}
	return p, nil
}

// exeMapping returns the range, permissions and offset of the mapping
// whose first line is line (split into fields), if it maps the executable
// (exe is " " and its path, how such lines end), and "" otherwise.
func exeMapping(line, exe string, fields []string) string {
	if len(fields) < 6 || !strings.HasSuffix(line, exe) {
		return ""
	}
	return fields[0] + " " + fields[1] + " " + fields[2]
}
