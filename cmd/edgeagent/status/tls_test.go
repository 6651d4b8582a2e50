package status

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/testrig/certtest"
	"github.com/edgeagent/edgeagent/testrig/logbuf"
)

// stamp sets the files' modification time to now+ahead.
func stamp(t *testing.T, ahead time.Duration, files ...string) {
	t.Helper()
	at := time.Now().Add(ahead)
	for _, f := range files {
		if err := os.Chtimes(f, at, at); err != nil {
			t.Fatal(err)
		}
	}
}

// servedCert is the leaf certificate a fresh TLS connection to addr gets.
func servedCert(t *testing.T, addr string) []byte {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) // only reading what is served
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].Raw
}

func TestTLSEndpoint(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "status.crt"), filepath.Join(dir, "status.key")
	first := certtest.WriteSelfSigned(t, certFile, keyFile, "gw-7.example")
	var logs logbuf.Buffer
	src := &fakeSource{snap: sampleSnapshot(), ready: true}
	s := startServer(t, Config{Listen: "127.0.0.1:0", Token: "s3cret", CertFile: certFile, KeyFile: keyFile,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}, src)
	ctx := context.Background()

	// The gateway's own CLI pins the configured certificate: its name
	// (gw-7.example) is not the address it dials.
	pinned, err := PinnedTLS(certFile)
	if err != nil {
		t.Fatal(err)
	}
	if snap, err := NewClient(s.Addr(), "s3cret", pinned).Snapshot(ctx); err != nil || snap.Gateway != "gw-7" {
		t.Fatalf("pinned HTTPS client: %v %+v", err, snap)
	}
	if _, err := NewClient(s.Addr(), "", pinned).Snapshot(ctx); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("HTTPS without the token must still be refused: %v", err)
	}
	// Plain HTTP gets nothing but a refusal.
	if _, err := NewClient(s.Addr(), "s3cret", nil).Snapshot(ctx); err == nil || !strings.Contains(err.Error(), "HTTPS") {
		t.Errorf("plain HTTP against the TLS endpoint: %v", err)
	}
	// A remote client checks the chain and the name: the system roots do
	// not know a self-signed certificate, --ca with it does, for the name
	// it was issued to only.
	if _, err := NewClient(s.Addr(), "s3cret", &tls.Config{}).Snapshot(ctx); err == nil {
		t.Error("a self-signed certificate passed the system roots")
	}
	ca, err := CATLS(certFile)
	if err != nil {
		t.Fatal(err)
	}
	ca.ServerName = "gw-7.example"
	if _, err := NewClient(s.Addr(), "s3cret", ca).Snapshot(ctx); err != nil {
		t.Errorf("--ca with the gateway's certificate: %v", err)
	}
	ca.ServerName = "other.example"
	if _, err := NewClient(s.Addr(), "s3cret", ca).Snapshot(ctx); err == nil {
		t.Error("a certificate for another name passed")
	}

	// Renewal: the next connection gets the new certificate, and a CLI
	// still pinned to the old one refuses the endpoint.
	second := certtest.WriteSelfSigned(t, certFile, keyFile, "gw-7.example")
	stamp(t, time.Minute, certFile, keyFile) // distinct from the first pair's, whatever the filesystem's clock
	if got := servedCert(t, s.Addr()); !bytes.Equal(got, second) || bytes.Equal(got, first) {
		t.Fatal("the renewed certificate is not served")
	}
	if _, err := NewClient(s.Addr(), "s3cret", pinned).Snapshot(ctx); err == nil || !strings.Contains(err.Error(), "not the one in") {
		t.Errorf("a client pinned to the old certificate: %v", err)
	}
	// A pair caught mid-renewal (a new certificate, the old key) does not
	// load: the last good one stays in service, and it is said once.
	other := filepath.Join(dir, "other.key")
	certtest.WriteSelfSigned(t, certFile, other, "gw-7.example")
	stamp(t, 2*time.Minute, certFile)
	for range 2 {
		if got := servedCert(t, s.Addr()); !bytes.Equal(got, second) {
			t.Fatal("a pair that does not load replaced the served certificate")
		}
	}
	if n := strings.Count(logs.String(), "does not load"); n != 1 {
		t.Errorf("the failed reload was logged %d times, want once:\n%s", n, logs.String())
	}
	// Starting on a pair that does not load is refused.
	if _, err := New(Config{Listen: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile}, src); err == nil {
		t.Error("a mismatched certificate and key were accepted at start")
	}
}

func TestPlainHTTPOffLoopbackWarns(t *testing.T) {
	var logs logbuf.Buffer
	cfg := Config{Listen: "0.0.0.0:0", Token: "s3cret", Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	if _, err := New(cfg, &fakeSource{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "clear text") {
		t.Errorf("no warning for a plain HTTP endpoint beyond loopback: %q", logs.String())
	}
}

// A chmod or chown moves no modification time: the stamps still tell the
// change, so a key made readable after a failed reload is loaded.
func TestCertStampsSeeAChmod(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("inode change times are read on Linux only")
	}
	dir := t.TempDir()
	crt, key := filepath.Join(dir, "s.crt"), filepath.Join(dir, "s.key")
	certtest.WriteSelfSigned(t, crt, key, "127.0.0.1")
	r, err := newCertReloader(crt, key, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	before, err := r.stamps()
	if err != nil {
		t.Fatal(err)
	}
	mod := time.Now().Add(-time.Hour)
	if err := os.Chtimes(key, mod, mod); err != nil { // a known mtime, kept across the chmod
		t.Fatal(err)
	}
	mid, err := r.stamps()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(key, 0o640); err != nil {
		t.Fatal(err)
	}
	after, err := r.stamps()
	if err != nil {
		t.Fatal(err)
	}
	if mid == before || after == mid {
		t.Errorf("stamps do not change with a chmod: %+v, %+v, %+v", before, mid, after)
	}
}

// The status warns of a certificate that expires within two weeks (the
// gateway's own CLI pins it and would not notice).
func TestCertExpiryWarning(t *testing.T) {
	dir := t.TempDir()
	crt, key := filepath.Join(dir, "s.crt"), filepath.Join(dir, "s.key")
	certtest.WriteSelfSigned(t, crt, key, "127.0.0.1") // valid for an hour
	s := startServer(t, Config{Listen: "127.0.0.1:0", CertFile: crt, KeyFile: key}, &fakeSource{snap: sampleSnapshot(), ready: true})
	if w := strings.Join(s.Current().Warnings, "\n"); !strings.Contains(w, "TLS certificate ("+crt+") expires on") {
		t.Errorf("no expiry warning: %q", w)
	}
}
