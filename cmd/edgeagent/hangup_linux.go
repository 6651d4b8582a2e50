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
