// Package alert evaluates alert rules on the window stage's emitted
// aggregates and queues fired and cleared transitions for the uplink and
// for the gateway's local broker in the same transaction as the windows.
//
// The Engine implements window.Observer: the window stage calls Emitted for
// every emitted aggregate, in a deterministic order, inside its batch
// transaction, with the logged clock of the emission (emittedAtMs). The
// engine is a pure function of that sequence of calls and of the
// transactions they come in — it reads no other clock, and nothing of the
// local publisher's — so a replay or a restart neither loses nor repeats a
// transition. The same sequence split into different transactions, with a
// restart in between, writes byte-identical uplink rows, republished
// aggregates and rule state; only how a storm is told locally follows the
// transactions, since a storm never rewrites a local row an earlier,
// committed transaction queued (the publisher may be sending it).
// docs/alerts.md is the user's side.
//
// # Evaluation
//
// A rule applies to aggregates of its metric whose device matches its glob
// (path.Match). Per (rule, device) the engine keeps the start of the latest
// evaluated window and evaluates windows in start order:
//
//   - a window starting after the latest is a new window;
//   - a window starting at the latest (a revision of it, or a re-emission
//     after a reset) is evaluated again from the state before it, and may
//     change the decision;
//   - a window starting before the latest is ignored (counted).
//
// Windows without readings are never emitted, so they neither count in
// nor break a streak. The value compared is the window's aggregate named in
// the condition (count, or sum/min/max/mean/first/last); a window that
// lacks it, or where it is NaN, is not evaluated.
//
// Not firing, a window where when holds adds one to the streak, one where
// it does not resets it; at For the wanted state becomes fired. Firing,
// only clear_when clears (hysteresis). A transition is the wanted state
// differing from the last one sent.
//
// # Rate limit
//
// At most one transition per (rule, device) per min_interval, measured on
// the logged clock (the highest emittedAtMs seen), and at most one per
// (rule, device, window start), which keeps keys unique when revisions
// flip a decision. A change that cannot be sent is held back and counted;
// the next transition sent carries the count in Suppressed (not counting
// itself). A held-back state is sent at the first emission point (of any
// device) once its interval has passed, keyed with the latest window of its
// (rule, device), so a device that flapped and then settled ends in the
// right state without waiting for another window of its own.
//
// # Storms
//
// When more than local_publish.storm_threshold transitions of one rule
// happen at one emission point (same emittedAtMs), every transition still
// goes to the uplink, but their local messages are replaced by one
// summary: the first threshold are queued individually and, at the next,
// deleted from the outbox again and replaced by a summary row, which each
// further transition rewrites. Inside one transaction nothing of this is
// visible to the publisher, which sees one summary. Rules with retain: true
// are never folded: their topics hold each device's current state.
//
// # State
//
// Per (rule, device) the engine stores its state in bucket alert_state,
// the storm accounting per rule in alert_storm and its logged clock in
// alert_meta, all written in the caller's transaction. If that
// transaction does not commit, the next Emitted call (seeing a new
// transaction) reloads the in-memory state from the database. Quiet states
// (not firing, nothing held back) are dropped after Config.Expiry of logged
// time; states of removed rules, or of devices a rule no longer matches,
// are dropped by New.
//
// # Caveats
//
//   - Removing a rule or narrowing its devices forgets its firing alerts
//     without sending cleared.
//   - A storm that spans two transactions (readings with the same
//     received-at millisecond on either side of a micro-batch boundary)
//     may let the publisher send some of the first individual messages
//     before the summary replaces them. When it already sent the summary,
//     the storm goes on in a new part (SummaryMessage.Part) with its own
//     key, counting only the transitions after it.
//   - Held-back transitions are sent only when some window is emitted; a
//     gateway whose devices are all silent sends nothing.
package alert
