package main

import "strings"

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
// stays there, and the pipeline stays on one or two threads (load mode,
// 10,000 devices, CPU per million readings: 26-31 s against 34 at 5,000
// msgs/s, 11.5-12.5 against 13.3-14.4 at 25,000, about 5 % less unpaced;
// docs/performance.md, session 41). The costs: sysmon wakes 100
// times a second while the agent is idle (0.2 % of a core), the trace's
// one line goes to stderr every 24.8 days (and at start on a host up
// longer than that), and a fatal error also prints the scheduler's state.
const quietSchedtrace = "schedtrace=2147483647"

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
