// Package buffer is Bronze: the append-only, fsync'd bbolt log of every raw
// message the gateway received, from which the window stage replays.
//
// Every record gets a sequence number at append. Ingest appends a whole
// acknowledgement batch in one transaction and acknowledges to the broker
// only after Append returns (DESIGN invariant 1). The batch is stored as one
// bbolt value, a chunk, under the big-endian sequence of its first record:
// each Record (topic, QoS, retained flag, received-at and the unparsed
// payload) as a uvarint length and its encoding. One key per record, as
// DESIGN sketches it, cost a bbolt Put and its allocations per message, and
// a Delete per message again when retention trims; with chunks both are per
// batch. Reads and Scan still go record by record from any sequence;
// retention trims whole chunks.
//
// # Bounds
//
// Retention by age and by bytes applies only to records the window stage has
// checkpointed past (SetCheckpoint). When MaxBytes is reached and every
// record is still unprocessed, Append returns ErrFull and stores nothing: the
// caller withholds acknowledgements and the broker keeps queueing.
//
// # Caveats
//
// bbolt allows one process to open a file for writing; a second Open waits
// for the lock and fails after a timeout. Inspect a running agent through its
// status endpoint. The file never shrinks: freed pages are reused.
package buffer
