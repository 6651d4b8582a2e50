//go:build !pprof

package main

import "runtime"

// noMemProfile is the GODEBUG setting `edgeagent run` starts with (see
// sysmon_linux.go): no heap profile sampling from the runtime's start. A
// release build has no way to read a heap profile, but the runtime samples
// one anyway (something linked keeps runtime.MemProfile reachable): every
// 512 KiB allocated on average, a stack unwound and a bucket kept for it
// in a 1.4 MB hash table, whose pages the buckets touch at random
// (profiling/buckets in the runtime's memory classes under load: 1.44
// MB). A -tags pprof build keeps sampling (pprof.go).
const noMemProfile = "memprofilerate=0"

// Where the start is not re-executed (other systems, other commands), the
// sampling stops here, after the packages' own initialisation.
func init() { runtime.MemProfileRate = 0 }
