package config

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"os"
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
	tlsFiles := func(prefix string, t TLS) {
		check(prefix+".ca_file", t.CAFile)
		check(prefix+".cert_file", t.CertFile)
		check(prefix+".key_file", t.KeyFile)
	}
	tlsFiles("mqtt.tls", c.MQTT.TLS)
	check("uplink.nats.creds_file", c.Uplink.NATS.CredsFile)
	tlsFiles("uplink.nats.tls", c.Uplink.NATS.TLS)
	tlsFiles("uplink.mqtt.tls", c.Uplink.MQTT.TLS)
	n := len(list)
	check("status.tls.cert_file", c.Status.TLS.CertFile)
	check("status.tls.key_file", c.Status.TLS.KeyFile)
	if st := c.Status.TLS; len(list) == n && st.CertFile != "" && st.KeyFile != "" {
		// Both readable: the agent would refuse to start on a pair that
		// does not load, so say it here, with the line.
		if _, err := tls.LoadX509KeyPair(st.CertFile, st.KeyFile); err != nil {
			list = append(list, &FieldError{Key: "status.tls.cert_file", Msg: fmt.Sprintf("%s with %s: %v", st.CertFile, st.KeyFile, err)})
		}
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
