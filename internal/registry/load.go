package registry

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Defaults applied where a route leaves a key out.
const (
	DefaultListen      = "127.0.0.1:8080"
	DefaultAdmin       = "127.0.0.1:9090"
	DefaultWakeBudget  = 60 * time.Second
	DefaultSleepBudget = 30 * time.Second
	DefaultIdle        = 15 * time.Minute
	DefaultMaxHeld     = 10000
	// DefaultMaxUpstreamConns: enough for any small tenant's concurrency, few enough that a herd of
	// 10,000 released at once does not become 10,000 dials to a tenant that has just started.
	DefaultMaxUpstreamConns = 256
	DefaultProbeTimeout     = 2 * time.Second
	DefaultInterval         = time.Second
	DefaultBackoff          = time.Second
	DefaultBackoffMax       = time.Minute
)

// fileConfig is the file's top level, decoded strictly.
type fileConfig struct {
	Listen string      `yaml:"listen"`
	Admin  string      `yaml:"admin"`
	Routes []yaml.Node `yaml:"routes"`
}

// routeKeys is a route's common keys. The backing's settings sit beside them under the backing's name.
type routeKeys struct {
	Name        string    `yaml:"name"`
	Hosts       []string  `yaml:"hosts"`
	Host        string    `yaml:"host"`
	PathPrefix  string    `yaml:"path_prefix"`
	Backing     string    `yaml:"backing"`
	Upstream    string    `yaml:"upstream"`
	MaxUpConns  int       `yaml:"max_upstream_conns"`
	Health      healthKey `yaml:"health"`
	Idle        *Duration `yaml:"idle"`
	WakeBudget  Duration  `yaml:"wake_budget"`
	SleepBudget Duration  `yaml:"sleep_budget"`
	Hold        struct {
		MaxRequests int      `yaml:"max_requests"`
		MaxTime     Duration `yaml:"max_time"`
	} `yaml:"hold"`
	Backoff struct {
		Initial Duration `yaml:"initial"`
		Max     Duration `yaml:"max"`
	} `yaml:"backoff"`
}

type healthKey struct {
	Path     string   `yaml:"path"`
	Status   string   `yaml:"status"`
	Interval Duration `yaml:"interval"`
	Timeout  Duration `yaml:"timeout"`
	Passes   int      `yaml:"passes"`
	Budget   Duration `yaml:"budget"`
}

var (
	nameRE  = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	labelRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
)

// LoadFile reads and validates a config file. See Load.
func LoadFile(path string, backings map[string]SettingsDecoder) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Load(data, backings)
}

// Load parses and validates a configuration. backings maps each backing name this build supports to
// the decoder of its settings. On failure the error joins one *Error per problem found (use Errors to
// list them); Load never stops at the first.
func Load(data []byte, backings map[string]SettingsDecoder) (*Config, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		var l errs
		for _, e := range yamlErrors(err) {
			l.list = append(l.list, e)
		}
		return nil, l.err()
	}
	// A problem in the top-level keys does not stop the routes from being checked: the operator gets
	// the whole list at once.
	var l errs
	var fc fileConfig
	if err := DecodeStrict(&doc, &fc); err != nil {
		l.addErr("", "", 0, err)
	}
	topBad := badRoots(l.list)
	cfg := &Config{Listen: fc.Listen, Admin: fc.Admin}
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if cfg.Admin == "" {
		cfg.Admin = DefaultAdmin
	}
	if len(fc.Routes) == 0 && !topBad["routes"] {
		l.add("", "routes", 0, "no routes configured")
	}
	names := map[string]int{}
	hosts := map[string]string{}
	for i := range fc.Routes {
		r := loadRoute(&l, &fc.Routes[i], i, backings)
		if r == nil {
			continue
		}
		if prev, dup := names[r.Name]; dup {
			l.add(r.Name, "name", KeyLine(&fc.Routes[i], "name"), "duplicate route name (also route #%d)", prev+1)
			continue
		}
		names[r.Name] = i
		for _, h := range r.Hosts {
			k := h + r.PathPrefix
			if other, dup := hosts[k]; dup {
				l.add(r.Name, "hosts", KeyLine(&fc.Routes[i], "hosts"), "host %q with path prefix %q is already routed to %q", h, r.PathPrefix, other)
				continue
			}
			hosts[k] = r.Name
		}
		cfg.Routes = append(cfg.Routes, r)
	}
	if len(l.list) > 0 {
		return nil, l.err()
	}
	return cfg, nil
}

// loadRoute decodes and validates one route, adding its problems to l. It returns nil when the route is
// unusable.
func loadRoute(l *errs, n *yaml.Node, idx int, backings map[string]SettingsDecoder) *Route {
	if n.Kind != yaml.MappingNode {
		l.add(fmt.Sprintf("#%d", idx+1), "", n.Line, "a route must be a mapping")
		return nil
	}
	// Split the common keys from the backing's block so each is decoded strictly by its owner.
	var name string
	common := &yaml.Node{Kind: yaml.MappingNode, Line: n.Line}
	blocks := map[string]*yaml.Node{}
	blockLines := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Value == "name" {
			name = v.Value
		}
		if _, ok := backings[k.Value]; ok || isKnownBacking(k.Value) {
			blocks[k.Value] = v
			blockLines[k.Value] = k.Line
			continue
		}
		common.Content = append(common.Content, k, v)
	}
	label := name
	if label == "" {
		label = fmt.Sprintf("#%d", idx+1)
	}
	// The route's keys that did decode are still checked, so one bad value does not hide the rest;
	// checks of a key that already failed to decode are dropped at the end (a "5 seconds" wake_budget
	// is reported once, not again as whatever its default then trips).
	at := func(key string) int { return KeyLine(n, key) }
	bad := len(l.list)
	var rk routeKeys
	if err := DecodeStrict(common, &rk); err != nil {
		l.addErr(label, "", n.Line, err)
	}
	undecoded := badRoots(l.list[bad:])
	decodeErrs := len(l.list)
	r := &Route{Name: rk.Name, Backing: rk.Backing, PathPrefix: rk.PathPrefix}
	switch {
	case rk.Name == "":
		l.add(label, "name", at("name"), "missing")
	case !nameRE.MatchString(rk.Name):
		l.add(label, "name", at("name"), "%q is not a valid route name (lower-case letters, digits, '-' and '_', at most 63)", rk.Name)
	}

	// Hosts.
	type hostAt struct {
		name, key string
	}
	var hs []hostAt
	if rk.Host != "" {
		hs = append(hs, hostAt{rk.Host, "host"})
	}
	for i, h := range rk.Hosts {
		hs = append(hs, hostAt{h, fmt.Sprintf("hosts[%d]", i)})
	}
	if len(hs) == 0 {
		l.add(label, "hosts", at("hosts"), "missing: a route needs at least one host")
	}
	seen := map[string]bool{}
	for _, ha := range hs {
		h := strings.ToLower(strings.TrimSpace(ha.name))
		if err := checkHost(h); err != nil {
			l.add(label, "hosts", at(ha.key), "%v", err)
			continue
		}
		if seen[h] {
			l.add(label, "hosts", at(ha.key), "host %q listed twice", h)
			continue
		}
		seen[h] = true
		r.Hosts = append(r.Hosts, h)
	}
	if r.PathPrefix != "" && !strings.HasPrefix(r.PathPrefix, "/") {
		l.add(label, "path_prefix", at("path_prefix"), "%q must start with /", r.PathPrefix)
	}
	r.PathPrefix = strings.TrimSuffix(r.PathPrefix, "/")

	// Upstream.
	if rk.Upstream == "" {
		l.add(label, "upstream", at("upstream"), "missing: where does the woken tenant listen? (host:port or unix:/path)")
	} else if u, err := ParseUpstream(rk.Upstream); err != nil {
		l.add(label, "upstream", at("upstream"), "%v", err)
	} else {
		r.Upstream = u
	}

	// Timing.
	r.WakeBudget = orDefault(rk.WakeBudget.D(), DefaultWakeBudget)
	r.SleepBudget = orDefault(rk.SleepBudget.D(), DefaultSleepBudget)
	r.Idle = DefaultIdle
	if rk.Idle != nil {
		r.Idle = rk.Idle.D()
	}
	r.MaxUpstreamConns = rk.MaxUpConns
	if r.MaxUpstreamConns == 0 {
		r.MaxUpstreamConns = DefaultMaxUpstreamConns
	} else if r.MaxUpstreamConns < 0 {
		l.add(label, "max_upstream_conns", at("max_upstream_conns"), "must be positive, got %d", r.MaxUpstreamConns)
	}
	r.Hold.MaxRequests = rk.Hold.MaxRequests
	if r.Hold.MaxRequests == 0 {
		r.Hold.MaxRequests = DefaultMaxHeld
	} else if r.Hold.MaxRequests < 0 {
		l.add(label, "hold.max_requests", at("hold.max_requests"), "must be positive, got %d", r.Hold.MaxRequests)
	}
	// Default: long enough to see the wake fail with its cause (budget plus stopping the unhealthy
	// tenant) rather than a bare 504 racing the wake deadline.
	r.Hold.MaxTime = orDefault(rk.Hold.MaxTime.D(), r.WakeBudget+r.SleepBudget)
	r.Backoff.Initial = orDefault(rk.Backoff.Initial.D(), DefaultBackoff)
	r.Backoff.Max = orDefault(rk.Backoff.Max.D(), DefaultBackoffMax)
	if r.Backoff.Max < r.Backoff.Initial {
		l.add(label, "backoff.max", at("backoff.max"), "%v is shorter than backoff.initial %v", r.Backoff.Max, r.Backoff.Initial)
	}

	// Health.
	h := rk.Health
	r.Health = Health{
		Path:      h.Path,
		MinStatus: 200,
		MaxStatus: 399,
		Interval:  orDefault(h.Interval.D(), DefaultInterval),
		Timeout:   orDefault(h.Timeout.D(), DefaultProbeTimeout),
		Passes:    h.Passes,
		Budget:    h.Budget.D(),
	}
	if r.Health.Path == "" {
		r.Health.Path = "/"
	} else if !strings.HasPrefix(r.Health.Path, "/") {
		l.add(label, "health.path", at("health.path"), "%q must start with /", h.Path)
	}
	if r.Health.Passes == 0 {
		r.Health.Passes = 1
	} else if r.Health.Passes < 0 {
		l.add(label, "health.passes", at("health.passes"), "must be positive, got %d", h.Passes)
	}
	if h.Status != "" {
		lo, hi, err := parseStatusRange(h.Status)
		if err != nil {
			l.add(label, "health.status", at("health.status"), "%v", err)
		}
		r.Health.MinStatus, r.Health.MaxStatus = lo, hi
	}
	if r.Health.Budget > r.WakeBudget && !undecoded["wake_budget"] {
		l.add(label, "health.budget", at("health.budget"), "%v exceeds wake_budget %v", r.Health.Budget, r.WakeBudget)
	}

	// Backing.
	switch dec, ok := backings[rk.Backing]; {
	case rk.Backing == "":
		l.add(label, "backing", at("backing"), "missing (one of: %s)", strings.Join(backingNames(backings), ", "))
	case !ok:
		l.add(label, "backing", at("backing"), "%q is not available in this build (one of: %s)", rk.Backing, strings.Join(backingNames(backings), ", "))
	default:
		for k := range blocks {
			if k != rk.Backing {
				l.add(label, k, blockLines[k], "settings for backing %q, but the route's backing is %q", k, rk.Backing)
			}
		}
		if len(l.list) == bad {
			settings, err := dec(r, blocks[rk.Backing])
			if err != nil {
				line := blockLines[rk.Backing]
				if line == 0 {
					line = at("backing") // no block at all: point at the backing it is missing for
				}
				l.addErr(label, rk.Backing, line, err)
			}
			r.Settings = settings
		}
	}
	if len(l.list) > bad {
		if len(undecoded) > 0 {
			kept := l.list[:decodeErrs]
			for _, e := range l.list[decodeErrs:] {
				if !undecoded[rootKey(e)] {
					kept = append(kept, e)
				}
			}
			l.list = kept
		}
		return nil
	}
	return r
}

// badRoots returns the first segment of each problem's key ("health" for "health.interval", "hosts" for
// "hosts[1]").
func badRoots(list []error) map[string]bool {
	m := map[string]bool{}
	for _, e := range list {
		if k := rootKey(e); k != "" {
			m[k] = true
		}
	}
	return m
}

func rootKey(err error) string {
	var e *Error
	if !errors.As(err, &e) {
		return ""
	}
	k := e.Key
	if i := strings.IndexAny(k, ".["); i >= 0 {
		k = k[:i]
	}
	return k
}

// KeyLine returns the line of a dotted key below the mapping n ("health.status", "hosts[1]"): the
// deepest part of it that is present, or n's own line when the key is absent altogether (0 for a nil
// n). Settings decoders use it to give their errors a line.
func KeyLine(n *yaml.Node, key string) int {
	if n == nil {
		return 0
	}
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	line := n.Line
	for _, part := range strings.Split(key, ".") {
		name, idx := part, -1
		if i := strings.IndexByte(part, '['); i >= 0 && strings.HasSuffix(part, "]") {
			name = part[:i]
			if v, err := strconv.Atoi(part[i+1 : len(part)-1]); err == nil {
				idx = v
			}
		}
		if n.Kind != yaml.MappingNode {
			return line
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == name {
				line, next = n.Content[i].Line, n.Content[i+1]
				break
			}
		}
		if next == nil {
			return line
		}
		n = next
		if idx >= 0 {
			if n.Kind != yaml.SequenceNode || idx >= len(n.Content) {
				return line
			}
			n = n.Content[idx]
			line = n.Line
		}
	}
	return line
}

// isKnownBacking names the backings the project has, so that a settings block for one this build
// lacks is reported as such rather than as an unknown key.
func isKnownBacking(k string) bool {
	switch k {
	case "exec", "unit", "kvm", "redfish":
		return true
	}
	return false
}

func backingNames(m map[string]SettingsDecoder) []string {
	var out []string
	for _, k := range []string{"exec", "unit", "kvm", "redfish"} {
		if _, ok := m[k]; ok {
			out = append(out, k)
		}
	}
	return out
}

func checkHost(h string) error {
	if h == "" {
		return fmt.Errorf("empty host")
	}
	rest := h
	if strings.HasPrefix(h, "*.") {
		rest = h[2:]
	}
	if strings.Contains(rest, "*") {
		return fmt.Errorf("host %q: a wildcard may only be the leading label, as in *.example.com", h)
	}
	if strings.Contains(rest, ":") {
		return fmt.Errorf("host %q: leave the port out; hosts match whatever port the edge listens on", h)
	}
	for _, lab := range strings.Split(rest, ".") {
		if !labelRE.MatchString(lab) {
			return fmt.Errorf("host %q is not a valid DNS name", h)
		}
	}
	return nil
}

func parseStatusRange(s string) (int, int, error) {
	lo, hi, ok := strings.Cut(s, "-")
	if !ok {
		hi = lo
	}
	a, err1 := strconv.Atoi(strings.TrimSpace(lo))
	b, err2 := strconv.Atoi(strings.TrimSpace(hi))
	if err1 != nil || err2 != nil || a < 100 || b > 599 || a > b {
		return 200, 399, fmt.Errorf("%q is not a status range such as \"200-399\" or \"204\"", s)
	}
	return a, b, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}
