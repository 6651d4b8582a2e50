package rig

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/edgeagent/edgeagent/testrig/agentproc"
	"github.com/edgeagent/edgeagent/testrig/verify"
)

// Verdicts.
const (
	Pass = "PASS"
	Fail = "FAIL"
)

// Report is the outcome of a run, machine-readable as JSON.
type Report struct {
	Mode        string `json:"mode"` // run, demo
	Scenario    string `json:"scenario"`
	Description string `json:"description,omitempty"`
	Short       bool   `json:"short"`
	Verdict     string `json:"verdict"`
	// Interrupted is true when the run was stopped early (Ctrl-C): the
	// verdict is then FAIL and the report covers what had arrived.
	Interrupted bool `json:"interrupted"`
	// Failures says, one line each, why the verdict is FAIL.
	Failures []string `json:"failures,omitempty"`
	// Notes are things worth knowing that are not failures.
	Notes []string `json:"notes,omitempty"`
	// RunDir is the run directory, "" when it was a temporary one
	// removed after a pass.
	RunDir string `json:"run_dir"`
	Broker string `json:"broker"`
	// Uplink says what carried the agent's uplink to the verifier.
	Uplink string `json:"uplink,omitempty"`

	PublishSeconds float64 `json:"publish_s"`
	SettleSeconds  float64 `json:"settle_s"`
	TotalSeconds   float64 `json:"total_s"`

	Plan      PlanSummary      `json:"plan"`
	Publisher PublisherSummary `json:"publisher"`
	Result    *verify.Result   `json:"result"`
	Counters  Counters         `json:"counters"`
	// Tables compares the late and dead-letter tables' rows with the
	// truth's, read from the state database after the agent stopped.
	Tables *Tables `json:"tables,omitempty"`
	// Alerts compares the local alert transitions with the truth's, for a
	// scenario with alert rules.
	Alerts *AlertResult `json:"alerts,omitempty"`
	Faults []FaultEvent `json:"faults,omitempty"`
	Agent  AgentSummary `json:"agent"`
	// BrokerDropped counts messages the in-process broker dropped.
	BrokerDropped uint64 `json:"broker_dropped"`
}

// PlanSummary counts what the simulator sent.
type PlanSummary struct {
	Devices int `json:"devices"`
	// Messages is everything sent; Readings the valid readings (retries
	// not counted); Retries producer retries; Dead the messages the agent
	// must dead-letter.
	Messages int `json:"messages"`
	Readings int `json:"readings"`
	Retries  int `json:"retries"`
	Dead     int `json:"dead_letters"`
}

// PublisherSummary is what the publisher did.
type PublisherSummary struct {
	Published   uint64 `json:"published"`
	Acked       uint64 `json:"acked"`
	Republished uint64 `json:"republished"`
	Unacked     int64  `json:"unacked"`
}

// Counters compares the agent's counters with the truth. Observed values
// come from /status.json and are absent when it is unavailable.
type Counters struct {
	Source string `json:"source"`
	// Mode is exact, or at-least-once when a fault may make the broker
	// deliver a message twice (observed may then exceed expected).
	Mode        string  `json:"mode"`
	Late        Counter `json:"late"`
	Duplicates  Counter `json:"duplicates"`
	DeadLetters Counter `json:"dead_letters"`
}

// Counter is one expected/observed pair.
type Counter struct {
	Expected uint64  `json:"expected"`
	Observed *uint64 `json:"observed,omitempty"`
}

func (c Counter) ok(atLeastOnce bool) bool {
	if c.Observed == nil {
		return true
	}
	if atLeastOnce {
		return *c.Observed >= c.Expected
	}
	return *c.Observed == c.Expected
}

func (c Counter) String() string {
	if c.Observed == nil {
		return fmt.Sprintf("n/a (expected %d)", c.Expected)
	}
	return fmt.Sprintf("%d/%d", *c.Observed, c.Expected)
}

// AgentSummary is the agent process over the run.
type AgentSummary struct {
	Starts int              `json:"starts"`
	Exits  []agentproc.Exit `json:"exits,omitempty"`
	// UnexpectedExits counts exits the rig did not cause, outside disk-full spans.
	UnexpectedExits int             `json:"unexpected_exits"`
	FinalExitCode   int             `json:"final_exit_code"`
	Usage           agentproc.Usage `json:"usage"`
	Log             string          `json:"log"`
}

// OK reports whether the verdict is PASS.
func (r *Report) OK() bool { return r.Verdict == Pass }

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error { return writeIndentedJSON(w, "report", r) }

// writeIndentedJSON writes v, one of the rig's reports (what names it),
// as indented JSON.
func writeIndentedJSON(w io.Writer, what string, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("rig: write %s: %w", what, err)
	}
	return nil
}

// WriteTable writes the short human summary.
func (r *Report) WriteTable(w io.Writer) {
	short := ""
	if r.Short {
		short = " (short)"
	}
	name := r.Mode
	if r.Scenario != "" {
		name += " " + r.Scenario
	}
	interrupted := ""
	if r.Interrupted {
		interrupted = " (interrupted: a partial report)"
	}
	fmt.Fprintf(w, "edgerig %s%s: %s%s\n", name, short, r.Verdict, interrupted)
	via := r.Broker
	if r.Uplink != "" {
		via += ", uplink over " + r.Uplink
	}
	fmt.Fprintf(w, "  run        %d devices, %s messages (%s readings, %s retries, %s to dead-letter) via %s; %.1fs publishing, %.1fs settling\n",
		r.Plan.Devices, num(r.Plan.Messages), num(r.Plan.Readings), num(r.Plan.Retries), num(r.Plan.Dead), via, r.PublishSeconds, r.SettleSeconds)
	if len(r.Faults) > 0 {
		var parts []string
		for _, f := range r.Faults {
			s := fmt.Sprintf("%.1fs %s", f.AtSeconds, f.Kind)
			switch {
			case f.Skipped != "":
				s += " (skipped)"
			case f.Error != "":
				s += " (error)"
			}
			parts = append(parts, s)
		}
		fmt.Fprintf(w, "  faults     %s\n", strings.Join(parts, ", "))
	}
	if res := r.Result; res != nil {
		wc := res.Windows
		fmt.Fprintf(w, "  windows    expected %s  received %s  correct %s  wrong %d  missing %d  extra %d  (revised %d: sent again with a new value; at least %d expected)\n",
			num(wc.Expected), num(wc.Received), num(wc.Correct), wc.Wrong, wc.Missing, wc.Extra, wc.Revised, wc.RevisionsExpected)
		if wc.Overcounted > 0 {
			// Waiting cannot mend a window with more readings than were
			// sent, so the rig stops waiting: windows the agent had not
			// closed yet then count as missing too.
			fmt.Fprintf(w, "             %d of the wrong windows hold more readings than were sent, so the rig stopped waiting at once: some of the missing may only have been still open\n", wc.Overcounted)
		}
		if p := res.PTime; p.Expected > 0 || p.Extra > 0 {
			fmt.Fprintf(w, "  ptime      series expected %d  correct %d  wrong %d  missing %d  extra %d  (plain numbers without timestamps, as totals, %s)\n",
				p.Expected, p.Correct, p.Wrong, p.Missing, p.Extra, p.Mode)
		}
		d := res.Delivery
		fmt.Fprintf(w, "  delivery   %s messages, %s, %s aggregates; before upsert %d duplicate aggregates, %d duplicate batches, %d key conflicts\n",
			num(int(d.Messages)), bytesStr(int64(d.Bytes)), num(int(d.Aggregates)), d.DuplicateAggregates, d.DuplicateBatches, d.KeyConflicts)
		if l := res.Latency; l.Windows > 0 {
			fmt.Fprintf(w, "  latency    publish→window p50 %s  p99 %s  max %s over %s windows\n",
				ms(l.P50Ms), ms(l.P99Ms), ms(l.MaxMs), num(l.Windows))
		}
	}
	if a := r.Alerts; a != nil {
		fmt.Fprintf(w, "  alerts     transitions expected %d  received %d  correct %d  missing %d  extra %d  (%d delivered again, %d keys with two contents)\n",
			a.Expected, a.Received, a.Correct, a.Missing, a.Extra, a.Duplicates, a.Conflicts)
	}
	c := r.Counters
	fmt.Fprintf(w, "  counters   late %s  duplicates %s  dead letters %s  (observed/expected, %s, %s)\n",
		c.Late, c.Duplicates, c.DeadLetters, c.Source, c.Mode)
	if t := r.Tables; t != nil {
		fmt.Fprintf(w, "  tables     late %d rows of %d expected (%d missing, %d unexpected)  dead letters %d rows of %d (%d missing, %d unexpected)\n",
			t.Late.Rows, t.Late.Expected, t.Late.Missing, t.Late.Unexpected, t.DeadLetters.Rows, t.DeadLetters.Expected, t.DeadLetters.Missing, t.DeadLetters.Unexpected)
	}
	a := r.Agent
	fmt.Fprintf(w, "  agent      %d starts, %d unexpected exits, final exit %d, CPU %.1fs, peak RSS %s\n",
		a.Starts, a.UnexpectedExits, a.FinalExitCode, a.Usage.CPUSeconds, bytesStr(a.Usage.PeakRSSBytes))
	for _, f := range r.Faults {
		if f.Skipped != "" {
			fmt.Fprintf(w, "  skipped    %s: %s\n", f.Kind, f.Skipped)
		}
		if f.Error != "" {
			fmt.Fprintf(w, "  error      %s: %s\n", f.Kind, f.Error)
		}
	}
	seen := map[string]bool{}
	for _, f := range r.Faults {
		if f.Note != "" && !seen[f.Kind+f.Note] {
			seen[f.Kind+f.Note] = true
			fmt.Fprintf(w, "  note       %s: %s\n", f.Kind, f.Note)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  note       %s\n", n)
	}
	for _, f := range r.Failures {
		fmt.Fprintf(w, "  FAILURE    %s\n", f)
	}
	if r.Result != nil {
		for _, p := range r.Result.Problems {
			fmt.Fprintf(w, "    %s\n", p)
		}
	}
	if !r.OK() {
		fmt.Fprintf(w, "  kept       %s (agent log: %s)\n", r.RunDir, r.Agent.Log)
	}
}

// num groups thousands: 12,345.
func num(n int) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func bytesStr(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func ms(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%.2fs", v/1000)
	}
	return fmt.Sprintf("%.0fms", v)
}
