package main

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

// isTTY reports whether f is a terminal (TCGETS answers).
func isTTY(f *os.File) bool {
	var t syscall.Termios
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TCGETS, uintptr(unsafe.Pointer(&t)))
	return errno == 0
}

// reexec replaces the process with a new run of its binary, same arguments
// and environment, same PID (so systemd sees the same service). Go opens
// every file close-on-exec; the agent closed its own before this. It
// returns only on failure.
func reexec() error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the binary to start again: %w", err)
	}
	if err := syscall.Exec(exe, os.Args, os.Environ()); err != nil {
		return fmt.Errorf("start %s again: %w", exe, err)
	}
	return nil
}
