package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeagent/edgeagent/testrig/certtest"
)

func TestStatusTLS(t *testing.T) {
	base := "gateway_id: gw\nmqtt:\n  broker: embedded\n  subscriptions: [{topic: \"a/{device}\"}]\n"
	for _, tc := range []struct{ yaml, want string }{
		{"status:\n  tls:\n    cert_file: /x.crt\n", "config.yaml:6: status.tls.key_file: required with cert_file"},
		{"status:\n  tls:\n    key_file: /x.key\n", "config.yaml:6: status.tls.cert_file: required with key_file"},
		{"status:\n  listen: \"\"\n  tls:\n    cert_file: /x.crt\n    key_file: /x.key\n", "config.yaml:7: status.tls: has no effect: status.listen is empty"},
	} {
		_, err := Parse("config.yaml", []byte(base+tc.yaml), noEnv)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.yaml, err, tc.want)
		}
	}

	// CheckFiles loads the pair: two readable files that are not a
	// certificate and its key are refused with the line.
	dir := t.TempDir()
	crt, key := filepath.Join(dir, "s.crt"), filepath.Join(dir, "s.key")
	for _, f := range []string{crt, key} {
		if err := os.WriteFile(f, []byte("not pem"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c := mustParse(t, base+"status:\n  listen: 0.0.0.0:9464\n  token: t0k\n  tls:\n    cert_file: "+crt+"\n    key_file: "+key+"\n")
	if err := c.CheckFiles(); err == nil || !strings.Contains(err.Error(), "config.yaml:9: status.tls.cert_file: "+crt+" with "+key) {
		t.Errorf("CheckFiles with a pair that does not load = %v", err)
	}
	certtest.WriteSelfSigned(t, crt, key, "gw")
	if err := c.CheckFiles(); err != nil {
		t.Errorf("CheckFiles with a good pair = %v", err)
	}
	if err := os.Remove(key); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckFiles(); err == nil || !strings.Contains(err.Error(), "status.tls.key_file: "+key+": no such file") {
		t.Errorf("CheckFiles with the key missing = %v", err)
	}
}
