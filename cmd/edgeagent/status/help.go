package status

import (
	"bufio"
	"bytes"
	"io"
	"strings"
)

// metricHelp is the HELP text of every edgeagent_ family. VictoriaMetrics/
// metrics writes "# HELP name" with no text (it has no place for one), so
// writeWithHelp fills it in from here; TestMetricsHaveHelp fails for a family
// added without an entry.
var metricHelp = map[string]string{
	"edgeagent_info":                                  "Build and identity: the gateway name and the agent's version, as labels.",
	"edgeagent_uptime_seconds":                        "Seconds since the agent started or was last reloaded (SIGHUP).",
	"edgeagent_warnings":                              "Active warnings; status.json and the status page name each one's cause.",
	"edgeagent_ingest_connected":                      "1 while the agent is connected to the device broker.",
	"edgeagent_ingest_messages_received_total":        "MQTT messages received from the device broker.",
	"edgeagent_ingest_messages_committed_total":       "Messages committed to Bronze (durable on disk).",
	"edgeagent_ingest_messages_acked_total":           "QoS 1 and 2 messages acknowledged to the broker, each after its Bronze commit.",
	"edgeagent_ingest_reconnects_total":               "Reconnects to the device broker.",
	"edgeagent_ingest_broker_dropped_total":           "Messages the built-in broker dropped for a local subscriber that fell mqtt.embedded.max_pending_writes behind.",
	"edgeagent_ingest_sessions_lost_total":            "Connects on which the broker had lost the agent's session, and what it had queued for it.",
	"edgeagent_ingest_rejected_total":                 "Messages stored in Bronze as rejected at ingest, by reason.",
	"edgeagent_input_messages_per_second":             "Messages received from the device broker per second, over the last 10 seconds.",
	"edgeagent_bronze_commits_total":                  "Bronze group commits (one fsync each).",
	"edgeagent_bronze_commit_failures_total":          "Bronze commits that failed (disk full, I/O error); their messages were not acknowledged.",
	"edgeagent_bronze_full_total":                     "Times Bronze reached storage.bronze_max_bytes with unprocessed records and held acknowledgements.",
	"edgeagent_bronze_commit_seconds_total":           "Seconds spent in Bronze commits.",
	"edgeagent_bronze_last_commit_seconds":            "Duration of the last Bronze commit.",
	"edgeagent_bronze_records":                        "Records in Bronze.",
	"edgeagent_bronze_bytes":                          "Bytes of records in Bronze.",
	"edgeagent_bronze_max_bytes":                      "storage.bronze_max_bytes (0: no bound).",
	"edgeagent_bronze_backlog_records":                "Bronze records the window stage has not processed yet.",
	"edgeagent_bronze_backlog_bytes":                  "Bytes of unprocessed Bronze records, estimated from the log's mean record size.",
	"edgeagent_bronze_oldest_age_seconds":             "Age of the oldest record in Bronze.",
	"edgeagent_bronze_full":                           "1 while Bronze is at its bound and acknowledgements are held.",
	"edgeagent_window_records_processed_total":        "Bronze records the window stage processed.",
	"edgeagent_window_readings_total":                 "Readings taken into windows after dedup (one a message; a reading may carry several metrics).",
	"edgeagent_processed_records_per_second":          "Bronze records the window stage processed per second, over the last 10 seconds.",
	"edgeagent_window_batches_total":                  "Window stage micro-batches committed.",
	"edgeagent_window_checkpoints_total":              "State checkpoints written since the agent started, by what made them due (interval, delta, caught_up, bronze_full, stop).",
	"edgeagent_window_batch_duration_seconds":         "Duration of the last window stage micro-batch.",
	"edgeagent_window_trigger_interval_seconds":       "processing.trigger_interval: how often the stage runs a micro-batch.",
	"edgeagent_window_aggregates_emitted_total":       "Window aggregates written to the outbox, revisions included.",
	"edgeagent_window_revisions_total":                "Aggregates emitted as a revision (rev > 1) of a window already sent.",
	"edgeagent_window_open_windows":                   "Windows in state, evicted ones included.",
	"edgeagent_window_evicted_windows":                "Emitted windows waiting out their lateness in the state database, not in memory.",
	"edgeagent_window_pending_revisions":              "Windows changed since their last emission, waiting for the next trigger.",
	"edgeagent_window_dedup_entries":                  "Event ids held for deduplication.",
	"edgeagent_window_devices":                        "Devices with state in the window stage.",
	"edgeagent_window_tombstones":                     "Expired devices whose lateness horizon is kept (for readings.max_past_skew).",
	"edgeagent_window_tombstones_dropped_total":       "Tombstones dropped to keep them within window.max_devices.",
	"edgeagent_window_state_bytes":                    "Estimated memory the window state takes.",
	"edgeagent_late_readings_total":                   "Late-table rows: one per metric of a reading and window that refused it, past its lateness horizon.",
	"edgeagent_duplicate_readings_total":              "Readings dropped as duplicates of an event id already taken.",
	"edgeagent_dead_letters_total":                    "Records the window stage could not use, by reason (the dead-letter table).",
	"edgeagent_window_failing":                        "1 while window batches fail and are retried with backoff.",
	"edgeagent_window_failures_total":                 "Window batches that failed.",
	"edgeagent_late_rows_evicted_total":               "Oldest late-table rows dropped at the table's bound.",
	"edgeagent_dead_letter_rows_evicted_total":        "Oldest dead-letter rows dropped at the table's bound.",
	"edgeagent_devices_expired_total":                 "Devices whose state was dropped after window.device_expiry without readings.",
	"edgeagent_end_to_end_lag_seconds":                "Now minus the latest event time processed.",
	"edgeagent_window_logged_clock_timestamp_seconds": "The window stage's logged clock: the newest received-at or clock tick it has seen, or after a gateway clock step back that mark moved on by half the stamps' advance (Unix seconds).",
	"edgeagent_window_blocked":                        "1 while the outbox is over its bound and the window stage consumes nothing.",
	"edgeagent_window_blocked_total":                  "Times the outbox reached its bound and the window stage stopped consuming Bronze.",
	"edgeagent_outbox_rows":                           "Outbox rows (aggregates, alerts, local messages) not yet sealed into a batch (see edgeagent_uplink_sealed_batches).",
	"edgeagent_outbox_bytes":                          "Bytes of outbox rows plus sealed, unacknowledged batches (what storage.outbox_max_bytes bounds).",
	"edgeagent_outbox_max_bytes":                      "storage.outbox_max_bytes (0: no bound).",
	"edgeagent_uplink_lag_seconds":                    "Age of the oldest unsent aggregate in the outbox.",
	"edgeagent_uplink_up":                             "1 while the uplink is connected.",
	"edgeagent_uplink_state":                          "The uplink's state: 1 for the current one.",
	"edgeagent_uplink_reconnects_total":               "Reconnects of the uplink.",
	"edgeagent_uplink_batches_sent_total":             "Batches acknowledged upstream.",
	"edgeagent_uplink_aggregates_sent_total":          "Aggregates in batches acknowledged upstream.",
	"edgeagent_uplink_alerts_sent_total":              "Alert transitions in batches acknowledged upstream.",
	"edgeagent_uplink_bytes_sent_total":               "Bytes of every batch published upstream, headers and resends included (compressed, as on the wire).",
	"edgeagent_uplink_resends_total":                  "Batches sent again after a failure or a timeout.",
	"edgeagent_uplink_duplicates_total":               "Batches the server acknowledged as duplicates of its idempotency key.",
	"edgeagent_uplink_ack_timeouts_total":             "Batches whose acknowledgement did not come within uplink.ack_timeout.",
	"edgeagent_uplink_last_ack_seconds":               "Round trip of the last acknowledged batch.",
	"edgeagent_uplink_failing_seconds":                "How long batches have been refused or left unacknowledged, across reconnects; 0 while acknowledged.",
	"edgeagent_uplink_sealed_batches":                 "Batches sealed and waiting to be sent or acknowledged.",
	"edgeagent_uplink_bytes_per_second":               "Bytes sent upstream per second, over the last 10 seconds.",
	"edgeagent_alert_rules":                           "Alert rules configured.",
	"edgeagent_alerts_firing":                         "Alerts firing now.",
	"edgeagent_alerts_firing_by_rule":                 "Alerts firing now, by rule.",
	"edgeagent_alerts_fired_total":                    "Alert transitions to firing.",
	"edgeagent_alerts_cleared_total":                  "Alert transitions to cleared.",
	"edgeagent_alerts_suppressed_total":               "Alert transitions held back by min_interval.",
	"edgeagent_alert_summaries_total":                 "Alert storms: summary messages queued in place of a rule's local alert messages within its storm window.",
	"edgeagent_local_messages_queued_total":           "Messages queued for publishing on the local broker.",
	"edgeagent_local_messages_published_total":        "Messages published on the local broker (acknowledged at QoS 1).",
	"edgeagent_local_publish_failures_total":          "Local publish attempts that failed (each is retried).",
}

// writeWithHelp writes what write writes to w, each empty "# HELP name" line
// given its text from metricHelp; families without an entry (the process_
// and go_ ones) keep theirs as they are.
func writeWithHelp(w io.Writer, write func(io.Writer)) error {
	var buf bytes.Buffer
	write(&buf)
	out := bufio.NewWriter(w)
	for line := range strings.Lines(buf.String()) {
		if name, ok := strings.CutPrefix(line, "# HELP "); ok {
			name = strings.TrimSuffix(name, "\n")
			if text := metricHelp[name]; text != "" {
				out.WriteString("# HELP " + name + " " + text + "\n")
				continue
			}
		}
		out.WriteString(line)
	}
	return out.Flush()
}
