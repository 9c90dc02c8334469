package exec

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/registry"
)

// decodeYAML runs Decode on a block written in YAML ("" = no block at all). $D in the block stands for
// a temporary directory holding: app (executable), data.txt (not executable), sub/ (a directory),
// bin/tool (executable).
func decodeYAML(t *testing.T, up registry.Upstream, block string) (*Settings, []error, string) {
	t.Helper()
	d := t.TempDir()
	must(t, os.WriteFile(filepath.Join(d, "app"), []byte("#!/bin/true\n"), 0o755))
	must(t, os.WriteFile(filepath.Join(d, "data.txt"), []byte("x"), 0o644))
	must(t, os.Mkdir(filepath.Join(d, "sub"), 0o755))
	must(t, os.Mkdir(filepath.Join(d, "bin"), 0o755))
	must(t, os.WriteFile(filepath.Join(d, "bin", "tool"), []byte("#!/bin/true\n"), 0o755))
	var node *yaml.Node
	if block != "" {
		node = &yaml.Node{}
		must(t, yaml.Unmarshal([]byte(strings.ReplaceAll(block, "$D", d)), node))
	}
	v, err := Decode(&registry.Route{Name: "app", Upstream: up}, node)
	if err != nil {
		if v != nil {
			t.Errorf("Decode returned both settings and an error")
		}
		return nil, registry.Errors(err), d
	}
	return v.(*Settings), nil, d
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

var tcp = registry.Upstream{Network: "tcp", Address: "127.0.0.1:8080"}

func TestDecodeErrors(t *testing.T) {
	cases := []struct {
		name  string
		up    registry.Upstream
		block string
		want  []string // each error's text, in order; $D is the temporary directory
	}{
		{"no block", tcp, "",
			[]string{`argv: missing: the command to run, as a list such as ["/usr/bin/app", "--port", "8080"] (no shell is used)`}},
		{"empty argv", tcp, "argv: []\n",
			[]string{`line 1: argv: missing: the command to run, as a list such as ["/usr/bin/app", "--port", "8080"] (no shell is used)`}},
		{"argv as a string", tcp, "dir: /\nargv: app --port 8080\n",
			[]string{`line 2: argv: must be a list, such as ["/usr/bin/app", "--port", "8080"]: no shell is used to split a string`}},
		{"empty argv0", tcp, "argv: ['', x]\n",
			[]string{`line 1: argv[0]: empty: the executable to run`}},
		{"not in PATH", tcp, "argv: [no-such-binary-xyz]\nenv: {PATH: /nonexistent:$D/sub}\n",
			[]string{`line 1: argv[0]: "no-such-binary-xyz" not found in PATH (/nonexistent:$D/sub)`}},
		{"missing file", tcp, "argv: [$D/nope]\n",
			[]string{`line 1: argv[0]: "$D/nope": no such file or directory`}},
		{"not executable", tcp, "argv:\n  - $D/data.txt\n",
			[]string{`line 2: argv[0]: "$D/data.txt" is not executable (mode -rw-r--r--)`}},
		{"a directory", tcp, "argv: [$D/sub]\n",
			[]string{`line 1: argv[0]: "$D/sub" is a directory, not an executable`}},
		{"relative argv0 resolved against dir", tcp, "argv: [./nope]\ndir: $D\n",
			[]string{`line 1: argv[0]: "$D/nope": no such file or directory`}},
		{"relative dir", tcp, "argv: [$D/app]\ndir: some/where\n",
			[]string{`line 2: dir: "some/where" must be an absolute path`}},
		{"missing dir", tcp, "argv: [$D/app]\ndir: $D/gone\n",
			[]string{`line 2: dir: "$D/gone": no such file or directory`}},
		{"dir is a file", tcp, "argv: [$D/app]\ndir: $D/data.txt\n",
			[]string{`line 2: dir: "$D/data.txt" is not a directory`}},
		{"unknown signal", tcp, "argv: [$D/app]\nstop_signal: TERMINATE\n",
			[]string{`line 2: stop_signal: "TERMINATE" is not a signal name (such as TERM, INT, QUIT, HUP, USR1)`}},
		{"negative grace", tcp, "argv: [$D/app]\nstop_grace: -1s\n",
			[]string{`line 2: stop_grace: "-1s" is negative`}},
		{"grace without unit", tcp, "argv: [$D/app]\nstop_grace: 10\n",
			[]string{`line 2: stop_grace: "10" is not a duration (use a unit, as in "10s" or "1m")`}},
		{"bad listen mode", tcp, "argv: [$D/app]\nlisten: socket\n",
			[]string{`line 2: listen: "socket" is not a listen mode (one of: env, listen_fds, none)`}},
		{"env collides with listen env (tcp)", tcp, "argv: [$D/app]\nenv:\n  PORT: \"9\"\n",
			[]string{"line 3: env.PORT: set by `listen: env` from the route's upstream 127.0.0.1:8080; remove it, or use `listen: none` and say where to listen in argv or env"}},
		{"env collides with listen env (unix)", registry.Upstream{Network: "unix", Address: "/run/a.sock"}, "argv: [$D/app]\nenv: {SOCKET: /x}\n",
			[]string{"line 2: env.SOCKET: set by `listen: env` from the route's upstream unix:/run/a.sock; remove it, or use `listen: none` and say where to listen in argv or env"}},
		{"env collides with listen_fds", tcp, "argv: [$D/app]\nlisten: listen_fds\nenv: {LISTEN_FDS: \"2\"}\n",
			[]string{"line 3: env.LISTEN_FDS: set by `listen: listen_fds`; remove it"}},
		{"env sets the shim's variable", tcp, "argv: [$D/app]\nenv: {ACTIVATOR_EXEC_SHIM_GATE: \"3\"}\n",
			[]string{"line 2: env.ACTIVATOR_EXEC_SHIM_GATE: reserved for the activator's exec shim; remove it"}},
		{"bad env name", tcp, "argv: [$D/app]\nenv: {\"A=B\": x}\n",
			[]string{`line 2: env.A=B: variable name "A=B" must not contain '=' or NUL`}},
		{"env as a list", tcp, "argv: [$D/app]\nenv: [A=1]\n",
			[]string{`line 2: env: must be a mapping of variable names to values`}},
		{"multi-line marker", tcp, "argv: [$D/app]\nready_marker: \"a\\nb\"\n",
			[]string{`line 2: ready_marker: must be one line: it is matched within a line of output`}},
		{"unknown key", tcp, "argv: [$D/app]\nstop_timeout: 5s\n",
			[]string{`line 2: stop_timeout: unknown key (known keys: argv, cpu_max, dir, env, listen, memory_max, pids_max, ready_marker, sleep, standby, stop_grace, stop_signal)`}},
		{"not a mapping", tcp, "[a, b]\n",
			[]string{`line 1: must be a mapping with at least argv`}},
		{"every problem at once", tcp, "argv: [$D/data.txt]\ndir: rel\nstop_signal: NOPE\nstop_grace: -5s\nlisten: tcp\n", []string{
			`line 1: argv[0]: "$D/data.txt" is not executable (mode -rw-r--r--)`,
			`line 2: dir: "rel" must be an absolute path`,
			`line 3: stop_signal: "NOPE" is not a signal name (such as TERM, INT, QUIT, HUP, USR1)`,
			`line 4: stop_grace: "-5s" is negative`,
			`line 5: listen: "tcp" is not a listen mode (one of: env, listen_fds, none)`,
		}},
		{"argv and signal", tcp, "argv: [$D/data.txt]\nstop_signal: NOPE\n", []string{
			`line 1: argv[0]: "$D/data.txt" is not executable (mode -rw-r--r--)`,
			`line 2: stop_signal: "NOPE" is not a signal name (such as TERM, INT, QUIT, HUP, USR1)`,
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, errs, d := decodeYAML(t, c.up, c.block)
			var got []string
			for _, e := range errs {
				var re *registry.Error
				if !errors.As(e, &re) {
					t.Errorf("error %v is a %T, want *registry.Error", e, e)
				} else if re.Key == "" && c.name != "not a mapping" {
					t.Errorf("error %v has no key", e)
				}
				got = append(got, e.Error())
			}
			var want []string
			for _, w := range c.want {
				want = append(want, strings.ReplaceAll(w, "$D", d))
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("errors:\n got  %q\n want %q", got, want)
			}
		})
	}
}

func TestDecodeDefaultsAndValues(t *testing.T) {
	s, errs, _ := decodeYAML(t, tcp, "argv: [true, --flag]\n")
	if errs != nil {
		t.Fatalf("Decode: %v", errs)
	}
	if s.Path == "" || !filepath.IsAbs(s.Path) || filepath.Base(s.Path) != "true" {
		t.Errorf("Path %q, want true resolved via PATH", s.Path)
	}
	if !reflect.DeepEqual(s.Argv, []string{"true", "--flag"}) {
		t.Errorf("Argv %q: argv[0] must be kept as written", s.Argv)
	}
	if s.StopSignal != syscall.SIGTERM || s.StopGrace != DefaultStopGrace || s.Listen != ListenEnv || s.Dir != "" || s.ReadyMarker != "" {
		t.Errorf("defaults: %+v", s)
	}

	s, errs, d := decodeYAML(t, tcp, `
argv: [tool, -v]
env: {PATH: $D/bin, GREETING: hi}
dir: $D/sub/
ready_marker: listening on
stop_signal: sigint
stop_grace: 0
listen: listen_fds
`)
	if errs != nil {
		t.Fatalf("Decode: %v", errs)
	}
	want := &Settings{
		Argv: []string{"tool", "-v"}, Path: filepath.Join(d, "bin", "tool"),
		Env: map[string]string{"PATH": d + "/bin", "GREETING": "hi"}, Dir: filepath.Join(d, "sub"),
		ReadyMarker: "listening on", StopSignal: syscall.SIGINT, StopGrace: 0, Listen: ListenFDs, Sleep: SleepStop,
	}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("got  %+v\nwant %+v", s, want)
	}

	for in, sig := range map[string]syscall.Signal{"TERM": syscall.SIGTERM, "SIGQUIT": syscall.SIGQUIT, "hup": syscall.SIGHUP, "USR2": syscall.SIGUSR2} {
		s, errs, _ := decodeYAML(t, tcp, "argv: [$D/app]\nstop_signal: "+in+"\nstop_grace: 1m30s\n")
		if errs != nil || s.StopSignal != sig || s.StopGrace != 90*time.Second {
			t.Errorf("stop_signal %s: %v %v", in, s, errs)
		}
	}

	s, errs, d = decodeYAML(t, tcp, "argv: [./app]\ndir: $D\n")
	if errs != nil || s.Path != filepath.Join(d, "app") {
		t.Errorf("relative argv[0] with dir: %+v %v", s, errs)
	}
}

// Through registry.Load, the keys gain the backing's prefix and the route's name.
func TestDecodeThroughRegistry(t *testing.T) {
	cfg := `
routes:
  - name: web
    host: web.example.com
    upstream: 127.0.0.1:8081
    backing: exec
    exec:
      argv: [/nonexistent/app]
      stop_grace: -1s
`
	_, err := registry.Load([]byte(cfg), map[string]registry.SettingsDecoder{"exec": Decode})
	var got []string
	for _, e := range registry.Errors(err) {
		got = append(got, e.Error())
	}
	want := []string{
		`line 8: route "web": exec.argv[0]: "/nonexistent/app": no such file or directory`,
		`line 9: route "web": exec.stop_grace: "-1s" is negative`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("errors:\n got  %q\n want %q", got, want)
	}
}

// sleep and the cgroup limits: defaults, valid values, and each way a value can be wrong.
func TestDecodeContainment(t *testing.T) {
	cases := []struct {
		block   string
		want    Limits
		sleep   SleepMode
		standby bool
		err     string
	}{
		{block: "", sleep: SleepStop},
		{block: "sleep: freeze\n", sleep: SleepFreeze},
		{block: "sleep: stop\n", sleep: SleepStop},
		{block: "standby: true\n", sleep: SleepStop, standby: true},
		{block: "sleep: stop\nstandby: true\n", sleep: SleepStop, standby: true},
		{block: "sleep: freeze\nstandby: true\n", err: `line 3: standby: true needs sleep: stop (a frozen tenant keeps its processes, so there is no next one to start ahead; sleep is freeze)`},
		{block: "standby: yes please\n", err: "line 2: standby: cannot unmarshal !!str `yes please` into bool"},
		{block: "sleep: pause\n", err: `line 2: sleep: "pause" is not a sleep mode (one of: stop, freeze)`},
		{block: "memory_max: 512MiB\ncpu_max: 1.5\npids_max: 64\n", sleep: SleepStop,
			want: Limits{Memory: "536870912", CPU: "150000 100000", Pids: "64"}},
		{block: "memory_max: max\ncpu_max: max\npids_max: max\n", sleep: SleepStop,
			want: Limits{Memory: "max", CPU: "max 100000", Pids: "max"}},
		{block: "memory_max: lots\n", err: `line 2: memory_max: "lots" is not a size (e.g. 512MiB, 2GiB) or "max"`},
		{block: "memory_max: 0\n", err: `line 2: memory_max: must be positive, got 0 (or "max" for no limit)`},
		{block: "cpu_max: 0\n", err: `line 2: cpu_max: "0" is not a number of CPUs above 0.001, such as 0.5 or 2 (or "max")`},
		{block: "cpu_max: 50%\n", err: `line 2: cpu_max: "50%" is not a number of CPUs above 0.001, such as 0.5 or 2 (or "max")`},
		{block: "pids_max: -1\n", err: `line 2: pids_max: "-1" is not a positive whole number of processes (or "max")`},
	}
	for _, c := range cases {
		t.Run(c.block, func(t *testing.T) {
			s, errs, _ := decodeYAML(t, tcp, "argv: [/bin/true]\n"+c.block)
			if c.err != "" {
				if len(errs) != 1 || errs[0].Error() != c.err {
					t.Fatalf("errors %q, want [%q]", errs, c.err)
				}
				return
			}
			if errs != nil {
				t.Fatal(errs)
			}
			if s.Limits != c.want || s.Sleep != c.sleep || s.Standby != c.standby {
				t.Errorf("limits %+v sleep %q standby %v, want %+v %q %v", s.Limits, s.Sleep, s.Standby, c.want, c.sleep, c.standby)
			}
		})
	}
}

// CheckHost passes on the host the settings were decoded on, and fails once a reload's decode would
// give other settings or problems: dir gone, the executable gone, or argv[0] found elsewhere in PATH.
func TestCheckHost(t *testing.T) {
	s, errs, d := decodeYAML(t, registry.Upstream{}, "argv: [tool]\ndir: $D/sub\nenv: {PATH: \"$D/first:$D/bin\"}\n")
	if errs != nil {
		t.Fatal(errs)
	}
	if err := s.CheckHost(&registry.HostCache{}); err != nil {
		t.Fatalf("unchanged host: %v", err)
	}
	must(t, os.Mkdir(filepath.Join(d, "first"), 0o755))
	must(t, os.WriteFile(filepath.Join(d, "first", "tool"), []byte("#!/bin/true\n"), 0o755))
	if err := s.CheckHost(&registry.HostCache{}); err == nil || !strings.Contains(err.Error(), "first/tool") {
		t.Errorf("argv[0] found earlier in PATH: CheckHost = %v, want it to name the new path", err)
	}
	must(t, os.Remove(filepath.Join(d, "first", "tool")))
	must(t, os.Remove(filepath.Join(d, "bin", "tool")))
	if err := s.CheckHost(&registry.HostCache{}); err == nil {
		t.Error("executable removed: CheckHost passed")
	}
	must(t, os.WriteFile(filepath.Join(d, "bin", "tool"), []byte("#!/bin/true\n"), 0o755))
	must(t, os.Remove(filepath.Join(d, "sub")))
	if err := s.CheckHost(&registry.HostCache{}); err == nil || !strings.Contains(err.Error(), "dir") {
		t.Errorf("dir removed: CheckHost = %v", err)
	}
}
