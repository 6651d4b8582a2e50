// Command edgerig runs edgeagent end to end against simulated devices,
// injected faults and a verifying cloud: scenarios (run), the live demo
// (demo) and a sustained load (load).
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/edgeagent/edgeagent/testrig/rig"
	"github.com/edgeagent/edgeagent/testrig/scenario"
)

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1 // the run found something missing or wrong
	exitUsage = 2
	exitError = 3 // the run could not be carried out
)

func main() {
	restoreTerminal := takeTerminal()
	ctx, abort := context.WithCancel(context.Background())
	stop := make(chan struct{})
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go interrupts(sigs, stop, abort, done, os.Stderr, func() {
		restoreTerminal()
		os.Exit(exitError)
	})
	code := Main(ctx, stop, os.Args[1:], os.Stdout, os.Stderr)
	close(done)
	signal.Stop(sigs)
	restoreTerminal()
	os.Exit(code)
}

// abortGrace is how long an abort may take to stop the agent and servers
// before the rig exits anyway (its children then die with it, see
// testrig/procattr).
const abortGrace = 10 * time.Second

// interrupts turns signals into the rig's two ways of stopping, until done
// is closed: the first closes stop (the devices stop and the summary
// follows), the second cancels the run's context through abort (the agent
// and servers are stopped, no summary), and a third, or an abort still
// running after abortGrace, calls exit.
func interrupts(sigs <-chan os.Signal, stop chan<- struct{}, abort func(), done <-chan struct{}, stderr io.Writer, exit func()) {
	select {
	case <-sigs:
	case <-done:
		return
	}
	fmt.Fprintln(stderr, "\nedgerig: stopping: the summary follows (Ctrl-C again aborts at once)")
	close(stop)
	select {
	case <-sigs:
	case <-done:
		return
	}
	fmt.Fprintln(stderr, "\nedgerig: aborting: stopping the agent and servers, no summary")
	abort()
	select {
	case <-sigs:
	case <-time.After(abortGrace):
	case <-done:
		return
	}
	fmt.Fprintln(stderr, "edgerig: exiting without waiting for the agent and servers to stop")
	exit()
}

// Synopses, one per subcommand: the top-level usage and each subcommand's
// --help share them, so the two cannot drift apart.
const (
	synRun    = "edgerig run [--agent PATH] [--short] [--json FILE] [--dir DIR] [--keep] [--broker mochi|mosquitto] [--mqtt URL] [--nats URL] [--uplink nats|mqtt] [--uplink-broker URL] [--disk-full auto|write-errors] [--quiet] SCENARIO"
	synDemo   = "edgerig demo [--agent PATH] [--duration D] [--devices N] [--dir DIR] [--json FILE] [--uplink nats|mqtt]"
	synLoad   = "edgerig load [--agent PATH] [--devices N] [--duration D] [--connections N] [--reading-interval D] [--max-spread D] [--rate N] [--max-rate N] [--json FILE] [--dir DIR] [--mqtt URL | --embedded] [--uplink nats|mqtt]"
	synReplay = "edgerig replay --dir DIR --agent PATH [--agent PATH ...] [--rounds N] [--json FILE]"
)

const usage = `edgerig — simulated devices, faults and cloud around the real edgeagent

Usage:
  ` + synRun + `
  ` + synDemo + `
  ` + synLoad + `
  ` + synReplay + `
  edgerig scenarios

SCENARIO is a stock scenario name (edgerig scenarios lists them) or a YAML file.
Exit status: 0 pass, 1 something missing or wrong, 2 usage, 3 the run could not be carried out.
`

// Main runs the command line and returns the exit code. Closing stop ends
// a run or demo early with its report; ctx ending aborts it.
func Main(ctx context.Context, stop <-chan struct{}, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "run":
		return cmdRun(ctx, stop, args[1:], stdout, stderr)
	case "demo":
		return cmdDemo(ctx, stop, args[1:], stdout, stderr)
	case "load":
		// Load mode has no partial figures to give: a stop ends it as an
		// abort does.
		lctx, cancel := rig.WithStop(ctx, stop)
		defer cancel()
		return cmdLoad(lctx, args[1:], stdout, stderr)
	case "replay":
		lctx, cancel := rig.WithStop(ctx, stop)
		defer cancel()
		return cmdReplay(lctx, args[1:], stdout, stderr)
	case "scenarios":
		for _, n := range scenario.Names() {
			sc, err := scenario.Lookup(n)
			if err != nil {
				fmt.Fprintf(stdout, "%-16s (invalid: %v)\n", n, err)
				continue
			}
			fmt.Fprintf(stdout, "%-16s %s\n", n, sc.Description)
		}
		return exitOK
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "edgerig: unknown command %q\n\n%s", args[0], usage)
	return exitUsage
}

// flags makes a subcommand's flag set. Its messages are buffered so that
// parseFailed can send --help to stdout and a bad flag to stderr.
func flags(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("edgerig "+name, flag.ContinueOnError)
	fs.SetOutput(&bytes.Buffer{})
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: %s\n\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseFailed reports a flag parse error and returns the exit code:
// -h/--help print the usage to stdout and succeed, as the top-level --help
// does; anything else is a usage error.
func parseFailed(fs *flag.FlagSet, err error, stdout, stderr io.Writer) int {
	msg := fs.Output().(*bytes.Buffer).String()
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, msg)
		return exitOK
	}
	fmt.Fprint(stderr, msg)
	return exitUsage
}

// parse parses flags placed before or after the positional arguments.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func cmdRun(ctx context.Context, stop <-chan struct{}, args []string, stdout, stderr io.Writer) int {
	fs := flags("run", synRun)
	agent := fs.String("agent", "bin/edgeagent", "edgeagent binary")
	short := fs.Bool("short", false, "run the scenario's short version (CI)")
	jsonPath := fs.String("json", "", "also write the report as JSON to `FILE` (- for stdout)")
	dir := fs.String("dir", "", "run directory (default: a temporary one, removed after a pass)")
	keep := fs.Bool("keep", false, "keep the run directory after a pass")
	mqtt := fs.String("mqtt", "", "use this external MQTT broker `URL` instead of an in-process one")
	nats := fs.String("nats", "", "use this external NATS `URL` (with JetStream) instead of an in-process one")
	broker := fs.String("broker", "", "in-process broker: mochi or mosquitto (default: mosquitto when the scenario restarts the broker or the agent and mosquitto is installed, else mochi)")
	uplink := fs.String("uplink", rig.UplinkNATS, "the agent's uplink: nats (JetStream) or mqtt (a broker of its own)")
	uplinkBroker := fs.String("uplink-broker", "", "with --uplink mqtt: this external MQTT broker `URL` instead of an in-process one")
	diskFull := fs.String("disk-full", rig.DiskFullAuto, "how disk_full fills the disk: auto (a small tmpfs where the rig can mount one, else injected write errors) or write-errors")
	quiet := fs.Bool("quiet", false, "no progress lines")
	pos, err := parse(fs, args)
	if err != nil {
		return parseFailed(fs, err, stdout, stderr)
	}
	if len(pos) != 1 {
		fmt.Fprintf(stderr, "edgerig run: want one SCENARIO, got %d\n\n%s", len(pos), usage)
		return exitUsage
	}
	if err := checkFlags(checkURL("mqtt", *mqtt, mqttSchemes...), checkURL("nats", *nats, "nats"),
		// The uplink goes through the fault proxy, which speaks plain TCP.
		checkURL("uplink-broker", *uplinkBroker, "tcp", "mqtt")); err != nil {
		fmt.Fprintf(stderr, "edgerig run: %v\n", err)
		return exitUsage
	}
	sc, err := scenario.Lookup(pos[0])
	if err != nil {
		fmt.Fprintf(stderr, "edgerig run: %v\n", err)
		return exitUsage
	}
	var progress io.Writer = stderr
	if *quiet {
		progress = nil
	}
	opts := rig.Options{Agent: *agent, Scenario: sc, Short: *short, Dir: *dir, Keep: *keep,
		MQTT: *mqtt, NATS: *nats, Broker: *broker, Uplink: *uplink, UplinkBroker: *uplinkBroker, Progress: progress, Stop: stop,
		DiskFull: *diskFull}
	if err := rig.CheckOptions(opts); err != nil {
		fmt.Fprintf(stderr, "edgerig run: %v\n", err)
		return exitUsage
	}
	if err := checkJSONPath(*jsonPath); err != nil {
		fmt.Fprintf(stderr, "edgerig: %v\n", err)
		return exitUsage
	}
	rep, err := rig.Run(ctx, opts)
	if err != nil {
		fmt.Fprintf(stderr, "edgerig run: %s\n", failed(ctx, err))
		return exitError
	}
	return report(rep, *jsonPath, stdout, stderr)
}

func report(rep *rig.Report, jsonPath string, stdout, stderr io.Writer) int {
	if jsonPath == "-" {
		if err := rep.WriteJSON(stdout); err != nil {
			fmt.Fprintf(stderr, "edgerig: %v\n", err)
			return exitError
		}
	} else {
		rep.WriteTable(stdout)
		if jsonPath != "" {
			if code := writeJSONFile(jsonPath, rep.WriteJSON, stderr); code != exitOK {
				return code
			}
		}
	}
	switch {
	case rep.Interrupted:
		return exitError // not carried out to the end: no verdict on the agent
	case !rep.OK():
		return exitFail
	}
	return exitOK
}

// failed says why a run could not be carried out, in a user's words when
// it was aborted.
func failed(ctx context.Context, err error) string {
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return fmt.Sprintf("aborted (a second Ctrl-C): the agent and servers were stopped, no report (%v)", err)
	}
	return err.Error()
}

// checkJSONPath opens a --json FILE for writing before the run, so that a
// path that cannot be written is said at once and not after minutes of
// running.
func checkJSONPath(path string) error {
	if path == "" || path == "-" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("--json: %w", err)
	}
	return f.Close()
}

func writeJSONFile(path string, write func(io.Writer) error, stderr io.Writer) int {
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintf(stderr, "edgerig: %v\n", err)
		return exitError
	}
	werr := write(f)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		fmt.Fprintf(stderr, "edgerig: write %s: %v\n", path, werr)
		return exitError
	}
	return exitOK
}

func cmdDemo(ctx context.Context, stop <-chan struct{}, args []string, stdout, stderr io.Writer) int {
	fs := flags("demo", synDemo)
	agent := fs.String("agent", "bin/edgeagent", "edgeagent binary")
	duration := fs.Duration("duration", 0, "stop after this long (default: run until Ctrl-C)")
	devices := fs.Int("devices", 36, "number of simulated devices")
	dir := fs.String("dir", "", "data directory (default: a temporary one; ./demo-data keeps it)")
	jsonPath := fs.String("json", "", "also write the verifier's summary as JSON to `FILE`")
	uplink := fs.String("uplink", rig.UplinkNATS, "the agent's uplink: nats (JetStream) or mqtt (a broker of its own)")
	pos, err := parse(fs, args)
	if err != nil {
		return parseFailed(fs, err, stdout, stderr)
	}
	if len(pos) != 0 {
		fmt.Fprintf(stderr, "edgerig demo: unexpected argument %q\n", pos[0])
		return exitUsage
	}
	if err := checkFlags(checkMin("duration", *duration, 0, "0 (run until Ctrl-C) or more"), checkMin("devices", *devices, 3, "at least 3 (one of each format)"),
		rig.CheckUplink(rig.Options{Uplink: *uplink})); err != nil {
		fmt.Fprintf(stderr, "edgerig demo: %v\n", err)
		return exitUsage
	}
	if err := checkJSONPath(*jsonPath); err != nil {
		fmt.Fprintf(stderr, "edgerig: %v\n", err)
		return exitUsage
	}
	rep, err := rig.Demo(ctx, rig.DemoOptions{Agent: *agent, Duration: *duration, Devices: *devices, Dir: *dir, Out: stdout, Stop: stop, Uplink: *uplink})
	if err != nil {
		fmt.Fprintf(stderr, "edgerig demo: %s\n", failed(ctx, err))
		if errors.Is(err, rig.ErrNoAgent) {
			fmt.Fprintln(stderr, "build the agent first: make build (make demo does it for you)")
		}
		return exitError
	}
	return report(rep, *jsonPath, stdout, stderr)
}

func cmdLoad(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flags("load", synLoad)
	agent := fs.String("agent", "bin/edgeagent", "edgeagent binary")
	devices := fs.Int("devices", 10000, "simulated devices")
	duration := fs.Duration("duration", 30*time.Second, "how long the agent is loaded")
	conns := fs.Int("connections", 16, "MQTT connections the devices share")
	interval := fs.Duration("reading-interval", rig.DefaultReadingInterval, "event time between one device's readings (sets how fast event time runs)")
	jsonPath := fs.String("json", "", "also write the figures as JSON to `FILE` (- for stdout, instead of the table)")
	mqtt := fs.String("mqtt", "", "use this external MQTT broker `URL` (the ceiling is measured on it too)")
	embedded := fs.Bool("embedded", false, "devices publish to the agent's embedded broker (its CPU and memory then include the broker's)")
	dir := fs.String("dir", "", "run directory (default: a temporary one)")
	uplink := fs.String("uplink", rig.UplinkNATS, "the agent's uplink: nats (JetStream) or mqtt (a broker of its own)")
	spread := fs.Duration("max-spread", 0, "keep the devices within this much event time of each other when unpaced (0: unbounded, the connections race)")
	paced := fs.Int("rate", 0, "pace the publishers at this many `msgs/s` (0: as fast as the agent takes them); compare builds at one rate")
	maxRate := fs.Int("max-rate", rig.DefaultMaxRate, "unpaced, plan at most this many `msgs/s` (the plan holds 1.5 times the measured ceiling up to this, about 300 bytes a message in the rig's memory)")
	pos, err := parse(fs, args)
	if err != nil {
		return parseFailed(fs, err, stdout, stderr)
	}
	if len(pos) != 0 {
		fmt.Fprintf(stderr, "edgerig load: unexpected argument %q\n", pos[0])
		return exitUsage
	}
	if *embedded && *mqtt != "" {
		fmt.Fprintln(stderr, "edgerig load: --embedded and --mqtt exclude each other (the devices publish either to the agent or to the external broker)")
		return exitUsage
	}
	if err := checkFlags(checkMin("devices", *devices, 1, "at least 1"), checkMin("duration", *duration, time.Nanosecond, "more than 0"),
		checkMin("connections", *conns, 1, "at least 1"), checkMin("reading-interval", *interval, time.Nanosecond, "more than 0"), checkMin("rate", *paced, 0, "0 or more"),
		checkMin("max-rate", *maxRate, 1, "at least 1"), checkMin("max-spread", *spread, 0, "0 or more"), checkURL("mqtt", *mqtt, mqttSchemes...), rig.CheckUplink(rig.Options{Uplink: *uplink})); err != nil {
		fmt.Fprintf(stderr, "edgerig load: %v\n", err)
		return exitUsage
	}
	if err := checkJSONPath(*jsonPath); err != nil {
		fmt.Fprintf(stderr, "edgerig: %v\n", err)
		return exitUsage
	}
	lr, err := rig.Load(ctx, rig.LoadOptions{Agent: *agent, Devices: *devices, Duration: *duration, Connections: *conns,
		ReadingInterval: *interval, MaxSpread: *spread, Rate: *paced, MaxRate: *maxRate, MQTT: *mqtt, Embedded: *embedded, Uplink: *uplink, Dir: *dir, Progress: stderr})
	if err != nil {
		fmt.Fprintf(stderr, "edgerig load: %v\n", err)
		return exitError
	}
	if code := writeReport("load", *jsonPath, lr.WriteTable, lr.WriteJSON, stdout, stderr); code != exitOK {
		return code
	}
	if !lr.OK() {
		return exitFail
	}
	return exitOK
}

// cmdReplay runs agents over the Bronze log a load run left (--dir) and
// reports their CPU side by side.
func cmdReplay(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flags("replay", synReplay)
	dir := fs.String("dir", "", "the directory of an earlier `edgerig load --dir DIR` run")
	var agents []string
	fs.Func("agent", "an edgeagent binary to run (repeat to compare builds; they alternate)", func(v string) error {
		agents = append(agents, v)
		return nil
	})
	rounds := fs.Int("rounds", 5, "runs of each agent")
	jsonPath := fs.String("json", "", "also write the figures as JSON to `FILE` (- for stdout, instead of the table)")
	pos, err := parse(fs, args)
	if err != nil {
		return parseFailed(fs, err, stdout, stderr)
	}
	if len(pos) != 0 {
		fmt.Fprintf(stderr, "edgerig replay: unexpected argument %q\n", pos[0])
		return exitUsage
	}
	var errs []error
	if *dir == "" {
		errs = append(errs, errors.New("--dir: required (the directory of a load run)"))
	}
	if len(agents) == 0 {
		errs = append(errs, errors.New("--agent: at least one"))
	}
	if err := checkFlags(append(errs, checkMin("rounds", *rounds, 1, "at least 1"))...); err != nil {
		fmt.Fprintf(stderr, "edgerig replay: %v\n", err)
		return exitUsage
	}
	if err := checkJSONPath(*jsonPath); err != nil {
		fmt.Fprintf(stderr, "edgerig: %v\n", err)
		return exitUsage
	}
	rep, err := rig.Replay(ctx, rig.ReplayOptions{Dir: *dir, Agents: agents, Rounds: *rounds,
		Logf: func(format string, args ...any) { fmt.Fprintf(stderr, format+"\n", args...) }})
	if err != nil {
		fmt.Fprintf(stderr, "edgerig replay: %v\n", err)
		return exitError
	}
	return writeReport("replay", *jsonPath, rep.WriteTable, rep.WriteJSON, stdout, stderr)
}

// writeReport writes a report as the --json flag says: the table, the
// table and a JSON file, or JSON alone on stdout (-).
func writeReport(cmd, jsonPath string, table func(io.Writer), asJSON func(io.Writer) error, stdout, stderr io.Writer) int {
	switch jsonPath {
	case "-":
		if err := asJSON(stdout); err != nil {
			fmt.Fprintf(stderr, "edgerig %s: %v\n", cmd, err)
			return exitError
		}
	case "":
		table(stdout)
	default:
		table(stdout)
		return writeJSONFile(jsonPath, asJSON, stderr)
	}
	return exitOK
}

// mqttSchemes are the broker URL schemes both paho (the simulated devices)
// and the agent's config accept.
var mqttSchemes = []string{"tcp", "mqtt", "ssl", "tls", "mqtts", "ws", "wss"}

// checkFlags joins the failed checks, one line each. Flag values are checked
// before anything starts, so a bad value is a usage error (exit 2) naming
// the flag, not a failed run (exit 3) naming some field inside the rig.
func checkFlags(errs ...error) error {
	return errors.Join(errs...)
}

// checkMin checks a numeric flag against its least allowed value.
func checkMin[T int | time.Duration](name string, v, least T, want string) error {
	if v < least {
		return fmt.Errorf("--%s %v: want %s", name, v, want)
	}
	return nil
}

// checkURL checks that a server flag, when given, is scheme://host:port
// with one of schemes: a bare host or host:port would otherwise fail
// only once servers are starting, with the library's words for it.
func checkURL(name, v string, schemes ...string) error {
	if v == "" {
		return nil
	}
	u, err := url.Parse(v)
	if err != nil || !slices.Contains(schemes, u.Scheme) || u.Hostname() == "" || u.Port() == "" {
		return fmt.Errorf("--%s %q: want %s://host:port", name, v, strings.Join(schemes, "|"))
	}
	return nil
}
