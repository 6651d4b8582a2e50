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
)

// watchHangup gives SIGHUP its two usual meanings for run. From a terminal
// it is a hangup (the technician's SSH session closed): the agent stops as
// on SIGTERM. Otherwise (systemctl reload, kill -HUP) it asks for the
// config to be read again: once the file checks out, the agent stops
// cleanly and restart reports true, for runAgent to start it again in
// place; a file with problems is logged and the agent runs on with the
// config it has. Go's default for SIGHUP ended the process without the
// drain, and systemd took that for a clean exit and left it stopped.
//
// hup is registered by the caller before anything else, so that no SIGHUP
// falls to the default action while the agent opens.
func watchHangup(ctx context.Context, hup <-chan os.Signal, stop context.CancelFunc, log *slog.Logger, path string) (restart *atomic.Bool) {
	restart = new(atomic.Bool)
	terminal := isTTY(os.Stderr)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
			}
			if terminal {
				log.Info("hangup: stopping")
				stop()
				return
			}
			var problems bytes.Buffer
			if cfg, _ := loadConfig(&env{stdout: &problems, stderr: &problems}, path, true); cfg == nil {
				log.Error("SIGHUP: the config has problems; running on with the one loaded at start",
					"config", path, "problems", strings.TrimSpace(problems.String()))
				continue
			}
			log.Info("SIGHUP: stopping, to start again with the config read anew", "config", path)
			restart.Store(true)
			stop()
			return
		}
	}()
	return restart
}

// notifyHangup registers for SIGHUP; the returned func unregisters.
func notifyHangup() (<-chan os.Signal, func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	return hup, func() { signal.Stop(hup) }
}
