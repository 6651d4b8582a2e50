package config

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"
)

// The file is decoded by walking goccy's AST against the Config struct's
// yaml tags rather than with yaml.Unmarshal, because the decoder must
// report every unknown key and type error at once, each with its line, and
// remember the line of every key for Validate. The value types are few
// (struct, string, int, bool, Duration, Size and slices of those), so the
// walk is short.

// source remembers where keys were written.
type source struct {
	file string
	pos  map[string]position // key path → where its key (or list item) is
	bad  map[string]bool     // key paths that already have a decode error
	// unset maps key paths to the unset variables they reference, in a
	// read-only parse (ParseReadOnly), where those keys are left empty.
	unset map[string][]string
}

type position struct{ line, col int }

// lineOf returns the position of key, or of its nearest ancestor written in
// the file (a missing window.slide is reported on the "window:" line).
func (s *source) lineOf(key string) position {
	if s == nil {
		return position{}
	}
	for k := key; k != ""; k = parentKey(k) {
		if p, ok := s.pos[k]; ok {
			return p
		}
	}
	return position{}
}

// suppressed reports whether key (or an ancestor) already failed to decode,
// so Validate's complaint about the default left in its place would only
// repeat the problem.
func (s *source) suppressed(key string) bool {
	for k := key; k != ""; k = parentKey(k) {
		if s.bad[k] {
			return true
		}
	}
	return false
}

func parentKey(k string) string {
	i := strings.LastIndexAny(k, ".[")
	if i < 0 {
		return ""
	}
	return k[:i]
}

// refKind is what a "${…}" found in the raw text turned out to be.
type refKind int

const (
	refVar     refKind = iota // ${NAME}
	refLiteral                // $${ → a literal ${
	refInvalid                // ${ not followed by NAME}
)

type envRef struct {
	kind refKind
	name string
	text string // as written, for messages
	line int
}

// envRefs are the references found in the raw text. Each one is replaced
// there by a placeholder — mark, index, mark — where mark is a private-use
// rune absent from the file. The placeholder is plain text in any YAML
// context, so the parser sees the same lines and structure whatever the
// variables hold (a password with '#', '"' or ": " cannot change the
// document), and a reference inside a comment is never looked up. Values
// are expanded when the decoder reads a scalar.
type envRefs struct {
	mark rune
	list []envRef
}

func markRefs(data string) (string, envRefs, error) {
	if !strings.Contains(data, "${") {
		return data, envRefs{}, nil
	}
	var r envRefs
	for c := rune(0xE000); c <= 0xFFFFD && r.mark == 0; c++ {
		if c == 0xF900 {
			c = 0xF0000 // on to the supplementary private use area
		}
		if !strings.ContainsRune(data, c) {
			r.mark = c
		}
	}
	if r.mark == 0 {
		// Only a file of megabytes made of private-use characters gets here.
		return "", envRefs{}, errors.New("cannot expand ${...} references: the file uses every private-use character")
	}
	var b strings.Builder
	b.Grow(len(data))
	line := 1
	add := func(ref envRef) {
		b.WriteRune(r.mark)
		b.WriteString(strconv.Itoa(len(r.list)))
		b.WriteRune(r.mark)
		r.list = append(r.list, ref)
	}
	for i := 0; i < len(data); {
		switch {
		case data[i] == '\n':
			line++
		case strings.HasPrefix(data[i:], "$${"):
			add(envRef{kind: refLiteral, text: "$${", line: line})
			i += 3
			continue
		case strings.HasPrefix(data[i:], "${"):
			j := i + 2
			for j < len(data) && isNameByte(data[j], j == i+2) {
				j++
			}
			if j > i+2 && j < len(data) && data[j] == '}' {
				add(envRef{kind: refVar, name: data[i+2 : j], text: data[i : j+1], line: line})
				i = j + 1
				continue
			}
			// Show the whole bad reference in the message when it is closed
			// on the same line; only "${" itself is replaced.
			text := "${"
			if k := strings.IndexAny(data[i:], "}\n"); k > 0 && data[i+k] == '}' && k < 64 {
				text = data[i : i+k+1]
			}
			add(envRef{kind: refInvalid, text: text, line: line})
			i += 2
			continue
		}
		b.WriteByte(data[i])
		i++
	}
	return b.String(), r, nil
}

func isNameByte(c byte, first bool) bool {
	return c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || !first && c >= '0' && c <= '9'
}

// scan calls fn for each literal run and each reference in s.
func (r envRefs) scan(s string, text func(string), ref func(envRef)) {
	for r.mark != 0 {
		i := strings.IndexRune(s, r.mark)
		if i < 0 {
			break
		}
		rest := s[i+utf8.RuneLen(r.mark):]
		j := strings.IndexRune(rest, r.mark)
		n, err := strconv.Atoi(rest[:max(j, 0)])
		if j < 0 || err != nil || n < 0 || n >= len(r.list) {
			break // cannot happen: the mark occurs only in placeholders
		}
		text(s[:i])
		ref(r.list[n])
		s = rest[j+utf8.RuneLen(r.mark):]
	}
	text(s)
}

// unexpand restores references as written, for keys and messages.
func (r envRefs) unexpand(s string) string {
	if r.mark == 0 {
		return s
	}
	var b strings.Builder
	r.scan(s, func(t string) { b.WriteString(t) }, func(e envRef) { b.WriteString(e.text) })
	return b.String()
}

type decoder struct {
	src *source
	env func(string) (string, bool)
	// readOnly leaves a key with an unset variable empty (recorded in
	// src.unset) instead of failing it.
	readOnly bool
	refs     envRefs
	aliases  map[*ast.AliasNode]ast.Node
	errs     []*FieldError
}

func (d *decoder) fail(p position, key, format string, args ...any) {
	if key != "" {
		d.src.bad[key] = true
	}
	d.errs = append(d.errs, &FieldError{File: d.src.file, Line: p.line, Column: p.col, Key: key, Msg: fmt.Sprintf(format, args...)})
}

func posOf(n ast.Node) position {
	if n == nil {
		return position{}
	}
	if doc, ok := n.(*ast.DocumentNode); ok {
		// DocumentNode.GetToken dereferences a nil body.
		if doc.Body == nil {
			return position{}
		}
		n = doc.Body
	}
	if tk := n.GetToken(); tk != nil && tk.Position != nil {
		return position{tk.Position.Line, tk.Position.Column}
	}
	return position{}
}

// parseYAML parses text into an AST, turning parser panics into errors:
// a fuzzed or corrupted file must produce a message, never a crash.
func parseYAML(text string) (f *ast.File, err error) {
	defer func() {
		if r := recover(); r != nil {
			f, err = nil, fmt.Errorf("yaml parser failed: %v", r)
		}
	}()
	// Duplicate keys are allowed by the parser and reported by the decoder,
	// together with every other problem.
	return parser.ParseBytes([]byte(text), 0, parser.AllowDuplicateMapKey())
}

// syntaxError converts a parser error into a FieldError with its position.
func (d *decoder) syntaxError(err error) {
	var p position
	msg := err.Error()
	if te, ok := err.(interface {
		GetToken() *token.Token
		GetMessage() string
	}); ok {
		msg = te.GetMessage()
		tk := te.GetToken()
		// A mis-indented "key: value" line continues the plain scalar above
		// it, and the parser blames the scalar's first line: point at the
		// colon instead, which is on the line to fix.
		if tk != nil && tk.Next != nil && tk.Next.Type == token.MappingValueType && strings.Contains(msg, "mapping value is not allowed") {
			tk = tk.Next
			msg += " (check the indentation)"
		}
		if tk != nil && tk.Position != nil {
			p = position{tk.Position.Line, tk.Position.Column}
		}
	}
	d.fail(p, "", "YAML syntax error: %s", d.refs.unexpand(msg))
}

// decodeFile decodes the one document of f over c. It reports false when
// the file's shape is wrong, so validating the defaults would only add noise.
func (d *decoder) decodeFile(f *ast.File, c *Config) bool {
	if len(f.Docs) > 1 {
		for _, doc := range f.Docs[1:] {
			if doc.Body != nil {
				d.fail(posOf(doc), "", "only one YAML document is allowed (remove the second ---)")
				return false
			}
		}
	}
	if len(f.Docs) == 0 || f.Docs[0].Body == nil {
		return true // empty file: every default
	}
	d.aliases = make(map[*ast.AliasNode]ast.Node)
	anchors := make(map[string]ast.Node)
	for _, doc := range f.Docs {
		d.collectAliases(doc.Body, anchors)
	}
	body := d.resolve(f.Docs[0].Body)
	switch body.(type) {
	case *ast.MappingNode, *ast.MappingValueNode:
	case nil, *ast.NullNode:
		return true
	default:
		d.fail(posOf(body), "", "the file must be a mapping of keys (key: value lines), not %s", d.describe(body))
		return false
	}
	d.decodeStruct(body, reflect.ValueOf(c).Elem(), "")
	return true
}

// collectAliases resolves each alias to the anchor defined most recently
// before it, which is what YAML means when a name is reused.
func (d *decoder) collectAliases(n ast.Node, anchors map[string]ast.Node) {
	switch n := n.(type) {
	case *ast.MappingNode:
		for _, mv := range n.Values {
			d.collectAliases(mv, anchors)
		}
	case *ast.MappingValueNode:
		d.collectAliases(n.Key, anchors)
		d.collectAliases(n.Value, anchors)
	case *ast.MappingKeyNode:
		d.collectAliases(n.Value, anchors)
	case *ast.SequenceNode:
		for _, v := range n.Values {
			d.collectAliases(v, anchors)
		}
	case *ast.TagNode:
		d.collectAliases(n.Value, anchors)
	case *ast.AnchorNode:
		d.collectAliases(n.Value, anchors)
		anchors[tokenText(n.Name)] = n.Value
	case *ast.AliasNode:
		d.aliases[n] = anchors[tokenText(n.Value)]
	}
}

// tokenText is a node's source text, "" when there is none.
func tokenText(n ast.Node) string {
	if n == nil {
		return ""
	}
	if tk := n.GetToken(); tk != nil {
		return tk.Value
	}
	return ""
}

// resolve strips anchors and tags and follows aliases. Tags are ignored:
// the target field decides the type.
func (d *decoder) resolve(n ast.Node) ast.Node {
	for i := 0; i < 100; i++ { // aliases cannot loop, but bound it anyway
		switch v := n.(type) {
		case *ast.AnchorNode:
			n = v.Value
		case *ast.TagNode:
			n = v.Value
		case *ast.AliasNode:
			n = d.aliases[v]
		default:
			return n
		}
	}
	return nil
}

var (
	durationType = reflect.TypeFor[Duration]()
	sizeType     = reflect.TypeFor[Size]()
)

// decode decodes n into v, which holds the default. A null value (a key
// with nothing after the colon) keeps the default.
func (d *decoder) decode(n ast.Node, v reflect.Value, key string) {
	p := posOf(n)
	if alias, ok := n.(*ast.AliasNode); ok && d.aliases[alias] == nil {
		d.fail(p, key, "undefined alias *%s", tokenText(alias.Value))
		return
	}
	n = d.resolve(n)
	if n == nil {
		return
	}
	if _, ok := n.(*ast.NullNode); ok {
		return
	}
	switch {
	case v.Type() == durationType:
		if s, ok := d.scalar(n, p, key, "a duration such as 10s, 5m or 1h30m"); ok {
			dur, err := parseDuration(s)
			if err != nil {
				d.fail(p, key, "%s", err)
				return
			}
			v.SetInt(int64(dur))
		}
		return
	case v.Type() == sizeType:
		if s, ok := d.scalar(n, p, key, "a size such as 512MiB, 1GiB or 1048576"); ok {
			sz, err := parseSize(s)
			if err != nil {
				d.fail(p, key, "%s", err)
				return
			}
			v.SetInt(int64(sz))
		}
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		switch n.(type) {
		case *ast.MappingNode, *ast.MappingValueNode:
			d.decodeStruct(n, v, key)
		default:
			d.fail(p, key, "must be a mapping of keys (indented key: value lines), not %s", d.describe(n))
		}
	case reflect.Slice:
		d.decodeSlice(n, v, key)
	case reflect.String:
		if s, ok := d.scalar(n, p, key, "a string"); ok {
			v.SetString(s)
		}
	case reflect.Bool:
		if s, ok := d.scalar(n, p, key, "true or false"); ok {
			switch s {
			case "true", "True", "TRUE":
				v.SetBool(true)
			case "false", "False", "FALSE":
				v.SetBool(false)
			default:
				d.fail(p, key, "must be true or false, not %q", s)
			}
		}
	case reflect.Int:
		if s, ok := d.scalar(n, p, key, "a whole number"); ok {
			t := strings.TrimSpace(s)
			// 100_000 reads better than 100000 for max_devices.
			if u := strings.ReplaceAll(t, "_", ""); u != "" && isDigits(strings.TrimPrefix(u, "-")) && t[0] != '_' {
				t = u
			}
			i, err := strconv.ParseInt(t, 10, strconv.IntSize)
			if err != nil {
				why := "must be a whole number"
				if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
					why = "is out of range (a whole number from -9223372036854775808 to 9223372036854775807)"
				}
				d.fail(p, key, "%s, not %q", why, s)
				return
			}
			v.SetInt(i)
		}
	default:
		// Only reachable if a field of a new type is added without teaching
		// the decoder about it; TestSchemaTypes guards against that.
		d.fail(p, key, "internal error: cannot decode into %s", v.Type())
	}
}

// scalar returns the text of a scalar node with environment references
// expanded. Plain scalars that YAML reads as numbers or booleans keep their
// text as written ("007" stays "007" in a string field).
func (d *decoder) scalar(n ast.Node, p position, key, want string) (string, bool) {
	var s string
	switch n := n.(type) {
	case *ast.StringNode:
		s = n.Value
	case *ast.LiteralNode:
		if n.Value != nil {
			s = n.Value.Value
		}
	case *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode, *ast.InfinityNode, *ast.NanNode:
		return tokenText(n), true
	default:
		d.fail(p, key, "must be %s, not %s", want, d.describe(n))
		return "", false
	}
	return d.expand(s, key)
}

// expand replaces the placeholders in s by the variables' values.
func (d *decoder) expand(s, key string) (string, bool) {
	if d.refs.mark == 0 || !strings.ContainsRune(s, d.refs.mark) {
		return s, true
	}
	var b strings.Builder
	ok := true
	d.refs.scan(s, func(t string) { b.WriteString(t) }, func(r envRef) {
		switch r.kind {
		case refLiteral:
			b.WriteString("${")
		case refInvalid:
			d.fail(position{line: r.line}, key, "invalid reference %q: only ${NAME} is supported (write $${ for a literal ${)", r.text)
			ok = false
		case refVar:
			v, set := d.env(r.name)
			switch {
			case !set && d.readOnly:
				d.src.bad[key] = true // its value is not known: no check applies
				if d.src.unset == nil {
					d.src.unset = map[string][]string{}
				}
				d.src.unset[key] = append(d.src.unset[key], r.name)
				ok = false // the key keeps its default; no error
			case !set:
				d.fail(position{line: r.line}, key, "environment variable %s is not set", r.name)
				ok = false
			}
			b.WriteString(v)
		}
	})
	return b.String(), ok
}

func (d *decoder) decodeStruct(n ast.Node, v reflect.Value, path string) {
	var values []*ast.MappingValueNode
	switch n := n.(type) {
	case *ast.MappingNode:
		values = n.Values
	case *ast.MappingValueNode:
		values = []*ast.MappingValueNode{n}
	}
	fields := fieldsOf(v.Type())
	// Merge keys (<<: *defaults) first: keys written in the mapping itself
	// override merged ones wherever they appear.
	for _, mv := range values {
		if _, ok := mv.Key.(*ast.MergeKeyNode); ok {
			d.merge(mv.Value, v, path)
		}
	}
	seen := make(map[string]int)
	for _, mv := range values {
		if _, ok := mv.Key.(*ast.MergeKeyNode); ok {
			continue
		}
		kp := posOf(mv.Key)
		kn := d.resolve(mv.Key)
		var name string
		switch k := kn.(type) {
		case *ast.StringNode:
			name = d.refs.unexpand(k.Value)
		case nil, *ast.MappingKeyNode, *ast.MappingNode, *ast.SequenceNode:
			d.fail(kp, path, "complex keys are not supported")
			continue
		default:
			name = tokenText(k)
		}
		key := joinKey(path, name)
		f, ok := fields.byName[name]
		if !ok {
			d.fail(kp, key, "unknown key%s", d.hint(name, fields, path))
			continue
		}
		if line, dup := seen[name]; dup {
			d.fail(kp, key, "duplicate key (first set on line %d)", line)
			continue
		}
		seen[name] = kp.line
		d.src.pos[key] = kp
		d.decode(mv.Value, v.Field(f), key)
	}
}

// merge applies a YAML merge key's value: one mapping or a list of them,
// earlier ones taking precedence.
func (d *decoder) merge(n ast.Node, v reflect.Value, path string) {
	p := posOf(n)
	n = d.resolve(n)
	switch m := n.(type) {
	case *ast.MappingNode, *ast.MappingValueNode:
		d.decodeStruct(m, v, path)
	case *ast.SequenceNode:
		for i := len(m.Values) - 1; i >= 0; i-- {
			d.merge(m.Values[i], v, path)
		}
	default:
		d.fail(p, path, "<< must merge a mapping (an alias such as *defaults), not %s", d.describe(n))
	}
}

func (d *decoder) decodeSlice(n ast.Node, v reflect.Value, key string) {
	p := posOf(n)
	seq, ok := n.(*ast.SequenceNode)
	if !ok {
		d.fail(p, key, "must be a list (lines starting with \"- \", or [a, b]), not %s", d.describe(n))
		return
	}
	out := reflect.MakeSlice(v.Type(), len(seq.Values), len(seq.Values))
	for i, item := range seq.Values {
		ik := key + "[" + strconv.Itoa(i) + "]"
		ev := out.Index(i)
		if def, ok := ev.Addr().Interface().(interface{ setDefaults() }); ok {
			def.setDefaults()
		}
		d.src.pos[ik] = posOf(item)
		d.decode(item, ev, ik)
	}
	v.Set(out)
}

// hint suggests what an unknown key was meant to be: the nearest key at
// this level, else the same key elsewhere in the schema (an indentation
// slip), else the list of valid keys.
func (d *decoder) hint(name string, f *structFields, path string) string {
	if s := suggest(name, f.names); s != "" {
		return " (did you mean " + s + "?)"
	}
	var elsewhere []string
	for _, p := range schemaIndex()[strings.ToLower(name)] {
		if parentKey(p) != listPattern(path) {
			elsewhere = append(elsewhere, p)
		}
	}
	if len(elsewhere) > 0 {
		if len(elsewhere) > 3 {
			elsewhere = elsewhere[:3]
		}
		return " here (did you mean " + orList(elsewhere) + "? check the indentation)"
	}
	return " (valid keys here: " + strings.Join(f.names, ", ") + ")"
}

// listPattern turns "mqtt.subscriptions[3]" into "mqtt.subscriptions[]",
// the form schemaIndex uses.
func listPattern(path string) string {
	var b strings.Builder
	for i := 0; i < len(path); i++ {
		b.WriteByte(path[i])
		if path[i] == '[' {
			for i+1 < len(path) && path[i+1] != ']' {
				i++
			}
		}
	}
	return b.String()
}

func orList(s []string) string {
	if len(s) == 1 {
		return s[0]
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

func joinKey(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

type structFields struct {
	names  []string // in declaration order
	byName map[string]int
}

var fieldCache sync.Map // reflect.Type → *structFields

func fieldsOf(t reflect.Type) *structFields {
	if f, ok := fieldCache.Load(t); ok {
		return f.(*structFields)
	}
	f := &structFields{byName: make(map[string]int)}
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		name := strings.Split(sf.Tag.Get("yaml"), ",")[0]
		if !sf.IsExported() || name == "" || name == "-" {
			continue
		}
		f.names = append(f.names, name)
		f.byName[name] = i
	}
	fieldCache.Store(t, f)
	return f
}

// schemaIndex maps every key name (lower case) to the full paths where it
// is valid, list items written as "[]".
var schemaIndex = sync.OnceValue(func() map[string][]string {
	idx := make(map[string][]string)
	var walk func(t reflect.Type, path string)
	walk = func(t reflect.Type, path string) {
		f := fieldsOf(t)
		for _, name := range f.names {
			p := joinKey(path, name)
			idx[name] = append(idx[name], p)
			ft := t.Field(f.byName[name]).Type
			switch {
			case ft.Kind() == reflect.Struct:
				walk(ft, p)
			case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
				walk(ft.Elem(), p+"[]")
			}
		}
	}
	walk(reflect.TypeFor[Config](), "")
	for _, ps := range idx {
		sort.Strings(ps)
	}
	return idx
})

// describe names a node's kind for type errors, showing references as
// written rather than the values of (possibly secret) variables.
func (d *decoder) describe(n ast.Node) string {
	switch n := n.(type) {
	case nil:
		return "nothing"
	case *ast.MappingNode, *ast.MappingValueNode:
		return "a mapping"
	case *ast.SequenceNode:
		return "a list"
	case *ast.StringNode:
		return fmt.Sprintf("the string %q", d.refs.unexpand(n.Value))
	case *ast.LiteralNode:
		return "a text block"
	default:
		return strconv.Quote(tokenText(n))
	}
}
