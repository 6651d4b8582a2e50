package natstest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeagent/edgeagent/testrig/natstest"
)

func publish(t *testing.T, url, subject, id string, data string) *jetstream.PubAck {
	t.Helper()
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ack, err := js.Publish(ctx, subject, []byte(data), jetstream.WithMsgID(id))
	if err != nil {
		t.Fatalf("publish %s: %v", id, err)
	}
	return ack
}

func TestServers(t *testing.T) {
	for _, kind := range []string{"in-process", "binary"} {
		t.Run(kind, func(t *testing.T) {
			var s *natstest.Server
			if kind == "binary" {
				s = natstest.StartBinary(t)
			} else {
				s = natstest.Start(t)
			}
			natstest.CreateStream(t, s.URL(), "T", []string{"t.>"}, 0)
			for i := 0; i < 3; i++ {
				publish(t, s.URL(), "t.a", fmt.Sprint("id-", i), fmt.Sprint("m", i))
			}
			if ack := publish(t, s.URL(), "t.a", "id-1", "again"); !ack.Duplicate {
				t.Fatal("a resent id inside the default window was stored again")
			}
			// File storage survives a restart on the same port.
			s.Restart()
			msgs := natstest.StreamMessages(t, s.URL(), "T")
			if len(msgs) != 3 {
				t.Fatalf("%d messages after restart, want 3", len(msgs))
			}
			for i, m := range msgs {
				if string(m.Data) != fmt.Sprint("m", i) || m.Header.Get(jetstream.MsgIDHeader) != fmt.Sprint("id-", i) || m.Subject != "t.a" {
					t.Fatalf("message %d = %q %v", i, m.Data, m.Header)
				}
			}
		})
	}
}

func TestDuplicateWindowPassed(t *testing.T) {
	s := natstest.Start(t)
	natstest.CreateStream(t, s.URL(), "W", []string{"w.>"}, 200*time.Millisecond)
	publish(t, s.URL(), "w.data", "batch-1", "first")
	if ack := publish(t, s.URL(), "w.data", "batch-1", "resend"); !ack.Duplicate {
		t.Fatal("resend inside the window was not a duplicate")
	}
	natstest.WaitDuplicateWindowPassed(t, s.URL(), "w.probe", 10*time.Second)
	if ack := publish(t, s.URL(), "w.data", "batch-1", "late resend"); ack.Duplicate {
		t.Fatal("the window had not passed when WaitDuplicateWindowPassed returned")
	}
	n := 0
	for _, m := range natstest.StreamMessages(t, s.URL(), "W") {
		if m.Subject == "w.data" {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("%d data messages, want 2 (the first and the late resend)", n)
	}
}

func TestShutdownAndStart(t *testing.T) {
	s := natstest.Start(t)
	s.Shutdown()
	s.Shutdown() // twice is fine
	s.Start()
	natstest.CreateStream(t, s.URL(), "S", []string{"s"}, 0)
}
