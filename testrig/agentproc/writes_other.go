//go:build !linux

package agentproc

import "errors"

func limitGroupWrites(pgid int, restore bool) error {
	return errors.New("agentproc: write errors are injected only on Linux (prlimit)")
}
