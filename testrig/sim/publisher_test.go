package sim

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgeagent/edgeagent/testrig/scenario"
	"github.com/edgeagent/edgeagent/testrig/servers"
)

func smallPlan(t *testing.T, d time.Duration) *Plan {
	t.Helper()
	sc, err := scenario.Parse("small", []byte(`
name: small
seed: 9
duration: 2s
speed: 600
connections: 2
devices:
  - {prefix: j, count: 4, format: json, interval: 10s, metrics: [t]}
  - {prefix: c, count: 2, format: cbor, interval: 10s, metrics: [t, h]}
  - {prefix: n, count: 2, format: number, interval: 20s, metrics: [level]}
misbehaviour:
  duplicates: {readings: 10%}
  malformed: {messages: 5%}
`))
	if err != nil {
		t.Fatal(err)
	}
	sc.Duration = d
	p, err := NewPlan(sc, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func startMochi(t *testing.T) *servers.Mochi {
	t.Helper()
	m, err := servers.StartMochi("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// recorder is a persistent subscriber that records payloads per topic.
type recorder struct {
	mu  sync.Mutex
	got map[string][][]byte
	c   paho.Client
}

func record(t *testing.T, url string) *recorder {
	t.Helper()
	r := &recorder{got: map[string][][]byte{}}
	h := func(_ paho.Client, m paho.Message) {
		r.mu.Lock()
		r.got[m.Topic()] = append(r.got[m.Topic()], m.Payload())
		r.mu.Unlock()
	}
	subscribed := make(chan struct{}, 1)
	opts := paho.NewClientOptions().AddBroker(url).SetClientID("sim-test-recorder").SetCleanSession(false).
		SetOrderMatters(true).SetAutoReconnect(true).SetConnectRetry(true).SetConnectRetryInterval(50 * time.Millisecond)
	opts.SetOnConnectHandler(func(c paho.Client) {
		c.SubscribeMultiple(map[string]byte{"sensors/+/telemetry": 1, "cbor/+/telemetry": 1, "num/+/+": 1}, h).Wait()
		select {
		case subscribed <- struct{}{}:
		default:
		}
	})
	r.c = paho.NewClient(opts)
	if tok := r.c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("recorder connect: %v", tok.Error())
	}
	select {
	case <-subscribed:
	case <-time.After(10 * time.Second):
		t.Fatal("recorder: not subscribed within 10s")
	}
	t.Cleanup(func() { r.c.Disconnect(100) })
	return r
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, v := range r.got {
		n += len(v)
	}
	return n
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
}

// TestPublisherKeepsEachDevicesOrder publishes a plan over two shared
// connections and checks that every device's messages arrive, complete and
// in the planned order.
func TestPublisherKeepsEachDevicesOrder(t *testing.T) {
	m := startMochi(t)
	rec := record(t, m.URL())
	plan := smallPlan(t, 2*time.Second)
	pub := NewPublisher(plan, PublisherConfig{Broker: m.URL(), ClientPrefix: "sim-test"})
	if err := pub.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	total := plan.Counts().Messages
	waitFor(t, 10*time.Second, "every message at the subscriber", func() bool { return rec.count() >= total })
	for d, dev := range plan.Devices {
		if pub.Sent()[d] != len(dev.Messages) {
			t.Fatalf("%s: %d of %d messages acknowledged", dev.Name, pub.Sent()[d], len(dev.Messages))
		}
		want := map[string][][]byte{}
		for i, msg := range dev.Messages {
			want[msg.Topic] = append(want[msg.Topic], msg.Payload)
			if pub.SentAt()[d][i] == 0 {
				t.Fatalf("%s: message %d has no send time", dev.Name, i)
			}
		}
		rec.mu.Lock()
		for topic, payloads := range want {
			got := rec.got[topic]
			if len(got) != len(payloads) {
				rec.mu.Unlock()
				t.Fatalf("%s: %d messages, want %d", topic, len(got), len(payloads))
			}
			for i := range payloads {
				if !bytes.Equal(got[i], payloads[i]) {
					rec.mu.Unlock()
					t.Fatalf("%s: message %d out of order", topic, i)
				}
			}
		}
		rec.mu.Unlock()
	}
	if p := pub.Progress(); p.Acked != uint64(total) || p.Published != uint64(total) {
		t.Fatalf("progress %+v, want %d published and acked", p, total)
	}
}

// restartable is a broker the tests stop and start again.
type restartable interface {
	URL() string
	Stop() error
	Start() error
}

// publishThroughRestart publishes plan to b, stops b once more than
// acked messages are acknowledged, starts it again after outage, and
// returns the publisher once it has finished without error.
func publishThroughRestart(t *testing.T, b restartable, plan *Plan, clientPrefix string, acked uint64, outage time.Duration) *Publisher {
	t.Helper()
	started := make(chan time.Time, 1)
	pub := NewPublisher(plan, PublisherConfig{Broker: b.URL(), ClientPrefix: clientPrefix,
		OnStart: func(t time.Time) { started <- t }})
	done := make(chan error, 1)
	go func() { done <- pub.Run(context.Background()) }()
	<-started
	waitFor(t, 10*time.Second, "some acknowledgements", func() bool { return pub.Progress().Acked > acked })
	if err := b.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(outage) // the outage itself, not a wait for a condition
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("publisher did not finish within 60s of the restart")
	}
	return pub
}

// TestPublisherSurvivesBrokerRestart restarts the broker while publishing:
// every message is acknowledged in the end (paho resends what was in flight).
func TestPublisherSurvivesBrokerRestart(t *testing.T) {
	m := startMochi(t)
	plan := smallPlan(t, 3*time.Second)
	pub := publishThroughRestart(t, m, plan, "sim-restart", 20, 300*time.Millisecond)
	for d, dev := range plan.Devices {
		if pub.Sent()[d] != len(dev.Messages) {
			t.Fatalf("%s: %d of %d acknowledged after the restart", dev.Name, pub.Sent()[d], len(dev.Messages))
		}
	}
}

// TestPublisherKeepsOrderAcrossBrokerRestart restarts a persistent
// mosquitto while the plan is being published: each device's messages
// still reach a persistent subscriber in their planned order (paho resends
// what was in flight after the reconnect; a publish made meanwhile could
// overtake it). A copy sent again is allowed; an overtaking one is not.
func TestPublisherKeepsOrderAcrossBrokerRestart(t *testing.T) {
	m, err := servers.StartMosquitto(t.TempDir())
	if errors.Is(err, servers.ErrNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	rec := record(t, m.URL())
	plan := smallPlan(t, 4*time.Second)
	publishThroughRestart(t, m, plan, "sim-order", 50, time.Second)
	firstCopies := func(payloads [][]byte) []string {
		seen := map[string]bool{}
		var out []string
		for _, b := range payloads {
			if !seen[string(b)] {
				seen[string(b)] = true
				out = append(out, string(b))
			}
		}
		return out
	}
	want := map[string][][]byte{}
	for _, dev := range plan.Devices {
		for _, msg := range dev.Messages {
			want[msg.Topic] = append(want[msg.Topic], msg.Payload)
		}
	}
	for topic, payloads := range want {
		exp := firstCopies(payloads)
		waitFor(t, 20*time.Second, topic+"'s messages at the subscriber", func() bool {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			return len(firstCopies(rec.got[topic])) >= len(exp)
		})
		rec.mu.Lock()
		got := firstCopies(rec.got[topic])
		rec.mu.Unlock()
		for i := range exp {
			if got[i] != exp[i] {
				t.Fatalf("%s: message %d of %d out of order: got %s, want %s", topic, i, len(exp), got[i], exp[i])
			}
		}
	}
}

// TestPublisherStopsOnCancel stops mid-plan: what was sent is a prefix per
// device, and nothing is left unacknowledged.
func TestPublisherStopsOnCancel(t *testing.T) {
	m := startMochi(t)
	plan := smallPlan(t, 10*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	pub := NewPublisher(plan, PublisherConfig{Broker: m.URL(), ClientPrefix: "sim-cancel"})
	done := make(chan error, 1)
	go func() { done <- pub.Run(ctx) }()
	waitFor(t, 10*time.Second, "some acknowledgements", func() bool { return pub.Progress().Acked > 30 })
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	if pub.Unacked() != 0 {
		t.Fatalf("%d unacknowledged", pub.Unacked())
	}
	sent, total := 0, 0
	for d, dev := range plan.Devices {
		sent += pub.Sent()[d]
		total += len(dev.Messages)
	}
	if sent == 0 || sent >= total || uint64(sent) != pub.Progress().Acked {
		t.Fatalf("sent %d of %d, progress %+v: want a part, equal to the acks", sent, total, pub.Progress())
	}
}

// TestLockstepHoldsTheConnectionAhead: a connection whose next message is
// planned past the span of the one furthest behind waits until that one
// moves on or finishes, or its context ends.
func TestLockstepHoldsTheConnectionAhead(t *testing.T) {
	l := newLockstep(2, time.Second)
	passed := make(chan time.Duration, 3)
	wait := func(ctx context.Context, at time.Duration) {
		go func() {
			l.wait(ctx, 0, at)
			passed <- at
		}()
	}
	expectPass := func(at time.Duration) {
		t.Helper()
		select {
		case got := <-passed:
			if got != at {
				t.Fatalf("the wait for %v passed, want the one for %v", got, at)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the wait for %v did not pass within 10s", at)
		}
	}
	expectHeld := func() {
		t.Helper()
		// Negative evidence needs a bound: a wait that should hold but
		// passes would show within this long.
		select {
		case got := <-passed:
			t.Fatalf("the wait for %v passed while connection 1 is more than a second behind", got)
		case <-time.After(100 * time.Millisecond):
		}
	}

	wait(context.Background(), time.Second) // within the span of connection 1 at 0
	expectPass(time.Second)
	wait(context.Background(), 5*time.Second)
	expectHeld()
	l.wait(context.Background(), 1, 3*time.Second) // 1 is still more than a second behind
	expectHeld()
	l.wait(context.Background(), 1, 4*time.Second)
	expectPass(5 * time.Second)

	wait(context.Background(), 10*time.Second)
	expectHeld()
	l.done(1) // the connection behind has nothing more to send
	expectPass(10 * time.Second)

	l2 := newLockstep(2, time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer context.AfterFunc(ctx, l2.wake)()
	go func() {
		l2.wait(ctx, 0, time.Minute)
		passed <- time.Minute
	}()
	expectHeld()
	cancel()
	expectPass(time.Minute)
}

// TestPublisherLockstepKeepsDevicesTogether publishes unpaced over two
// connections, one carrying seven devices and the other one, so the
// second would race through the plan's time seven times faster: with
// Lockstep, no message goes out before every message of the other
// connection planned more than the span earlier.
func TestPublisherLockstepKeepsDevicesTogether(t *testing.T) {
	m := startMochi(t)
	plan := smallPlan(t, 4*time.Second)
	for d := range plan.Devices {
		plan.Devices[d].Conn = 0
	}
	plan.Devices[len(plan.Devices)-1].Conn = 1
	const span = 100 * time.Millisecond
	pub := NewPublisher(plan, PublisherConfig{Broker: m.URL(), ClientPrefix: "sim-lockstep", Unpaced: true, Lockstep: span, MaxInflight: 4})
	if err := pub.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	type sent struct {
		conn     int
		at       time.Duration
		wallNano int64
	}
	var all []sent
	for d, dev := range plan.Devices {
		for i, msg := range dev.Messages {
			all = append(all, sent{dev.Conn, msg.SendAt, pub.SentAt()[d][i]})
		}
	}
	// For each connection, the latest send among its messages planned
	// before each point: checked against every message of the other.
	checked := 0
	for _, a := range all {
		for _, b := range all {
			if b.conn != a.conn && b.at < a.at-span && b.wallNano > a.wallNano {
				t.Fatalf("connection %d sent a message planned at %v before connection %d sent one planned at %v, more than %v earlier",
					a.conn, a.at, b.conn, b.at, span)
			}
			if b.conn != a.conn && b.at < a.at-span {
				checked++
			}
		}
	}
	if checked == 0 {
		t.Fatal("the plan has no pair of messages further apart than the span: nothing was checked")
	}
}
