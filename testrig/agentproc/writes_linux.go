package agentproc

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// setFileSizeLimit sets the soft RLIMIT_FSIZE of process pid (prlimit(2),
// allowed on a process of the same user) to limit, or back to the rig's
// own soft limit, which every child inherits, when restore is set. The
// hard limit is left alone: lowering it could not be undone unprivileged.
func setFileSizeLimit(pid int, limit uint64, restore bool) error {
	var lim syscall.Rlimit
	if err := prlimit(pid, nil, &lim); err != nil {
		return err
	}
	if restore {
		var own syscall.Rlimit
		if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &own); err != nil {
			return err
		}
		limit = min(own.Cur, lim.Max)
	}
	lim.Cur = limit
	return prlimit(pid, &lim, nil)
}

func prlimit(pid int, set, old *syscall.Rlimit) error {
	_, _, errno := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), syscall.RLIMIT_FSIZE,
		uintptr(unsafe.Pointer(set)), uintptr(unsafe.Pointer(old)), 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// groupMembers lists the processes of process group pgid (the agent and,
// behind a wrapper script that did not exec it, the wrapper's children).
func groupMembers(pgid int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + ent.Name() + "/stat")
		if err != nil {
			continue // exited since the listing
		}
		// Fields after the command name, which is in parentheses and may
		// hold spaces: state, ppid, pgrp.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) > 2 && f[2] == strconv.Itoa(pgid) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// limitGroupWrites applies (or, with restore, lifts) a file size limit of
// 0 to every process of group pgid: each write(2) to a regular file then
// fails with EFBIG, the injected write error of disk_full where no small
// filesystem can be mounted. Go ignores the SIGXFSZ that comes with it.
// A process the group forks during a pass is not in its listing, so passes
// repeat until one finds no process it has not handled; a child forked
// after its parent was handled inherits the parent's limit.
func limitGroupWrites(pgid int, restore bool) error {
	done := map[int]bool{}
	var errs []error
	for pass := 0; ; pass++ {
		pids, err := groupMembers(pgid)
		if err != nil {
			return fmt.Errorf("agentproc: list the agent's processes: %w", err)
		}
		fresh := 0
		for _, pid := range pids {
			if done[pid] {
				continue
			}
			done[pid], fresh = true, fresh+1
			if err := setFileSizeLimit(pid, 0, restore); err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, fmt.Errorf("agentproc: file size limit of process %d: %w", pid, err))
			}
		}
		if fresh == 0 {
			return errors.Join(errs...)
		}
		if pass == 100 {
			return errors.Join(append(errs, errors.New("agentproc: the agent's process group keeps forking; file size limits may be incomplete"))...)
		}
	}
}
