package registry

import (
	"bytes"
	"encoding"
	"errors"
	"fmt"
	"maps"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

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

// or returns the duration, or def when d is nil (its key was left out).
func (d *Duration) or(def time.Duration) time.Duration {
	if d == nil {
		return def
	}
	return d.D()
}

// ByteSize is a number of bytes written in YAML as a whole number with an optional unit: "32KiB",
// "32 KiB", "100MB" or "1048576". See ParseByteSize.
type ByteSize int64

// Units of ByteSize.
const (
	kiB = 1 << 10
	miB = 1 << 20
	giB = 1 << 30
)

// sizeUnit maps each unit ParseByteSize accepts, as written (case matters), to its bytes.
func sizeUnit(unit string) (int64, bool) {
	switch unit {
	case "", "B":
		return 1, true
	case "KB":
		return 1e3, true
	case "MB":
		return 1e6, true
	case "GB":
		return 1e9, true
	case "KiB":
		return kiB, true
	case "MiB":
		return miB, true
	case "GiB":
		return giB, true
	}
	return 0, false
}

var sizeRE = regexp.MustCompile(`^(-?)([0-9]+)(\.[0-9]*)?(?: ?([A-Za-z]+))?$`)

// ParseByteSize parses a size: a whole, non-negative number of bytes, optionally followed by one of
// the units B, KB, MB, GB (powers of 1000) or KiB, MiB, GiB (powers of 1024), written as here and
// with at most one space before it. Negative sizes, fractions, other units and sizes beyond an int64
// are errors.
func ParseByteSize(s string) (int64, error) {
	m := sizeRE.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("%q is not a size (e.g. 32KiB, 1MiB, 1048576)", s)
	}
	neg, digits, frac, unit := m[1] != "", m[2], m[3] != "", m[4]
	mult, ok := sizeUnit(unit)
	switch {
	case !ok:
		return 0, fmt.Errorf("%q is not a size (e.g. 32KiB, 1MiB, 1048576)", s)
	case neg:
		return 0, fmt.Errorf("size %q is negative", s)
	case frac:
		return 0, fmt.Errorf("size %q is not a whole number (write 1536KiB, not 1.5MiB)", s)
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("size %q is too large (at most %d bytes)", s, int64(math.MaxInt64))
	}
	return n * mult, nil
}

// Bytes returns the size as a number of bytes.
func (b ByteSize) Bytes() int64 { return int64(b) }

// String writes the size in the largest binary unit that holds it exactly ("32KiB", "1500B"), which
// ParseByteSize reads back; zero is "0".
func (b ByteSize) String() string {
	switch {
	case b == 0:
		return "0"
	case b%giB == 0:
		return fmt.Sprintf("%dGiB", b/giB)
	case b%miB == 0:
		return fmt.Sprintf("%dMiB", b/miB)
	case b%kiB == 0:
		return fmt.Sprintf("%dKiB", b/kiB)
	}
	return fmt.Sprintf("%dB", int64(b))
}

// UnmarshalYAML accepts what ParseByteSize does.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: want a size such as \"32KiB\" or 1048576", n.Line)
	}
	v, err := ParseByteSize(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*b = ByteSize(v)
	return nil
}

// MarshalYAML writes the size back as String does.
func (b ByteSize) MarshalYAML() (any, error) { return b.String(), nil }

// or returns the size in bytes, or def when b is nil (its key was left out).
func (b *ByteSize) or(def int64) int64 {
	if b == nil {
		return def
	}
	return b.Bytes()
}

// valueOr returns *p, or def when p is nil (its key was left out).
func valueOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

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
	good := checkNode(&l, node, reflect.TypeOf(v), "")
	if good != nil {
		if err := good.Decode(v); err != nil {
			// check should have caught every problem; report whatever it missed all the same.
			l.list = append(l.list, yamlErrors(err)...)
		}
	}
	return l.err()
}

var lineRE = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)

var anchorRE = regexp.MustCompile(`unknown anchor '([^']*)' referenced`)

// syntaxLine finds the line of a YAML syntax error that names none. The YAML library omits "line N"
// for an error on the first line, and its reader (control characters, bad UTF-8) and alias errors
// carry no position at all, so those are found in data itself; anything else is on line 1.
func syntaxLine(data []byte, msg string) int {
	lineOf := func(off int) int { return 1 + bytes.Count(data[:off], []byte{'\n'}) }
	switch {
	case strings.Contains(msg, "control characters"):
		for i, c := range data {
			if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f {
				return lineOf(i)
			}
		}
	case strings.Contains(msg, "UTF-8"), strings.Contains(msg, "Unicode"):
		for i := 0; i < len(data); {
			r, n := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && n <= 1 {
				return lineOf(i)
			}
			i += n
		}
	default:
		if m := anchorRE.FindStringSubmatch(msg); m != nil {
			if i := bytes.Index(data, []byte("*"+m[1])); i >= 0 {
				return lineOf(i)
			}
		}
	}
	return 1
}

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

// checkNode walks n against t (a struct, slice, map or scalar type, possibly behind pointers), adding to l
// every mapping key t does not declare and every value that does not decode into its field. It returns
// n without the offending entries, or nil when n itself is bad, so decoding the result keeps every good
// value. A node with nothing to drop is returned as it is: only the path to a dropped entry is copied.
func checkNode(l *errs, n *yaml.Node, t reflect.Type, prefix string) *yaml.Node {
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
		c := checkNode(l, n.Content[0], t, prefix)
		switch c {
		case nil:
			return nil
		case n.Content[0]:
			return n
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
		return checkUnmarshaler(l, n, t, prefix)
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

// kept builds a node's copy entry by entry, copying only once an entry differs from n's own (it was
// dropped, or its value was). node returns n itself when none did.
type kept struct {
	n      *yaml.Node
	out    []*yaml.Node // the copy's Content, once copied
	copied bool
}

// keep records the entry of n that starts at Content[i] as the checked nodes c (none for a dropped
// entry): a key and its value, or a list's item.
func (k *kept) keep(i int, c ...*yaml.Node) {
	same := c != nil
	for x, v := range c {
		same = same && v == k.n.Content[i+x]
	}
	if same && !k.copied {
		return
	}
	if !k.copied {
		k.copied = true
		k.out = append(make([]*yaml.Node, 0, len(k.n.Content)), k.n.Content[:i]...)
	}
	k.out = append(k.out, c...)
}

func (k *kept) node() *yaml.Node {
	if !k.copied {
		return k.n
	}
	out := *k.n
	out.Content = k.out
	return &out
}

// checkStruct checks a mapping against the fields of struct type t: see checkNode.
func checkStruct(l *errs, n *yaml.Node, t reflect.Type, prefix string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		l.add("", prefix, n.Line, "want a mapping of keys, got %s", describe(n))
		return nil
	}
	fields := fieldsOf(t)
	k := kept{n: n}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, v := n.Content[i], n.Content[i+1]
		ft, ok := fields.types[kn.Value]
		if !ok {
			l.add("", join(prefix, kn.Value), kn.Line, "unknown key (known keys: %s)", fields.known)
			k.keep(i)
			continue
		}
		if c := checkNode(l, v, ft, join(prefix, kn.Value)); c != nil {
			k.keep(i, kn, c)
		} else {
			k.keep(i)
		}
	}
	return k.node()
}

// checkList checks a sequence against slice or array type t: see checkNode.
func checkList(l *errs, n *yaml.Node, t reflect.Type, prefix string) *yaml.Node {
	if n.Kind != yaml.SequenceNode {
		l.add("", prefix, n.Line, "want a list, got %s", describe(n))
		return nil
	}
	k := kept{n: n}
	for i, v := range n.Content {
		if c := checkNode(l, v, t.Elem(), prefix+"["+strconv.Itoa(i)+"]"); c != nil {
			k.keep(i, c)
		} else {
			k.keep(i)
		}
	}
	return k.node()
}

// checkMap checks a mapping against map type t: see checkNode.
func checkMap(l *errs, n *yaml.Node, t reflect.Type, prefix string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		l.add("", prefix, n.Line, "want a mapping, got %s", describe(n))
		return nil
	}
	k := kept{n: n}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, v := n.Content[i], n.Content[i+1]
		if c := checkNode(l, v, t.Elem(), join(prefix, kn.Value)); c != nil {
			k.keep(i, kn, c)
		} else {
			k.keep(i)
		}
	}
	return k.node()
}

var textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()

// fits reports whether the non-null node n certainly decodes into a value of type t, so that checkLeaf
// need not try it: a string from any scalar without an explicit tag, a bool from a plain true or false.
// Anything else is tried.
func fits(n *yaml.Node, t reflect.Type) bool {
	if n.Kind != yaml.ScalarNode || n.Style&yaml.TaggedStyle != 0 || reflect.PointerTo(t).Implements(textUnmarshalerType) {
		return false
	}
	switch t.Kind() {
	case reflect.String:
		// The decoder sets a string field to the scalar's text whatever the scalar resolves to; only an
		// explicit tag (!!binary, !!int on a word) can fail.
		return true
	case reflect.Bool:
		return n.Tag == "!!bool"
	}
	return false
}

// checkLeaf decodes n into a scratch value of type t and reports why it does not fit, under key.
func checkLeaf(l *errs, n *yaml.Node, t reflect.Type, key string) *yaml.Node {
	if fits(n, t) {
		return n
	}
	return leafErrors(l, n, key, n.Decode(reflect.New(t).Interface()))
}

// checkUnmarshaler is checkLeaf for a type with its own UnmarshalYAML, called directly: that is all
// Node.Decode would do with a non-null node, without building a decoder for it.
func checkUnmarshaler(l *errs, n *yaml.Node, t reflect.Type, key string) *yaml.Node {
	u := reflect.New(t).Interface().(yaml.Unmarshaler)
	return leafErrors(l, n, key, u.UnmarshalYAML(n))
}

// leafErrors adds err, n's decoding error, to l under key, and returns n when there is none.
func leafErrors(l *errs, n *yaml.Node, key string, err error) *yaml.Node {
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

// structFields is what checkStruct needs of a struct type: its fields by YAML key (those of inline
// structs included) and, for the unknown-key hint, the keys sorted and joined.
type structFields struct {
	types map[string]reflect.Type
	known string
}

// fieldTables holds each struct type's fields (reflect.Type → *structFields), built on first use and
// kept for the process's life: the types are the program's own, so it stays small, and a table never
// changes once built. Every route of a config decodes the same few types, the backings' DecodeStrict
// calls included, and building the tables anew for each route was most of the cost of decoding it.
// A sync.Map, because Load decodes routes on several goroutines.
var fieldTables sync.Map

// fieldsOf returns t's fields.
func fieldsOf(t reflect.Type) *structFields {
	if f, ok := fieldTables.Load(t); ok {
		return f.(*structFields)
	}
	types := yamlFields(t)
	f, _ := fieldTables.LoadOrStore(t, &structFields{types: types, known: strings.Join(slices.Sorted(maps.Keys(types)), ", ")})
	return f.(*structFields)
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
