package packaging

import (
	"errors"
	"os/exec"
	"testing"
)

func TestDebianVersion(t *testing.T) {
	tests := []struct {
		describe string
		want     string
	}{
		{"v1.2.3", "1.2.3"},
		{"1.2.3", "1.2.3"},
		{"v1.2.3-dirty", "1.2.3+0.dirty"},
		{"v1.2.3-4-gabc1234", "1.2.3+4.gabc1234"},
		{"v1.2.3-4-gabc1234-dirty", "1.2.3+4.gabc1234.dirty"},
		{"v1.2.3-rc.1", "1.2.3~rc.1"},
		{"v1.2.3-rc.1-4-gabc1234", "1.2.3~rc.1+4.gabc1234"},
		{"v1.2.3-beta-2", "1.2.3~beta.2"},
		{"v1.2.3+build.7", "1.2.3+build.7"},
		{"v1.2.3+build.7-4-gabc1234", "1.2.3+build.7.4.gabc1234"},
		{"abc1234", "0.0.0+gabc1234"},
		{"abc1234-dirty", "0.0.0+gabc1234.dirty"},
		{"3860990", "3860990"}, // all digits: a date tag, not a hash
		{"dev", "0.0.0+dev"},
		{"release/2024_01", "0.0.0+release.2024.01"},
		{" v2.0.0\n", "2.0.0"},
	}
	for _, tt := range tests {
		got, err := DebianVersion(tt.describe)
		if err != nil {
			t.Errorf("DebianVersion(%q): %v", tt.describe, err)
			continue
		}
		if got != tt.want {
			t.Errorf("DebianVersion(%q) = %q, want %q", tt.describe, got, tt.want)
		}
	}
	for _, bad := range []string{"", "   ", "-dirty"} {
		if v, err := DebianVersion(bad); !errors.Is(err, ErrBadVersion) {
			t.Errorf("DebianVersion(%q) = %q, %v; want ErrBadVersion", bad, v, err)
		}
	}
}

// TestDebianVersionOrder asks dpkg itself whether the converted versions
// sort the way the releases they come from do.
func TestDebianVersionOrder(t *testing.T) {
	dpkg := need(t, "dpkg", "dpkg")
	// Ascending release order.
	describes := []string{
		"dev",
		"abc1234",
		"v0.9.0",
		"v1.0.0-rc.1",
		"v1.0.0-rc.1-3-gabc1234",
		"v1.0.0-rc.2",
		"v1.0.0",
		"v1.0.0-dirty",
		"v1.0.0-1-gdef5678",
		"v1.0.0-12-g0123abc",
		"v1.0.1-rc.1",
		"v1.0.1",
		"v1.10.0",
	}
	var versions []string
	for _, d := range describes {
		v, err := DebianVersion(d)
		if err != nil {
			t.Fatalf("DebianVersion(%q): %v", d, err)
		}
		versions = append(versions, v)
	}
	for i := 1; i < len(versions); i++ {
		a, b := versions[i-1], versions[i]
		if err := exec.Command(dpkg, "--validate-version", b).Run(); err != nil {
			t.Errorf("dpkg --validate-version %q (from %q): %v", b, describes[i], err)
		}
		if err := exec.Command(dpkg, "--compare-versions", a, "lt", b).Run(); err != nil {
			t.Errorf("dpkg says %q (from %q) is not before %q (from %q)", a, describes[i-1], b, describes[i])
		}
	}
}
