package status

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// Identity names the agent behind an endpoint. Its data_dir is what tells
// two agents on one host apart: bbolt's lock keeps two agents off one
// directory, while two configs may well share a gateway_id.
type Identity struct {
	Gateway string
	DataDir string // as the config gives it, for people to read
	// DirID is the data_dir's device and inode ("" where it cannot be
	// read), so that a link to it, or a relative path taken from
	// another working directory, still names the same directory.
	DirID string
}

// AgentIdentity is the identity of the agent whose config has gateway
// and dataDir, read from the directory itself.
func AgentIdentity(gateway, dataDir string) Identity {
	return Identity{Gateway: gateway, DataDir: dataDir, DirID: dirID(dataDir)}
}

func dirID(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	return strconv.FormatUint(uint64(st.Dev), 10) + ":" + strconv.FormatUint(st.Ino, 10)
}

// sameDir reports whether two identities name one data_dir.
func (id *Identity) sameDir(o *Identity) bool {
	if id.DirID != "" || o.DirID != "" {
		return id.DirID == o.DirID
	}
	return filepath.Clean(id.DataDir) == filepath.Clean(o.DataDir)
}

// The headers every authorized answer carries, percent-encoded (a path
// may hold any byte).
const (
	GatewayHeader = "Edgeagent-Gateway-Id"
	DataDirHeader = "Edgeagent-Data-Dir"
	DirIDHeader   = "Edgeagent-Data-Dir-Id"
)

// headers renders the identity once, for every answer; nil for none.
func (id Identity) headers() http.Header {
	if id.DataDir == "" {
		return nil
	}
	return http.Header{
		GatewayHeader: {url.PathEscape(id.Gateway)},
		DataDirHeader: {url.PathEscape(id.DataDir)},
		DirIDHeader:   {id.DirID},
	}
}

// identityOf reads the headers; ok is false when the answer names no agent.
func identityOf(h http.Header) (id Identity, ok bool) {
	dir := h.Get(DataDirHeader)
	if dir == "" {
		return Identity{}, false
	}
	unescape := func(s string) string {
		if u, err := url.PathUnescape(s); err == nil {
			return u
		}
		return s
	}
	return Identity{Gateway: unescape(h.Get(GatewayHeader)), DataDir: unescape(dir), DirID: h.Get(DirIDHeader)}, true
}

// OtherAgentError is the answer of an endpoint that is not the agent the
// client expected: another agent (Got names it) or something that names
// no agent at all (Unnamed). Its rows and figures are not this config's.
type OtherAgentError struct {
	Base      string // the endpoint, e.g. http://127.0.0.1:9464
	Want, Got Identity
	Unnamed   bool
	_         [0]func() // not comparable: no equality code linked for it
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
	if c.Expect == nil || (ok && c.Expect.sameDir(&got)) {
		return nil
	}
	return &OtherAgentError{Base: c.Base, Want: *c.Expect, Got: got, Unnamed: !ok}
}
