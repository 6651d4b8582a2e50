package exepages

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Pages is the executable's read-only mappings, found by the first Drop:
// they do not move while the process runs. The zero value is ready.
type Pages struct {
	found  bool
	ranges []uintptr // start, length, start, length, …
}

var errNoRange = errors.New("a range in /proc/self/smaps is not hex")

// Drop takes the executable's pages out of the resident set; the code
// running now faults its own pages back at once. An error finding them
// is returned once, and later calls then do nothing.
func (p *Pages) Drop() error {
	if !p.found {
		p.found = true
		var err error
		if p.ranges, err = find("/proc/self/smaps"); err != nil {
			return err
		}
	}
	for i := 0; i < len(p.ranges); i += 2 {
		if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, p.ranges[i], p.ranges[i+1], syscall.MADV_DONTNEED); errno != 0 {
			return errno
		}
	}
	return nil
}

// find reads the executable's mappings from smaps (/proc/self/smaps but
// in tests). It keeps only private read-only mappings of the executable's
// file with no page of their own (Anonymous 0): a page the dynamic loader
// relocated (RELRO) is not a copy of the file, and dropping it would
// bring the file's bytes back.
func find(smaps string) ([]uintptr, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(smaps)
	if err != nil {
		return nil, err
	}
	var ranges []uintptr
	var candidate string
	for rest := string(b); rest != ""; {
		var line string
		line, rest, _ = strings.Cut(rest, "\n")
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		if strings.Contains(fields[0], "-") {
			candidate = ""
			if len(fields) == 6 && fields[5] == exe && (fields[1] == "r-xp" || fields[1] == "r--p") {
				candidate = fields[0]
			}
			continue
		}
		if candidate != "" && fields[0] == "Anonymous:" && fields[1] == "0" {
			lo, hi, _ := strings.Cut(candidate, "-")
			start, err1 := strconv.ParseUint(lo, 16, 64)
			end, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 != nil || err2 != nil {
				return nil, errNoRange
			}
			ranges = append(ranges, uintptr(start), uintptr(end-start))
		}
	}
	return ranges, nil
}
