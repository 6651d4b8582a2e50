package status

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"

	"github.com/VictoriaMetrics/metrics"
)

// VictoriaMetrics/metrics rather than prometheus/client_golang: measured on
// linux/arm64 (stripped), a bare net/http server is 5.37 MB, with
// VictoriaMetrics/metrics 5.70 MB (+0.31 MiB), with client_golang and
// promhttp 8.00 MB (+2.5 MiB) — a quarter of the 10 MiB budget.
func init() { metrics.ExposeMetadata(true) }

// metrics renders the snapshot in the Prometheus text format. The figures
// live in the stages; each scrape reads them once, so nothing is double
// counted and no registry mirrors them.
func (s *Server) metrics(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	snap := s.Current()
	err := writeWithHelp(w, func(w io.Writer) {
		WriteMetrics(w, snap)
		metrics.WriteProcessMetrics(w)
		metrics.WriteFDMetrics(w) // not part of the above (process_open_fds, process_max_fds)
	})
	if err != nil {
		// A scraper that went away mid-response: nothing else to do.
		s.cfg.Logger.Debug("status: write /metrics", "err", err)
	}
}

// WriteMetrics writes snap as Prometheus metrics.
func WriteMetrics(w io.Writer, snap Snapshot) {
	g := func(name string, v float64) { metrics.WriteGaugeFloat64(w, name, v) }
	c := func(name string, v uint64) { metrics.WriteCounterUint64(w, name, v) }
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	labeled(w, "edgeagent_info", "gauge", "", map[string]uint64{
		fmt.Sprintf(`gateway=%q,version=%q`, snap.Gateway, snap.Version): 1})
	g("edgeagent_uptime_seconds", snap.UptimeSeconds)
	// One number to alert on: each warning also names its cause in
	// status.json and on the page.
	g("edgeagent_warnings", float64(len(snap.Warnings)))

	in := snap.Ingest
	g("edgeagent_ingest_connected", b(in.Connected))
	c("edgeagent_ingest_messages_received_total", in.ReceivedTotal)
	c("edgeagent_ingest_messages_committed_total", in.CommittedTotal)
	c("edgeagent_ingest_messages_acked_total", in.AckedTotal)
	c("edgeagent_ingest_reconnects_total", in.Reconnects)
	c("edgeagent_ingest_broker_dropped_total", in.BrokerDropped)
	c("edgeagent_ingest_sessions_lost_total", in.SessionsLost)
	labeled(w, "edgeagent_ingest_rejected_total", "counter", "reason", in.Rejected)
	g("edgeagent_input_messages_per_second", snap.Rates.InputPerSecond)

	c("edgeagent_bronze_commits_total", in.CommitsTotal)
	c("edgeagent_bronze_commit_failures_total", in.CommitFailures)
	c("edgeagent_bronze_full_total", in.BronzeFullTotal)
	metrics.WriteCounterFloat64(w, "edgeagent_bronze_commit_seconds_total", in.CommitSecondsTotal)
	g("edgeagent_bronze_last_commit_seconds", in.LastCommitSeconds)
	br := snap.Bronze
	g("edgeagent_bronze_records", float64(br.Records))
	g("edgeagent_bronze_bytes", float64(br.Bytes))
	g("edgeagent_bronze_max_bytes", float64(br.MaxBytes))
	g("edgeagent_bronze_backlog_records", float64(br.BacklogRecords))
	// Estimated from the log's mean record size, like status.json's
	// unprocessed_bytes.
	g("edgeagent_bronze_backlog_bytes", float64(br.UnprocessedBytes))
	g("edgeagent_bronze_oldest_age_seconds", br.OldestAge)
	g("edgeagent_bronze_full", b(in.BronzeFull))

	wn := snap.Window
	c("edgeagent_window_records_processed_total", wn.ProcessedTotal)
	c("edgeagent_window_readings_total", wn.ReadingsTotal)
	g("edgeagent_processed_records_per_second", snap.Rates.ProcessedPerSecond)
	c("edgeagent_window_batches_total", wn.BatchesTotal)
	labeled(w, "edgeagent_window_checkpoints_total", "counter", "reason", wn.CheckpointsByReason)
	g("edgeagent_window_batch_duration_seconds", wn.LastBatchSeconds)
	g("edgeagent_window_trigger_interval_seconds", wn.TriggerIntervalSeconds)
	c("edgeagent_window_aggregates_emitted_total", wn.EmittedTotal)
	c("edgeagent_window_revisions_total", wn.RevisionsTotal)
	g("edgeagent_window_open_windows", float64(wn.OpenWindows))
	g("edgeagent_window_evicted_windows", float64(wn.EvictedWindows))
	g("edgeagent_window_pending_revisions", float64(wn.PendingRevisions))
	g("edgeagent_window_dedup_entries", float64(wn.DedupEntries))
	g("edgeagent_window_devices", float64(wn.Devices))
	g("edgeagent_window_tombstones", float64(wn.Tombstones))
	c("edgeagent_window_tombstones_dropped_total", wn.TombstonesDropped)
	g("edgeagent_window_state_bytes", float64(wn.StateBytes))
	c("edgeagent_late_readings_total", wn.LateTotal)
	c("edgeagent_duplicate_readings_total", wn.DuplicatesTotal)
	labeled(w, "edgeagent_dead_letters_total", "counter", "reason", wn.DeadLettersByReason)
	g("edgeagent_window_failing", b(wn.Failing))
	c("edgeagent_window_failures_total", wn.FailuresTotal)
	c("edgeagent_late_rows_evicted_total", wn.LateRowsEvicted)
	c("edgeagent_dead_letter_rows_evicted_total", wn.DeadLetterRowsEvicted)
	c("edgeagent_devices_expired_total", wn.DevicesExpired)
	// Absent until a reading was processed: a lag of 0 would look perfect
	// on an agent that has seen nothing (subscribed to the wrong topic).
	if !wn.LatestEventTime.IsZero() {
		g("edgeagent_end_to_end_lag_seconds", wn.LagSeconds)
	}
	// The newest received-at the stage has seen; against time() it shows a
	// gateway clock that went back (the stage's clock does not).
	if !wn.LoggedClock.IsZero() {
		g("edgeagent_window_logged_clock_timestamp_seconds", float64(wn.LoggedClock.UnixMilli())/1e3)
	}
	g("edgeagent_window_blocked", b(wn.Blocked))
	c("edgeagent_window_blocked_total", wn.BlockedTotal)

	ob := snap.Outbox
	g("edgeagent_outbox_rows", float64(ob.Rows))
	g("edgeagent_outbox_bytes", float64(ob.Bytes))
	g("edgeagent_outbox_max_bytes", float64(ob.MaxBytes))
	g("edgeagent_uplink_lag_seconds", ob.OldestAge)

	up := snap.Uplink
	g("edgeagent_uplink_up", b(up.State == "up"))
	states := map[string]uint64{}
	for _, st := range []string{"up", "down", "connecting", "disabled"} {
		states[strconv.Quote(st)] = 0
		if st == up.State {
			states[strconv.Quote(st)] = 1
		}
	}
	labeled(w, "edgeagent_uplink_state", "gauge", "state", states)
	c("edgeagent_uplink_reconnects_total", up.ReconnectsTotal)
	c("edgeagent_uplink_batches_sent_total", up.BatchesSent)
	c("edgeagent_uplink_aggregates_sent_total", up.AggregatesSent)
	c("edgeagent_uplink_alerts_sent_total", up.AlertsSent)
	c("edgeagent_uplink_bytes_sent_total", up.BytesSent)
	c("edgeagent_uplink_resends_total", up.Resends)
	c("edgeagent_uplink_duplicates_total", up.Duplicates)
	c("edgeagent_uplink_ack_timeouts_total", up.AckTimeouts)
	g("edgeagent_uplink_last_ack_seconds", up.LastAckSeconds)
	// How long sending has been failing (refused or unacknowledged,
	// across reconnects); 0 while batches are acknowledged.
	failing := 0.0
	if d := up.failingFor(snap.Time); !up.FailingSince.IsZero() && d > 0 {
		failing = d.Seconds()
	}
	g("edgeagent_uplink_failing_seconds", failing)
	g("edgeagent_uplink_sealed_batches", float64(up.SealedBatches))
	g("edgeagent_uplink_bytes_per_second", snap.Rates.SentPerSecond)

	if al := snap.Alerts; al != nil {
		g("edgeagent_alert_rules", float64(al.Rules))
		g("edgeagent_alerts_firing", float64(al.Firing))
		byRule := make(map[string]uint64, len(al.FiringByRule))
		for r, n := range al.FiringByRule {
			byRule[r] = uint64(n)
		}
		labeled(w, "edgeagent_alerts_firing_by_rule", "gauge", "rule", byRule)
		c("edgeagent_alerts_fired_total", al.FiredTotal)
		c("edgeagent_alerts_cleared_total", al.ClearedTotal)
		c("edgeagent_alerts_suppressed_total", al.SuppressedTotal)
		c("edgeagent_alert_summaries_total", al.SummariesTotal)
		c("edgeagent_local_messages_queued_total", al.LocalQueuedTotal)
		c("edgeagent_local_messages_published_total", al.LocalPublishedTotal)
		c("edgeagent_local_publish_failures_total", al.LocalFailuresTotal)
	}
}

// labeled writes one metric family with a label. Keys of values are the
// label's value; when label is "" the keys are whole label sets. Already
// quoted keys (starting with ") are used as they are.
func labeled(w io.Writer, name, typ, label string, values map[string]uint64) {
	metrics.WriteMetadataIfNeeded(w, name, typ)
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		switch {
		case label == "":
			fmt.Fprintf(w, "%s{%s} %d\n", name, k, values[k])
		case len(k) > 0 && k[0] == '"':
			fmt.Fprintf(w, "%s{%s=%s} %d\n", name, label, k, values[k])
		default:
			fmt.Fprintf(w, "%s{%s=%q} %d\n", name, label, k, values[k])
		}
	}
}
