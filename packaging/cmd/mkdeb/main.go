// Command mkdeb builds the edgeagent .deb packages from the binaries that
// `make cross` left in dist/; it is what `make deb` runs.
//
//	go run ./packaging/cmd/mkdeb -version "$(git describe --tags --always --dirty)"
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"

	"github.com/edgeagent/edgeagent/packaging"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkdeb:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("mkdeb", flag.ContinueOnError)
	dist := fs.String("dist", "dist", "directory with edgeagent-linux-ARCH binaries; the .debs go there too")
	version := fs.String("version", "", "git describe output or version (default: git describe --tags --always --dirty)")
	arches := fs.String("arch", "", "comma-separated targets (armv6,armv7,arm64,amd64 or Debian names); default all")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version == "" {
		out, err := exec.CommandContext(ctx, "git", "describe", "--tags", "--always", "--dirty").Output()
		if err != nil {
			return fmt.Errorf("git describe (pass -version): %w", err)
		}
		*version = strings.TrimSpace(string(out))
	}
	o := packaging.DebOptions{RepoDir: ".", DistDir: *dist, Version: *version, Output: os.Stderr}
	if *arches != "" {
		for _, name := range strings.Split(*arches, ",") {
			a, ok := packaging.LookupArch(strings.TrimSpace(name))
			if !ok {
				return fmt.Errorf("unknown architecture %q", name)
			}
			o.Arches = append(o.Arches, a)
		}
	}
	// Reproducible packages: file times are the commit's, unless the
	// caller set SOURCE_DATE_EPOCH.
	if os.Getenv("SOURCE_DATE_EPOCH") == "" {
		if out, err := exec.CommandContext(ctx, "git", "log", "-1", "--format=%ct").Output(); err == nil {
			if sec, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64); err == nil {
				o.SourceDateEpoch = sec
			}
		}
	}
	debs, err := packaging.BuildDebs(ctx, o)
	for _, d := range debs {
		fmt.Println(d)
	}
	return err
}
