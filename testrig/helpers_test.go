package testrig_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/packaging"
	"github.com/edgeagent/edgeagent/testrig/rig"
	"github.com/edgeagent/edgeagent/testrig/scenario"
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
		// As the release is built (make build): static, stripped, its
		// tags; the RSS the benchmarks report includes the binary's pages.
		cmd := exec.Command("go", "build", "-trimpath", "-tags", packaging.BuildTags, "-ldflags", "-s -w", "-o", agentBin, "./cmd/edgeagent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
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

// runShort runs the short version of the stock scenario name against the
// real agent with o's other options, logs the report table and returns the
// report and the table.
func runShort(t *testing.T, name string, o rig.Options) (*rig.Report, string) {
	t.Helper()
	sc, err := scenario.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	o.Agent, o.Scenario, o.Short, o.Progress = agent(t), sc, true, logWriter{t}
	rep, err := rig.Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	rep.WriteTable(&b)
	t.Log("\n" + b.String())
	return rep, b.String()
}
