package wire_test

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/edgeagent/edgeagent/uplink/wire"
)

const wireDoc = "../../docs/wire-format.md"

// docExample is the batch of the worked example in docs/wire-format.md.
func docExample() *wire.Batch {
	a := wire.Aggregate{
		Device: "dev-0042", Metric: "temperature", Start: 1767225600000, End: 1767225660000, Count: 60,
		Sum: wire.F(1282.5), Min: wire.F(21.25), Max: wire.F(21.5), Mean: wire.F(21.375),
		First: wire.F(21.25), Last: wire.F(21.5), Rev: 1,
	}
	a.Key = wire.AggregateKey("gw-0001", a.Device, a.Metric, a.Start, a.Rev)
	return &wire.Batch{V: 1, Gateway: "gw-0001", Batch: "gw-0001-41-41-7c4a79887be718f2", Aggregates: []wire.Aggregate{a}}
}

// docBlock returns the fenced block that follows the marker comment.
func docBlock(t *testing.T, doc, marker string) string {
	t.Helper()
	re := regexp.MustCompile("(?s)<!-- " + regexp.QuoteMeta(marker) + "[^>]*-->\n```[a-z]*\n(.*?)\n```")
	m := re.FindStringSubmatch(doc)
	if m == nil {
		t.Fatalf("%s: no block after <!-- %s -->", wireDoc, marker)
	}
	return m[1]
}

func docHex(t *testing.T, doc, marker string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(docBlock(t, doc, marker)), ""))
	if err != nil {
		t.Fatalf("%s: %s: %v", wireDoc, marker, err)
	}
	return b
}

// TestWireFormatDocExample keeps the worked example honest: the documented
// CBOR is byte for byte what the encoder makes, the documented zstd frame
// decodes to the same batch, and the documented Python decoder (when Python
// with cbor2 and zstandard is installed) reads both.
func TestWireFormatDocExample(t *testing.T) {
	raw, err := os.ReadFile(wireDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	want := docExample()
	enc, err := wire.EncodeBatch(want, wire.EncodingNone)
	if err != nil {
		t.Fatal(err)
	}
	cborHex := docHex(t, doc, "wire-example-cbor")
	if !bytes.Equal(cborHex, enc) {
		t.Fatalf("%s: the documented CBOR is not what the encoder makes; update the doc with\n%x", wireDoc, enc)
	}
	zstdHex := docHex(t, doc, "wire-example-zstd")
	got, err := wire.DecodeBody(zstdHex)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: the documented zstd frame decodes to %+v, %v", wireDoc, got, err)
	}
	if !strings.Contains(doc, fmt.Sprintf("%d bytes", len(enc))) {
		t.Errorf("%s: the example's size (%d bytes) is not stated", wireDoc, len(enc))
	}

	python := pythonWithModules(t)
	dir := t.TempDir()
	script := docBlock(t, doc, "wire-example-python") + `

import sys
table = {}
for path in sys.argv[1:]:
    with open(path) as f:
        upsert(table, decode_body(bytes.fromhex(f.read())))
(window, agg), = table.items()
print(window[0], window[1], window[2], window[3], agg["rev"], agg["sum"], agg["key"])
`
	files := map[string]string{"decode.py": script, "cbor.hex": hex.EncodeToString(cborHex), "zstd.hex": hex.EncodeToString(zstdHex)}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(python, filepath.Join(dir, "decode.py"), filepath.Join(dir, "cbor.hex"), filepath.Join(dir, "zstd.hex")).CombinedOutput()
	if err != nil {
		t.Fatalf("the documented Python decoder failed: %v\n%s", err, out)
	}
	a := want.Aggregates[0]
	if line := fmt.Sprintf("gw-0001 %s %s %d %d %v %s", a.Device, a.Metric, a.Start, a.Rev, *a.Sum, a.Key); strings.TrimSpace(string(out)) != line {
		t.Fatalf("the documented Python decoder printed %q, want %q", out, line)
	}
}

// pythonWithModules finds a python3 that has cbor2 and zstandard, or skips.
func pythonWithModules(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		path, err := exec.LookPath(p)
		if err != nil {
			continue
		}
		if exec.Command(path, "-c", "import cbor2, zstandard").Run() == nil {
			return path
		}
	}
	t.Skip("python3 with cbor2 and zstandard is not installed (apt-get install python3-cbor2 python3-zstandard); the Python example is not run")
	return ""
}

func ExampleDecodeBody() {
	body, err := wire.EncodeBatch(docExample(), wire.EncodingZstd)
	if err != nil {
		panic(err)
	}
	// A receiver on MQTT has no Content-Encoding header: DecodeBody sniffs.
	b, err := wire.DecodeBody(body)
	if err != nil {
		panic(err)
	}
	for _, a := range b.Aggregates {
		fmt.Println(b.Gateway, a.Device, a.Metric, a.Start, a.Rev, *a.Mean)
	}
	// Output: gw-0001 dev-0042 temperature 1767225600000 1 21.375
}
