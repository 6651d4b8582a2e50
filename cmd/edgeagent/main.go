// Command edgeagent is the edge gateway agent: it ingests device MQTT into a
// durable log, computes event-time windows and forwards the aggregates
// upstream. main only turns Run into an exit code.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// Set by the linker: -X main.version=… -X main.commit=…
var (
	version = "dev"
	commit  = "unknown"
)

func main() {
	quietSysmon(os.Args) // first: it may replace the process image
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	os.Exit(Run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}
