package procattr

import "syscall"

// Child returns the attributes of a child process: its own process group,
// so that a Ctrl-C at the terminal reaches only the rig, which then stops
// its children in order; and SIGKILL when the rig dies, so that a rig
// killed with SIGKILL (or crashing) leaves no agent or broker running.
func Child() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
