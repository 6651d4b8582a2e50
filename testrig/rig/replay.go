package rig

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgeagent/edgeagent/testrig/agentproc"
	"github.com/edgeagent/edgeagent/testrig/procattr"
)

// ReplayOptions configure a replay: agents processing the Bronze log of
// an earlier load run (edgerig load --dir) from a fresh state, one after
// the other. A load run's figures depend on how fast the machine ran the
// publishers and the broker at that moment (a tenth apart from one run to
// the next on this project's machine); a replay gives each agent the same
// records in the same order, with nothing else running, so two builds of
// the window stage compare on a few runs.
type ReplayOptions struct {
	// Dir is the load run's directory: agent.yaml and data/bronze.db.
	Dir string
	// Agents are the edgeagent binaries, run in turn each round.
	Agents []string
	// Rounds is how many times each agent runs (default 5).
	Rounds int
	// Work is where the runs' data directories go (default a temporary
	// directory, removed after).
	Work string
	// Logf, if set, reports each run as it ends.
	Logf func(format string, args ...any)
}

// ReplayRun is one agent's run over the log.
type ReplayRun struct {
	Agent string `json:"agent"`
	// CPUSeconds is the agent's user and system time.
	CPUSeconds float64 `json:"cpu_seconds"`
	// MinorFaults are the page faults served from memory (the kernel's
	// minflt): mapped file pages touched again after a release, heap
	// pages new to the process.
	MinorFaults int64 `json:"minor_faults"`
	// WrittenBytes is what the agent wrote to storage (write_bytes in
	// /proc/PID/io, last read before it exited; 0 where there is none).
	WrittenBytes int64   `json:"written_bytes"`
	WallSeconds  float64 `json:"wall_seconds"`
}

// ReplaySummary is an agent's runs and their medians.
type ReplaySummary struct {
	Agent             string      `json:"agent"`
	Runs              []ReplayRun `json:"runs"`
	MedianCPUSeconds  float64     `json:"median_cpu_seconds"`
	MedianMinorFaults int64       `json:"median_minor_faults"`
	MedianWritten     int64       `json:"median_written_bytes"`
}

// ReplayReport is a replay's result, one summary per agent in the order
// given.
type ReplayReport struct {
	Dir         string          `json:"dir"`
	BronzeBytes int64           `json:"bronze_bytes"`
	Agents      []ReplaySummary `json:"agents"`
}

// Replay runs each agent Rounds times, alternating, with `run --once` on
// a copy of the load run's Bronze and its config without an uplink: the
// window stage processes the whole log, checkpoints as it goes and
// leaves its aggregates in the outbox.
func Replay(ctx context.Context, o ReplayOptions) (*ReplayReport, error) {
	if len(o.Agents) == 0 {
		return nil, errors.New("replay: no agent binary given")
	}
	if o.Rounds <= 0 {
		o.Rounds = 5
	}
	bronze := filepath.Join(o.Dir, "data", "bronze.db")
	st, err := os.Stat(bronze)
	if err != nil {
		return nil, fmt.Errorf("replay: %w (the directory of a load run, edgerig load --dir)", err)
	}
	raw, err := os.ReadFile(filepath.Join(o.Dir, "agent.yaml"))
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	work := o.Work
	if work == "" {
		if work, err = os.MkdirTemp("", "edgerig-replay-"); err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		defer os.RemoveAll(work)
	}
	data := filepath.Join(work, "data")
	config := filepath.Join(work, "agent.yaml")
	cfg, err := replayConfig(string(raw), data)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(config, []byte(cfg), 0o644); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	rep := &ReplayReport{Dir: o.Dir, BronzeBytes: st.Size()}
	for _, a := range o.Agents {
		rep.Agents = append(rep.Agents, ReplaySummary{Agent: a})
	}
	for round := 1; round <= o.Rounds; round++ {
		for i, a := range o.Agents {
			if err := os.RemoveAll(data); err != nil {
				return nil, fmt.Errorf("replay: %w", err)
			}
			if err := os.MkdirAll(data, 0o750); err != nil {
				return nil, fmt.Errorf("replay: %w", err)
			}
			if err := copyFile(bronze, filepath.Join(data, "bronze.db")); err != nil {
				return nil, fmt.Errorf("replay: copy Bronze: %w", err)
			}
			r, err := replayOnce(ctx, a, config, filepath.Join(work, fmt.Sprintf("agent-%d-%d.log", i, round)))
			if err != nil {
				return nil, err
			}
			rep.Agents[i].Runs = append(rep.Agents[i].Runs, r)
			if o.Logf != nil {
				o.Logf("round %d, %s: %.2f s CPU, %d minor faults, %.1f MB written", round, a, r.CPUSeconds, r.MinorFaults, float64(r.WrittenBytes)/1e6)
			}
		}
	}
	for i := range rep.Agents {
		s := &rep.Agents[i]
		s.MedianCPUSeconds = median(s.Runs, func(r ReplayRun) float64 { return r.CPUSeconds })
		s.MedianMinorFaults = int64(median(s.Runs, func(r ReplayRun) float64 { return float64(r.MinorFaults) }))
		s.MedianWritten = int64(median(s.Runs, func(r ReplayRun) float64 { return float64(r.WrittenBytes) }))
	}
	return rep, nil
}

// replayConfig is a load run's agent.yaml (as render writes it) with its
// data directory moved to data and without the uplink and the status
// listener: the aggregates stay in the outbox, and `run --once` exits
// when the log is processed.
func replayConfig(raw, data string) (string, error) {
	var b strings.Builder
	skipping, sawData := false, false
	for _, line := range strings.Split(raw, "\n") {
		if skipping && strings.HasPrefix(line, " ") {
			continue
		}
		skipping = false
		switch {
		case strings.HasPrefix(line, "data_dir:"):
			line, sawData = fmt.Sprintf("data_dir: %q", data), true
		case strings.HasPrefix(line, "status:"):
			continue
		case strings.HasPrefix(line, "uplink:"):
			skipping = true
			continue
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	if !sawData {
		return "", errors.New("replay: agent.yaml has no data_dir: not one edgerig wrote")
	}
	return strings.TrimRight(b.String(), "\n") + "\n", nil
}

// replayOnce runs agent over the copied log and measures it.
func replayOnce(ctx context.Context, agent, config, logPath string) (ReplayRun, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return ReplayRun{}, fmt.Errorf("replay: %w", err)
	}
	defer log.Close()
	cmd := exec.CommandContext(ctx, agent, "run", "-c", config, "--once")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = procattr.Child() // it dies with the rig
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return ReplayRun{}, fmt.Errorf("replay: start %s: %w", agent, err)
	}
	// write_bytes is gone with the process: read it until the end.
	written := make(chan int64, 1)
	done := make(chan struct{})
	go func() {
		var last int64
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			if n, err := writeBytes(cmd.Process.Pid); err == nil {
				last = n
			}
			select {
			case <-done:
				written <- last
				return
			case <-t.C:
			}
		}
	}()
	err = cmd.Wait()
	close(done)
	r := ReplayRun{Agent: agent, WrittenBytes: <-written, WallSeconds: time.Since(start).Seconds()}
	if err != nil {
		return r, fmt.Errorf("replay: %s: %w (log %s)", agent, err, logPath)
	}
	r.CPUSeconds, r.MinorFaults, _ = agentproc.ExitUsage(cmd.ProcessState)
	return r, nil
}

// writeBytes reads write_bytes from /proc/PID/io.
func writeBytes(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "write_bytes: "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, errors.New("no write_bytes in /proc/PID/io")
}

func median(runs []ReplayRun, f func(ReplayRun) float64) float64 {
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v) == 0 {
		return 0
	}
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// WriteTable writes the report for a reader: each agent's medians, then
// every run's CPU.
func (r *ReplayReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "replay of %s (Bronze %.0f MB), `run --once` from a fresh state, agents alternating\n", r.Dir, float64(r.BronzeBytes)/1e6)
	for _, s := range r.Agents {
		cpus := make([]string, len(s.Runs))
		for i, run := range s.Runs {
			cpus[i] = fmt.Sprintf("%.2f", run.CPUSeconds)
		}
		fmt.Fprintf(w, "  %s\n    median %.2f s CPU, %d minor faults, %.1f MB written; CPU by run: %s\n",
			s.Agent, s.MedianCPUSeconds, s.MedianMinorFaults, float64(s.MedianWritten)/1e6, strings.Join(cpus, ", "))
	}
}

// WriteJSON writes the report as indented JSON.
func (r *ReplayReport) WriteJSON(w io.Writer) error { return writeIndentedJSON(w, "replay report", r) }
