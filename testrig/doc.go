// Package testrig holds the end-to-end checks of the real edgeagent binary:
// every stock scenario run short against simulated devices, faults and a
// verifying cloud (go test), and the load benchmark (make bench). The rig
// itself lives in the subpackages; see docs/testrig.md.
package testrig
