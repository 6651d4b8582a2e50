//go:build pprof

package main

// Built with -tags pprof, the agent serves net/http/pprof on
// $EDGEAGENT_PPROF (e.g. 127.0.0.1:6060) for profiling under load. Release
// builds leave it out.

import (
	"net/http"
	_ "net/http/pprof"
	"os"
	"runtime"
	"strconv"
)

// noMemProfile is empty: a profiling build samples the heap (see
// memprofile.go).
const noMemProfile = ""

func init() {
	// A finer heap sample rate (bytes) for exact per-structure sizes.
	if r, err := strconv.Atoi(os.Getenv("EDGEAGENT_MEMPROFILERATE")); err == nil && r > 0 {
		runtime.MemProfileRate = r
	}
	if addr := os.Getenv("EDGEAGENT_PPROF"); addr != "" {
		go http.ListenAndServe(addr, nil)
	}
}
