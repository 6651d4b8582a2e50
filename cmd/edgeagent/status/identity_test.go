package status

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A client that expects one agent takes figures and rows only from that
// agent: another data_dir, or an answer that names no agent, is an
// *OtherAgentError, whatever the answer held.
func TestClientChecksTheAgentThatAnswers(t *testing.T) {
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	link := filepath.Join(dir, "link")
	if err := os.Mkdir(dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(dataDir, link); err != nil {
		t.Fatal(err)
	}
	me := AgentIdentity("gw-7", dataDir)
	if me.DirID == "" {
		t.Fatalf("no device and inode for %s", dataDir)
	}
	src := &fakeSource{snap: sampleSnapshot(), ready: true}
	s := startServer(t, Config{Identity: me}, src)
	ctx := context.Background()

	for _, tc := range []struct {
		name   string
		expect *Identity
		other  bool
	}{
		{"no expectation", nil, false},
		{"this agent", &me, false},
		{"this agent, data_dir with a trailing slash", ptr(AgentIdentity("gw-7", dataDir+"/")), false},
		{"this agent, data_dir through a link", ptr(AgentIdentity("gw-7", link)), false},
		{"this agent, data_dir relative to another working directory", ptr(AgentIdentity("gw-7", relativeTo(t, dataDir))), false},
		// A gateway_id edited but not reloaded: the same agent, which
		// the caller may note; the client does not refuse it.
		{"this agent under a new name", ptr(AgentIdentity("gw-8", dataDir)), false},
		{"another data_dir, not made yet", ptr(AgentIdentity("gw-7", filepath.Join(dir, "other"))), true},
		{"another data_dir", ptr(AgentIdentity("gw-7", dir)), true},
		{"the same path string, another directory", &Identity{Gateway: "gw-7", DataDir: dataDir, DirID: "1:2"}, true},
	} {
		c := NewClient(s.Addr(), "", nil)
		c.Expect = tc.expect
		snap, snapErr := c.Snapshot(ctx)
		var rows []map[string]any
		rowsErr := c.Inspect(ctx, "late", nil, &rows)
		for _, err := range []error{snapErr, rowsErr} {
			var other *OtherAgentError
			switch {
			case tc.other && !errors.As(err, &other):
				t.Errorf("%s: %v, want an *OtherAgentError", tc.name, err)
			case tc.other && (other.Got != me || !strings.Contains(err.Error(), "keeps its data in "+dataDir)):
				t.Errorf("%s: %v names %+v, want %+v", tc.name, err, other.Got, me)
			case !tc.other && err != nil:
				t.Errorf("%s: %v", tc.name, err)
			}
		}
		if !tc.other && (snap.Gateway != "gw-7" || len(rows) != 1) {
			t.Errorf("%s: snapshot %q, %d rows", tc.name, snap.Gateway, len(rows))
		}
		if c.Answered != me {
			t.Errorf("%s: answered %+v, want %+v", tc.name, c.Answered, me)
		}
	}

	// Another agent's error answer is still another agent's.
	c := NewClient(s.Addr(), "", nil)
	c.Expect = ptr(AgentIdentity("gw-7", dir))
	var other *OtherAgentError
	if err := c.Inspect(ctx, "nothing", nil, new(any)); !errors.As(err, &other) {
		t.Errorf("another agent's 404: %v, want an *OtherAgentError", err)
	}

	// Something else on the port, answering like the endpoint but naming
	// no agent (or an agent from before the headers).
	unnamed := startServer(t, Config{}, src)
	c = NewClient(unnamed.Addr(), "", nil)
	c.Expect = &me
	if _, err := c.Snapshot(ctx); !errors.As(err, &other) || !other.Unnamed || !strings.Contains(err.Error(), "does not name the agent") {
		t.Errorf("an unnamed answer: %v, want an unnamed *OtherAgentError", err)
	}
	c.Expect = nil
	if _, err := c.Snapshot(ctx); err != nil {
		t.Errorf("an unnamed answer without an expectation: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

// relativeTo is path relative to the test's working directory.
func relativeTo(t *testing.T, path string) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(wd, path)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

// Where neither side can read the directory's device and inode, the
// paths decide.
func TestIdentityWithoutDirIDComparesPaths(t *testing.T) {
	a := Identity{DataDir: "/var/lib/edgeagent/"}
	for _, tc := range []struct {
		other string
		same  bool
	}{{"/var/lib/edgeagent", true}, {"/var/lib/./edgeagent", true}, {"/var/lib/edgeagent-2", false}} {
		if got := a.sameDir(&Identity{DataDir: tc.other}); got != tc.same {
			t.Errorf("%s against %s: same %v, want %v", a.DataDir, tc.other, got, tc.same)
		}
	}
}

// The identity goes only to a caller with the token: a data_dir's path is
// not for whoever reaches the port. It survives any bytes in either name.
func TestIdentityNeedsTheToken(t *testing.T) {
	me := Identity{Gateway: "gw 7/ü", DataDir: "/var/lib/edge agent/ü"}
	s := startServer(t, Config{Token: "s3cret", Identity: me}, &fakeSource{snap: sampleSnapshot()})
	for _, tc := range []struct {
		token string
		named bool
	}{{"", false}, {"wrong", false}, {"s3cret", true}} {
		req, err := http.NewRequest("GET", "http://"+s.Addr()+"/status.json", nil)
		if err != nil {
			t.Fatal(err)
		}
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		got, named := identityOf(resp.Header)
		if named != tc.named || (named && got != me) {
			t.Errorf("token %q: headers name %+v (%v), want named=%v", tc.token, got, named, tc.named)
		}
	}
	c := NewClient(s.Addr(), "s3cret", nil)
	c.Expect = &me
	if _, err := c.Snapshot(context.Background()); err != nil {
		t.Errorf("with the token, a path of spaces and non-ASCII bytes: %v", err)
	}
}
