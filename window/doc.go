// Package window turns Bronze records into deduplicated event-time
// aggregates per (device, metric): Silver parses and deduplicates readings,
// Gold assigns them to tumbling or hopping windows under per-device
// watermarks and emits each window, and its revisions, into the outbox.
//
// The stage is a pure function of Bronze (DESIGN invariant 3): wall-clock
// time enters only as the received-at stamps and logged clock ticks in the
// records. The logged clock is the highest received-at seen so far; idle
// closes, device expiry and the trigger boundaries at which pending
// revisions are emitted all follow from it, so where a record falls in a
// micro-batch never changes what is emitted or in which order.
//
// # Emission points
//
//   - After a reading advances its device's watermark (max event time minus
//     window.watermark_delay): every window of the device whose end is at or
//     before the watermark and not yet emitted, at revision 1 (above the
//     revision base after a reset or replay).
//   - When the logged clock moves: first, if floor(clock/trigger_interval)
//     changed, every pending revision; then the open windows of devices
//     silent for window.idle_timeout (idle close); then devices silent for
//     window.device_expiry are dropped.
//
// At each point windows are emitted sorted by (device, metric, start).
//
// # State
//
// The hot state lives in memory. Every batch commits its outbox entries
// and late and dead-letter rows with the Bronze offset they cover; a state
// checkpoint writes only the rows that changed since the last one. A large
// checkpoint is written in several transactions, so that it never holds
// all its rows in memory at once, and counts only when its last one
// commits, with the offset and the batch's outputs: until then its rows
// are new versions that a restart ignores (see slotted in groups.go), so
// state and offset still change together (DESIGN invariant 2). Emitted windows
// without pending changes, which wait out the allowed lateness and are
// rarely touched again, are kept encoded (parked) until a state checkpoint
// writes them, and then only on disk; late data for one reads it back. New
// loads the rest.
//
// # Caveats
//
//   - Plain-number payloads, and JSON or CBOR payloads with neither an event
//     id nor an event time, carry no identity and are never deduplicated.
//   - Flush emits pending revisions at a point that depends on when it is
//     called; only RunOnce (at the end of Bronze) uses it.
//   - Event ids are deduplicated by a 64-bit FNV-1a hash per device.
//   - Late data for an evicted window reads the state database inside the
//     batch; if that read fails the batch fails and the stage goes back to
//     its last checkpoint, as after a failed commit.
package window
