package alert

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/internal/topic"
	"github.com/edgeagent/edgeagent/testrig/mqtttest"
	"github.com/edgeagent/edgeagent/uplink/local"
	"github.com/edgeagent/edgeagent/window"
)

// The crash test re-executes the test binary as a child that runs the
// window stage with the engine; these variables switch it into that role.
const (
	envCrashChild  = "EDGEAGENT_ALERT_CRASH_CHILD"
	envCrashState  = "EDGEAGENT_ALERT_CRASH_STATE"
	envCrashBronze = "EDGEAGENT_ALERT_CRASH_BRONZE"
	// crashCommitted is the line the child prints once the window batch
	// holding the alerts has committed.
	crashCommitted = "committed"
)

// The engine is the window stage's observer.
var _ window.Observer = (*Engine)(nil)

func TestMain(m *testing.M) {
	if os.Getenv(envCrashChild) != "" {
		os.Exit(crashChild())
	}
	os.Exit(m.Run())
}

// stageConfig is a window stage reading JSON telemetry with 1-minute
// tumbling windows and the engine as its observer.
func stageConfig(obs window.Observer, maxRecords int) window.Config {
	tp, err := topic.Parse("sensors/{device}/telemetry")
	if err != nil {
		panic(err) // a constant template
	}
	return window.Config{
		Gateway:            "gw1",
		Subscriptions:      []window.Subscription{{Template: tp, Format: window.FormatJSON}},
		EventID:            "id",
		EventTime:          "ts",
		Size:               time.Minute,
		WatermarkDelay:     2 * time.Second,
		AllowedLateness:    time.Minute,
		IdleTimeout:        5 * time.Minute,
		MaxRecordsPerBatch: maxRecords,
		Observer:           obs,
		Logger:             testLogger(),
	}
}

// readings are four JSON readings a minute for press-1, whose minute means
// cross 80 twice in a row, hover in the hysteresis band and fall below 75,
// and for press-2, which stays cool. The last minute closes the others.
func readings() []buffer.Record {
	hot := []float64{70, 85, 86, 78, 79, 74, 70, 70, 70}
	var recs []buffer.Record
	id := 0
	for m, v := range hot {
		for q := range 4 {
			ts := t0 + int64(m)*minute + int64(q)*15_000
			for _, d := range []struct {
				dev string
				v   float64
			}{{"press-1", v + float64(q) - 1.5}, {"press-2", 60}} {
				id++
				recs = append(recs, buffer.Record{
					Kind: buffer.KindMessage, Topic: "sensors/" + d.dev + "/telemetry", QoS: 1,
					ReceivedAt: (ts + 300) * 1e6,
					Payload:    fmt.Appendf(nil, `{"id":"%d","ts":%d,"temperature":%g}`, id, ts, d.v),
				})
			}
		}
	}
	return recs
}

func openBronze(t testing.TB, path string) *buffer.Bronze {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "bronze.db")
	}
	b, err := buffer.Open(path, buffer.Options{})
	if err != nil {
		t.Fatalf("open bronze: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestWithWindowStage runs the real window stage over a real Bronze with
// the engine as its observer: the alert fires exactly once, after the
// second window above 80, and clears once, when the mean drops below 75.
// Running it in batches of 5 records gives the same outbox; a restart over
// the same Bronze adds nothing.
func TestWithWindowStage(t *testing.T) {
	var outboxes [][]byte
	for _, batch := range []int{10_000, 5} {
		db := openDBOpts(t, "", true)
		br := openBronze(t, "")
		if err := br.Append(readings()); err != nil {
			t.Fatal(err)
		}
		e := newEngine(t, db, testConfig(overheating()))
		// Stats are read from another goroutine while the stage runs.
		var polls atomic.Int64
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		wg.Go(func() {
			for ctx.Err() == nil {
				_ = e.Stats()
				polls.Add(1)
				time.Sleep(time.Millisecond) // sampling interval of a status reader
			}
		})
		s, err := window.New(db, br, stageConfig(e, batch))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.RunOnce(); err != nil {
			t.Fatal(err)
		}
		cancel()
		wg.Wait()

		got := transitions(t, alerts(t, db), "overheating")
		want := strs(
			transition{"press-1", 2, StateFired, 86, 0},
			transition{"press-1", 5, StateCleared, 74, 0},
		)
		if !slices.Equal(got, want) {
			t.Fatalf("batch %d: transitions\n got %v\nwant %v", batch, got, want)
		}
		if n := len(locals(t, db)); n != 2 {
			t.Fatalf("batch %d: %d local rows, want 2", batch, n)
		}
		// Restart: a new stage and engine over the same databases.
		before := outboxBytes(t, db)
		e2 := newEngine(t, db, testConfig(overheating()))
		s2, err := window.New(db, br, stageConfig(e2, batch))
		if err != nil {
			t.Fatal(err)
		}
		if err := s2.RunOnce(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(outboxBytes(t, db), before) {
			t.Fatalf("batch %d: a restart over the same Bronze changed the outbox", batch)
		}
		outboxes = append(outboxes, before)
	}
	if !bytes.Equal(outboxes[0], outboxes[1]) {
		t.Fatal("batches of 5 records gave a different outbox than one batch")
	}
}

// crashChild runs the window stage with the engine over the Bronze the
// parent wrote, says so once the batch committed, and waits to be killed:
// no local publisher runs in it.
func crashChild() int {
	fail := func(what string, err error) int {
		fmt.Fprintf(os.Stderr, "child: %s: %v\n", what, err)
		return 2
	}
	db, err := bolt.Open(os.Getenv(envCrashState), 0o600, &bolt.Options{Timeout: 10 * time.Second})
	if err != nil {
		return fail("open state", err)
	}
	br, err := buffer.Open(os.Getenv(envCrashBronze), buffer.Options{})
	if err != nil {
		return fail("open bronze", err)
	}
	e, err := New(db, testConfig(overheating()))
	if err != nil {
		return fail("engine", err)
	}
	s, err := window.New(db, br, stageConfig(e, 10_000))
	if err != nil {
		return fail("stage", err)
	}
	if err := s.RunOnce(); err != nil {
		return fail("run", err)
	}
	fmt.Println(crashCommitted)
	select {} // the parent kills us here, before anything is published
}

// TestCrashBeforeLocalPublish kills (SIGKILL) a child after the window
// batch holding an alert committed and before any local publish. A
// publisher started afterwards on the same database delivers each alert
// message exactly once (by key) to a real broker, and running the stage
// again adds nothing.
func TestCrashBeforeLocalPublish(t *testing.T) {
	dir := t.TempDir()
	statePath, bronzePath := filepath.Join(dir, "state.db"), filepath.Join(dir, "bronze.db")
	func() {
		br, err := buffer.Open(bronzePath, buffer.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer br.Close()
		if err := br.Append(readings()); err != nil {
			t.Fatal(err)
		}
	}()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envCrashChild+"=1", envCrashState+"="+statePath, envCrashBronze+"="+bronzePath)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Scan()
		line <- sc.Text()
	}()
	select {
	case l := <-line:
		if l != crashCommitted {
			t.Fatalf("child said %q", l)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the child did not commit its window batch")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	db := openDB(t, statePath)
	if n := len(locals(t, db)); n != 2 {
		t.Fatalf("%d local rows after the kill, want the fired and cleared messages", n)
	}
	url := mqtttest.StartMochi(t)
	var mu sync.Mutex
	var got []string
	sub := paho.NewClient(paho.NewClientOptions().AddBroker(url).SetClientID("hmi").SetCleanSession(true))
	if tok := sub.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscriber connect: %v", tok.Error())
	}
	t.Cleanup(func() { sub.Disconnect(100) })
	tok := sub.Subscribe("edgeagent/gw1/#", 1, func(_ paho.Client, m paho.Message) {
		mu.Lock()
		got = append(got, string(m.Payload()))
		mu.Unlock()
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	sink, err := local.NewPahoSink(local.PahoConfig{Broker: url, Gateway: "gw1", Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	pub, err := local.New(db, local.Config{Gateway: "gw1", Sink: sink, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- pub.Run(t.Context()) }()
	t.Cleanup(func() {
		pub.Close()
		if err := <-errc; err != nil {
			t.Errorf("publisher: %v", err)
		}
	})

	// The stage restarted over the same Bronze adds nothing.
	br := openBronze(t, bronzePath)
	e := newEngine(t, db, testConfig(overheating()))
	s, err := window.New(db, br, stageConfig(e, 10_000))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RunOnce(); err != nil {
		t.Fatal(err)
	}
	// A sentinel queued after the alerts: once it arrived, anything
	// published before it has arrived too.
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := outbox.Append(tx, outbox.KindLocal, 0, local.Encode(local.Message{Topic: "edgeagent/gw1/sentinel", Payload: []byte("sentinel"), QoS: 1}))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	pub.Notify()
	mqtttest.WaitFor(t, 20*time.Second, "the sentinel", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(got, "sentinel")
	})
	mu.Lock()
	defer mu.Unlock()
	keys := map[string]int{}
	for _, p := range got {
		if p == "sentinel" {
			continue
		}
		i := strings.Index(p, `"key":"`)
		if i < 0 {
			t.Fatalf("message without a key: %s", p)
		}
		k := p[i+7:]
		keys[k[:strings.IndexByte(k, '"')]]++
	}
	fired := AlertKey("gw1", "overheating", "press-1", t0+2*minute, StateFired)
	cleared := AlertKey("gw1", "overheating", "press-1", t0+5*minute, StateCleared)
	if len(keys) != 2 || keys[fired] != 1 || keys[cleared] != 1 {
		t.Fatalf("delivered keys %v, want %s and %s once each", keys, fired, cleared)
	}
}
