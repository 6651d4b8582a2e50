// Package secret masks credentials for output: every place that shows or
// logs a broker or server URL (the effective config, the status page and
// JSON, /readyz, logs, errors that reach last_error) goes through URL, so
// a password written in a URL never leaves the config file.
package secret

import (
	"net/url"
	"strings"
)

// Mask replaces a secret in output.
const Mask = "***"

// URL masks the password in a URL. With userIsToken (NATS) s may be a
// comma-separated list of URLs, and a user name without a password is a
// token, masked too; other URLs are one URL, whose password may hold a
// comma. A URL that does not parse is masked up to its last '@' rather
// than risk printing a password.
func URL(s string, userIsToken bool) string {
	if !strings.Contains(s, "@") {
		return s
	}
	parts := []string{s}
	if userIsToken {
		parts = strings.Split(s, ",")
	}
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err == nil && strings.Contains(u.Path+u.RawQuery+u.Fragment, "@") {
			// A password with an unencoded @, / or # moves the host past
			// it: the URL parses, its user info does not hold all of it.
			err = url.EscapeError("@")
		}
		if err != nil || u.User == nil {
			if err != nil {
				if j := strings.LastIndex(p, "@"); j >= 0 {
					parts[i] = Mask + p[j:]
				}
			}
			continue
		}
		userinfo := u.User.String()
		if _, hasPw := u.User.Password(); hasPw {
			userinfo = url.User(u.User.Username()).String() + ":" + Mask
		} else if userIsToken {
			userinfo = Mask
		}
		// Built by hand: url.URL.String would escape the mask to %2A%2A%2A.
		u.User = nil
		rest := strings.TrimPrefix(strings.TrimPrefix(u.String(), u.Scheme+":"), "//")
		parts[i] = u.Scheme + "://" + userinfo + "@" + rest
	}
	return strings.Join(parts, ",")
}
