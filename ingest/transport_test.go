package ingest

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/internal/mochilisten"
	"github.com/edgeagent/edgeagent/testrig/certtest"
	"github.com/edgeagent/edgeagent/testrig/freeport"
	"github.com/edgeagent/edgeagent/testrig/logbuf"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
)

// loopbackTLS returns a server config with a fresh self-signed certificate
// for 127.0.0.1 and a client config that trusts it.
func loopbackTLS(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	der, key := certtest.SelfSigned(t, "127.0.0.1")
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}},
		&tls.Config{RootCAs: pool}
}

// Over TLS and over WebSocket alike the agent's connection takes the
// PUBLISH packets out of paho's stream: every QoS1 message is stored and
// acknowledged, so the broker holds nothing for the agent afterwards, and
// of an oversized payload only the prefix is read in.
func TestIngestOverTLSAndWebSocket(t *testing.T) {
	serverTLS, clientTLS := loopbackTLS(t)
	// The broker's log is shown when the test fails: a WebSocket listener
	// binds in its own goroutine and reports a failure only there.
	brokerLog := new(logbuf.Buffer)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("broker log:\n%s", brokerLog)
		}
	})
	srv := mochi.New(&mochi.Options{InlineClient: true, Logger: slog.New(slog.NewTextHandler(brokerLog, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatal(err)
	}
	ports := freeport.Ports(t, 4)
	addr := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", ports[i]) }
	plain, secure, ws, wss := addr(0), addr(1), addr(2), addr(3)
	// Guarded: mochi's own closing of a listener's clients can hang the
	// broker's Close when a client leaves at the same moment.
	for _, l := range []listeners.Listener{
		mochilisten.Listen("tcp", plain),
		mochilisten.Guard(srv, listeners.NewTCP(listeners.Config{ID: "tls", Address: secure, TLSConfig: serverTLS})),
		mochilisten.Guard(srv, listeners.NewWebsocket(listeners.Config{ID: "ws", Address: ws})),
		mochilisten.Guard(srv, listeners.NewWebsocket(listeners.Config{ID: "wss", Address: wss, TLSConfig: serverTLS})),
	} {
		if err := srv.AddListener(l); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	pub := mqtttest.NewPublisher(t, "tcp://"+plain, "device-pub")

	for _, c := range []struct{ name, url string }{
		{"tls", "ssl://" + secure},
		{"websocket", "ws://" + ws},
		{"websocket-tls", "wss://" + wss},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := openBronze(t, buffer.Options{})
			agentLog := new(logbuf.Buffer)
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("agent log:\n%s", agentLog)
				}
			})
			cfg := testConfig(t, c.url, "edgeagent-"+c.name, agentLog)
			// An attempt that hangs is retried within the wait below.
			cfg.ConnectTimeout = 3 * time.Second
			if c.name != "websocket" {
				cfg.TLS = clientTLS
			}
			in := startIngester(t, b, cfg)
			mqtttest.WaitFor(t, 10*time.Second, "connected", in.Connected)
			if in.src.(*pahoSource).conn.Load() == nil {
				t.Fatal("the connection is paho's own, not the agent's bufferedConn")
			}
			want := payloads(c.name, 300)
			pub.PublishAll(t, "sensors/"+c.name+"/telemetry", 1, want)
			waitForMessages(t, b, want)
			mqtttest.WaitFor(t, 10*time.Second, "every message acknowledged at the broker", func() bool {
				cl, ok := srv.Clients.Get(cfg.ClientID)
				return ok && cl.State.Inflight.Len() == 0 && in.Stats().Acked.Load() >= uint64(len(want))
			})
			pub.Publish(t, "sensors/"+c.name+"/telemetry", 1, bytes.Repeat([]byte("z"), 2<<20))
			mqtttest.WaitFor(t, 10*time.Second, "the oversized message dead-lettered", func() bool {
				return in.Stats().Rejected()[ReasonOversized] == 1
			})
		})
	}
}
