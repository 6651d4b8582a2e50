package config

import (
	"fmt"
	"math"
	"net"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgeagent/edgeagent/internal/secret"
	"github.com/edgeagent/edgeagent/internal/topic"
)

// Limits the window stage enforces when it starts (window.Config.Validate),
// repeated here so the check reports them with their line;
// TestConfigCheckAgreesWithTheStages in cmd/edgeagent/agent keeps the two
// in step.
const (
	maxWindowsPerReading = 100
	maxMetricsPerReading = 64
)

// gatewayIDPattern keeps the id one NATS subject token: a dot would split
// it, and a stream bound to edge.*.aggregates (docs/uplink.md) would then
// not capture the gateway's batches, which would wait in its outbox.
var gatewayIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// validGatewayID reports whether id can go into subjects and topics.
func validGatewayID(id string) bool { return gatewayIDPattern.MatchString(id) }

// Validate checks every value and the rules between them. It returns nil
// or an *Errors naming each bad key, with its line when the Config came
// from Parse (a key not written in the file is reported on the line of its
// nearest written parent).
func (c *Config) Validate() error {
	v := &validator{c: c}
	v.top()
	v.mqtt()
	v.ingest()
	v.storage()
	v.status()
	v.readings()
	v.window()
	v.processing()
	v.uplink()
	v.alerts()
	v.localPublish()
	if len(v.errs) == 0 {
		return nil
	}
	file := ""
	if c.src != nil {
		file = c.src.file
	}
	for _, fe := range v.errs {
		key := fe.Key
		if fe.at != "" {
			key = fe.at
		}
		p := c.src.lineOf(key)
		fe.File, fe.Line, fe.Column = file, p.line, p.col
	}
	errs := &Errors{File: file, List: v.errs}
	errs.sortAndDedup()
	return errs
}

type validator struct {
	c    *Config
	errs []*FieldError
}

// undecoded reports whether key's value in the file could not be decoded
// (it was reported, and the key kept its default).
func (v *validator) undecoded(key string) bool {
	return v.c.src != nil && v.c.src.suppressed(key)
}

func (v *validator) add(key, format string, args ...any) {
	v.errs = append(v.errs, &FieldError{Key: key, Msg: fmt.Sprintf(format, args...)})
}

// addPair reports a rule between key and other under key, on the line of
// other when only other is written: the line the user wrote, not that of
// key's parent (or none).
func (v *validator) addPair(key, other, format string, args ...any) {
	v.add(key, format, args...)
	if v.c.src != nil && !v.c.written(key) && v.c.written(other) {
		v.errs[len(v.errs)-1].at = other
	}
}

func (v *validator) oneOf(key, val string, allowed ...string) bool {
	if slices.Contains(allowed, val) {
		return true
	}
	msg := fmt.Sprintf("must be %s, not %q", orList(allowed), val)
	if s := suggest(val, allowed); s != "" {
		msg += " (did you mean " + s + "?)"
	}
	v.add(key, "%s", msg)
	return false
}

func (v *validator) positive(key string, d Duration) {
	if d <= 0 {
		v.add(key, "must be a positive duration, not %s", d)
	}
}

func (v *validator) nonNegative(key string, d Duration) {
	if d < 0 {
		v.add(key, "must not be negative, not %s", d)
	}
}

func (v *validator) atLeast(key string, n, least int) {
	if n < least {
		v.add(key, "must be at least %d, not %d", least, n)
	}
}

func (v *validator) top() {
	c := v.c
	switch {
	case c.GatewayID == "":
		v.add("gateway_id", "required: every gateway must name itself (letters, digits, '_', '-')")
	case strings.Contains(c.GatewayID, "."):
		v.add("gateway_id", "%q contains '.': the id is one NATS subject token (use '-' or '_' instead)", c.GatewayID)
	case !validGatewayID(c.GatewayID):
		v.add("gateway_id", "%q may only contain letters, digits, '_' and '-' (it goes into NATS subjects and MQTT topics)", c.GatewayID)
	}
	if c.DataDir == "" {
		v.add("data_dir", "required")
	}
	v.oneOf("log.format", c.Log.Format, "text", "json")
	v.oneOf("log.level", c.Log.Level, "debug", "info", "warn", "error")
}

var (
	mqttSchemes    = []string{"tcp", "ssl", "tls", "mqtt", "mqtts", "ws", "wss"}
	mqttTLSSchemes = []string{"ssl", "tls", "mqtts", "wss"}
	natsSchemes    = []string{"nats", "tls", "ws", "wss"}
)

func (v *validator) mqtt() {
	m := v.c.MQTT
	embedded := m.Broker == "embedded"
	var scheme string
	switch {
	case m.Broker == "":
		v.add("mqtt.broker", "required: a URL such as tcp://127.0.0.1:1883, or embedded")
	case embedded:
		if m.Embedded.Listen == "" {
			v.add("mqtt.embedded.listen", "required when mqtt.broker is embedded")
		}
	default:
		if u := v.brokerURL("mqtt.broker", m.Broker, mqttSchemes, true); u != nil {
			scheme = u.Scheme
		}
	}
	v.atLeast("mqtt.embedded.max_pending_writes", m.Embedded.MaxPendingWrites, 1)
	if d := m.Embedded.SessionExpiry; d < Duration(time.Second) {
		v.add("mqtt.embedded.session_expiry", "%s is under 1s (the broker counts whole seconds)", d)
	}
	if m.Embedded.Listen != "" {
		v.hostPort("mqtt.embedded.listen", m.Embedded.Listen, "127.0.0.1:1883")
	}
	switch {
	case embedded && (m.Username != "" || m.Password != ""):
		// It would read as protection the built-in broker does not give.
		key := "mqtt.username"
		if m.Username == "" {
			key = "mqtt.password"
		}
		v.add(key, "has no effect: the embedded broker has no authentication and accepts every client; keep mqtt.embedded.listen on loopback or a trusted interface")
	case m.Password != "" && m.Username == "":
		v.add("mqtt.password", "needs mqtt.username (MQTT sends a password only with a user name)")
	}
	v.tls("mqtt", m.TLS, embedded, scheme)
	// MQTT sends the keep-alive as 16 bits of seconds: paho would cut a
	// fraction off and wrap a larger value (65536s went out as 0, off).
	switch {
	case m.KeepAlive < Duration(time.Second):
		v.add("mqtt.keep_alive", "must be at least 1s, not %s", m.KeepAlive)
	case m.KeepAlive > Duration(65535*time.Second):
		v.add("mqtt.keep_alive", "must be at most 18h12m15s (MQTT sends it as 16 bits of seconds), not %s", m.KeepAlive)
	case time.Duration(m.KeepAlive)%time.Second != 0:
		v.add("mqtt.keep_alive", "must be whole seconds (MQTT sends it in seconds), not %s", m.KeepAlive)
	}
	v.positive("mqtt.connect_timeout", m.ConnectTimeout)
	v.positive("mqtt.reconnect_max_interval", m.ReconnectMaxInterval)

	if len(m.Subscriptions) == 0 {
		v.add("mqtt.subscriptions", "at least one subscription is required, e.g. - topic: \"sensors/{device}/telemetry\"")
	}
	filters := make(map[string]string)
	for i, s := range m.Subscriptions {
		key := fmt.Sprintf("mqtt.subscriptions[%d]", i)
		v.checkQoS(key+".qos", s.QoS, 0)
		formatOK := v.oneOf(key+".format", s.Format, "json", "cbor", "number")
		if strings.HasPrefix(s.Topic, "$share/") || strings.HasPrefix(s.Topic, "$queue/") {
			// The broker delivers under the topic without the prefix,
			// which the template would then not match: every message
			// would be dead-lettered.
			v.add(key+".topic", "%q is a shared subscription, which the agent does not take: subscribe to the topic itself (each agent keeps a whole log)", s.Topic)
			continue
		}
		t, err := topic.Parse(s.Topic)
		if err != nil {
			v.add(key+".topic", "%s", strings.TrimPrefix(err.Error(), topic.ErrTemplate.Error()+": "))
			continue
		}
		if !t.HasDevice() {
			v.add(key+".topic", "%q has no {device} level (the device id is read from the topic)", s.Topic)
		}
		if formatOK && s.Format == "number" && !t.HasMetric() {
			v.add(key+".format", "number needs a {metric} level in the topic (a bare number does not name its metric)")
		}
		if prev, dup := filters[t.Filter()]; dup {
			v.add(key+".topic", "subscribes to the same MQTT filter %s as %s", t.Filter(), prev)
		} else {
			filters[t.Filter()] = key + ".topic"
		}
	}
}

// checkQoS checks qos is in least..2.
func (v *validator) checkQoS(key string, qos, least int) {
	if qos < least || qos > 2 {
		if least == 0 {
			v.add(key, "must be 0, 1 or 2, not %d", qos)
		} else {
			v.add(key, "must be 1 or 2, not %d (the outbox deletes a batch only once the broker acknowledged it)", qos)
		}
	}
}

// brokerURL checks a broker URL and returns it parsed, or nil after
// reporting the problem. Messages show the URL with its password masked.
func (v *validator) brokerURL(key, s string, schemes []string, needPort bool) *url.URL {
	shown := secret.URL(s, schemes[0] == "nats") // a NATS user without password is a token
	example := schemes[0] + "://127.0.0.1:1883"
	if schemes[0] == "nats" {
		example = "nats://127.0.0.1:4222"
	}
	if !strings.Contains(s, "://") {
		v.add(key, "%q has no scheme: write it as a URL such as %s", shown, example)
		return nil
	}
	u, err := url.Parse(s)
	if err == nil && strings.Contains(u.Path+u.RawQuery+u.Fragment, "@") {
		err = url.EscapeError("@") // the host would be part of a password
	}
	if err != nil {
		hint := ""
		if strings.Contains(s, "@") {
			hint = "; in a user name or password, write @ / # ? : and % percent-encoded (%40 %2F %23 %3F %3A %25)"
		}
		v.add(key, "%q is not a URL such as %s%s", shown, example, hint)
		return nil
	}
	if !slices.Contains(schemes, strings.ToLower(u.Scheme)) {
		v.add(key, "%q: scheme must be %s, not %q", shown, orList(schemes), u.Scheme)
		return nil
	}
	u.Scheme = strings.ToLower(u.Scheme)
	if u.Hostname() == "" {
		v.add(key, "%q has no host", shown)
		return nil
	}
	port := u.Port()
	if port == "" && needPort && u.Scheme != "ws" && u.Scheme != "wss" {
		v.add(key, "%q has no port (MQTT brokers usually listen on 1883, or 8883 for TLS)", shown)
		return nil
	}
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			v.add(key, "%q: port must be 1 to 65535", shown)
			return nil
		}
	}
	return u
}

// tls checks the tls block under prefix. scheme is the broker's URL scheme
// ("" when unknown or not an MQTT URL).
func (v *validator) tls(prefix string, t TLS, embedded bool, scheme string) {
	if (t.CertFile == "") != (t.KeyFile == "") {
		if t.CertFile == "" {
			v.add(prefix+".tls.cert_file", "required with key_file (a client certificate needs both)")
		} else {
			v.add(prefix+".tls.key_file", "required with cert_file (a client certificate needs both)")
		}
	}
	if t.IsZero() {
		return
	}
	switch {
	case embedded:
		v.add(prefix+".tls", "has no effect: the agent connects to its embedded broker without TLS")
	case scheme != "" && !slices.Contains(mqttTLSSchemes, scheme):
		v.add(prefix+".tls", "has no effect with a %s:// broker: use %s", scheme, orList(schemeList(mqttTLSSchemes)))
	}
}

func schemeList(s []string) []string {
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = x + "://"
	}
	return out
}

// hostPort checks a listen address and returns its host; example is a
// valid one for the key, for the message.
func (v *validator) hostPort(key, s, example string) (string, bool) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		v.add(key, "must be host:port, e.g. %s, not %q", example, s)
		return "", false
	}
	// Not 0: a port picked at random could not be found by the devices
	// or by edgeagent status.
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		v.add(key, "%q: port must be a number from 1 to 65535", s)
		return "", false
	}
	if host != "" && net.ParseIP(host) == nil && !validHostname(host) {
		v.add(key, "%q: %q is not an IP address or host name", s, host)
		return "", false
	}
	return host, true
}

// sameListener reports whether listening on a and on b would take the
// same port: the same port on the same host, or on every interface.
func sameListener(a, b string) bool {
	ha, pa, errA := net.SplitHostPort(a)
	hb, pb, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil || pa != pb {
		return false
	}
	return sameHost(ha, hb) || wildcardHost(ha) || wildcardHost(hb)
}

// wildcardHost reports whether a listen address's host is every interface.
func wildcardHost(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }

func validHostname(h string) bool {
	if len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
				return false
			}
		}
	}
	return true
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (v *validator) ingest() {
	in, c := v.c.Ingest, v.c
	v.positive("ingest.commit_interval", in.CommitInterval)
	v.atLeast("ingest.max_commit_records", in.MaxCommitRecords, 1)
	v.positive("ingest.clock_tick_interval", in.ClockTickInterval)
	if in.ClockTickInterval > c.Window.IdleTimeout && c.Window.IdleTimeout > 0 {
		v.addPair("ingest.clock_tick_interval", "window.idle_timeout", "%s is longer than window.idle_timeout %s: logged ticks are what close idle windows", in.ClockTickInterval, c.Window.IdleTimeout)
	}
	switch {
	case in.MaxPayloadBytes <= 0:
		v.add("ingest.max_payload_bytes", "must be positive, not %s", in.MaxPayloadBytes)
	case in.MaxPayloadBytes > c.Storage.BronzeMaxBytes && c.Storage.BronzeMaxBytes > 0:
		v.addPair("ingest.max_payload_bytes", "storage.bronze_max_bytes", "%s is larger than storage.bronze_max_bytes %s", in.MaxPayloadBytes, c.Storage.BronzeMaxBytes)
	}
}

func (v *validator) storage() {
	s, c := v.c.Storage, v.c
	v.nonNegative("storage.bronze_retention", s.BronzeRetention)
	if s.BronzeMaxBytes <= 0 {
		v.add("storage.bronze_max_bytes", "must be positive, not %s (Bronze must be bounded)", s.BronzeMaxBytes)
	}
	switch {
	case s.OutboxMaxBytes <= 0:
		v.add("storage.outbox_max_bytes", "must be positive, not %s (the outbox must be bounded)", s.OutboxMaxBytes)
	case s.OutboxMaxBytes < c.Uplink.MaxBatchBytes:
		v.addPair("storage.outbox_max_bytes", "uplink.max_batch_bytes", "%s is smaller than uplink.max_batch_bytes %s: one batch must fit", s.OutboxMaxBytes, c.Uplink.MaxBatchBytes)
	}
}

func (v *validator) status() {
	s := v.c.Status
	switch {
	case s.TLS.CertFile != "" && s.TLS.KeyFile == "":
		v.add("status.tls.key_file", "required with cert_file (the server certificate needs its key)")
	case s.TLS.KeyFile != "" && s.TLS.CertFile == "":
		v.add("status.tls.cert_file", "required with key_file (the server certificate needs both)")
	}
	if s.Listen == "" {
		if s.TLS != (StatusTLS{}) {
			v.add("status.tls", "has no effect: status.listen is empty, so the endpoint is disabled")
		}
		return
	}
	host, ok := v.hostPort("status.listen", s.Listen, "127.0.0.1:9464")
	if e := v.c.MQTT.Embedded.Listen; ok && v.c.MQTT.Broker == "embedded" && sameListener(s.Listen, e) {
		v.add("status.listen", "%q takes the port of mqtt.embedded.listen %q: give each its own", s.Listen, e)
	}
	if ok && !isLoopback(host) && s.Token == "" {
		where := "every interface"
		if host != "" {
			where = host
		}
		v.add("status.token", "required because status.listen %q is reachable beyond this machine (%s); or listen on 127.0.0.1", s.Listen, where)
	}
}

func (v *validator) dotPath(key, p string) {
	for _, seg := range strings.Split(p, ".") {
		if seg == "" {
			v.add(key, "%q has an empty segment (write dot paths like payload.temperature)", p)
			return
		}
	}
}

func (v *validator) readings() {
	r := v.c.Readings
	if r.EventID != "" {
		v.dotPath("readings.event_id", r.EventID)
	}
	if r.EventTime != "" {
		v.dotPath("readings.event_time", r.EventTime)
	}
	if r.EventID != "" && r.EventID == r.EventTime {
		// One field cannot be both: the id would take it, and every
		// reading would lack its time.
		v.addPair("readings.event_id", "readings.event_time", "%q is also readings.event_time; an event id must be a field of its own", r.EventID)
	}
	v.oneOf("readings.time_format", r.TimeFormat, "unix_s", "unix_ms", "unix_ns", "rfc3339", "auto")
	seen := make(map[string]int)
	for i, m := range r.Metrics {
		key := fmt.Sprintf("readings.metrics[%d]", i)
		if m == "" {
			v.add(key, "empty metric path")
			continue
		}
		v.dotPath(key, m)
		if j, dup := seen[m]; dup {
			v.add(key, "%q is listed twice (also readings.metrics[%d])", m, j)
		}
		seen[m] = i
		if m == r.EventID || m == r.EventTime {
			v.add(key, "%q is also the event id or event time field", m)
		}
	}
	if len(r.Metrics) > maxMetricsPerReading {
		v.add("readings.metrics", "lists %d paths, at most %d", len(r.Metrics), maxMetricsPerReading)
	}
	v.positive("readings.max_future_skew", r.MaxFutureSkew)
	v.positive("readings.max_past_skew", r.MaxPastSkew)
}

// maxWindowSize is the longest window.size.
const maxWindowSize = Duration(366 * 24 * time.Hour)

func (v *validator) window() {
	w := v.c.Window
	v.positive("window.size", w.Size)
	if w.Size > maxWindowSize {
		// Longer windows stay open (and in memory) for more than a year,
		// and their derived timeouts approach what a duration can hold.
		v.add("window.size", "must be at most %s (366 days), not %s", maxWindowSize, w.Size)
	}
	v.positive("window.slide", w.Slide)
	// Window bounds travel in Unix milliseconds.
	wholeMs := true
	for _, d := range []struct {
		key string
		d   Duration
	}{{"window.size", w.Size}, {"window.slide", w.Slide}} {
		if d.d > 0 && time.Duration(d.d)%time.Millisecond != 0 {
			v.add(d.key, "%s is not a whole number of milliseconds (window bounds are in milliseconds)", d.d)
			wholeMs = false
		}
	}
	// A size or slide that failed to decode kept its default, and one that
	// is not whole milliseconds derived nothing; comparing the other with
	// it would report a problem that is not there.
	if w.Size > 0 && w.Slide > 0 && wholeMs && !v.undecoded("window.size") && !v.undecoded("window.slide") {
		switch {
		case w.Slide > w.Size:
			v.addPair("window.slide", "window.size", "%s is longer than window.size %s (windows would leave gaps)", w.Slide, w.Size)
		case w.Size%w.Slide != 0:
			v.add("window.slide", "window.size %s is not a multiple of %s (every reading must fall in the same number of windows)", w.Size, w.Slide)
		case w.Size/w.Slide > maxWindowsPerReading:
			v.add("window.slide", "%s is too small for window.size %s: a reading would fall in %d windows, at most %d", w.Slide, w.Size, w.Size/w.Slide, maxWindowsPerReading)
		}
	}
	v.nonNegative("window.watermark_delay", w.WatermarkDelay)
	v.nonNegative("window.allowed_lateness", w.AllowedLateness)
	v.positive("window.idle_timeout", w.IdleTimeout)
	if len(w.Aggregates) == 0 {
		v.add("window.aggregates", "must name at least one of %s", strings.Join(aggregateNames, ", "))
	}
	seen := make(map[string]bool)
	for i, a := range w.Aggregates {
		key := fmt.Sprintf("window.aggregates[%d]", i)
		if v.oneOf(key, a, aggregateNames...) && seen[a] {
			v.add(key, "%s is listed twice", a)
		}
		seen[a] = true
	}
	v.atLeast("window.max_devices", w.MaxDevices, 1)
	v.atLeast("window.max_metrics_per_device", w.MaxMetricsPerDevice, 1)
	v.positive("window.device_expiry", w.DeviceExpiry)
	if w.DeviceExpiry > 0 && w.DeviceExpiry <= w.IdleTimeout+w.AllowedLateness {
		v.add("window.device_expiry", "%s must be longer than window.idle_timeout + window.allowed_lateness (%s), or a device's state is dropped while its windows can still be revised", w.DeviceExpiry, w.IdleTimeout+w.AllowedLateness)
	}
}

func (v *validator) processing() {
	p := v.c.Processing
	if p.TriggerInterval < Duration(time.Millisecond) {
		v.add("processing.trigger_interval", "must be at least 1ms, not %s", p.TriggerInterval)
	}
	v.positive("processing.checkpoint_interval", p.CheckpointInterval)
	v.atLeast("processing.max_records_per_batch", p.MaxRecordsPerBatch, 1)
	v.atLeast("processing.max_procs", p.MaxProcs, 0)
}

func (v *validator) uplink() {
	u, c := v.c.Uplink, v.c
	if u.NATS.URL != "" && u.MQTT.Broker != "" {
		v.add("uplink.mqtt.broker", "set only one uplink: uplink.nats.url is set too")
	}
	v.nats()

	m := u.MQTT
	var scheme string
	switch m.Broker {
	case "":
	case "embedded":
		v.add("uplink.mqtt.broker", "cannot be embedded: the uplink goes to a cloud broker (a URL such as ssl://broker.example.com:8883)")
	default:
		if pu := v.brokerURL("uplink.mqtt.broker", m.Broker, mqttSchemes, true); pu != nil {
			scheme = pu.Scheme
		}
	}
	switch {
	case m.Topic != "":
		v.publishTopic("uplink.mqtt.topic", m.Topic, "gateway_id")
	case m.Broker != "":
		v.add("uplink.mqtt.topic", "required with uplink.mqtt.broker")
	}
	v.checkQoS("uplink.mqtt.qos", m.QoS, 1)
	if m.Broker != "" && m.ClientID != "" && m.ClientID == c.MQTT.ClientID {
		v.add("uplink.mqtt.client_id", "must differ from mqtt.client_id (%q): a broker disconnects one of two clients with the same id", m.ClientID)
	}
	if m.Password != "" && m.Username == "" {
		v.add("uplink.mqtt.password", "needs uplink.mqtt.username (MQTT sends a password only with a user name)")
	}
	v.tls("uplink.mqtt", m.TLS, false, scheme)

	v.atLeast("uplink.max_batch_records", u.MaxBatchRecords, 1)
	switch {
	case u.MaxBatchBytes < 1<<10:
		v.add("uplink.max_batch_bytes", "must be at least 1KiB, not %s (one aggregate must fit in a batch)", u.MaxBatchBytes)
	case u.MaxBatchBytes > 64<<20:
		v.add("uplink.max_batch_bytes", "must be at most 64MiB, not %s (the receivers' decompression limit)", u.MaxBatchBytes)
	}
	v.oneOf("uplink.compression", u.Compression, "zstd", "none")
	switch {
	case u.MaxBytesPerSecond < 0:
		v.add("uplink.max_bytes_per_second", "must not be negative (0 is unlimited)")
	case u.MaxBytesPerSecond > 0 && u.MaxBytesPerSecond < 1<<10:
		v.add("uplink.max_bytes_per_second", "must be 0 (unlimited) or at least 1KiB, not %s", u.MaxBytesPerSecond)
	}
	v.positive("uplink.ack_timeout", u.AckTimeout)
	v.positive("uplink.reconnect_max_interval", u.ReconnectMaxInterval)
}

func (v *validator) nats() {
	n := v.c.Uplink.NATS
	if n.URL != "" {
		// nats.Connect takes a comma-separated list of servers, all
		// websocket or none (it refuses the mix at every connect).
		urls := strings.Split(n.URL, ",")
		websocket := 0
		for _, s := range urls {
			s = strings.TrimSpace(s)
			v.brokerURL("uplink.nats.url", s, natsSchemes, false)
			if l := strings.ToLower(s); strings.HasPrefix(l, "ws://") || strings.HasPrefix(l, "wss://") {
				websocket++
			}
		}
		if websocket > 0 && websocket < len(urls) {
			v.add("uplink.nats.url", "mixes websocket (ws://, wss://) and other URLs; list one kind")
		}
	}
	v.natsSubject("uplink.nats.subject", n.Subject)
	switch {
	case n.Stream == "" && n.CreateStream:
		v.add("uplink.nats.stream", "required when uplink.nats.create_stream is true")
	case n.Stream != "" && strings.ContainsAny(n.Stream, " \t\r\n.*>/\\"):
		v.add("uplink.nats.stream", "%q: a stream name cannot contain spaces, '.', '*', '>', '/' or '\\'", n.Stream)
	}
	auth := 0
	for _, s := range []string{n.CredsFile, n.User, n.Token} {
		if s != "" {
			auth++
		}
	}
	if auth > 1 {
		v.add("uplink.nats", "use only one of creds_file, user/password and token")
	}
	if n.Password != "" && n.User == "" {
		v.add("uplink.nats.password", "needs uplink.nats.user")
	}
	v.tls("uplink.nats", n.TLS, false, "")
}

// placeholderSamples stand in for placeholders when checking output topics
// and subjects.
func (v *validator) placeholderSamples() map[string]string {
	gw := v.c.GatewayID
	if !validGatewayID(gw) {
		gw = "gw" // reported separately; check the rest with a valid id
	}
	return map[string]string{"gateway_id": gw, "device": "device", "metric": "metric"}
}

func (v *validator) natsSubject(key, s string) {
	if s == "" {
		if v.c.Uplink.NATS.URL != "" {
			v.add(key, "required with uplink.nats.url")
		}
		return
	}
	exp := topic.Expand(s, map[string]string{"gateway_id": v.placeholderSamples()["gateway_id"]})
	if strings.ContainsAny(exp, "{}") {
		v.add(key, "%q: unknown placeholder (only {gateway_id} is replaced)", s)
		return
	}
	for _, tok := range strings.Split(exp, ".") {
		switch {
		case tok == "":
			v.add(key, "%q has an empty token (a NATS subject is dot-separated words)", s)
			return
		case strings.ContainsAny(tok, "*>"):
			// Wildcards are whole tokens, but a '*' or '>' inside a word
			// is refused too: subscribers' tools read it as one.
			v.add(key, "%q: cannot publish to a wildcard subject ('*' and '>' are not allowed)", s)
			return
		case strings.ContainsAny(tok, " \t\r\n"):
			v.add(key, "%q: a NATS subject cannot contain spaces", s)
			return
		}
	}
}

// publishTopic checks an MQTT topic the agent publishes to, which may
// contain the named placeholders, and returns it expanded with samples.
func (v *validator) publishTopic(key, s string, allowed ...string) (string, bool) {
	samples := v.placeholderSamples()
	vals := make(map[string]string, len(allowed))
	for _, a := range allowed {
		vals[a] = samples[a]
	}
	exp := topic.Expand(s, vals)
	switch {
	case strings.ContainsAny(exp, "{}"):
		names := make([]string, len(allowed))
		for i, a := range allowed {
			names[i] = "{" + a + "}"
		}
		v.add(key, "%q: unknown placeholder (allowed: %s)", s, strings.Join(names, ", "))
	case strings.ContainsAny(exp, "+#"):
		v.add(key, "%q: cannot publish to a topic with the wildcards + or #", s)
	case strings.HasPrefix(exp, "$"):
		v.add(key, "%q: topics starting with $ are reserved for the broker", s)
	case strings.ContainsRune(exp, 0):
		v.add(key, "%q: a topic cannot contain NUL", s)
	default:
		return exp, true
	}
	return "", false
}

// topicExpansions expands the placeholders of s named in allowed in every
// combination of their sample and the literal levels of the
// subscriptions' topics ({gateway_id} takes its one value).
func (v *validator) topicExpansions(s string, allowed []string) []string {
	samples := v.placeholderSamples()
	var literals []string
	for _, sub := range v.c.MQTT.Subscriptions {
		for _, level := range strings.Split(sub.Topic, "/") {
			if level != "" && !strings.ContainsAny(level, "{}+#") && !slices.Contains(literals, level) {
				literals = append(literals, level)
			}
		}
	}
	out := []string{s}
	for _, name := range allowed {
		ph := "{" + name + "}"
		if !strings.Contains(s, ph) {
			continue
		}
		values := []string{samples[name]}
		if name != "gateway_id" {
			values = append(values, literals...)
		}
		next := make([]string, 0, len(out)*len(values))
		for _, o := range out {
			for _, val := range values {
				next = append(next, strings.ReplaceAll(o, ph, val))
			}
		}
		out = next
	}
	return out
}

func (v *validator) alerts() {
	c := v.c
	names := make(map[string]int)
	for i, r := range c.Alerts {
		key := fmt.Sprintf("alerts[%d]", i)
		switch j, dup := names[r.Name]; {
		case r.Name == "":
			v.add(key+".name", "required")
		case dup:
			v.add(key+".name", "%q is already the name of alerts[%d]", r.Name, j)
		default:
			names[r.Name] = i
		}
		switch {
		case r.Metric == "":
			v.add(key+".metric", "required")
		case len(c.Readings.Metrics) > 0 && !slices.Contains(c.Readings.Metrics, r.Metric):
			msg := fmt.Sprintf("%q is not in readings.metrics, so it is never computed", r.Metric)
			if s := suggest(r.Metric, c.Readings.Metrics); s != "" {
				msg += " (did you mean " + s + "?)"
			}
			v.add(key+".metric", "%s", msg)
		}
		if r.Devices == "" {
			v.add(key+".devices", "must not be empty (\"*\" matches every device)")
		} else if _, err := path.Match(r.Devices, ""); err != nil {
			v.add(key+".devices", "%q is not a valid glob pattern", r.Devices)
		}
		when, whenOK := v.condition(key+".when", r.When)
		if r.ClearWhen != "" {
			clear, clearOK := v.condition(key+".clear_when", r.ClearWhen)
			if whenOK && clearOK && when.Aggregate == clear.Aggregate {
				if x, ok := overlap(when, clear); ok {
					v.add(key+".clear_when", "%q and when %q both hold at %s, so the alert would fire and clear at once", r.ClearWhen, r.When, strconv.FormatFloat(x, 'g', 6, 64))
				}
			}
		}
		v.atLeast(key+".for", r.For, 1)
		if len(r.Actions) == 0 {
			v.add(key+".actions", "must name at least one of uplink, local")
		}
		seen := make(map[string]bool)
		for j, a := range r.Actions {
			akey := fmt.Sprintf("%s.actions[%d]", key, j)
			if !v.oneOf(akey, a, "uplink", "local") {
				continue
			}
			if seen[a] {
				v.add(akey, "%s is listed twice", a)
				continue
			}
			seen[a] = true
			if a == "local" && c.LocalPublish.AlertsTopic == "" {
				v.add(akey, "local needs local_publish.alerts_topic")
			}
		}
		v.nonNegative(key+".min_interval", r.MinInterval)
	}
}

func (v *validator) condition(key, s string) (Condition, bool) {
	cond, msg := parseCondition(s)
	if msg != "" {
		v.add(key, "%s", msg)
		return cond, false
	}
	if !slices.Contains(v.c.Window.Aggregates, cond.Aggregate) {
		v.add(key, "%q uses %s, which is not in window.aggregates", s, cond.Aggregate)
		return cond, false
	}
	if cond.Aggregate == "count" && !countCanHold(cond) && v.c.written(key) {
		// A rule that can never fire, or an alert that can never clear.
		// (A default clear_when, "count <= 0" for "count > 0", is a rule
		// that fires once and stays firing, as written.)
		v.add(key, "%q never holds: count is a whole number of readings, at least 1 in every window evaluated", s)
		return cond, false
	}
	return cond, true
}

// countCanHold reports whether c holds for some count of an emitted
// window: a whole number from 1. One-sided comparisons hold, if at all, at
// 1, next to the threshold, or far above it.
func countCanHold(c Condition) bool {
	f := math.Floor(c.Value)
	for _, n := range []float64{1, f - 1, f, f + 1, f + 2, 1 << 53} {
		if n >= 1 && c.Holds(n) {
			return true
		}
	}
	return false
}

func (v *validator) localPublish() {
	c := v.c
	lp := c.LocalPublish
	v.atLeast("local_publish.storm_threshold", lp.StormThreshold, 1)
	v.nonNegative("local_publish.storm_window", lp.StormWindow)
	check := func(key, s string, allowed ...string) {
		if s == "" {
			return
		}
		if _, ok := v.publishTopic(key, s, allowed...); !ok {
			return
		}
		// Local messages go to the device-side broker: one the agent also
		// subscribes to would be ingested as a reading, forever. Each
		// placeholder is tried with a sample and with every literal level
		// of the subscriptions, so that dev/{device}/{metric} is caught
		// against dev/{device}/telemetry (a metric named telemetry).
		for _, exp := range v.topicExpansions(s, allowed) {
			for i, sub := range c.MQTT.Subscriptions {
				if t, err := topic.Parse(sub.Topic); err == nil {
					if _, _, match := t.Match(exp); match {
						v.add(key, "%q matches mqtt.subscriptions[%d].topic %q (as %q): the agent would ingest its own messages", s, i, sub.Topic, exp)
						return
					}
				}
			}
		}
	}
	check("local_publish.alerts_topic", lp.AlertsTopic, "gateway_id", "device")
	check("local_publish.aggregates_topic", lp.AggregatesTopic, "gateway_id", "device", "metric")
	// The same loop through an MQTT uplink pointed at the device broker.
	if c.Uplink.MQTT.Broker != "" && sameDeviceBroker(c.MQTT, c.Uplink.MQTT.Broker) {
		check("uplink.mqtt.topic", c.Uplink.MQTT.Topic, "gateway_id")
	}
}

// sameDeviceBroker reports whether the broker URL reaches the device
// broker m: the same URL, or the same port on the same host, counting
// localhost and 127.0.0.1 as one host, and the built-in broker's
// every-interface listener as reachable on loopback.
func sameDeviceBroker(m MQTT, broker string) bool {
	if broker == m.Broker {
		return true
	}
	host, port, ok := brokerEndpoint(broker)
	if !ok {
		return false
	}
	if m.Broker == "embedded" {
		// The built-in broker listens for plain MQTT over TCP only.
		if u, err := url.Parse(broker); err != nil || u.Scheme != "tcp" && u.Scheme != "mqtt" {
			return false
		}
		lh, lp, err := net.SplitHostPort(m.Embedded.Listen)
		if err != nil || lp != port {
			return false
		}
		return wildcardHost(lh) && sameHost("127.0.0.1", host) || sameHost(lh, host)
	}
	dh, dp, ok := brokerEndpoint(m.Broker)
	return ok && dp == port && sameHost(dh, host)
}

// brokerEndpoint is a broker URL's host and port. Validation requires the
// port except for websocket URLs, which default to 80 and 443.
func brokerEndpoint(broker string) (host, port string, ok bool) {
	u, err := url.Parse(broker)
	if err != nil || u.Host == "" {
		return "", "", false
	}
	port = u.Port()
	if port == "" {
		port = map[string]string{"ws": "80", "wss": "443"}[u.Scheme]
	}
	return u.Hostname(), port, port != ""
}

// sameHost compares host names, all loopback names being one host.
func sameHost(a, b string) bool {
	loopback := func(h string) bool {
		ip := net.ParseIP(h)
		return strings.EqualFold(h, "localhost") || ip != nil && ip.IsLoopback()
	}
	return strings.EqualFold(a, b) || loopback(a) && loopback(b)
}
