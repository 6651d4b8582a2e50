package config

import "testing"

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"abc", "", 3},
		{"", "abc", 3},
		{"qos", "qos", 0},
		{"qso", "qos", 1}, // swap
		{"keepalive", "keep_alive", 1},
		{"bronze_retension", "bronze_retention", 1},
		{"kitten", "sitting", 3},
		{"ca", "abc", 3}, // optimal string alignment, not full Damerau
		{"日本語", "日本", 1},
	} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
		if got := editDistance(tc.b, tc.a); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d (symmetry)", tc.b, tc.a, got, tc.want)
		}
	}
}

func TestSuggest(t *testing.T) {
	keys := []string{"broker", "embedded", "client_id", "username", "password", "tls", "keep_alive", "subscriptions"}
	for _, tc := range []struct{ in, want string }{
		{"brokr", "broker"},
		{"Broker", "broker"},
		{"keep-alive", "keep_alive"},
		{"keepalive", "keep_alive"},
		{"KEEP_ALIVE", "keep_alive"},
		{"subscription", "subscriptions"},
		{"clientid", "client_id"},
		{"tsl", "tls"},
		{"user", ""}, // 4 edits from username: too far
		{"ssl", ""},  // short keys need a near-exact match
		{"x", ""},
		{"certificate", ""},
	} {
		if got := suggest(tc.in, keys); got != tc.want {
			t.Errorf("suggest(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
