package config

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse feeds arbitrary bytes to Parse. It must never panic, and any
// file it accepts must print (YAML) to a file that parses back to an
// equal Config.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.yaml")
	for _, p := range append(files, "example.yaml") {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("gateway_id: ${A}\nmqtt:\n  subscriptions: [{topic: \"${B}/{device}\"}]\n"))
	f.Add([]byte("a: &a [*a]\n"))
	f.Add([]byte("\ue000${X}\ue000"))
	env := func(name string) (string, bool) {
		if name == "UNSET" {
			return "", false
		}
		return "v-" + name + "\n#:\"", true
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("fuzz.yaml", data, env)
		if err != nil {
			if c != nil {
				t.Fatal("Config returned with an error")
			}
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		out, err := c.YAML()
		if err != nil {
			t.Fatalf("YAML: %v", err)
		}
		back, err := Parse("out.yaml", out, env)
		if err != nil {
			t.Fatalf("printed config does not parse: %v\n%s", err, out)
		}
		if !equalConfigs(c, back) {
			t.Fatalf("round trip changed the config:\n%s", out)
		}
		if _, err := c.Redacted().YAML(); err != nil {
			t.Fatalf("Redacted().YAML: %v", err)
		}
	})
}

// BenchmarkParse measures loading the full example file: the agent pays it
// once at start and `config check` once per run, so only a gross regression
// (a quadratic walk, say) would matter.
func BenchmarkParse(b *testing.B) {
	data, err := os.ReadFile("example.yaml")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse("example.yaml", data, noEnv); err != nil {
			b.Fatal(err)
		}
	}
}
