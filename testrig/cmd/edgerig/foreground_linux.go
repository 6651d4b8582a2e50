package main

import (
	"os"
	"os/signal"
	"syscall"
	"unsafe"
)

// takeTerminal puts the rig in a process group of its own and makes that
// group the terminal's foreground, when the rig was started in the
// foreground group of another program without job control — make, go
// run. A Ctrl-C then reaches the rig alone: GNU make, reached too, would
// wait for the rig and then exit by the signal ("Interrupt", status 130)
// whatever the rig returned, and go run would exit 1; this way `make
// demo` stopped with Ctrl-C exits with the rig's own status. It returns
// the function that gives the terminal back; it does nothing (and returns
// a no-op) when stdin is not a terminal, the rig is not in the foreground,
// or it already leads its group (a shell with job control started it).
func takeTerminal() (restore func()) {
	noop := func() {}
	fd := int(os.Stdin.Fd())
	fg, err := tcgetpgrp(fd)
	if err != nil || fg != syscall.Getpgrp() || syscall.Getpgrp() == os.Getpid() {
		return noop
	}
	// A background group that sets the foreground gets SIGTTOU, and a
	// Ctrl-Z would stop the rig while make waits for it, leaving the
	// terminal to a stopped group: ignore both.
	signal.Ignore(syscall.SIGTTOU, syscall.SIGTSTP)
	if err := syscall.Setpgid(0, 0); err != nil {
		return noop
	}
	if err := tcsetpgrp(fd, os.Getpid()); err != nil {
		_ = syscall.Setpgid(0, fg) // back into the group that has the terminal
		return noop
	}
	return func() { _ = tcsetpgrp(fd, fg) }
}

func tcgetpgrp(fd int) (int, error) {
	var pgrp int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCGPGRP, uintptr(unsafe.Pointer(&pgrp))); e != 0 {
		return 0, e
	}
	return int(pgrp), nil
}

func tcsetpgrp(fd, pgrp int) error {
	p := int32(pgrp)
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCSPGRP, uintptr(unsafe.Pointer(&p))); e != 0 {
		return e
	}
	return nil
}
