package main

import (
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

// hasControllingTerminal reports whether the process has one: /dev/tty
// opens only then. A service started by systemd has none; an agent run
// from a shell has, whatever its output is redirected to.
func hasControllingTerminal() bool {
	f, err := os.Open("/dev/tty")
	if err != nil {
		return false
	}
	f.Close()
	return true
}
