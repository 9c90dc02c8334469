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
	cfg, err := registry.Load(data, backings)
	return renderResult(t, cfg, err)
}

// renderResult is render's output for a load's result.
func renderResult(t *testing.T, cfg *registry.Config, err error) []byte {
	t.Helper()
	var b bytes.Buffer
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
				// A problem without a route is about a top-level key: one the file has, or a misspelt one,
				// or a key of the top-level edge block.
				if re.Route == "" && strings.ContainsAny(re.Key, ".[") && !strings.HasPrefix(re.Key, "edge.") {
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
				`line 11: route "a": health.intervall: unknown key (known keys: budget, fail_fast_after, host, interval, passes, path, status, tcp, timeout)`,
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

const (
	kib = int64(1 << 10)
	mib = int64(1 << 20)
)

// keyCase is one value of one key: valid, with the field it yields, or invalid, with its one problem.
type keyCase struct {
	value   string // written after "key: "; "" leaves the key out
	want    any    // the field, when value is valid
	problem string // the problem after "line N: [route "a": ]key: ", when it is not
}

// runKeyCase loads data and checks that it yields kc.want through get, or kc.problem alone, after prefix.
func runKeyCase(t *testing.T, data string, kc keyCase, prefix string, get func(*registry.Config) any) {
	t.Helper()
	cfg, err := registry.Load([]byte(data), backings)
	if kc.problem != "" {
		var got []string
		for _, e := range registry.Errors(err) {
			got = append(got, e.Error())
		}
		if want := []string{prefix + kc.problem}; !reflect.DeepEqual(got, want) {
			t.Errorf("Load problems:\n got %q\nwant %q", got, want)
		}
		return
	}
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got := get(cfg); !reflect.DeepEqual(got, kc.want) {
		t.Errorf("got %#v, want %#v", got, kc.want)
	}
}

// topKey is a top-level key, "shutdown_grace" or "edge.NAME", with the field it sets and its cases.
type topKey struct {
	key   string
	get   func(*registry.Config) any
	cases []keyCase
}

// runTopKeys runs each case of each key with the key on line 1 (shutdown_grace) or line 2 (below
// edge:), before one valid route.
func runTopKeys(t *testing.T, keys []topKey) {
	t.Helper()
	for _, k := range keys {
		for _, kc := range k.cases {
			t.Run(k.key+"="+kc.value, func(t *testing.T) {
				top, line := "", 1
				if name, ok := strings.CutPrefix(k.key, "edge."); ok {
					top, line = "edge:\n", 2
					if kc.value != "" {
						top += "  " + name + ": " + kc.value + "\n"
					}
				} else if kc.value != "" {
					top = k.key + ": " + kc.value + "\n"
				}
				prefix := fmt.Sprintf("line %d: %s: ", line, k.key)
				runKeyCase(t, top+oneRoute("hosts: [a.localhost]"), kc, prefix, k.get)
			})
		}
	}
}

const (
	notDuration = `is not a duration (use a unit, as in "1.5s" or "15m")`
	notSize     = `is not a size (e.g. 32KiB, 1MiB, 1048576)`
)

// TestLoadTopDurations covers shutdown_grace and the edge's timeouts: the default, a valid value, and
// each way a value can be wrong (0 among them: a zero timeout is not "none", but for tunnel_timeout,
// where it is).
func TestLoadTopDurations(t *testing.T) {
	runTopKeys(t, []topKey{
		{"shutdown_grace", func(c *registry.Config) any { return c.ShutdownGrace }, []keyCase{
			{value: "", want: 30 * time.Second},
			{value: "2m", want: 2 * time.Minute},
			{value: "0", problem: "must be positive, got 0s (leave the key out for the default 30s)"},
			{value: "-1s", problem: `duration "-1s" is negative`},
			{value: "30", problem: `"30" ` + notDuration},
			{value: "[30s]", problem: `want a duration such as "1.5s" or "15m"`},
		}},
		{"edge.header_timeout", func(c *registry.Config) any { return c.Edge.HeaderTimeout }, []keyCase{
			{value: "", want: 10 * time.Second},
			{value: "2.5s", want: 2500 * time.Millisecond},
			{value: "0", problem: "must be positive, got 0s (leave the key out for the default 10s)"},
			{value: "-5s", problem: `duration "-5s" is negative`},
			{value: "ten", problem: `"ten" ` + notDuration},
		}},
		{"edge.body_timeout", func(c *registry.Config) any { return c.Edge.BodyTimeout }, []keyCase{
			{value: "", want: 30 * time.Second},
			{value: "1m", want: time.Minute},
			{value: "0", problem: "must be positive, got 0s (leave the key out for the default 30s)"},
			{value: "5 seconds", problem: `"5 seconds" ` + notDuration},
		}},
		{"edge.send_timeout", func(c *registry.Config) any { return c.Edge.SendTimeout }, []keyCase{
			{value: "", want: time.Minute},
			{value: "15s", want: 15 * time.Second},
			{value: "0", problem: "must be positive, got 0s (leave the key out for the default 1m0s)"},
		}},
		{"edge.tunnel_timeout", func(c *registry.Config) any { return c.Edge.TunnelTimeout }, []keyCase{
			{value: "", want: time.Hour},
			{value: "0", want: time.Duration(0)}, // no bound
			{value: "1s", want: time.Second},
			{value: "24h", want: 24 * time.Hour},
			{value: "999ms", problem: "999ms would close WebSockets between their messages: 0 for no bound, or at least 1s"},
			{value: "1ns", problem: "1ns would close WebSockets between their messages: 0 for no bound, or at least 1s"},
			{value: "-1h", problem: `duration "-1h" is negative`},
			{value: "3600", problem: `"3600" ` + notDuration},
		}},
		{"edge.keepalive_timeout", func(c *registry.Config) any { return c.Edge.KeepAliveTimeout }, []keyCase{
			{value: "", want: 2 * time.Minute},
			{value: "75s", want: 75 * time.Second},
			{value: "0", problem: "must be positive, got 0s (leave the key out for the default 2m0s)"},
			{value: "{a: 1}", problem: `want a duration such as "1.5s" or "15m"`},
		}},
	})
}

// TestLoadEdgeLimits covers the edge's sizes, max_held and body_buffer_dir: the default, valid values
// (the bounds among them), and each way a value can be wrong.
func TestLoadEdgeLimits(t *testing.T) {
	runTopKeys(t, []topKey{
		{"edge.max_header_bytes", func(c *registry.Config) any { return c.Edge.MaxHeaderBytes }, []keyCase{
			{value: "", want: 32 * kib},
			{value: "1KiB", want: kib},
			{value: "1MiB", want: mib},
			{value: "8 KiB", want: 8 * kib},
			{value: "16000", want: int64(16000)},
			{value: "1023", problem: "must be between 1KiB and 1MiB, got 1023B"},
			{value: "1025KiB", problem: "must be between 1KiB and 1MiB, got 1025KiB"},
			{value: "0", problem: "must be between 1KiB and 1MiB, got 0"},
			{value: "32kb", problem: `"32kb" ` + notSize},
			{value: "-1KiB", problem: `size "-1KiB" is negative`},
			{value: "1.5KiB", problem: `size "1.5KiB" is not a whole number (write 1536KiB, not 1.5MiB)`},
			{value: "[32KiB]", problem: `want a size such as "32KiB" or 1048576`},
		}},
		{"edge.max_held", func(c *registry.Config) any { return c.Edge.MaxHeld }, []keyCase{
			{value: "", want: 20000},
			{value: "1", want: 1},
			{value: "0", problem: "must be positive, got 0 (leave the key out for the default 20000)"},
			{value: "-3", problem: "must be positive, got -3 (leave the key out for the default 20000)"},
			{value: "many", problem: "cannot unmarshal !!str `many` into int"},
		}},
		{"edge.max_held_bytes", func(c *registry.Config) any { return c.Edge.MaxHeldBytes }, []keyCase{
			{value: "", want: 256 * mib},
			{value: "1GB", want: int64(1e9)},
			{value: "0", problem: "must be positive, got 0 (leave the key out for the default 256MiB)"},
			{value: "99999999999999999999", problem: `size "99999999999999999999" is too large (at most 9223372036854775807 bytes)`},
		}},
		{"edge.body_memory", func(c *registry.Config) any { return c.Edge.BodyMemory }, []keyCase{
			{value: "", want: 64 * kib},
			{value: "0", want: int64(0)},
			{value: "16MiB", want: 16 * mib},
			{value: "16777217", problem: "must be at most 16MiB, got 16777217B (the rest of a body goes to body_buffer_dir)"},
			{value: "1GiB", problem: "must be at most 16MiB, got 1GiB (the rest of a body goes to body_buffer_dir)"},
			{value: "64k", problem: `"64k" ` + notSize},
		}},
		{"edge.body_buffer_dir", func(c *registry.Config) any { return c.Edge.BodyBufferDir }, []keyCase{
			{value: "", want: ""},
			{value: "/nonexistent/bodies", want: "/nonexistent/bodies"}, // existence is a live check
			{value: "tmp/bodies", problem: `"tmp/bodies" is not an absolute path (leave the key out for the system's temporary directory)`},
			{value: "[/tmp]", problem: "cannot unmarshal !!seq into string"},
		}},
	})
}

// TestLoadRouteBodyKeys covers request_buffering, max_body and health.fail_fast_after.
func TestLoadRouteBodyKeys(t *testing.T) {
	route := func(c *registry.Config) *registry.Route { return c.Routes[0] }
	keys := []struct {
		key   string // a route's key, "health.NAME" for one in its health block
		get   func(*registry.Config) any
		cases []keyCase
	}{
		{"request_buffering", func(c *registry.Config) any { return route(c).RequestBuffering }, []keyCase{
			{value: "", want: true},
			{value: "false", want: false},
			{value: "true", want: true},
			{value: "sometimes", problem: "cannot unmarshal !!str `sometimes` into bool"},
			{value: "1", problem: "cannot unmarshal !!int `1` into bool"},
		}},
		{"max_body", func(c *registry.Config) any { return route(c).MaxBody }, []keyCase{
			{value: "", want: 100 * mib},
			{value: "0", want: int64(0)},
			{value: "10GB", want: int64(10e9)},
			{value: "1048576", want: mib},
			{value: "512 B", want: int64(512)},
			{value: "-1", problem: `size "-1" is negative`},
			{value: "1.5MiB", problem: `size "1.5MiB" is not a whole number (write 1536KiB, not 1.5MiB)`},
			{value: "100mb", problem: `"100mb" is not a size (e.g. 32KiB, 1MiB, 1048576)`},
			{value: "9223372036854775808", problem: `size "9223372036854775808" is too large (at most 9223372036854775807 bytes)`},
			{value: "8589934592GiB", problem: `size "8589934592GiB" is too large (at most 9223372036854775807 bytes)`},
			{value: "[1MiB]", problem: `want a size such as "32KiB" or 1048576`},
		}},
		{"health.fail_fast_after", func(c *registry.Config) any { return route(c).Health.FailFastAfter }, []keyCase{
			{value: "", want: 3},
			{value: "0", want: 0},
			{value: "10", want: 10},
			{value: "-1", problem: "must not be negative, got -1 (0 turns the rule off)"},
			{value: "often", problem: "cannot unmarshal !!str `often` into int"},
		}},
	}
	for _, k := range keys {
		for _, kc := range k.cases {
			t.Run(k.key+"="+kc.value, func(t *testing.T) {
				// The key sits on line 7, after the route's hosts, or on line 8 below health: on line 7.
				extra, line := []string{"hosts: [a.localhost]"}, 7
				if name, ok := strings.CutPrefix(k.key, "health."); ok && kc.value != "" {
					extra, line = append(extra, "health:", "  "+name+": "+kc.value), 8
				} else if kc.value != "" {
					extra = append(extra, k.key+": "+kc.value)
				}
				prefix := fmt.Sprintf(`line %d: route "a": %s: `, line, k.key)
				runKeyCase(t, oneRoute(extra...), kc, prefix, k.get)
			})
		}
	}
}

// TestLoadEdgeBlock: the edge block as a whole. Left out, empty or null, it takes every default; each of
// its problems is reported, all at once, beside those of the routes.
func TestLoadEdgeBlock(t *testing.T) {
	defaults := registry.EdgeLimits{
		HeaderTimeout:    10 * time.Second,
		BodyTimeout:      30 * time.Second,
		KeepAliveTimeout: 2 * time.Minute,
		SendTimeout:      time.Minute,
		TunnelTimeout:    time.Hour,
		MaxHeaderBytes:   32 * kib,
		MaxHeld:          20000,
		MaxHeldBytes:     256 * mib,
		BodyMemory:       64 * kib,
		MaxSpillBytes:    1024 * mib,
		// The TLS listener's limits.
		TLSHandshakeTimeout: 10 * time.Second,
		MaxTLSHandshakes:    256,
		EventLoops:          registry.EventLoopsAuto,
	}
	for _, top := range []string{"", "edge:\n", "edge: {}\n", "edge: ~\n"} {
		cfg, err := registry.Load([]byte(top+oneRoute("hosts: [a.localhost]")), backings)
		if err != nil {
			t.Fatalf("Load with %q: %v", top, err)
		}
		if cfg.Edge != defaults {
			t.Errorf("Load with %q: Edge = %+v, want %+v", top, cfg.Edge, defaults)
		}
	}
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{
			name: "not a mapping",
			yaml: "edge: strict\n" + oneRoute("hosts: [a.localhost]"),
			want: []string{`line 1: edge: want a mapping of keys, got "strict"`},
		},
		{
			name: "every key wrong, and a route's problem",
			yaml: "edge:\n  header_timeout: 0\n  body_timeout: 5\n  max_header_bytes: 64MiB\n  max_held: -1\n" +
				"  max_held_bytes: 1.5GiB\n  body_memory: 17MiB\n  body_buffer_dir: ./spool\n  keepalive: 1m\n  tunnel_timeout: 500ms\n" +
				"routes:\n  - name: a\n    hosts: [a.localhost]\n    backing: exec\n    upstream: localhost\n    exec: {argv: [/bin/a]}\n",
			want: []string{
				`line 2: edge.header_timeout: must be positive, got 0s (leave the key out for the default 10s)`,
				`line 3: edge.body_timeout: "5" is not a duration (use a unit, as in "1.5s" or "15m")`,
				`line 4: edge.max_header_bytes: must be between 1KiB and 1MiB, got 64MiB`,
				`line 5: edge.max_held: must be positive, got -1 (leave the key out for the default 20000)`,
				`line 6: edge.max_held_bytes: size "1.5GiB" is not a whole number (write 1536KiB, not 1.5MiB)`,
				`line 7: edge.body_memory: must be at most 16MiB, got 17MiB (the rest of a body goes to body_buffer_dir)`,
				`line 8: edge.body_buffer_dir: "./spool" is not an absolute path (leave the key out for the system's temporary directory)`,
				`line 9: edge.keepalive: unknown key (known keys: body_buffer_dir, body_memory, body_timeout, event_loops, header_timeout, keepalive_timeout, max_conns, max_header_bytes, max_held, max_held_bytes, max_spill_bytes, max_spill_files, max_tls_handshakes, send_timeout, tls_handshake_timeout, tunnel_timeout)`,
				`line 10: edge.tunnel_timeout: 500ms would close WebSockets between their messages: 0 for no bound, or at least 1s`,
				`line 15: route "a": upstream: upstream "localhost" is neither host:port nor a unix socket path`,
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

func TestParseByteSize(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr string
	}{
		{in: "0", want: 0},
		{in: "1048576", want: 1048576},
		{in: "007", want: 7},
		{in: "1B", want: 1},
		{in: "1KB", want: 1000},
		{in: "1MB", want: 1000000},
		{in: "1GB", want: 1000000000},
		{in: "32KiB", want: 32 << 10},
		{in: "32 KiB", want: 32 << 10},
		{in: "1MiB", want: 1 << 20},
		{in: "1GiB", want: 1 << 30},
		{in: "9223372036854775807", want: 1<<63 - 1},
		{in: "9223372036854775807B", want: 1<<63 - 1},
		{in: "8589934591GiB", want: 8589934591 << 30},
		{in: "9223372036854775KB", want: 9223372036854775000},
		{in: "", wantErr: `"" ` + notSize},
		{in: "KiB", wantErr: `"KiB" ` + notSize},
		{in: "32kb", wantErr: `"32kb" ` + notSize},
		{in: "32KIB", wantErr: `"32KIB" ` + notSize},
		{in: "32 kib", wantErr: `"32 kib" ` + notSize},
		{in: "32Ki", wantErr: `"32Ki" ` + notSize},
		{in: "32TiB", wantErr: `"32TiB" ` + notSize},
		{in: "32  KiB", wantErr: `"32  KiB" ` + notSize},
		{in: " 32KiB", wantErr: `" 32KiB" ` + notSize},
		{in: "32 ", wantErr: `"32 " ` + notSize},
		{in: "+32", wantErr: `"+32" ` + notSize},
		{in: "1e6", wantErr: `"1e6" ` + notSize},
		{in: "0x10", wantErr: `"0x10" ` + notSize},
		{in: "1,000", wantErr: `"1,000" ` + notSize},
		{in: "-1", wantErr: `size "-1" is negative`},
		{in: "-0", wantErr: `size "-0" is negative`},
		{in: "-32 KiB", wantErr: `size "-32 KiB" is negative`},
		{in: "1.5MiB", wantErr: `size "1.5MiB" is not a whole number (write 1536KiB, not 1.5MiB)`},
		{in: "1.0", wantErr: `size "1.0" is not a whole number (write 1536KiB, not 1.5MiB)`},
		{in: "2.", wantErr: `size "2." is not a whole number (write 1536KiB, not 1.5MiB)`},
		{in: "9223372036854775808", wantErr: `size "9223372036854775808" is too large (at most 9223372036854775807 bytes)`},
		{in: "99999999999999999999999", wantErr: `size "99999999999999999999999" is too large (at most 9223372036854775807 bytes)`},
		{in: "8589934592GiB", wantErr: `size "8589934592GiB" is too large (at most 9223372036854775807 bytes)`},
		{in: "9223372036854776KB", wantErr: `size "9223372036854776KB" is too large (at most 9223372036854775807 bytes)`},
	}
	for _, tt := range tests {
		got, err := registry.ParseByteSize(tt.in)
		gotErr := ""
		if err != nil {
			gotErr = err.Error()
		}
		if got != tt.want || gotErr != tt.wantErr {
			t.Errorf("ParseByteSize(%q) = %d, %q; want %d, %q", tt.in, got, gotErr, tt.want, tt.wantErr)
		}
	}
}

// TestByteSizeString: a size is written in the largest unit that holds it exactly, and reads back.
func TestByteSizeString(t *testing.T) {
	tests := []struct {
		in   registry.ByteSize
		want string
	}{
		{0, "0"},
		{1, "1B"},
		{1000, "1000B"},
		{1024, "1KiB"},
		{1536, "1536B"}, // 1.5KiB: not a whole number of KiB
		{32 << 10, "32KiB"},
		{3 << 20, "3MiB"},
		{1 << 30, "1GiB"},
		{5 << 40, "5120GiB"},
		{1<<63 - 1, "9223372036854775807B"},
	}
	for _, tt := range tests {
		got := tt.in.String()
		if got != tt.want {
			t.Errorf("ByteSize(%d).String() = %q, want %q", int64(tt.in), got, tt.want)
		}
		if back, err := registry.ParseByteSize(got); err != nil || back != int64(tt.in) {
			t.Errorf("ParseByteSize(%q) = %d, %v; want %d back", got, back, err, int64(tt.in))
		}
	}
}

// TestLoadSyntaxErrorsNameALine: the YAML library names no line for an error on the first line, nor
// for bad bytes or an unknown alias anywhere; Load still reports one (found by FuzzLoad).
func TestLoadSyntaxErrorsNameALine(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		line     int
	}{
		{"unterminated quote on line 1", `"`, 1},
		{"mapping value on line 1", "a: b: c", 1},
		{"tab on line 1", "\t", 1},
		{"bad UTF-8 on line 3", "routes:\n  - name: a\n    hosts: [\xff]\n", 3},
		{"control character on line 3", "routes:\n  - name: a\n    hosts: [a\x01.localhost]\n", 3},
		{"unknown alias on line 2", "a: &x\nb: *y", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := registry.Load([]byte(tc.in), nil)
			if err == nil {
				t.Fatal("Load succeeded")
			}
			for _, e := range registry.Errors(err) {
				var re *registry.Error
				if !errors.As(e, &re) || re.Line != tc.line {
					t.Errorf("%v: want line %d", e, tc.line)
				}
			}
		})
	}
}

// TestLoadCgroupRoot covers cgroup_root: automatic when left out, off, an absolute cgroup path
// (cleaned), and each way a value can be wrong.
func TestLoadCgroupRoot(t *testing.T) {
	runTopKeys(t, []topKey{
		{"cgroup_root", func(c *registry.Config) any { return c.CgroupRoot }, []keyCase{
			{value: "", want: ""},
			{value: "off", want: "off"},
			{value: "/system.slice/activator.service/tenants", want: "/system.slice/activator.service/tenants"},
			{value: "/a//b/", want: "/a/b"},
			{value: "tenants", problem: `"tenants" must be "off" or an absolute cgroup path, as in /system.slice/activator.service/tenants (leave the key out for a group below the activator's own)`},
			{value: "/", problem: `"/" is the root of the cgroup hierarchy: every cgroup below cgroup_root is killed at start-up, so it must be a group of the activator's own`},
			{value: "/a/../b", problem: `"/a/../b" must not contain ".."`},
			{value: "/sys/fs/cgroup/x", problem: `"/sys/fs/cgroup/x" is a file system path: write the cgroup's path as /proc/self/cgroup shows it, without the mount point (/x)`},
			{value: "[a]", problem: "cannot unmarshal !!seq into string"},
		}},
	})
}

// TestLoadEventLoops: edge.event_loops left out is EventLoopsAuto (one loop per CPU, which the serving
// process counts); 0 turns the loops off and any value up to MaxEventLoops is kept as written.
func TestLoadEventLoops(t *testing.T) {
	for _, c := range []struct {
		edge string
		want int
	}{
		{"", registry.EventLoopsAuto},
		{"edge: {event_loops: 0}\n", 0},
		{"edge: {event_loops: 1}\n", 1},
		{"edge: {event_loops: 64}\n", registry.MaxEventLoops},
	} {
		cfg, err := registry.Load([]byte(c.edge+oneRoute("hosts: [a.localhost]")), backings)
		if err != nil {
			t.Fatalf("Load with %q: %v", c.edge, err)
		}
		if cfg.Edge.EventLoops != c.want {
			t.Errorf("Load with %q: edge.event_loops %d, want %d", c.edge, cfg.Edge.EventLoops, c.want)
		}
	}
}
