package agent

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/config"
)

func filesTestConfig(t *testing.T, dataDir, extra string) *config.Config {
	t.Helper()
	yaml := fmt.Sprintf(`gateway_id: gw-files
data_dir: %q
mqtt:
  broker: tcp://127.0.0.1:1883
  subscriptions:
    - {topic: "s/{device}", format: json}
readings: {event_id: id, event_time: ts}
%s`, dataDir, extra)
	cfg, err := config.Parse("edgeagent.yaml", []byte(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestReloadKeepsFiles: an agent's data files handed on with Detach stay
// open through its Close; an Open with them that fails leaves them open
// for the caller; one that succeeds uses them and closes them.
func TestReloadKeepsFiles(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Logger: slog.New(slog.DiscardHandler), ConfigPath: "edgeagent.yaml"}
	first, err := Open(filesTestConfig(t, dir, ""), opts)
	if err != nil {
		t.Fatal(err)
	}
	files := first.Detach()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	usable := func(when string) error {
		if err := files.Bronze.Append([]buffer.Record{{Kind: buffer.KindMessage, ReceivedAt: time.Now().UnixNano(), Topic: "s/d1", Payload: []byte(`{}`)}}); err != nil {
			return fmt.Errorf("%s: append to Bronze: %w", when, err)
		}
		if err := files.State.Update(func(*bolt.Tx) error { return nil }); err != nil {
			return fmt.Errorf("%s: write the state database: %w", when, err)
		}
		return nil
	}
	if err := usable("after Detach and Close"); err != nil {
		t.Fatal(err)
	}

	opts.Files = files
	if _, err := Open(filesTestConfig(t, dir, "window: {size: 5m}\n"), opts); err == nil {
		t.Fatal("Open with a window size the saved state refuses succeeded")
	}
	if err := usable("after a failed Open"); err != nil {
		t.Fatal(err)
	}

	second, err := Open(filesTestConfig(t, dir, ""), opts)
	if err != nil {
		t.Fatal(err)
	}
	if second.Bronze != files.Bronze || second.State != files.State {
		t.Fatal("Open with Files opened the files again")
	}
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	if err := usable("after the owner's Close"); err == nil {
		t.Fatal("the files stayed open after the agent that owned them closed")
	}
}
