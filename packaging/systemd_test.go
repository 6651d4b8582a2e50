package packaging

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// unitFile is a parsed systemd unit: section → key → values in order.
type unitFile map[string]map[string][]string

func parseUnit(t *testing.T, path string) unitFile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unitFile{}
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not a key=value line in a section: %q", path, n, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}

// TestSystemdUnit checks the settings the agent's operation depends on:
// the paths the package installs, no ExecStartPre (the config check is
// run's own, so RestartPreventExitStatus sees its exit 3), reload by SIGHUP, a stop timeout above the agent's own 15 s
// drain, restart limits, the memory budget and the hardening.
func TestSystemdUnit(t *testing.T) {
	u := parseUnit(t, filepath.Join(repoRoot(t), "packaging", "edgeagent.service"))
	want := map[string]map[string]string{
		"Unit": {
			"StartLimitIntervalSec": "10min",
			"StartLimitBurst":       "10",
		},
		"Service": {
			"User":                     "edgeagent",
			"Group":                    "edgeagent",
			"EnvironmentFile":          "-/etc/default/edgeagent",
			"ExecStart":                "/usr/bin/edgeagent run -c /etc/edgeagent/config.yaml",
			"Restart":                  "on-failure",
			"RestartPreventExitStatus": "3",
			"StateDirectory":           "edgeagent",
			"UMask":                    "0027",
			"MemoryHigh":               "96M",
			"MemoryMax":                "128M",
			"NoNewPrivileges":          "yes",
			"CapabilityBoundingSet":    "",
			"ProtectSystem":            "strict",
			"ProtectHome":              "yes",
			"PrivateTmp":               "yes",
			"PrivateDevices":           "yes",
			"ProtectKernelTunables":    "yes",
			"ProtectKernelModules":     "yes",
			"ProtectKernelLogs":        "yes",
			"ProtectControlGroups":     "yes",
			"RestrictAddressFamilies":  "AF_INET AF_INET6 AF_UNIX",
			"RestrictNamespaces":       "yes",
			"LockPersonality":          "yes",
			"MemoryDenyWriteExecute":   "yes",
		},
		"Install": {
			"WantedBy": "multi-user.target",
		},
	}
	for section, keys := range want {
		for k, v := range keys {
			got, ok := u[section][k]
			if !ok {
				t.Errorf("[%s] has no %s=", section, k)
				continue
			}
			if got[0] != v {
				t.Errorf("[%s] %s=%s, want %s", section, k, got[0], v)
			}
		}
	}
	if sc := u["Service"]["SystemCallFilter"]; len(sc) == 0 || sc[0] != "@system-service" {
		t.Errorf("SystemCallFilter=%v, want @system-service first", sc)
	}
	if _, ok := u["Service"]["ExecStartPre"]; ok {
		t.Errorf("ExecStartPre is set: systemd restarts a unit whose ExecStartPre fails whatever RestartPreventExitStatus says (systemd#11868); run checks the config itself")
	}
	if r := u["Service"]["ExecReload"]; len(r) != 1 || r[0] != "/bin/kill -HUP $MAINPID" {
		t.Errorf("ExecReload=%v, want /bin/kill -HUP $MAINPID (the agent reads its config again on SIGHUP)", r)
	}
	stop, err := time.ParseDuration(u["Service"]["TimeoutStopSec"][0])
	if err != nil || stop < 20*time.Second {
		t.Errorf("TimeoutStopSec=%v (%v): must leave the agent's 15s drain room to finish", u["Service"]["TimeoutStopSec"], err)
	}
}

// TestSystemdAnalyzeSecurity scores the unit with systemd's own exposure
// analysis; docs/install.md reports the figure.
func TestSystemdAnalyzeSecurity(t *testing.T) {
	sa := need(t, "systemd-analyze", "systemd")
	unit := filepath.Join(repoRoot(t), "packaging", "edgeagent.service")
	out, err := exec.Command(sa, "security", "--offline=true", "--no-pager", unit).CombinedOutput()
	if err != nil && strings.Contains(string(out), "offline") {
		t.Skipf("this systemd-analyze has no --offline (systemd < 250): %s", out)
	}
	if err != nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`Overall exposure level for edgeagent\.service: ([0-9.]+) (\S+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no overall exposure level in:\n%s", out)
	}
	level, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("systemd-analyze security: exposure %.1f %s", level, m[2])
	// 10 is fully exposed; systemd calls below 2 "OK" at worst.
	if level >= 2.0 {
		t.Errorf("exposure level %.1f, want below 2.0:\n%s", level, out)
	}
}
