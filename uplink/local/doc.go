// Package local publishes the outbox's local rows — alert messages and
// republished aggregates the window stage queued for the gateway's own
// broker — so a PLC, an HMI or a relay on site can react while the uplink is
// down.
//
// # Flow
//
// The alert engine (window/alert) appends outbox rows of kind
// outbox.KindLocal inside the window stage's batch transaction; each row's
// Data is a Message encoded with Encode. A Publisher reads those rows in
// outbox order (it skips the aggregate and alert rows, which belong to the
// uplink), publishes each through a Sink and waits for it to succeed, then
// deletes the published rows in one transaction. A failed publish is retried
// with capped exponential backoff from the same row, so order holds and
// nothing is skipped. The Publisher polls every Config.PollInterval and
// wakes at once on Notify.
//
// Two sinks are provided: SinkFunc wraps a function (the agent passes the
// embedded broker's inline Publish), and PahoSink publishes to an external
// broker with QoS 1 and a persistent session.
//
// # Delivery
//
// At least once. A row is deleted only after its publish succeeded (for
// QoS 1, after the PUBACK), so a crash or kill -9 between the two publishes
// the rows of that last round again on restart — at most Config.BatchRows
// of them. Every alert message carries an idempotency key for receivers that
// must act once.
//
// # Caveats
//
//   - One Publisher per state database: two would publish the same rows.
//   - A row that cannot be decoded is logged, counted (Stats.Rejected) and
//     deleted; it cannot be published and must not block the rows after it.
//   - Nothing expires: rows queued while the local broker was unreachable
//     are published when it comes back, however old.
package local
