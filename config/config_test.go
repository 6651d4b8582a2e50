package config

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/edgeagent/edgeagent/testrig/certtest"
)

func noEnv(string) (string, bool) { return "", false }

// equalConfigs compares two Configs ignoring where they were parsed from.
func equalConfigs(a, b *Config) bool {
	x, y := *a, *b
	x.src, y.src = nil, nil
	return reflect.DeepEqual(x, y)
}

func mustParse(t *testing.T, yaml string) *Config {
	t.Helper()
	c, err := Parse("config.yaml", []byte(yaml), noEnv)
	if err != nil {
		t.Fatalf("Parse:\n%v", err)
	}
	return c
}

const minimal = "gateway_id: gw-01\nmqtt:\n  subscriptions:\n    - topic: sensors/{device}/telemetry\n"

// The defaults are part of the file format's contract (docs/config.md).
func TestDefaults(t *testing.T) {
	want := map[string]string{
		"gateway_id":                           "",
		"data_dir":                             "/var/lib/edgeagent",
		"log.format":                           "text",
		"log.level":                            "info",
		"mqtt.broker":                          "tcp://127.0.0.1:1883",
		"mqtt.embedded.listen":                 "127.0.0.1:1883",
		"mqtt.embedded.max_pending_writes":     "256",
		"mqtt.embedded.session_expiry":         "1h",
		"mqtt.client_id":                       "",
		"mqtt.username":                        "",
		"mqtt.password":                        "",
		"mqtt.tls.ca_file":                     "",
		"mqtt.tls.cert_file":                   "",
		"mqtt.tls.key_file":                    "",
		"mqtt.tls.insecure_skip_verify":        "false",
		"mqtt.keep_alive":                      "30s",
		"mqtt.connect_timeout":                 "10s",
		"mqtt.reconnect_max_interval":          "30s",
		"mqtt.subscriptions":                   "[]",
		"ingest.commit_interval":               "50ms",
		"ingest.max_commit_records":            "1000",
		"ingest.clock_tick_interval":           "1s",
		"ingest.max_payload_bytes":             "256KiB",
		"storage.bronze_retention":             "168h",
		"storage.bronze_max_bytes":             "1GiB",
		"storage.outbox_max_bytes":             "256MiB",
		"status.listen":                        "127.0.0.1:9464",
		"status.token":                         "",
		"readings.event_id":                    "id",
		"readings.event_time":                  "ts",
		"readings.time_format":                 "auto",
		"readings.metrics":                     "[]",
		"readings.max_future_skew":             "5m",
		"readings.max_past_skew":               "720h",
		"window.size":                          "1m",
		"window.slide":                         "1m",
		"window.watermark_delay":               "10s",
		"window.allowed_lateness":              "10m",
		"window.idle_timeout":                  "2m",
		"window.aggregates":                    "[count sum min max mean first last]",
		"window.max_devices":                   "100000",
		"window.max_metrics_per_device":        "1000",
		"window.device_expiry":                 "24h",
		"processing.trigger_interval":          "1s",
		"processing.max_records_per_batch":     "10000",
		"processing.checkpoint_interval":       "10s",
		"processing.max_procs":                 "1",
		"processing.heap_pacing":               "true",
		"uplink.nats.url":                      "",
		"uplink.nats.subject":                  "edge.{gateway_id}.aggregates",
		"uplink.nats.stream":                   "EDGE",
		"uplink.nats.create_stream":            "false",
		"uplink.nats.creds_file":               "",
		"uplink.nats.user":                     "",
		"uplink.nats.password":                 "",
		"uplink.nats.token":                    "",
		"uplink.nats.tls.ca_file":              "",
		"uplink.nats.tls.insecure_skip_verify": "false",
		"uplink.mqtt.broker":                   "",
		"uplink.mqtt.topic":                    "edge/{gateway_id}/aggregates",
		"uplink.mqtt.qos":                      "1",
		"uplink.mqtt.client_id":                "",
		"uplink.mqtt.username":                 "",
		"uplink.mqtt.password":                 "",
		"uplink.mqtt.tls.ca_file":              "",
		"uplink.max_batch_records":             "500",
		"uplink.max_batch_bytes":               "256KiB",
		"uplink.compression":                   "zstd",
		"uplink.max_bytes_per_second":          "0",
		"uplink.ack_timeout":                   "10s",
		"uplink.reconnect_max_interval":        "30s",
		"alerts":                               "[]",
		"local_publish.alerts_topic":           "edgeagent/{gateway_id}/alerts/{device}",
		"local_publish.aggregates_topic":       "",
		"local_publish.storm_threshold":        "20",
		"local_publish.storm_window":           "1m",
	}
	d := Default()
	for key, w := range want {
		got, err := valueAt(d, key)
		if err != nil {
			t.Errorf("%s: %v", key, err)
		} else if got != w {
			t.Errorf("Default %s = %q, want %q", key, got, w)
		}
	}
	// Every leaf key is in the table, so a new key needs a decided default.
	for _, p := range schemaLeaves() {
		if _, ok := want[p]; !ok && !strings.Contains(p, "[]") && !strings.Contains(p, ".tls.") {
			t.Errorf("no default checked for %s", p)
		}
	}
}

func TestAlertAndSubscriptionDefaults(t *testing.T) {
	c := mustParse(t, minimal+"alerts:\n  - name: hot\n    metric: t\n    when: mean > 80\n")
	r := c.Alerts[0]
	if r.Devices != "*" || r.For != 1 || !reflect.DeepEqual(r.Actions, []string{"uplink"}) ||
		r.MinInterval.String() != "1m" || r.Retain || r.Severity != "" {
		t.Errorf("alert defaults: %+v", r)
	}
	if r.ClearWhen != "mean <= 80" {
		t.Errorf("clear_when = %q, want the negation of when", r.ClearWhen)
	}
	s := c.MQTT.Subscriptions[0]
	if s.QoS != 1 || s.Format != "json" {
		t.Errorf("subscription defaults: %+v", s)
	}
	tmpl, err := s.Template()
	if err != nil || tmpl.Filter() != "sensors/+/telemetry" || !tmpl.HasDevice() {
		t.Errorf("Template() = %v, %v", tmpl, err)
	}
}

// Default() lacks exactly the two values a gateway must provide.
func TestDefaultValidate(t *testing.T) {
	err := Default().Validate()
	var errs *Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Validate() = %v, want *Errors", err)
	}
	var keys []string
	for _, fe := range errs.List {
		keys = append(keys, fe.Key)
		if fe.File != "" || fe.Line != 0 {
			t.Errorf("a Config built in code has no file or line: %+v", fe)
		}
	}
	if !reflect.DeepEqual(keys, []string{"gateway_id", "mqtt.subscriptions"}) {
		t.Errorf("problems with Default(): %v", keys)
	}
	if !strings.HasPrefix(errs.Error(), "gateway_id: required") {
		t.Errorf("Error() = %q", errs.Error())
	}
	c := Default()
	c.GatewayID = "gw"
	c.MQTT.Subscriptions = []Subscription{{Topic: "s/{device}", QoS: 1, Format: "json"}}
	c.ApplyDerived()
	if err := c.Validate(); err != nil {
		t.Errorf("completed Default(): %v", err)
	}
	if c.MQTT.ClientID != "edgeagent-gw" || c.Uplink.MQTT.ClientID != "edgeagent-gw-uplink" {
		t.Errorf("ApplyDerived client ids: %q %q", c.MQTT.ClientID, c.Uplink.MQTT.ClientID)
	}
}

func TestUplinkTransport(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"", ""},
		{"uplink:\n  nats:\n    url: nats://127.0.0.1:4222\n", "nats"},
		{"uplink:\n  mqtt:\n    broker: ssl://127.0.0.1:8883\n", "mqtt"},
	} {
		if got := mustParse(t, minimal+tc.yaml).Uplink.Transport(); got != tc.want {
			t.Errorf("%q: Transport() = %q, want %q", tc.yaml, got, tc.want)
		}
	}
}

// example.yaml is installed as /etc/edgeagent/config.yaml: it must be
// valid, hold exactly the defaults, and show every key. Keys whose default
// follows another key's value are shown commented out: written, they would
// stop following it when a technician edits only window.size.
func TestExampleFile(t *testing.T) {
	data, err := os.ReadFile("example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse("example.yaml", data, noEnv)
	if err != nil {
		t.Fatalf("example.yaml:\n%v", err)
	}
	want := Default()
	want.GatewayID = "gw-01"
	want.MQTT.Subscriptions = []Subscription{{Topic: "sensors/{device}/telemetry", QoS: 1, Format: "json"}}
	want.ApplyDerived()
	if !equalConfigs(c, want) {
		a, _ := c.YAML()
		b, _ := want.YAML()
		t.Errorf("example.yaml differs from the defaults:\n%s\nwant:\n%s", a, b)
	}
	for _, p := range schemaLeaves() {
		if strings.HasPrefix(p, "alerts[]") {
			// Alerts default to none: the example shows a rule in comments.
			leaf := p[strings.LastIndex(p, ".")+1:]
			if !regexp.MustCompile(`(?m)^#\s+(- )?` + leaf + `:`).Match(data) {
				t.Errorf("example.yaml: commented alert rule lacks %s", leaf)
			}
			continue
		}
		_, written := c.src.pos[strings.ReplaceAll(p, "[]", "[0]")]
		if derivedKeys[p] {
			leaf := p[strings.LastIndex(p, ".")+1:]
			if written || !regexp.MustCompile(`(?m)^\s*#\s*`+leaf+`:`).Match(data) {
				t.Errorf("example.yaml: %s follows another key's value: show it commented out, not written", p)
			}
			continue
		}
		if !written {
			t.Errorf("example.yaml does not show %s", p)
		}
	}
}

// docs/config.md is the reference: it must name every key.
func TestDocsCoverEveryKey(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "docs", "config.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range schemaPaths() {
		if !strings.Contains(string(data), "`"+p+"`") {
			t.Errorf("docs/config.md does not document `%s`", p)
		}
	}
}

// schemaPaths lists every key path, list items as "[]", sections included.
func schemaPaths() []string {
	var out []string
	var walk func(t reflect.Type, path string)
	walk = func(t reflect.Type, path string) {
		f := fieldsOf(t)
		for _, name := range f.names {
			p := joinKey(path, name)
			out = append(out, p)
			ft := t.Field(f.byName[name]).Type
			switch {
			case ft.Kind() == reflect.Struct && ft != durationType && ft != sizeType:
				walk(ft, p)
			case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
				walk(ft.Elem(), p+"[]")
			}
		}
	}
	walk(reflect.TypeFor[Config](), "")
	return out
}

// schemaLeaves lists the key paths that hold values.
func schemaLeaves() []string {
	var out []string
	all := schemaPaths()
	for i, p := range all {
		if i+1 < len(all) && (strings.HasPrefix(all[i+1], p+".") || strings.HasPrefix(all[i+1], p+"[].")) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// The decoder and printer handle a fixed set of types; a field of another
// type would fail at run time, so catch it here.
func TestSchemaTypes(t *testing.T) {
	var walk func(t2 reflect.Type, path string)
	walk = func(t2 reflect.Type, path string) {
		for i := 0; i < t2.NumField(); i++ {
			f := t2.Field(i)
			if !f.IsExported() {
				continue
			}
			p := path + "." + f.Name
			if f.Tag.Get("yaml") == "" {
				t.Errorf("%s has no yaml tag", p)
			}
			ft := f.Type
			if ft.Kind() == reflect.Slice {
				ft = ft.Elem()
			}
			switch {
			case ft == durationType || ft == sizeType:
			case ft.Kind() == reflect.Struct:
				walk(ft, p)
			case ft.Kind() == reflect.String || ft.Kind() == reflect.Int || ft.Kind() == reflect.Bool:
			default:
				t.Errorf("%s: type %s is not supported by the decoder", p, f.Type)
			}
			name := strings.Split(f.Tag.Get("yaml"), ",")[0]
			if (strings.Contains(name, "password") || strings.Contains(name, "token")) && f.Tag.Get("secret") != "true" {
				t.Errorf("%s looks secret but is not tagged secret:\"true\"", p)
			}
		}
	}
	walk(reflect.TypeFor[Config](), "Config")
}

// YAML() of the effective config parses back to an equal Config.
func TestYAMLRoundTrip(t *testing.T) {
	files, _ := filepath.Glob("testdata/good_*.yaml")
	files = append(files, "example.yaml")
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			data, tc := readCase(t, path)
			c, err := Parse("in.yaml", data, mapEnv(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			out, err := c.YAML()
			if err != nil {
				t.Fatal(err)
			}
			back, err := Parse("out.yaml", out, noEnv)
			if err != nil {
				t.Fatalf("YAML() output does not parse:\n%v\n%s", err, out)
			}
			if !equalConfigs(c, back) {
				t.Errorf("round trip changed the config:\n%s", out)
			}
		})
	}
}

// Free-text values survive printing whatever they hold.
func TestYAMLStrings(t *testing.T) {
	for _, s := range []string{
		"", " ", "*", "-", "~", "null", "Null", "true", "no", "yes", "1", "007", "1.50", "1e3", ".inf", "-.nan",
		"0x1F", "1_000", "12:30", "a: b", "a:b", "a #b", "#x", "@x", "`x", "!x", "&x", "%x", "[x", "{x}", "x,y",
		"'q", "\"d", "back\\slash", "${X}", "$${X}", "$", "multi\nline", "tab\there", "\r", " lead", "trail ",
		"é", "日本", "\u2028", "\x00", "\x7f", "emoji 🙂", "\ue000", "---", "...", "? x", "|", ">", "a: 'b' #c",
	} {
		c := mustParse(t, minimal+"alerts:\n  - name: n\n    metric: m\n    when: count > 1\n")
		c.Alerts[0].Severity = s
		flow := "x" + strings.ReplaceAll(s, ".", "_") // a valid dot path, printed in [ ]
		c.Readings.Metrics = []string{"m", flow}
		c.Uplink.NATS.CredsFile = s
		out, err := c.YAML()
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse("out.yaml", out, noEnv)
		if err != nil {
			t.Errorf("%q: output does not parse:\n%v", s, err)
			continue
		}
		if back.Alerts[0].Severity != s || back.Readings.Metrics[1] != flow || back.Uplink.NATS.CredsFile != s {
			t.Errorf("%q came back as %q / %q / %q", s, back.Alerts[0].Severity, back.Readings.Metrics[1], back.Uplink.NATS.CredsFile)
		}
	}
}

func TestRedacted(t *testing.T) {
	c := mustParse(t, `
gateway_id: gw-01
mqtt:
  broker: tcp://dev:devpass@127.0.0.1:1883
  username: dev
  password: mqtt-secret
  subscriptions:
    - topic: s/{device}
status:
  listen: 0.0.0.0:9464
  token: status-secret
uplink:
  nats:
    url: nats://u:natspass@a:4222,nats://bare-token@b:4222, nats://c:4222
    token: nats-token
  mqtt:
    password: ""
alerts:
  - name: n
    metric: m
    when: count > 1
`)
	r := c.Redacted()
	for key, want := range map[string]string{
		"mqtt.broker":          "tcp://dev:***@127.0.0.1:1883",
		"mqtt.username":        "dev",
		"mqtt.password":        "***",
		"status.token":         "***",
		"uplink.nats.url":      "nats://u:***@a:4222,nats://***@b:4222, nats://c:4222",
		"uplink.nats.token":    "***",
		"uplink.nats.password": "", // empty stays empty: "***" would suggest one is set
		"uplink.mqtt.password": "",
	} {
		if got, _ := valueAt(r, key); got != want {
			t.Errorf("Redacted %s = %q, want %q", key, got, want)
		}
	}
	out, err := r.YAML()
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"devpass", "mqtt-secret", "status-secret", "natspass", "bare-token", "nats-token"} {
		if strings.Contains(string(out), secret) {
			t.Errorf("redacted YAML shows %q:\n%s", secret, out)
		}
	}
	// The original is untouched and shares nothing mutable with the copy.
	if c.MQTT.Password != "mqtt-secret" || c.Status.Token != "status-secret" {
		t.Error("Redacted changed the original")
	}
	r.MQTT.Subscriptions[0].Topic = "changed"
	r.Alerts[0].Actions[0] = "changed"
	r.Window.Aggregates[0] = "changed"
	if c.MQTT.Subscriptions[0].Topic == "changed" || c.Alerts[0].Actions[0] == "changed" || c.Window.Aggregates[0] == "changed" {
		t.Error("Redacted shares slices with the original")
	}
}

// A secret may hold any character: the reference is expanded inside the
// parsed value, so the value cannot change the document.
func TestEnvSecretWithSpecialCharacters(t *testing.T) {
	data, tc := readCase(t, "testdata/good_env.yaml")
	c, err := Parse("config.yaml", data, mapEnv(tc.env))
	if err != nil {
		t.Fatal(err)
	}
	if want := tc.env["MQTT_PW"]; c.MQTT.Password != want || !strings.Contains(want, "\n") {
		t.Errorf("password = %q, want %q", c.MQTT.Password, want)
	}
	// Expanded once: a value that itself contains ${X} is not looked up again.
	if !strings.Contains(c.MQTT.Password, "${NOT_EXPANDED_TWICE}") {
		t.Errorf("password = %q", c.MQTT.Password)
	}
}

func TestEnvNilUsesProcessEnvironment(t *testing.T) {
	t.Setenv("EDGEAGENT_TEST_GW", "from-env")
	c, err := Parse("config.yaml", []byte(strings.Replace(minimal, "gw-01", "${EDGEAGENT_TEST_GW}", 1)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.GatewayID != "from-env" {
		t.Errorf("gateway_id = %q", c.GatewayID)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte(minimal), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.GatewayID != "gw-01" {
		t.Errorf("gateway_id = %q", c.GatewayID)
	}

	_, err = Load(filepath.Join(dir, "missing.yaml"))
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("Load(missing) = %v, want a not-exist error naming the file", err)
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("gateway_id: gw\nmqtt:\n  subscriptions:\n    - topic: a/{device}\n      qos: 7\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load(bad)
	if want := bad + ":5: mqtt.subscriptions[0].qos: must be 0, 1 or 2, not 7"; err == nil || err.Error() != want {
		t.Errorf("Load(bad) = %v, want %q", err, want)
	}
}

func TestCheckFiles(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	certtest.WriteSelfSigned(t, ca, filepath.Join(dir, "ca.key"), "127.0.0.1")
	c := mustParse(t, `gateway_id: gw
mqtt:
  broker: ssl://127.0.0.1:8883
  tls:
    ca_file: `+ca+`
  subscriptions: [{topic: "a/{device}"}]
uplink:
  nats:
    url: nats://127.0.0.1:4222
    creds_file: `+filepath.Join(dir, "missing.creds")+`
    tls:
      ca_file: `+dir+`
`)
	err := c.CheckFiles()
	var errs *Errors
	if !errors.As(err, &errs) || len(errs.List) != 2 {
		t.Fatalf("CheckFiles() = %v, want two problems", err)
	}
	got := err.Error()
	for _, want := range []string{
		"config.yaml:10: uplink.nats.creds_file: " + filepath.Join(dir, "missing.creds") + ": no such file or directory",
		"config.yaml:12: uplink.nats.tls.ca_file: " + dir + ": is a directory",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("CheckFiles() =\n%s\nwant a line %q", got, want)
		}
	}
	c.Uplink.NATS.CredsFile, c.Uplink.NATS.TLS.CAFile = "", ""
	if err := c.CheckFiles(); err != nil {
		t.Errorf("CheckFiles() with readable files = %v", err)
	}
}

// A file that can be read is also loaded as the agent loads it, so a file
// of the wrong kind is found by config check, with its line, and not at
// start or at every uplink connect.
func TestCheckFilesLoadsWhatItReads(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	notPEM := write("not.pem", "pem")
	certA, keyA := filepath.Join(dir, "a.crt"), filepath.Join(dir, "a.key")
	certtest.WriteSelfSigned(t, certA, keyA, "127.0.0.1")
	certB, keyB := filepath.Join(dir, "b.crt"), filepath.Join(dir, "b.key")
	certtest.WriteSelfSigned(t, certB, keyB, "127.0.0.1")
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := user.Seed()
	if err != nil {
		t.Fatal(err)
	}
	goodCreds := write("good.creds", "-----BEGIN NATS USER JWT-----\neyJhbGciOiJlZDI1NTE5In0.e30.c2ln\n------END NATS USER JWT------\n\n-----BEGIN USER NKEY SEED-----\n"+string(seed)+"\n------END USER NKEY SEED------\n")
	badCreds := write("bad.creds", "not a credentials file\n")
	seedOnly := write("seed.creds", string(seed)+"\n")
	parse := func(mqttCA, certFile, keyFile, creds string) *Config {
		return mustParse(t, `gateway_id: gw
mqtt:
  broker: ssl://127.0.0.1:8883
  tls:
    ca_file: `+mqttCA+`
    cert_file: `+certFile+`
    key_file: `+keyFile+`
  subscriptions: [{topic: "a/{device}"}]
uplink:
  nats:
    url: nats://127.0.0.1:4222
    creds_file: `+creds+`
`)
	}
	err = parse(notPEM, certA, keyB, badCreds).CheckFiles()
	var errs *Errors
	if !errors.As(err, &errs) || len(errs.List) != 3 {
		t.Fatalf("CheckFiles() = %v, want three problems", err)
	}
	got := err.Error()
	for _, want := range []string{
		"config.yaml:5: mqtt.tls.ca_file: " + notPEM + " holds no PEM certificate",
		"config.yaml:6: mqtt.tls.cert_file: " + certA + " with " + keyB + ": tls: private key does not match public key",
		"config.yaml:12: uplink.nats.creds_file: " + badCreds + " is not a NATS credentials file",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("CheckFiles() =\n%s\nwant a line %q", got, want)
		}
	}
	if err := parse(certA, certB, keyB, goodCreds).CheckFiles(); err != nil {
		t.Errorf("CheckFiles() with good files = %v", err)
	}
	if err := parse(certA, certB, keyB, seedOnly).CheckFiles(); err == nil || !strings.Contains(err.Error(), "no user JWT in it") {
		t.Errorf("CheckFiles() with a seed and no JWT = %v, want the JWT named as missing", err)
	}
}

// ParseCheckingFiles lists a missing file next to the other problems, so
// `config check` shows everything in one pass.
func TestParseCheckingFilesListsEverything(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.creds")
	_, err := ParseCheckingFiles("config.yaml", []byte(`gateway_id: gw
mqtt:
  broker: tcp://127.0.0.1:1883
  subscriptions: [{topic: "a/{device}"}]
window:
  size: -1m
uplink:
  nats:
    url: nats://127.0.0.1:4222
    creds_file: `+missing+`
`), func(string) (string, bool) { return "", false })
	var errs *Errors
	if !errors.As(err, &errs) || len(errs.List) != 2 {
		t.Fatalf("ParseCheckingFiles() = %v, want two problems", err)
	}
	got := err.Error()
	for _, want := range []string{"config.yaml:6: window.size:", "config.yaml:10: uplink.nats.creds_file: " + missing + ": no such file or directory"} {
		if !strings.Contains(got, want) {
			t.Errorf("ParseCheckingFiles() =\n%s\nwant a line starting %q", got, want)
		}
	}
}

func TestFieldErrorFormat(t *testing.T) {
	for _, tc := range []struct {
		fe   FieldError
		want string
	}{
		{FieldError{File: "c.yaml", Line: 12, Column: 3, Key: "a.b", Msg: "bad"}, "c.yaml:12: a.b: bad"},
		{FieldError{File: "c.yaml", Key: "a.b", Msg: "bad"}, "c.yaml: a.b: bad"},
		{FieldError{Line: 4, Key: "a", Msg: "bad"}, "line 4: a: bad"},
		{FieldError{Key: "a", Msg: "bad"}, "a: bad"},
		{FieldError{File: "c.yaml", Line: 2, Msg: "YAML syntax error: x"}, "c.yaml:2: YAML syntax error: x"},
	} {
		if got := tc.fe.Error(); got != tc.want {
			t.Errorf("%+v: Error() = %q, want %q", tc.fe, got, tc.want)
		}
	}
}

// Problems come out in line order, those without a line last, and a
// pathological file cannot produce an unbounded report.
func TestErrorsOrderAndCap(t *testing.T) {
	var b strings.Builder
	b.WriteString("x: &bad {a1: 1, a2: 2, a3: 3, a4: 4, a5: 5, a6: 6, a7: 7, a8: 8, a9: 9, a10: 10}\nmqtt:\n  subscriptions:\n")
	for i := 0; i < 50; i++ {
		b.WriteString("    - *bad\n")
	}
	_, err := Parse("config.yaml", []byte(b.String()), noEnv)
	var errs *Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Parse = %v", err)
	}
	if len(errs.List) != maxErrors+1 || !strings.HasPrefix(errs.List[maxErrors].Msg, "and ") {
		t.Errorf("%d problems reported, want %d and a summary", len(errs.List), maxErrors+1)
	}
	last := 0
	for _, fe := range errs.List[:maxErrors] {
		if fe.Line < last && fe.Line != 0 {
			t.Fatalf("problems out of order: line %d after %d", fe.Line, last)
		}
		last = fe.Line
	}
}

// The placeholder character is one the file does not contain, so a file
// holding private-use characters still expands correctly.
func TestEnvPlaceholderCollision(t *testing.T) {
	yaml := minimal + "alerts:\n  - name: \"\ue000${X}\ue0011\ue000\"\n    metric: m\n    when: count > 0\n"
	c, err := Parse("config.yaml", []byte(yaml), mapEnv(map[string]string{"X": "\ue0002\ue000"}))
	if err != nil {
		t.Fatal(err)
	}
	if want := "\ue000\ue0002\ue000\ue0011\ue000"; c.Alerts[0].Name != want {
		t.Errorf("name = %q, want %q", c.Alerts[0].Name, want)
	}
}

// A size that is not whole milliseconds is the one problem reported: no
// slide derived from it, no comparison of the default slide with it (an
// audit saw "window.slide: 1.5ms is not a whole number…" on a key never
// written).
func TestSubMillisecondSizeIsOneProblem(t *testing.T) {
	_, err := Parse("config.yaml", []byte(minimal+"window:\n  size: 1500us\n"), func(string) (string, bool) { return "", false })
	var errs *Errors
	if !errors.As(err, &errs) || len(errs.List) != 1 || !strings.Contains(err.Error(), "window.size: 1.5ms is not a whole number of milliseconds") {
		t.Fatalf("Parse() = %v, want only the size's problem", err)
	}
}

// A rule between two keys of which only one is written is reported on
// that one's line: there is no other line the user wrote (an audit saw
// "bnd.yaml: ingest.max_payload_bytes: …" with no line at all).
func TestPairRuleOnTheWrittenLine(t *testing.T) {
	_, err := Parse("config.yaml", []byte(minimal+"storage:\n  bronze_max_bytes: 64KiB\n"), noEnv)
	var errs *Errors
	if !errors.As(err, &errs) || len(errs.List) != 1 {
		t.Fatalf("Parse() = %v, want one problem", err)
	}
	fe := errs.List[0]
	if fe.Key != "ingest.max_payload_bytes" || fe.Line != strings.Count(minimal, "\n")+2 {
		t.Errorf("reported as %s, want ingest.max_payload_bytes on the line of bronze_max_bytes (%d)", fe, strings.Count(minimal, "\n")+2)
	}
}

// The event id and event time cannot be one field: config check took it,
// and every reading was then dead-lettered "field ts missing" (an audit).
func TestEventIDIsNotTheEventTime(t *testing.T) {
	_, err := Parse("config.yaml", []byte(minimal+"readings:\n  event_id: ts\n  event_time: ts\n"), noEnv)
	if err == nil || !strings.Contains(err.Error(), `readings.event_id: "ts" is also readings.event_time`) {
		t.Fatalf("Parse() = %v, want the id refused", err)
	}
}

// nats.go refuses a server list that mixes websocket and other URLs at
// every connect: config check must refuse it (found by a review).
func TestNATSURLsOfOneKind(t *testing.T) {
	_, err := Parse("config.yaml", []byte(minimal+"uplink:\n  nats:\n    url: nats://127.0.0.1:4222,WS://127.0.0.1:8080\n"), noEnv)
	if err == nil || !strings.Contains(err.Error(), "uplink.nats.url: mixes websocket") {
		t.Fatalf("Parse() = %v, want the mix refused", err)
	}
	if _, err := Parse("config.yaml", []byte(minimal+"uplink:\n  nats:\n    url: ws://127.0.0.1:8080,wss://127.0.0.1:8443\n"), noEnv); err != nil {
		t.Errorf("two websocket URLs refused: %v", err)
	}
}

// Unwritten slide, idle_timeout and device_expiry follow window.size, so
// that writing only the size gives tumbling windows of that size which no
// idle close cuts short; written values are kept.
func TestWindowDefaultsFollowSize(t *testing.T) {
	for _, tc := range []struct {
		yaml                string
		slide, idle, expiry string
	}{
		{"window: {size: 1m}", "1m", "2m", "24h"},
		{"window: {size: 5m}", "5m", "5m10s", "24h"},
		{"window: {size: 24h, watermark_delay: 1m}", "24h", "24h1m", "48h22m"},
		{"window: {size: 10m, slide: 5m, idle_timeout: 3m, device_expiry: 1h}", "5m", "3m", "1h"},
		{"window: {size: 1h, allowed_lateness: 0s}", "1h", "1h0m10s", "24h"},
	} {
		c := mustParse(t, minimal+tc.yaml+"\n")
		w := c.Window
		if w.Slide.String() != tc.slide || w.IdleTimeout.String() != tc.idle || w.DeviceExpiry.String() != tc.expiry {
			t.Errorf("%s: slide %s, idle_timeout %s, device_expiry %s; want %s, %s, %s",
				tc.yaml, w.Slide, w.IdleTimeout, w.DeviceExpiry, tc.slide, tc.idle, tc.expiry)
		}
	}
}

// ParseReadOnly: a key whose variable is unset keeps its default, with no
// error and none of its checks, and Unresolved names the variable for the
// key and for its parents; set variables and other keys are as in Parse.
func TestParseReadOnly(t *testing.T) {
	yaml := `gateway_id: ${GW}
mqtt:
  broker: tcp://127.0.0.1:1883
  password: ${MQTTPW}
  subscriptions: [{topic: "a/{device}"}]
uplink:
  max_batch_bytes: ${BATCH}
status:
  listen: ${LISTEN}
`
	env := func(name string) (string, bool) {
		if name == "LISTEN" {
			return "127.0.0.1:9999", true
		}
		return "", false
	}
	if _, err := Parse("config.yaml", []byte(yaml), env); err == nil || !strings.Contains(err.Error(), "environment variable MQTTPW is not set") {
		t.Fatalf("Parse with unset variables = %v", err)
	}
	c, err := ParseReadOnly("config.yaml", []byte(yaml), env)
	if err != nil {
		t.Fatalf("ParseReadOnly: %v", err)
	}
	if c.Status.Listen != "127.0.0.1:9999" || c.GatewayID != "" || c.Uplink.MaxBatchBytes != Default().Uplink.MaxBatchBytes {
		t.Errorf("ParseReadOnly values: listen %q, gateway %q, max_batch_bytes %v", c.Status.Listen, c.GatewayID, c.Uplink.MaxBatchBytes)
	}
	for key, want := range map[string]string{"gateway_id": "GW", "mqtt": "MQTTPW", "mqtt.password": "MQTTPW", "uplink.max_batch_bytes": "BATCH", "status.listen": "", "status": ""} {
		if got := strings.Join(c.Unresolved(key), ","); got != want {
			t.Errorf("Unresolved(%s) = %q, want %q", key, got, want)
		}
	}
	// A cross-key check on a key left unknown does not hold either way.
	cross := "gateway_id: gw\nmqtt:\n  broker: tcp://127.0.0.1:1883\n  username: ${MU}\n  password: pw\n  subscriptions: [{topic: \"a/{device}\"}]\n"
	if _, err := ParseReadOnly("config.yaml", []byte(cross), env); err != nil {
		t.Errorf("ParseReadOnly with the username's variable unset: %v", err)
	}
	if _, err := Parse("config.yaml", []byte(cross), env); err == nil {
		t.Error("Parse accepted an unset variable")
	}
	// A key that is wrong for another reason is still refused.
	if _, err := ParseReadOnly("config.yaml", []byte(yaml+"  tokn: x\n"), env); err == nil || !strings.Contains(err.Error(), "tokn") {
		t.Errorf("ParseReadOnly with an unknown key = %v", err)
	}
}

// Every whole config the docs show (a YAML block with gateway_id) is
// valid as written, with its ${NAME} variables set and the files it names
// not checked: a reader copies them (an audit found the fleet example in
// install.md failing its own check).
func TestDocExamplesAreValid(t *testing.T) {
	block := regexp.MustCompile("(?s)```yaml\n(.*?)```")
	files, err := filepath.Glob(filepath.Join("..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, f := range append(files, filepath.Join("..", "README.md")) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range block.FindAllSubmatchIndex(data, -1) {
			yaml := data[m[2]:m[3]]
			if !bytes.Contains(yaml, []byte("gateway_id:")) {
				continue // a fragment
			}
			name := fmt.Sprintf("%s:%d", filepath.Base(f), bytes.Count(data[:m[2]], []byte("\n"))+1)
			if _, err := Parse(name, yaml, func(string) (string, bool) { return "gw-doc", true }); err != nil {
				t.Errorf("the example at %s is invalid:\n%v", name, err)
			}
			checked++
		}
	}
	if checked < 3 {
		t.Errorf("checked %d examples; the README, config.md and install.md have whole ones", checked)
	}
}

// derivedKeys are the keys whose default ApplyDerived takes from
// window.size while the file does not write them.
var derivedKeys = map[string]bool{"window.slide": true, "window.idle_timeout": true, "window.device_expiry": true}
