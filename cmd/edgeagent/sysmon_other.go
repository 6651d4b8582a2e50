//go:build !linux

package main

// quietSysmon is Linux-only: elsewhere `edgeagent run` keeps Go's default
// system monitor (see sysmon_linux.go).
func quietSysmon([]string) {}

func sysmonMode() string { return "default" }
