package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"time"

	"github.com/edgeagent/edgeagent/cmd/edgeagent/agent"
	"github.com/edgeagent/edgeagent/config"
	"github.com/edgeagent/edgeagent/ingest"
	"github.com/edgeagent/edgeagent/internal/heapgoal"
	"github.com/edgeagent/edgeagent/internal/lograte"
	"github.com/edgeagent/edgeagent/uplink"
	"github.com/edgeagent/edgeagent/window"
	"github.com/edgeagent/edgeagent/window/alert"
)

// Exit codes.
const (
	exitOK     = 0
	exitFail   = 1 // the command ran and failed
	exitUsage  = 2 // bad flags or arguments
	exitConfig = 3 // the config file is invalid, or the saved state does not match it
)

// command is one subcommand.
type command struct {
	name    string
	summary string
	usage   string // the text after "edgeagent NAME", then examples
	run     func(ctx context.Context, env *env, args []string) int
}

// env is what every subcommand gets.
type env struct {
	stdout, stderr io.Writer
}

func (e *env) errorf(format string, a ...any) {
	fmt.Fprintf(e.stderr, "edgeagent: "+format+"\n", a...)
}

var commands []*command

func register(c *command) { commands = append(commands, c) }

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// Run runs the command line args and returns the process exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	e := &env{stdout: stdout, stderr: stderr}
	if len(args) == 0 {
		printUsage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "--help", "help":
		if len(args) > 1 {
			topic := strings.Join(args[1:], " ")
			if c := lookup(topic); c != nil {
				// The command's own --help: its usage and its flags.
				return Run(ctx, append(strings.Fields(c.name), "--help"), stdout, stderr)
			}
			if printGroup(stdout, topic) {
				return exitOK
			}
		}
		printUsage(stdout)
		return exitOK
	case "-v", "--version":
		args = []string{"version"}
	}
	name, rest := args[0], args[1:]
	// Two-word commands: "config check", "inspect bronze".
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		if c := lookup(name + " " + rest[0]); c != nil {
			name, rest = c.name, rest[1:]
		}
	}
	c := lookup(name)
	if c == nil {
		// A group ("config", "inspect") lists its commands: on --help as the
		// answer, otherwise as a usage error.
		if len(rest) > 0 && (rest[0] == "-h" || rest[0] == "--help") && printGroup(stdout, name) {
			return exitOK
		}
		if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") && len(groupCommands(name)) > 0 {
			// "inspect foo": say what was wrong before listing what is right.
			e.errorf("unknown command %q", name+" "+rest[0])
		}
		if printGroup(stderr, name) {
			return exitUsage
		}
		e.errorf("unknown command %q; run 'edgeagent help' for the list", strings.Join(args[:min(2, len(args))], " "))
		return exitUsage
	}
	return c.run(ctx, e, rest)
}

// groupCommands are the commands whose first word is group.
func groupCommands(group string) []*command {
	var cs []*command
	for _, c := range commands {
		if strings.HasPrefix(c.name, group+" ") {
			cs = append(cs, c)
		}
	}
	return cs
}

// printGroup lists the commands whose first word is group, and reports
// whether there were any.
func printGroup(w io.Writer, group string) bool {
	cs := groupCommands(group)
	if len(cs) == 0 {
		return false
	}
	printCommands(w, group+" ", cs)
	return true
}

func printUsage(w io.Writer) {
	fmt.Fprintf(w, "edgeagent — durable MQTT ingest, event-time windows and uplink for edge gateways\n\n")
	printCommands(w, "", append([]*command(nil), commands...))
}

// printCommands lists cs (sorted in place) by name, under the usage line
// of the commands that start with prefix.
func printCommands(w io.Writer, prefix string, cs []*command) {
	sort.Slice(cs, func(i, j int) bool { return cs[i].name < cs[j].name })
	fmt.Fprintf(w, "Usage: edgeagent %sCOMMAND [flags]\n\nCommands:\n", prefix)
	for _, c := range cs {
		fmt.Fprintf(w, "  %-22s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun 'edgeagent %sCOMMAND --help' for a command's flags and examples.\n", prefix)
}

// newFlags returns a FlagSet whose --help prints the command's usage.
func newFlags(c *command, e *env) *flag.FlagSet {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	errs := &countingWriter{w: e.stderr}
	fs.SetOutput(errs)
	fs.Usage = func() {
		// Asked for (--help), the usage is the output; after a flag error,
		// which the flag package wrote first, it goes with the error.
		w := e.stdout
		if errs.n > 0 {
			w = e.stderr
		}
		fmt.Fprint(w, c.usage)
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n == 0 {
			return
		}
		fmt.Fprintln(w, "\nFlags:")
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(errs)
	}
	return fs
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += n
	return n, err
}

// parseFlags parses args; it returns an exit code and false when the command
// must stop (help shown, or a usage error).
func parseFlags(fs *flag.FlagSet, args []string) (int, bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, false
		}
		return exitUsage, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "edgeagent %s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return exitUsage, false
	}
	return 0, true
}

const defaultConfigPath = "/etc/edgeagent/config.yaml"

// loadConfig loads the file and prints every error when it is invalid.
// With checkFiles it also checks that the files the config names (TLS,
// NATS credentials) can be read, so a missing certificate is reported with
// its line before anything starts instead of failing a stage at start.
func loadConfig(e *env, path string, checkFiles bool) (*config.Config, int) {
	if checkFiles {
		return loadConfigWith(e, path, config.ParseCheckingFiles)
	}
	return loadConfigWith(e, path, config.Parse)
}

// loadReadOnlyConfig loads the file for a command that reads the keys
// named (or under them) and starts nothing: a variable left unset
// elsewhere in the file does not stop it (config.ParseReadOnly), one in a
// key it needs does, named.
func loadReadOnlyConfig(e *env, path string, needed ...string) (*config.Config, int) {
	cfg, code := loadConfigWith(e, path, config.ParseReadOnly)
	if cfg == nil {
		return nil, code
	}
	for _, key := range needed {
		if names := cfg.Unresolved(key); len(names) > 0 {
			e.errorf("%s: %s uses ${%s}, which is not set; set it, or run as root (sudo) if it comes from the variables file", path, key, strings.Join(names, "}, ${"))
			return nil, exitConfig
		}
	}
	return cfg, exitOK
}

func loadConfigWith(e *env, path string, parse func(string, []byte, func(string) (string, bool)) (*config.Config, error)) (*config.Config, int) {
	data, err := os.ReadFile(path)
	if err != nil {
		e.errorf("read config %s: %v", path, err)
		return nil, exitConfig
	}
	lookup, envErr := configEnv()
	cfg, err := parse(path, data, lookup)
	if err != nil {
		var errs *config.Errors
		if errors.As(err, &errs) {
			fmt.Fprintf(e.stderr, "edgeagent: %s is invalid (%d problem%s):\n", path, len(errs.List), plural(len(errs.List)))
			fmt.Fprintln(e.stderr, errs.Error())
			switch {
			case errors.Is(envErr, fs.ErrNotExist):
				fmt.Fprintf(e.stderr, "Note: the variables file was skipped (%v); check EDGEAGENT_ENV_FILE if the config uses ${NAME} variables from it.\n", envErr)
			case envErr != nil:
				fmt.Fprintf(e.stderr, "Note: the variables file was skipped (%v); run as root (sudo) if the config uses ${NAME} variables from it.\n", envErr)
			}
			fmt.Fprintf(e.stderr, "Fix the file and check it again with: edgeagent config check -c %s\n", path)
			return nil, exitConfig
		}
		e.errorf("%v", err)
		return nil, exitConfig
	}
	return cfg, exitOK
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func newLogger(w io.Writer, format, level string) *slog.Logger {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		lv = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lv}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if format == "json" {
		// slog's JSON writes a duration as integer nanoseconds
		// ("in":161000000); the text format's "161ms" reads better and
		// parses with Go's time.ParseDuration.
		opts.ReplaceAttr = func(_ []string, a slog.Attr) slog.Attr {
			if a.Value.Kind() == slog.KindDuration {
				a.Value = slog.StringValue(a.Value.Duration().String())
			}
			return a
		}
		h = slog.NewJSONHandler(w, opts)
	}
	// A warning or error repeated during an outage logs once a minute with
	// a count, not once per retry.
	return slog.New(lograte.New(h, time.Minute, nil))
}

func init() {
	register(&command{
		name:    "run",
		summary: "run the agent (ingest, windows, uplink, status endpoint)",
		usage: `Usage: edgeagent run -c FILE [--once] [--log-format text|json]

Runs the agent until SIGTERM or SIGINT, then finishes the batch in hand,
flushes, closes the store and exits 0. SIGHUP reads the config again: if
the agent would start with it, it stops the same way and opens again with
it; if not, it logs why and runs on (from a terminal, SIGHUP stops it).

With --once it processes everything already in Bronze, emits what is due,
tries to deliver the outbox to the uplink for up to uplink.ack_timeout (at
least 5s), and exits (the availableNow mode of batch jobs): 0 when every
aggregate and alert was acknowledged, 1 when the uplink left some in the
outbox for the next run. With no uplink configured it exits 0 and the
outbox keeps them until one is. Local messages (local_publish) wait for the
next run of the agent.

Examples:
  edgeagent run -c /etc/edgeagent/config.yaml
  edgeagent run -c ./config.yaml --log-format json
  edgeagent run -c ./config.yaml --once
`,
		run: runAgent,
	})
	register(&command{
		name:    "config check",
		summary: "validate a config file and print the effective config",
		usage: `Usage: edgeagent config check -c FILE [--skip-files]

Validates the file, and loads the TLS and NATS credentials files it names
as the agent will. When it is valid, prints the effective configuration
(defaults filled in, secrets masked) and exits 0. Otherwise prints every
problem with its file, line and key, and exits 3. With --skip-files the
named files are not looked for: for checking a fleet config on a laptop.

Examples:
  edgeagent config check -c /etc/edgeagent/config.yaml
  GATEWAY_ID=gw-17 edgeagent config check -c fleet.yaml --skip-files
`,
		run: configCheck,
	})
	register(&command{
		name:    "version",
		summary: "print the version, commit and platform",
		usage:   "Usage: edgeagent version\n\nExample:\n  edgeagent version\n",
		run:     printVersion,
	})
}

func runAgent(ctx context.Context, e *env, args []string) int {
	hup, unnotify := notifyHangup()
	defer unnotify()
	c := lookup("run")
	fs := newFlags(c, e)
	path := fs.String("c", defaultConfigPath, "config file")
	once := fs.Bool("once", false, "process what is in Bronze, flush, deliver, exit")
	logFormat := fs.String("log-format", "", "log format: text or json (default: the config's log.format)")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *logFormat != "" && *logFormat != "text" && *logFormat != "json" {
		e.errorf("--log-format must be text or json, not %q", *logFormat)
		return exitUsage
	}
	// Each round opens the agent on a checked config; a SIGHUP that asks
	// for a reload ends the round cleanly (see hangupWatch). The restart
	// stays in the process, so no SIGTERM that arrives during it is lost,
	// as it was across an exec.
	cfg, code := loadConfig(e, *path, true)
	if cfg == nil {
		return code
	}
	var prev *config.Config // the config that ran before a reload
	// files are the data files a reload keeps open from one round to the
	// next; a round that opens the agent owns them until it stops.
	var files *agent.Files
	for {
		code, next, opened, kept := runRound(ctx, e, hup, cfg, *path, *logFormat, *once, files)
		files = kept
		switch {
		case next != nil:
			prev, cfg = cfg, next
		case !opened && prev != nil && ctx.Err() == nil:
			// The reloaded config passed the check but did not open: the
			// one before it did, so the agent goes on with that rather
			// than down.
			fmt.Fprintf(e.stderr, "edgeagent: the reloaded config did not open; opening the one that ran before it again\n")
			cfg, prev = prev, nil
		default:
			if files != nil {
				if err := files.Close(); err != nil {
					fmt.Fprintf(e.stderr, "edgeagent: %v\n", err)
					if code == exitOK {
						code = exitFail
					}
				}
			}
			return code
		}
	}
}

// runRound opens the agent on cfg (read from path) and files (nil: open
// data_dir's), runs it until ctx is done or a SIGHUP asks for a reload,
// and closes it. next is the config to open again with, nil when the agent
// is done; opened says Open succeeded. kept are the data files left open
// for the caller: files again after a failed Open, the agent's own after a
// reload, nil once it closed them.
func runRound(ctx context.Context, e *env, hup <-chan os.Signal, cfg *config.Config, path, logFormat string, once bool, files *agent.Files) (code int, next *config.Config, opened bool, kept *agent.Files) {
	format := cfg.Log.Format
	if logFormat != "" {
		format = logFormat
	}
	log := newLogger(e.stderr, format, cfg.Log.Level)
	setMaxProcs(log, cfg.Processing.MaxProcs, os.Getenv("GOMAXPROCS"))
	defer startHeapPacing(cfg.Processing.HeapPacing)()
	if files != nil {
		log.Info("keeping the data files open across the reload", "data_dir", cfg.DataDir)
	}
	a, err := agent.Open(cfg, agent.Options{Logger: log, ConfigPath: path, Version: version, Files: files})
	if err != nil {
		log.Error("cannot start", "err", err)
		var hint *agent.HintError
		if errors.As(err, &hint) {
			// A config the saved state does not match, or a damaged data
			// file: like an invalid config, a restart cannot fix it
			// (RestartPreventExitStatus=3).
			fmt.Fprintf(e.stderr, "edgeagent: %s\n", hint.Hint)
			return exitConfig, nil, false, files
		}
		if invalidConfig(err) {
			// A setting a stage refuses that config check let through: as
			// much an invalid config as one config check finds.
			fmt.Fprintf(e.stderr, "edgeagent: %v\n", err)
			return exitConfig, nil, false, files
		}
		return exitFail, nil, false, files
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	watch := &hangupWatch{parent: ctx, stop: stop, a: a, log: log, path: path, once: once, done: make(chan struct{})}
	go watch.run(runCtx, hup)
	if once {
		err = a.RunOnce(runCtx)
	} else {
		err = a.Run(runCtx)
	}
	stop()
	<-watch.done // the next round's watch reads hup alone
	if err == nil && watch.restarting() {
		kept = a.Detach()
	}
	if cerr := a.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		log.Error("stopped with an error", "err", err)
		return exitFail, nil, true, kept
	}
	if watch.restarting() {
		log.Info("starting again with the config read anew", "config", path)
		return exitOK, watch.next, true, kept
	}
	// A SIGTERM during Close ends the reload: the caller closes what was
	// kept for it.
	return exitOK, nil, true, kept
}

func configCheck(_ context.Context, e *env, args []string) int {
	c := lookup("config check")
	fs := newFlags(c, e)
	path := fs.String("c", defaultConfigPath, "config file")
	skipFiles := fs.Bool("skip-files", false, "do not read the TLS and credentials files it names (checking a fleet config on another machine)")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	cfg, code := loadConfig(e, *path, !*skipFiles)
	if cfg == nil {
		return code
	}
	out, err := cfg.Redacted().YAML()
	if err != nil {
		e.errorf("print effective config: %v", err)
		return exitFail
	}
	fmt.Fprintf(e.stdout, "# %s is valid. Effective configuration (defaults filled in, secrets masked):\n", *path)
	e.stdout.Write(out)
	return exitOK
}

func printVersion(_ context.Context, e *env, args []string) int {
	fs := newFlags(lookup("version"), e)
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	v, c := version, commit
	if info, ok := debug.ReadBuildInfo(); ok && c == "unknown" {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				c = s.Value[:12]
			}
		}
	}
	fmt.Fprintf(e.stdout, "edgeagent %s (commit %s, %s, %s/%s)\n", v, c, runtime.Version(), runtime.GOOS, goarch())
	return exitOK
}

// goarch names ARM variants the way the release artifacts do (armv6, armv7).
func goarch() string {
	if runtime.GOARCH != "arm" {
		return runtime.GOARCH
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "GOARM" {
				return "armv" + strings.TrimSuffix(s.Value, ",softfloat")
			}
		}
	}
	return "arm"
}

// startHeapPacing runs the heap pacer (internal/heapgoal) for one round
// when processing.heap_pacing is on; the func it returns stops the pacer,
// which puts back the memory limit it found (GOMEMLIMIT's), and waits.
func startHeapPacing(on bool) (stop func()) {
	if !on {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		heapgoal.Run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// setMaxProcs applies processing.max_procs unless GOMAXPROCS is set in the
// environment (env, which the Go runtime has applied already). The
// pipeline is a chain of single goroutines, each mostly waiting for the
// next; with more threads than it keeps busy, every hand-off wakes a
// spinning thread that finds nothing to do: 15-20 % of the agent's CPU in
// load mode.
func setMaxProcs(log *slog.Logger, maxProcs int, env string) {
	if env != "" {
		log.Info("scheduler threads", "max_procs", runtime.GOMAXPROCS(0), "from", "GOMAXPROCS", "sysmon", sysmonMode())
		return
	}
	n := maxProcs
	if n == 0 {
		n = runtime.NumCPU()
	}
	runtime.GOMAXPROCS(n)
	log.Info("scheduler threads", "max_procs", n, "from", "processing.max_procs", "sysmon", sysmonMode())
}

// invalidConfig reports whether err is a stage's refusal of its settings.
func invalidConfig(err error) bool {
	for _, target := range []error{ingest.ErrConfig, window.ErrInvalidConfig, alert.ErrInvalidConfig, uplink.ErrConfig} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}
