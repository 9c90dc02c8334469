package registry

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// SettingsDecoder decodes and validates one route's backing settings: the YAML mapping under the key
// named after the backing (nil when the route has none). It returns the value the backing's provider
// will later receive as Route.Settings, or every problem found, each preferably an *Error whose Key is
// relative to the settings block ("argv", "stop.grace"); the registry adds the route, the backing's
// key prefix and a line number where the error lacks them.
//
// The route passed in has its common keys already decoded (Settings is still nil).
type SettingsDecoder func(r *Route, settings *yaml.Node) (any, error)

// Duration is a time.Duration written in YAML as a Go duration string ("1.5s", "15m") or "0".
type Duration time.Duration

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// UnmarshalYAML accepts "250ms", "1m30s" and 0; negative durations are rejected.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: want a duration such as \"1.5s\" or \"15m\"", n.Line)
	}
	if n.Value == "0" {
		*d = 0
		return nil
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration (use a unit, as in \"1.5s\" or \"15m\")", n.Line, n.Value)
	}
	if v < 0 {
		return fmt.Errorf("line %d: duration %q is negative", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration back as a string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// DecodeStrict decodes node into v (a pointer to a struct with yaml tags) and rejects keys the struct
// does not declare, at any depth, and values that do not fit their field (a "5 seconds" duration, a word
// where a number belongs, a scalar where a mapping belongs). It reports every such problem, not just the
// first: each is an *Error whose Key is the dotted path below node ("stop.grace", "argv[0]") and whose
// Line is the offending line. Even on error, v receives every value that did decode, so a caller can go
// on validating the rest and report those problems too. A nil node leaves v unchanged.
func DecodeStrict(node *yaml.Node, v any) error {
	if node == nil {
		return nil
	}
	var l errs
	good := check(&l, node, reflect.TypeOf(v), "")
	if good != nil {
		if err := good.Decode(v); err != nil {
			// check should have caught every problem; report whatever it missed all the same.
			l.list = append(l.list, yamlErrors(err)...)
		}
	}
	return l.err()
}

var lineRE = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)

// yamlErrors turns a yaml.v3 decode error into *Errors carrying line numbers.
func yamlErrors(err error) []error {
	var te *yaml.TypeError
	msgs := []string{err.Error()}
	if errors.As(err, &te) {
		msgs = te.Errors
	}
	var out []error
	for _, m := range msgs {
		e := &Error{Err: errors.New(m)}
		if sm := lineRE.FindStringSubmatch(m); sm != nil {
			e.Line, _ = strconv.Atoi(sm[1])
			e.Err = errors.New(sm[2])
		}
		out = append(out, e)
	}
	return out
}

var (
	nodeType        = reflect.TypeOf(yaml.Node{})
	unmarshalerType = reflect.TypeOf((*yaml.Unmarshaler)(nil)).Elem()
)

// check walks n against t (a struct, slice, map or scalar type, possibly behind pointers), adding to l
// every mapping key t does not declare and every value that does not decode into its field. It returns
// a copy of n without the offending entries, or nil when n itself is bad, so decoding the copy keeps
// every good value.
func check(l *errs, n *yaml.Node, t reflect.Type, prefix string) *yaml.Node {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || n == nil {
		return n
	}
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) != 1 {
			return n
		}
		c := check(l, n.Content[0], t, prefix)
		if c == nil {
			return nil
		}
		doc := *n
		doc.Content = []*yaml.Node{c}
		return &doc
	}
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	switch {
	case n.Kind == 0:
		return nil // an empty document: nothing to decode
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null":
		return n // null leaves the field at its zero value
	}
	switch {
	case t == nodeType || t.Kind() == reflect.Interface:
		return n // taken as is
	case reflect.PointerTo(t).Implements(unmarshalerType):
		return checkLeaf(l, n, t, prefix)
	}
	switch t.Kind() {
	case reflect.Struct:
		return checkStruct(l, n, t, prefix)
	case reflect.Slice, reflect.Array:
		return checkList(l, n, t, prefix)
	case reflect.Map:
		return checkMap(l, n, t, prefix)
	}
	return checkLeaf(l, n, t, prefix)
}

// checkStruct checks a mapping against the fields of struct type t: see check.
func checkStruct(l *errs, n *yaml.Node, t reflect.Type, prefix string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		l.add("", prefix, n.Line, "want a mapping of keys, got %s", describe(n))
		return nil
	}
	fields := yamlFields(t)
	out := *n
	out.Content = nil
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		ft, ok := fields[k.Value]
		if !ok {
			l.add("", join(prefix, k.Value), k.Line, "unknown key (known keys: %s)", strings.Join(sortedKeys(fields), ", "))
			continue
		}
		if c := check(l, v, ft, join(prefix, k.Value)); c != nil {
			out.Content = append(out.Content, k, c)
		}
	}
	return &out
}

// checkList checks a sequence against slice or array type t: see check.
func checkList(l *errs, n *yaml.Node, t reflect.Type, prefix string) *yaml.Node {
	if n.Kind != yaml.SequenceNode {
		l.add("", prefix, n.Line, "want a list, got %s", describe(n))
		return nil
	}
	out := *n
	out.Content = nil
	for i, c := range n.Content {
		if c := check(l, c, t.Elem(), fmt.Sprintf("%s[%d]", prefix, i)); c != nil {
			out.Content = append(out.Content, c)
		}
	}
	return &out
}

// checkMap checks a mapping against map type t: see check.
func checkMap(l *errs, n *yaml.Node, t reflect.Type, prefix string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		l.add("", prefix, n.Line, "want a mapping, got %s", describe(n))
		return nil
	}
	out := *n
	out.Content = nil
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if c := check(l, v, t.Elem(), join(prefix, k.Value)); c != nil {
			out.Content = append(out.Content, k, c)
		}
	}
	return &out
}

// checkLeaf decodes n into a scratch value of type t and reports why it does not fit, under key.
func checkLeaf(l *errs, n *yaml.Node, t reflect.Type, key string) *yaml.Node {
	err := n.Decode(reflect.New(t).Interface())
	if err == nil {
		return n
	}
	for _, e := range yamlErrors(err) {
		re := e.(*Error)
		re.Key = key
		if re.Line == 0 {
			re.Line = n.Line
		}
		l.list = append(l.list, re)
	}
	return nil
}

// describe names a node's kind for error messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	}
	return "something else"
}

func join(prefix, key string) string {
	if prefix == "" {
		return key
	}
	return prefix + "." + key
}

func yamlFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if strings.Contains(opts, "inline") {
			for k, v := range yamlFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f.Type
	}
	return out
}

func sortedKeys(m map[string]reflect.Type) []string {
	return slices.Sorted(maps.Keys(m))
}
