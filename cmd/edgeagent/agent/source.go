package agent

import (
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgeagent/edgeagent/buffer/outbox"
	"github.com/edgeagent/edgeagent/cmd/edgeagent/status"
	"github.com/edgeagent/edgeagent/internal/secret"
	"github.com/edgeagent/edgeagent/window"
)

// statusSource adapts the running agent to status.Source.
type statusSource struct {
	a       *Agent
	tables  *Tables
	started time.Time
	config  []byte
}

func (s *statusSource) Config() []byte { return s.config }

func (s *statusSource) Inspect(table string, q status.Query) (any, error) {
	return s.tables.Inspect(table, q)
}

func (s *statusSource) Ready() (bool, string) {
	a := s.a
	if !a.Ingest.Connected() {
		return false, "ingest is not connected to the MQTT broker " + secret.URL(a.cfg.MQTT.Broker, false)
	}
	st := a.Ingest.Stats()
	if st.Full.Load() {
		return false, "Bronze is full of unprocessed records"
	}
	if st.CommitFailing.Load() {
		return false, "Bronze commits are failing: " + st.LastCommitError()
	}
	if msg, refused := st.SubscribeError(); refused {
		return false, "the broker refused a subscription: " + msg
	}
	return true, ""
}

func (s *statusSource) Snapshot() status.Snapshot {
	a := s.a
	now := a.opts.Clock()
	snap := status.Snapshot{Gateway: a.cfg.GatewayID, Version: a.opts.Version, Time: now.UTC(), UptimeSeconds: now.Sub(s.started).Seconds()}
	if r := a.reloadRefused.Load(); r != nil {
		snap.ReloadRefused = *r
	}

	in := a.Ingest.Stats()
	subscribeErr, _ := in.SubscribeError()
	snap.Ingest = status.Ingest{
		Broker:             secret.URL(a.cfg.MQTT.Broker, false),
		Connected:          a.Ingest.Connected(),
		ReceivedTotal:      in.Received.Load(),
		CommittedTotal:     in.Committed.Load(),
		AckedTotal:         in.Acked.Load(),
		CommitsTotal:       in.Commits.Load(),
		CommitFailures:     in.CommitFailures.Load(),
		CommitSecondsTotal: time.Duration(in.CommitNanos.Load()).Seconds(),
		LastCommitSeconds:  time.Duration(in.LastCommitNano.Load()).Seconds(),
		Reconnects:         in.Reconnects.Load(),
		BrokerDropped:      in.BrokerDropped.Load(),
		SessionsLost:       in.SessionsLost.Load(),
		SessionLostAt:      unixNanoTime(in.SessionLostAt.Load()),
		SubscribeError:     subscribeErr,
		Rejected:           in.Rejected(),
		BronzeFull:         in.Full.Load(),
		BronzeFullTotal:    in.FullTotal.Load(),
		CommitFailing:      in.CommitFailing.Load(),
		LastCommitError:    in.LastCommitError(),
		LastError:          in.LastError(),
	}
	if a.cfg.MQTT.Broker == "embedded" {
		snap.Ingest.Broker = "embedded on " + a.cfg.MQTT.Embedded.Listen
	}

	ws := a.Stage.Stats()
	if bs, err := a.Bronze.Stats(); err == nil {
		snap.Bronze = status.Bronze{Records: bs.Records, Bytes: bs.Bytes, MaxBytes: bs.MaxBytes,
			FirstSeq: bs.FirstSeq, LastSeq: bs.LastSeq, Checkpoint: bs.Checkpoint,
			Retention: time.Duration(a.cfg.Storage.BronzeRetention).Seconds()}
		// The backlog is what the window stage has not processed yet, not
		// what it has not checkpointed (that moves every checkpoint
		// interval); the unprocessed bytes are estimated from it.
		if bs.LastSeq > ws.Offset {
			snap.Bronze.BacklogRecords = bs.LastSeq - ws.Offset
		}
		if bs.Records > 0 {
			snap.Bronze.UnprocessedBytes = int64(float64(bs.Bytes) * float64(min(snap.Bronze.BacklogRecords, uint64(bs.Records))) / float64(bs.Records))
		}
		if bs.OldestAt > 0 {
			snap.Bronze.OldestAge = now.Sub(time.Unix(0, bs.OldestAt)).Seconds()
		}
	}

	snap.Window = status.Window{
		ProcessedTotal:         ws.Records,
		ReadingsTotal:          ws.Readings,
		BatchesTotal:           ws.Batches,
		CheckpointsByReason:    ws.Checkpoints,
		LastBatchSeconds:       ws.LastBatchDuration.Seconds(),
		LastBatchRecords:       ws.LastBatchRecords,
		TriggerIntervalSeconds: time.Duration(a.cfg.Processing.TriggerInterval).Seconds(),
		EmittedTotal:           ws.Emitted,
		RevisionsTotal:         ws.Revisions,
		OpenWindows:            ws.OpenWindows,
		EvictedWindows:         ws.EvictedWindows,
		PendingRevisions:       ws.PendingRevisions,
		DedupEntries:           ws.DedupEntries,
		Devices:                ws.Devices,
		Tombstones:             ws.Tombstones,
		TombstonesDropped:      ws.TombstonesDropped,
		StateBytes:             ws.StateBytes,
		LateTotal:              ws.Late,
		DuplicatesTotal:        ws.Duplicates,
		DeadLettersByReason:    ws.DeadLetters,
		LatestEventTime:        ws.LatestEventTime.UTC(),
		LoggedClock:            ws.LoggedClock,
		LagSeconds:             ws.Lag.Seconds(),
		Blocked:                ws.Blocked,
		BlockedTotal:           ws.BlockedTotal,
		Failing:                ws.Failing,
		FailuresTotal:          ws.Failures,
		LastError:              ws.LastError,
		LateRowsEvicted:        ws.LateEvicted,
		DeadLetterRowsEvicted:  ws.DeadLettersEvicted,
		DevicesExpired:         ws.DevicesExpired,
	}
	if !ws.TombstoneFloor.IsZero() {
		floor := ws.TombstoneFloor
		snap.Window.TombstoneFloor = &floor
	}
	if a.Alerts != nil {
		as := a.Alerts.Stats()
		snap.Alerts = &status.Alerts{Rules: as.Rules, Firing: as.Firing, FiringByRule: as.FiringByRule,
			FiredTotal: as.Fired, ClearedTotal: as.Cleared, SuppressedTotal: as.Suppressed, SummariesTotal: as.Summaries,
			LocalQueuedTotal: as.LocalMessages}
		if a.Local != nil {
			ls := a.Local.Stats()
			snap.Alerts.LocalPublishedTotal, snap.Alerts.LocalFailuresTotal, snap.Alerts.LocalLastError = ls.Published, ls.Failures, ls.LastError
		}
	}
	for _, n := range ws.DeadLetters {
		snap.Window.DeadLettersTotal += n
	}

	snap.Outbox.MaxBytes = int64(a.cfg.Storage.OutboxMaxBytes)
	err := a.State.View(func(tx *bolt.Tx) error {
		st, err := outbox.ReadStats(tx)
		if err != nil {
			return err
		}
		snap.Outbox.Rows, snap.Outbox.Bytes = st.Rows, st.Bytes
		if st.Oldest > 0 {
			snap.Outbox.OldestAge = now.Sub(time.UnixMilli(st.Oldest)).Seconds()
		}
		dls, err := window.ReadDeadLetters(tx, window.Filter{}, 10)
		for i := range dls {
			snap.DeadLetters = append(snap.DeadLetters, deadLetterRow(&dls[i]))
		}
		return err
	})
	if err != nil {
		a.log.Warn("status: read the outbox and dead letters", "err", err)
	}

	snap.Uplink = status.Uplink{Transport: a.cfg.Uplink.Transport(), State: "disabled"}
	if a.Uplink != nil {
		us := a.Uplink.Stats()
		snap.Uplink.State = string(us.Link)
		snap.Uplink.Since = us.LinkSince.UTC()
		if !us.NotUpSince.IsZero() {
			snap.Uplink.DownSince, snap.Uplink.DownFor = us.NotUpSince.UTC(), now.Sub(us.NotUpSince)
		}
		if !us.FailingSince.IsZero() {
			snap.Uplink.FailingSince, snap.Uplink.FailingFor = us.FailingSince.UTC(), now.Sub(us.FailingSince)
		}
		snap.Uplink.ReconnectsTotal = us.Reconnects
		snap.Uplink.BatchesSent = us.BatchesSent
		snap.Uplink.AggregatesSent = us.AggregatesSent
		snap.Uplink.AlertsSent = us.AlertsSent
		snap.Uplink.BytesSent = us.BytesSent
		snap.Uplink.Resends = us.Resends
		snap.Uplink.Duplicates = us.Duplicates
		snap.Uplink.AckTimeouts = us.AckTimeouts
		snap.Uplink.LastAckSeconds = us.LastAckLatency.Seconds()
		snap.Uplink.SealedBatches = us.SealedBatches
		snap.Uplink.LastError = us.LastError
		// Sealed batches still count as queued: they are not delivered yet.
		snap.Outbox.Bytes += us.SealedBytes
		if us.OldestUnsent > 0 {
			snap.Outbox.OldestAge = now.Sub(time.UnixMilli(us.OldestUnsent)).Seconds()
		}
	}
	return snap
}

// unixNanoTime is t (Unix ns) as a UTC time, the zero time for 0.
func unixNanoTime(t int64) time.Time {
	if t == 0 {
		return time.Time{}
	}
	return time.Unix(0, t).UTC()
}
