package packaging

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
)

// ErrMissingBinary is returned by BuildDebs when an architecture's binary
// has not been built into the dist directory.
var ErrMissingBinary = errors.New("packaging: binary not built (run make cross first)")

// NFPMConfig is the nfpm configuration, relative to the repository root.
const NFPMConfig = "packaging/nfpm.yaml"

// DebOptions say what BuildDebs packages and where.
type DebOptions struct {
	// RepoDir is the repository root: nfpm runs there, so the source paths
	// in nfpm.yaml are relative to it.
	RepoDir string
	// DistDir holds the binaries (edgeagent-linux-ARCH); the .deb files are
	// written next to them.
	DistDir string
	// Version is `git describe` output (or a version); see DebianVersion.
	Version string
	// SourceDateEpoch, when > 0, is the mtime of every file in the package
	// (reproducible builds); otherwise SOURCE_DATE_EPOCH from the
	// environment, otherwise the time of the build.
	SourceDateEpoch int64
	// Arches defaults to all of Arches.
	Arches []Arch
	// Go is the go command; "go" by default.
	Go string
	// Output receives nfpm's output; nil discards it.
	Output io.Writer
}

// DebFileName is the conventional name of the package file.
func DebFileName(debVersion string, a Arch) string {
	return fmt.Sprintf("edgeagent_%s_%s.deb", debVersion, a.Deb)
}

// BuildDebs builds one .deb per architecture with `go tool nfpm` (pinned in
// go.mod) and returns their paths, in the order of o.Arches.
func BuildDebs(ctx context.Context, o DebOptions) ([]string, error) {
	version, err := DebianVersion(o.Version)
	if err != nil {
		return nil, err
	}
	if o.Go == "" {
		o.Go = "go"
	}
	if o.Output == nil {
		o.Output = io.Discard
	}
	if len(o.Arches) == 0 {
		o.Arches = Arches
	}
	repo, err := filepath.Abs(o.RepoDir)
	if err != nil {
		return nil, fmt.Errorf("resolve repository dir: %w", err)
	}
	dist, err := filepath.Abs(o.DistDir)
	if err != nil {
		return nil, fmt.Errorf("resolve dist dir: %w", err)
	}
	for _, a := range o.Arches {
		bin := filepath.Join(dist, a.BinaryName())
		if _, err := os.Stat(bin); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrMissingBinary, bin, err)
		}
	}
	// nfpm compresses with one core; run as many at once as there are.
	debs := make([]string, len(o.Arches))
	errs := make([]error, len(o.Arches))
	outs := make([]bytes.Buffer, len(o.Arches))
	sem := make(chan struct{}, max(1, runtime.NumCPU()))
	var wg sync.WaitGroup
	for i, a := range o.Arches {
		debs[i] = filepath.Join(dist, DebFileName(version, a))
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			cmd := exec.CommandContext(ctx, o.Go, "tool", "nfpm", "package",
				"--config", NFPMConfig, "--packager", "deb", "--target", debs[i])
			cmd.Dir = repo
			cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
			cmd.Env = append(os.Environ(),
				"EDGEAGENT_BINARY="+filepath.Join(dist, a.BinaryName()),
				"EDGEAGENT_DEB_ARCH="+a.Deb,
				"EDGEAGENT_DEB_VERSION="+version,
			)
			if o.SourceDateEpoch > 0 {
				cmd.Env = append(cmd.Env, "SOURCE_DATE_EPOCH="+strconv.FormatInt(o.SourceDateEpoch, 10))
			}
			if err := cmd.Run(); err != nil {
				errs[i] = fmt.Errorf("nfpm package %s (%s): %w", a.Deb, strings.Join(cmd.Args, " "), err)
			}
		}()
	}
	wg.Wait()
	for i := range outs {
		if _, err := o.Output.Write(outs[i].Bytes()); err != nil {
			return nil, fmt.Errorf("write nfpm output: %w", err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return debs, nil
}
