package main

import (
	"os"
	"strings"
	"syscall"
)

// quietSchedtrace is the GODEBUG setting `edgeagent run` starts with: a
// scheduler trace every 2^31-1 ms (24.8 days), the longest the runtime
// takes. The trace is not what it is for. Go's system monitor (sysmon)
// sleeps deeply whenever every P is idle, and the next system call wakes
// it with its 20 µs polling restarted; while it polls, a call that lasts
// one poll (an fdatasync, a large pwrite) loses its P to another thread
// (handoffp). An agent that idles between messages restarts that storm
// each time: at 5,000 msgs/s sysmon switched in and out 3,800 times a
// second, and the agent's work ran on four threads. With schedtrace set,
// sysmon never sleeps deeply, so its polling backs off to every 10 ms and
// stays there, and the pipeline stays on one thread (load mode, 10,000
// devices: 26 s of CPU per million readings against 34 at 5,000 msgs/s,
// 11.5-11.8 against 13.3-14.3 at 25,000, 9.4-11.1 against 10.5-12.2
// unpaced; docs/performance.md, session 41). The costs: sysmon wakes 100
// times a second while the agent is idle (0.2 % of a core), the trace's
// one line goes to stderr every 24.8 days (and at start on a host up
// longer than that), and a fatal error also prints the scheduler's state.
const quietSchedtrace = "schedtrace=2147483647"

// quietSysmon re-executes `edgeagent run` with quietSchedtrace added to
// GODEBUG, before anything else happens in the process (no file is open,
// no signal handler is installed: a SIGTERM before the exec ends the
// process, as it would have). GODEBUG is read once, when the runtime
// starts, so it cannot be set from inside. A GODEBUG that names schedtrace
// already (schedtrace=0 turns this off) is left as it is, which also stops
// the new image from doing it again. If the exec fails (no /proc, the file
// removed since), the agent runs on as it is.
func quietSysmon(args []string) {
	if len(args) < 2 || args[1] != "run" {
		return
	}
	godebug, set := os.LookupEnv("GODEBUG")
	if namesSetting(godebug, "schedtrace") {
		return
	}
	value := quietSchedtrace
	if set && godebug != "" {
		value = godebug + "," + quietSchedtrace
	}
	env := make([]string, 0, len(os.Environ())+1)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GODEBUG=") {
			env = append(env, kv)
		}
	}
	env = append(env, "GODEBUG="+value)
	// The executable's path, not /proc/self/exe, which would name the
	// process "exe" (its comm, what ps and systemd show). argv stays as it
	// was.
	exe, err := os.Executable()
	if err != nil {
		return
	}
	_ = syscall.Exec(exe, args, env) // returns only if it failed
}

// namesSetting reports whether the GODEBUG value godebug sets name, or,
// when name is key=value, sets key to value.
func namesSetting(godebug, name string) bool {
	for _, kv := range strings.Split(godebug, ",") {
		kv = strings.TrimSpace(kv)
		if k, _, _ := strings.Cut(kv, "="); k == name || kv == name {
			return true
		}
	}
	return false
}

// sysmonMode names, for the start's log, how the system monitor runs.
func sysmonMode() string {
	godebug := os.Getenv("GODEBUG")
	switch {
	case strings.Contains(godebug, quietSchedtrace):
		return "quiet"
	case namesSetting(godebug, "schedtrace") && !namesSetting(godebug, "schedtrace=0"):
		return "GODEBUG's schedtrace"
	}
	return "default"
}
