package rig

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/edgeagent/edgeagent/testrig/scenario"
	"github.com/edgeagent/edgeagent/testrig/sim"
)

// FaultEvent is what happened to one scheduled fault.
type FaultEvent struct {
	Kind string `json:"kind"`
	// AtSeconds is when it began, after the start of publishing.
	AtSeconds  float64 `json:"at_s"`
	ForSeconds float64 `json:"for_s"`
	// Skipped says why the fault could not be injected on this machine or
	// with these servers; Error says why injecting it failed.
	Skipped string `json:"skipped,omitempty"`
	Error   string `json:"error,omitempty"`
	Note    string `json:"note,omitempty"`
}

// faults runs a scenario's faults against an env.
type faults struct {
	e   *env
	pub *sim.Publisher

	mu     sync.Mutex
	events []FaultEvent
	// agentDown is true while a fault holds the agent down, so the
	// supervisor does not restart it; diskFull spans tolerate exits.
	agentDown bool
	diskFull  [][2]time.Time
}

// run injects every fault at its time after start and returns when all
// have been restored (or ctx ended).
func (f *faults) run(ctx context.Context, list []scenario.Fault, total time.Duration, start time.Time) {
	var wg sync.WaitGroup
	for _, ft := range list {
		wg.Add(1)
		go func() {
			defer wg.Done()
			at := ft.At.Resolve(total)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(start.Add(at))):
			}
			ev := FaultEvent{Kind: ft.Kind, AtSeconds: time.Since(start).Seconds(), ForSeconds: ft.For.Seconds()}
			f.inject(ctx, ft, &ev)
			f.mu.Lock()
			f.events = append(f.events, ev)
			f.mu.Unlock()
		}()
	}
	wg.Wait()
}

// Events returns the fault events in time order.
func (f *faults) Events() []FaultEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	ev := append([]FaultEvent(nil), f.events...)
	sort.Slice(ev, func(i, j int) bool { return ev[i].AtSeconds < ev[j].AtSeconds })
	return ev
}

func (f *faults) skip(ev *FaultEvent, format string, a ...any) {
	ev.Skipped = fmt.Sprintf(format, a...)
	f.e.logf("fault %s skipped: %s", ev.Kind, ev.Skipped)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (f *faults) setAgentDown(v bool) {
	f.mu.Lock()
	f.agentDown = v
	f.mu.Unlock()
}

func (f *faults) inject(ctx context.Context, ft scenario.Fault, ev *FaultEvent) {
	e := f.e
	switch ft.Kind {
	case scenario.FaultAgentKill, scenario.FaultAgentRestart:
		f.setAgentDown(true)
		defer f.setAgentDown(false)
		if ft.Kind == scenario.FaultAgentKill {
			e.logf("fault: SIGKILL agent, down %v", ft.For)
			if err := e.agent.Kill(); err != nil {
				ev.Error = err.Error()
			}
		} else {
			e.logf("fault: SIGTERM agent, down %v", ft.For)
			code, err := e.agent.Terminate(30 * time.Second)
			switch {
			case err != nil:
				ev.Error = err.Error()
			case code != 0:
				ev.Error = fmt.Sprintf("agent exited %d after SIGTERM, want 0", code)
			}
		}
		sleepCtx(ctx, ft.For)
		if e.mochi != nil {
			// mochi can lose a message published while the agent's
			// session is taken over by its new connection: hold the
			// devices (what they sent meanwhile is queued in the session)
			// until the agent is back.
			f.pub.Pause()
			defer f.pub.Resume()
			f.waitPublisherAcked(ctx)
			ev.Note = "mochi: devices paused while the agent reconnected (mochi can lose a publish during a session takeover); install mosquitto to keep them going"
		}
		if err := e.agent.Start(); err != nil {
			ev.Error = joinErr(ev.Error, err.Error())
		} else if e.mochi != nil {
			if err := e.waitAgentReady(ctx, 30*time.Second); err != nil {
				ev.Error = joinErr(ev.Error, err.Error())
			}
		}
	case scenario.FaultBrokerRestart:
		if e.broker == nil {
			f.skip(ev, "the broker is %s, which the rig cannot restart", e.brokerName)
			return
		}
		if e.mochi != nil {
			// mochi keeps nothing across a restart: let the agent take
			// everything the broker holds for it first, so the fault tests
			// reconnection, not a durability mochi does not have.
			f.pub.Pause()
			defer f.pub.Resume()
			drained := func() bool {
				p := f.pub.Progress()
				return p.Acked == p.Published && e.mochi.Pending(ClientID) == 0
			}
			deadline := time.Now().Add(30 * time.Second)
			for !drained() && time.Now().Before(deadline) && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond) // the broker's state has no event to wait on
			}
			ev.Note = "mochi: drained before the restart (it loses queued messages); install mosquitto for a restart under load"
			if !drained() {
				ev.Note += "; the drain timed out, messages may be lost"
			}
		}
		e.logf("fault: restart broker (%s), down %v", e.brokerName, ft.For)
		if err := e.broker.Stop(); err != nil {
			ev.Error = err.Error()
		}
		sleepCtx(ctx, ft.For)
		if err := e.broker.Start(); err != nil {
			ev.Error = joinErr(ev.Error, err.Error())
		}
		if e.mochi != nil {
			// The new broker knows no session: until the agent has
			// subscribed again, whatever the devices send reaches nobody.
			deadline := time.Now().Add(30 * time.Second)
			for e.mochi.Subscriptions(ClientID) < 3 && time.Now().Before(deadline) && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond) // the broker has no event to wait on
			}
			if e.mochi.Subscriptions(ClientID) < 3 {
				ev.Error = joinErr(ev.Error, "the agent did not subscribe again within 30s of the broker restart")
			}
		}
	case scenario.FaultNATSRestart:
		if e.cfg.uplink == UplinkMQTT {
			f.skip(ev, "the uplink is MQTT (--uplink mqtt): there is no NATS server to restart")
			return
		}
		if e.nats == nil {
			f.skip(ev, "NATS is external (--nats); the rig cannot restart it")
			return
		}
		e.logf("fault: restart NATS, down %v", ft.For)
		if err := e.nats.Stop(); err != nil {
			ev.Error = err.Error()
		}
		sleepCtx(ctx, ft.For)
		if err := e.nats.Start(); err != nil {
			ev.Error = joinErr(ev.Error, err.Error())
		}
	case scenario.FaultUplinkCut, scenario.FaultUplinkBlackhole, scenario.FaultUplinkDropAcks:
		// A fault on a proxy the agent's uplink does not use proves
		// nothing: the run must not pass as if it had held.
		// An agent that is still connecting gets a few seconds.
		through := func() bool { toServer, _ := e.proxy.Forwarded(); return e.proxy.Accepted() > 0 && toServer > 0 }
		for deadline := time.Now().Add(10 * time.Second); !through() && time.Now().Before(deadline) && ctx.Err() == nil; {
			sleepCtx(ctx, 100*time.Millisecond)
		}
		if !through() {
			toServer, _ := e.proxy.Forwarded()
			ev.Error = fmt.Sprintf("the agent's uplink has not gone through the fault proxy (%d connections, %d bytes to the server): the fault cannot reach it", e.proxy.Accepted(), toServer)
			return
		}
		e.logf("fault: %s for %v", ft.Kind, ft.For)
		switch ft.Kind {
		case scenario.FaultUplinkCut:
			e.proxy.Cut()
		case scenario.FaultUplinkBlackhole:
			e.proxy.Blackhole()
		default:
			e.proxy.DropServerToClient()
		}
		sleepCtx(ctx, ft.For)
		e.proxy.Restore()
		e.logf("fault: %s restored", ft.Kind)
	case scenario.FaultDiskFull:
		start := time.Now()
		if e.tmpfs {
			e.logf("fault: disk full for %v", ft.For)
			n, err := fillDisk(e.dataDir)
			if err != nil {
				ev.Error = err.Error()
			}
			ev.Note = fmt.Sprintf("filled %d KiB", n>>10)
			sleepCtx(ctx, ft.For)
			if err := os.Remove(filepath.Join(e.dataDir, fillName)); err != nil {
				ev.Error = joinErr(ev.Error, fmt.Sprintf("remove fill file: %v", err))
			}
		} else {
			// No filesystem to fill: every write of the agent to a file
			// fails instead, also across its restarts within the span.
			e.logf("fault: disk full for %v, by injected write errors", ft.For)
			ev.Note = "injected write errors (file size limit 0)"
			if e.tmpfsNote != "" {
				ev.Note += ": " + e.tmpfsNote
			}
			if err := e.agent.BlockWrites(true); err != nil {
				ev.Error = err.Error()
			}
			sleepCtx(ctx, ft.For)
			if err := e.agent.BlockWrites(false); err != nil {
				ev.Error = joinErr(ev.Error, fmt.Sprintf("write errors: %v", err))
			}
		}
		f.mu.Lock()
		// An agent that exits on a full disk is restarted like systemd
		// would; its exit up to a few seconds after is not a failure.
		f.diskFull = append(f.diskFull, [2]time.Time{start, time.Now().Add(3 * time.Second)})
		f.mu.Unlock()
		e.logf("fault: disk space restored")
	}
}

// waitPublisherAcked waits until every publish handed to the broker is
// acknowledged (the publisher must be paused).
func (f *faults) waitPublisherAcked(ctx context.Context) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if p := f.pub.Progress(); p.Acked == p.Published {
			return
		}
		time.Sleep(10 * time.Millisecond) // the publisher has no event to wait on
	}
}

// duringDiskFull reports whether t falls in a disk_full span.
func (f *faults) duringDiskFull(t time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.diskFull {
		if !t.Before(s[0]) && !t.After(s[1]) {
			return true
		}
	}
	return false
}

func joinErr(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

const fillName = ".edgerig-disk-fill"

// fillDisk writes a file into dir until the filesystem is full and returns
// its size.
func fillDisk(dir string) (int64, error) {
	fh, err := os.OpenFile(filepath.Join(dir, fillName), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, fmt.Errorf("fill disk: %w", err)
	}
	defer fh.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for len(buf) > 0 {
		w, err := fh.Write(buf)
		n += int64(w)
		if errors.Is(err, syscall.ENOSPC) {
			buf = buf[:len(buf)/2] // fill the last pages too
			continue
		}
		if err != nil {
			return n, fmt.Errorf("fill disk: %w", err)
		}
	}
	return n, nil
}

// supervise restarts the agent after an exit the rig did not cause, as
// systemd's Restart=on-failure would, until ctx ends. Each such exit is
// recorded by the agent process.
func (f *faults) supervise(ctx context.Context) {
	handled := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond): // exits are polled, restarts are rare
		}
		exits := f.e.agent.Exits()
		f.mu.Lock()
		down := f.agentDown
		f.mu.Unlock()
		if len(exits) == handled || down || f.e.agent.Running() {
			handled = len(exits)
			continue
		}
		last := exits[len(exits)-1]
		handled = len(exits)
		if !last.Unexpected {
			continue
		}
		f.e.logf("agent exited unexpectedly (code %d %s); restarting it in 1s", last.Code, last.Signal)
		sleepCtx(ctx, time.Second)
		if ctx.Err() != nil {
			return
		}
		if err := f.e.agent.Start(); err != nil {
			f.e.logf("restart agent: %v", err)
		}
	}
}
