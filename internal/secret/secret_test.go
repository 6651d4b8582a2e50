package secret

import "testing"

func TestURL(t *testing.T) {
	for _, tc := range []struct {
		in    string
		token bool
		want  string
	}{
		{"tcp://127.0.0.1:1883", false, "tcp://127.0.0.1:1883"},
		{"tcp://user@h:1", false, "tcp://user@h:1"},
		{"tcp://user@h:1", true, "tcp://***@h:1"},
		{"ssl://us%20er:p%40ss@h:1/path?q=1", false, "ssl://us%20er:***@h:1/path?q=1"},
		{"nats://a:b@h1,nats://c:d@h2", true, "nats://a:***@h1,nats://c:***@h2"},
		{"::bad::pw@host", false, "***@host"},
		{"tcp://user:pa,ss@host:1883", false, "tcp://user:***@host:1883"}, // one URL: the comma is the password's
		{"nats://bob:p@ss/1@127.0.0.1:4222", true, "***@127.0.0.1:4222"},  // unencoded @ and /: the "host" is the password's
		{"nats://bob:p#ss@127.0.0.1:4222", true, "***@127.0.0.1:4222"},
	} {
		if got := URL(tc.in, tc.token); got != tc.want {
			t.Errorf("URL(%q, %v) = %q, want %q", tc.in, tc.token, got, tc.want)
		}
	}
}
