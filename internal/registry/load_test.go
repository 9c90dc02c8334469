package registry_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/registry"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// fakeExec stands in for the exec backing's settings so these tests do not depend on a real backend.
type fakeExec struct {
	Argv []string          `yaml:"argv"`
	Dir  string            `yaml:"dir"`
	Env  map[string]string `yaml:"env"`
	Stop struct {
		Grace registry.Duration `yaml:"grace"`
	} `yaml:"stop"`
}

// decodeExec is a SettingsDecoder the way a backing writes one: strict decode, defaults, and checks that
// report keys relative to the block.
func decodeExec(r *registry.Route, node *yaml.Node) (any, error) {
	if r.Settings != nil {
		return nil, errors.New("decoder called with Settings already set")
	}
	s := &fakeExec{}
	if err := registry.DecodeStrict(node, s); err != nil {
		return nil, err
	}
	var errs []error
	switch {
	case len(s.Argv) == 0:
		errs = append(errs, &registry.Error{Key: "argv", Err: errors.New("missing: the command to run")})
	case !filepath.IsAbs(s.Argv[0]):
		errs = append(errs, &registry.Error{Key: "argv[0]", Err: fmt.Errorf("%q is not an absolute path", s.Argv[0])})
	}
	if s.Stop.Grace.D() > r.SleepBudget {
		errs = append(errs, &registry.Error{Key: "stop.grace", Err: fmt.Errorf("%v exceeds the route's sleep_budget %v", s.Stop.Grace.D(), r.SleepBudget)})
	}
	if s.Stop.Grace == 0 {
		s.Stop.Grace = registry.Duration(5 * time.Second)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return s, nil
}

// backings is what a build with only the exec backing passes to Load.
var backings = map[string]registry.SettingsDecoder{"exec": decodeExec}

// TestGolden loads every testdata/NAME.yaml and compares the outcome with testdata/NAME.golden: the
// parsed Config as indented JSON (durations written as Go durations), or the problems, one per line.
// Run `go test ./internal/registry -update` to rewrite the golden files, then review the diff.
func TestGolden(t *testing.T) {
	inputs, err := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(inputs) == 0 {
		t.Fatal("no testdata/*.yaml")
	}
	for _, in := range inputs {
		name := strings.TrimSuffix(filepath.Base(in), ".yaml")
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			got := render(t, data)
			golden := strings.TrimSuffix(in, ".yaml") + ".golden"
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("Load(%s) differs from %s (run with -update and review the diff)\n--- got\n%s\n--- want\n%s", in, golden, got, want)
			}
		})
	}
}

// render is what a golden file holds: "ok" and the config, or "N problems" and one problem a line.
func render(t *testing.T, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	cfg, err := registry.Load(data, backings)
	if err != nil {
		if cfg != nil {
			t.Errorf("Load returned both a config and an error")
		}
		list := registry.Errors(err)
		fmt.Fprintf(&b, "# %d problem(s)\n", len(list))
		for _, e := range list {
			fmt.Fprintln(&b, e.Error())
		}
		return b.Bytes()
	}
	out, err := json.MarshalIndent(plain(reflect.ValueOf(cfg)), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	b.WriteString("# ok\n")
	b.Write(out)
	b.WriteByte('\n')
	return b.Bytes()
}

// field keeps a struct's field order in the JSON rendering.
type field struct {
	name  string
	value any
}

type ordered []field

func (o ordered) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(f.name)
		v, err := json.Marshal(f.value)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

var (
	durationType   = reflect.TypeOf(time.Duration(0))
	regDurationTyp = reflect.TypeOf(registry.Duration(0))
)

// plain turns v into JSON-ready values: structs keep their field order, durations read as "1m0s", and
// Settings shows its dynamic type so a golden file says which decoder produced it.
func plain(v reflect.Value) any {
	switch {
	case !v.IsValid():
		return nil
	case v.Type() == durationType:
		return time.Duration(v.Int()).String()
	case v.Type() == regDurationTyp:
		return time.Duration(v.Int()).String()
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		if v.Kind() == reflect.Interface {
			return ordered{{"type", v.Elem().Type().String()}, {"value", plain(v.Elem())}}
		}
		return plain(v.Elem())
	case reflect.Struct:
		var o ordered
		for i := 0; i < v.NumField(); i++ {
			if f := v.Type().Field(i); f.IsExported() {
				o = append(o, field{f.Name, plain(v.Field(i))})
			}
		}
		return o
	case reflect.Slice:
		if v.IsNil() {
			return nil
		}
		out := make([]any, v.Len())
		for i := range out {
			out[i] = plain(v.Index(i))
		}
		return out
	case reflect.Map:
		out := map[string]any{}
		for _, k := range v.MapKeys() {
			out[fmt.Sprint(k.Interface())] = plain(v.MapIndex(k))
		}
		return out
	}
	return v.Interface()
}

// TestLoadReportsEverything checks the contract behind the golden files: Load lists every problem in
// one go, and each one is an *Error naming its route, its key and its line.
func TestLoadReportsEverything(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "many_problems.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = registry.Load(data, backings)
	list := registry.Errors(err)
	type want struct {
		route, key string
		line       int
	}
	wants := []want{
		// In file order, so `activator check` reads top to bottom like the file.
		{"", "listn", 1},
		{"alpha", "upstream", 8},
		{"alpha", "health.interval", 9},
		{"alpha", "max_upstream_conns", 10},
		{"beta", "hosts", 13},
		{"beta", "backing", 14},
		// The misspelt key leaves upstream unset; the line is the route's, as the key is absent. gamma's
		// exec block is not decoded: a backing's settings are checked once the common keys pass.
		{"gamma", "upstream", 16},
		{"gamma", "upstram", 20},
	}
	if len(list) != len(wants) {
		t.Fatalf("Load reported %d problems, want %d:\n%v", len(list), len(wants), err)
	}
	for i, e := range list {
		var re *registry.Error
		if !errors.As(e, &re) {
			t.Errorf("problem %d is %T (%v), want *registry.Error", i, e, e)
			continue
		}
		got := want{re.Route, re.Key, re.Line}
		if got != wants[i] {
			t.Errorf("problem %d = %+v (%v), want %+v", i, got, e, wants[i])
		}
		msg := e.Error()
		if re.Route != "" && !strings.Contains(msg, fmt.Sprintf("route %q", re.Route)) {
			t.Errorf("problem %d %q does not name its route", i, msg)
		}
		if !strings.Contains(msg, re.Key+": ") {
			t.Errorf("problem %d %q does not name its key", i, msg)
		}
	}
}

// TestGoldenProblemsNameKeys checks every failing golden input: each problem is an *Error that carries a
// line and a key, and a route whenever it is about one.
func TestGoldenProblemsNameKeys(t *testing.T) {
	inputs, _ := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	for _, in := range inputs {
		data, err := os.ReadFile(in)
		if err != nil {
			t.Fatal(err)
		}
		_, err = registry.Load(data, backings)
		for _, e := range registry.Errors(err) {
			var re *registry.Error
			if !errors.As(e, &re) {
				t.Errorf("%s: %v is %T, want *registry.Error", in, e, e)
				continue
			}
			switch {
			case strings.HasPrefix(filepath.Base(in), "syntax"):
				// A YAML syntax error has a line but no key.
				if re.Line == 0 {
					t.Errorf("%s: %v has no line", in, e)
				}
			case re.Key == "routes" && re.Route == "":
				// "no routes configured" is about the file, not a line in it.
			case strings.HasPrefix(re.Route, "#") && re.Key == "":
				// A route that is not a mapping has no keys: it is named by position.
				if re.Line == 0 {
					t.Errorf("%s: %v has no line", in, e)
				}
			default:
				if re.Key == "" || re.Line == 0 {
					t.Errorf("%s: %v lacks a key or a line", in, e)
				}
				// A problem without a route is about a top-level key: one the file has, or a misspelt one.
				if re.Route == "" && strings.ContainsAny(re.Key, ".[") {
					t.Errorf("%s: %v is about a route but names none", in, e)
				}
			}
		}
	}
}

// TestDecodeStrict covers the pieces a backing's decoder relies on directly.
func TestDecodeStrict(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string // Error() of each problem
		argv []string // decoded even when there are problems
	}{
		{name: "ok", yaml: "argv: [/bin/true]\nstop: {grace: 2s}", argv: []string{"/bin/true"}},
		{name: "nil node", yaml: ""},
		{
			name: "unknown keys at every depth",
			yaml: "argv: [/bin/true]\nstop: {grace: 2s, signal: TERM}\nuser: nobody",
			want: []string{
				"line 2: stop.signal: unknown key (known keys: grace)",
				"line 3: user: unknown key (known keys: argv, dir, env, stop)",
			},
			argv: []string{"/bin/true"},
		},
		{
			name: "bad values keep the good ones",
			yaml: "dir: [a]\nargv: [/bin/true]\nstop:\n  grace: 5 seconds\nenv: {A: {b: c}}",
			want: []string{
				"line 1: dir: cannot unmarshal !!seq into string",
				"line 4: stop.grace: \"5 seconds\" is not a duration (use a unit, as in \"1.5s\" or \"15m\")",
				"line 5: env.A: cannot unmarshal !!map into string",
			},
			argv: []string{"/bin/true"},
		},
		{
			name: "scalar for a mapping",
			yaml: "stop: now",
			want: []string{`line 1: stop: want a mapping of keys, got "now"`},
		},
		{
			name: "negative duration",
			yaml: "stop: {grace: -1s}",
			want: []string{`line 1: stop.grace: duration "-1s" is negative`},
		},
		{name: "null values", yaml: "argv:\nstop:\nenv: ~"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var node *yaml.Node
			if tt.yaml != "" {
				var doc yaml.Node
				if err := yaml.Unmarshal([]byte(tt.yaml), &doc); err != nil {
					t.Fatal(err)
				}
				node = &doc
			}
			var s fakeExec
			err := registry.DecodeStrict(node, &s)
			var got []string
			for _, e := range registry.Errors(err) {
				got = append(got, e.Error())
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("DecodeStrict problems:\n got %q\nwant %q", got, tt.want)
			}
			if !reflect.DeepEqual(s.Argv, tt.argv) {
				t.Errorf("argv = %q, want %q", s.Argv, tt.argv)
			}
		})
	}
}

func TestParseUpstream(t *testing.T) {
	tests := []struct {
		in      string
		want    registry.Upstream
		wantErr bool
	}{
		{in: "127.0.0.1:9001", want: registry.Upstream{Network: "tcp", Address: "127.0.0.1:9001"}},
		{in: "[::1]:80", want: registry.Upstream{Network: "tcp", Address: "[::1]:80"}},
		{in: "app.internal:8080", want: registry.Upstream{Network: "tcp", Address: "app.internal:8080"}},
		{in: "unix:/run/app.sock", want: registry.Upstream{Network: "unix", Address: "/run/app.sock"}},
		{in: "/run/app.sock", want: registry.Upstream{Network: "unix", Address: "/run/app.sock"}},
		{in: "", wantErr: true},
		{in: "localhost", wantErr: true},
		{in: "unix:relative.sock", wantErr: true},
		{in: "host:0", wantErr: true},
		{in: ":8080", wantErr: true},
		{in: "host:", wantErr: true},
	}
	for _, tt := range tests {
		got, err := registry.ParseUpstream(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("ParseUpstream(%q) error = %v, want error: %v", tt.in, err, tt.wantErr)
			continue
		}
		if got != tt.want {
			t.Errorf("ParseUpstream(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
		if err == nil {
			if back, err := registry.ParseUpstream(got.String()); err != nil || back != got {
				t.Errorf("ParseUpstream(%q.String() = %q) = %+v, %v; want the same upstream back", tt.in, got.String(), back, err)
			}
		}
	}
}

func TestLoadFile(t *testing.T) {
	_, err := registry.LoadFile(filepath.Join(t.TempDir(), "absent.yaml"), backings)
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadFile(absent) error = %v, want one wrapping os.ErrNotExist", err)
	}
	cfg, err := registry.LoadFile(filepath.Join("testdata", "full.yaml"), backings)
	if err != nil {
		t.Fatalf("LoadFile(full.yaml): %v", err)
	}
	if r := cfg.Route("hello"); r == nil || r.Name != "hello" {
		t.Errorf("Config.Route(hello) = %+v", r)
	}
	if r := cfg.Route("nope"); r != nil {
		t.Errorf("Config.Route(nope) = %+v, want nil", r)
	}
}

// oneRoute is a config with one route "a" whose first lines (2 to 5) are valid; extra adds its keys from
// line 6 on, so a case can give each problem a line of its own.
func oneRoute(extra ...string) string {
	var b strings.Builder
	b.WriteString("routes:\n  - name: a\n    backing: exec\n    upstream: 127.0.0.1:9001\n    exec: {argv: [/bin/a]}\n")
	for _, e := range extra {
		b.WriteString("    " + e + "\n")
	}
	return b.String()
}

// problems returns the Error() text of each problem Load reports for data.
func problems(t *testing.T, data string, decoders map[string]registry.SettingsDecoder) []string {
	t.Helper()
	cfg, err := registry.Load([]byte(data), decoders)
	if err != nil && cfg != nil {
		t.Errorf("Load returned both a config and an error")
	}
	var got []string
	for _, e := range registry.Errors(err) {
		got = append(got, e.Error())
	}
	return got
}

// TestLoadSectionReportsEveryProblem: a problem in one key of a section (a value that does not decode,
// an unknown key) does not hide the problems in the section's other keys, nor a broken route the
// duplicates it shares with another.
func TestLoadSectionReportsEveryProblem(t *testing.T) {
	const (
		notDuration = `is not a duration (use a unit, as in "1.5s" or "15m")`
		upstreamMsg = `where does the woken tenant listen? (host:port or unix:/path)`
	)
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{
			name: "hold: negative max_time and max_requests",
			yaml: oneRoute("hosts: [a.localhost]", "hold: {max_time: -5s, max_requests: -1}"),
			want: []string{
				`line 7: route "a": hold.max_time: duration "-5s" is negative`,
				`line 7: route "a": hold.max_requests: must be positive, got -1`,
			},
		},
		{
			name: "hold: unknown key and negative max_requests",
			yaml: oneRoute("hosts: [a.localhost]", "hold: {max: 5, max_requests: -1}"),
			want: []string{
				`line 7: route "a": hold.max: unknown key (known keys: max_requests, max_time)`,
				`line 7: route "a": hold.max_requests: must be positive, got -1`,
			},
		},
		{
			name: "health: bad timeout and a budget over wake_budget",
			yaml: oneRoute("hosts: [a.localhost]", "health: {timeout: soon, budget: 90s}"),
			want: []string{
				`line 7: route "a": health.timeout: "soon" ` + notDuration,
				`line 7: route "a": health.budget: 1m30s exceeds wake_budget 1m0s`,
			},
		},
		{
			name: "health: unknown key and bad path, passes and status",
			yaml: oneRoute("hosts: [a.localhost]", "health:", "  path: healthz", "  passes: -1", "  status: ok", "  intervall: 1s"),
			want: []string{
				`line 8: route "a": health.path: "healthz" must start with /`,
				`line 9: route "a": health.passes: must be positive, got -1`,
				`line 10: route "a": health.status: "ok" is not a status range such as "200-399" or "204"`,
				`line 11: route "a": health.intervall: unknown key (known keys: budget, interval, passes, path, status, timeout)`,
			},
		},
		{
			name: "backoff: unknown key and max below initial",
			yaml: oneRoute("hosts: [a.localhost]", "backoff: {initial: 10s, max: 5s, jitter: 1s}"),
			want: []string{
				`line 7: route "a": backoff.jitter: unknown key (known keys: initial, max)`,
				`line 7: route "a": backoff.max: 5s is shorter than backoff.initial 10s`,
			},
		},
		{
			name: "hosts: one that does not decode, one with a port, one twice",
			yaml: oneRoute("hosts:", "  - [a.localhost]", `  - "a:80"`, "  - b.localhost", "  - B.localhost"),
			want: []string{
				`line 7: route "a": hosts[0]: cannot unmarshal !!seq into string`,
				`line 8: route "a": hosts: host "a:80": leave the port out; hosts match whatever port the edge listens on`,
				`line 10: route "a": hosts: host "b.localhost" listed twice`,
			},
		},
		{
			name: "duplicate name of a route with another problem",
			yaml: oneRoute("hosts: [a.localhost]") + "  - name: a\n    hosts: [b.localhost]\n    backing: exec\n    exec: {argv: [/bin/a]}\n",
			want: []string{
				`line 7: route "a": upstream: missing: ` + upstreamMsg,
				`line 7: route "a": name: duplicate route name (also route #1)`,
			},
		},
		{
			name: "duplicate name and duplicate host",
			yaml: oneRoute("hosts: [a.localhost]") + "  - name: a\n    hosts: [a.localhost]\n    backing: exec\n    upstream: 127.0.0.1:9002\n    exec: {argv: [/bin/a]}\n",
			want: []string{
				`line 7: route "a": name: duplicate route name (also route #1)`,
				`line 8: route "a": hosts: host "a.localhost" with path prefix "" is already routed to "a"`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := problems(t, tt.yaml, backings); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Load problems:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(tt.want, "\n     "))
			}
		})
	}
}

// TestLoadReportsABadValueOnce: a value that does not decode is reported once, not again by the checks
// that would read it (they would see a default the operator never wrote).
func TestLoadReportsABadValueOnce(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{
			name: "hosts is not a list",
			yaml: oneRoute("hosts: a.localhost"),
			want: []string{`line 6: route "a": hosts: want a list, got "a.localhost"`},
		},
		{
			name: "no host decodes",
			yaml: oneRoute("hosts: [[a.localhost]]"),
			want: []string{`line 6: route "a": hosts[0]: cannot unmarshal !!seq into string`},
		},
		{
			name: "bad wake_budget is not compared with health.budget",
			yaml: oneRoute("hosts: [a.localhost]", "wake_budget: soon", "health: {budget: 90s}"),
			want: []string{`line 7: route "a": wake_budget: "soon" is not a duration (use a unit, as in "1.5s" or "15m")`},
		},
		{
			name: "bad backoff.initial is not compared with backoff.max",
			yaml: oneRoute("hosts: [a.localhost]", "backoff: {initial: soon, max: 500ms}"),
			want: []string{`line 7: route "a": backoff.initial: "soon" is not a duration (use a unit, as in "1.5s" or "15m")`},
		},
		{
			name: "bad backoff.max is not compared with backoff.initial",
			yaml: oneRoute("hosts: [a.localhost]", "backoff: {initial: 2m, max: [1m]}"),
			want: []string{`line 7: route "a": backoff.max: want a duration such as "1.5s" or "15m"`},
		},
		{
			name: "a health block that is not a mapping",
			yaml: oneRoute("hosts: [a.localhost]", "health: /healthz"),
			want: []string{`line 7: route "a": health: want a mapping of keys, got "/healthz"`},
		},
		{
			name: "backing that does not decode",
			yaml: oneRoute("hosts: [a.localhost]", "backing: [exec]"),
			want: []string{`line 7: route "a": backing: cannot unmarshal !!seq into string`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := problems(t, tt.yaml, backings); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Load problems:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(tt.want, "\n     "))
			}
		})
	}
}

// TestLoadBackingNames: the backings a build offers are the decoders it passes, listed sorted.
func TestLoadBackingNames(t *testing.T) {
	decode := func(*registry.Route, *yaml.Node) (any, error) { return struct{}{}, nil }
	decoders := map[string]registry.SettingsDecoder{"zeta": decode, "exec": decodeExec, "alpha": decode}
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{
			name: "missing",
			yaml: "routes:\n  - name: a\n    hosts: [a.localhost]\n    upstream: 127.0.0.1:9001\n",
			want: []string{`line 2: route "a": backing: missing (one of: alpha, exec, zeta)`},
		},
		{
			name: "not in this build",
			yaml: "routes:\n  - name: a\n    hosts: [a.localhost]\n    upstream: 127.0.0.1:9001\n    backing: kvm\n    kvm: {kernel: /boot/vmlinuz}\n",
			want: []string{`line 5: route "a": backing: "kvm" is not available in this build (one of: alpha, exec, zeta)`},
		},
		{
			name: "another backing's block",
			yaml: oneRoute("hosts: [a.localhost]", "alpha: {}"),
			want: []string{`line 7: route "a": alpha: settings for backing "alpha", but the route's backing is "exec"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := problems(t, tt.yaml, decoders); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Load problems:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(tt.want, "\n     "))
			}
		})
	}
}
