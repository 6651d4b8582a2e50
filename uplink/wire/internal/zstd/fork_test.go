package zstd_test

import (
	"bytes"
	"flag"
	"fmt"
	"go/format"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the fork from the klauspost/compress version go.mod requires")

const (
	upstreamModule = "github.com/klauspost/compress"
	forkPath       = "github.com/edgeagent/edgeagent/uplink/wire/internal/zstd"
)

// forkDirs are the upstream directories the fork copies, and where they go.
// The decoder stays in: one package reads and writes, as before the fork.
var forkDirs = []struct{ from, to string }{
	{"zstd", "."},
	{"zstd/internal/xxhash", "internal/xxhash"},
	{"internal/le", "internal/le"},
	{"internal/regmask", "internal/regmask"},
	{"internal/cpuinfo", "internal/cpuinfo"},
}

// forkPatches are the fork's only changes besides import paths: file, the
// upstream text (which must occur exactly once) and its replacement.
var forkPatches = []struct{ file, from, to string }{{
	// 2^19 entries of 8 bytes are 4 MiB of heap, the agent's largest single
	// allocation, for a window of 256 KiB: 2^16 hold every position of a
	// 500-aggregate batch (about 100 KB). Measured on the rig's steady data
	// (BenchmarkWireSize): 23.76 bytes an aggregate against 23.74.
	"enc_better.go",
	"betterLongTableBits = 19 ",
	"betterLongTableBits = 16 ",
}, {
	// The agent encodes at SpeedBetterCompression without a dictionary
	// (uplink/wire): the other levels' encoders, which the level switch
	// keeps in the binary, were 25 KB of the arm64 budget's text.
	"encoder_options.go",
	`	switch o.level {
	case SpeedFastest:
		if o.dict != nil {
			return &fastEncoderDict{fastEncoder: fastEncoder{fastBase: fastBase{maxMatchOff: int32(o.windowSize), bufferReset: math.MaxInt32 - int32(o.windowSize*2), lowMem: o.lowMem}}}
		}
		return &fastEncoder{fastBase: fastBase{maxMatchOff: int32(o.windowSize), bufferReset: math.MaxInt32 - int32(o.windowSize*2), lowMem: o.lowMem}}

	case SpeedDefault:
		if o.dict != nil {
			return &doubleFastEncoderDict{fastEncoderDict: fastEncoderDict{fastEncoder: fastEncoder{fastBase: fastBase{maxMatchOff: int32(o.windowSize), bufferReset: math.MaxInt32 - int32(o.windowSize*2), lowMem: o.lowMem}}}}
		}
		return &doubleFastEncoder{fastEncoder: fastEncoder{fastBase: fastBase{maxMatchOff: int32(o.windowSize), bufferReset: math.MaxInt32 - int32(o.windowSize*2), lowMem: o.lowMem}}}
	case SpeedBetterCompression:
		if o.dict != nil {
			return &betterFastEncoderDict{betterFastEncoder: betterFastEncoder{fastBase: fastBase{maxMatchOff: int32(o.windowSize), bufferReset: math.MaxInt32 - int32(o.windowSize*2), lowMem: o.lowMem}}}
		}
		return &betterFastEncoder{fastBase: fastBase{maxMatchOff: int32(o.windowSize), bufferReset: math.MaxInt32 - int32(o.windowSize*2), lowMem: o.lowMem}}
	case SpeedBestCompression:
		return &bestFastEncoder{fastBase: fastBase{maxMatchOff: int32(o.windowSize), bufferReset: math.MaxInt32 - int32(o.windowSize*2), lowMem: o.lowMem}}
	}
	panic("unknown compression level")`,
	`	if o.level == SpeedBetterCompression && o.dict == nil {
		return &betterFastEncoder{fastBase: fastBase{maxMatchOff: int32(o.windowSize), bufferReset: math.MaxInt32 - int32(o.windowSize*2), lowMem: o.lowMem}}
	}
	panic("this fork encodes at SpeedBetterCompression without a dictionary only")`,
}}

// forkFiles are files of the fork's own, not derived from upstream.
var forkFiles = []string{"doc.go", "fork_test.go", "conformance_test.go", "LICENSE"}

// skipUpstream reports whether an upstream file stays out of the fork:
// tests, docs, and the Snappy converter, whose reference decoder is another
// internal package the agent does not need. Licences stay in.
func skipUpstream(name string) bool {
	if strings.HasSuffix(name, "_test.go") || name == "snappy.go" {
		return true
	}
	return !strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, ".s") && !strings.HasPrefix(name, "LICENSE")
}

// rewriteImports points upstream's internal packages at the fork's copies,
// and formats Go files again: the new paths sort differently among imports.
func rewriteImports(t *testing.T, name string, src []byte) []byte {
	src = bytes.ReplaceAll(src, []byte(`"`+upstreamModule+`/zstd/internal/`), []byte(`"`+forkPath+`/internal/`))
	src = bytes.ReplaceAll(src, []byte(`"`+upstreamModule+`/internal/`), []byte(`"`+forkPath+`/internal/`))
	if !strings.HasSuffix(name, ".go") {
		return src
	}
	formatted, err := format.Source(src)
	if err != nil {
		t.Fatalf("formatting %s: %v", name, err)
	}
	return formatted
}

// TestForkIsUpstreamWithItsPatch derives every file of the fork from the
// module cache and compares: the fork must be upstream, its imports moved
// and forkPatches applied, nothing else. To move to a new klauspost/compress
// release, bump go.mod, then run this test with -update and read the diff.
func TestForkIsUpstreamWithItsPatch(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", upstreamModule).Output()
	if err != nil {
		t.Fatalf("locating %s in the module cache: %v", upstreamModule, err)
	}
	upstream := strings.TrimSpace(string(out))
	if upstream == "" {
		t.Fatalf("%s has no directory in the module cache (run go mod download)", upstreamModule)
	}
	want := map[string][]byte{}
	for _, d := range forkDirs {
		entries, err := os.ReadDir(filepath.Join(upstream, d.from))
		if err != nil {
			t.Fatalf("reading upstream: %v", err)
		}
		for _, e := range entries {
			if e.IsDir() || skipUpstream(e.Name()) {
				continue
			}
			src, err := os.ReadFile(filepath.Join(upstream, d.from, e.Name()))
			if err != nil {
				t.Fatalf("reading upstream: %v", err)
			}
			want[filepath.Join(d.to, e.Name())] = rewriteImports(t, e.Name(), src)
		}
	}
	for _, p := range forkPatches {
		src, ok := want[p.file]
		if !ok {
			t.Fatalf("patch target %s is not in upstream any more", p.file)
		}
		if n := bytes.Count(src, []byte(p.from)); n != 1 {
			t.Fatalf("patch for %s: upstream has %q %d times, want once; review the patch against the new release", p.file, p.from, n)
		}
		want[p.file] = bytes.Replace(src, []byte(p.from), []byte(p.to), 1)
	}
	licence, err := os.ReadFile(filepath.Join(upstream, "LICENSE"))
	if err != nil {
		t.Fatalf("reading upstream licence: %v", err)
	}
	want["LICENSE"] = licence

	if *update {
		writeFork(t, want)
	}

	have := map[string]bool{}
	err = filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		have[path] = true
		return nil
	})
	if err != nil {
		t.Fatalf("listing the fork: %v", err)
	}
	for name, src := range want {
		got, err := os.ReadFile(name)
		if err != nil {
			t.Errorf("fork lacks %s (run with -update): %v", name, err)
			continue
		}
		if !bytes.Equal(got, src) {
			t.Errorf("%s differs from upstream with the fork's patch (run with -update, or put the change in forkPatches)", name)
		}
	}
	for name := range have {
		if _, ok := want[name]; !ok && !slices.Contains(forkFiles, name) {
			t.Errorf("%s is in the fork but not derived from upstream nor listed in forkFiles", name)
		}
	}
}

func writeFork(t *testing.T, want map[string][]byte) {
	for name, src := range want {
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(name, src, 0o644); err != nil {
			t.Fatal(fmt.Errorf("writing the fork: %w", err))
		}
	}
}
