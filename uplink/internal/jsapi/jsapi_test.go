package jsapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeagent/edgeagent/testrig/natstest"
)

const (
	stream  = "EDGE"
	subject = "edge.gw.aggregates"
)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func publisher(t *testing.T, nc *nats.Conn) *Publisher {
	t.Helper()
	p, err := NewPublisher(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func msg(subj, id, data string) *nats.Msg {
	m := nats.NewMsg(subj)
	m.Header.Set(MsgIDHeader, id)
	m.Header.Set("Content-Type", "application/test")
	m.Data = []byte(data)
	return m
}

// wait returns the future's result, failing the test after a while.
func wait(t *testing.T, f *Future) (PubAck, error) {
	t.Helper()
	select {
	case <-f.Done():
		return f.Result()
	case <-time.After(10 * time.Second):
		t.Fatal("no answer to the publish")
		return PubAck{}, nil
	}
}

func TestPublishToStream(t *testing.T) {
	srv := natstest.Start(t)
	natstest.CreateStream(t, srv.URL(), stream, []string{subject}, time.Minute)
	nc := natstest.Connect(t, srv.URL())
	p := publisher(t, nc)

	var futures []*Future
	for i := range 20 {
		f, err := p.Publish(msg(subject, fmt.Sprint("id-", i), fmt.Sprint("m", i)))
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
	}
	for i, f := range futures {
		ack, err := wait(t, f)
		if err != nil || ack.Stream != stream || ack.Sequence != uint64(i+1) || ack.Duplicate {
			t.Fatalf("publish %d: %+v %v", i, ack, err)
		}
	}
	// The same id again inside the window: acknowledged as a duplicate,
	// not stored.
	f, err := p.Publish(msg(subject, "id-3", "again"))
	if err != nil {
		t.Fatal(err)
	}
	if ack, err := wait(t, f); err != nil || !ack.Duplicate || ack.Sequence != 4 {
		t.Fatalf("resend: %+v %v, want a duplicate of seq 4", ack, err)
	}
	msgs := natstest.StreamMessages(t, srv.URL(), stream)
	if len(msgs) != 20 {
		t.Fatalf("stream holds %d messages, want 20", len(msgs))
	}
	for i, m := range msgs {
		if string(m.Data) != fmt.Sprint("m", i) || m.Header.Get(MsgIDHeader) != fmt.Sprint("id-", i) || m.Header.Get("Content-Type") != "application/test" {
			t.Fatalf("stored message %d: %q %v", i, m.Data, m.Header)
		}
	}
}

// TestPublishNoStream: nobody holds the subject; the publish is tried
// three times in all, then fails as jetstream's would.
func TestPublishNoStream(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv.URL())
	attempts := 0
	p := publisher(t, nc)
	p.wait = 10 * time.Millisecond
	p.onRetry = func() { attempts++ } // called on the subscription's goroutine, one at a time
	start := time.Now()
	f, err := p.Publish(msg(subject, "x", "x"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = wait(t, f)
	if !errors.Is(err, ErrNoStreamResponse) || err.Error() != jetstream.ErrNoStreamResponse.Error() {
		t.Fatalf("error %v, want %v", err, jetstream.ErrNoStreamResponse)
	}
	if attempts != noResponderRetries {
		t.Errorf("%d retries, want %d", attempts, noResponderRetries)
	}
	if d := time.Since(start); d < noResponderRetries*p.wait {
		t.Errorf("failed after %v, before the retries' waits", d)
	}
}

// TestPublishRetryFindsStream: the stream appears between the first
// no-responders answer and the retry, and the retry is stored.
func TestPublishRetryFindsStream(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv.URL())
	p := publisher(t, nc)
	p.wait = 10 * time.Millisecond
	retries := 0
	// The hook runs before the retry is scheduled: a stand-in stream that
	// answers like JetStream subscribes there, so it is in place when the
	// retry goes out.
	p.onRetry = func() {
		retries++
		if retries > 1 {
			return
		}
		sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
			if m.Header.Get(MsgIDHeader) != "late" || string(m.Data) != "late" {
				t.Errorf("retry is not the message: %v %q", m.Header, m.Data)
			}
			m.Respond([]byte(`{"stream":"STANDIN","seq":9}`))
		})
		if err != nil {
			t.Error(err)
			return
		}
		t.Cleanup(func() { sub.Unsubscribe() })
		if err := nc.Flush(); err != nil {
			t.Error(err)
		}
	}
	f, err := p.Publish(msg(subject, "late", "late"))
	if err != nil {
		t.Fatal(err)
	}
	ack, err := wait(t, f)
	if err != nil || ack.Stream != "STANDIN" || ack.Sequence != 9 {
		t.Fatalf("ack %+v %v", ack, err)
	}
	if retries != 1 {
		t.Errorf("%d retries, want 1", retries)
	}
}

// TestAnswers: a stand-in stream answers each publish with a fixed body;
// the future reports what jetstream would.
func TestAnswers(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv.URL())
	p := publisher(t, nc)
	answers := map[string]string{
		"ack":     `{"stream":"S","seq":7}`,
		"dup":     `{"stream":"S","seq":7,"duplicate":true,"domain":"hub"}`,
		"apierr":  `{"type":"io.nats.jetstream.api.v1.pub_ack_response","error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}`,
		"garbage": `not json`,
		"empty":   `{}`,
	}
	if _, err := nc.Subscribe("standin.>", func(m *nats.Msg) {
		m.Respond([]byte(answers[strings.TrimPrefix(m.Subject, "standin.")]))
	}); err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		ack PubAck
		err string
	}{
		"ack":     {PubAck{Stream: "S", Sequence: 7}, ""},
		"dup":     {PubAck{Stream: "S", Sequence: 7, Duplicate: true, Domain: "hub"}, ""},
		"apierr":  {PubAck{}, "nats: API error: code=503 err_code=10077 description=maximum messages exceeded"},
		"garbage": {PubAck{}, jetstream.ErrInvalidJSAck.Error()},
		"empty":   {PubAck{}, jetstream.ErrInvalidJSAck.Error()},
	}
	for name, w := range want {
		f, err := p.Publish(msg("standin."+name, name, name))
		if err != nil {
			t.Fatal(err)
		}
		ack, err := wait(t, f)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if ack != w.ack || got != w.err {
			t.Errorf("%s: %+v %q, want %+v %q", name, ack, got, w.ack, w.err)
		}
	}
}

func TestPublishAfterClose(t *testing.T) {
	srv := natstest.Start(t)
	p := publisher(t, natstest.Connect(t, srv.URL()))
	p.Close()
	p.Close()
	if _, err := p.Publish(msg(subject, "x", "x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("publish after close: %v", err)
	}
	if _, err := p.Publish(&nats.Msg{Subject: subject, Reply: "r"}); err == nil {
		t.Fatal("a message with its own reply subject was accepted")
	}
}

func TestStreamInfoAndCreate(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv.URL())
	if _, err := StreamInfo(ctx(t), nc, stream); !errors.Is(err, ErrStreamNotFound) {
		t.Fatalf("info of a missing stream: %v", err)
	}
	cfg := StreamConfig{Name: stream, Subjects: []string{subject}, Duplicates: 2 * time.Minute}
	if err := CreateStream(ctx(t), nc, cfg); err != nil {
		t.Fatal(err)
	}
	if subjects, err := StreamInfo(ctx(t), nc, stream); err != nil || len(subjects) != 1 || subjects[0] != subject {
		t.Fatalf("info after create: %v, %v", subjects, err)
	}
	// What the server made of it, read back with nats.go's jetstream.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx(t), stream)
	if err != nil {
		t.Fatal(err)
	}
	got := s.CachedInfo().Config
	if got.Storage != jetstream.FileStorage || got.Duplicates != 2*time.Minute || got.Retention != jetstream.LimitsPolicy ||
		len(got.Subjects) != 1 || got.Subjects[0] != subject || got.Discard != jetstream.DiscardOld || got.Replicas != 1 {
		t.Errorf("created stream: %+v", got)
	}
	if err := CreateStream(ctx(t), nc, cfg); err != nil {
		t.Errorf("create again, same config: %v", err)
	}
	other := cfg
	other.Subjects = []string{"other.subject"}
	if err := CreateStream(ctx(t), nc, other); !errors.Is(err, ErrStreamNameInUse) {
		t.Errorf("create again, other config: %v, want name in use", err)
	}
}

func TestSubjectMatches(t *testing.T) {
	for _, tc := range []struct {
		filter, subject string
		want            bool
	}{
		{"edge.gw.aggregates", "edge.gw.aggregates", true},
		{"edge.*.aggregates", "edge.gw.aggregates", true},
		{"edge.>", "edge.gw.aggregates", true},
		{">", "edge", true},
		{"edge.>", "edge", false},
		{"edge.*", "edge.gw.aggregates", false},
		{"edge.gw.aggregates.more", "edge.gw.aggregates", false},
		{"other.x", "edge.gw.aggregates", false},
	} {
		if got := SubjectMatches(tc.filter, tc.subject); got != tc.want {
			t.Errorf("SubjectMatches(%q, %q) = %v, want %v", tc.filter, tc.subject, got, tc.want)
		}
	}
}

// TestStreamWithoutJetStream: a server with JetStream off answers nobody.
func TestStreamWithoutJetStream(t *testing.T) {
	srv := natstest.Start(t, natstest.WithOptions(func(o *server.Options) { o.JetStream = false }))
	nc := natstest.Connect(t, srv.URL())
	if _, err := StreamInfo(ctx(t), nc, stream); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("info without JetStream: %v", err)
	}
}

// TestCreateRequestMatchesJetStream: the create request is byte for byte
// what nats.go's jetstream sent for the stream the agent creates.
func TestCreateRequestMatchesJetStream(t *testing.T) {
	for _, c := range []StreamConfig{
		{Name: stream, Subjects: []string{subject}, Duplicates: 2 * time.Minute},
		{Name: "X", Subjects: []string{"a.*", "b.>"}},
	} {
		got, err := c.request()
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(jetstream.StreamConfig{Name: c.Name, Subjects: c.Subjects, Storage: jetstream.FileStorage, Duplicates: c.Duplicates})
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("create request\n got %s\nwant %s", got, want)
		}
	}
}

// TestAPIErrorText: the same text as jetstream's APIError.
func TestAPIErrorText(t *testing.T) {
	e := &APIError{Code: 400, ErrCode: 10071, Description: "wrong last sequence: 3"}
	j := &jetstream.APIError{Code: 400, ErrorCode: 10071, Description: "wrong last sequence: 3"}
	if e.Error() != j.Error() {
		t.Errorf("%q, jetstream says %q", e.Error(), j.Error())
	}
	if errors.Is(e, ErrStreamNotFound) || !errors.Is(&APIError{ErrCode: errCodeStreamNotFound}, ErrStreamNotFound) {
		t.Error("Is does not match on err_code")
	}
}

func FuzzParseAck(f *testing.F) {
	for _, s := range []string{`{"stream":"S","seq":1}`, `{"stream":"S","seq":1,"duplicate":true}`,
		`{"error":{"code":503,"err_code":10077,"description":"x"}}`, `{}`, `null`, `[]`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ack, err := ParseAck(data)
		if err == nil && ack.Stream == "" {
			t.Fatalf("accepted an ack without a stream: %q", data)
		}
		if err != nil && ack != (PubAck{}) {
			t.Fatalf("error %v with an ack %+v", err, ack)
		}
	})
}
