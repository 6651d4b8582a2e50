// Package procattr sets the process attributes of the servers and agents
// the rig starts as child processes, so that they stop with the rig.
//
// # Caveats
//
//   - On Linux a child gets SIGKILL when the rig dies, even by SIGKILL
//     (PR_SET_PDEATHSIG). The kernel sends it when the OS thread that
//     started the child exits, not the process: the Go runtime keeps its
//     threads for the life of the process unless a goroutine exits while
//     locked to one (runtime.LockOSThread), which the rig never does.
//   - Elsewhere only the process group is set: a rig killed with SIGKILL
//     leaves its children running there.
package procattr
