package scenario

import (
	"fmt"
	"path"
	"strings"

	"github.com/edgeagent/edgeagent/config"
)

// AlertRule is one of the agent's alert rules (docs/alerts.md), with the
// keys the agent's config uses. The rig runs every rule with min_interval
// 0s and no storm folding, so each transition is its own local message and
// the transitions are a function of the windows alone, which the truth
// computes.
type AlertRule struct {
	Name    string `yaml:"name"`
	Metric  string `yaml:"metric"`
	Devices string `yaml:"devices"` // glob over device ids; default "*"
	When    string `yaml:"when"`
	// For is how many windows in a row when must hold to fire (default 1).
	For       int    `yaml:"for"`
	ClearWhen string `yaml:"clear_when"` // default: the negation of when
}

// Conditions returns the rule's when and clear_when, parsed with the
// agent's config parser (the conditions' syntax is the config's; what the
// rules do with them the truth states on its own); Validate has checked
// them.
func (r AlertRule) Conditions() (when, clear config.Condition) {
	when, _ = config.ParseCondition(r.When)
	if r.ClearWhen == "" {
		return when, when.Negate()
	}
	clear, _ = config.ParseCondition(r.ClearWhen)
	return when, clear
}

// Matches reports whether the rule watches device's metric.
func (r AlertRule) Matches(device, metric string) bool {
	ok, _ := path.Match(r.Devices, device)
	return ok && metric == r.Metric
}

func (sc *Scenario) setAlertDefaults() {
	for i := range sc.Agent.Alerts {
		r := &sc.Agent.Alerts[i]
		if r.Devices == "" {
			r.Devices = "*"
		}
		if r.For == 0 {
			r.For = 1
		}
	}
}

func (sc *Scenario) validateAlerts(p *problems) {
	names := map[string]bool{}
	for i, r := range sc.Agent.Alerts {
		k := fmt.Sprintf("agent.alerts[%d]", i)
		if r.Name == "" || strings.ContainsAny(r.Name, "/+#") {
			p.add(k+".name", "required, without / + #")
		} else if names[r.Name] {
			p.add(k+".name", "%q used twice", r.Name)
		}
		names[r.Name] = true
		if !sc.hasWindowedMetric(r.Metric) {
			p.add(k+".metric", "%q is not a metric of a json or cbor device group (plain numbers are windowed by arrival, which the truth cannot know)", r.Metric)
		}
		if _, err := path.Match(r.Devices, ""); err != nil {
			p.add(k+".devices", "%q: %v", r.Devices, err)
		}
		if r.For < 1 {
			p.add(k+".for", "at least 1")
		}
		for _, c := range []struct{ key, s string }{{"when", r.When}, {"clear_when", r.ClearWhen}} {
			if c.s == "" && c.key == "clear_when" {
				continue
			}
			cond, err := config.ParseCondition(c.s)
			switch {
			case err != nil:
				p.add(k+"."+c.key, "%s", strings.TrimPrefix(err.Error(), config.ErrCondition.Error()+": "))
			case !contains(sc.Agent.Window.Aggregates, cond.Aggregate):
				p.add(k+"."+c.key, "%q: %q is not in agent.window.aggregates", c.s, cond.Aggregate)
			}
		}
	}
}

func (sc *Scenario) hasWindowedMetric(m string) bool {
	for _, g := range sc.Devices {
		if g.Format != FormatNumber && contains(g.Metrics, m) {
			return true
		}
	}
	return false
}
