package testrig_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	buildOnce sync.Once
	agentBin  string
	buildErr  error
	buildDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// agent builds the real edgeagent binary once per test process.
func agent(tb testing.TB) string {
	tb.Helper()
	buildOnce.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			buildErr = err
			return
		}
		root := filepath.Dir(strings.TrimSpace(string(out)))
		if buildDir, buildErr = os.MkdirTemp("", "edgerig-agent-"); buildErr != nil {
			return
		}
		agentBin = filepath.Join(buildDir, "edgeagent")
		cmd := exec.Command("go", "build", "-o", agentBin, "./cmd/edgeagent")
		cmd.Dir = root
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		buildErr = cmd.Run()
	})
	if buildErr != nil {
		tb.Fatalf("build edgeagent: %v", buildErr)
	}
	return agentBin
}

// logWriter sends the rig's progress lines to the test log.
type logWriter struct{ tb testing.TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
