package alert

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	bolt "go.etcd.io/bbolt"
)

// Bucket layout in the state database.
var (
	// alert_state: uvarint len + rule name + device → state.
	bucketState = []byte("alert_state")
	// alert_storm: rule name → the storm group of its latest emission point.
	bucketStorm = []byte("alert_storm")
	// alert_meta: the engine's logged clock.
	bucketMeta = []byte("alert_meta")

	buckets = [][]byte{bucketState, bucketStorm, bucketMeta}

	keyClock = []byte("clock")
)

// stateVersion is the first byte of every stored row; bump it when the
// layout changes.
const stateVersion = 1

// state is what the engine remembers of one (rule, device).
type state struct {
	// evaluated is false until a window was evaluated; lastStart and
	// lastEnd are the bounds of the latest evaluated window, lastAt the
	// logged clock when it was.
	evaluated          bool
	lastStart, lastEnd int64
	lastAt             int64
	// streak counts consecutive windows in which when held while not
	// wanting to fire; want is the state the conditions ask for. baseStreak
	// and baseWant are both as they were before the latest window, so a
	// revision of it can be evaluated again.
	streak, baseStreak uint32
	want, baseWant     bool
	// value is the aggregate want's condition compares, in the latest
	// window where that condition held (NaN before any did): a transition
	// sent later, with another window, so reports a value that meets its
	// condition. (Not restored for a revision, which would need one more
	// stored field and a row the previous release cannot read: a revision
	// that undoes a transition while its window sits in the hysteresis band
	// keeps the undone transition's value.)
	value float64
	// firing is the last state sent out (what subscribers believe).
	firing bool
	// hasTrans: a transition was sent, at logged time transAt, keyed with
	// window start transStart.
	hasTrans   bool
	transAt    int64
	transStart int64
	// suppressed counts changes of want not sent when they happened.
	suppressed uint32
}

// pending reports whether a transition is held back.
func (s *state) pending() bool { return s.want != s.firing }

// quiet reports whether s carries nothing a fresh state would not.
func (s *state) quiet() bool {
	return !s.firing && !s.want && s.streak == 0 && s.suppressed == 0
}

const (
	flagEvaluated = 1 << iota
	flagBaseWant
	flagWant
	flagFiring
	flagHasTrans
)

func encodeState(s *state) []byte {
	b := make([]byte, 0, 64)
	var f byte
	set := func(bit byte, on bool) {
		if on {
			f |= bit
		}
	}
	set(flagEvaluated, s.evaluated)
	set(flagBaseWant, s.baseWant)
	set(flagWant, s.want)
	set(flagFiring, s.firing)
	set(flagHasTrans, s.hasTrans)
	b = append(b, stateVersion, f)
	b = binary.AppendVarint(b, s.lastStart)
	b = binary.AppendVarint(b, s.lastEnd)
	b = binary.AppendVarint(b, s.lastAt)
	b = binary.AppendUvarint(b, uint64(s.streak))
	b = binary.AppendUvarint(b, uint64(s.baseStreak))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(s.value))
	b = binary.AppendVarint(b, s.transAt)
	b = binary.AppendVarint(b, s.transStart)
	return binary.AppendUvarint(b, uint64(s.suppressed))
}

func decodeState(b []byte) (*state, error) {
	d := decoder{b: b}
	if v := d.byte(); v != stateVersion {
		return nil, fmt.Errorf("%w: state version %d", ErrCorruptState, v)
	}
	f := d.byte()
	s := &state{
		evaluated: f&flagEvaluated != 0, baseWant: f&flagBaseWant != 0, want: f&flagWant != 0,
		firing: f&flagFiring != 0, hasTrans: f&flagHasTrans != 0,
	}
	s.lastStart, s.lastEnd, s.lastAt = d.varint(), d.varint(), d.varint()
	s.streak, s.baseStreak = d.uvarint32(), d.uvarint32()
	s.value = math.Float64frombits(d.u64())
	s.transAt, s.transStart = d.varint(), d.varint()
	s.suppressed = d.uvarint32()
	if d.err != nil || len(d.b) != 0 {
		return nil, fmt.Errorf("%w: state row", ErrCorruptState)
	}
	return s, nil
}

// group is the storm accounting of one rule at one emission point.
type group struct {
	at                    int64
	count, fired, cleared uint32
	// seqs are the outbox rows of the individual local messages of this
	// group that the current transaction queued (at most the threshold;
	// stored for the rows' layout, cleared by begin); summarySeq the
	// current summary row.
	seqs       []uint64
	summarySeq uint64
	devices    []string
	// part is the summary's part, 0 for the first (see SummaryMessage);
	// fired, cleared and devices count the current part only.
	part uint32
	// held is set while a part after the first waits for the storm's
	// window to end before its summary is queued.
	held bool
	// summaryInTx: summarySeq was queued by the current transaction, so
	// it can still be rewritten (not stored; begin clears it, and seqs).
	summaryInTx bool
}

func encodeGroup(g *group) []byte {
	b := []byte{stateVersion}
	b = binary.AppendVarint(b, g.at)
	b = binary.AppendUvarint(b, uint64(g.count))
	b = binary.AppendUvarint(b, uint64(g.fired))
	b = binary.AppendUvarint(b, uint64(g.cleared))
	b = binary.AppendUvarint(b, g.summarySeq)
	b = binary.AppendUvarint(b, uint64(len(g.seqs)))
	for _, s := range g.seqs {
		b = binary.AppendUvarint(b, s)
	}
	b = binary.AppendUvarint(b, uint64(len(g.devices)))
	for _, d := range g.devices {
		b = appendString(b, d)
	}
	if g.part > 0 {
		// Last and optional, so rows written before parts existed decode;
		// held, only ever set with a part, after it the same way.
		b = binary.AppendUvarint(b, uint64(g.part))
		if g.held {
			b = append(b, 1)
		}
	}
	return b
}

func decodeGroup(b []byte) (*group, error) {
	d := decoder{b: b}
	if v := d.byte(); v != stateVersion {
		return nil, fmt.Errorf("%w: storm version %d", ErrCorruptState, v)
	}
	g := &group{at: d.varint()}
	g.count, g.fired, g.cleared = d.uvarint32(), d.uvarint32(), d.uvarint32()
	g.summarySeq = d.uvarint()
	n := d.uvarint()
	for i := uint64(0); i < n && d.err == nil; i++ {
		g.seqs = append(g.seqs, d.uvarint())
	}
	n = d.uvarint()
	for i := uint64(0); i < n && d.err == nil; i++ {
		g.devices = append(g.devices, d.string())
	}
	// The encoder writes a part only from 2 on, and held only after one,
	// as the byte 1: anything else did not come from it (a fuzz input
	// with part 0 and held decoded to a group that encoded without held).
	bad := false
	if len(d.b) > 0 {
		g.part = d.uvarint32()
		bad = g.part == 0
	}
	if len(d.b) > 0 {
		held := d.byte()
		g.held, bad = held == 1, bad || held != 1
	}
	if d.err != nil || len(d.b) != 0 || bad {
		return nil, fmt.Errorf("%w: storm row", ErrCorruptState)
	}
	return g, nil
}

func stateKey(rule, device string) []byte {
	return append(appendString(make([]byte, 0, 2+len(rule)+len(device)), rule), device...)
}

func parseStateKey(k []byte) (rule, device string, err error) {
	d := decoder{b: k}
	rule = d.string()
	if d.err != nil {
		return "", "", fmt.Errorf("%w: state key %x", ErrCorruptState, k)
	}
	return rule, string(d.b), nil
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decoder reads the encodings above; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

var errShort = errors.New("short")

func (d *decoder) byte() byte {
	if d.err != nil || len(d.b) < 1 {
		d.err = errShort
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) u64() uint64 {
	if d.err != nil || len(d.b) < 8 {
		d.err = errShort
		return 0
	}
	v := binary.BigEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errShort
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errShort
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) uvarint32() uint32 {
	v := d.uvarint()
	if v > math.MaxUint32 {
		d.err = errShort
	}
	return uint32(v)
}

func (d *decoder) string() string {
	n := d.uvarint()
	if d.err != nil || n > uint64(len(d.b)) {
		d.err = errShort
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// Reset drops every alert state bucket (the next New starts with no alert
// firing and no history). Call it with no Engine open on the database.
//
// edgeagent reset-state should not call it: the engine ignores windows it
// has already evaluated, so keeping its state across a rebuild of the
// window state is what stops the rebuilt windows from sending every alert
// of the retained history again.
func Reset(tx *bolt.Tx) error {
	for _, name := range buckets {
		if err := tx.DeleteBucket(name); err != nil && !errors.Is(err, bolt.ErrBucketNotFound) {
			return fmt.Errorf("alert: delete bucket %s: %w", name, err)
		}
	}
	return nil
}
