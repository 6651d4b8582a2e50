package status

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"time"
)

// ErrNotRunning is returned by the client when nothing listens on the
// status address: the agent is stopped (or its endpoint is disabled).
var ErrNotRunning = errors.New("status: no agent is listening")

// Client reads a running agent's endpoint: one GET per connection, HTTP/1.1
// written by hand over net (and crypto/tls), since net/http's client
// Transport would add about 100 KiB to a binary that needs one request
// at a time.
type Client struct {
	Base  string // http://127.0.0.1:9464
	Token string
	// Timeout bounds a whole request: dial, handshake, answer.
	Timeout time.Duration
	// Expect, when set, is the agent the caller means: an answer from
	// any other (another data_dir, or no name at all) is an
	// *OtherAgentError instead of its figures or rows.
	Expect *Identity
	// Answered is the agent that answered the last request.
	Answered Identity

	addr string      // host:port dialled
	tls  *tls.Config // nil: plain HTTP
}

// NewClient returns a client for a status.listen address, over HTTPS with
// tc when tc is not nil.
func NewClient(listen, token string, tc *tls.Config) *Client {
	host, port, err := net.SplitHostPort(listen)
	if err == nil && (host == "" || host == "0.0.0.0" || host == "::") {
		listen = net.JoinHostPort("127.0.0.1", port)
	}
	c := &Client{Base: "http://" + listen, Token: token, Timeout: 10 * time.Second, addr: listen, tls: tc}
	if tc != nil {
		c.Base = "https://" + listen
	}
	return c
}

// Snapshot fetches /status.json.
func (c *Client) Snapshot(ctx context.Context) (Snapshot, error) {
	var s Snapshot
	err := c.get(ctx, "/status.json", nil, &s)
	return s, err
}

// Inspect fetches /inspect/TABLE with the query's filters into out.
func (c *Client) Inspect(ctx context.Context, table string, q url.Values, out any) error {
	return c.get(ctx, "/inspect/"+url.PathEscape(table), q, out)
}

func (c *Client) get(ctx context.Context, path string, q url.Values, out any) error {
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	u := c.Base + path
	resp, body, err := c.do(ctx, path)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("%w on %s", ErrNotRunning, c.Base)
		}
		return fmt.Errorf("status: GET %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		// Another agent's error (a table it does not know, a failed
		// read) says less than that it is another agent. A 401 names
		// no one, and stays a 401.
		if _, named := identityOf(resp.Header); named {
			if err := c.checkIdentity(resp.Header); err != nil {
				return err
			}
		}
		return fmt.Errorf("status: GET %s: %s: %s", u, resp.Status, bytes.TrimSpace(body))
	}
	if err := c.checkIdentity(resp.Header); err != nil {
		return err
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("status: decode %s: %w", u, err)
	}
	return nil
}

// maxBody bounds an answer read into memory (an inspect page of large
// payloads).
const maxBody = 64 << 20

func (c *Client) do(ctx context.Context, path string) (*http.Response, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	var conn net.Conn
	var err error
	if c.tls != nil {
		tc := c.tls.Clone()
		if tc.ServerName == "" {
			tc.ServerName, _, _ = net.SplitHostPort(c.addr)
		}
		conn, err = (&tls.Dialer{Config: tc}).DialContext(ctx, "tcp", c.addr)
	} else {
		conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", c.addr)
	}
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var req bytes.Buffer
	fmt.Fprintf(&req, "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: edgeagent\r\nAccept: application/json\r\nConnection: close\r\n", path, c.addr)
	if c.Token != "" {
		fmt.Fprintf(&req, "Authorization: Bearer %s\r\n", c.Token)
	}
	req.WriteString("\r\n")
	if _, err := conn.Write(req.Bytes()); err != nil {
		return nil, nil, ctxErr(ctx, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return nil, nil, ctxErr(ctx, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, nil, fmt.Errorf("read the answer: %w", ctxErr(ctx, err))
	}
	return resp, body, nil
}

// ctxErr names the deadline or cancellation behind an I/O error it caused.
func ctxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("%w (%v)", cerr, err)
	}
	return err
}
