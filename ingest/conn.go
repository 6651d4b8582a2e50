package ingest

import (
	"bufio"
	"crypto/tls"
	"net"
	"net/url"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// paho reads each packet's fixed header one byte at a time straight from
// the socket: three to five read syscalls per message, a third of the
// agent's CPU under load. A buffered reader makes it about one per TCP
// segment. Writes (the PUBACKs) go straight through, as paho expects.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// bufferedDial opens plain TCP and TLS broker connections for paho with a
// buffered reader. WebSocket URLs are left to paho (ok is false).
func bufferedDial(scheme string) (paho.OpenConnectionFunc, bool) {
	switch scheme {
	case "tcp", "mqtt", "ssl", "tls", "mqtts", "tcps":
	default:
		return nil, false
	}
	return func(uri *url.URL, o paho.ClientOptions) (net.Conn, error) {
		d := &net.Dialer{Timeout: o.ConnectTimeout}
		var c net.Conn
		var err error
		switch uri.Scheme {
		case "tcp", "mqtt":
			c, err = d.Dial("tcp", uri.Host)
		default:
			c, err = tls.DialWithDialer(d, "tcp", uri.Host, o.TLSConfig)
		}
		if err != nil {
			return nil, err
		}
		return &bufferedConn{Conn: c, r: bufio.NewReaderSize(c, 32<<10)}, nil
	}, true
}
