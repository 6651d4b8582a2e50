package rig

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgeagent/edgeagent/testrig/truth"
)

// AlertResult compares the alert transitions the agent published on the
// device broker with the ones the truth expects from the windows.
type AlertResult struct {
	// Expected transitions; Received distinct alert keys; Correct the
	// received ones expected; Missing and Extra the difference.
	Expected int `json:"expected"`
	Received int `json:"received"`
	Correct  int `json:"correct"`
	Missing  int `json:"missing"`
	Extra    int `json:"extra"`
	// Duplicates counts deliveries of a key already received (a local
	// message published again after a crash); Conflicts keys that arrived
	// with two different contents, which a key must never carry.
	Duplicates int `json:"duplicates"`
	Conflicts  int `json:"conflicts"`
	// Examples names a few missing, extra or conflicting transitions.
	Examples []string `json:"examples,omitempty"`
}

// alertMsg is the part of a local alert message the rig checks
// (docs/alerts.md).
type alertMsg struct {
	Type, Rule, Device, State, Key string
	Start                          int64
}

// alertWatch holds what the agent published on its alerts topic.
type alertWatch struct {
	client paho.Client
	mu     sync.Mutex
	byKey  map[string][]byte // the first payload of each key
	msgs   map[string]alertMsg
	dups   int
	confl  []string
	bad    []string
}

// watchAlerts subscribes to the agent's alerts topic on the device broker,
// in a session that outlives a broker restart, and keeps subscribing after
// each reconnect.
func watchAlerts(ctx context.Context, brokerURL string) (*alertWatch, error) {
	w := &alertWatch{byKey: map[string][]byte{}, msgs: map[string]alertMsg{}}
	filter := strings.NewReplacer("{gateway_id}", Gateway, "{device}", "+").Replace(AlertsTopic)
	opts := paho.NewClientOptions().AddBroker(brokerURL).SetClientID("edgerig-alerts").
		SetCleanSession(false).SetAutoReconnect(true).SetConnectRetry(true).
		SetConnectRetryInterval(100 * time.Millisecond).SetMaxReconnectInterval(time.Second)
	opts.SetOnConnectHandler(func(c paho.Client) { c.Subscribe(filter, 1, w.receive) })
	w.client = paho.NewClient(opts)
	tok := w.client.Connect()
	select {
	case <-tok.Done():
	case <-ctx.Done():
		w.client.Disconnect(0)
		return nil, ctx.Err()
	}
	if err := tok.Error(); err != nil {
		return nil, fmt.Errorf("rig: alerts subscriber: %w", err)
	}
	return w, nil
}

func (w *alertWatch) receive(_ paho.Client, m paho.Message) {
	var a alertMsg
	err := json.Unmarshal(m.Payload(), &a)
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err != nil || a.Type != "alert" || a.Key == "":
		w.bad = append(w.bad, fmt.Sprintf("%s: not an alert message: %.200s", m.Topic(), m.Payload()))
	case w.byKey[a.Key] == nil:
		w.byKey[a.Key] = bytes.Clone(m.Payload())
		w.msgs[a.Key] = a
	default:
		w.dups++
		if !bytes.Equal(w.byKey[a.Key], m.Payload()) {
			w.confl = append(w.confl, a.Key)
		}
	}
}

func (w *alertWatch) close() { w.client.Disconnect(250) }

// compare checks what arrived against exp.
func (w *alertWatch) compare(exp []truth.Transition) *AlertResult {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := &AlertResult{Expected: len(exp), Received: len(w.msgs), Duplicates: w.dups, Conflicts: len(w.confl)}
	type id struct {
		rule, device, state string
		start               int64
	}
	want := map[id]bool{}
	for _, t := range exp {
		want[id{t.Rule, t.Device, t.State, t.Start}] = true
	}
	got := map[id]bool{}
	var extra []string
	for _, m := range w.msgs {
		k := id{m.Rule, m.Device, m.State, m.Start}
		got[k] = true
		if want[k] {
			r.Correct++
		} else {
			extra = append(extra, "extra "+m.Key)
		}
	}
	var missing []string
	for _, t := range exp {
		if !got[id{t.Rule, t.Device, t.State, t.Start}] {
			missing = append(missing, fmt.Sprintf("missing %s/%s/%d/%s", t.Rule, t.Device, t.Start, t.State))
		}
	}
	r.Missing, r.Extra = len(missing), len(extra)
	sort.Strings(extra)
	for _, list := range [][]string{missing, extra, prefixed("conflict ", w.confl), w.bad} {
		r.Examples = append(r.Examples, list[:min(len(list), 3)]...)
	}
	return r
}

func prefixed(p string, s []string) []string {
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = p + x
	}
	return out
}

// complete says whether every expected transition has arrived.
func (r *AlertResult) complete() bool { return r.Correct == r.Expected }

// failures says why the alerts fail the run, one line each.
func (r *AlertResult) failures() []string {
	var f []string
	if r.Expected == 0 {
		f = append(f, "the scenario's alert rules made no transition over the run's windows: nothing was checked (choose a threshold the metric crosses)")
	}
	if r.Missing > 0 || r.Extra > 0 || r.Conflicts > 0 {
		f = append(f, fmt.Sprintf("alerts: %d missing, %d extra, %d keys with two contents (%s)", r.Missing, r.Extra, r.Conflicts, strings.Join(r.Examples, "; ")))
	} else if len(r.Examples) > 0 {
		f = append(f, "alerts: "+strings.Join(r.Examples, "; "))
	}
	return f
}

// waitAlerts polls until every expected transition has arrived or timeout
// passes, and returns the last comparison.
func waitAlerts(ctx context.Context, w *alertWatch, exp []truth.Transition, timeout time.Duration) *AlertResult {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		r := w.compare(exp)
		if r.complete() || time.Now().After(deadline) {
			return r
		}
		select {
		case <-ctx.Done():
			return r
		case <-tick.C:
		}
	}
}
