package config

import (
	"bytes"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/edgeagent/edgeagent/internal/secret"
	"github.com/goccy/go-yaml/token"
)

// mask replaces secrets in Redacted output.
const mask = secret.Mask

// Redacted returns a deep copy of c with every non-empty secret (passwords,
// tokens) replaced by "***" and passwords in URL user info masked, for
// printing and logging.
func (c *Config) Redacted() *Config {
	r := c.clone()
	redact(reflect.ValueOf(r).Elem())
	return r
}

func (c *Config) clone() *Config {
	out := &Config{}
	deepCopy(reflect.ValueOf(out).Elem(), reflect.ValueOf(c).Elem())
	out.src = c.src // immutable once Parse returns
	return out
}

// deepCopy copies src into dst (both settable, same type), allocating new
// slices so the copy shares nothing mutable with the original.
func deepCopy(dst, src reflect.Value) {
	switch src.Kind() {
	case reflect.Struct:
		for i := 0; i < src.NumField(); i++ {
			if dst.Type().Field(i).IsExported() {
				deepCopy(dst.Field(i), src.Field(i))
			}
		}
	case reflect.Slice:
		if src.IsNil() {
			dst.Set(reflect.Zero(src.Type()))
			return
		}
		s := reflect.MakeSlice(src.Type(), src.Len(), src.Len())
		for i := 0; i < src.Len(); i++ {
			deepCopy(s.Index(i), src.Index(i))
		}
		dst.Set(s)
	default:
		dst.Set(src)
	}
}

func redact(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		t := v.Type()
		for i := 0; i < v.NumField(); i++ {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			fv := v.Field(i)
			switch {
			case f.Tag.Get("secret") == "true" && fv.Kind() == reflect.String:
				if fv.String() != "" {
					fv.SetString(mask)
				}
			case f.Tag.Get("redact") != "":
				fv.SetString(secret.URL(fv.String(), f.Tag.Get("redact") == "nats-url"))
			default:
				redact(fv)
			}
		}
	case reflect.Slice:
		for i := 0; i < v.Len(); i++ {
			redact(v.Index(i))
		}
	}
}

// YAML returns c as a YAML document with every key, in schema order: the
// effective configuration. Print c.Redacted().YAML(), not c.YAML(), where
// others can read it. Parse(YAML()) yields an equal Config.
func (c *Config) YAML() ([]byte, error) {
	var b bytes.Buffer
	if err := emitStruct(&b, reflect.ValueOf(c).Elem(), 0); err != nil {
		return nil, fmt.Errorf("print config: %w", err)
	}
	return b.Bytes(), nil
}

func emitStruct(b *bytes.Buffer, v reflect.Value, indent int) error {
	f := fieldsOf(v.Type())
	for _, name := range f.names {
		// The first key of a list item goes on the "- " line.
		if b.Len() == 0 || b.Bytes()[b.Len()-1] == '\n' {
			b.WriteString(strings.Repeat(" ", indent))
		}
		b.WriteString(name + ":")
		if err := emitValue(b, v.Field(f.byName[name]), indent); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

// emitValue writes a value after its "key:".
func emitValue(b *bytes.Buffer, v reflect.Value, indent int) error {
	switch {
	case v.Type() == durationType:
		b.WriteString(" " + Duration(v.Int()).String() + "\n")
		return nil
	case v.Type() == sizeType:
		b.WriteString(" " + Size(v.Int()).String() + "\n")
		return nil
	}
	switch v.Kind() {
	case reflect.Struct:
		b.WriteString("\n")
		return emitStruct(b, v, indent+2)
	case reflect.Slice:
		if v.Len() == 0 {
			b.WriteString(" []\n")
			return nil
		}
		if v.Type().Elem().Kind() != reflect.Struct {
			// Lists of scalars read best on one line: [count, sum].
			items := make([]string, v.Len())
			for i := range items {
				s, err := scalarText(v.Index(i), true)
				if err != nil {
					return err
				}
				items[i] = s
			}
			b.WriteString(" [" + strings.Join(items, ", ") + "]\n")
			return nil
		}
		b.WriteString("\n")
		for i := 0; i < v.Len(); i++ {
			b.WriteString(strings.Repeat(" ", indent+2) + "- ")
			if err := emitStruct(b, v.Index(i), indent+4); err != nil {
				return fmt.Errorf("[%d]: %w", i, err)
			}
		}
		return nil
	}
	s, err := scalarText(v, false)
	if err != nil {
		return err
	}
	b.WriteString(" " + s + "\n")
	return nil
}

// scalarText formats a scalar; flow says it goes inside [ ].
func scalarText(v reflect.Value, flow bool) (string, error) {
	switch v.Kind() {
	case reflect.String:
		return quoteString(v.String(), flow), nil
	case reflect.Bool:
		return strconv.FormatBool(v.Bool()), nil
	case reflect.Int:
		return strconv.FormatInt(v.Int(), 10), nil
	}
	return "", fmt.Errorf("cannot print %s", v.Type())
}

// plainSafe matches strings that read back as the same string when written
// without quotes, in block and flow context alike. In block context a colon
// is safe inside a plain scalar when no space follows it, which covers URLs
// and host:port.
var plainSafe = regexp.MustCompile(`^[A-Za-z0-9_/][A-Za-z0-9_./:-]*$`)

// quoteString writes s as a YAML scalar that Parse reads back as s: plain
// when unambiguous, else double-quoted. A literal "${" is written as "$${"
// so that it is not taken for a variable reference.
func quoteString(s string, flow bool) string {
	s = strings.ReplaceAll(s, "${", "$${")
	plain := plainSafe.MatchString(s) && !strings.HasSuffix(s, ":") && !token.IsNeedQuoted(s) && !looksNumeric(s)
	if plain && !(flow && strings.Contains(s, ":")) {
		return s
	}
	var b strings.Builder
	b.WriteByte('"')
	for i, r := range s {
		switch {
		case r == utf8.RuneError && strings.HasPrefix(s[i:], "\xef\xbf\xbd"):
			b.WriteRune(r)
		case r == utf8.RuneError:
			b.WriteString(`\uFFFD`) // invalid UTF-8 cannot be carried in YAML
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7f || !unicode.IsPrint(r) && r != ' ':
			if r > 0xFFFF {
				fmt.Fprintf(&b, `\U%08X`, r)
			} else {
				fmt.Fprintf(&b, `\u%04X`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// looksNumeric reports strings that some YAML reader could take for a
// number (1e3, 0x1F, 1_000, 12:30): quoting them costs nothing.
func looksNumeric(s string) bool {
	for _, r := range s {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			if !strings.ContainsRune("eExXoObB", r) {
				return false
			}
		}
	}
	return s[0] >= '0' && s[0] <= '9'
}
