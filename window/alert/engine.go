package alert

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/uplink/local"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// expiryCheck is how often, on the logged clock, quiet states are looked
// for; a crossing of a multiple of it is a deterministic point.
const expiryCheck = time.Hour

// skey names one (rule, device).
type skey struct {
	rule   int
	device string
}

// counters are the Stats counters one transaction adds when it commits.
type counters struct {
	fired, cleared, suppressed, summaries, folded, ignored uint64
	// local is the net change of queued local rows (a storm deletes some);
	// queued is set when any was appended.
	local  int64
	queued bool
}

// Engine evaluates alert rules on every emitted window. It implements
// window.Observer; see the package documentation for the semantics.
//
// Emitted must be called from one goroutine at a time (the window stage's);
// Stats may be called from any.
type Engine struct {
	cfg       Config
	rules     []*rule
	byName    map[string]int
	log       *slog.Logger
	threshold uint32
	// stormWindow is local_publish.storm_window in ms.
	stormWindow int64
	expiry      int64 // ms
	// alertTopic and aggTopic are the compiled local topics; aggTopic is
	// nil when aggregates are not republished.
	alertTopic, aggTopic outTopic

	mu      sync.Mutex
	states  map[skey]*state
	pending map[skey]struct{}
	minDue  int64 // no pending transition is due before this logged time
	clock   int64 // highest emittedAtMs seen
	groups  []*group
	firing  []int
	// cur is the transaction of the last Emitted call; curDone is set when
	// it committed. Emitted with another transaction while curDone is false
	// means cur rolled back, and the in-memory state is reloaded.
	cur     *bolt.Tx
	curDone bool
	txc     *counters

	statsMu sync.Mutex
	stats   Stats
}

// Stats is a snapshot of the engine.
type Stats struct {
	// Rules is the number of configured rules; States the (rule, device)
	// pairs tracked.
	Rules, States int
	// Firing is the number of (rule, device) pairs whose last transition
	// sent was fired; FiringByRule splits it by rule name.
	Firing       int
	FiringByRule map[string]int
	// Pending is the number of pairs with a transition held back by
	// min_interval.
	Pending int
	// Fired and Cleared count transitions sent since start; Suppressed the
	// changes held back by min_interval.
	Fired, Cleared, Suppressed uint64
	// Summaries counts the summary messages queued for storms (a summary
	// replaced the local messages of a rule's storm, a later part its
	// rest); LocalFolded the local alert messages that summaries replaced.
	Summaries, LocalFolded uint64
	// LocalMessages counts rows queued for the local broker (alerts,
	// summaries, aggregates), less the ones a storm summary replaced.
	LocalMessages uint64
	// IgnoredRevisions counts windows older than the latest evaluated one
	// of their (rule, device).
	IgnoredRevisions uint64
}

// Validate reports what New would refuse in cfg's rules.
func (cfg Config) Validate() error {
	_, err := cfg.compile()
	return err
}

// New validates cfg, creates the engine's buckets (and the outbox's), drops
// the state of rules that are no longer configured and of devices a rule no
// longer matches, and loads the rest.
func New(db *bolt.DB, cfg Config) (*Engine, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.LocalPublish.StormThreshold == 0 {
		cfg.LocalPublish.StormThreshold = DefaultStormThreshold
	}
	if cfg.Expiry == 0 {
		cfg.Expiry = DefaultExpiry
	}
	rules, err := cfg.compile()
	if err != nil {
		return nil, err
	}
	e := &Engine{
		cfg: cfg, rules: rules, log: cfg.Logger, byName: map[string]int{},
		threshold: uint32(cfg.LocalPublish.StormThreshold),
		// 0: only transitions at the same instant form a storm.
		stormWindow: time.Duration(cfg.LocalPublish.StormWindow).Milliseconds(),
		expiry:      cfg.Expiry.Milliseconds(),
	}
	for i, r := range rules {
		e.byName[r.name] = i
	}
	e.alertTopic = compileTopic(cfg.LocalPublish.AlertsTopic, cfg.Gateway)
	if cfg.LocalPublish.AggregatesTopic != "" {
		e.aggTopic = compileTopic(cfg.LocalPublish.AggregatesTopic, cfg.Gateway)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if err := outbox.Init(tx); err != nil {
			return err
		}
		for _, name := range buckets {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return fmt.Errorf("create bucket %s: %w", name, err)
			}
		}
		if err := e.prune(tx); err != nil {
			return err
		}
		return e.load(tx)
	})
	if err != nil {
		return nil, fmt.Errorf("alert: open state: %w", err)
	}
	e.publish(&counters{})
	return e, nil
}

// Local reports whether the engine queues local messages at all, that is
// whether a local.Publisher must run.
func (e *Engine) Local() bool {
	if e.cfg.LocalPublish.AggregatesTopic != "" {
		return true
	}
	return slices.ContainsFunc(e.rules, func(r *rule) bool { return r.local })
}

// prune deletes what the configuration no longer asks for: states of
// removed rules or of devices outside a rule's glob, and storm rows of
// removed rules. They are dropped without a cleared transition.
func (e *Engine) prune(tx *bolt.Tx) error {
	var drop [][]byte
	b := tx.Bucket(bucketState)
	err := b.ForEach(func(k, _ []byte) error {
		name, dev, err := parseStateKey(k)
		if err != nil {
			return err
		}
		i, ok := e.byName[name]
		if !ok {
			drop = append(drop, k)
		} else if m, _ := path.Match(e.rules[i].devices, dev); !m {
			drop = append(drop, k)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("scan alert state: %w", err)
	}
	sb := tx.Bucket(bucketStorm)
	err = sb.ForEach(func(k, _ []byte) error {
		if _, ok := e.byName[string(k)]; !ok {
			drop = append(drop, append([]byte{0}, k...)) // marked: storm row
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("scan alert storms: %w", err)
	}
	if len(drop) > 0 {
		e.log.Info("alert: dropping the state of removed rules or unmatched devices", "rows", len(drop))
	}
	for _, k := range drop {
		var err error
		if len(k) > 0 && k[0] == 0 {
			err = sb.Delete(k[1:])
		} else {
			err = b.Delete(k)
		}
		if err != nil {
			return fmt.Errorf("drop alert row %x: %w", k, err)
		}
	}
	return nil
}

// load replaces the in-memory state with the one stored in tx.
func (e *Engine) load(tx *bolt.Tx) error {
	e.states = map[skey]*state{}
	e.pending = map[skey]struct{}{}
	e.minDue = math.MaxInt64
	e.groups = make([]*group, len(e.rules))
	e.firing = make([]int, len(e.rules))
	e.clock = 0
	b := tx.Bucket(bucketState)
	if b == nil {
		return fmt.Errorf("alert: bucket %s missing", bucketState)
	}
	err := b.ForEach(func(k, v []byte) error {
		name, dev, err := parseStateKey(k)
		if err != nil {
			return err
		}
		i, ok := e.byName[name]
		if !ok {
			return nil
		}
		s, err := decodeState(v)
		if err != nil {
			return fmt.Errorf("%s/%s: %w", name, dev, err)
		}
		k2 := skey{i, dev}
		e.states[k2] = s
		if s.firing {
			e.firing[i]++
		}
		e.track(k2, s)
		return nil
	})
	if err != nil {
		return fmt.Errorf("load alert state: %w", err)
	}
	err = tx.Bucket(bucketStorm).ForEach(func(k, v []byte) error {
		i, ok := e.byName[string(k)]
		if !ok {
			return nil
		}
		g, err := decodeGroup(v)
		if err != nil {
			return fmt.Errorf("storm %s: %w", k, err)
		}
		e.groups[i] = g
		return nil
	})
	if err != nil {
		return fmt.Errorf("load alert storms: %w", err)
	}
	if v := tx.Bucket(bucketMeta).Get(keyClock); v != nil {
		d := decoder{b: v}
		e.clock = d.varint()
		if d.err != nil {
			return fmt.Errorf("%w: clock", ErrCorruptState)
		}
	}
	return nil
}

// Emitted evaluates every rule watching a, an aggregate the window stage
// emitted at logged time emittedAtMs, and queues the resulting transitions
// and local messages in tx, together with the engine's state. It
// implements window.Observer. If tx does not commit, the engine reloads
// its state from the database at the next call.
func (e *Engine) Emitted(tx *bolt.Tx, a *wire.Aggregate, emittedAtMs int64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.begin(tx); err != nil {
		return err
	}
	if err := e.advance(tx, emittedAtMs); err != nil {
		return err
	}
	if err := e.sweep(tx, emittedAtMs); err != nil {
		return err
	}
	if err := e.releaseEnded(tx); err != nil {
		return err
	}
	if e.aggTopic != nil {
		payload, err := marshal(AggregateMessageOf(e.cfg.Gateway, a))
		if err != nil {
			return err
		}
		m := local.Message{Topic: e.aggTopic.expand(a.Device, a.Metric), Payload: payload, QoS: localQoS}
		if _, err := e.appendLocal(tx, m, emittedAtMs); err != nil {
			return fmt.Errorf("alert: republish %s: %w", a.Key, err)
		}
	}
	for i, r := range e.rules {
		if !r.matches(a) {
			continue
		}
		if err := e.evaluate(tx, i, a, emittedAtMs); err != nil {
			return fmt.Errorf("alert: rule %s on %s: %w", r.name, a.Key, err)
		}
	}
	return nil
}

// begin notices a new transaction, reloading the state if the previous one
// did not commit.
func (e *Engine) begin(tx *bolt.Tx) error {
	if tx == e.cur {
		return nil
	}
	if e.cur != nil && !e.curDone {
		if err := e.load(tx); err != nil {
			return fmt.Errorf("alert: reload after a rolled back batch: %w", err)
		}
	}
	e.cur, e.curDone = tx, false
	// What earlier transactions queued is committed, and the local
	// publisher may be sending it: a storm never touches those rows again.
	for _, g := range e.groups {
		if g != nil {
			g.seqs, g.summaryInTx = nil, false
		}
	}
	c := &counters{}
	e.txc = c
	tx.OnCommit(func() { e.committed(tx, c) })
	return nil
}

// committed runs after tx committed (bbolt's OnCommit, outside its locks).
func (e *Engine) committed(tx *bolt.Tx, c *counters) {
	e.mu.Lock()
	if e.cur == tx {
		e.curDone = true
	}
	e.mu.Unlock()
	e.publish(c)
	if c.queued && e.cfg.OnLocal != nil {
		e.cfg.OnLocal()
	}
}

// publish adds c to the counters and refreshes the snapshot.
func (e *Engine) publish(c *counters) {
	e.mu.Lock()
	byRule := make(map[string]int, len(e.rules))
	firing := 0
	for i, r := range e.rules {
		byRule[r.name] = e.firing[i]
		firing += e.firing[i]
	}
	states, pending := len(e.states), len(e.pending)
	e.mu.Unlock()
	e.statsMu.Lock()
	defer e.statsMu.Unlock()
	st := &e.stats
	st.Rules, st.States, st.Pending = len(e.rules), states, pending
	st.Firing, st.FiringByRule = firing, byRule
	st.Fired += c.fired
	st.Cleared += c.cleared
	st.Suppressed += c.suppressed
	st.Summaries += c.summaries
	st.LocalFolded += c.folded
	st.LocalMessages = uint64(int64(st.LocalMessages) + c.local)
	st.IgnoredRevisions += c.ignored
}

// Stats returns a snapshot as of the last commit; it is safe to call from
// any goroutine.
func (e *Engine) Stats() Stats {
	e.statsMu.Lock()
	defer e.statsMu.Unlock()
	st := e.stats
	st.FiringByRule = make(map[string]int, len(e.stats.FiringByRule))
	for k, v := range e.stats.FiringByRule {
		st.FiringByRule[k] = v
	}
	return st
}

// advance moves the engine's logged clock forward and, when it crosses an
// expiry check point, drops quiet states.
func (e *Engine) advance(tx *bolt.Tx, at int64) error {
	if at <= e.clock {
		return nil
	}
	old := e.clock
	e.clock = at
	if err := tx.Bucket(bucketMeta).Put(keyClock, appendVarint(nil, at)); err != nil {
		return fmt.Errorf("alert: put clock: %w", err)
	}
	step := min(e.expiry, expiryCheck.Milliseconds())
	if step > 0 && old/step != at/step {
		return e.expire(tx)
	}
	return nil
}

// expire drops states that carry no information: not firing, nothing held
// back, no streak, and evaluated last more than Expiry ago (and past the
// rate limit, so dropping cannot let a transition through early).
func (e *Engine) expire(tx *bolt.Tx) error {
	b := tx.Bucket(bucketState)
	var drop []skey
	for k, s := range e.states {
		r := e.rules[k.rule]
		if s.quiet() && e.clock-s.lastAt >= e.expiry && (!s.hasTrans || e.clock-s.transAt >= r.minInterval) {
			drop = append(drop, k)
		}
	}
	for _, k := range drop {
		if err := b.Delete(stateKey(e.rules[k.rule].name, k.device)); err != nil {
			return fmt.Errorf("alert: expire %s/%s: %w", e.rules[k.rule].name, k.device, err)
		}
		delete(e.states, k)
	}
	return nil
}

// due is the logged time from which s's held-back transition may be sent
// by a sweep. A transition already sent at s's latest window start blocks
// the sweep: the next window sends it (one transition per window start
// keeps keys unique).
func (e *Engine) due(k skey, s *state) int64 {
	if !s.hasTrans {
		return math.MinInt64
	}
	if s.transStart == s.lastStart {
		return math.MaxInt64
	}
	return s.transAt + e.rules[k.rule].minInterval
}

// track keeps the pending set in step with s.
func (e *Engine) track(k skey, s *state) {
	if !s.pending() {
		delete(e.pending, k)
		return
	}
	e.pending[k] = struct{}{}
	e.minDue = min(e.minDue, e.due(k, s))
}

// sweep sends the held-back transitions whose interval has passed, in
// (rule, device) order, keyed with each one's latest window.
func (e *Engine) sweep(tx *bolt.Tx, at int64) error {
	if len(e.pending) == 0 || e.clock < e.minDue {
		return nil
	}
	var due []skey
	next := int64(math.MaxInt64)
	for k := range e.pending {
		if d := e.due(k, e.states[k]); d <= e.clock {
			due = append(due, k)
		} else {
			next = min(next, d)
		}
	}
	e.minDue = next
	// sort.Slice rather than slices.SortFunc: a generic sort of a struct
	// type adds about 10 KB of code to the binary (its 10 MiB budget,
	// docs/performance.md), and this list is short and rare.
	sort.Slice(due, func(i, j int) bool {
		return cmp.Or(cmp.Compare(due[i].rule, due[j].rule), strings.Compare(due[i].device, due[j].device)) < 0
	})
	for _, k := range due {
		s := e.states[k]
		sup := s.suppressed
		if sup > 0 {
			sup-- // the change being sent was counted when it was held back
		}
		if err := e.transition(tx, k, s, s.lastStart, s.lastEnd, s.value, sup, at); err != nil {
			return fmt.Errorf("alert: send held-back %s/%s: %w", e.rules[k.rule].name, k.device, err)
		}
		e.track(k, s)
		if err := e.putState(tx, k, s); err != nil {
			return err
		}
	}
	return nil
}

// evaluate applies one window to one (rule, device).
func (e *Engine) evaluate(tx *bolt.Tx, ri int, a *wire.Aggregate, at int64) error {
	r := e.rules[ri]
	k := skey{ri, a.Device}
	s := e.states[k]
	fresh := s == nil
	if fresh {
		s = &state{}
	}
	if s.evaluated && a.Start < s.lastStart {
		e.txc.ignored++
		return nil
	}
	revision := s.evaluated && a.Start == s.lastStart
	want, streak := s.want, s.streak
	if revision {
		want, streak = s.baseWant, s.baseStreak
	}
	cond := r.when
	if want {
		cond = r.clear
	}
	v, ok := value(a, cond)
	if !ok {
		return nil // the window lacks the aggregate: not evaluated
	}
	if fresh {
		e.states[k] = s
	}
	prev := s.want
	if !revision {
		s.baseWant, s.baseStreak = s.want, s.streak
		s.lastStart, s.evaluated = a.Start, true
	}
	s.lastEnd, s.lastAt = a.End, e.clock
	// Hysteresis: when must hold For windows in a row to fire; once
	// firing, only clear_when clears.
	switch {
	case !want && r.when.Holds(v):
		streak++
		if streak >= r.forN {
			want, streak = true, 0
		}
	case !want:
		streak = 0
	case r.clear.Holds(v) && !holds(a, r.when):
		// A clear_when on another aggregate than when's can hold in the
		// same window (max > 95 and mean < 70): the alert stays firing
		// while when holds, instead of clearing and firing again.
		want = false
	}
	s.want, s.streak = want, streak
	// The value reported with want's transition: this window's, when it
	// meets want's condition; else that of the last window that did (a
	// held-back transition sent with a window inside the hysteresis band
	// reports the value that made it, not one that contradicts it).
	tcond := r.clear
	if want {
		tcond = r.when
	}
	if holds(a, tcond) {
		s.value, _ = value(a, tcond)
	}
	changed := s.want != prev
	switch {
	case s.pending() && e.allowed(r, s):
		sup := s.suppressed
		if !changed && sup > 0 {
			sup-- // sending a change held back earlier
		}
		if err := e.transition(tx, k, s, a.Start, a.End, s.value, sup, at); err != nil {
			return err
		}
	case changed:
		s.suppressed++
		e.txc.suppressed++
	}
	e.track(k, s)
	return e.putState(tx, k, s)
}

// allowed reports whether a transition may be sent now: none was sent in
// the last min_interval of logged time, nor at the window start in hand.
func (e *Engine) allowed(r *rule, s *state) bool {
	if !s.hasTrans {
		return true
	}
	return s.transStart != s.lastStart && e.clock-s.transAt >= r.minInterval
}

// transition sends s's wanted state: an uplink alert and a local message
// as the rule's actions say.
func (e *Engine) transition(tx *bolt.Tx, k skey, s *state, start, end int64, v float64, sup uint32, at int64) error {
	r := e.rules[k.rule]
	st, cond := StateCleared, r.clearString
	if s.want {
		st, cond = StateFired, r.whenString
	}
	key := AlertKey(e.cfg.Gateway, r.name, k.device, start, st)
	if r.uplink {
		a := wire.Alert{
			Rule: r.name, Device: k.device, Metric: r.metric, Start: start,
			State: st, Severity: r.severity, Value: v, Key: key, Suppressed: sup,
		}
		data, err := wire.EncodeAlert(&a)
		if err != nil {
			return fmt.Errorf("encode alert %s: %w", key, err)
		}
		if _, err := outbox.Append(tx, outbox.KindAlert, at, data); err != nil {
			return fmt.Errorf("append alert %s: %w", key, err)
		}
	}
	if r.local {
		m := AlertMessage{
			Type: TypeAlert, Gateway: e.cfg.Gateway, Rule: r.name, Device: k.device, Metric: r.metric,
			Start: start, End: end, State: st, Severity: r.severity, Value: finite(v),
			Condition: cond, Key: key, Suppressed: sup, EmittedAt: at,
		}
		if err := e.localAlert(tx, k, r, &m, at); err != nil {
			return err
		}
	}
	if s.want {
		e.firing[k.rule]++
		e.txc.fired++
	} else {
		e.firing[k.rule]--
		e.txc.cleared++
	}
	s.firing = s.want
	s.hasTrans, s.transAt, s.transStart = true, e.clock, start
	s.suppressed = 0
	return nil
}

// localAlert queues the local message of a transition, or folds it into
// the storm summary of its rule and emission point.
func (e *Engine) localAlert(tx *bolt.Tx, k skey, r *rule, m *AlertMessage, at int64) error {
	payload, err := marshal(m)
	if err != nil {
		return err
	}
	msg := local.Message{
		Topic:   e.alertTopic.expand(k.device, ""),
		Payload: payload, Retain: r.retain, QoS: localQoS,
	}
	if r.retain {
		// Retained topics hold each device's current state: a summary
		// would leave them stale, so they are never folded.
		if _, err := e.appendLocal(tx, msg, at); err != nil {
			return fmt.Errorf("append local alert %s: %w", m.Key, err)
		}
		return nil
	}
	g := e.groups[k.rule]
	if g == nil || e.stormOver(g, at) || at < g.at {
		if err := e.releaseHeld(tx, k.rule, at); err != nil {
			return err
		}
		g = &group{at: at}
		e.groups[k.rule] = g
	}
	if g.count > e.threshold && !g.held && !g.summaryInTx {
		// The storm goes on after the transaction that queued its summary
		// committed: the local publisher may have sent it, so it is never
		// rewritten (a key goes out with one content). A new part counts
		// from here under its own key, held until the storm's window ends
		// (releaseHeld): a storm that goes on for the whole window pages
		// once more, not once a micro-batch.
		g.part++
		g.fired, g.cleared, g.devices, g.summarySeq = 0, 0, nil, 0
		g.held = true
	}
	g.count++
	if m.State == StateFired {
		g.fired++
	} else {
		g.cleared++
	}
	if len(g.devices) < maxSummaryDevices {
		g.devices = append(g.devices, k.device)
	}
	if g.count <= e.threshold {
		seq, err := e.appendLocal(tx, msg, at)
		if err != nil {
			return fmt.Errorf("append local alert %s: %w", m.Key, err)
		}
		g.seqs = append(g.seqs, seq)
	} else if g.held {
		e.txc.folded++ // into the held part, queued when the window ends
	} else {
		// A storm: the individual messages of this group give way to one
		// summary, rewritten as the group grows within the transaction
		// that queued it.
		var drop []uint64
		if g.count == e.threshold+1 {
			// The individual messages this transaction queued give way;
			// those of earlier ones may be out, and stay counted.
			drop, g.seqs = g.seqs, nil
			e.txc.summaries++
			e.txc.folded += uint64(len(drop))
		} else {
			drop = []uint64{g.summarySeq} // queued by this transaction (checked above)
		}
		if err := outbox.Delete(tx, drop...); err != nil {
			return fmt.Errorf("fold local alerts of %s: %w", r.name, err)
		}
		e.txc.local -= int64(len(drop))
		e.txc.folded++ // this transition's own message
		if err := e.queueSummary(tx, r, g, at); err != nil {
			return err
		}
	}
	return e.putGroup(tx, r, g)
}

// queueSummary queues g's summary, emitted at logged time at.
func (e *Engine) queueSummary(tx *bolt.Tx, r *rule, g *group, at int64) error {
	sm := SummaryMessage{
		Type: TypeSummary, Gateway: e.cfg.Gateway, Rule: r.name, Metric: r.metric, Severity: r.severity,
		EmittedAt: at, Transitions: g.fired + g.cleared, Fired: g.fired, Cleared: g.cleared,
		Devices: g.devices, Key: fmt.Sprintf("%s/%s/%s/%d", e.cfg.Gateway, r.name, summaryDevice, g.at),
	}
	if g.part > 0 {
		sm.Part = g.part + 1
		sm.Key += fmt.Sprintf("/%d", sm.Part)
	}
	payload, err := marshal(&sm)
	if err != nil {
		return err
	}
	seq, err := e.appendLocal(tx, local.Message{Topic: r.summaryTopic, Payload: payload, QoS: localQoS}, at)
	if err != nil {
		return fmt.Errorf("append storm summary of %s: %w", r.name, err)
	}
	g.summarySeq, g.summaryInTx = seq, true
	return nil
}

// releaseHeld queues the held summary part of rule ri's storm, if any, at
// logged time at: its window ended, or a new storm of the rule begins.
func (e *Engine) releaseHeld(tx *bolt.Tx, ri int, at int64) error {
	g := e.groups[ri]
	if g == nil || !g.held {
		return nil
	}
	r := e.rules[ri]
	g.held = false
	e.txc.summaries++
	if err := e.queueSummary(tx, r, g, at); err != nil {
		return err
	}
	return e.putGroup(tx, r, g)
}

// stormOver says whether logged time at is past g's storm window (with
// storm_window 0s, any later instant).
func (e *Engine) stormOver(g *group, at int64) bool { return at-g.at >= max(e.stormWindow, 1) }

// releaseEnded releases the held parts of storms whose window ended by
// the logged clock, in rule order.
func (e *Engine) releaseEnded(tx *bolt.Tx) error {
	for ri, g := range e.groups {
		if g != nil && g.held && e.stormOver(g, e.clock) {
			if err := e.releaseHeld(tx, ri, e.clock); err != nil {
				return err
			}
		}
	}
	return nil
}

func (e *Engine) putGroup(tx *bolt.Tx, r *rule, g *group) error {
	if err := tx.Bucket(bucketStorm).Put([]byte(r.name), encodeGroup(g)); err != nil {
		return fmt.Errorf("put storm of %s: %w", r.name, err)
	}
	return nil
}

func (e *Engine) appendLocal(tx *bolt.Tx, m local.Message, at int64) (uint64, error) {
	seq, err := outbox.Append(tx, outbox.KindLocal, at, local.Encode(m))
	if err != nil {
		return 0, err
	}
	e.txc.local++
	e.txc.queued = true
	return seq, nil
}

func (e *Engine) putState(tx *bolt.Tx, k skey, s *state) error {
	if err := tx.Bucket(bucketState).Put(stateKey(e.rules[k.rule].name, k.device), encodeState(s)); err != nil {
		return fmt.Errorf("put alert state %s/%s: %w", e.rules[k.rule].name, k.device, err)
	}
	return nil
}

func appendVarint(b []byte, v int64) []byte { return binary.AppendVarint(b, v) }
