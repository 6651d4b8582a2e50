package scenario

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestStockScenariosAreValid(t *testing.T) {
	names := Names()
	for _, want := range []string{"steady", "offline-backlog", "duplicates", "late-data", "bad-input", "link-outage", "crash", "chaos"} {
		if !contains(names, want) {
			t.Errorf("stock scenario %s missing (have %v)", want, names)
		}
	}
	for _, n := range names {
		sc, err := Lookup(n)
		if err != nil {
			t.Errorf("%s: %v", n, err)
			continue
		}
		if sc.Name != n {
			t.Errorf("%s: name %q differs from the file name", n, sc.Name)
		}
		short := sc.WithShort()
		if err := short.Validate(); err != nil {
			t.Errorf("%s --short: %v", n, err)
		}
		if short.Duration > sc.Duration || short.DeviceCount() > sc.DeviceCount() {
			t.Errorf("%s: short version is not shorter (%v, %d devices)", n, short.Duration, short.DeviceCount())
		}
	}
}

// The chaos scenario must hold every misbehaviour and every fault kind.
func TestChaosHasEverything(t *testing.T) {
	sc, err := Lookup("chaos")
	if err != nil {
		t.Fatal(err)
	}
	m := sc.Misbehaviour
	if m.Offline == nil || m.Pause == nil || m.Duplicates == nil || m.OutOfOrder == nil || m.ClockSkew == nil ||
		m.Late == nil || m.Malformed == nil || m.SchemaChange == nil || m.Bursts == nil {
		t.Errorf("chaos lacks a misbehaviour: %+v", m)
	}
	kinds := map[string]bool{}
	for _, f := range sc.Faults {
		kinds[f.Kind] = true
	}
	for _, k := range FaultKinds {
		if k != FaultAgentRestart && !kinds[k] {
			t.Errorf("chaos lacks fault %s", k)
		}
	}
}

func TestParseDefaultsAndUnits(t *testing.T) {
	sc, err := Parse("t", []byte(`
name: t
duration: 10s
devices:
  - {prefix: a, count: 2, format: json, interval: 5s, metrics: [x]}
misbehaviour:
  duplicates: {readings: 5%}
  clock_skew: {devices: 0.5}
  offline: {devices: 10%, min: 1m, max: 2m, within: [1s, 50%]}
faults:
  - {at: 50%, kind: uplink_cut, for: 2s}
  - {at: 3s, kind: nats_restart}
agent:
  max_payload_bytes: 4KiB
  window: {size: 30s}
`))
	if err != nil {
		t.Fatal(err)
	}
	if sc.Misbehaviour.Duplicates.Readings != 0.05 || sc.Misbehaviour.ClockSkew.Devices != 0.5 {
		t.Errorf("fractions: %v %v", sc.Misbehaviour.Duplicates.Readings, sc.Misbehaviour.ClockSkew.Devices)
	}
	if got := sc.Faults[0].At.Resolve(sc.Duration); got != 5*time.Second {
		t.Errorf("50%% of 10s resolved to %v", got)
	}
	if got := sc.Faults[1].At.Resolve(sc.Duration); got != 3*time.Second {
		t.Errorf("3s resolved to %v", got)
	}
	if wi := sc.Misbehaviour.Offline.Within; wi == nil || wi[0].Resolve(sc.Duration) != time.Second || wi[1].Resolve(sc.Duration) != 5*time.Second {
		t.Errorf("offline.within: %+v", wi)
	}
	if sc.Agent.MaxPayloadBytes != 4096 {
		t.Errorf("max_payload_bytes %d", sc.Agent.MaxPayloadBytes)
	}
	w := sc.Agent.Window
	if w.Slide != 30*time.Second || w.WatermarkDelay != DefaultWatermarkDelay || w.IdleTimeout != DefaultIdleTimeout || len(w.Aggregates) != 7 {
		t.Errorf("window defaults not applied: %+v", w)
	}
	if sc.Misbehaviour.Duplicates.MaxGap != 3 || len(sc.Misbehaviour.ClockSkew.Kinds) != 6 {
		t.Errorf("misbehaviour defaults not applied")
	}
	if sc.AtLeastOnce() {
		t.Error("uplink faults alone do not make delivery at-least-once")
	}
}

func TestParseRejects(t *testing.T) {
	base := "name: t\nduration: 10s\ndevices:\n  - {prefix: a, count: 1, format: json, interval: 5s, metrics: [x]}\n"
	cases := []struct {
		name, yaml, want string
	}{
		{"unknown key", base + "speeed: 3\n", "speeed"},
		{"bad format", strings.Replace(base, "json", "xml", 1), "format"},
		{"metric named ts", strings.Replace(base, "[x]", "[ts]", 1), "metrics"},
		{"fault kind", base + "faults:\n  - {at: 10%, kind: meteor}\n", "meteor"},
		{"fault after the end", base + "faults:\n  - {at: 20s, kind: uplink_cut}\n", "faults[0].at"},
		{"fraction over 1", base + "misbehaviour:\n  duplicates: {readings: 150%}\n", "duplicates.readings"},
		{"slide not dividing size", base + "agent:\n  window: {size: 1m, slide: 25s}\n", "slide"},
		{"pause shorter than idle", base + "misbehaviour:\n  pause: {devices: 10%, at: 10%, for: 1s}\n", "pause.for"},
		{"bad at", base + "faults:\n  - {at: soon, kind: uplink_cut}\n", "soon"},
		{"no devices", "name: t\nduration: 10s\n", "devices"},
		{"offline within past the end", base + "misbehaviour:\n  offline: {devices: 10%, min: 1m, max: 2m, within: [5s, 20s]}\n", "offline.within"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(c.yaml))
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not name %q", err, c.want)
			}
		})
	}
}

func TestLookupUnknown(t *testing.T) {
	_, err := Lookup("no-such-scenario")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "steady") {
		t.Fatalf("err = %v, want ErrNotFound listing the stock scenarios", err)
	}
}

// TestInvalidFiles parses each file of testdata/invalid: every problem it
// holds must be refused with ErrInvalid, and each "# want:" comment must be
// the end of a "FILE:LINE: key: message" prefix of an error line.
func TestInvalidFiles(t *testing.T) {
	files, err := filepath.Glob("testdata/invalid/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files: %v", err)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var wants []string
			for _, line := range strings.Split(string(data), "\n") {
				if w, ok := strings.CutPrefix(line, "# want: "); ok {
					wants = append(wants, path+w)
				}
			}
			if len(wants) == 0 {
				t.Fatal("no # want: line")
			}
			_, err = Load(path)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			var errs *Errors
			if !errors.As(err, &errs) {
				t.Fatalf("err is %T, want *Errors", err)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(wants) {
				t.Errorf("%d problems, want %d:\n%v", len(lines), len(wants), err)
			}
			for _, w := range wants {
				found := false
				for _, l := range lines {
					found = found || strings.HasPrefix(l, w)
				}
				if !found {
					t.Errorf("no error line starts with\n  %s\ngot:\n%v", w, err)
				}
			}
		})
	}
}

// TestFaultOverlap: faults on one component must be FaultGap apart;
// faults on different components may overlap.
func TestFaultOverlap(t *testing.T) {
	base := "name: t\nduration: 10s\ndevices:\n  - {prefix: a, count: 1, format: json, interval: 5s, metrics: [x]}\nfaults:\n"
	cases := []struct {
		faults string
		ok     bool
	}{
		{"  - {at: 1s, kind: agent_kill, for: 1s}\n  - {at: 3s, kind: agent_kill, for: 1s}\n", true},
		{"  - {at: 1s, kind: agent_kill, for: 1s}\n  - {at: 2500ms, kind: agent_restart, for: 1s}\n", false},
		{"  - {at: 5s, kind: agent_kill, for: 0s}\n  - {at: 5s, kind: agent_kill, for: 0s}\n", false},
		{"  - {at: 4s, kind: agent_kill, for: 3s}\n  - {at: 1s, kind: agent_kill, for: 1s}\n", true},
		{"  - {at: 1s, kind: agent_kill, for: 3s}\n  - {at: 2s, kind: broker_restart, for: 1s}\n  - {at: 2s, kind: uplink_cut, for: 3s}\n", true},
		{"  - {at: 1s, kind: uplink_cut, for: 3s}\n  - {at: 2s, kind: uplink_drop_acks, for: 1s}\n", false},
	}
	for _, c := range cases {
		_, err := Parse("t.yaml", []byte(base+c.faults))
		if (err == nil) != c.ok {
			t.Errorf("faults\n%s: err = %v, want ok %v", c.faults, err, c.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "must not overlap") {
			t.Errorf("unexpected error %v", err)
		}
	}
}
