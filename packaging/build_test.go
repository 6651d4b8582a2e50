package packaging

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The stamp the test build carries, in the form `git describe` prints, so
// the Debian version conversion is exercised on the way.
const (
	testVersion = "v1.2.3-4-gabcdef0"
	testCommit  = "abcdef012345"
	// testEpoch is the file time in the test packages (SOURCE_DATE_EPOCH).
	testEpoch = 1700000000
)

// workDir holds what the tests build; TestMain removes it.
var workDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "edgeagent-packaging-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "packaging test:", err)
		os.Exit(1)
	}
	workDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// repoRoot is the module root: the tests run in packaging/.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatalf("resolve repository root: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root %s has no go.mod: %v", root, err)
	}
	return root
}

// goCmd is the go command of the toolchain running the tests.
func goCmd() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(os.Getenv("GOROOT"), "bin", "go")
}

// memo builds something once per test binary and hands every caller the
// same result or the same error.
type memo[T any] struct {
	once sync.Once
	val  T
	err  error
}

func (m *memo[T]) get(t testing.TB, build func() (T, error)) T {
	t.Helper()
	m.once.Do(func() { m.val, m.err = build() })
	if m.err != nil {
		t.Fatal(m.err)
	}
	return m.val
}

var (
	binMemo memo[map[string]string] // Arch.Name → binary path
	debMemo memo[map[string]string] // Arch.Deb → .deb path
)

// crossBinaries builds dist/edgeagent-linux-ARCH for every target the way
// `make cross` does, once per test run, in workDir/dist.
func crossBinaries(t testing.TB) map[string]string {
	t.Helper()
	root := repoRoot(t)
	return binMemo.get(t, func() (map[string]string, error) {
		dist := filepath.Join(workDir, "dist")
		if err := os.MkdirAll(dist, 0o755); err != nil {
			return nil, fmt.Errorf("create dist dir: %w", err)
		}
		bins := map[string]string{}
		for _, a := range Arches {
			out := filepath.Join(dist, a.BinaryName())
			start := time.Now()
			// The same command line as `make cross`.
			ldflags := fmt.Sprintf("-s -w -X main.version=%s -X main.commit=%s", testVersion, testCommit)
			cmd := exec.Command(goCmd(), "build", "-trimpath", "-tags", BuildTags, "-ldflags", ldflags, "-o", out, "./cmd/edgeagent")
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+a.GOARCH, "GOARM="+a.GOARM)
			if outb, err := runTimeout(cmd, 8*time.Minute); err != nil {
				return nil, fmt.Errorf("cross build %s: %w\n%s", a.Name, err, outb)
			}
			fmt.Fprintf(os.Stderr, "packaging test: built %s in %v\n", a.BinaryName(), time.Since(start).Round(time.Millisecond))
			bins[a.Name] = out
		}
		return bins, nil
	})
}

// debPackages builds the .deb of every target with BuildDebs (what
// `make deb` runs), once per test run.
func debPackages(t testing.TB) map[string]string {
	t.Helper()
	crossBinaries(t)
	root := repoRoot(t)
	return debMemo.get(t, func() (map[string]string, error) {
		var log bytes.Buffer
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		defer cancel()
		paths, err := BuildDebs(ctx, DebOptions{
			RepoDir:         root,
			DistDir:         filepath.Join(workDir, "dist"),
			Version:         testVersion,
			SourceDateEpoch: testEpoch,
			Go:              goCmd(),
			Output:          &log,
		})
		if err != nil {
			return nil, fmt.Errorf("build debs: %w\n%s", err, log.String())
		}
		fmt.Fprintf(os.Stderr, "packaging test: built %d packages in %v\n", len(paths), time.Since(start).Round(time.Millisecond))
		debs := map[string]string{}
		for i, a := range Arches {
			debs[a.Deb] = paths[i]
		}
		return debs, nil
	})
}

// runTimeout runs cmd with a deadline and returns its combined output.
func runTimeout(cmd *exec.Cmd, d time.Duration) ([]byte, error) {
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.Bytes(), err
	case <-time.After(d):
		_ = cmd.Process.Kill()
		<-done
		return out.Bytes(), fmt.Errorf("%s: still running after %v, killed", strings.Join(cmd.Args, " "), d)
	}
}

// run runs a command that must succeed and returns its stdout.
func run(t testing.TB, dir string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// need returns the path of a command the test cannot do without, or skips
// the test naming the Debian package that provides it.
func need(t testing.TB, command, pkg string) string {
	t.Helper()
	for _, c := range []string{command, "/usr/sbin/" + command, "/usr/bin/" + command} {
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	t.Skipf("%s is not installed (apt-get install %s); skipping", command, pkg)
	return ""
}

// exitCode is the exit status of a finished command, or -1.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}
