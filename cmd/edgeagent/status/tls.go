package status

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// certReloader serves the certificate of certFile and keyFile, loading the
// pair again at the next handshake after either file changed, so a renewed
// certificate needs no restart. A pair that does not load (a renewal caught
// between writing the certificate and its key) leaves the previous one in
// service and is logged once.
type certReloader struct {
	certFile, keyFile string
	log               *slog.Logger

	mu     sync.Mutex
	loaded fileStamps // of the pair in cert
	failed fileStamps // of the last pair that did not load, logged once
	cert   *tls.Certificate
}

// fileStamp tells a changed file: its modification time and size, and its
// inode and change time, which a chown or chmod (a key made readable to
// the agent after a renewal) or a rename over it move.
type fileStamp struct {
	mod          time.Time
	size         int64
	inode, ctime int64
}

type fileStamps [2]fileStamp

func newCertReloader(certFile, keyFile string, log *slog.Logger) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile, log: log}
	st, err := r.stamps()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("status: load TLS certificate %s with key %s: %w", certFile, keyFile, err)
	}
	r.cert, r.loaded = &cert, st
	if w := r.expiryWarning(time.Now()); w != "" {
		log.Warn("status: " + w)
	}
	return r, nil
}

// expiryWarnBefore is how long before its end a certificate is warned of.
const expiryWarnBefore = 14 * 24 * time.Hour

// expiryWarning says when the certificate in service has expired or
// expires within expiryWarnBefore: clients other than the gateway's own
// CLI (which pins it) then refuse the endpoint.
func (r *certReloader) expiryWarning(now time.Time) string {
	r.mu.Lock()
	cert := r.cert
	r.mu.Unlock()
	leaf := cert.Leaf // set by LoadX509KeyPair since Go 1.23
	if leaf == nil {
		return ""
	}
	switch left := leaf.NotAfter.Sub(now); {
	case left <= 0:
		return fmt.Sprintf("the status endpoint's TLS certificate (%s) expired on %s: remote clients refuse it", r.certFile, leaf.NotAfter.UTC().Format(time.DateOnly))
	case left < expiryWarnBefore:
		return fmt.Sprintf("the status endpoint's TLS certificate (%s) expires on %s", r.certFile, leaf.NotAfter.UTC().Format(time.DateOnly))
	}
	return ""
}

func (r *certReloader) stamps() (fileStamps, error) {
	var st fileStamps
	for i, name := range []string{r.certFile, r.keyFile} {
		fi, err := os.Stat(name)
		if err != nil {
			return st, fmt.Errorf("status: TLS file: %w", err)
		}
		st[i] = fileStamp{mod: fi.ModTime(), size: fi.Size()}
		st[i].inode, st[i].ctime = inodeAndCtime(fi)
	}
	return st, nil
}

// get is tls.Config.GetCertificate.
func (r *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, err := r.stamps()
	if err != nil || st == r.loaded || st == r.failed {
		// A file that vanished mid-renewal: keep serving what is loaded.
		return r.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		r.failed = st
		r.log.Warn("status: the changed TLS certificate does not load; still serving the previous one",
			"cert_file", r.certFile, "key_file", r.keyFile, "err", err)
		return r.cert, nil
	}
	r.cert, r.loaded = &cert, st
	r.log.Info("status: TLS certificate reloaded", "cert_file", r.certFile)
	if cert.Leaf != nil && !cert.Leaf.NotAfter.After(time.Now()) {
		r.log.Warn("status: the reloaded TLS certificate has expired", "cert_file", r.certFile, "not_after", cert.Leaf.NotAfter)
	}
	return r.cert, nil
}

// PinnedTLS is the client side for a CLI on the gateway itself: it trusts
// exactly the leaf certificate in certFile, the one the agent serves, so
// the check holds whatever names or issuer the certificate has (an address
// like 0.0.0.0:9464 is reached as 127.0.0.1, which few certificates name).
func PinnedTLS(certFile string) (*tls.Config, error) {
	data, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("status: read TLS certificate: %w", err)
	}
	var leaf []byte
	for rest := data; leaf == nil; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			return nil, fmt.Errorf("status: %s holds no PEM certificate", certFile)
		}
		if b.Type == "CERTIFICATE" {
			leaf = b.Bytes
		}
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Verification is the pin below, not the name and chain check.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].Raw, leaf) {
				return fmt.Errorf("status: the endpoint's certificate is not the one in %s (renewed since this command read it, the agent could not load the renewed pair — its log says why — or another server on the port)", certFile)
			}
			return nil
		},
	}, nil
}

// CATLS is the client side for a remote endpoint: the system's roots, or
// the certificates in caFile when it is set (a private CA, or the
// gateway's self-signed certificate itself).
func CATLS(caFile string) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile == "" {
		return tc, nil
	}
	data, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("status: read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, errors.New("status: " + caFile + " holds no PEM certificate")
	}
	tc.RootCAs = pool
	return tc, nil
}
