package packaging

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// debFile is what the package must install: path, mode and owner as
// `dpkg-deb --contents` prints them, and where it comes from in the tree
// ("" for the binary, checked against the cross build).
type debFile struct {
	path, mode, owner, source string
}

var wantDebFiles = []debFile{
	{"./usr/bin/edgeagent", "-rwxr-xr-x", "root/root", ""},
	// Group edgeagent comes from postinst: the group does not exist yet
	// when dpkg unpacks.
	{"./etc/edgeagent/config.yaml", "-rw-r-----", "root/root", "config/example.yaml"},
	{"./etc/default/edgeagent", "-rw-------", "root/root", "packaging/default.env"},
	{"./usr/lib/systemd/system/edgeagent.service", "-rw-r--r--", "root/root", "packaging/edgeagent.service"},
	{"./usr/share/doc/edgeagent/mosquitto-edgeagent.conf", "-rw-r--r--", "root/root", "packaging/mosquitto-edgeagent.conf"},
	{"./usr/share/doc/edgeagent/install.md", "-rw-r--r--", "root/root", "docs/install.md"},
	{"./usr/share/doc/edgeagent/config.md", "-rw-r--r--", "root/root", "docs/config.md"},
	{"./usr/share/doc/edgeagent/operations.md", "-rw-r--r--", "root/root", "docs/operations.md"},
	{"./usr/share/doc/edgeagent/windows.md", "-rw-r--r--", "root/root", "docs/windows.md"},
	{"./usr/share/doc/edgeagent/alerts.md", "-rw-r--r--", "root/root", "docs/alerts.md"},
	{"./usr/share/doc/edgeagent/uplink.md", "-rw-r--r--", "root/root", "docs/uplink.md"},
	{"./usr/share/doc/edgeagent/wire-format.md", "-rw-r--r--", "root/root", "docs/wire-format.md"},
	{"./usr/share/doc/edgeagent/performance.md", "-rw-r--r--", "root/root", "docs/performance.md"},
}

// TestDebPackages inspects every .deb the way dpkg sees it: control
// fields, the files with their modes and owners (and nothing else), the
// conffiles, the maintainer scripts, and that the payload is byte for byte
// the cross-built binary and the files in the tree.
func TestDebPackages(t *testing.T) {
	dpkgDeb := need(t, "dpkg-deb", "dpkg")
	debs := debPackages(t)
	bins := crossBinaries(t)
	root := repoRoot(t)
	wantVersion, err := DebianVersion(testVersion)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range Arches {
		t.Run(a.Deb, func(t *testing.T) {
			deb := debs[a.Deb]
			if got, want := filepath.Base(deb), DebFileName(wantVersion, a); got != want {
				t.Errorf("package file %s, want %s", got, want)
			}

			fields := map[string]string{
				"Package":      "edgeagent",
				"Version":      wantVersion,
				"Architecture": a.Deb,
				"Depends":      "adduser | passwd",
				"Section":      "net",
			}
			for field, want := range fields {
				got := strings.TrimSpace(run(t, "", dpkgDeb, "--field", deb, field))
				if got != want {
					t.Errorf("control field %s = %q, want %q", field, got, want)
				}
			}

			// Every regular file, with its mode and owner.
			got := map[string]debFile{}
			for _, line := range strings.Split(strings.TrimSpace(run(t, "", dpkgDeb, "--contents", deb)), "\n") {
				f := strings.Fields(line)
				if len(f) < 6 {
					t.Fatalf("unexpected dpkg-deb --contents line %q", line)
				}
				if strings.HasPrefix(f[0], "d") {
					if f[0] != "drwxr-xr-x" || f[1] != "root/root" {
						t.Errorf("directory %s is %s %s, want drwxr-xr-x root/root", f[5], f[0], f[1])
					}
					continue
				}
				got[f[5]] = debFile{path: f[5], mode: f[0], owner: f[1]}
			}
			for _, w := range wantDebFiles {
				g, ok := got[w.path]
				if !ok {
					t.Errorf("package lacks %s", w.path)
					continue
				}
				if g.mode != w.mode || g.owner != w.owner {
					t.Errorf("%s is %s %s, want %s %s", w.path, g.mode, g.owner, w.mode, w.owner)
				}
				delete(got, w.path)
			}
			for p := range got {
				t.Errorf("package holds unexpected file %s", p)
			}

			// Control area: conffiles and maintainer scripts.
			ctl := t.TempDir()
			run(t, "", dpkgDeb, "--control", deb, ctl)
			conffiles := strings.Fields(readFile(t, filepath.Join(ctl, "conffiles")))
			sort.Strings(conffiles)
			if want := []string{"/etc/default/edgeagent", "/etc/edgeagent/config.yaml"}; strings.Join(conffiles, " ") != strings.Join(want, " ") {
				t.Errorf("conffiles %v, want %v", conffiles, want)
			}
			for _, script := range []string{"postinst", "prerm", "postrm"} {
				p := filepath.Join(ctl, script)
				st, err := os.Stat(p)
				if err != nil {
					t.Errorf("maintainer script %s: %v", script, err)
					continue
				}
				if st.Mode().Perm() != 0o755 {
					t.Errorf("maintainer script %s has mode %v, want 0755", script, st.Mode().Perm())
				}
				if readFile(t, p) != readFile(t, filepath.Join(root, "packaging", "scripts", script)) {
					t.Errorf("maintainer script %s differs from packaging/scripts/%s", script, script)
				}
				if out, err := exec.Command("sh", "-n", p).CombinedOutput(); err != nil {
					t.Errorf("sh -n %s: %v\n%s", script, err, out)
				}
			}
			for _, script := range []string{"preinst", "config"} {
				if _, err := os.Stat(filepath.Join(ctl, script)); err == nil {
					t.Errorf("unexpected maintainer script %s", script)
				}
			}

			// The payload is what was built and what is in the tree.
			data := t.TempDir()
			run(t, "", dpkgDeb, "--extract", deb, data)
			for _, w := range wantDebFiles {
				src := bins[a.Name]
				if w.source != "" {
					src = filepath.Join(root, w.source)
				}
				if !bytes.Equal(readBytes(t, filepath.Join(data, w.path)), readBytes(t, src)) {
					t.Errorf("%s in the package differs from %s", w.path, src)
				}
			}
		})
	}
}

func readBytes(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func readFile(t testing.TB, path string) string { return string(readBytes(t, path)) }

// scratchRoot is an empty system for dpkg --root: a dpkg database and
// the account files useradd edits.
func scratchRoot(t *testing.T) string {
	t.Helper()
	r := t.TempDir()
	files := map[string]string{
		"var/lib/dpkg/status": "",
		"etc/passwd":          "root:x:0:0:root:/root:/bin/sh\n",
		"etc/group":           "root:x:0:\n",
		"etc/shadow":          "root:*:19000:0:99999:7:::\n",
		"etc/gshadow":         "root:*::\n",
	}
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates", "var/log", "etc"} {
		if err := os.MkdirAll(filepath.Join(r, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(r, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// dpkgRoot runs dpkg on the scratch root. The maintainer scripts run on
// this machine (chrootless: the scratch root has no shell) with DPKG_ROOT
// set, which they honour; --force-depends because the scratch root has no
// adduser or passwd package.
func dpkgRoot(t *testing.T, root string, args ...string) string {
	t.Helper()
	dpkg := need(t, "dpkg", "dpkg")
	base := []string{"--root=" + root, "--force-script-chrootless", "--force-depends", "--log=" + filepath.Join(root, "var/log/dpkg.log")}
	cmd := exec.Command(dpkg, append(base, args...)...)
	out, err := runTimeout(cmd, 2*time.Minute)
	if err != nil {
		t.Fatalf("dpkg %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// account is one line of a scratch root's passwd or group file.
func account(t *testing.T, root, file, name string) []string {
	t.Helper()
	for _, line := range strings.Split(readFile(t, filepath.Join(root, "etc", file)), "\n") {
		if f := strings.Split(line, ":"); f[0] == name {
			return f
		}
	}
	return nil
}

func ownerOf(t *testing.T, path string) (uid, gid int, mode os.FileMode) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	return int(sys.Uid), int(sys.Gid), st.Mode()
}

// TestDebInstallScratchRoot installs the amd64 package with dpkg into a
// scratch root: the maintainer scripts create the system user, hand the
// config to its group and the state directory to it, the installed binary
// accepts the installed config, systemd accepts the installed unit; a
// reinstall (an upgrade) changes nothing; a purge removes it all.
func TestDebInstallScratchRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("dpkg --root needs root to set file owners; run as root (CI does)")
	}
	need(t, "useradd", "passwd")
	host, ok := LookupArch(runtime.GOARCH)
	if !ok {
		t.Skipf("no package for this machine's %s: the scratch-root install runs the installed binary", runtime.GOARCH)
	}
	deb := debPackages(t)[host.Deb]
	root := scratchRoot(t)

	out := dpkgRoot(t, root, "--install", deb)
	if !strings.Contains(out, "systemctl enable --now edgeagent") {
		t.Errorf("first install does not tell how to start the agent:\n%s", out)
	}

	user := account(t, root, "passwd", "edgeagent")
	if user == nil {
		t.Fatalf("postinst created no edgeagent user:\n%s", readFile(t, filepath.Join(root, "etc/passwd")))
	}
	uid, _ := strconv.Atoi(user[2])
	gid, _ := strconv.Atoi(user[3])
	if uid == 0 || uid >= 1000 {
		t.Errorf("edgeagent uid %d is not a system uid (1-999)", uid)
	}
	if user[5] != "/var/lib/edgeagent" || user[6] != "/usr/sbin/nologin" {
		t.Errorf("edgeagent home %q shell %q, want /var/lib/edgeagent and /usr/sbin/nologin", user[5], user[6])
	}
	if g := account(t, root, "group", "edgeagent"); g == nil || g[2] != user[3] {
		t.Errorf("edgeagent group %v does not match the user's gid %s", g, user[3])
	}
	if _, err := os.Stat(filepath.Join(root, "home/edgeagent")); err == nil {
		t.Errorf("postinst created a home directory")
	}

	conf := filepath.Join(root, "etc/edgeagent/config.yaml")
	if u, g, m := ownerOf(t, conf); u != 0 || g != gid || m.Perm() != 0o640 {
		t.Errorf("config.yaml is %d:%d %v, want 0:%d 0640 (root writes, the service reads)", u, g, m.Perm(), gid)
	}
	state := filepath.Join(root, "var/lib/edgeagent")
	if u, g, m := ownerOf(t, state); u != uid || g != gid || !m.IsDir() || m.Perm() != 0o750 {
		t.Errorf("state dir is %d:%d %v, want %d:%d drwxr-x---", u, g, m, uid, gid)
	}
	if _, _, m := ownerOf(t, filepath.Join(root, "etc/default/edgeagent")); m.Perm() != 0o600 {
		t.Errorf("/etc/default/edgeagent mode %v, want 0600", m.Perm())
	}
	status := run(t, "", "dpkg-query", "--admindir="+filepath.Join(root, "var/lib/dpkg"), "--showformat=${db:Status-Status} ${Version}", "--show", "edgeagent")
	if want := "installed " + mustDebianVersion(t, testVersion); status != want {
		t.Errorf("dpkg status %q, want %q", status, want)
	}

	// The installed binary accepts the installed config: the check run
	// makes first on a fresh gateway.
	bin := filepath.Join(root, "usr/bin/edgeagent")
	if out := run(t, "", bin, "config", "check", "-c", conf); !strings.Contains(out, "is valid") {
		t.Errorf("installed config check:\n%s", out)
	}

	// systemd reads the installed unit without a complaint.
	if sa, err := exec.LookPath("systemd-analyze"); err == nil {
		linkSystemdTargets(t, root)
		cmd := exec.Command(sa, "verify", "--root="+root, "edgeagent.service")
		out, err := runTimeout(cmd, time.Minute)
		if err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	} else {
		t.Log("systemd-analyze not installed: unit not verified")
	}

	// A reinstall runs postinst as an upgrade: no second user, same owners,
	// and the local edit of the conffile is kept.
	edited := append(readBytes(t, conf), "\n# edited on site\n"...)
	if err := os.WriteFile(conf, edited, 0o640); err != nil {
		t.Fatal(err)
	}
	if out := dpkgRoot(t, root, "--force-confold", "--install", deb); strings.Contains(out, "systemctl enable --now") {
		t.Errorf("upgrade repeats the first-install hint:\n%s", out)
	}
	if n := strings.Count(readFile(t, filepath.Join(root, "etc/passwd")), "\nedgeagent:"); n != 1 {
		t.Errorf("%d edgeagent users after reinstall, want 1", n)
	}
	if !bytes.Equal(readBytes(t, conf), edited) {
		t.Errorf("reinstall replaced the locally edited config")
	}
	if u, g, m := ownerOf(t, conf); u != 0 || g != gid || m.Perm() != 0o640 {
		t.Errorf("after reinstall config.yaml is %d:%d %v, want 0:%d 0640", u, g, m.Perm(), gid)
	}

	// Purge: files, conffiles, state and enablement go; the user stays.
	wants := filepath.Join(root, "etc/systemd/system/multi-user.target.wants")
	if err := os.MkdirAll(wants, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/usr/lib/systemd/system/edgeagent.service", filepath.Join(wants, "edgeagent.service")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "bronze.db"), []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	dpkgRoot(t, root, "--purge", "edgeagent")
	for _, p := range []string{"usr/bin/edgeagent", "etc/edgeagent", "etc/default/edgeagent", "var/lib/edgeagent",
		"usr/lib/systemd/system/edgeagent.service", "etc/systemd/system/multi-user.target.wants/edgeagent.service"} {
		if _, err := os.Lstat(filepath.Join(root, p)); err == nil {
			t.Errorf("/%s is still there after purge", p)
		}
	}
	if account(t, root, "passwd", "edgeagent") == nil {
		t.Errorf("purge removed the edgeagent user (Debian keeps system users)")
	}
}

func mustDebianVersion(t *testing.T, describe string) string {
	t.Helper()
	v, err := DebianVersion(describe)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// linkSystemdTargets gives the scratch root the host's targets and slices,
// which the unit's default dependencies name, so `systemd-analyze verify
// --root` can load it.
func linkSystemdTargets(t *testing.T, root string) {
	t.Helper()
	// ExecReload runs /bin/kill, which every Debian system has (procps,
	// priority important) and a scratch root does not.
	if kill, err := exec.LookPath("kill"); err == nil && !strings.HasPrefix(kill, root) {
		dst := filepath.Join(root, "bin/kill")
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(dst); err != nil {
			if err := os.WriteFile(dst, readBytes(t, kill), 0o755); err != nil {
				t.Fatal(fmt.Errorf("copy %s: %w", kill, err))
			}
		}
	}
	for _, dir := range []string{"/usr/lib/systemd/system", "/lib/systemd/system"} {
		matches, _ := filepath.Glob(filepath.Join(dir, "*.target"))
		slices, _ := filepath.Glob(filepath.Join(dir, "*.slice"))
		for _, m := range append(matches, slices...) {
			dst := filepath.Join(root, "usr/lib/systemd/system", filepath.Base(m))
			if _, err := os.Lstat(dst); err == nil {
				continue
			}
			if err := os.WriteFile(dst, readBytes(t, m), 0o644); err != nil {
				t.Fatal(fmt.Errorf("copy %s: %w", m, err))
			}
		}
		if len(matches) > 0 {
			return
		}
	}
}

// TestDebInstallExistingGroup: a leftover edgeagent group (a user removed
// by hand) is reused, not a reason for postinst to fail.
func TestDebInstallExistingGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("dpkg --root needs root to set file owners; run as root (CI does)")
	}
	need(t, "useradd", "passwd")
	host, ok := LookupArch(runtime.GOARCH)
	if !ok {
		t.Skipf("no package for this machine's %s", runtime.GOARCH)
	}
	deb := debPackages(t)[host.Deb]
	root := scratchRoot(t)
	group := filepath.Join(root, "etc/group")
	if err := os.WriteFile(group, []byte("root:x:0:\nedgeagent:x:777:\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dpkgRoot(t, root, "--install", deb)
	user := account(t, root, "passwd", "edgeagent")
	if user == nil || user[3] != "777" {
		t.Fatalf("edgeagent user %v, want one in the existing group 777", user)
	}
	if n := strings.Count(readFile(t, group), "\nedgeagent:"); n != 1 {
		t.Errorf("%d edgeagent groups, want 1:\n%s", n, readFile(t, group))
	}
	if _, g, _ := ownerOf(t, filepath.Join(root, "etc/edgeagent/config.yaml")); g != 777 {
		t.Errorf("config.yaml group %d, want 777", g)
	}
}

func TestBuildDebsMissingBinary(t *testing.T) {
	dist := t.TempDir()
	_, err := BuildDebs(t.Context(), DebOptions{RepoDir: "..", DistDir: dist, Version: "v1.0.0"})
	if !errors.Is(err, ErrMissingBinary) {
		t.Fatalf("BuildDebs with an empty dist dir: %v, want ErrMissingBinary", err)
	}
	if !strings.Contains(err.Error(), Arches[0].BinaryName()) {
		t.Errorf("error %q does not name the missing binary", err)
	}
	if _, err := BuildDebs(t.Context(), DebOptions{RepoDir: "..", DistDir: dist, Version: ""}); !errors.Is(err, ErrBadVersion) {
		t.Errorf("BuildDebs with no version: %v, want ErrBadVersion", err)
	}
}

// TestDebReproducible: the same binary, tree and SOURCE_DATE_EPOCH give a
// byte-identical package, so a rebuilt release can be checked against the
// published one.
func TestDebReproducible(t *testing.T) {
	a, _ := LookupArch("arm64")
	first := debPackages(t)[a.Deb]
	dist := t.TempDir()
	if err := os.WriteFile(filepath.Join(dist, a.BinaryName()), readBytes(t, crossBinaries(t)[a.Name]), 0o755); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	again, err := BuildDebs(t.Context(), DebOptions{
		RepoDir: repoRoot(t), DistDir: dist, Version: testVersion,
		SourceDateEpoch: testEpoch, Go: goCmd(), Arches: []Arch{a}, Output: &log,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if !bytes.Equal(readBytes(t, first), readBytes(t, again[0])) {
		t.Errorf("two builds of the %s package differ", a.Deb)
	}
}
