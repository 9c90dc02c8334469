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
// does not declare, at any depth. Every problem is returned as an *Error whose Key is the dotted path
// below node and whose Line is the offending line. A nil node leaves v unchanged.
func DecodeStrict(node *yaml.Node, v any) error {
	if node == nil {
		return nil
	}
	var l errs
	checkKeys(&l, node, reflect.TypeOf(v), "")
	if len(l.list) > 0 {
		return l.err()
	}
	if err := node.Decode(v); err != nil {
		for _, e := range yamlErrors(err) {
			l.list = append(l.list, e)
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

// checkKeys reports mapping keys that t (a struct, possibly behind pointers) does not declare.
func checkKeys(l *errs, n *yaml.Node, t reflect.Type, prefix string) {
	for t != nil && (t.Kind() == reflect.Pointer) {
		t = t.Elem()
	}
	if t == nil || n == nil {
		return
	}
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	switch t.Kind() {
	case reflect.Struct:
		if t == reflect.TypeOf(yaml.Node{}) || n.Kind != yaml.MappingNode {
			return
		}
		if reflect.PointerTo(t).Implements(reflect.TypeOf((*yaml.Unmarshaler)(nil)).Elem()) {
			return
		}
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			ft, ok := fields[k.Value]
			if !ok {
				l.add("", join(prefix, k.Value), k.Line, "unknown key (known keys: %s)", strings.Join(sortedKeys(fields), ", "))
				continue
			}
			checkKeys(l, v, ft, join(prefix, k.Value))
		}
	case reflect.Slice:
		if n.Kind == yaml.SequenceNode {
			for i, c := range n.Content {
				checkKeys(l, c, t.Elem(), fmt.Sprintf("%s[%d]", prefix, i))
			}
		}
	case reflect.Map:
		if n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				checkKeys(l, n.Content[i+1], t.Elem(), join(prefix, n.Content[i].Value))
			}
		}
	}
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
