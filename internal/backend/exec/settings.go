package exec

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"
	"golang.org/x/sys/unix"

	"github.com/activator/activator/internal/backend/exec/shim"
	"github.com/activator/activator/internal/registry"
)

// DefaultStopGrace is how long Sleep waits after the stop signal before it sends SIGKILL.
const DefaultStopGrace = 10 * time.Second

// ListenMode says how the child learns where to listen.
type ListenMode string

const (
	// ListenEnv passes the route's upstream in the environment: PORT and HOST for a TCP upstream, SOCKET
	// for a unix one.
	ListenEnv ListenMode = "env"
	// ListenFDs pre-binds the upstream in the backend and hands it to the child as fd 3 with the systemd
	// socket-activation protocol (LISTEN_FDS=1, LISTEN_PID, LISTEN_FDNAMES).
	ListenFDs ListenMode = "listen_fds"
	// ListenNone passes nothing: argv already says where to listen.
	ListenNone ListenMode = "none"
)

// SleepMode is what Sleep does to the tenant.
type SleepMode string

const (
	// SleepStop stops the tenant: stop signal, SIGKILL after the stop grace, then its whole cgroup.
	SleepStop SleepMode = "stop"
	// SleepFreeze freezes the tenant's cgroup (cgroup.freeze); Wake thaws it. Needs cgroup containment.
	SleepFreeze SleepMode = "freeze"
)

// Limits are the cgroup v2 limits of a tenant, each the exact text written to its control file, or ""
// when the route sets none. Each needs its controller enabled for the activator's cgroup_root.
type Limits struct {
	Memory string // memory.max: bytes, or "max"
	CPU    string // cpu.max: "QUOTA PERIOD" in microseconds, or "max PERIOD"
	Pids   string // pids.max: a count, or "max"
}

// cpuPeriod is the cpu.max period cpu_max is written with, in microseconds (the kernel's default).
const cpuPeriod = 100000

// Settings is one route's validated `exec:` block, as Decode returns it (a *Settings in
// registry.Route.Settings). It is immutable once decoded.
type Settings struct {
	// Argv is the command as configured; Argv[0] is passed to the child unchanged.
	Argv []string
	// Path is the absolute path of the executable Argv[0] resolved to at decode time.
	Path string
	// Env holds extra variables, added to the activator's own environment.
	Env map[string]string
	// Dir is the child's working directory ("" = the activator's).
	Dir string
	// ReadyMarker, when not empty, must appear in a line of the child's stdout or stderr before Wake
	// returns.
	ReadyMarker string
	// StopSignal is sent to the child's process group by Sleep (default SIGTERM).
	StopSignal syscall.Signal
	// StopGrace is how long Sleep waits after StopSignal before SIGKILL (default 10s; 0 = SIGKILL at once).
	StopGrace time.Duration
	// Listen is how the child learns its address (default ListenEnv).
	Listen ListenMode
	// Sleep is what Sleep does (default SleepStop).
	Sleep SleepMode
	// Limits are the tenant's cgroup limits (memory_max, cpu_max, pids_max).
	Limits Limits
	// Standby starts the next child ahead, with the route (Prepare) and at each sleep, stopped before
	// its exec (standby.go): a wake only lets it go on. Needs sleep: stop.
	Standby bool
}

// rawSettings is the YAML shape of the block. Durations and signals are strings so that every problem
// can be reported with its key.
type rawSettings struct {
	Argv        []string          `yaml:"argv"`
	Env         map[string]string `yaml:"env"`
	Dir         string            `yaml:"dir"`
	ReadyMarker string            `yaml:"ready_marker"`
	StopSignal  string            `yaml:"stop_signal"`
	StopGrace   string            `yaml:"stop_grace"`
	Listen      string            `yaml:"listen"`
	Sleep       string            `yaml:"sleep"`
	MemoryMax   string            `yaml:"memory_max"`
	CPUMax      string            `yaml:"cpu_max"`
	PidsMax     string            `yaml:"pids_max"`
	Standby     bool              `yaml:"standby"`
}

// problems collects *registry.Error values with keys relative to the exec block.
type problems struct {
	list  []error
	lines map[string]int // key -> line of its value
	block int            // line of the block itself
}

func (p *problems) add(key string, format string, args ...any) {
	line, ok := p.lines[key]
	if !ok {
		// "argv[1]" or "env.PORT" without a line of their own fall back to their parent key's line.
		parent, _, _ := strings.Cut(key, "[")
		parent, _, _ = strings.Cut(parent, ".")
		line, ok = p.lines[parent]
		if !ok {
			line = p.block
		}
	}
	p.list = append(p.list, &registry.Error{Key: key, Line: line, Err: fmt.Errorf(format, args...)})
}

// Decode is the exec backing's registry.SettingsDecoder: it decodes the route's `exec:` block strictly,
// validates every key against the route and the host (the executable must exist and be executable, dir
// must exist), applies defaults and returns a *Settings. Every problem is reported, each as a
// *registry.Error whose Key is relative to the block ("argv", "argv[0]", "env.PORT", "stop_signal").
func Decode(r *registry.Route, node *yaml.Node) (any, error) {
	p := &problems{lines: map[string]int{}}
	if node != nil {
		p.block = node.Line
	}
	if node != nil && node.Kind == yaml.DocumentNode && len(node.Content) == 1 {
		node = node.Content[0]
	}
	var raw rawSettings
	if node != nil {
		if node.Kind != yaml.MappingNode {
			p.add("", "must be a mapping with at least argv")
			return nil, errors.Join(p.list...)
		}
		if !shapeOK(p, node) {
			return nil, errors.Join(p.list...)
		}
		if err := registry.DecodeStrict(node, &raw); err != nil {
			return nil, err
		}
	}

	s := &Settings{
		Argv:        raw.Argv,
		Env:         raw.Env,
		Dir:         raw.Dir,
		ReadyMarker: raw.ReadyMarker,
		StopSignal:  syscall.SIGTERM,
		StopGrace:   DefaultStopGrace,
		Listen:      ListenEnv,
		Sleep:       SleepStop,
		Standby:     raw.Standby,
	}

	// dir first: a relative argv[0] with a slash is resolved against it.
	dirOK := true
	if s.Dir != "" {
		if err := checkDir(s.Dir); err != nil {
			p.add("dir", "%v", err)
			dirOK = false
		}
		s.Dir = filepath.Clean(s.Dir)
	}

	// env before argv: a PATH set there is where argv[0] is looked up.
	for _, k := range sortedKeys(s.Env) {
		key := "env." + k
		switch {
		case k == "":
			p.add("env", "empty variable name")
		case strings.ContainsAny(k, "=\x00"):
			p.add(key, "variable name %q must not contain '=' or NUL", k)
		case strings.Contains(s.Env[k], "\x00"):
			p.add(key, "value must not contain NUL")
		case k == shim.Env || k == shim.GateEnv:
			// The shim reads them, and removes them, before the tenant runs: set here, they would
			// make a route without a shim run the activator's own binary as one, or a shim read the
			// listening socket as its gate.
			p.add(key, "reserved for the activator's exec shim; remove it")
		}
	}

	switch {
	case len(s.Argv) == 0:
		p.add("argv", "missing: the command to run, as a list such as [\"/usr/bin/app\", \"--port\", \"8080\"] (no shell is used)")
	case s.Argv[0] == "":
		p.add("argv[0]", "empty: the executable to run")
	case dirOK || filepath.IsAbs(s.Argv[0]) || !strings.Contains(s.Argv[0], "/"):
		path, err := resolve(s.Argv[0], s.Dir, s.Env)
		if err != nil {
			p.add("argv[0]", "%v", err)
		}
		s.Path = path
	}
	for i, a := range s.Argv {
		if strings.Contains(a, "\x00") {
			p.add(fmt.Sprintf("argv[%d]", i), "must not contain NUL")
		}
	}

	if strings.ContainsAny(s.ReadyMarker, "\r\n") {
		p.add("ready_marker", "must be one line: it is matched within a line of output")
	}

	if raw.StopSignal != "" {
		sig, err := parseSignal(raw.StopSignal)
		if err != nil {
			p.add("stop_signal", "%v", err)
		}
		s.StopSignal = sig
	}

	if raw.StopGrace != "" {
		d, err := parseGrace(raw.StopGrace)
		if err != nil {
			p.add("stop_grace", "%v", err)
		}
		s.StopGrace = d
	}

	switch ListenMode(raw.Listen) {
	case "":
	case ListenEnv, ListenFDs, ListenNone:
		s.Listen = ListenMode(raw.Listen)
	default:
		p.add("listen", "%q is not a listen mode (one of: env, listen_fds, none)", raw.Listen)
	}
	if r != nil && s.Listen == ListenEnv {
		for _, k := range envListenKeys(r.Upstream) {
			if _, ok := s.Env[k]; ok {
				p.add("env."+k, "set by `listen: env` from the route's upstream %s; remove it, or use `listen: none` and say where to listen in argv or env", r.Upstream)
			}
		}
	}
	if s.Listen == ListenFDs {
		for _, k := range []string{"LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"} {
			if _, ok := s.Env[k]; ok {
				p.add("env."+k, "set by `listen: listen_fds`; remove it")
			}
		}
	}

	switch SleepMode(raw.Sleep) {
	case "":
	case SleepStop, SleepFreeze:
		s.Sleep = SleepMode(raw.Sleep)
	default:
		p.add("sleep", "%q is not a sleep mode (one of: stop, freeze)", raw.Sleep)
	}
	if s.Standby && s.Sleep != SleepStop {
		p.add("standby", "true needs sleep: stop (a frozen tenant keeps its processes, so there is no next one to start ahead; sleep is %s)", s.Sleep)
	}
	s.Limits = decodeLimits(p, raw)

	if len(p.list) > 0 {
		// In file order, whatever order the checks ran in.
		slices.SortStableFunc(p.list, func(a, b error) int { return a.(*registry.Error).Line - b.(*registry.Error).Line })
		return nil, errors.Join(p.list...)
	}
	return s, nil
}

// decodeLimits checks memory_max, cpu_max and pids_max and turns each into its control file's text.
func decodeLimits(p *problems, raw rawSettings) Limits {
	var l Limits
	switch v := raw.MemoryMax; v {
	case "", "max":
		l.Memory = v
	default:
		n, err := registry.ParseByteSize(v)
		switch {
		case err != nil:
			p.add("memory_max", "%q is not a size (e.g. 512MiB, 2GiB) or \"max\"", v)
		case n == 0:
			p.add("memory_max", "must be positive, got 0 (or \"max\" for no limit)")
		default:
			l.Memory = strconv.FormatInt(n, 10)
		}
	}
	switch v := raw.CPUMax; v {
	case "":
	case "max":
		l.CPU = fmt.Sprintf("max %d", cpuPeriod)
	default:
		cpus, err := strconv.ParseFloat(v, 64)
		if quota := cpus * cpuPeriod; err != nil || quota < 100 || quota > 1e12 {
			p.add("cpu_max", "%q is not a number of CPUs above 0.001, such as 0.5 or 2 (or \"max\")", v)
		} else {
			l.CPU = fmt.Sprintf("%d %d", int64(quota), cpuPeriod)
		}
	}
	switch v := raw.PidsMax; v {
	case "", "max":
		l.Pids = v
	default:
		if n, err := strconv.ParseInt(v, 10, 64); err != nil || n <= 0 {
			p.add("pids_max", "%q is not a positive whole number of processes (or \"max\")", v)
		} else {
			l.Pids = strconv.FormatInt(n, 10)
		}
	}
	return l
}

// shapeOK records the line of each key and reports argv and env of the wrong YAML kind with their key
// (a strict decode would report them without one).
func shapeOK(p *problems, node *yaml.Node) bool {
	ok := true
	for i := 0; i+1 < len(node.Content); i += 2 {
		k, v := node.Content[i], node.Content[i+1]
		p.lines[k.Value] = k.Line
		switch k.Value {
		case "argv":
			if v.Kind == yaml.SequenceNode {
				for j, c := range v.Content {
					p.lines[fmt.Sprintf("argv[%d]", j)] = c.Line
				}
				continue
			}
			if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
				continue // reported as missing
			}
			p.add("argv", "must be a list, such as [\"/usr/bin/app\", \"--port\", \"8080\"]: no shell is used to split a string")
			ok = false
		case "env":
			if v.Kind == yaml.MappingNode {
				for j := 0; j+1 < len(v.Content); j += 2 {
					p.lines["env."+v.Content[j].Value] = v.Content[j].Line
				}
				continue
			}
			if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
				continue
			}
			p.add("env", "must be a mapping of variable names to values")
			ok = false
		}
	}
	return ok
}

// resolve finds the executable argv0 names: a name without a slash is looked up in PATH (the env
// block's PATH if it sets one, else the activator's); a relative path with a slash is taken relative
// to dir (or the activator's working directory).
func resolve(argv0, dir string, env map[string]string) (string, error) {
	if !strings.Contains(argv0, "/") {
		pathVar, ok := env["PATH"]
		if !ok {
			pathVar = os.Getenv("PATH")
		}
		for _, d := range filepath.SplitList(pathVar) {
			if d == "" || !filepath.IsAbs(d) {
				continue // never resolve through the current directory
			}
			c := filepath.Join(d, argv0)
			if checkExecutable(c) == nil {
				return c, nil
			}
		}
		return "", fmt.Errorf("%q not found in PATH (%s)", argv0, pathVar)
	}
	path := argv0
	if !filepath.IsAbs(path) {
		base := dir
		if base == "" {
			wd, err := os.Getwd()
			if err != nil {
				return "", fmt.Errorf("resolve %q: %w", argv0, err)
			}
			base = wd
		}
		path = filepath.Join(base, path)
	}
	if err := checkExecutable(path); err != nil {
		return "", err
	}
	return path, nil
}

// checkDir reports why dir cannot be a tenant's working directory, naming it.
func checkDir(dir string) error {
	switch fi, err := os.Stat(dir); {
	case !filepath.IsAbs(dir):
		return fmt.Errorf("%q must be an absolute path", dir)
	case err != nil:
		return fmt.Errorf("%q: %v", dir, unwrapPathError(err))
	case !fi.IsDir():
		return fmt.Errorf("%q is not a directory", dir)
	}
	return nil
}

// checkExecutable reports why path cannot be executed, naming it.
func checkExecutable(path string) error {
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return fmt.Errorf("%q: %v", path, unwrapPathError(err))
	case fi.IsDir():
		return fmt.Errorf("%q is a directory, not an executable", path)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("%q is not a regular file", path)
	case fi.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("%q is not executable (mode %v)", path, fi.Mode().Perm())
	}
	if err := unix.Access(path, unix.X_OK); err != nil {
		return fmt.Errorf("%q is not executable by the activator: %v", path, err)
	}
	return nil
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// parseSignal accepts "TERM", "SIGTERM", "sigterm", ...
func parseSignal(s string) (syscall.Signal, error) {
	name := strings.ToUpper(strings.TrimSpace(s))
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	sig := unix.SignalNum(name)
	if sig == 0 {
		return syscall.SIGTERM, fmt.Errorf("%q is not a signal name (such as TERM, INT, QUIT, HUP, USR1)", s)
	}
	return sig, nil
}

func parseGrace(s string) (time.Duration, error) {
	if s == "0" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return DefaultStopGrace, fmt.Errorf("%q is not a duration (use a unit, as in \"10s\" or \"1m\")", s)
	}
	if d < 0 {
		return DefaultStopGrace, fmt.Errorf("%q is negative", s)
	}
	return d, nil
}

// envListenKeys are the variables `listen: env` sets for an upstream.
func envListenKeys(u registry.Upstream) []string {
	switch u.Network {
	case "tcp":
		return []string{"HOST", "PORT"}
	case "unix":
		return []string{"SOCKET"}
	}
	return nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

var _ registry.HostChecker = (*Settings)(nil)

// CheckHost implements registry.HostChecker: dir is still a directory and argv[0] still resolves, to
// the same executable, as when s was decoded. Each directory and each lookup is asked of the host once
// per load (c).
func (s *Settings) CheckHost(c *registry.HostCache) error {
	if s.Dir != "" {
		if _, err := c.Do("exec.dir\x00"+s.Dir, func() (string, error) { return "", checkDir(s.Dir) }); err != nil {
			return fmt.Errorf("dir: %w", err)
		}
	}
	pathVar, ok := s.Env["PATH"]
	if !ok {
		pathVar = os.Getenv("PATH")
	}
	path, err := c.Do("exec.resolve\x00"+s.Argv[0]+"\x00"+s.Dir+"\x00"+pathVar, func() (string, error) { return resolve(s.Argv[0], s.Dir, s.Env) })
	if err != nil {
		return err
	}
	if path != s.Path {
		return fmt.Errorf("argv[0] %q resolves to %s now, not %s", s.Argv[0], path, s.Path)
	}
	return nil
}
