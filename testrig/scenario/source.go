package scenario

import (
	"encoding"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"
)

// source is a scenario file's syntax tree and where each key is written,
// so that every problem, including the rules Validate checks after the
// decode, names its line.
type source struct {
	file *ast.File
	// lines maps a key path (faults[0].kind) to the line of its key, or of
	// its item for list items.
	lines map[string]int
	// at maps the position of a key's or a value's first token to the key
	// path, for decoder errors that carry only a token.
	at map[[2]int]string
}

// parseSource parses data and records where every key is. A syntax error
// is returned as a FieldError with its line.
func parseSource(name string, data []byte) (*source, *FieldError) {
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		line, msg := tokenError(err)
		return nil, &FieldError{File: name, Line: line, Msg: "YAML syntax error: " + msg}
	}
	s := &source{file: f, lines: map[string]int{}, at: map[[2]int]string{}}
	if len(f.Docs) > 0 && f.Docs[0] != nil && f.Docs[0].Body != nil {
		s.record(f.Docs[0].Body, "")
	}
	return s, nil
}

// tokenError splits a go-yaml error into its line (0 when it has none) and
// its message without the position and source excerpt.
func tokenError(err error) (int, string) {
	te, ok := err.(interface {
		GetToken() *token.Token
		GetMessage() string
	})
	if !ok {
		return 0, err.Error()
	}
	if tk := te.GetToken(); tk != nil && tk.Position != nil {
		return tk.Position.Line, te.GetMessage()
	}
	return 0, te.GetMessage()
}

func posOf(n ast.Node) (token.Position, bool) {
	if n == nil {
		return token.Position{}, false
	}
	tk := n.GetToken()
	if tk == nil || tk.Position == nil {
		return token.Position{}, false
	}
	return *tk.Position, true
}

// unwrap returns the value under anchors and tags.
func unwrap(n ast.Node) ast.Node {
	for {
		switch v := n.(type) {
		case *ast.AnchorNode:
			n = v.Value
		case *ast.TagNode:
			n = v.Value
		default:
			return n
		}
	}
}

// pairs returns a mapping's key/value pairs (nil when n is no mapping).
func pairs(n ast.Node) ([]*ast.MappingValueNode, bool) {
	switch v := n.(type) {
	case *ast.MappingNode:
		return v.Values, true
	case *ast.MappingValueNode:
		return []*ast.MappingValueNode{v}, true
	}
	return nil, false
}

func keyName(mv *ast.MappingValueNode) string {
	if tk := mv.Key.GetToken(); tk != nil {
		return tk.Value
	}
	return mv.Key.String()
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func (s *source) note(path string, n ast.Node, line bool) {
	if p, ok := posOf(n); ok {
		if line {
			s.lines[path] = p.Line
		}
		s.at[[2]int{p.Line, p.Column}] = path
	}
}

func (s *source) record(n ast.Node, path string) {
	n = unwrap(n)
	if ps, ok := pairs(n); ok {
		for _, mv := range ps {
			k := join(path, keyName(mv))
			s.note(k, mv.Key, true)
			s.note(k, mv.Value, false)
			s.record(mv.Value, k)
		}
		return
	}
	if seq, ok := n.(*ast.SequenceNode); ok {
		for i, item := range seq.Values {
			k := path + "[" + strconv.Itoa(i) + "]"
			s.note(k, item, true)
			s.record(item, k)
		}
	}
}

// lineOf returns the line of key, or of its nearest ancestor written in
// the file (a default filled in, or a rule about a whole section); 0 when
// none is.
func (s *source) lineOf(key string) int {
	for key != "" {
		if l, ok := s.lines[key]; ok {
			return l
		}
		i := strings.LastIndexAny(key, ".[")
		if i < 0 {
			return 0
		}
		key = key[:i]
	}
	return 0
}

// keyAt returns the key path whose key or value starts at the error's
// token, and its line.
func (s *source) keyAt(err error) (string, int, string) {
	line, msg := tokenError(err)
	te, ok := err.(interface{ GetToken() *token.Token })
	if !ok || te.GetToken() == nil || te.GetToken().Position == nil {
		return "", line, msg
	}
	p := te.GetToken().Position
	return s.at[[2]int{p.Line, p.Column}], line, msg
}

var (
	durationType  = reflect.TypeFor[time.Duration]()
	unmarshalerTy = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// check walks the tree along the Scenario type and reports, each at its
// line, what the decoder would stop at without saying where: unknown keys,
// and values a field cannot take (a duration such as 15ss, a share, a
// point of the run, a size, a number). Every problem is reported, not only
// the first.
func (s *source) check(p *problems) {
	if len(s.file.Docs) == 0 || s.file.Docs[0] == nil || s.file.Docs[0].Body == nil {
		return
	}
	s.checkNode(p, s.file.Docs[0].Body, reflect.TypeFor[Scenario](), "")
}

func (s *source) checkNode(p *problems, n ast.Node, t reflect.Type, path string) {
	n = unwrap(n)
	if n == nil || n.Type() == ast.NullType || n.Type() == ast.AliasType {
		return // nothing to check, or the decoder resolves it
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	pos, _ := posOf(n)
	switch {
	case t == durationType:
		if err := yaml.NodeToValue(n, new(time.Duration)); err != nil {
			p.addAt(pos.Line, path, "%s is not a duration (500ms, 10s, 25m)", describe(n))
		}
		return
	case reflect.PointerTo(t).Implements(unmarshalerTy):
		if err := yaml.NodeToValue(n, reflect.New(t).Interface()); err != nil {
			_, msg := tokenError(err)
			p.addAt(pos.Line, path, "%s", msg)
		}
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		ps, ok := pairs(n)
		if !ok {
			p.addAt(pos.Line, path, "want a mapping of keys, not %s", describe(n))
			return
		}
		names, fields := yamlFields(t)
		for _, mv := range ps {
			name := keyName(mv)
			k := join(path, name)
			if mv.Key.IsMergeKey() {
				continue
			}
			ft, ok := fields[name]
			if !ok {
				kp, _ := posOf(mv.Key)
				p.addAt(kp.Line, k, "unknown key (known here: %s)", strings.Join(names, ", "))
				continue
			}
			s.checkNode(p, mv.Value, ft, k)
		}
	case reflect.Slice:
		seq, ok := n.(*ast.SequenceNode)
		if !ok {
			p.addAt(pos.Line, path, "want a list, not %s", describe(n))
			return
		}
		for i, item := range seq.Values {
			s.checkNode(p, item, t.Elem(), path+"["+strconv.Itoa(i)+"]")
		}
	case reflect.Map:
		if _, ok := pairs(n); !ok {
			p.addAt(pos.Line, path, "want a mapping, not %s", describe(n))
		}
	default:
		if err := yaml.NodeToValue(n, reflect.New(t).Interface()); err != nil {
			p.addAt(pos.Line, path, "%s is not a %s", describe(n), kindName(t))
		}
	}
}

// describe quotes a scalar, or names a mapping or list.
func describe(n ast.Node) string {
	switch unwrap(n).(type) {
	case *ast.MappingNode, *ast.MappingValueNode:
		return "a mapping"
	case *ast.SequenceNode:
		return "a list"
	}
	if tk := n.GetToken(); tk != nil {
		return strconv.Quote(tk.Value)
	}
	return strconv.Quote(n.String())
}

func kindName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int64:
		return "whole number"
	case reflect.Uint64:
		return "whole number, 0 or more"
	case reflect.Float64:
		return "number"
	case reflect.Bool:
		return "boolean (true or false)"
	case reflect.String:
		return "string"
	}
	return t.String()
}

// yamlFields lists a struct's yaml keys in field order and maps them to
// field types.
func yamlFields(t reflect.Type) ([]string, map[string]reflect.Type) {
	var names []string
	m := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" || !f.IsExported() {
			continue
		}
		names = append(names, name)
		m[name] = f.Type
	}
	return names, m
}
