// Package agentproc runs the real edgeagent binary as a child process for
// the rig — start, SIGKILL, SIGTERM, restart — and reads what it exposes:
// its status endpoint and its resource use in /proc.
package agentproc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/edgeagent/edgeagent/testrig/procattr"
)

// ErrNotRunning is returned when the agent is not running.
var ErrNotRunning = errors.New("agentproc: agent is not running")

// Process is one agent binary run with one config, restartable.
type Process struct {
	bin, config, logPath string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	logFile *os.File
	// expected is set while the rig itself stops the process, so its exit
	// is not reported as unexpected.
	expected bool
	starts   int
	exits    []Exit
	// cpu and hwm carry the figures of earlier runs across restarts.
	cpu     float64
	hwm     int64
	lastCPU float64
	// logStart is the log's size when the current run started.
	logStart int64
	// pipe sends the agent's output through a pipe (PipeOutput);
	// writesBlocked is set between BlockWrites(true) and (false), and
	// blockErr holds why a start within that span could not be limited.
	pipe, writesBlocked bool
	blockErr            error
}

// Exit is one end of the agent process.
type Exit struct {
	At         time.Time `json:"at"`
	Code       int       `json:"code"`
	Signal     string    `json:"signal,omitempty"`
	Unexpected bool      `json:"unexpected"`
}

// New prepares an agent process that runs bin run -c config and appends
// its output to logPath. It starts nothing.
func New(bin, config, logPath string) *Process {
	return &Process{bin: bin, config: config, logPath: logPath}
}

// Start starts the agent. It is an error to start it twice.
func (p *Process) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return errors.New("agentproc: already running")
	}
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("agentproc: open log: %w", err)
	}
	fmt.Fprintf(f, "--- edgerig: starting agent at %s ---\n", time.Now().Format(time.RFC3339Nano))
	if fi, err := f.Stat(); err == nil {
		p.logStart = fi.Size()
	}
	cmd := exec.Command(p.bin, "run", "-c", p.config)
	cmd.Stdout, cmd.Stderr = f, f
	if p.pipe {
		// Not an *os.File, so exec copies the output through a pipe. A
		// process that left the group cannot hold Wait for ever; the delay
		// is long, since closing the pipe kills (SIGPIPE) an agent still
		// shutting down behind a wrapper that did not exec it.
		out := struct{ io.Writer }{f}
		cmd.Stdout, cmd.Stderr, cmd.WaitDelay = out, out, time.Minute
	}
	// Its own process group (a Ctrl-C reaches the rig, which stops the
	// agent in order), and it dies with the rig.
	cmd.SysProcAttr = procattr.Child()
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("agentproc: start %s: %w", p.bin, err)
	}
	p.cmd, p.logFile, p.done, p.expected = cmd, f, make(chan struct{}), false
	p.starts++
	p.lastCPU = 0
	done := p.done
	go func() {
		werr := cmd.Wait()
		p.mu.Lock()
		e := Exit{At: time.Now(), Code: cmd.ProcessState.ExitCode(), Unexpected: !p.expected}
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			e.Signal = ws.Signal().String()
		}
		if cpu, _, ok := ExitUsage(cmd.ProcessState); ok {
			// Rusage CPU is exact at exit; /proc sampling may have missed
			// the end.
			p.cpu += cpu
		} else {
			p.cpu += p.lastCPU
		}
		p.exits = append(p.exits, e)
		fmt.Fprintf(p.logFile, "--- edgerig: agent exited: %v ---\n", werr)
		p.logFile.Close()
		p.cmd = nil
		p.mu.Unlock()
		close(done)
	}()
	if p.writesBlocked {
		// A moment after the start: a write the agent makes first succeeds.
		// The agent runs either way, so a failure is no failure to start:
		// BlockWrites(false) reports it, with the fault it spoils.
		if err := limitGroupWrites(cmd.Process.Pid, false); err != nil {
			p.blockErr = errors.Join(p.blockErr, err)
		}
	}
	return nil
}

// PipeOutput makes the agent write its output to a pipe that the rig
// copies to the log, instead of to the log file itself, which BlockWrites
// would make fail too. Call it before Start.
func (p *Process) PipeOutput() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pipe = true
}

// BlockWrites(true) makes every write of the agent's processes to a
// regular file fail with EFBIG (a file size limit of 0) — its data files
// and, without PipeOutput, its log — now and, from a moment after it, at
// every start until BlockWrites(false) lifts it. It is disk_full's
// injected write error where the rig cannot mount a small filesystem to
// fill. BlockWrites(false) also returns why a start in between could not
// be limited.
func (p *Process) BlockWrites(on bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.writesBlocked = on
	var err error
	if p.cmd != nil {
		err = limitGroupWrites(p.cmd.Process.Pid, !on)
	}
	if !on {
		err, p.blockErr = errors.Join(p.blockErr, err), nil
	}
	return err
}

// ExitUsage returns an exited child's CPU seconds (user and system) and
// minor page faults from its rusage, if the platform gives one. Its
// Maxrss is not offered: Go starts children with CLONE_VM, so a child's
// ru_maxrss counts the rig's own memory at the fork (hundreds of MiB in
// load mode); peak RSS comes from the child's VmHWM, sampled while it runs.
func ExitUsage(ps *os.ProcessState) (cpuSeconds float64, minorFaults int64, ok bool) {
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok {
		return 0, 0, false
	}
	return tvSec(ru.Utime) + tvSec(ru.Stime), int64(ru.Minflt), true // Minflt is int32 on 32-bit ARM
}

func tvSec(tv syscall.Timeval) float64 { return float64(tv.Sec) + float64(tv.Usec)/1e6 }

// Running reports whether the agent process is alive.
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil
}

// Done is closed when the current process exits (nil when none runs).
func (p *Process) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return nil
	}
	return p.done
}

// PID is the current process id (0 when none runs).
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Kill sends SIGKILL and waits for the exit.
func (p *Process) Kill() error { return p.stop(syscall.SIGKILL, 10*time.Second) }

// Terminate sends SIGTERM and waits up to timeout for the exit, then kills.
// It returns the exit code.
func (p *Process) Terminate(timeout time.Duration) (int, error) {
	if err := p.stop(syscall.SIGTERM, timeout); err != nil {
		return -1, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exits[len(p.exits)-1].Code, nil
}

func (p *Process) stop(sig syscall.Signal, timeout time.Duration) error {
	p.mu.Lock()
	if p.cmd == nil {
		p.mu.Unlock()
		return ErrNotRunning
	}
	p.expected = true
	if cpu, hwm, err := readProc(p.cmd.Process.Pid); err == nil {
		p.lastCPU, p.hwm = cpu, max(p.hwm, hwm)
	}
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if err := signalGroup(cmd, sig); err != nil {
		return fmt.Errorf("agentproc: signal %v: %w", sig, err)
	}
	deadline := time.After(timeout)
	select {
	case <-done:
		// A wrapper script that ran the agent without exec may have died
		// of the signal while the agent, left in the group, still shuts
		// down: it gets the rest of the timeout.
		if waitGroupGone(cmd.Process.Pid, deadline) {
			return nil
		}
		_ = signalGroup(cmd, syscall.SIGKILL)
		return fmt.Errorf("agentproc: a process of the agent's group did not exit within %v of %v; killed", timeout, sig)
	case <-deadline:
	}
	_ = signalGroup(cmd, syscall.SIGKILL)
	<-done
	return fmt.Errorf("agentproc: agent did not exit within %v of %v; killed", timeout, sig)
}

// signalGroup signals the child's process group (procattr.Child gives it
// one of its own), so that an agent started by a wrapper script that did
// not exec it is signalled too. A group already gone is no error.
func signalGroup(cmd *exec.Cmd, sig syscall.Signal) error {
	err := syscall.Kill(-cmd.Process.Pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// waitGroupGone polls until process group pgid has no process left, or
// deadline; it reports whether the group emptied. (No event says so: the
// rig is not the parent of a wrapper's children.)
func waitGroupGone(pgid int, deadline <-chan time.Time) bool {
	for {
		if errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH) {
			return true
		}
		select {
		case <-deadline:
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Exits lists every exit so far.
func (p *Process) Exits() []Exit {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Exit(nil), p.exits...)
}

// Starts counts the starts.
func (p *Process) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

// Usage is the agent's resource use over all its runs so far.
type Usage struct {
	// CPUSeconds is user + system time.
	CPUSeconds float64 `json:"cpu_seconds"`
	// PeakRSSBytes is the highest VmHWM of any run.
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
}

// Usage samples /proc for the running process and adds the finished runs.
func (p *Process) Usage() Usage {
	p.mu.Lock()
	defer p.mu.Unlock()
	u := Usage{CPUSeconds: p.cpu, PeakRSSBytes: p.hwm}
	if p.cmd != nil {
		if cpu, hwm, err := readProc(p.cmd.Process.Pid); err == nil {
			p.lastCPU = cpu
			u.CPUSeconds += cpu
			u.PeakRSSBytes = max(u.PeakRSSBytes, hwm)
			p.hwm = max(p.hwm, hwm)
		}
	}
	return u
}

// clkTck is sysconf(_SC_CLK_TCK), 100 on every Linux the agent supports.
const clkTck = 100

// readProc reads utime+stime (seconds) from /proc/PID/stat and VmHWM
// (bytes) from /proc/PID/status.
func readProc(pid int) (cpu float64, hwm int64, err error) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, fmt.Errorf("agentproc: %w", err)
	}
	// The command name (field 2) may hold spaces; fields count from after it.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("agentproc: unexpected /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("agentproc: short /proc/%d/stat", pid)
	}
	// After the name: state is field 3, utime field 14, stime field 15.
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("agentproc: parse /proc/%d/stat times", pid)
	}
	cpu = float64(ut+st) / clkTck
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, fmt.Errorf("agentproc: %w", err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			fs := strings.Fields(v)
			if len(fs) >= 1 {
				kb, err := strconv.ParseInt(fs[0], 10, 64)
				if err == nil {
					hwm = kb * 1024
				}
			}
		}
	}
	return cpu, hwm, nil
}

// LogPath is the agent's log file.
func (p *Process) LogPath() string { return p.logPath }

// LogTail returns the last n bytes of the agent's log.
func (p *Process) LogTail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return ""
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// LoggedSinceStart reports whether the current run has logged s.
func (p *Process) LoggedSinceStart(s string) bool {
	p.mu.Lock()
	from := p.logStart
	p.mu.Unlock()
	b, err := os.ReadFile(p.logPath)
	return err == nil && int64(len(b)) >= from && strings.Contains(string(b[from:]), s)
}

// Status is the agent's /status.json, the fields the rig reads.
type Status struct {
	Gateway string `json:"gateway"`
	Ingest  struct {
		Connected      bool   `json:"connected"`
		ReceivedTotal  uint64 `json:"received_total"`
		CommittedTotal uint64 `json:"committed_total"`
		// CommitsTotal and CommitSecondsTotal: Bronze group commits and
		// the time spent in them.
		CommitsTotal       uint64  `json:"commits_total"`
		CommitSecondsTotal float64 `json:"commit_seconds_total"`
	} `json:"ingest"`
	Bronze struct {
		Records        uint64 `json:"records"`
		Bytes          uint64 `json:"bytes"`
		BacklogRecords uint64 `json:"backlog_records"`
	} `json:"bronze"`
	Window struct {
		ProcessedTotal   uint64  `json:"processed_total"`
		ReadingsTotal    uint64  `json:"readings_total"`
		OpenWindows      uint64  `json:"open_windows"`
		LateTotal        uint64  `json:"late_total"`
		DuplicatesTotal  uint64  `json:"duplicates_total"`
		DeadLettersTotal uint64  `json:"dead_letters_total"`
		LagSeconds       float64 `json:"lag_seconds"`
		// CheckpointsByReason: the state checkpoints since the agent
		// started, by what made them due.
		CheckpointsByReason map[string]uint64 `json:"checkpoints_by_reason"`
	} `json:"window"`
	Outbox struct {
		Rows             uint64  `json:"rows"`
		Bytes            uint64  `json:"bytes"`
		OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	} `json:"outbox"`
	Uplink struct {
		State               string `json:"state"`
		ReconnectsTotal     uint64 `json:"reconnects_total"`
		BytesSentTotal      uint64 `json:"bytes_sent_total"`
		AggregatesSentTotal uint64 `json:"aggregates_sent_total"`
	} `json:"uplink"`
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

// FetchStatus reads http://addr/status.json.
func FetchStatus(ctx context.Context, addr string) (*Status, error) {
	var s Status
	err := get(ctx, addr, "status", "/status.json", func(body io.Reader) error {
		return json.NewDecoder(body).Decode(&s)
	})
	if err != nil {
		return nil, err
	}
	return &s, nil
}

// FetchMetrics reads http://addr/metrics and returns its samples without
// labels by name (the Go runtime's counters among them); labelled ones
// are left out.
func FetchMetrics(ctx context.Context, addr string) (map[string]float64, error) {
	m := map[string]float64{}
	err := get(ctx, addr, "metrics", "/metrics", func(body io.Reader) error {
		sc := bufio.NewScanner(body)
		for sc.Scan() {
			// name value [timestamp]
			fields := strings.Fields(sc.Text())
			if len(fields) < 2 || strings.HasPrefix(fields[0], "#") || strings.ContainsRune(fields[0], '{') {
				continue
			}
			name := fields[0]
			v, err := strconv.ParseFloat(fields[1], 64)
			if err != nil {
				return fmt.Errorf("sample %s: %w", name, err)
			}
			m[name] = v
		}
		return sc.Err()
	})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// get fetches http://addr+path and hands decode its body (at most 1 MiB).
func get(ctx context.Context, addr, what, path string, decode func(io.Reader) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return fmt.Errorf("agentproc: %s request: %w", what, err)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return fmt.Errorf("agentproc: get %s: %w", what, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("agentproc: get %s: %s", what, resp.Status)
	}
	if err := decode(io.LimitReader(resp.Body, 1<<20)); err != nil {
		return fmt.Errorf("agentproc: decode %s: %w", what, err)
	}
	return nil
}
