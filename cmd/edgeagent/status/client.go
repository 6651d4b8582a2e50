package status

import (
	"context"
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

// Client reads a running agent's endpoint.
type Client struct {
	Base  string // http://127.0.0.1:9464
	Token string
	HTTP  *http.Client
}

// NewClient returns a client for a status.listen address.
func NewClient(listen, token string) *Client {
	host, port, err := net.SplitHostPort(listen)
	if err == nil && (host == "" || host == "0.0.0.0" || host == "::") {
		listen = net.JoinHostPort("127.0.0.1", port)
	}
	return &Client{Base: "http://" + listen, Token: token, HTTP: &http.Client{Timeout: 10 * time.Second}}
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
	u := c.Base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("%w on %s", ErrNotRunning, c.Base)
		}
		return fmt.Errorf("status: GET %s: %w", u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("status: read %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status: GET %s: %s: %s", u, resp.Status, body)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("status: decode %s: %w", u, err)
	}
	return nil
}
