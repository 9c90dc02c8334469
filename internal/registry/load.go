package registry

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
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
	// DefaultResponseTimeout bounds the wait for a tenant's answer head: long enough for a slow
	// report or a model's unstreamed answer, short enough that a hung request ends and lets its tenant
	// sleep.
	DefaultResponseTimeout = 5 * time.Minute
	DefaultMaxHeld         = 10000
	// DefaultMaxUpstreamConns: enough for any small tenant's concurrency, few enough that a herd of
	// 10,000 released at once does not become 10,000 dials to a tenant that has just started.
	DefaultMaxUpstreamConns = 256
	DefaultProbeTimeout     = 2 * time.Second
	DefaultInterval         = time.Second
	DefaultBackoff          = time.Second
	DefaultBackoffMax       = time.Minute
	DefaultMaxBody          = 100 * miB
	DefaultFailFastAfter    = 3

	DefaultShutdownGrace    = 30 * time.Second
	DefaultHeaderTimeout    = 10 * time.Second
	DefaultBodyTimeout      = 30 * time.Second
	DefaultKeepAliveTimeout = 2 * time.Minute
	// DefaultSendTimeout is edge.send_timeout's default, nginx's send_timeout: a client this slow to
	// take 16 KiB of an answer is gone, and it holds an upstream connection slot of its route.
	DefaultSendTimeout = time.Minute
	// DefaultTunnelTimeout is edge.tunnel_timeout's default, HAProxy's common `timeout tunnel`: a
	// WebSocket silent this long both ways has nobody at one end, and keeps its tenant awake.
	DefaultTunnelTimeout  = time.Hour
	DefaultMaxHeaderBytes = 32 * kiB
	// DefaultMaxHeldTotal is edge.max_held, across all routes; DefaultMaxHeld is one route's.
	DefaultMaxHeldTotal = 20000
	DefaultMaxHeldBytes = 256 * miB
	DefaultBodyMemory   = 64 * kiB
	// DefaultMaxSpillBytes is edge.max_spill_bytes: ten of the default max_body's uploads at once.
	DefaultMaxSpillBytes = 1 << 30
)

// Bounds of the edge's sizes, and of its tunnel_timeout.
const (
	// minTunnelTimeout: a shorter tunnel_timeout would close WebSockets between their messages.
	minTunnelTimeout = time.Second
	minHeaderBytes   = 1 * kiB
	maxHeaderBytes   = 1 * miB
	maxBodyMemory    = 16 * miB
)

// fileConfig is the file's top level, decoded strictly.
type fileConfig struct {
	Listen        string            `yaml:"listen"`
	Admin         string            `yaml:"admin"`
	ShutdownGrace *Duration         `yaml:"shutdown_grace"`
	CgroupRoot    string            `yaml:"cgroup_root"`
	Edge          edgeKeys          `yaml:"edge"`
	ListenTLS     string            `yaml:"listen_tls"`
	RedirectHTTP  bool              `yaml:"redirect_http"`
	TLS           tlsKeys           `yaml:"tls"`
	Trusted       []string          `yaml:"trusted_proxies"`
	ProxyProtocol proxyProtocolKeys `yaml:"proxy_protocol"`
	Routes        []yaml.Node       `yaml:"routes"`
	Instances     []yaml.Node       `yaml:"instances"` // routes without hosts (chain.go)
	AdminKeys     adminKeys         `yaml:",inline"`   // admin_socket, admin_token_file, … (admin.go)
}

// edgeKeys is the edge: block. Every key is a pointer, nil when left out, so that a zero the operator
// wrote is checked rather than taken for the default.
type edgeKeys struct {
	HeaderTimeout    *Duration `yaml:"header_timeout"`
	BodyTimeout      *Duration `yaml:"body_timeout"`
	KeepAliveTimeout *Duration `yaml:"keepalive_timeout"`
	SendTimeout      *Duration `yaml:"send_timeout"`
	TunnelTimeout    *Duration `yaml:"tunnel_timeout"`
	MaxHeaderBytes   *ByteSize `yaml:"max_header_bytes"`
	MaxHeld          *int      `yaml:"max_held"`
	MaxHeldBytes     *ByteSize `yaml:"max_held_bytes"`
	BodyMemory       *ByteSize `yaml:"body_memory"`
	BodyBufferDir    string    `yaml:"body_buffer_dir"`
	MaxSpillFiles    *int      `yaml:"max_spill_files"`
	MaxSpillBytes    *ByteSize `yaml:"max_spill_bytes"`
	TLSHandshake     *Duration `yaml:"tls_handshake_timeout"`
	MaxTLSHandshakes *int      `yaml:"max_tls_handshakes"`
	MaxConns         *int      `yaml:"max_conns"`
	EventLoops       *int      `yaml:"event_loops"`
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
	Buffering   *bool     `yaml:"request_buffering"`
	MaxBody     *ByteSize `yaml:"max_body"`
	Detailed    bool      `yaml:"detailed_errors"`
	Health      healthKey `yaml:"health"`
	Idle        *Duration `yaml:"idle"`
	RespTimeout *Duration `yaml:"response_timeout"`
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
	WaitingPage yaml.Node    `yaml:"waiting_page"` // true, false or {template: PATH}
	Ignore      ignoreKeys   `yaml:"ignore"`
	KeepWarm    []windowKeys `yaml:"keep_warm"`
	WakeAt      []yaml.Node  `yaml:"wake_at"`  // "cron spec" or {cron, time_zone}
	Requires    []string     `yaml:"requires"` // instance names (chain.go)
	Fleet       *fleetKeys   `yaml:"fleet"`    // nil when left out (fleet.go)
}

type healthKey struct {
	Path     string   `yaml:"path"`
	Host     string   `yaml:"host"`
	Status   string   `yaml:"status"`
	Interval Duration `yaml:"interval"`
	Timeout  Duration `yaml:"timeout"`
	Passes   int      `yaml:"passes"`
	Budget   Duration `yaml:"budget"`
	FailFast *int     `yaml:"fail_fast_after"`
	TCP      bool     `yaml:"tcp"`
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
	doc, err := parse(data)
	if err != nil {
		return nil, err
	}
	cfg, _, _, err := loadDoc(&doc, backings, nil)
	return cfg, err
}

// parse parses data into a document node; its syntax errors are *Errors with their lines.
func parse(data []byte) (yaml.Node, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		l := errs{list: yamlErrors(err)}
		for _, e := range l.list {
			if re := e.(*Error); re.Line == 0 {
				re.Line = syntaxLine(data, re.Err.Error())
			}
		}
		return doc, l.err()
	}
	return doc, nil
}

// loadDoc is Load after the parse. It also returns the usable entries, each with its final Route, and
// the own addresses the routes were checked against. cut is set for a Reloader's load by the cut
// (reuse.go), whose entries are not in doc; nil for a whole load. A load by the cut fails with
// errOwnChanged when it reuses Routes checked against other own addresses, and with errNoCut when
// one of its runs does not parse as its entries.
func loadDoc(doc *yaml.Node, backings map[string]SettingsDecoder, cut *cutLoad) (*Config, []entry, []ownAddr, error) {
	// A problem in the top-level keys does not stop the routes from being checked: the operator gets
	// the whole list at once.
	var l errs
	var fc fileConfig
	if err := DecodeStrict(doc, &fc); err != nil {
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
	top := topCheck{l: &l, doc: doc}
	own := top.checkListenTLS(fc.ListenTLS, top.checkAddrs(cfg.Listen, cfg.Admin))
	if cut != nil && cut.reuse != nil && !slices.Equal(own, cut.reuse.own) {
		return nil, nil, nil, errOwnChanged
	}
	cfg.ListenTLS, cfg.RedirectHTTP = fc.ListenTLS, fc.RedirectHTTP
	cfg.TLS = top.checkTLS(fc.ListenTLS, fc.RedirectHTTP, fc.TLS)
	cfg.TrustedProxies, cfg.ProxyProtocol = top.checkProxies(fc.Trusted, fc.ProxyProtocol, fc.ListenTLS)
	cfg.ShutdownGrace = top.duration("shutdown_grace", fc.ShutdownGrace, DefaultShutdownGrace)
	cfg.CgroupRoot = top.checkCgroupRoot(fc.CgroupRoot)
	cfg.Edge = top.checkEdge(fc.Edge)
	cfg.AdminAccess = top.checkAdmin(cfg.Admin, fc.AdminKeys)
	if len(fc.Routes) == 0 && !topBad["routes"] {
		l.add("", "routes", 0, "no routes configured")
	}
	ents, cutOK := loadEntries(&l, doc, &fc, backings, own, cut)
	if !cutOK {
		return nil, nil, nil, errNoCut
	}
	checkRequires(&l, ents)
	if len(l.list) > 0 {
		return nil, nil, nil, l.err()
	}
	for i := range ents {
		if !ents[i].reused { // a reused Route is compact already
			ents[i].r = compacted(ents[i].r)
		}
	}
	cfg.Routes, cfg.Instances = routesOf(ents)
	return cfg, ents, own, nil
}

// routesOf is the Routes and the Instances of a good load's entries, in file order.
func routesOf(ents []entry) (routes, instances []*Route) {
	for _, e := range ents {
		if e.r.Instance {
			instances = append(instances, e.r)
		} else {
			routes = append(routes, e.r)
		}
	}
	return routes, instances
}

// loadRoute decodes and validates one route, or one instance (an entry of instances:), adding every
// problem it has to l. own are the activator's own addresses, which its upstream must not be. It returns
// the entry with its route as far as it decoded and whether it is usable (it has no problems); the
// entry's route is nil when n is not even a mapping.
func loadRoute(l *errs, n *yaml.Node, idx int, instance bool, backings map[string]SettingsDecoder, own []ownAddr) entry {
	e := entry{idx: idx, label: routeLabel(n, idx)}
	if n.Kind != yaml.MappingNode {
		e.label = fmt.Sprintf("#%d", idx+1)
		what := "a route"
		if instance {
			what = "an instance"
		}
		l.add(e.label, "", n.Line, "%s must be a mapping", what)
		markInstance(l.list[len(l.list)-1:], instance)
		return e
	}
	common, blocks := splitBlocks(n, backings)
	c := &routeCheck{l: l, n: n, label: e.label, start: len(l.list), own: own}
	if err := DecodeStrict(common, &c.rk); err != nil {
		l.addErr(c.label, "", n.Line, err)
	}
	c.undecoded = errorKeys(l.list[c.start:])
	c.r = &Route{Name: c.rk.Name, Backing: c.rk.Backing, Instance: instance}
	// One checker per section, each reporting every problem in it. The order is the order of the
	// problems on a single line (a route written as one flow mapping).
	c.checkName()
	if instance {
		c.checkNoHosts()
	} else {
		c.checkHosts()
	}
	c.checkUpstream()
	c.checkBody()
	c.checkBudgets()
	c.checkHold()
	c.checkBackoff()
	c.checkHealth()
	if instance {
		c.checkNoPeople()
	} else {
		c.checkPeople()
	}
	c.checkSchedules()
	c.checkFleet(backings)
	c.checkBacking(blocks, backings)
	markInstance(l.list[c.start:], instance)
	e.r, e.ok, e.reqs = c.r, len(l.list) == c.start, c.requireKeys()
	e.withLines(n)
	return e
}

// block is a backing's settings block in a route: the mapping under the backing's name.
type block struct {
	node *yaml.Node
	line int // the line of the block's key
}

// splitBlocks separates a route's common keys from its backings' settings blocks, so that each is
// decoded strictly by its owner. A block is a key that names a backing of this build, or the route's own
// backing even when this build lacks it: that is reported once, at backing, not again as an unknown key.
func splitBlocks(n *yaml.Node, backings map[string]SettingsDecoder) (*yaml.Node, map[string]block) {
	own := ""
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == "backing" {
			own = n.Content[i+1].Value
		}
	}
	return splitByBacking(n, own, reflect.TypeFor[routeKeys](), backings)
}

// splitByBacking is splitBlocks for a mapping whose common keys are those of the struct type keys and
// whose own backing is own (a fleet member's is its route's).
func splitByBacking(n *yaml.Node, own string, keys reflect.Type, backings map[string]SettingsDecoder) (*yaml.Node, map[string]block) {
	if _, isCommon := fieldsOf(keys).types[own]; isCommon {
		own = ""
	}
	common := &yaml.Node{Kind: yaml.MappingNode, Line: n.Line, Content: make([]*yaml.Node, 0, len(n.Content))}
	blocks := map[string]block{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if _, ok := backings[k.Value]; ok || (own != "" && k.Value == own) {
			blocks[k.Value] = block{node: v, line: k.Line}
			continue
		}
		common.Content = append(common.Content, k, v)
	}
	return common, blocks
}

// routeLabel names a route in its problems: by its name, or by its position when it has none.
func routeLabel(n *yaml.Node, idx int) string {
	name := ""
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == "name" {
			name = n.Content[i+1].Value
		}
	}
	if name == "" {
		return fmt.Sprintf("#%d", idx+1)
	}
	return name
}

// routeCheck is one route under validation: its decoded common keys, the Route being built from them,
// and the keys that failed to decode. The keys that did decode are all checked, so one bad value hides
// nothing else; a check that would read a key that failed to decode is skipped, as it would see a default
// the operator never wrote (a "5 seconds" wake_budget is reported once, not again as whatever its
// default then trips).
type routeCheck struct {
	l         *errs
	n         *yaml.Node // the route's mapping
	label     string
	start     int             // len(l.list) before this route
	undecoded map[string]bool // full keys that failed to decode: "hosts[1]", "health.timeout", "hold"
	rk        routeKeys
	r         *Route
	own       []ownAddr  // the activator's own valid addresses: listen and admin
	members   []memberAt // a fleet's members, for checkBacking (fleet.go)
}

func (c *routeCheck) add(key string, line int, format string, args ...any) {
	c.l.add(c.label, key, line, format, args...)
}

// at returns the line of a dotted key of the route (see KeyLine).
func (c *routeCheck) at(key string) int { return KeyLine(c.n, key) }

// failed reports whether any of keys, or a section one of them sits in, failed to decode.
func (c *routeCheck) failed(keys ...string) bool {
	for _, k := range keys {
		for i := range len(k) {
			if (k[i] == '.' || k[i] == '[') && c.undecoded[k[:i]] {
				return true
			}
		}
		if c.undecoded[k] {
			return true
		}
	}
	return false
}

// failedBelow reports whether key or anything below it ("hosts[0]") failed to decode.
func (c *routeCheck) failedBelow(key string) bool {
	for k := range c.undecoded {
		if k == key || strings.HasPrefix(k, key+".") || strings.HasPrefix(k, key+"[") {
			return true
		}
	}
	return false
}

func (c *routeCheck) checkName() {
	switch name := c.rk.Name; {
	case c.failed("name"):
	case name == "":
		c.add("name", c.at("name"), "missing")
	case CheckName(name) != nil:
		c.add("name", c.at("name"), "%v", CheckName(name))
	}
}

// checkHosts checks host, every entry of hosts and path_prefix.
func (c *routeCheck) checkHosts() {
	type hostAt struct {
		name, key string
	}
	var hs []hostAt
	if c.rk.Host != "" {
		hs = append(hs, hostAt{c.rk.Host, "host"})
	}
	// Entries that failed to decode are missing from rk.Hosts: skip their positions to find each line.
	pos := 0
	for _, h := range c.rk.Hosts {
		for len(c.undecoded) > 0 && c.undecoded[fmt.Sprintf("hosts[%d]", pos)] {
			pos++
		}
		hs = append(hs, hostAt{h, fmt.Sprintf("hosts[%d]", pos)})
		pos++
	}
	if len(hs) == 0 && !c.failedBelow("hosts") {
		c.add("hosts", c.at("hosts"), "missing: a route needs at least one host")
	}
	seen := map[string]bool{}
	for _, ha := range hs {
		h := strings.ToLower(strings.TrimSpace(ha.name))
		if err := checkHost(h); err != nil {
			c.add("hosts", c.at(ha.key), "%v", err)
			continue
		}
		if seen[h] {
			c.add("hosts", c.at(ha.key), "host %q listed twice", h)
			continue
		}
		seen[h] = true
		c.r.Hosts = append(c.r.Hosts, h)
	}
	if p := c.rk.PathPrefix; p != "" && !strings.HasPrefix(p, "/") {
		c.add("path_prefix", c.at("path_prefix"), "%q must start with /", p)
	}
	c.r.PathPrefix = strings.TrimSuffix(c.rk.PathPrefix, "/")
}

// checkUpstream checks upstream and max_upstream_conns. A fleet has no upstream of its own: each
// member has one (checkFleet).
func (c *routeCheck) checkUpstream() {
	fleet := c.rk.Fleet != nil || c.failedBelow("fleet")
	switch u, err := ParseUpstream(c.rk.Upstream); {
	case c.failed("upstream"):
	case fleet && c.rk.Upstream != "":
		c.add("upstream", c.at("upstream"), "a fleet has no upstream of its own: each member has its own (fleet.members[N].upstream)")
	case fleet:
	case c.rk.Upstream == "":
		c.add("upstream", c.at("upstream"), "missing: where does the woken tenant listen? (host:port or unix:/path)")
	case err != nil:
		c.add("upstream", c.at("upstream"), "%v", err)
	default:
		c.r.Upstream = u
		c.checkNotOwn("upstream", u)
	}
	c.r.MaxUpstreamConns = c.rk.MaxUpConns
	if c.r.MaxUpstreamConns == 0 {
		c.r.MaxUpstreamConns = DefaultMaxUpstreamConns
	} else if c.r.MaxUpstreamConns < 0 {
		c.add("max_upstream_conns", c.at("max_upstream_conns"), "must be positive, got %d", c.r.MaxUpstreamConns)
	}
}

// checkNotOwn reports an upstream, at key, that is one of the activator's own addresses. A wildcard
// listen address (0.0.0.0, ::, or no host) counts as every address certainly local: loopback ones and
// localhost.
func (c *routeCheck) checkNotOwn(key string, u Upstream) {
	for _, a := range c.own {
		if !a.names(u) {
			continue
		}
		what := "requests would loop back to the edge"
		if a.key == "admin" {
			what = "requests would go to the admin API"
		}
		c.add(key, c.at(key), "upstream %s is the activator's own %s address %s: %s (where does the woken tenant listen?)", u, a.key, a.addr, what)
		return
	}
}

// checkBody applies request_buffering, max_body and detailed_errors, whose values need no check
// beyond decoding (which rejects a negative size; 0 means no limit).
func (c *routeCheck) checkBody() {
	c.r.RequestBuffering = valueOr(c.rk.Buffering, true)
	c.r.MaxBody = c.rk.MaxBody.or(DefaultMaxBody)
	c.r.DetailedErrors = c.rk.Detailed
}

// checkBudgets applies wake_budget, sleep_budget, idle and response_timeout. Their values need no
// check beyond decoding, which already rejects negative durations, but for a response_timeout under a
// millisecond.
func (c *routeCheck) checkBudgets() {
	c.r.WakeBudget = orDefault(c.rk.WakeBudget.D(), DefaultWakeBudget)
	c.r.SleepBudget = orDefault(c.rk.SleepBudget.D(), DefaultSleepBudget)
	c.r.Idle = DefaultIdle
	if c.rk.Idle != nil {
		c.r.Idle = c.rk.Idle.D()
	}
	c.r.ResponseTimeout = DefaultResponseTimeout
	if c.rk.RespTimeout != nil {
		c.r.ResponseTimeout = c.rk.RespTimeout.D()
		if d := c.r.ResponseTimeout; d > 0 && d < time.Millisecond {
			// Every request would get 504 before the tenant could answer (an operator trial set 1ns).
			c.add("response_timeout", c.at("response_timeout"), "%v is shorter than any answer: 0 for no bound, or at least 1ms", d)
		}
	}
}

// checkHold checks the hold block. It runs after checkBudgets, whose budgets make max_time's default.
func (c *routeCheck) checkHold() {
	c.r.Hold.MaxRequests = c.rk.Hold.MaxRequests
	if c.r.Hold.MaxRequests == 0 {
		c.r.Hold.MaxRequests = DefaultMaxHeld
	} else if c.r.Hold.MaxRequests < 0 {
		c.add("hold.max_requests", c.at("hold.max_requests"), "must be positive, got %d", c.r.Hold.MaxRequests)
	}
	// Default: long enough to see the wake fail with its cause (budget plus stopping the unhealthy
	// tenant) rather than a bare 504 racing the wake deadline.
	c.r.Hold.MaxTime = orDefault(c.rk.Hold.MaxTime.D(), c.r.WakeBudget+c.r.SleepBudget)
}

func (c *routeCheck) checkBackoff() {
	b := &c.r.Backoff
	b.Initial = orDefault(c.rk.Backoff.Initial.D(), DefaultBackoff)
	b.Max = orDefault(c.rk.Backoff.Max.D(), DefaultBackoffMax)
	if b.Max < b.Initial && !c.failed("backoff.initial", "backoff.max") {
		c.add("backoff.max", c.at("backoff.max"), "%v is shorter than backoff.initial %v", b.Max, b.Initial)
	}
}

// checkHealth checks the health block. It runs after checkBudgets, since the health budget must fit in
// the wake budget, and after checkHosts, whose first exact host is health.host's default.
func (c *routeCheck) checkHealth() {
	hk := c.rk.Health
	h := Health{
		Path:      hk.Path,
		Host:      hk.Host,
		MinStatus: 200,
		MaxStatus: 399,
		Interval:  orDefault(hk.Interval.D(), DefaultInterval),
		Timeout:   orDefault(hk.Timeout.D(), DefaultProbeTimeout),
		Passes:    hk.Passes,
		Budget:    hk.Budget.D(),
	}
	if h.Path == "" {
		h.Path = "/"
	} else if !strings.HasPrefix(h.Path, "/") {
		c.add("health.path", c.at("health.path"), "%q must start with /", hk.Path)
	}
	if h.Host != "" {
		if err := checkHealthHost(h.Host); err != nil {
			c.add("health.host", c.at("health.host"), "%v", err)
		}
	} else if i := slices.IndexFunc(c.r.Hosts, func(h string) bool { return !strings.HasPrefix(h, "*.") }); i >= 0 {
		h.Host = c.r.Hosts[i]
	}
	if h.Passes == 0 {
		h.Passes = 1
	} else if h.Passes < 0 {
		c.add("health.passes", c.at("health.passes"), "must be positive, got %d", hk.Passes)
	}
	h.FailFastAfter = valueOr(hk.FailFast, DefaultFailFastAfter)
	if h.FailFastAfter < 0 {
		c.add("health.fail_fast_after", c.at("health.fail_fast_after"), "must not be negative, got %d (0 turns the rule off)", h.FailFastAfter)
	}
	if hk.Status != "" {
		lo, hi, err := parseStatusRange(hk.Status)
		if err != nil {
			c.add("health.status", c.at("health.status"), "%v", err)
		}
		h.MinStatus, h.MaxStatus = lo, hi
	}
	if h.Budget > c.r.WakeBudget && !c.failed("wake_budget", "health.budget") {
		c.add("health.budget", c.at("health.budget"), "%v exceeds wake_budget %v", h.Budget, c.r.WakeBudget)
	}
	if hk.TCP {
		c.checkTCPHealth(&h)
	}
	c.r.Health = h
}

// checkTCPHealth reports the keys of the health block that a connect check does not use, and clears
// them.
func (c *routeCheck) checkTCPHealth(h *Health) {
	hk := c.rk.Health
	for _, k := range []struct {
		key   string
		given bool
	}{{"path", hk.Path != ""}, {"host", hk.Host != ""}, {"status", hk.Status != ""}, {"fail_fast_after", hk.FailFast != nil}} {
		if k.given {
			key := "health." + k.key
			c.add(key, c.at(key), "not used with health.tcp: true (the gate only connects, it sends no request): remove it")
		}
	}
	h.TCP = true
	h.Path, h.Host, h.MinStatus, h.MaxStatus, h.FailFastAfter = "", "", 0, 0, 0
}

// topCheck checks the top-level keys beside routes. A key that failed to decode is left nil, so it takes
// its default and is not reported again.
type topCheck struct {
	l   *errs
	doc *yaml.Node
}

func (c topCheck) add(key, format string, args ...any) {
	c.l.add("", key, KeyLine(c.doc, key), format, args...)
}

// checkCgroupRoot validates cgroup_root: "" (automatic), "off", or an absolute cgroup path, returned
// cleaned. The path is the cgroup's as /proc/self/cgroup shows it, not a file system path, and never
// the hierarchy's root: every group below cgroup_root is killed at start-up.
func (c topCheck) checkCgroupRoot(v string) string {
	switch {
	case v == "" || v == "off":
		return v
	case !strings.HasPrefix(v, "/"):
		c.add("cgroup_root", "%q must be \"off\" or an absolute cgroup path, as in /system.slice/activator.service/tenants (leave the key out for a group below the activator's own)", v)
	case slices.Contains(strings.Split(v, "/"), ".."):
		c.add("cgroup_root", "%q must not contain \"..\"", v)
	case filepath.Clean(v) == "/":
		c.add("cgroup_root", "%q is the root of the cgroup hierarchy: every cgroup below cgroup_root is killed at start-up, so it must be a group of the activator's own", v)
	case strings.HasPrefix(v, "/sys/fs/cgroup/"):
		rel := strings.TrimPrefix(strings.TrimPrefix(v, "/sys/fs/cgroup"), "/unified")
		c.add("cgroup_root", "%q is a file system path: write the cgroup's path as /proc/self/cgroup shows it, without the mount point (%s)", v, rel)
	default:
		return filepath.Clean(v)
	}
	return ""
}

// The forms listen and admin take, for their problems' hints.
const (
	listenForms = "(want host:port, as in 127.0.0.1:8080, [::1]:8080 or :8080)"
	adminForms  = "(want host:port, as in 127.0.0.1:9090, or unix:/path)"
)

// checkAddrs checks listen (already defaulted), the parts of admin that ParseAdminAddr (checkAdmin)
// leaves unchecked (a host that is no IP address nor DNS name, port 0), and that the two do not
// overlap. It returns those that are valid: the addresses no upstream may be. The edge listens on TCP
// only.
func (c topCheck) checkAddrs(listen, admin string) []ownAddr {
	var own []ownAddr
	l, lerr := parseOwnAddr("listen", listen, false, listenForms)
	if lerr != nil {
		c.add("listen", "%v", lerr)
	} else {
		own = append(own, l)
	}
	if _, err := ParseAdminAddr(admin); err != nil {
		return own // checkAdmin reports it
	}
	a, aerr := parseOwnAddr("admin", admin, true, adminForms)
	switch {
	case aerr != nil:
		c.add("admin", "%v", aerr)
		return own
	case lerr == nil && a.overlaps(l):
		c.add("admin", "%s is also the edge's address (listen: %s)", admin, listen)
	}
	return append(own, a)
}

// duration returns the duration at key, or def when the key is left out, and reports a zero one: a
// timeout of 0 is not "none" here. Decoding already rejects negative durations.
func (c topCheck) duration(key string, d *Duration, def time.Duration) time.Duration {
	v := d.or(def)
	if v <= 0 {
		c.add(key, "must be positive, got %v (leave the key out for the default %v)", v, def)
	}
	return v
}

// checkEdge applies the edge block's defaults and reports every key out of its range.
func (c topCheck) checkEdge(ek edgeKeys) EdgeLimits {
	e := EdgeLimits{
		HeaderTimeout:       c.duration("edge.header_timeout", ek.HeaderTimeout, DefaultHeaderTimeout),
		BodyTimeout:         c.duration("edge.body_timeout", ek.BodyTimeout, DefaultBodyTimeout),
		KeepAliveTimeout:    c.duration("edge.keepalive_timeout", ek.KeepAliveTimeout, DefaultKeepAliveTimeout),
		SendTimeout:         c.duration("edge.send_timeout", ek.SendTimeout, DefaultSendTimeout),
		TunnelTimeout:       ek.TunnelTimeout.or(DefaultTunnelTimeout),
		MaxHeaderBytes:      ek.MaxHeaderBytes.or(DefaultMaxHeaderBytes),
		MaxHeld:             valueOr(ek.MaxHeld, DefaultMaxHeldTotal),
		MaxHeldBytes:        ek.MaxHeldBytes.or(DefaultMaxHeldBytes),
		BodyMemory:          ek.BodyMemory.or(DefaultBodyMemory),
		BodyBufferDir:       ek.BodyBufferDir,
		MaxSpillFiles:       valueOr(ek.MaxSpillFiles, 0),
		MaxSpillBytes:       ek.MaxSpillBytes.or(DefaultMaxSpillBytes),
		TLSHandshakeTimeout: c.duration("edge.tls_handshake_timeout", ek.TLSHandshake, DefaultTLSHandshakeTimeout),
		MaxTLSHandshakes:    valueOr(ek.MaxTLSHandshakes, DefaultMaxTLSHandshakes),
		MaxConns:            valueOr(ek.MaxConns, 0),
		EventLoops:          valueOr(ek.EventLoops, EventLoopsAuto),
	}
	if d := e.TunnelTimeout; d > 0 && d < minTunnelTimeout {
		c.add("edge.tunnel_timeout", "%v would close WebSockets between their messages: 0 for no bound, or at least %v", d, minTunnelTimeout)
	}
	if ek.EventLoops != nil && (e.EventLoops < 0 || e.EventLoops > MaxEventLoops) {
		c.add("edge.event_loops", "must be between 0 (off) and %d, got %d (leave the key out for one per CPU)", MaxEventLoops, e.EventLoops)
	}
	if ek.MaxConns != nil && e.MaxConns <= 0 {
		c.add("edge.max_conns", "must be positive, got %d (leave the key out to derive it from the open-file limit)", e.MaxConns)
	}
	if e.MaxTLSHandshakes <= 0 {
		c.add("edge.max_tls_handshakes", "must be positive, got %d (leave the key out for the default %d)", e.MaxTLSHandshakes, DefaultMaxTLSHandshakes)
	}
	if v := e.MaxHeaderBytes; v < minHeaderBytes || v > maxHeaderBytes {
		c.add("edge.max_header_bytes", "must be between %v and %v, got %v", ByteSize(minHeaderBytes), ByteSize(maxHeaderBytes), ByteSize(v))
	}
	if e.MaxHeld <= 0 {
		c.add("edge.max_held", "must be positive, got %d (leave the key out for the default %d)", e.MaxHeld, DefaultMaxHeldTotal)
	}
	if e.MaxHeldBytes <= 0 {
		c.add("edge.max_held_bytes", "must be positive, got %v (leave the key out for the default %v)", ByteSize(e.MaxHeldBytes), ByteSize(DefaultMaxHeldBytes))
	}
	if e.BodyMemory > maxBodyMemory {
		c.add("edge.body_memory", "must be at most %v, got %v (the rest of a body goes to body_buffer_dir)", ByteSize(maxBodyMemory), ByteSize(e.BodyMemory))
	}
	if ek.MaxSpillFiles != nil && e.MaxSpillFiles <= 0 {
		c.add("edge.max_spill_files", "must be positive, got %d (leave the key out to derive it from the open-file limit)", e.MaxSpillFiles)
	}
	if e.MaxSpillBytes <= 0 {
		c.add("edge.max_spill_bytes", "must be positive, got %v (leave the key out for the default %v)", ByteSize(e.MaxSpillBytes), ByteSize(DefaultMaxSpillBytes))
	}
	if d := e.BodyBufferDir; d != "" && !filepath.IsAbs(d) {
		c.add("edge.body_buffer_dir", "%q is not an absolute path (leave the key out for the system's temporary directory)", d)
	}
	return e
}

// checkBacking checks backing and that the route has no other backing's block, then has the backing's
// decoder check its own block. The decoder sees the route's common keys, so it runs only for a route
// that has no other problem.
func (c *routeCheck) checkBacking(blocks map[string]block, backings map[string]SettingsDecoder) {
	name := c.rk.Backing
	dec, ok := backings[name]
	switch {
	case c.failed("backing"):
		return
	case name == "":
		c.add("backing", c.at("backing"), "missing (one of: %s)", backingNames(backings))
		return
	case !ok:
		c.add("backing", c.at("backing"), "%q is not available in this build (one of: %s)", name, backingNames(backings))
		return
	}
	for _, k := range slices.Sorted(maps.Keys(blocks)) {
		if k != name {
			c.add(k, blocks[k].line, "settings for backing %q, but the route's backing is %q", k, name)
		}
	}
	c.checkMemberBlocks(name)
	if len(c.l.list) > c.start {
		return
	}
	own := blocks[name]
	if c.r.Fleet != nil {
		c.decodeMembers(dec, name, own)
		return
	}
	settings, err := dec(c.r, own.node)
	if err != nil {
		line := own.line
		if line == 0 {
			line = c.at("backing") // no block at all: point at the backing it is missing for
		}
		c.l.addErr(c.label, name, line, err)
	}
	c.r.Settings = settings
}

// errorKeys returns the key of each problem in list (nil for none: most routes have none).
func errorKeys(list []error) map[string]bool {
	if len(list) == 0 {
		return nil
	}
	m := map[string]bool{}
	for _, err := range list {
		var e *Error
		if errors.As(err, &e) && e.Key != "" {
			m[e.Key] = true
		}
	}
	return m
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
	for part := range strings.SplitSeq(key, ".") {
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

// backingNames lists the backings this build offers, sorted so that error text does not vary from run
// to run.
func backingNames(backings map[string]SettingsDecoder) string {
	return strings.Join(slices.Sorted(maps.Keys(backings)), ", ")
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

// compacted returns a copy of r whose name, hosts, backing, upstream address, health path and host and
// requires share one allocation of their own. As loaded they are the parser's strings, each allocated
// among the parse's garbage: kept one by one, they would pin that garbage's memory pages after it is
// collected. The backing's Settings are left as they are.
func compacted(r *Route) *Route {
	c := *r
	c.Hosts = slices.Clone(r.Hosts)
	c.Requires = slices.Clone(r.Requires)
	strs := []*string{&c.Name, &c.PathPrefix, &c.Backing, &c.Upstream.Address, &c.Health.Path, &c.Health.Host}
	for i := range c.Hosts {
		strs = append(strs, &c.Hosts[i])
	}
	for i := range c.Requires {
		strs = append(strs, &c.Requires[i])
	}
	var b strings.Builder
	for _, p := range strs {
		b.WriteString(*p)
	}
	all, off := b.String(), 0
	for _, p := range strs {
		n := len(*p)
		*p, off = all[off:off+n], off+n
	}
	return &c
}
