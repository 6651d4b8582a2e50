package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/nats-io/nkeys"
)

// CheckFiles checks that every file the configuration names (TLS
// certificates and keys, the NATS credentials file) exists and can be
// read. It is separate from Validate, which is pure, so a config can be
// checked on a laptop for a gateway; `config check` on the gateway should
// call both. It returns nil or an *Errors.
func (c *Config) CheckFiles() error {
	var list []*FieldError
	check := func(key, path string) {
		if path == "" {
			return
		}
		f, err := os.Open(path)
		if err == nil {
			st, serr := f.Stat()
			f.Close()
			switch {
			case serr != nil:
				err = serr
			case st.IsDir():
				err = errors.New("is a directory")
			}
		}
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err // the path is already in the message
			}
			list = append(list, &FieldError{Key: key, Msg: fmt.Sprintf("%s: %v", path, err)})
		}
	}
	// Files that can be read are also loaded as the agent will load them,
	// so that a file of the wrong kind is found here, with its line,
	// rather than at start (or, for the NATS credentials, at every
	// connect attempt).
	keyPair := func(prefix, certFile, keyFile string) {
		if certFile == "" || keyFile == "" {
			return
		}
		if _, err := tls.LoadX509KeyPair(certFile, keyFile); err != nil {
			list = append(list, &FieldError{Key: prefix + ".cert_file", Msg: fmt.Sprintf("%s with %s: %v", certFile, keyFile, err)})
		}
	}
	tlsFiles := func(prefix string, t TLS) {
		n := len(list)
		check(prefix+".ca_file", t.CAFile)
		check(prefix+".cert_file", t.CertFile)
		check(prefix+".key_file", t.KeyFile)
		if len(list) > n {
			return
		}
		if t.CAFile != "" {
			if err := loadCA(t.CAFile); err != nil {
				list = append(list, &FieldError{Key: prefix + ".ca_file", Msg: err.Error()})
			}
		}
		keyPair(prefix, t.CertFile, t.KeyFile)
	}
	tlsFiles("mqtt.tls", c.MQTT.TLS)
	n := len(list)
	check("uplink.nats.creds_file", c.Uplink.NATS.CredsFile)
	if f := c.Uplink.NATS.CredsFile; f != "" && len(list) == n {
		if err := checkCreds(f); err != nil {
			list = append(list, &FieldError{Key: "uplink.nats.creds_file", Msg: err.Error()})
		}
	}
	tlsFiles("uplink.nats.tls", c.Uplink.NATS.TLS)
	tlsFiles("uplink.mqtt.tls", c.Uplink.MQTT.TLS)
	n = len(list)
	check("status.tls.cert_file", c.Status.TLS.CertFile)
	check("status.tls.key_file", c.Status.TLS.KeyFile)
	if len(list) == n {
		keyPair("status.tls", c.Status.TLS.CertFile, c.Status.TLS.KeyFile)
	}
	if len(list) == 0 {
		return nil
	}
	file := ""
	if c.src != nil {
		file = c.src.file
	}
	for _, fe := range list {
		p := c.src.lineOf(fe.Key)
		fe.File, fe.Line, fe.Column = file, p.line, p.col
	}
	errs := &Errors{File: file, List: list}
	errs.sortAndDedup()
	return errs
}

// loadCA reads a CA file as the TLS clients do: at least one PEM
// certificate.
func loadCA(path string) error {
	pem, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if !x509.NewCertPool().AppendCertsFromPEM(pem) {
		return fmt.Errorf("%s holds no PEM certificate", path)
	}
	return nil
}

// checkCreds reads a NATS credentials file as nats.go does at each
// connect: a user JWT and an nkey seed.
func checkCreds(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	const want = "a user JWT and an nkey seed, as nsc writes it"
	kp, err := nkeys.ParseDecoratedNKey(b)
	if err != nil {
		return fmt.Errorf("%s is not a NATS credentials file (%s): %v", path, want, err)
	}
	kp.Wipe()
	// Without its decorated JWT section nats.go sends the whole file as
	// the JWT, and every connect fails authentication.
	if jwt, _ := nkeys.ParseDecoratedJWT(b); jwt == "" || jwt == string(b) {
		return fmt.Errorf("%s is not a NATS credentials file (%s): no user JWT in it", path, want)
	}
	return nil
}
