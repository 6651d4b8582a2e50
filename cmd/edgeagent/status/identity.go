package status

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
)

// Identity names the agent behind an endpoint. DataDir (absolute) is what
// tells two agents on one host apart: bbolt's lock keeps two agents off
// one data_dir, while two configs may well share a gateway_id.
type Identity struct {
	Gateway string
	DataDir string
}

// The headers every authorized answer carries, percent-encoded (a path
// may hold any byte).
const (
	GatewayHeader = "Edgeagent-Gateway-Id"
	DataDirHeader = "Edgeagent-Data-Dir"
)

func (id Identity) setHeaders(h http.Header) {
	if id == (Identity{}) {
		return
	}
	h.Set(GatewayHeader, url.PathEscape(id.Gateway))
	h.Set(DataDirHeader, url.PathEscape(id.DataDir))
}

// identityOf reads the headers; ok is false when the answer names no agent.
func identityOf(h http.Header) (id Identity, ok bool) {
	gw, dir := h.Get(GatewayHeader), h.Get(DataDirHeader)
	if dir == "" {
		return Identity{}, false
	}
	var err error
	if id.Gateway, err = url.PathUnescape(gw); err != nil {
		id.Gateway = gw
	}
	if id.DataDir, err = url.PathUnescape(dir); err != nil {
		id.DataDir = dir
	}
	return id, true
}

// SameDataDir reports whether two data_dir paths name one directory: equal
// once cleaned, or one directory reached through a link.
func SameDataDir(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	sa, errA := os.Stat(a)
	sb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(sa, sb)
}

// OtherAgentError is the answer of an endpoint that is not the agent the
// client expected: another agent (Got names it) or something that names
// no agent at all (Unnamed). Its rows and figures are not this config's.
type OtherAgentError struct {
	Base      string // the endpoint, e.g. http://127.0.0.1:9464
	Want, Got Identity
	Unnamed   bool
}

func (e *OtherAgentError) Error() string {
	if e.Unnamed {
		return fmt.Sprintf("status: what answers on %s does not name the agent behind it (no %s header): something other than this config's agent (data_dir %s) holds status.listen, or an agent older than this command",
			e.Base, DataDirHeader, e.Want.DataDir)
	}
	return fmt.Sprintf("status: the agent answering on %s is not this config's: it keeps its data in %s (gateway_id %q), this config in %s (gateway_id %q). Another agent holds status.listen",
		e.Base, e.Got.DataDir, e.Got.Gateway, e.Want.DataDir, e.Want.Gateway)
}

// checkIdentity compares an answer's headers with c.Expect and records
// what answered in c.Answered.
func (c *Client) checkIdentity(h http.Header) error {
	got, ok := identityOf(h)
	c.Answered = got
	switch {
	case c.Expect == nil:
		return nil
	case !ok:
		return &OtherAgentError{Base: c.Base, Want: *c.Expect, Unnamed: true}
	case !SameDataDir(c.Expect.DataDir, got.DataDir):
		return &OtherAgentError{Base: c.Base, Want: *c.Expect, Got: got}
	}
	return nil
}
