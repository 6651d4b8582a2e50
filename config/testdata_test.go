package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// Each file under testdata/ is one case. Header comments say what to
// expect, telegraf-style:
//
//	# env: NAME=value         an environment variable (value may be Go-quoted)
//	# error: substring        one expected problem; the file is bad when any is given,
//	                          and the error must have exactly this many lines
//	# expect: key.path = value  a decoded value, for good files
//	value  # want: substring  an expected problem on this line: the same as
//	                          # error: config.yaml:<this line>: substring
//
// Files are parsed as "config.yaml", so substrings read like real output.
type testCase struct {
	env    map[string]string
	errors []string
	expect [][2]string
}

func readCase(t *testing.T, path string) ([]byte, testCase) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tc := testCase{env: map[string]string{}}
	for i, line := range strings.Split(string(data), "\n") {
		if _, want, ok := strings.Cut(line, " # want: "); ok {
			tc.errors = append(tc.errors, fmt.Sprintf("config.yaml:%d: %s", i+1, want))
			continue
		}
		directive, rest, ok := strings.Cut(strings.TrimPrefix(line, "# "), ": ")
		if !ok || !strings.HasPrefix(line, "# ") {
			continue
		}
		switch directive {
		case "env":
			name, val, _ := strings.Cut(rest, "=")
			if strings.HasPrefix(val, `"`) {
				if val, err = strconv.Unquote(val); err != nil {
					t.Fatalf("%s: env %s: %v", path, name, err)
				}
			}
			tc.env[name] = val
		case "error":
			tc.errors = append(tc.errors, rest)
		case "expect":
			k, v, ok := strings.Cut(rest, " = ")
			if !ok {
				t.Fatalf("%s: bad expect line %q", path, line)
			}
			tc.expect = append(tc.expect, [2]string{k, v})
		}
	}
	return data, tc
}

func mapEnv(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestTestdata(t *testing.T) {
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 20 {
		t.Fatalf("found only %d cases in testdata/", len(files))
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			data, tc := readCase(t, path)
			good := strings.HasPrefix(filepath.Base(path), "good_")
			if good != (len(tc.errors) == 0) {
				t.Fatalf("good_ files must have no # error: lines, bad_ files at least one")
			}
			c, err := Parse("config.yaml", data, mapEnv(tc.env))
			if good {
				if err != nil {
					t.Fatalf("unexpected error:\n%v", err)
				}
				if len(tc.expect) == 0 {
					t.Fatal("a good case must check at least one value with # expect:")
				}
				for _, e := range tc.expect {
					got, err := valueAt(c, e[0])
					if err != nil {
						t.Errorf("%s: %v", e[0], err)
					} else if got != e[1] {
						t.Errorf("%s = %q, want %q", e[0], got, e[1])
					}
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want:\n%s", strings.Join(tc.errors, "\n"))
			}
			if c != nil {
				t.Error("Parse returned a Config with an error")
			}
			var errs *Errors
			if !errors.As(err, &errs) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %T does not unwrap to *Errors and ErrInvalid", err)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(errs.List) {
				t.Errorf("Error() has %d lines for %d problems", len(lines), len(errs.List))
			}
			used := make([]bool, len(lines))
		want:
			for _, w := range tc.errors {
				for i, l := range lines {
					if !used[i] && strings.Contains(l, w) {
						used[i] = true
						continue want
					}
				}
				t.Errorf("missing error %q", w)
			}
			for i, l := range lines {
				if !used[i] {
					t.Errorf("unexpected error %q", l)
				}
			}
			for _, fe := range errs.List {
				if fe.File != "config.yaml" {
					t.Errorf("%q: File = %q", fe.Error(), fe.File)
				}
			}
		})
	}
}

// valueAt returns the value at a key path such as "mqtt.subscriptions[0].qos",
// formatted with fmt (Duration and Size print as in the file).
func valueAt(c *Config, path string) (string, error) {
	v := reflect.ValueOf(c).Elem()
	for _, part := range strings.Split(path, ".") {
		name, idx, hasIdx := strings.Cut(part, "[")
		f, ok := fieldsOf(v.Type()).byName[name]
		if !ok {
			return "", fmt.Errorf("no key %q", name)
		}
		v = v.Field(f)
		if hasIdx {
			i, err := strconv.Atoi(strings.TrimSuffix(idx, "]"))
			if err != nil || i >= v.Len() {
				return "", fmt.Errorf("bad index in %q (len %d)", part, v.Len())
			}
			v = v.Index(i)
		}
	}
	if v.Kind() == reflect.String {
		return v.String(), nil
	}
	return fmt.Sprint(v.Interface()), nil
}
