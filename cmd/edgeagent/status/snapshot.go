// Package status serves the agent's local status endpoint — Prometheus
// metrics, health and readiness, a JSON snapshot, an offline HTML page for
// technicians and read-only views of its tables — and fetches it for the
// `edgeagent status` and `inspect` commands.
package status

import "time"

// Snapshot is the agent's state at one instant: the body of /status.json,
// and what /metrics and the HTML page are rendered from.
type Snapshot struct {
	Gateway       string    `json:"gateway"`
	Version       string    `json:"version"`
	Time          time.Time `json:"time"`
	UptimeSeconds float64   `json:"uptime_seconds"`
	// ReloadRefused is why the last SIGHUP was refused: the config file
	// is not the config in force ("" after a start or a reload).
	ReloadRefused string `json:"reload_refused,omitempty"`

	Ingest Ingest `json:"ingest"`
	Bronze Bronze `json:"bronze"`
	Window Window `json:"window"`
	Outbox Outbox `json:"outbox"`
	Uplink Uplink `json:"uplink"`
	// Alerts is nil without alert rules or local_publish.aggregates_topic.
	Alerts *Alerts `json:"alerts,omitempty"`

	// Rates over the last RateWindow, computed by the server from samples.
	Rates Rates `json:"rates"`
	// Warnings are the conditions an operator should look at, worst first.
	Warnings []string `json:"warnings"`
	// DeadLetters are the most recent dead letters (newest first).
	DeadLetters []DeadLetter `json:"dead_letters,omitempty"`
}

// Ingest is the MQTT side.
type Ingest struct {
	Broker             string  `json:"broker"`
	Connected          bool    `json:"connected"`
	ReceivedTotal      uint64  `json:"received_total"`
	CommittedTotal     uint64  `json:"committed_total"`
	AckedTotal         uint64  `json:"acked_total"`
	CommitsTotal       uint64  `json:"commits_total"`
	CommitFailures     uint64  `json:"commit_failures_total"`
	CommitSecondsTotal float64 `json:"commit_seconds_total"`
	LastCommitSeconds  float64 `json:"last_commit_seconds"`
	Reconnects         uint64  `json:"reconnects_total"`
	// BrokerDropped: messages the embedded broker dropped for a client
	// whose write queue was full (always 0 with an external broker).
	BrokerDropped uint64 `json:"broker_dropped_total"`
	// SessionsLost counts connects on which the broker had no session
	// for the agent where it should have kept one (since start).
	SessionsLost uint64 `json:"sessions_lost_total"`
	// SessionLostAt is when the last was seen (zero: never).
	SessionLostAt time.Time `json:"session_lost_at,omitzero"`
	// SubscribeError names subscriptions the broker refused or granted at
	// a lower QoS on the last connect.
	SubscribeError string            `json:"subscribe_error,omitempty"`
	Rejected       map[string]uint64 `json:"rejected_total"`
	// BronzeFull is set while Bronze is at storage.bronze_max_bytes with
	// unprocessed records; BronzeFullTotal counts the times it got there.
	BronzeFull      bool   `json:"bronze_full"`
	BronzeFullTotal uint64 `json:"bronze_full_total"`
	// CommitFailing is set while Bronze commits fail (a full disk, an I/O
	// error), LastCommitError says why.
	CommitFailing   bool   `json:"commit_failing"`
	LastCommitError string `json:"last_commit_error,omitempty"`
	// LastError is the last commit or broker connection error, "" after
	// the next success.
	LastError string `json:"last_error,omitempty"`
}

// Bronze is the raw log.
type Bronze struct {
	Records  int64 `json:"records"`
	Bytes    int64 `json:"bytes"`
	MaxBytes int64 `json:"max_bytes"`
	// BacklogRecords are the records the window stage has not processed
	// yet; UnprocessedBytes estimates their bytes (the log's mean record).
	BacklogRecords   uint64  `json:"backlog_records"`
	UnprocessedBytes int64   `json:"unprocessed_bytes"`
	FirstSeq         uint64  `json:"first_seq"`
	LastSeq          uint64  `json:"last_seq"`
	Checkpoint       uint64  `json:"checkpoint"`
	OldestAge        float64 `json:"oldest_age_seconds"`
	Retention        float64 `json:"retention_seconds"`
}

// Window is the window stage.
type Window struct {
	ProcessedTotal uint64 `json:"processed_total"`
	ReadingsTotal  uint64 `json:"readings_total"`
	BatchesTotal   uint64 `json:"batches_total"`
	// CheckpointsByReason counts the state checkpoints since the agent
	// started by what made them due: interval (processing.checkpoint_interval),
	// delta (100,000 changes held), caught_up (a replay after a crash
	// caught up), bronze_full, stop (shutdown, run --once).
	CheckpointsByReason    map[string]uint64 `json:"checkpoints_by_reason"`
	LastBatchSeconds       float64           `json:"last_batch_seconds"`
	LastBatchRecords       int               `json:"last_batch_records"`
	TriggerIntervalSeconds float64           `json:"trigger_interval_seconds"`
	EmittedTotal           uint64            `json:"emitted_total"`
	RevisionsTotal         uint64            `json:"revisions_total"`
	OpenWindows            int               `json:"open_windows"`
	EvictedWindows         int               `json:"evicted_windows"`
	PendingRevisions       int               `json:"pending_revisions"`
	DedupEntries           int               `json:"dedup_entries"`
	Devices                int               `json:"devices"`
	// Tombstones are expired devices' lateness horizons, kept for
	// readings.max_past_skew: a fleet that keeps inventing device names
	// grows them (64 bytes each) though no device has state.
	Tombstones int `json:"tombstones"`
	// At most window.max_devices are kept: past that the oldest are
	// dropped, counted here, and TombstoneFloor is the newest horizon
	// among them while max_past_skew has not passed it: devices not seen
	// before take no readings for windows ending by then (late table).
	TombstonesDropped   uint64            `json:"tombstones_dropped_total"`
	TombstoneFloor      *time.Time        `json:"tombstone_floor,omitempty"`
	StateBytes          int64             `json:"state_bytes"`
	LateTotal           uint64            `json:"late_total"`
	DuplicatesTotal     uint64            `json:"duplicates_total"`
	DeadLettersTotal    uint64            `json:"dead_letters_total"`
	DeadLettersByReason map[string]uint64 `json:"dead_letters_by_reason"`
	// The late and dead-letter tables are bounded: the oldest rows past
	// the bound are evicted, counted here. DevicesExpired counts devices
	// whose state was dropped after window.device_expiry.
	// Failing is set while window batches fail and are retried (a full
	// disk under the state database, say); LastError says why.
	Failing               bool      `json:"failing"`
	FailuresTotal         uint64    `json:"failures_total"`
	LastError             string    `json:"last_error,omitempty"`
	LateRowsEvicted       uint64    `json:"late_rows_evicted_total"`
	DeadLetterRowsEvicted uint64    `json:"dead_letter_rows_evicted_total"`
	DevicesExpired        uint64    `json:"devices_expired_total"`
	LatestEventTime       time.Time `json:"latest_event_time"`
	// LoggedClock is the newest received-at or clock tick the stage has
	// processed: ahead of the gateway's clock only when that clock went
	// back.
	LoggedClock  time.Time `json:"logged_clock,omitzero"`
	LagSeconds   float64   `json:"lag_seconds"`
	Blocked      bool      `json:"blocked"`
	BlockedTotal uint64    `json:"blocked_total"`
}

// Outbox is the queue to the uplink (sealed batches included).
type Outbox struct {
	Rows      uint64  `json:"rows"`
	Bytes     uint64  `json:"bytes"`
	MaxBytes  int64   `json:"max_bytes"`
	OldestAge float64 `json:"oldest_age_seconds"`
}

// Uplink is the link to the cloud.
type Uplink struct {
	Transport string    `json:"transport"`      // nats, mqtt or "" when disabled
	State     string    `json:"state"`          // up, down, connecting, disabled
	Since     time.Time `json:"since,omitzero"` // absent while disabled
	// DownSince is when the link was last up (or the agent started),
	// absent while it is up: reconnect attempts change State, not this.
	DownSince time.Time `json:"down_since,omitzero"`
	// FailingSince is when sending last failed (a refused or unacknowledged
	// batch, a dropped link) with nothing acknowledged since; absent once a
	// batch is. It outlives reconnects, which DownSince does not.
	FailingSince time.Time `json:"failing_since,omitzero"`
	// DownFor and FailingFor are how long since DownSince and FailingSince
	// by Go's monotonic clock, which a step of the gateway's clock does
	// not move (after NTP's step at boot the stamps say decades); zero
	// where the snapshot does not know, and Time is used.
	DownFor         time.Duration `json:"-"`
	FailingFor      time.Duration `json:"-"`
	ReconnectsTotal uint64        `json:"reconnects_total"`
	BatchesSent     uint64        `json:"batches_sent_total"`
	AggregatesSent  uint64        `json:"aggregates_sent_total"`
	AlertsSent      uint64        `json:"alerts_sent_total"`
	BytesSent       uint64        `json:"bytes_sent_total"`
	Resends         uint64        `json:"resends_total"`
	Duplicates      uint64        `json:"duplicates_total"`
	AckTimeouts     uint64        `json:"ack_timeouts_total"`
	LastAckSeconds  float64       `json:"last_ack_seconds"`
	SealedBatches   uint64        `json:"sealed_batches"`
	LastError       string        `json:"last_error,omitempty"`
}

// Alerts are the alert rules' figures and the local publisher's.
type Alerts struct {
	Rules int `json:"rules"`
	// Firing counts (rule, device) pairs whose last transition was fired.
	Firing       int            `json:"firing"`
	FiringByRule map[string]int `json:"firing_by_rule"`
	FiredTotal   uint64         `json:"fired_total"`
	ClearedTotal uint64         `json:"cleared_total"`
	// SuppressedTotal counts changes min_interval held back.
	SuppressedTotal uint64 `json:"suppressed_total"`
	SummariesTotal  uint64 `json:"summaries_total"`
	// Local* are the messages to the gateway's own broker.
	LocalQueuedTotal    uint64 `json:"local_queued_total"`
	LocalPublishedTotal uint64 `json:"local_published_total"`
	LocalFailuresTotal  uint64 `json:"local_failures_total"`
	LocalLastError      string `json:"local_last_error,omitempty"`
}

// Rates are per-second figures over the last RateWindow.
type Rates struct {
	InputPerSecond     float64 `json:"input_msgs_per_second"`
	ProcessedPerSecond float64 `json:"processed_records_per_second"`
	// BacklogGrowth is the change in Bronze backlog records per second.
	BacklogGrowth float64 `json:"backlog_growth_per_second"`
	SentPerSecond float64 `json:"uplink_bytes_per_second"`
}

// DeadLetter is one dead-letter row as shown to operators.
type DeadLetter struct {
	Seq        uint64    `json:"seq"`
	Topic      string    `json:"topic"`
	Device     string    `json:"device,omitempty"`
	ReceivedAt time.Time `json:"received_at"`
	Code       string    `json:"code"`
	Reason     string    `json:"reason"`
	Payload    string    `json:"payload,omitempty"`
}

// downFor is how long the link has not been up (see DownFor).
func (u *Uplink) downFor(now time.Time) time.Duration {
	if u.DownFor > 0 {
		return u.DownFor
	}
	return now.Sub(u.DownSince)
}

// failingFor is how long sending has failed (see FailingFor).
func (u *Uplink) failingFor(now time.Time) time.Duration {
	if u.FailingFor > 0 {
		return u.FailingFor
	}
	return now.Sub(u.FailingSince)
}
