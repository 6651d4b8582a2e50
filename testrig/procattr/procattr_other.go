//go:build !linux

package procattr

import "syscall"

// Child returns the attributes of a child process: its own process group,
// so that a Ctrl-C at the terminal reaches only the rig, which then stops
// its children in order. There is no parent-death signal here (see the
// package caveats).
func Child() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
