package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/edgeagent/edgeagent/cmd/edgeagent/agent"
	"github.com/edgeagent/edgeagent/config"
)

// notifyHangup registers for SIGHUP before anything else, so that no
// SIGHUP falls to Go's default (the process ends, undrained) while the
// agent opens. A process started with SIGHUP ignored (nohup) keeps it
// ignored; hup is then nil. The returned func unregisters.
func notifyHangup() (hup <-chan os.Signal, unnotify func()) {
	if signal.Ignored(syscall.SIGHUP) {
		return nil, func() {}
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	return ch, func() { signal.Stop(ch) }
}

// hangupWatch gives SIGHUP its two usual meanings for run. In a process
// with a controlling terminal it is a hangup (the technician's SSH session
// closed), and with --once it has nothing to reload: the agent stops as on
// SIGTERM. Otherwise (systemctl reload, kill -HUP) it asks for the config
// to be read again: once the file checks out and the agent would start
// with it (agent.CheckReload), the agent stops cleanly and restarting
// reports true, for runAgent to open it again in the same process; a
// config it would refuse is logged and the agent runs on with the one it
// has. Go's default for SIGHUP ended the process without the drain, and
// systemd took that for a clean exit and left it stopped.
type hangupWatch struct {
	parent  context.Context // cancelled by SIGTERM/SIGINT: no restart then
	stop    context.CancelFunc
	a       *agent.Agent
	log     *slog.Logger
	path    string
	once    bool
	restart atomic.Bool
	// next is the config checked for the restart: the next round opens
	// this one, not the file read again, which may have changed since.
	// Set before restart, read after done.
	next *config.Config
	done chan struct{} // closed when run returns
}

// run watches hup until ctx (the agent's) is done.
func (h *hangupWatch) run(ctx context.Context, hup <-chan os.Signal) {
	defer close(h.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		if h.parent.Err() != nil {
			return // a SIGTERM came with it: stop, do not start again
		}
		if h.once || hasControllingTerminal() {
			h.log.Info("hangup: stopping")
			h.stop()
			return
		}
		var problems bytes.Buffer
		cfg, _ := loadConfig(&env{stdout: &problems, stderr: &problems}, h.path, true)
		// The status says so before the log does: whoever reads the log
		// line finds the status already telling why.
		if cfg == nil {
			h.a.ReloadRefused(strings.TrimSpace(problems.String()))
			h.log.Error("SIGHUP: the config has problems; running on with the running one",
				"config", h.path, "problems", strings.TrimSpace(problems.String()))
			continue
		}
		if err := h.a.CheckReload(cfg); err != nil {
			h.a.ReloadRefused(err.Error())
			h.log.Error("SIGHUP: the agent would not start with this config; running on with the running one",
				"config", h.path, "err", err)
			continue
		}
		h.log.Info("SIGHUP: stopping, to start again with the config read anew", "config", h.path)
		h.next = cfg
		h.restart.Store(true)
		h.stop()
		return
	}
}

// restarting reports whether the agent should start again: a reload was
// asked for and no SIGTERM came since.
func (h *hangupWatch) restarting() bool { return h.restart.Load() && h.parent.Err() == nil }

// hasControllingTerminal reports whether the process has one: /dev/tty
// opens only then. A service started by systemd has none; an agent run
// from a shell has, whatever its output is redirected to.
func hasControllingTerminal() bool {
	f, err := os.Open("/dev/tty")
	if err != nil {
		return false
	}
	f.Close()
	return true
}
