package main

import (
	"os"
	"slices"
	"strings"
	"syscall"
)

// quietSysmon re-executes `edgeagent run` with quietSchedtrace and
// noMemProfile added to GODEBUG, before anything else happens in the
// process (no file is open, no signal handler is installed: a SIGTERM
// before the exec ends the process, as it would have). GODEBUG is read
// once, when the runtime starts, so it cannot be set from inside. A
// setting GODEBUG names already (schedtrace=0 turns the quiet sysmon off)
// is left as it is, which also stops the new image from doing it again. If
// the exec fails (no /proc, the file removed since), the agent runs on as
// it is.
func quietSysmon(args []string) {
	if len(args) < 2 || args[1] != "run" {
		return
	}
	godebug := os.Getenv("GODEBUG")
	var add []string
	if !namesSetting(godebug, "schedtrace") {
		add = append(add, quietSchedtrace)
	}
	if noMemProfile != "" && !namesSetting(godebug, "memprofilerate") {
		add = append(add, noMemProfile)
	}
	if len(add) == 0 {
		return
	}
	value := strings.Join(add, ",")
	if godebug != "" {
		value = godebug + "," + value
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GODEBUG=") })
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

// sysmonMode names, for the start's log, how the system monitor runs.
func sysmonMode() string {
	godebug := os.Getenv("GODEBUG")
	switch {
	case namesSetting(godebug, quietSchedtrace):
		return "quiet"
	case namesSetting(godebug, "schedtrace") && !namesSetting(godebug, "schedtrace=0"):
		return "GODEBUG's schedtrace"
	}
	return "default"
}
