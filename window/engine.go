package window

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/edgeagent/edgeagent/buffer"
	"github.com/edgeagent/edgeagent/internal/decsum"
	"github.com/edgeagent/edgeagent/internal/topic"
	"github.com/edgeagent/edgeagent/uplink/wire"
)

// The engine is the in-memory window stage: it consumes Bronze records one
// at a time and decides, from them alone, what to emit and when. It knows
// nothing of bbolt; it records which state rows changed so the Stage can
// write a delta, and collects emissions, late and dead-letter rows for the
// batch transaction.

const (
	noTime  = math.MinInt64 // "nothing yet" for watermarks and horizons
	endless = math.MaxInt64 // "nothing due"
)

// window is one event-time window of one metric of one device.
type window struct {
	// ser is the window's series in engine.sers: an index, not a pointer,
	// so that windows hold no pointers and the collector, which counts a
	// densely marked span's objects whole as scannable, leaves them out
	// of the heap pacer's headroom (internal/heapgoal).
	ser                        seriesID
	start                      int64 // unix ms
	count                      uint64
	sum, min, max, first, last float64
	firstT, lastT              int64
	firstSeq, lastSeq          uint64
	rev                        uint32
	dirtyAt                    int32 // index in engine.dirtyWins while dirty
	emitted                    bool  // at least one revision went out
	pending                    bool  // changed since the last emission
	ptime                      bool  // a reading used its received-at
	dirty, dead                bool
}

func (w *window) add(v float64, t int64, seq uint64, ptime bool) {
	if w.count == 0 {
		w.min, w.max = v, v
		w.first, w.firstT, w.firstSeq = v, t, seq
		w.last, w.lastT, w.lastSeq = v, t, seq
	} else {
		w.min = math.Min(w.min, v)
		w.max = math.Max(w.max, v)
		// first/last by event time; ties go to the lower / higher Bronze sequence.
		if t < w.firstT || t == w.firstT && seq < w.firstSeq {
			w.first, w.firstT, w.firstSeq = v, t, seq
		}
		if t > w.lastT || t == w.lastT && seq > w.lastSeq {
			w.last, w.lastT, w.lastSeq = v, t, seq
		}
	}
	w.count++
	w.sum += v
	w.ptime = w.ptime || ptime
}

// seriesID is a series' index in engine.sers; 0 is none.
type seriesID uint32

// series is one metric of one device: its windows in state.
type series struct {
	dev     *device
	name    string
	windows []*window
	// evicted are the starts of emitted windows without pending changes
	// whose state is only in the state database or in parked: late data
	// is rare, so a window waiting out its lateness costs a bit here
	// instead of a *window (see engine.park).
	evicted startSet
	// The two 4-byte fields last and together: 80 bytes, a size class
	// below the 96 that padding after each of them took (load mode holds
	// about 19,000 series).
	id seriesID
	// parked is the newest of the series' windows parked since the last
	// checkpoint, in engine.parkArena (see engine.park).
	parked parkRef
}

func (s *series) find(start int64) *window {
	for i := len(s.windows) - 1; i >= 0; i-- {
		if s.windows[i].start == start {
			return s.windows[i]
		}
	}
	return nil
}

// device is the per-device state: watermark, lateness horizon, dedup set.
type device struct {
	name string
	maxT int64 // max event time, unix ms
	// finalBefore is the lateness horizon: windows ending at or before it
	// are final (late data goes to the late table). It only grows, so a
	// config change to delay or lateness can never revive a pruned window.
	finalBefore int64
	lastSeen    int64 // logged clock (unix ns) of the last new reading
	// series are the device's metrics in state, in no order: a slice,
	// since a device has a handful and a map costs ~300 bytes a device.
	series []*series
	// dedup holds the event-id hashes by the end of the reading's last
	// window; an id counts while that end is after finalBefore.
	dedup      dedupSet
	nextEmit   int64   // min end of windows not yet emitted
	nextPrune  int64   // min end of emitted windows without pending changes
	prev, next *device // in engine.active, or engine.idleList when idle
	// The small fields last and together: a device is one of the largest
	// populations in memory (10,000 in load mode), and this keeps it at 160
	// bytes, a size class of its own.
	shard  uint16 // of its state group rows: shardOf(name)
	hasMax bool
	idle   bool // idle-closed: in the idle list
	dirty  bool
	dead   bool
	// dedupDirty says the device is in the engine's list of dedup sets to
	// write.
	dedupDirty bool
}

// seriesOf returns the device's series of metric name, or nil. A device
// past seriesIndexMin series is looked up through a map: a publisher
// sending new metric names with every reading made each of its readings
// scan every series it had (an audit: 64,000 series of one device took 25
// s to process, 1.8 s spread over 1,000 devices).
func (e *engine) seriesOf(d *device, name []byte) *series {
	if len(d.series) > seriesIndexMin {
		idx := e.seriesIdx[d]
		if idx == nil {
			idx = make(map[string]*series, len(d.series))
			for _, s := range d.series {
				idx[s.name] = s
			}
			e.seriesIdx[d] = idx
		}
		return idx[string(name)]
	}
	for _, s := range d.series {
		if s.name == string(name) {
			return s
		}
	}
	return nil
}

// seriesIndexMin is the number of a device's series from which seriesOf
// goes through a map (devices usually have a handful).
const seriesIndexMin = 32

// addSeries makes a series of metric name for d.
func (e *engine) addSeries(d *device, name []byte) *series {
	s := &series{dev: d, name: e.internMetric(name)}
	e.register(s)
	d.series = append(d.series, s)
	if idx := e.seriesIdx[d]; idx != nil {
		idx[s.name] = s
	}
	return s
}

// register gives s an id in e.sers, reusing a dropped series' id.
// Not inlined, nor is unregister: the arm64 binary's code budget
// (docs/performance.md, Binary size).
//
//go:noinline
func (e *engine) register(s *series) {
	if n := len(e.freeSers); n > 0 {
		s.id = e.freeSers[n-1]
		e.freeSers = e.freeSers[:n-1]
		e.sers[s.id] = s
		return
	}
	s.id = seriesID(len(e.sers))
	e.sers = append(e.sers, s)
}

// unregister frees s's id; s's windows must be gone.
//
//go:noinline
func (e *engine) unregister(s *series) {
	e.sers[s.id] = nil
	e.freeSers = append(e.freeSers, s.id)
}

// serOf returns w's series (not inlined: see register).
//
//go:noinline
func (e *engine) serOf(w *window) *series { return e.sers[w.ser] }

// listOf returns the list d is in.
func (e *engine) listOf(d *device) *devList {
	if d.idle {
		return &e.idleList
	}
	return &e.active
}

// devList is a doubly linked list of devices ordered by lastSeen.
type devList struct{ head, tail *device }

func (l *devList) push(d *device) {
	d.prev, d.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = d
	} else {
		l.head = d
	}
	l.tail = d
}

func (l *devList) remove(d *device) {
	if d.prev != nil {
		d.prev.next = d.next
	} else {
		l.head = d.next
	}
	if d.next != nil {
		d.next.prev = d.prev
	} else {
		l.tail = d.prev
	}
	d.prev, d.next = nil, nil
}

type sub struct {
	tmpl   *topic.Template
	format string
}

// emission is an aggregate to be written by the batch's commit: its window
// as it was when emitted, without the pointers and strings of its wire
// form (88 bytes, against about 270 with the key and boxed figures the wire
// form allocates). When 10,000 devices go idle at once, one batch emits
// some 30,000 aggregates, and their wire forms were a fifth of the heap.
type emission struct {
	ser   *series
	start int64
	at    int64 // logged clock, unix ms
	count uint64
	rev   uint32
	ptime bool
	// vals are sum, min, max, mean, first and last, the sum and mean
	// already exact (decsum.Snap).
	vals [6]float64
}

// counters are the stage's cumulative counts; they are persisted with the
// state so they survive restarts.
type counters struct {
	Records, Ticks, Readings uint64
	Emitted, Revisions       uint64
	Late, LateEvicted        uint64
	Duplicates               uint64
	Dead                     [len(codeIndex)]uint64
	DeadEvicted              uint64
	LateRows, DeadRows       uint64
	DevicesExpired           uint64
	MaxEventTime             int64
	// TombstonesDropped counts the tombstones dropped for max_devices
	// (dropTombstones); stored last, absent from states saved before it.
	TombstonesDropped uint64
}

var codeIndex = [...]string{
	CodeUnknownTopic, CodeRejected, CodeNotJSON, CodeNotCBOR, CodeNotNumber,
	CodeNotObject, CodeTimeMissing, CodeTimeType, CodeTimeInvalid, CodeTimeFuture,
	CodeTimePast, CodeMetricType, CodeNoMetrics, CodeTooManyMetrics, CodeTooManyDevices,
	CodeNameTooLong,
}

func codeIdx(code string) int {
	for i, c := range codeIndex {
		if c == code {
			return i
		}
	}
	return 0
}

type engine struct {
	cfg                                       *Config
	sizeMs, slideMs, delayMs, lateMs          int64
	idleNs, expiryNs, triggerNs, futNs, pasNs int64
	subs                                      []sub
	aggs                                      struct{ sum, min, max, mean, first, last bool }
	x                                         *extractor
	rd                                        reading

	devices devTable
	// sers holds every series by its id (windows name theirs by id), and
	// freeSers the ids of series dropped since (an expired device's, or
	// a pruned empty one).
	sers     []*series
	freeSers []seriesID
	// metricNames interns series names: 10,000 devices report the same
	// few metrics, and each series held its own copy of the name.
	metricNames map[string]string
	// seriesIdx indexes the series of devices past seriesIndexMin of them
	// (see seriesOf).
	seriesIdx  map[*device]map[string]*series
	active     devList
	idleList   devList
	tombstones map[string]int64 // expired device → its lateness horizon
	pending    map[*window]struct{}
	clock      int64 // logged clock, unix ns: see loggedClock
	lastStamp  int64 // the last record's received-at (loggedClock)
	offset     uint64
	gen        uint64 // the committed checkpoint's generation (see slotted)
	revBase    uint32 // revisions start above this (raised by reset and replay)
	highRev    uint32 // highest revision ever emitted
	nWindows   int
	nDedup     int
	c          counters
	// suppressThrough is the last Bronze sequence whose outputs (outbox,
	// late and dead-letter rows) are already committed: after a restart
	// from an older state checkpoint the engine replays those records to
	// rebuild its state, and writes their outputs only once.
	suppressThrough uint64
	replaying       bool
	// deferReplayed is set when the outputs through suppressThrough were
	// written under other settings than the current ones (a restart after
	// a crash, with a changed config; Config.behaviour): the catch-up then
	// decides emissions the outputs may not hold, or holds with other
	// content. What it emits is kept pending instead, and goes out after
	// the catch-up above every revision already written (revBase), so no
	// key carries two contents and no revision goes back.
	deferReplayed bool
	// clearRows: the late and dead-letter rows of the records after
	// clearRowsAfter (the checkpoint's offset) were decided under the old
	// settings; the first commit deletes them, and the catch-up writes
	// what the current ones decide, so a reading is in one place.
	clearRows      bool
	clearRowsAfter uint64

	// batch outputs and state delta
	out []emission
	// outHint is a quarter more than the last batch's count of emissions
	// when its array was too large to keep: the next batch makes its array
	// that size at its first emission instead of growing one to it by
	// appends, which allocated three to four times the array (load mode:
	// 70 of the 820 MB a run allocated).
	outHint   int
	lates     []Late
	dls       []DeadLetter
	dirtyWins []*window
	// delWins are the windows dropped since the last checkpoint whose
	// stored rows may differ from what is final (changed since, or parked
	// unwritten): their deletes must be written. delFinal are the others,
	// whose stored rows say emitted with nothing pending: a load prunes
	// such a row again, so its delete may wait (see deferDeletes).
	delWins  []seriesStart
	delFinal []seriesStart
	// dedupDirty are the devices whose dedup groups changed since the
	// last checkpoint; dedupRows counts the rows that changed.
	dedupDirty []*device
	dedupRows  int
	dirtyDevs  []*device
	delDevs    []string
	tombPut    []string
	tombDel    []string
	revsDirty  bool
	tombPruned int64 // clock of the last tombstone pruning
	// tombFloor is the newest horizon of the tombstones dropped to keep
	// their number within max_devices: a device not seen before may be
	// one of them, so its windows ending by then are final (noTime: none
	// dropped, or the floor is past max_past_skew).
	tombFloor      int64
	tombFloorDirty bool
	// droppedAtLoad counts the tombstones the load dropped, saved under a
	// larger max_devices, for the stage to log.
	droppedAtLoad uint64

	nameBuf []byte
	due     []*window

	// load reads an evicted window back from the state database; the
	// Stage sets it. Without it (benchmarks, Replay) nothing is evicted.
	load func(dev, metric string, start int64) (*window, error)
	// loadDedup reads a cold dedup group's ids back (see dedupSet); set
	// together with load.
	loadDedup func(dev string, end int64) ([]uint64, error)
	// loadErr is the first failed load of this batch: the Step fails and
	// the state is reloaded from the last checkpoint.
	loadErr  error
	nEvicted int    // windows in series.evicted (counted in nWindows too)
	loads    uint64 // evicted windows read back from disk, since New
	// parkedSers are the series with windows parked since the last
	// checkpoint, nParked those windows (see park).
	parkedSers []*series
	parkArena  parkArena
	parkBuf    []byte
	nParked    int
	unparks    uint64 // parked windows read back, since New
	// dedupLoads are cold dedup groups read back, since New.
	dedupLoads uint64
}

func newEngine(cfg *Config) *engine {
	e := &engine{
		cfg:         cfg,
		sizeMs:      cfg.Size.Milliseconds(),
		slideMs:     cfg.Slide.Milliseconds(),
		delayMs:     cfg.WatermarkDelay.Milliseconds(),
		lateMs:      cfg.AllowedLateness.Milliseconds(),
		idleNs:      int64(cfg.IdleTimeout),
		expiryNs:    int64(cfg.DeviceExpiry),
		triggerNs:   int64(cfg.TriggerInterval),
		futNs:       int64(cfg.MaxFutureSkew),
		pasNs:       int64(cfg.MaxPastSkew),
		x:           newExtractor(cfg),
		metricNames: map[string]string{},
		seriesIdx:   map[*device]map[string]*series{},
		tombstones:  map[string]int64{},
		tombFloor:   noTime,
		pending:     map[*window]struct{}{},
		sers:        []*series{nil}, // id 0 is none
	}
	for _, s := range cfg.Subscriptions {
		e.subs = append(e.subs, sub{s.Template, s.Format})
	}
	for _, a := range cfg.Aggregates {
		switch a {
		case "sum":
			e.aggs.sum = true
		case "min":
			e.aggs.min = true
		case "max":
			e.aggs.max = true
		case "mean":
			e.aggs.mean = true
		case "first":
			e.aggs.first = true
		case "last":
			e.aggs.last = true
		}
	}
	return e
}

func (d *device) wm(delayMs int64) int64 {
	if !d.hasMax {
		return noTime
	}
	return d.maxT - delayMs
}

// lateWatermark is the watermark a late row reports: the device's own.
// The horizon only grows, so after a change of delay or lateness it is not
// that watermark less the lateness now set; a device back from expiry has
// no watermark yet, only the horizon it kept, which is reported as the
// watermark that made it.
func (d *device) lateWatermark(delayMs, lateMs int64) int64 {
	if d.hasMax {
		return d.wm(delayMs)
	}
	return d.finalBefore + lateMs
}

// process consumes one Bronze record.
func (e *engine) process(r *buffer.Record) {
	e.replaying = r.Seq <= e.suppressThrough
	e.c.Records++
	e.advanceClock(e.loggedClock(r.ReceivedAt))
	switch r.Kind {
	case buffer.KindTick:
		e.c.Ticks++
	case buffer.KindMessage:
		e.message(r)
	case buffer.KindRejected:
		_, dev, _, _ := e.match(r.Topic)
		e.dead(r, dev, CodeRejected, "refused by ingest: "+r.Reason)
	default:
		e.dead(r, "", CodeRejected, "unknown Bronze record kind "+r.Kind.String())
	}
	if r.Seq > e.offset {
		e.offset = r.Seq
	}
}

func (e *engine) match(t string) (*sub, string, string, bool) {
	for i := range e.subs {
		if dev, metric, ok := e.subs[i].tmpl.Match(t); ok {
			return &e.subs[i], dev, metric, true
		}
	}
	return nil, "", "", false
}

func (e *engine) dead(r *buffer.Record, device, code, msg string) {
	e.c.Dead[codeIdx(code)]++
	if e.suppressed() {
		return
	}
	p := r.Payload
	if len(p) > DeadLetterPayloadBytes {
		p = p[:DeadLetterPayloadBytes]
	}
	e.dls = append(e.dls, DeadLetter{
		Seq: r.Seq, Topic: r.Topic, Device: device, ReceivedAt: r.ReceivedAt,
		Reason: msg, Code: code, Payload: append([]byte(nil), p...),
	})
}

// parse turns a message into e.rd, or says why it cannot.
func (e *engine) parse(s *sub, r *buffer.Record, topicMetric string) *badInput {
	rd := &e.rd
	switch s.format {
	case FormatNumber:
		v, b := parseNumberPayload(r.Payload)
		if b != nil {
			return b
		}
		name := topicMetric
		if name == "" {
			name = "value"
		}
		e.nameBuf = append(e.nameBuf[:0], name...)
		rd.hasID, rd.ptime = false, true
		rd.t = floorDiv(r.ReceivedAt, 1e6)
		rd.metrics = append(rd.metrics[:0], metricVal{name: e.nameBuf, v: v})
		return nil
	case FormatCBOR:
		e.x.reset()
		if b := scanCBOR(e.x, r.Payload); b != nil {
			return b
		}
	default:
		e.x.reset()
		if b := scanJSON(e.x, r.Payload); b != nil {
			return b
		}
	}
	return e.x.finish(rd, r.ReceivedAt, e.cfg.TimeFormat, r.Topic, r.Payload)
}

// readMessage matches and parses a message into e.rd and checks its
// event time against the received-at.
func (e *engine) readMessage(r *buffer.Record) (devName, prefix string, b *badInput) {
	s, devName, topicMetric, ok := e.match(r.Topic)
	if !ok {
		return "", "", &badInput{CodeUnknownTopic, "no subscription matches topic " + r.Topic}
	}
	if len(devName) > maxNameLen {
		return "", "", &badInput{CodeNameTooLong, fmt.Sprintf("device name of %d bytes, at most %d", len(devName), maxNameLen)}
	}
	if b := e.parse(s, r, topicMetric); b != nil {
		return devName, "", b
	}
	rd := &e.rd
	if s.format != FormatNumber {
		prefix = topicMetric
	}
	for _, m := range rd.metrics {
		n := len(m.name)
		if prefix != "" {
			n += len(prefix) + 1
		}
		if n > maxNameLen {
			return devName, "", &badInput{CodeNameTooLong, fmt.Sprintf("metric name of %d bytes, at most %d", n, maxNameLen)}
		}
	}
	if !rd.ptime {
		recvMs := floorDiv(r.ReceivedAt, 1e6)
		if rd.t > floorDiv(r.ReceivedAt+e.futNs, 1e6) {
			return devName, "", &badInput{CodeTimeFuture, "event time " + fmtMs(rd.t) + " is more than max_future_skew " +
				e.cfg.MaxFutureSkew.String() + " after received-at " + fmtMs(recvMs)}
		}
		if rd.t < floorDiv(r.ReceivedAt-e.pasNs, 1e6) {
			return devName, "", &badInput{CodeTimePast, "event time " + fmtMs(rd.t) + " is more than max_past_skew " +
				e.cfg.MaxPastSkew.String() + " before received-at " + fmtMs(recvMs)}
		}
	}
	return devName, prefix, nil
}

func (e *engine) message(r *buffer.Record) {
	devName, prefix, b := e.readMessage(r)
	if b != nil {
		e.dead(r, devName, b.code, b.msg)
		return
	}
	dev := e.devices.get(devName)
	if dev == nil && e.devices.len() >= e.cfg.MaxDevices {
		e.dead(r, devName, CodeTooManyDevices, "window.max_devices reached, device not tracked")
		return
	}
	// Checked before a new device is made: one refused here must leave no
	// trace in the state, or a restart would not rebuild the same one.
	if held, adds := e.newMetrics(dev, prefix); adds > 0 && held+adds > e.cfg.MaxMetricsPerDevice {
		e.dead(r, devName, CodeTooManyMetrics, "window.max_metrics_per_device reached: the device holds "+
			strconv.Itoa(held)+" metrics in state, and the reading adds "+strconv.Itoa(adds))
		return
	}
	if dev == nil {
		dev = e.newDevice(devName)
	}
	e.addReading(dev, r.Seq, &e.rd, prefix)
}

// newMetrics returns how many series dev (nil: a new device) holds and, if
// the reading could take it past window.max_metrics_per_device, how many
// of its metrics it has no series for.
func (e *engine) newMetrics(dev *device, prefix string) (held, adds int) {
	if dev == nil {
		return 0, len(e.rd.metrics)
	}
	held = len(dev.series)
	if held+len(e.rd.metrics) <= e.cfg.MaxMetricsPerDevice {
		return held, 0
	}
	for _, m := range e.rd.metrics {
		if e.seriesOf(dev, e.metricName(prefix, m.name)) == nil {
			adds++
		}
	}
	return held, adds
}

// metricName is the series name of metric m under the topic prefix; it
// aliases e.nameBuf.
func (e *engine) metricName(prefix string, m []byte) []byte {
	if prefix == "" {
		return m
	}
	e.nameBuf = append(append(append(e.nameBuf[:0], prefix...), '.'), m...)
	return e.nameBuf
}

func (e *engine) newDevice(name string) *device {
	name = strings.Clone(name) // not a slice of the record's topic
	d := &device{name: name, finalBefore: noTime, nextEmit: endless, nextPrune: endless, shard: shardOf(name)}
	h, ok := e.tombstones[name]
	cut := floorDiv(e.clock-e.pasNs, 1e6)
	if !ok || h <= cut {
		// Its tombstone may be among those dropped for the bound. One
		// max_past_skew has passed counts as none: pruneTombstones
		// forgets it at points that depend on batches.
		h = e.tombFloor
	}
	// A device that expired comes back: windows it may have emitted
	// stay final, so none restarts at rev 1 with other content.
	if h > cut {
		d.finalBefore = h
	}
	if ok {
		delete(e.tombstones, name)
		e.tombDel = append(e.tombDel, name)
	}
	e.devices.put(d)
	e.active.push(d)
	e.markDev(d)
	return d
}

func (e *engine) markDev(d *device) {
	if !d.dirty {
		d.dirty = true
		e.dirtyDevs = append(e.dirtyDevs, d)
	}
}

func (e *engine) markDedup(d *device) {
	if !d.dedupDirty {
		d.dedupDirty = true
		e.dedupDirty = append(e.dedupDirty, d)
	}
}

// pruneDedup drops d's dedup groups that end at or before finalBefore.
func (e *engine) pruneDedup(d *device, finalBefore int64) {
	groups, ids := d.dedup.prune(finalBefore)
	if groups > 0 {
		e.nDedup -= ids
		e.dedupRows += groups
		e.markDedup(d)
	}
}

func (e *engine) markWin(w *window) {
	if !w.dirty {
		w.dirty, w.dirtyAt = true, int32(len(e.dirtyWins))
		e.dirtyWins = append(e.dirtyWins, w)
	}
}

func (e *engine) lastStart(t int64) int64 { return floorDiv(t, e.slideMs) * e.slideMs }

func (e *engine) addReading(dev *device, seq uint64, rd *reading, prefix string) {
	if rd.hasID {
		dup, ok := e.duplicate(dev, rd.id)
		if !ok {
			return // the Step fails and reloads the state
		}
		if dup {
			e.c.Duplicates++
			return
		}
	}
	e.c.Readings++
	t := rd.t
	last := e.lastStart(t)
	accepted := false
	for _, m := range rd.metrics {
		name := e.metricName(prefix, m.name)
		ser := e.seriesOf(dev, name)
		for s := last; s > t-e.sizeMs; s -= e.slideMs {
			end := s + e.sizeMs
			if end <= dev.finalBefore {
				e.c.Late++
				if !e.suppressed() {
					e.lates = append(e.lates, Late{Seq: seq, Device: dev.name, Metric: string(name), EventTime: t,
						WindowStart: s, Value: m.v, Watermark: dev.lateWatermark(e.delayMs, e.lateMs)})
				}
				continue
			}
			if ser == nil {
				ser = e.addSeries(dev, name)
			}
			w := ser.find(s)
			if w == nil {
				if ser.evicted.has(s, e.slideMs) {
					if w = e.restore(ser, s); w == nil {
						return // the Step fails and reloads the state
					}
				} else {
					w = &window{ser: ser.id, start: s}
					ser.windows = append(ser.windows, w)
					e.nWindows++
					dev.nextEmit = min(dev.nextEmit, end)
				}
			}
			w.add(m.v, t, seq, rd.ptime)
			if w.emitted && !w.pending {
				w.pending = true
				e.pending[w] = struct{}{}
			}
			e.markWin(w)
			accepted = true
		}
	}
	if accepted && rd.hasID {
		end := last + e.sizeMs
		if i, ok := dev.dedup.coldAt(end); ok {
			ids, ok := e.readDedup(dev, end)
			if !ok {
				return // the Step fails and reloads the state
			}
			dev.dedup.warm(i, ids)
		}
		if dev.dedup.add(rd.id, end) {
			e.dedupRows++
		}
		e.nDedup++
		e.markDedup(dev)
	}
	if accepted && t > e.c.MaxEventTime {
		e.c.MaxEventTime = t
	}
	dev.lastSeen = e.clock
	e.listOf(dev).remove(dev)
	e.active.push(dev)
	dev.idle = false
	if !dev.hasMax || t > dev.maxT {
		dev.hasMax, dev.maxT = true, t
		dev.finalBefore = max(dev.finalBefore, t-e.delayMs-e.lateMs)
	}
	e.markDev(dev)
	if wm := dev.wm(e.delayMs); wm >= dev.nextEmit || dev.finalBefore >= dev.nextPrune || dev.finalBefore >= dev.dedup.minEnd() {
		e.scanDevice(dev, wm)
	}
}

// coldThrough is the end up to which d's dedup groups go cold once
// written: its watermark, which every window of their readings has passed.
func (e *engine) coldThrough(d *device) int64 { return d.wm(e.delayMs) }

// duplicate reports whether id was accepted before from dev, reading cold
// dedup groups whose fingerprint matches. ok is false when such a read
// failed (recorded in e.loadErr).
func (e *engine) duplicate(dev *device, id uint64) (dup, ok bool) {
	if dev.dedup.seen(id, dev.finalBefore) {
		return true, true
	}
	ok = true
	dup = dev.dedup.coldCandidates(id, dev.finalBefore, func(end int64) bool {
		var ids []uint64
		if ids, ok = e.readDedup(dev, end); !ok {
			return true // stop looking
		}
		return slices.Contains(ids, id)
	})
	return dup && ok, ok
}

// readDedup reads the ids of dev's cold dedup group of end back from disk;
// on failure it records the error in e.loadErr and returns false.
func (e *engine) readDedup(dev *device, end int64) ([]uint64, bool) {
	ids, err := e.loadDedup(dev.name, end)
	if err != nil {
		e.loadErr = fmt.Errorf("load dedup group %s at %s: %w", dev.name, fmtMs(end), err)
		return nil, false
	}
	e.dedupLoads++
	return ids, true
}

// restore reads the evicted window at start back into memory, where it
// then changes like any other. On failure it records the error in
// e.loadErr and returns nil.
func (e *engine) restore(ser *series, start int64) *window {
	var w *window
	var err error
	enc, ref := e.parkArena.find(ser.parked, start)
	if ref != 0 {
		// Emitted since the last checkpoint: the state database does not
		// have it yet, or not as it is.
		w = new(window)
		err = decodeWindow(enc, w)
	} else {
		w, err = e.load(ser.dev.name, ser.name, start)
	}
	if err == nil && (!w.emitted || w.pending) {
		// Only emitted windows without pending changes are evicted.
		err = fmt.Errorf("%w: evicted window row is not emitted and clean", ErrCorruptState)
	}
	if err != nil {
		e.loadErr = fmt.Errorf("load evicted window %s/%s at %s: %w", ser.dev.name, ser.name, fmtMs(start), err)
		return nil
	}
	w.ser, w.start, w.dirty, w.dead = ser.id, start, false, false
	if ref != 0 {
		e.parkArena.dropAt(ref)
		e.nParked--
		e.unparks++
	} else {
		e.loads++
	}
	ser.evicted.remove(start, e.slideMs)
	ser.windows = append(ser.windows, w)
	e.nEvicted--
	return w
}

// scanDevice emits the device's windows the watermark has passed, then
// prunes final windows and expired dedup entries.
func (e *engine) scanDevice(dev *device, wm int64) {
	due := e.due[:0]
	for _, ser := range dev.series {
		for _, w := range ser.windows {
			if !w.emitted && w.start+e.sizeMs <= wm {
				due = append(due, w)
			}
		}
	}
	e.emitSorted(due)
	e.due = due[:0]
	e.pruneDevice(dev)
}

// pruneDevice drops final windows and dedup entries and recomputes the
// device's next due points.
func (e *engine) pruneDevice(dev *device) {
	dev.nextEmit, dev.nextPrune = endless, endless
	// Windows starting at or before finalStarts are final (end <= finalBefore).
	finalStarts := int64(noTime)
	if dev.finalBefore > noTime+e.sizeMs {
		finalStarts = dev.finalBefore - e.sizeMs
	}
	kept := dev.series[:0]
	for _, ser := range dev.series {
		ws := ser.windows
		for i := 0; i < len(ws); {
			w := ws[i]
			end := w.start + e.sizeMs
			switch {
			case !w.emitted:
				dev.nextEmit = min(dev.nextEmit, end)
			case w.pending:
			case end <= dev.finalBefore:
				e.dropWindow(w)
				ws[i] = ws[len(ws)-1]
				ws[len(ws)-1] = nil
				ws = ws[:len(ws)-1]
				continue
			default:
				dev.nextPrune = min(dev.nextPrune, end)
			}
			i++
		}
		ser.windows = ws
		// Evicted windows are emitted and clean: final ones go, the
		// oldest of the rest is the series' next prune point.
		e.dropEvicted(ser, finalStarts)
		if ser.evicted.len() > 0 {
			dev.nextPrune = min(dev.nextPrune, ser.evicted.first(e.slideMs)+e.sizeMs)
		}
		if len(ws) > 0 || ser.evicted.len() > 0 {
			kept = append(kept, ser)
			continue
		}
		e.unregister(ser)
		if idx := e.seriesIdx[dev]; idx != nil {
			delete(idx, ser.name)
		}
	}
	clear(dev.series[len(kept):])
	dev.series = kept
	if dev.finalBefore >= dev.dedup.minEnd() {
		e.pruneDedup(dev, dev.finalBefore)
	}
}

// dropEvicted deletes ser's evicted windows that start at or before
// through, parked or stored (a stored row may hold an older version of a
// parked one).
func (e *engine) dropEvicted(ser *series, through int64) {
	n := ser.evicted.dropThrough(through, e.slideMs, func(start int64) {
		if e.parkArena.drop(ser.parked, start) {
			e.nParked--
			e.delWins = append(e.delWins, seriesStart{start, ser})
			return
		}
		// Evicted and not parked: its row is the emitted, clean window.
		e.delFinal = append(e.delFinal, seriesStart{start, ser})
	})
	e.nWindows -= n
	e.nEvicted -= n
}

func (e *engine) dropWindow(w *window) {
	w.dead = true
	e.nWindows--
	if w.dirty || !w.emitted || w.pending {
		e.delWins = append(e.delWins, seriesStart{w.start, e.serOf(w)})
	} else {
		// Unchanged since a checkpoint wrote it emitted and clean.
		e.delFinal = append(e.delFinal, seriesStart{w.start, e.serOf(w)})
	}
	if w.pending {
		delete(e.pending, w)
	}
}

func (e *engine) compareWindows(a, b *window) int {
	as, bs := e.serOf(a), e.serOf(b)
	if c := strings.Compare(as.dev.name, bs.dev.name); c != 0 {
		return c
	}
	if c := strings.Compare(as.name, bs.name); c != 0 {
		return c
	}
	return cmp.Compare(a.start, b.start)
}

// emitSorted emits ws in (device, metric, start) order, so that the outbox
// is byte-identical however the emission point was reached.
func (e *engine) emitSorted(ws []*window) {
	slices.SortFunc(ws, e.compareWindows)
	for _, w := range ws {
		e.emit(w)
	}
}

// suppressed says whether a late or dead-letter row is already written:
// during a catch-up, unless the settings changed (deferReplayed), when the
// rows written may not be these — then the first commit deletes them
// (clearRows) and the catch-up writes its own.
func (e *engine) suppressed() bool { return e.replaying && !e.deferReplayed }

// deferring says whether emissions are held pending: a catch-up under
// changed settings (see deferReplayed).
func (e *engine) deferring() bool { return e.replaying && e.deferReplayed }

func (e *engine) emit(w *window) {
	if e.deferring() {
		w.emitted = true
		if !w.pending {
			w.pending = true
			e.pending[w] = struct{}{}
		}
		e.markWin(w)
		return
	}
	rev := max(w.rev, e.revBase) + 1
	w.rev, w.emitted = rev, true
	if w.pending {
		w.pending = false
		delete(e.pending, w)
		e.c.Revisions++
	}
	e.c.Emitted++
	if rev > e.highRev {
		e.highRev, e.revsDirty = rev, true
	}
	e.markWin(w)
	if !e.replaying {
		if e.out == nil && e.outHint > 0 {
			e.out = make([]emission, 0, e.outHint)
		}
		e.out = append(e.out, e.snapshot(w, rev))
	}
	if e.load != nil && parkEmitted {
		e.park(w)
	}
}

// parkEmitted is false only in tests that compare a run keeping every
// window in memory with one that parks and evicts them.
var parkEmitted = true

// park moves w, just emitted and without pending changes, out of the
// heap's windows into the parked encodings, where the next
// checkpoint finds it; after that checkpoint it is only on disk, and late
// data for it reads it back from either (restore). An emitted window
// mostly waits out its lateness untouched, and between checkpoints a fast
// stream emits many: in load mode (10,000 devices, event time 40 times
// the clock) some 60,000 windows of 112 bytes, each behind two pointers,
// waited for the checkpoint that evicts them, where their encodings take
// about 60 bytes.
func (e *engine) park(w *window) {
	ser := e.serOf(w)
	i := slices.Index(ser.windows, w)
	if i < 0 || !w.dirty || e.dirtyWins[w.dirtyAt] != w || e.parkArena.full() {
		// Not where emit leaves it, or the arena is full (4 GiB): it stays
		// a window, written as one, in memory until it is final.
		return
	}
	last := len(ser.windows) - 1
	ser.windows[i] = ser.windows[last]
	ser.windows[last] = nil
	ser.windows = ser.windows[:last]
	// Its entry in dirtyWins gives way to its parked one: the last entry
	// takes its place (the checkpoint sorts its changes anyway).
	last = len(e.dirtyWins) - 1
	moved := e.dirtyWins[last]
	e.dirtyWins[w.dirtyAt], moved.dirtyAt = moved, w.dirtyAt
	e.dirtyWins[last] = nil
	e.dirtyWins = e.dirtyWins[:last]
	if ser.parked == 0 {
		e.parkedSers = append(e.parkedSers, ser)
	}
	e.parkBuf = appendWindow(e.parkBuf[:0], w)
	ser.parked = e.parkArena.add(w.start, ser.parked, e.parkBuf)
	ser.evicted.add(w.start, e.slideMs)
	e.nEvicted++
	e.nParked++
}

// internMetric returns name as a string shared by every series of that
// metric, up to maxMetricNames distinct names (past them, a device
// inventing names costs its own strings, not an ever larger table).
func (e *engine) internMetric(name []byte) string {
	if s, ok := e.metricNames[string(name)]; ok {
		return s
	}
	s := string(name)
	if len(e.metricNames) < maxMetricNames {
		e.metricNames[s] = s
	}
	return s
}

const maxMetricNames = 4096

// snapshot is w's emission at revision rev.
func (e *engine) snapshot(w *window, rev uint32) emission {
	// The sum and mean of decimal readings, exactly (internal/decsum).
	sum, mean := decsum.Snap(w.sum, w.count, w.min, w.max)
	return emission{
		ser: e.serOf(w), start: w.start, at: floorDiv(e.clock, 1e6),
		count: w.count, rev: rev, ptime: w.ptime,
		vals: [6]float64{sum, w.min, w.max, mean, w.first, w.last},
	}
}

// aggregate is em's wire form, with the configured aggregates only; its
// figures point into em.
func (e *engine) aggregate(em *emission) wire.Aggregate {
	return e.aggregateKeyed(em, wire.AggregateKey(e.cfg.Gateway, em.ser.dev.name, em.ser.name, em.start, em.rev))
}

// appendKey appends em's wire.AggregateKey to dst.
func (e *engine) appendKey(dst []byte, em *emission) []byte {
	return wire.AppendAggregateKey(dst, e.cfg.Gateway, em.ser.dev.name, em.ser.name, em.start, em.rev)
}

// aggregateKeyed is aggregate with its key made by the caller.
func (e *engine) aggregateKeyed(em *emission, key string) wire.Aggregate {
	ser := em.ser
	a := wire.Aggregate{
		Device: ser.dev.name, Metric: ser.name,
		Start: em.start, End: em.start + e.sizeMs,
		Count: em.count, Rev: em.rev, ProcTime: em.ptime,
		Key: key,
	}
	v := &em.vals
	if e.aggs.sum {
		a.Sum = &v[0]
	}
	if e.aggs.min {
		a.Min = &v[1]
	}
	if e.aggs.max {
		a.Max = &v[2]
	}
	if e.aggs.mean {
		a.Mean = &v[3]
	}
	if e.aggs.first {
		a.First = &v[4]
	}
	if e.aggs.last {
		a.Last = &v[5]
	}
	return a
}

// detachedAggregate is em's wire form on figures of its own, for an
// observer that may keep it past the batch.
func (e *engine) detachedAggregate(em emission) *wire.Aggregate {
	a := e.aggregate(&em)
	return &a
}

// clockStepNs is how far a record's received-at may fall behind the logged
// clock before it counts as the gateway's clock stepped back rather than
// receipts on concurrent connections stamped a little out of order.
const clockStepNs = int64(1e9)

// loggedClock returns the logged clock's reading for a record received at
// ts (the gateway's wall clock). It follows the stamps forward and never
// goes back. When the wall clock steps back (NTP correcting a clock that
// ran ahead, an hour or a day), holding the high mark would stop the clock
// until the wall clock is back there: no trigger boundary, idle close or
// expiry, and pending revisions piling up in memory for as long (an
// audit: 5,950 pending after two hours of a day's step). Instead, while
// the stamps are more than clockStepNs behind, the clock moves by half of
// their own advance, so it goes on and the stamps catch up with it in
// twice the step (sooner if records are more than a minute apart: the
// clock follows less of the gap). A function of the stamps in Bronze
// order, so a replay decides the same.
func (e *engine) loggedClock(ts int64) int64 {
	prev := e.lastStamp
	e.lastStamp = ts
	if ts > e.clock-clockStepNs || ts <= prev {
		return max(ts, e.clock)
	}
	// At most a minute at a time: a reboot into 1970 and NTP's step back
	// to the real time, both below the clock, must not move it decades.
	return e.clock + min(ts-prev, slewStepNs)/2
}

// slewStepNs bounds the stamps' advance loggedClock follows in one record.
const slewStepNs = int64(60e9)

// idleCloseMax bounds the windows one clock advance closes for idle
// devices: the devices past it stay in the active list, first in line for
// the next advance (the next record or tick), so what an advance decides
// is still a function of Bronze. When a fleet falls silent at once (the
// end of the rig's load mode: 10,000 devices, 20,000 windows) one batch
// held every emission, its outbox rows and the commit's pages together,
// 3-5 MiB over the load's own peak RSS; in portions the run's peak is the
// load's (four load runs: three peaked during the load, where every run
// before peaked at the idle close; docs/performance.md, session 28). Once
// the zstd fork had lowered the load's own peak by 3.5 MiB, portions of
// 4,096 were the run's peak again, 1-3 MiB over the load's in four runs of
// six; of 1,024 in none of seven (session 33). The last of such a fleet
// close a few ticks later. A variable only for tests.
var idleCloseMax = 1024

// advanceClock moves the logged clock to ts (it never goes back) and runs
// what the clock decides: pending revisions at trigger boundaries, idle
// closes and device expiry.
func (e *engine) advanceClock(ts int64) {
	if ts <= e.clock {
		return
	}
	old := e.clock
	e.clock = ts
	due := e.due[:0]
	if len(e.pending) > 0 && floorDiv(old, e.triggerNs) != floorDiv(ts, e.triggerNs) {
		for w := range e.pending {
			due = append(due, w)
		}
	}
	closing := 0 // windows the idle closes add: at most about idleCloseMax
	for d := e.active.head; d != nil && d.lastSeen <= ts-e.idleNs && closing < idleCloseMax; d = e.active.head {
		for _, ser := range d.series {
			for _, w := range ser.windows {
				if !w.emitted {
					due = append(due, w)
					closing++
				}
			}
		}
		e.active.remove(d)
		e.idleList.push(d)
		d.idle = true
		e.markDev(d)
	}
	if len(due) > 0 {
		e.emitAndPrune(due)
	}
	e.due = due[:0]
	// Not during a deferred catch-up: expiry drops the windows it holds
	// pending; they expire at the first tick after it, sent.
	for d := e.idleList.head; d != nil && d.lastSeen <= ts-e.expiryNs && !e.deferring(); d = e.idleList.head {
		e.expire(d)
	}
}

// expire drops a silent device's state, keeping a tombstone with its
// lateness horizon.
func (e *engine) expire(d *device) {
	var due []*window
	horizon := d.finalBefore
	for _, ser := range d.series {
		for _, w := range ser.windows {
			if w.pending || !w.emitted {
				due = append(due, w)
			}
			horizon = max(horizon, w.start+e.sizeMs)
		}
		if ser.evicted.len() > 0 {
			horizon = max(horizon, ser.evicted.last(e.slideMs)+e.sizeMs)
		}
	}
	e.emitSorted(due)
	for _, ser := range d.series {
		for _, w := range ser.windows {
			e.dropWindow(w)
		}
		e.dropEvicted(ser, endless)
		e.unregister(ser)
	}
	e.pruneDedup(d, endless)
	e.listOf(d).remove(d)
	d.dead = true
	e.devices.remove(d.name)
	delete(e.seriesIdx, d)
	e.delDevs = append(e.delDevs, d.name)
	if horizon != noTime {
		e.tombstones[d.name] = horizon
		e.tombPut = append(e.tombPut, d.name)
		if len(e.tombstones) > e.cfg.MaxDevices {
			e.dropTombstones()
		}
	}
	e.c.DevicesExpired++
}

// dropTombstones keeps the tombstones within max_devices: a fleet that
// keeps inventing device names would otherwise hold one for each name for
// max_past_skew. The oldest horizons go, an eighth of the bound at a time
// (one sort per many expiries), and the newest of them becomes tombFloor,
// which every device not seen before then starts with: the dropped
// devices' windows stay final at the price of a new device's readings
// that old going to the late table. Every tombstone with that horizon or
// an older one goes, ties too, so a replay drops the same ones.
//
// Tombstones max_past_skew has passed count for nothing (newDevice ignores
// them) and go first: pruneTombstones forgets them only now and then, at
// points that depend on batches, so counting them would make whether and
// what to drop depend on batches too.
func (e *engine) dropTombstones() {
	e.forgetTombstonesBy(floorDiv(e.clock-e.pasNs, 1e6))
	// As uint64 with the sign bit flipped, which keeps their order: the
	// sort of []uint64 is in the binary already, one of another type
	// would add 7 KB (the arm64 binary's budget).
	if len(e.tombstones) <= e.cfg.MaxDevices {
		return
	}
	hs := make([]uint64, 0, len(e.tombstones))
	for _, h := range e.tombstones {
		hs = append(hs, uint64(h)^1<<63)
	}
	slices.Sort(hs)
	floor := int64(hs[len(hs)-(e.cfg.MaxDevices-e.cfg.MaxDevices/8)-1] ^ 1<<63)
	before := len(e.tombstones)
	e.forgetTombstonesBy(floor)
	e.c.TombstonesDropped += uint64(before - len(e.tombstones))
	e.tombFloor = max(e.tombFloor, floor)
	e.tombFloorDirty = true
}

// flushPending emits every pending revision now (Flush, end of RunOnce).
func (e *engine) flushPending() {
	due := e.due[:0]
	for w := range e.pending {
		due = append(due, w)
	}
	e.emitAndPrune(due)
	e.due = due[:0]
}

// emitAndPrune emits ws in order, then prunes each device they belong to.
func (e *engine) emitAndPrune(ws []*window) {
	e.emitSorted(ws)
	// Sorted, a device's windows are together: each device is pruned
	// after its last window, as pruning frees the ids of its emptied
	// series, which its windows name.
	var prev *device
	for _, w := range ws {
		if d := e.serOf(w).dev; d != prev {
			if prev != nil {
				e.pruneDevice(prev)
			}
			prev = d
		}
	}
	if prev != nil {
		e.pruneDevice(prev)
	}
}

// pruneTombstones forgets tombstones older than max_past_skew: no reading
// that old passes the skew check, so none could reach their windows.
func (e *engine) pruneTombstones() {
	if e.clock-e.tombPruned < 60e9 || (len(e.tombstones) == 0 && e.tombFloor == noTime) {
		return
	}
	e.tombPruned = e.clock
	cut := floorDiv(e.clock-e.pasNs, 1e6)
	if e.tombFloor != noTime && e.tombFloor <= cut {
		e.tombFloor = noTime
		e.tombFloorDirty = true
	}
	e.forgetTombstonesBy(cut)
}

// forgetTombstonesBy deletes the tombstones whose horizon is cut or older.
func (e *engine) forgetTombstonesBy(cut int64) {
	for name, h := range e.tombstones {
		if h <= cut {
			delete(e.tombstones, name)
			e.tombDel = append(e.tombDel, name)
		}
	}
}

// resetOutputs clears the batch outputs after a commit. The slices keep
// no references (an emission holds its series), and a
// large one goes: a batch of load-mode catch-up emits about 12,000
// aggregates, 1.8 MB of array that stayed live between batches.
func (e *engine) resetOutputs() {
	e.outHint = 0
	if cap(e.out) > keptOutputs {
		e.outHint = len(e.out) + len(e.out)/4 // room for a somewhat larger batch
	}
	e.out = resetSlice(e.out)
	e.lates = resetSlice(e.lates)
	e.dls = resetSlice(e.dls)
	e.revsDirty = false
}

// keptOutputs is the capacity up to which an output slice is reused.
const keptOutputs = 1024

func resetSlice[T any](s []T) []T {
	if cap(s) > keptOutputs {
		return nil
	}
	return emptied(s)
}

// resetDelta clears the state delta after a checkpoint wrote it, and
// empties the parked windows it wrote, which are now evicted. The lists
// keep their arrays for the next delta but not what they pointed to: the
// collector scans an array to its capacity, so a stale slot kept a dropped
// window alive until the next delta overwrote it, and in the live heap the
// collections after a checkpoint measure.
func (e *engine) resetDelta() {
	for _, w := range e.dirtyWins {
		w.dirty = false
	}
	e.releaseParked()
	for _, d := range e.dirtyDevs {
		d.dirty = false
	}
	e.dirtyWins = emptied(e.dirtyWins)
	e.delWins = emptied(e.delWins)
	e.delFinal = emptied(e.delFinal)
	for _, d := range e.dedupDirty {
		d.dedup.written()
		d.dedupDirty = false
		if e.loadDedup != nil {
			d.dedup.evict(e.coldThrough(d))
		}
	}
	e.dedupDirty = emptied(e.dedupDirty)
	e.dedupRows = 0
	e.dirtyDevs = emptied(e.dirtyDevs)
	e.delDevs = emptied(e.delDevs)
	e.tombPut = emptied(e.tombPut)
	e.tombDel = emptied(e.tombDel)
	e.tombFloorDirty = false
}

// releaseParked forgets the windows parked since the last checkpoint,
// which the checkpoint has put in their rows, and lets their arena's
// memory go.
func (e *engine) releaseParked() {
	for _, ser := range e.parkedSers {
		ser.parked = 0 // on disk now
	}
	e.parkedSers = emptied(e.parkedSers)
	e.parkArena.reset()
	e.nParked = 0
}

// emptied returns s with no elements and none of its old ones reachable.
func emptied[T any](s []T) []T {
	clear(s)
	return s[:0]
}

// deltaSize is the number of windows, dedup groups and devices the next
// checkpoint writes or deletes (into fewer group rows).
func (e *engine) deltaSize() int {
	return len(e.dirtyWins) + e.nParked + len(e.delWins) + len(e.delFinal) + e.dedupRows + len(e.dirtyDevs) + len(e.delDevs)
}

// stateBytes estimates the in-memory state size.
func (e *engine) stateBytes() int64 {
	return int64(e.nWindows-e.nEvicted)*200 + int64(e.nEvicted)*8 + int64(e.nParked)*70 + int64(e.nDedup)*12 + int64(e.devices.len())*400 + int64(len(e.tombstones))*64
}
