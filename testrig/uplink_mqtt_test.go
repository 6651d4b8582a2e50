package testrig_test

import (
	"strings"
	"testing"

	"github.com/edgeagent/edgeagent/testrig/rig"
	"github.com/edgeagent/edgeagent/testrig/scenario"
)

// TestMQTTUplink runs scenarios with the agent's uplink on an MQTT broker
// of its own (--uplink mqtt): steady must pass as over NATS; link-outage
// cuts, blackholes and drops the acks of the uplink through the proxy in
// front of that broker, and skips its NATS restart, saying so.
//
// With -short only steady runs.
func TestMQTTUplink(t *testing.T) {
	for _, name := range []string{"steady", "link-outage"} {
		t.Run(name, func(t *testing.T) {
			if testing.Short() && name != "steady" {
				t.Skip("-short: steady only")
			}
			t.Parallel()
			rep, table := runShort(t, name, rig.Options{Uplink: rig.UplinkMQTT})
			if !rep.OK() || rep.Result.Windows.Correct == 0 || rep.Result.Delivery.Bytes == 0 {
				t.Fatalf("verdict %s: %v", rep.Verdict, rep.Failures)
			}
			if !strings.Contains(table, "uplink over MQTT") {
				t.Fatal("the report does not say the uplink was MQTT")
			}
			for _, f := range rep.Faults {
				if (f.Kind == scenario.FaultNATSRestart) != (f.Skipped != "") {
					t.Errorf("fault %s: skipped %q; only nats_restart is skipped on the MQTT uplink", f.Kind, f.Skipped)
				}
			}
		})
	}
}
