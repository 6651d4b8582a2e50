package rig

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"time"

	"github.com/edgeagent/edgeagent/testrig/faultproxy"
	"github.com/edgeagent/edgeagent/testrig/scenario"
	"github.com/edgeagent/edgeagent/testrig/servers"
	"github.com/edgeagent/edgeagent/testrig/sim"
	"github.com/edgeagent/edgeagent/testrig/verify"
)

// Uplink transports a scenario run can send the agent's aggregates over.
const (
	UplinkNATS = "nats"
	UplinkMQTT = "mqtt"
)

// UplinkTopic is the agent's default uplink topic, edge/{gateway_id}/aggregates,
// expanded for Gateway; VerifierClientID is the verifier's persistent
// session on the uplink broker.
const (
	UplinkTopic      = "edge/" + Gateway + "/aggregates"
	VerifierClientID = "edgerig-verifier-" + Gateway
)

// CheckUplink refuses uplink options that do not go together (Run does
// too; a command line calls it first to tell a usage error apart).
func CheckUplink(o Options) error {
	switch o.Uplink {
	case "", UplinkNATS:
		if o.UplinkBroker != "" {
			return fmt.Errorf("rig: an uplink broker (%s) needs the MQTT uplink", o.UplinkBroker)
		}
	case UplinkMQTT:
		if o.NATS != "" {
			return fmt.Errorf("rig: --nats %s: the uplink is MQTT, no NATS server is used", o.NATS)
		}
	default:
		return fmt.Errorf("rig: uplink %q: want %s or %s", o.Uplink, UplinkNATS, UplinkMQTT)
	}
	return nil
}

// startUplink starts the cloud side of the run: the uplink server (unless
// external), the fault proxy in front of it, and the verifier, which
// reaches the server directly. It returns the agent's uplink URL (the
// proxy's).
func (e *env) startUplink(ctx context.Context) (string, error) {
	if e.cfg.uplink == UplinkMQTT {
		return e.startMQTTUplink()
	}
	natsAddr := ""
	if e.cfg.nats != "" {
		u, err := url.Parse(e.cfg.nats)
		if err != nil || u.Host == "" {
			return "", fmt.Errorf("rig: --nats %q: want nats://host:port", e.cfg.nats)
		}
		e.natsURL, natsAddr = e.cfg.nats, u.Host
	} else {
		n, err := servers.StartNATS(filepath.Join(e.cfg.dir, "nats"))
		if err != nil {
			return "", err
		}
		e.nats, e.natsURL, natsAddr = n, n.URL(), n.Addr()
	}
	sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := servers.CreateStream(sctx, e.natsURL, Stream, []string{Subject}); err != nil {
		return "", err
	}
	// An external stream keeps what earlier runs sent, with the same
	// gateway and so the same idempotency keys: the verifier starts after
	// it rather than purging a stream the rig does not own.
	after, err := servers.StreamLastSeq(sctx, e.natsURL, Stream)
	if err != nil {
		return "", err
	}
	if after > 0 {
		e.streamReused = true
		e.logf("stream %s on %s already holds messages up to sequence %d (earlier runs'); the verifier reads only what comes after", Stream, e.natsURL, after)
	}
	if e.proxy, err = faultproxy.New(natsAddr); err != nil {
		return "", err
	}
	if e.verifier, err = verify.Start(ctx, verify.Config{URL: e.natsURL, Stream: Stream, Subject: Subject, AfterSeq: after, Hold: e.cfg.holdVerifier}); err != nil {
		return "", err
	}
	e.uplinkName = "NATS JetStream"
	return "nats://" + e.proxy.Addr(), nil
}

// startMQTTUplink starts an in-process mochi of its own for the uplink (the
// devices' broker stays apart, so a broker_restart does not touch the
// cloud), or uses the external --uplink-broker, and subscribes the verifier
// before the agent exists, so no batch is published before its session.
func (e *env) startMQTTUplink() (string, error) {
	brokerURL := e.cfg.uplinkBroker
	if brokerURL == "" {
		m, err := servers.StartMochi("")
		if err != nil {
			return "", fmt.Errorf("rig: uplink broker: %w", err)
		}
		m.CountAcksFrom(VerifierClientID)
		e.uplinkMochi, brokerURL = m, m.URL()
		e.uplinkName = "MQTT to " + m.Name()
	} else {
		e.uplinkName = "MQTT to external " + brokerURL
	}
	u, err := url.Parse(brokerURL)
	if err != nil || u.Host == "" || (u.Scheme != "tcp" && u.Scheme != "mqtt") {
		return "", fmt.Errorf("rig: uplink broker %q: want tcp://host:port", brokerURL)
	}
	if e.proxy, err = faultproxy.New(u.Host); err != nil {
		return "", err
	}
	if e.verifier, err = verify.StartMQTT(verify.MQTTConfig{Broker: brokerURL, Topic: UplinkTopic, ClientID: VerifierClientID}); err != nil {
		return "", err
	}
	return "tcp://" + e.proxy.Addr(), nil
}

// planFor plans sc's run starting now. On a stream that holds earlier
// runs' batches, the plan takes a seed of its own: a run repeating an
// earlier one's seed minutes later sends the same readings at nearly the
// same event times, and so seals the same aggregates into batches of the
// same ids (the outbox numbers its rows from 1 again, and the id hashes
// the rows); JetStream drops such a batch as a duplicate within its
// duplicate window (2 minutes), and this run's verifier, which reads only
// what comes after the earlier runs, never sees it. The run's truth comes
// from the same plan, and the report says which seed it used.
func (e *env) planFor(sc *scenario.Scenario) (*sim.Plan, error) {
	if e.streamReused {
		own := *sc
		own.Seed ^= uint64(time.Now().UnixNano()) | 1
		e.logf("seed %d for this run instead of the scenario's %d, so that no batch repeats an earlier run's", own.Seed, sc.Seed)
		sc = &own
	}
	return sim.NewPlan(sc, time.Now())
}
