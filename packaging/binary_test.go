package packaging

import (
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/testrig/logbuf"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
)

// TestBinariesStaticForTheirCPU checks every cross-built binary: an ELF
// executable for the target's machine, with no program interpreter and no
// shared libraries (it runs on any gateway whatever its libc), built with
// cgo off, -trimpath, the release build tags and the right GOARM, and
// stripped.
func TestBinariesStaticForTheirCPU(t *testing.T) {
	bins := crossBinaries(t)
	for _, a := range Arches {
		t.Run(a.Name, func(t *testing.T) {
			path := bins[a.Name]
			f, err := elf.Open(path)
			if err != nil {
				t.Fatalf("open ELF %s: %v", path, err)
			}
			defer f.Close()
			if f.Machine != a.Machine {
				t.Errorf("ELF machine %v, want %v", f.Machine, a.Machine)
			}
			if f.Type != elf.ET_EXEC {
				t.Errorf("ELF type %v, want ET_EXEC (a static executable, not PIE)", f.Type)
			}
			wantClass := elf.ELFCLASS64
			if a.GOARCH == "arm" {
				wantClass = elf.ELFCLASS32
			}
			if f.Class != wantClass {
				t.Errorf("ELF class %v, want %v", f.Class, wantClass)
			}
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP {
					t.Errorf("has a PT_INTERP program header: dynamically linked")
				}
				if p.Type == elf.PT_DYNAMIC {
					t.Errorf("has a PT_DYNAMIC program header: dynamically linked")
				}
			}
			if libs, err := f.ImportedLibraries(); err != nil {
				t.Errorf("read imported libraries: %v", err)
			} else if len(libs) > 0 {
				t.Errorf("needs shared libraries %v", libs)
			}
			if s := f.Section(".symtab"); s != nil {
				t.Errorf("has a symbol table: not stripped (-s)")
			}
			if s := f.Section(".debug_info"); s != nil {
				t.Errorf("has DWARF: not stripped (-w)")
			}

			info, err := buildinfo.ReadFile(path)
			if err != nil {
				t.Fatalf("read build info: %v", err)
			}
			settings := map[string]string{}
			for _, s := range info.Settings {
				settings[s.Key] = s.Value
			}
			want := map[string]string{"GOOS": "linux", "GOARCH": a.GOARCH, "CGO_ENABLED": "0", "-trimpath": "true", "-tags": BuildTags}
			if a.GOARM != "" {
				want["GOARM"] = a.GOARM
			}
			for k, v := range want {
				if settings[k] != v {
					t.Errorf("build setting %s = %q, want %q", k, settings[k], v)
				}
			}
			if info.Path != "github.com/edgeagent/edgeagent/cmd/edgeagent" {
				t.Errorf("main package %q, want the edgeagent command", info.Path)
			}
		})
	}
}

// qemu returns the command that runs a's binary on this machine: the
// binary itself on its own CPU, else qemu user-mode emulation; it skips
// when qemu-user-static is not installed.
func qemu(t *testing.T, a Arch, bin string) []string {
	t.Helper()
	if a.GOARCH == runtime.GOARCH && runtime.GOOS == "linux" {
		return []string{bin}
	}
	for _, p := range []string{a.Qemu, "/usr/bin/" + a.Qemu} {
		if path, err := exec.LookPath(p); err == nil {
			// binfmt_misc may not be registered (containers): run the
			// emulator directly.
			return []string{path, bin}
		}
	}
	t.Skipf("%s is not installed: apt-get install qemu-user-static to run the %s binary under emulation", a.Qemu, a.Name)
	return nil
}

// emulated is the command running argv (from qemu) with args.
func emulated(argv []string, args ...string) *exec.Cmd {
	full := append(append([]string(nil), argv...), args...)
	return exec.Command(full[0], full[1:]...)
}

// TestEmulatedVersion runs `edgeagent version` for every target, ARM ones
// under qemu: the stamp from the linker flags and the platform name the
// release artifacts use (linux/armv7, not linux/arm).
func TestEmulatedVersion(t *testing.T) {
	bins := crossBinaries(t)
	for _, a := range Arches {
		t.Run(a.Name, func(t *testing.T) {
			argv := qemu(t, a, bins[a.Name])
			out, err := runTimeout(emulated(argv, "version"), 2*time.Minute)
			if err != nil {
				t.Fatalf("edgeagent version: %v\n%s", err, out)
			}
			want := fmt.Sprintf("edgeagent %s (commit %s, %s, linux/%s)\n", testVersion, testCommit, runtime.Version(), a.Name)
			if string(out) != want {
				t.Errorf("edgeagent version printed\n%q\nwant\n%q", out, want)
			}
		})
	}
}

// TestEmulatedAgent runs the ARM binaries a gateway would run: config check
// on the example config (the check run makes before it starts), the exit code
// for a bad one (what RestartPreventExitStatus relies on), and a short run
// with the built-in broker: QoS 1 readings published, SIGTERM, and the
// readings found in the Bronze log the agent left behind.
func TestEmulatedAgent(t *testing.T) {
	bins := crossBinaries(t)
	root := repoRoot(t)
	for _, name := range []string{"arm64", "armv7"} {
		a, _ := LookupArch(name)
		t.Run(a.Name, func(t *testing.T) {
			argv := qemu(t, a, bins[a.Name])

			example := filepath.Join(root, "config", "example.yaml")
			out, err := runTimeout(emulated(argv, "config", "check", "-c", example), 2*time.Minute)
			if err != nil {
				t.Fatalf("config check %s: %v\n%s", example, err, out)
			}
			if !bytes.Contains(out, []byte(example+" is valid")) {
				t.Errorf("config check output does not say the file is valid:\n%s", out)
			}

			dir := t.TempDir()
			bad := filepath.Join(dir, "bad.yaml")
			if err := os.WriteFile(bad, []byte("gateway_id: gw-01\nmqtt:\n  subscriptions:\n    - topic: \"s/{device}\"\nstorage:\n  bronze_retension: 1h\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err = runTimeout(emulated(argv, "config", "check", "-c", bad), 2*time.Minute)
			if code := exitCode(err); code != 3 {
				t.Errorf("config check of an invalid file exited %d (%v), want 3\n%s", code, err, out)
			}
			if !bytes.Contains(out, []byte("bronze_retension")) {
				t.Errorf("config check does not name the bad key:\n%s", out)
			}

			runAgentEmulated(t, argv, dir)
		})
	}
}

func runAgentEmulated(t *testing.T, argv []string, dir string) {
	t.Helper()
	port := mqtttest.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	dataDir := filepath.Join(dir, "data")
	cfg := filepath.Join(dir, "config.yaml")
	conf := fmt.Sprintf(`gateway_id: qemu-gw
data_dir: %s
mqtt:
  broker: embedded
  embedded:
    listen: %s
  subscriptions:
    - topic: "sensors/{device}/telemetry"
      qos: 1
      format: json
status:
  listen: ""
`, dataDir, addr)
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}

	logs := &logbuf.Buffer{}
	cmd := emulated(argv, "run", "-c", cfg)
	cmd.Stdout, cmd.Stderr = logs, logs
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start agent: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	exited := false
	t.Cleanup(func() {
		if !exited {
			_ = cmd.Process.Kill()
			<-done
		}
	})

	// Wait for the built-in broker to listen, or for the agent to die.
	deadline := time.Now().Add(90 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
		if err == nil {
			c.Close()
			break
		}
		select {
		case err := <-done:
			exited = true
			t.Fatalf("agent exited before listening: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent did not listen on %s within 90s:\n%s", addr, logs.String())
		}
		time.Sleep(50 * time.Millisecond) // polling a port: there is no event to wait on
	}
	t.Logf("emulated agent listening after %v", time.Since(start).Round(time.Millisecond))

	// The built-in broker acknowledges a QoS 1 publish only after the
	// Bronze commit, so each acknowledged reading must be in the file.
	pub := mqtttest.NewPublisher(t, "tcp://"+addr, "qemu-test-device")
	type reading struct{ topic, payload string }
	var sent []reading
	now := time.Now().UnixMilli()
	for i := range 5 {
		r := reading{
			topic:   fmt.Sprintf("sensors/dev-%d/telemetry", i%2),
			payload: fmt.Sprintf(`{"id":"r-%d","ts":%d,"temperature":%.1f}`, i, now+int64(i), 20+float64(i)/2),
		}
		pub.Publish(t, r.topic, 1, []byte(r.payload))
		sent = append(sent, r)
	}
	pub.Client.Disconnect(100)

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case err := <-done:
		exited = true
		if err != nil {
			t.Fatalf("agent exited with %v after SIGTERM, want 0:\n%s", err, logs.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("agent still running 60s after SIGTERM:\n%s", logs.String())
	}
	end := time.Now()

	b, err := buffer.Open(filepath.Join(dataDir, "bronze.db"), buffer.Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("open the Bronze log the agent left: %v", err)
	}
	defer b.Close()
	found := map[reading]buffer.Record{}
	if err := b.Scan(0, func(r buffer.Record) bool {
		if r.Kind == buffer.KindMessage {
			r.Payload = append([]byte(nil), r.Payload...)
			found[reading{r.Topic, string(r.Payload)}] = r
		}
		return true
	}); err != nil {
		t.Fatalf("scan Bronze: %v", err)
	}
	for _, s := range sent {
		r, ok := found[s]
		if !ok {
			t.Errorf("acknowledged reading %s %s is not in Bronze (found %d messages)", s.topic, s.payload, len(found))
			continue
		}
		if r.QoS != 1 {
			t.Errorf("reading %s stored with QoS %d, want 1", s.payload, r.QoS)
		}
		if at := time.Unix(0, r.ReceivedAt); at.Before(start) || at.After(end) {
			t.Errorf("reading %s received at %v, outside the run [%v, %v]", s.payload, at, start, end)
		}
	}
	if len(found) != len(sent) {
		t.Errorf("Bronze holds %d messages, want the %d published", len(found), len(sent))
	}
	if t.Failed() {
		t.Logf("agent log:\n%s", logs.String())
	}
}

// maxARM64Binary is the budget for the stripped arm64 binary (issue #6),
// with everything in: the embedded broker, both uplinks, TLS, the status
// endpoint and the YAML config.
const maxARM64Binary = 10 << 20

// TestBinarySizeBudget keeps the arm64 release binary under its budget. A
// dependency that makes the linker keep far more than it calls (anything
// reaching reflect.Value.MethodByName, such as text/template, keeps every
// exported method in the binary: +2.9 MiB) fails here, not in a release.
func TestBinarySizeBudget(t *testing.T) {
	bins := crossBinaries(t)
	for _, a := range Arches {
		st, err := os.Stat(bins[a.Name])
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d bytes (%.2f MiB)", a.Name, st.Size(), float64(st.Size())/(1<<20))
		if a.Name == "arm64" && st.Size() >= maxARM64Binary {
			t.Errorf("arm64 binary is %d bytes (%.2f MiB), over the %d MiB budget; see docs/performance.md, Binary size",
				st.Size(), float64(st.Size())/(1<<20), maxARM64Binary>>20)
		}
	}
}

// TestMakefileBuildTags: `make cross` builds with BuildTags, the tags the
// tests build and check the binaries with.
func TestMakefileBuildTags(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join(repoRoot(t), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	tags, build := "", ""
	for _, line := range strings.Split(string(mk), "\n") {
		k, v, ok := strings.Cut(line, ":=")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "TAGS":
			tags = strings.TrimSpace(v)
		case "BUILD":
			build = v
		}
	}
	if tags != BuildTags {
		t.Errorf("Makefile TAGS = %q, want packaging.BuildTags %q", tags, BuildTags)
	}
	if !strings.Contains(build, "-tags '$(TAGS)'") {
		t.Errorf("Makefile BUILD does not pass -tags '$(TAGS)': %q", build)
	}
}

// BenchmarkBinarySize reports the size of each release binary in MiB (the
// arm64 target is under 10 MiB) and of its .deb.
func BenchmarkBinarySize(b *testing.B) {
	bins := crossBinaries(b)
	debs := debPackages(b)
	for _, a := range Arches {
		st, err := os.Stat(bins[a.Name])
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(st.Size())/(1<<20), a.Name+"-MiB")
		dst, err := os.Stat(debs[a.Deb])
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(dst.Size())/(1<<20), a.Deb+"-deb-MiB")
	}
	b.ReportMetric(0, "ns/op") // a size report, not a timing
}
