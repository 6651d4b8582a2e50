package packaging

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// ErrBadVersion is returned by DebianVersion for input it cannot turn into
// a Debian version.
var ErrBadVersion = errors.New("packaging: bad version")

var (
	// describeSuffix is what `git describe` appends after a tag:
	// -<commits since the tag>-g<abbreviated hash>.
	describeSuffix = regexp.MustCompile(`^(.+)-([0-9]+)-g([0-9a-f]{4,40})$`)
	// bareHash is what `git describe --always` prints with no tag reachable.
	bareHash = regexp.MustCompile(`^[0-9a-f]{7,40}$`)
	// notDebian is every character an upstream version without a Debian
	// revision may not hold.
	notDebian = regexp.MustCompile(`[^A-Za-z0-9.+~]+`)
	// debianVersion is what DebianVersion promises to return.
	debianVersion = regexp.MustCompile(`^[0-9][A-Za-z0-9.+~]*$`)
)

// DebianVersion turns the output of `git describe --tags --always --dirty`
// into a Debian version that sorts the way the releases do:
//
//	v1.2.3                   → 1.2.3
//	v1.2.3-rc.1              → 1.2.3~rc.1             (before 1.2.3)
//	v1.2.3-4-gabc1234        → 1.2.3+4.gabc1234       (after 1.2.3, before 1.2.4)
//	v1.2.3-dirty             → 1.2.3+0.dirty
//	v1.2.3-4-gabc1234-dirty  → 1.2.3+4.gabc1234.dirty
//	abc1234 (no tag)         → 0.0.0+gabc1234
//	dev                      → 0.0.0+dev
//
// The result has no Debian revision (no "-"), so it may hold only
// letters, digits, '.', '+' and '~', and starts with a digit.
func DebianVersion(describe string) (string, error) {
	s := strings.TrimSpace(describe)
	if s == "" {
		return "", fmt.Errorf("%w: empty", ErrBadVersion)
	}
	var after []string // joined after one "+", in this order
	dirty := false
	if rest, ok := strings.CutSuffix(s, "-dirty"); ok {
		s, dirty = rest, true
		if s == "" {
			return "", fmt.Errorf("%w: %q has no version before -dirty", ErrBadVersion, describe)
		}
	}
	described := false
	if m := describeSuffix.FindStringSubmatch(s); m != nil {
		s, described = m[1], true
		after = append(after, m[2]+".g"+m[3])
	}
	// An all-digit string is more likely a date tag than a hash.
	if bareHash.MatchString(s) && strings.ContainsAny(s, "abcdef") {
		s, after = "0.0.0", append([]string{"g" + s}, after...)
		described = true
	}
	s = strings.TrimPrefix(strings.TrimPrefix(s, "v"), "V")
	if s == "" || s[0] < '0' || s[0] > '9' {
		// Not a version at all ("dev", a branch name): keep it as metadata
		// on a version that sorts before every release.
		after = append([]string{s}, after...)
		s = "0.0.0"
	}
	// Semantic-version build metadata ("+build.5") stays metadata.
	core, meta, hasMeta := strings.Cut(s, "+")
	if hasMeta {
		after = append([]string{meta}, after...)
	}
	// A semantic-version pre-release ("-rc.1") must sort before the release:
	// that is what '~' does in Debian versions.
	if base, pre, ok := strings.Cut(core, "-"); ok {
		core = base + "~" + pre
	}
	if dirty {
		if !described {
			// Zero commits after the tag: sorts after the tag and before
			// the first commit after it (+1.g…).
			after = append(after, "0")
		}
		after = append(after, "dirty")
	}
	v := clean(core)
	if len(after) > 0 {
		parts := make([]string, 0, len(after))
		for _, p := range after {
			if p = clean(strings.ReplaceAll(p, "+", ".")); p != "" {
				parts = append(parts, p)
			}
		}
		if len(parts) > 0 {
			v += "+" + strings.Join(parts, ".")
		}
	}
	if !debianVersion.MatchString(v) {
		return "", fmt.Errorf("%w: %q gives %q", ErrBadVersion, describe, v)
	}
	return v, nil
}

// clean replaces runs of characters a Debian version may not hold with a
// dot, and trims dots at the ends.
func clean(s string) string {
	return strings.Trim(notDebian.ReplaceAllString(s, "."), ".")
}
