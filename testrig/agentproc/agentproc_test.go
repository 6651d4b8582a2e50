package agentproc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The test binary plays the agent when fakeEnv is set: it logs the line
// the rig waits for, burns a little CPU, and exits 0 on SIGTERM — or, in
// "exit" mode, fails at once as a broken agent would.
const fakeEnv = "AGENTPROC_FAKE_AGENT"

func TestMain(m *testing.M) {
	switch os.Getenv(fakeEnv) {
	case "":
		os.Exit(m.Run())
	case "exit":
		fmt.Println("fake agent: cannot start")
		os.Exit(3)
	case "rig":
		fakeRig()
	case "writer":
		fakeWriter()
	}
	// The handler first: a test signals the pid as soon as the file names
	// it, and a SIGTERM before Notify would kill the fake with Go's
	// default action instead of the shutdown the test looks for (a CI
	// run on a busy machine did exactly that).
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	if f := os.Getenv(fakeEnv + "_PIDFILE"); f != "" {
		// Written whole and renamed into place: a test polling the file
		// must not read part of the pid as another process's.
		err := os.WriteFile(f+".tmp", []byte(strconv.Itoa(os.Getpid())), 0o600)
		if err == nil {
			err = os.Rename(f+".tmp", f)
		}
		if err != nil {
			fmt.Println("fake agent:", err)
			os.Exit(1)
		}
	}
	fmt.Println(`level=INFO msg="connected to broker"`)
	spin := time.Now().Add(200 * time.Millisecond)
	for time.Now().Before(spin) {
	}
	<-sig
	fmt.Println("fake agent: stopped")
	os.Exit(0)
}

// fakeRig plays the rig for TestChildDiesWithRig: it starts a fake agent,
// prints its pid and waits to be killed.
func fakeRig() {
	os.Setenv(fakeEnv, "agent")
	p := New(os.Args[0], "unused.yaml", os.Getenv(fakeEnv+"_LOG"))
	if err := p.Start(); err != nil {
		fmt.Println("fake rig:", err)
		os.Exit(1)
	}
	fmt.Println(p.PID())
	io.Copy(io.Discard, os.Stdin) // until the test kills us
	os.Exit(0)
}

// fakeWriter plays an agent that appends a line to the file named by
// fakeEnv_DATA at every SIGUSR1 and logs how that went, for
// TestBlockWrites; it exits 0 on SIGTERM.
func fakeWriter() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGTERM)
	// Its pid goes to the log, not a file: its file writes may be blocked.
	fmt.Printf("fake writer pid %d\n", os.Getpid())
	fmt.Println(`level=INFO msg="connected to broker"`)
	for n := 1; ; n++ {
		if <-sig == syscall.SIGTERM {
			os.Exit(0)
		}
		f, err := os.OpenFile(os.Getenv(fakeEnv+"_DATA"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err == nil {
			_, err = f.WriteString("x\n")
			f.Close()
		}
		fmt.Printf("write %d: %v\n", n, err)
	}
}

func fake(t *testing.T, mode string) *Process {
	t.Helper()
	t.Setenv(fakeEnv, mode)
	p := New(os.Args[0], "unused.yaml", filepath.Join(t.TempDir(), "agent.log"))
	t.Cleanup(func() {
		if p.Running() {
			p.Kill()
		}
	})
	return p
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
}

func TestKillTerminateRestart(t *testing.T) {
	p := fake(t, "run")
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err == nil {
		t.Fatal("a second Start while running succeeded")
	}
	waitFor(t, 10*time.Second, "the ready line", func() bool { return p.LoggedSinceStart("connected to broker") })
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if p.Running() {
		t.Fatal("running after Kill")
	}
	if err := p.Kill(); err != ErrNotRunning {
		t.Fatalf("Kill when stopped = %v, want ErrNotRunning", err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	if p.LoggedSinceStart("fake agent: stopped") {
		t.Fatal("LoggedSinceStart sees the previous run")
	}
	waitFor(t, 10*time.Second, "the ready line of the second run", func() bool { return p.LoggedSinceStart("connected to broker") })
	code, err := p.Terminate(10 * time.Second)
	if err != nil || code != 0 {
		t.Fatalf("Terminate = %d, %v; want 0, nil", code, err)
	}
	exits := p.Exits()
	if len(exits) != 2 || exits[0].Signal != "killed" || exits[1].Code != 0 || exits[0].Unexpected || exits[1].Unexpected {
		t.Fatalf("exits %+v: want a kill and a clean stop, both caused by the rig", exits)
	}
	if p.Starts() != 2 {
		t.Fatalf("%d starts, want 2", p.Starts())
	}
	u := p.Usage()
	if u.CPUSeconds <= 0 || u.PeakRSSBytes <= 0 {
		t.Fatalf("usage %+v: want the CPU and peak RSS of both runs", u)
	}
}

func TestUnexpectedExit(t *testing.T) {
	p := fake(t, "exit")
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the exit", func() bool { return !p.Running() })
	ex := p.Exits()
	if len(ex) != 1 || ex[0].Code != 3 || !ex[0].Unexpected {
		t.Fatalf("exits %+v, want one unexpected exit with code 3", ex)
	}
	if tail := p.LogTail(200); !strings.Contains(tail, "cannot start") {
		t.Fatalf("log tail %q lacks the agent's output", tail)
	}
}

func TestReadProc(t *testing.T) {
	// /proc counts CPU in clock ticks (10 ms): a test process that has
	// mostly waited, on a loaded machine, may not have used one yet. Use
	// some, until a tick shows or the deadline passes.
	var cpu float64
	var hwm int64
	var err error
	sink := 0
	for deadline := time.Now().Add(5 * time.Second); ; {
		if cpu, hwm, err = readProc(os.Getpid()); err != nil {
			t.Fatal(err)
		}
		if cpu > 0 || time.Now().After(deadline) {
			break
		}
		for i := range 1_000_000 {
			sink += i
		}
	}
	_ = sink
	if cpu <= 0 || hwm < 1<<20 {
		t.Fatalf("cpu %v s, VmHWM %d bytes: implausible for a running test", cpu, hwm)
	}
}

// A rig killed with SIGKILL takes its agent with it (Pdeathsig): nothing
// is left running to hold ports and data directories.
func TestChildDiesWithRig(t *testing.T) {
	rig := exec.Command(os.Args[0])
	rig.Env = append(os.Environ(), fakeEnv+"=rig", fakeEnv+"_LOG="+filepath.Join(t.TempDir(), "agent.log"))
	stdin, err := rig.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	out, err := rig.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := rig.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		rig.Process.Kill()
		t.Fatalf("fake rig printed no pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		rig.Process.Kill()
		t.Fatalf("fake rig: %q", line)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	if !alive(pid) {
		t.Fatalf("the agent %d is not running before the rig is killed", pid)
	}
	if err := rig.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	rig.Wait()
	waitFor(t, 10*time.Second, fmt.Sprintf("the agent %d to die with the rig", pid), func() bool { return !alive(pid) })
}

// alive reports whether pid runs: a zombie (dead, not yet reaped by
// whoever inherited it) does not.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// An agent behind a wrapper script that does not exec it is stopped with
// the script: the rig signals the process group, not only its child.
func TestWrapperWithoutExecLeavesNoAgent(t *testing.T) {
	dir := t.TempDir()
	script, pidFile := filepath.Join(dir, "wrap.sh"), filepath.Join(dir, "agent.pid")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n\""+os.Args[0]+"\" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakeEnv, "agent")
	t.Setenv(fakeEnv+"_PIDFILE", pidFile)
	p := New(script, "unused.yaml", filepath.Join(dir, "agent.log"))
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	waitFor(t, 10*time.Second, "the fake agent's pid", func() bool {
		b, err := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(string(b))
		return err == nil && pid > 0
	})
	// The agent gets its SIGTERM and the time to shut down, not a SIGKILL
	// as soon as the script is gone.
	if _, err := p.Terminate(10 * time.Second); err != nil {
		t.Fatalf("terminate: %v", err)
	}
	if !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		t.Fatal("the agent behind the script is still running")
	}
	if log, err := os.ReadFile(filepath.Join(dir, "agent.log")); err != nil || !strings.Contains(string(log), "fake agent: stopped") {
		t.Fatalf("the agent did not shut down on its SIGTERM (%v):\n%s", err, log)
	}
}

// TestBlockWrites checks disk_full's injected write error on a real
// process: writes fail with EFBIG while blocked, also after a restart
// while blocked, the log still arrives through the pipe, and they succeed
// again once lifted.
func TestBlockWrites(t *testing.T) {
	// Before fake: cleanups run last first, so the process is stopped
	// before its directory goes.
	t.Setenv(fakeEnv+"_DATA", filepath.Join(t.TempDir(), "data"))
	p := fake(t, "writer")
	p.PipeOutput()
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the ready line", func() bool { return p.LoggedSinceStart("connected to broker") })
	write := func(n int, want string) {
		t.Helper()
		if err := syscall.Kill(p.PID(), syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		line := fmt.Sprintf("write %d: %s", n, want)
		waitFor(t, 10*time.Second, line, func() bool { return p.LoggedSinceStart(line) })
	}
	write(1, "<nil>")
	if err := p.BlockWrites(true); err != nil {
		t.Fatal(err)
	}
	write(2, "write "+os.Getenv(fakeEnv+"_DATA")+": file too large")
	if _, err := p.Terminate(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the ready line after the restart", func() bool { return p.LoggedSinceStart("connected to broker") })
	write(1, "write "+os.Getenv(fakeEnv+"_DATA")+": file too large")
	if err := p.BlockWrites(false); err != nil {
		t.Fatal(err)
	}
	write(2, "<nil>")
	b, err := os.ReadFile(os.Getenv(fakeEnv + "_DATA"))
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != "x\nx\n" {
		t.Fatalf("data file %q, want the two unblocked writes", b)
	}
}

// TestBlockWritesBehindAWrapper starts, while writes are blocked, an agent
// behind a wrapper script that does not exec it: the script forks the
// agent around the moment the limit is applied, and the agent must get
// the limit all the same (a single pass over the group missed it in about
// a third of the starts).
func TestBlockWritesBehindAWrapper(t *testing.T) {
	dir := t.TempDir()
	script, logPath, data := filepath.Join(dir, "wrap.sh"), filepath.Join(dir, "agent.log"), filepath.Join(dir, "data")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n\""+os.Args[0]+"\" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakeEnv, "writer")
	t.Setenv(fakeEnv+"_DATA", data)
	p := New(script, "unused.yaml", logPath)
	p.PipeOutput()
	t.Cleanup(func() {
		if p.Running() {
			p.Kill()
		}
	})
	if err := p.BlockWrites(true); err != nil {
		t.Fatal(err)
	}
	for start := 1; start <= 5; start++ {
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the ready line", func() bool { return p.LoggedSinceStart("connected to broker") })
		log, err := os.ReadFile(logPath)
		if err != nil {
			t.Fatal(err)
		}
		_, after, ok := strings.Cut(string(log[strings.LastIndex(string(log), "--- edgerig: starting agent"):]), "fake writer pid ")
		f := strings.Fields(after)
		if !ok || len(f) == 0 {
			t.Fatalf("no pid in the log since the start:\n%s", log)
		}
		pid, err := strconv.Atoi(f[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		line := "write 1: write " + data + ": file too large"
		waitFor(t, 10*time.Second, fmt.Sprintf("start %d: %q", start, line), func() bool { return p.LoggedSinceStart(line) })
		if _, err := p.Terminate(10 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.BlockWrites(false); err != nil {
		t.Fatal(err)
	}
}

// FetchMetrics takes the unlabelled samples of an exposition and leaves
// out comments and labelled ones; a sample it cannot read is an error
// naming it.
func TestFetchMetrics(t *testing.T) {
	var body atomic.Value
	body.Store("# HELP go_memstats_alloc_bytes_total bytes\n" +
		"go_memstats_alloc_bytes_total 123456789\n" +
		"edgeagent_window_checkpoints_total{reason=\"delta\"} 7\n" +
		"go_gc_cpu_seconds_total 1.5e-01\n" +
		"go_goroutines 34 1700000000000\n") // with a timestamp
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		io.WriteString(w, body.Load().(string))
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	m, err := FetchMetrics(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]float64{"go_memstats_alloc_bytes_total": 123456789, "go_gc_cpu_seconds_total": 0.15, "go_goroutines": 34}; fmt.Sprint(m) != fmt.Sprint(want) {
		t.Fatalf("samples %v, want %v", m, want)
	}
	body.Store("go_memstats_mallocs_total many\n")
	if _, err := FetchMetrics(context.Background(), addr); err == nil || !strings.Contains(err.Error(), "go_memstats_mallocs_total") {
		t.Fatalf("a sample that is no number: error %v, want one naming it", err)
	}
}
