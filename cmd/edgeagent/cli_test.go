package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// Help goes to stdout with exit 0, flags included, however it is asked
// for; after a flag error the usage goes to stderr with the error, exit 2.
func TestHelpAndFlagErrors(t *testing.T) {
	for _, args := range [][]string{{"help", "status"}, {"status", "--help"}} {
		var out, errb bytes.Buffer
		if code := Run(context.Background(), args, &out, &errb); code != exitOK || !strings.Contains(out.String(), "Flags:") ||
			!strings.Contains(out.String(), "-addr") || errb.Len() != 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out.String(), errb.String())
		}
	}
	var out, errb bytes.Buffer
	if code := Run(context.Background(), []string{"inspect", "late", "--bogus"}, &out, &errb); code != exitUsage || out.Len() != 0 ||
		!strings.Contains(errb.String(), "flag provided but not defined: -bogus") || !strings.Contains(errb.String(), "Usage: edgeagent inspect late") {
		t.Errorf("a flag error: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}
