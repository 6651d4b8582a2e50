package alert

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"path"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/edgeagent/edgeagent/config"
	"github.com/edgeagent/edgeagent/internal/topic"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// Sentinel errors.
var (
	// ErrInvalidConfig wraps every Config validation failure; the message
	// names the configuration key.
	ErrInvalidConfig = errors.New("alert: invalid config")
	// ErrCorruptState is returned when a stored state row cannot be decoded.
	ErrCorruptState = errors.New("alert: corrupt state")
)

// Defaults applied by New to zero-valued Config fields.
const (
	DefaultStormThreshold = 20
	DefaultExpiry         = 24 * time.Hour
	// summaryDevice stands for {device} in the topic of a storm summary.
	summaryDevice = "_summary"
	// maxSummaryDevices bounds the device list of a summary message.
	maxSummaryDevices = 100
	// localQoS is the QoS of every local message.
	localQoS = 1
)

// Config configures the Engine.
type Config struct {
	// Gateway is gateway_id: the first part of every alert key and the
	// {gateway_id} of local topics.
	Gateway string
	// Rules are the alerts section, as config.Parse leaves it.
	Rules []config.AlertRule
	// LocalPublish is the local_publish section. StormThreshold 0 takes
	// DefaultStormThreshold.
	LocalPublish config.LocalPublish
	// Expiry: the state of a (rule, device) that is not firing and holds
	// nothing back is dropped once its last window is older than this on the
	// logged clock (default 24h; pass window.device_expiry).
	Expiry time.Duration
	// OnLocal, when set, is called after a commit that queued local
	// messages; wire it to (*local.Publisher).Notify.
	OnLocal func()
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// rule is a compiled AlertRule.
type rule struct {
	cfg          config.AlertRule
	name         string
	metric       string
	devices      string
	when, clear  config.Condition
	forN         uint32
	uplink       bool
	local        bool // local action and an alerts topic
	minInterval  int64
	whenString   string
	clearString  string
	severity     string
	retain       bool
	summaryTopic string
}

// matches reports whether the rule watches a.
func (r *rule) matches(a *wire.Aggregate) bool {
	if a.Metric != r.metric {
		return false
	}
	ok, _ := path.Match(r.devices, a.Device)
	return ok
}

// value returns the aggregate c compares; false when the window does not
// carry it (not in window.aggregates) or it is NaN.
func value(a *wire.Aggregate, c config.Condition) (float64, bool) {
	var p *float64
	switch c.Aggregate {
	case "count":
		return float64(a.Count), true
	case "sum":
		p = a.Sum
	case "min":
		p = a.Min
	case "max":
		p = a.Max
	case "mean":
		p = a.Mean
	case "first":
		p = a.First
	case "last":
		p = a.Last
	}
	// NaN compares false with everything. An infinity (a sum or mean past
	// float64's range, from readings that large) compares as one: such
	// readings are above any threshold.
	if p == nil || math.IsNaN(*p) {
		return 0, false
	}
	return *p, true
}

// holds reports whether c holds for window a.
func holds(a *wire.Aggregate, c config.Condition) bool {
	v, ok := value(a, c)
	return ok && c.Holds(v)
}

// compile validates cfg (after defaults) and compiles its rules.
func (c *Config) compile() ([]*rule, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...)
	}
	if c.Gateway == "" {
		return nil, bad("gateway_id is empty")
	}
	if c.LocalPublish.StormThreshold < 0 {
		return nil, bad("local_publish.storm_threshold %d is negative", c.LocalPublish.StormThreshold)
	}
	if c.Expiry < 0 {
		return nil, bad("expiry %v is negative", c.Expiry)
	}
	if err := checkTopic("local_publish.alerts_topic", c.LocalPublish.AlertsTopic, "gateway_id", "device"); err != nil {
		return nil, err
	}
	if err := checkTopic("local_publish.aggregates_topic", c.LocalPublish.AggregatesTopic, "gateway_id", "device", "metric"); err != nil {
		return nil, err
	}
	var rules []*rule
	seen := map[string]bool{}
	for i, rc := range c.Rules {
		key := fmt.Sprintf("alerts[%d]", i)
		if rc.Name == "" {
			return nil, bad("%s.name is empty", key)
		}
		if seen[rc.Name] {
			return nil, bad("%s.name %q is used twice", key, rc.Name)
		}
		seen[rc.Name] = true
		if rc.Metric == "" {
			return nil, bad("%s.metric is empty", key)
		}
		devices := rc.Devices
		if devices == "" {
			devices = "*"
		}
		if _, err := path.Match(devices, ""); err != nil {
			return nil, bad("%s.devices %q is not a valid glob", key, devices)
		}
		when, err := rc.WhenCondition()
		if err != nil {
			return nil, bad("%s.when: %v", key, err)
		}
		clear, err := rc.ClearCondition()
		if err != nil {
			return nil, bad("%s.clear_when: %v", key, err)
		}
		forN := rc.For
		if forN == 0 {
			forN = 1
		}
		if forN < 0 {
			return nil, bad("%s.for %d is negative", key, rc.For)
		}
		if rc.MinInterval < 0 {
			return nil, bad("%s.min_interval %v is negative", key, rc.MinInterval)
		}
		r := &rule{
			cfg: rc, name: rc.Name, metric: rc.Metric, devices: devices,
			when: when, clear: clear, forN: uint32(forN),
			minInterval: rc.MinInterval.Duration().Milliseconds(),
			whenString:  when.String(), clearString: clear.String(),
			severity: rc.Severity, retain: rc.Retain,
		}
		actions := rc.Actions
		if actions == nil {
			actions = []string{"uplink"}
		}
		for _, a := range actions {
			switch a {
			case "uplink":
				r.uplink = true
			case "local":
				if c.LocalPublish.AlertsTopic == "" {
					return nil, bad("%s.actions: local needs local_publish.alerts_topic", key)
				}
				r.local = true
			default:
				return nil, bad("%s.actions: unknown action %q (want uplink or local)", key, a)
			}
		}
		if r.local {
			r.summaryTopic = topic.Expand(c.LocalPublish.AlertsTopic, map[string]string{"gateway_id": c.Gateway, "device": summaryDevice})
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// checkTopic checks an output topic template: only the allowed
// placeholders, and no wildcard once expanded ("" is allowed: off).
func checkTopic(key, s string, allowed ...string) error {
	if s == "" {
		return nil
	}
	vals := map[string]string{}
	for _, a := range allowed {
		vals[a] = "x"
	}
	exp := topic.Expand(s, vals)
	switch {
	case strings.ContainsAny(exp, "{}"):
		return fmt.Errorf("%w: %s %q: unknown placeholder (allowed: %s)", ErrInvalidConfig, key, s, strings.Join(allowed, ", "))
	case strings.ContainsAny(exp, "+#\x00") || strings.HasPrefix(exp, "$"):
		return fmt.Errorf("%w: %s %q: not a topic to publish to (wildcard, NUL or leading $)", ErrInvalidConfig, key, s)
	}
	return nil
}

// outTopic is an output topic template compiled once: literal text and
// placeholders, expanded in one pass (a value that contains a placeholder
// stays literal, as with topic.Expand) without building a replacer per
// message.
type outTopic []topicPart

type topicPart struct {
	lit string
	ph  string // "device" or "metric" when not a literal
}

// compileTopic splits s at {device} and {metric}, with {gateway_id]
// replaced by gateway first.
func compileTopic(s, gateway string) outTopic {
	var t outTopic
	for s != "" {
		i := strings.IndexByte(s, '{')
		if i < 0 {
			t = append(t, topicPart{lit: s})
			break
		}
		matched := false
		for _, ph := range []string{"gateway_id", "device", "metric"} {
			if strings.HasPrefix(s[i:], "{"+ph+"}") {
				t = append(t, topicPart{lit: s[:i]})
				if ph == "gateway_id" {
					t = append(t, topicPart{lit: gateway})
				} else {
					t = append(t, topicPart{ph: ph})
				}
				s = s[i+len(ph)+2:]
				matched = true
				break
			}
		}
		if !matched {
			t = append(t, topicPart{lit: s[:i+1]})
			s = s[i+1:]
		}
	}
	return t
}

// topicLevel makes a device or metric name one valid topic level: a
// metric is a payload key, and one holding '+' or '#' made a topic the
// broker refuses — retried for ever, holding every local message behind
// it — and one holding '/' added levels. Those bytes, '%' (so the escape
// reads back) and what MQTT lets a broker treat as a malformed packet
// (mosquitto drops the connection) are percent-encoded, byte by byte:
// invalid UTF-8, control characters (U+0000–U+001F, U+007F–U+009F) and
// noncharacters (U+FDD0–U+FDEF, U+FFFE and U+FFFF of every plane).
func topicLevel(s string) string {
	var b strings.Builder
	done := 0 // s[:done] is in b
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if badInTopic(r, n) {
			b.WriteString(s[done:i])
			for _, c := range []byte(s[i : i+n]) {
				fmt.Fprintf(&b, "%%%02X", c)
			}
			done = i + n
		}
		i += n
	}
	if done == 0 {
		return s
	}
	b.WriteString(s[done:])
	return b.String()
}

// badInTopic says whether the rune r, n bytes of a name, must be encoded
// in a topic level (see topicLevel).
func badInTopic(r rune, n int) bool {
	switch {
	case r == utf8.RuneError && n == 1:
		return true
	case r == '/' || r == '+' || r == '#' || r == '%':
		return true
	case r < 0x20 || r >= 0x7F && r <= 0x9F:
		return true
	case r >= 0xFDD0 && r <= 0xFDEF || r&0xFFFE == 0xFFFE:
		return true
	}
	return false
}

func (t outTopic) expand(device, metric string) string {
	var b strings.Builder
	for _, p := range t {
		switch p.ph {
		case "device":
			b.WriteString(topicLevel(device))
		case "metric":
			b.WriteString(topicLevel(metric))
		default:
			b.WriteString(p.lit)
		}
	}
	return b.String()
}
