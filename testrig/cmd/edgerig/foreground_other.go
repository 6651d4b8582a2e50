//go:build !linux

package main

// takeTerminal does nothing here: under make, a Ctrl-C reaches make too,
// which then exits by the signal whatever the rig returned.
func takeTerminal() (restore func()) { return func() {} }
