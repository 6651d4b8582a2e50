// Package uplink drains the outbox to the cloud — NATS JetStream or MQTT —
// in sealed, compressed batches that are sent, acknowledged and only then
// deleted, so that every aggregate arrives exactly once in effect across
// crashes and outages of any length.
//
// # Flow
//
// A sealing goroutine reads the outbox rows of kind aggregate and alert (it
// leaves local rows to the local publisher), groups them in outbox order into
// batches of at most Config.MaxBatchRecords rows and Config.MaxBatchBytes of
// CBOR, encodes and compresses each (uplink/wire), and in one bbolt
// transaction stores the body, its id and its encoding in the uplink_batches
// bucket and deletes the rows from the outbox. A row is therefore always in
// exactly one place, and a batch's bytes are fixed before its first send: a
// resend, even after a crash or an upgrade, is byte-identical.
//
// A sending goroutine owns the connection. It publishes sealed batches
// oldest first, up to eight in flight, waits for each acknowledgement (the
// JetStream PubAck, the MQTT PUBACK) in order, and deletes acknowledged
// batches. A missing ack (Config.AckTimeout), a dropped connection or a
// refused publish closes the connection; the sender reconnects with capped
// exponential backoff and jitter and sends again from the oldest
// unacknowledged batch.
//
// While the link is up, whatever is in the outbox is sealed at once, small
// or not, to keep latency low. While it is down, only full batches are
// sealed: they compress best, and sealing shrinks what the gateway stores
// for the cloud by about seven times, which is what lets a day-long outage of
// a large fleet fit in storage.outbox_max_bytes (see BacklogBytes).
//
// # Batch ids and duplicates
//
// A batch id is "<gateway>-<first outbox seq>-<last outbox seq>-<hash>",
// where hash is 16 hex digits of a SHA-256 over the batch's rows. It is the
// Nats-Msg-Id, so JetStream drops a resend inside the stream's duplicate
// window. A resend after the window (a lost ack followed by a long outage)
// is stored twice; each aggregate's key makes that harmless, because the
// receiver upserts on (gateway, device, metric, start) and keeps the highest
// rev. docs/uplink.md and docs/wire-format.md are the receiver's side.
//
// # Caveats
//
//   - One Uplink per state database. Two would seal the same rows twice.
//   - Order on the stream is the outbox order except after a failure: when
//     the ack of batch n is lost but n+1 was stored, n+1 precedes the resent
//     n. Receivers must not depend on order; the upsert rule does not.
//   - Stats.Resends counts only resends by this process.
//   - A sealed batch larger than the NATS server's max_payload is refused
//     for ever; keep max_batch_bytes (default 256 KiB) below it (default
//     1 MiB). The uplink warns at connect.
//   - MaxBytesPerSecond counts message bodies and headers, not TCP, TLS or
//     protocol framing, which add a few per cent.
package uplink
