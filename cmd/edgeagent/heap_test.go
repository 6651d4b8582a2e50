package main

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgeagent/edgeagent/testrig/mqtttest"
)

// metricValue returns the value of the unlabelled sample name in a
// Prometheus exposition.
func metricValue(t *testing.T, exposition, name string) float64 {
	t.Helper()
	for line := range strings.SplitSeq(exposition, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics lacks %s", name)
	return 0
}

// processing.heap_pacing end to end, as an operator sees it on /metrics
// (go_memlimit_bytes): on, the agent sets Go's memory limit below the
// GOMEMLIMIT it was started with once the collector has run; off, the
// limit stays GOMEMLIMIT's through collections.
func TestHeapPacingSetsTheMemoryLimit(t *testing.T) {
	const gomemlimit = 1 << 30
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("heap_pacing=%v", on), func(t *testing.T) {
			dir := t.TempDir()
			statusAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
			brokerAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
			cfg := writeConfig(t, dir, embeddedAgentConfig("heap-gw", dir, brokerAddr)+fmt.Sprintf(`
status: {listen: "%s"}
processing: {heap_pacing: %v}
`, statusAddr, on))
			// A low GOGC makes the scrapes' own garbage trigger collections.
			p := startAgentEnv(t, []string{"GOMEMLIMIT=1GiB", "GOGC=10"}, "run", "-c", cfg)
			p.waitLog(t, "status endpoint listening")
			scrape := func() string { return httpGet(t, "http://"+statusAddr+"/metrics", 200) }
			m := scrape()
			startGC := metricValue(t, m, "go_gc_duration_seconds_count")
			if on {
				mqtttest.WaitFor(t, 30*time.Second, "a memory limit below GOMEMLIMIT", func() bool {
					return metricValue(t, scrape(), "go_memlimit_bytes") < gomemlimit
				})
			} else {
				mqtttest.WaitFor(t, 30*time.Second, "three collections", func() bool {
					m = scrape()
					return metricValue(t, m, "go_gc_duration_seconds_count") >= startGC+3
				})
				if got := metricValue(t, m, "go_memlimit_bytes"); got != gomemlimit {
					t.Fatalf("go_memlimit_bytes %g with heap_pacing off, want GOMEMLIMIT's %d", got, gomemlimit)
				}
			}
			p.stop(t)
		})
	}
}

// A release build samples no heap profile: once the agent has allocated
// several times the default sampling interval (512 KiB), the runtime
// still has no table of profiling buckets (go_memstats_buck_hash_sys_bytes
// a few kilobytes, where the table alone is 1.4 MB; see memprofile.go).
func TestNoHeapProfileSampling(t *testing.T) {
	dir := t.TempDir()
	statusAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	brokerAddr := fmt.Sprintf("127.0.0.1:%d", mqtttest.FreePort(t))
	cfg := writeConfig(t, dir, embeddedAgentConfig("memprofile-gw", dir, brokerAddr)+fmt.Sprintf(`
status: {listen: "%s"}
`, statusAddr))
	p := startAgent(t, "run", "-c", cfg)
	p.waitLog(t, "status endpoint listening")
	var m string
	mqtttest.WaitFor(t, 60*time.Second, "8 MiB allocated, scrape after scrape", func() bool {
		m = httpGet(t, "http://"+statusAddr+"/metrics", 200)
		return metricValue(t, m, "go_memstats_alloc_bytes_total") > 8<<20
	})
	if got := metricValue(t, m, "go_memstats_buck_hash_sys_bytes"); got > 64<<10 {
		t.Fatalf("go_memstats_buck_hash_sys_bytes %g after %g bytes allocated: the heap profile is sampled", got, metricValue(t, m, "go_memstats_alloc_bytes_total"))
	}
	p.stop(t)
}
