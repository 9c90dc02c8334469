// Package registry owns the activator's configuration: the routes, their common settings, and the
// validation that turns a YAML file into an immutable *Config or a list of errors that each name the
// route and key at fault.
//
// The registry knows the keys every route shares. Each backing's own settings block (the mapping under
// the key named after the backing, e.g. `exec:`) is decoded by a SettingsDecoder that the composition
// root supplies, so the registry never imports a backend and a backend owns its own schema.
package registry

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"
)

// Config is a parsed, validated configuration. It is immutable after Load returns.
type Config struct {
	// Listen is the edge's address (default 127.0.0.1:8080).
	Listen string
	// Admin is the admin API's address (default 127.0.0.1:9090): host:port or unix:/path
	// (ParseAdminAddr).
	Admin string
	// AdminAccess is the admin API's socket mode, token and accepted Host names (the admin_* keys).
	AdminAccess AdminAccess
	// ShutdownGrace bounds a shutdown on SIGTERM as a whole: answering held requests, draining in-flight
	// ones and putting tenants to sleep (default 30s, always positive).
	ShutdownGrace time.Duration
	// CgroupRoot is where exec tenants' cgroups go (cgroup_root): "" for a group below the activator's
	// own cgroup, chosen at start-up; "off" for no cgroups (process groups only); otherwise a cleaned
	// absolute cgroup v2 path such as /system.slice/activator.service/tenants, never "/". Read at
	// start-up only.
	CgroupRoot string
	// Edge is the edge's limits on its clients, shared by all routes.
	Edge EdgeLimits
	// ListenTLS is the edge's TLS listener's address (listen_tls), "" for none; TLS is what it serves
	// (tls.go). RedirectHTTP has the plain listener answer 308 to https for the hosts served over TLS
	// (and still serve ACME HTTP-01 challenges).
	ListenTLS    string
	TLS          TLS
	RedirectHTTP bool
	// TrustedProxies are the peers whose Forwarded and X-Forwarded-* headers (and PROXY header, where
	// ProxyProtocol asks for it) are taken as the client's.
	TrustedProxies []netip.Prefix
	ProxyProtocol  ProxyProtocol
	// Routes in file order.
	Routes []*Route
	// Instances are the tenants declared under instances:, in file order: Routes without hosts or a
	// path prefix (Instance is set), woken only as a requirement of a route or another instance
	// (Requires), or from the admin API. Their names are unique across routes and instances.
	Instances []*Route
}

// Instance returns the instance (instances:) with the given name, or nil.
func (c *Config) Instance(name string) *Route {
	for _, r := range c.Instances {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// EdgeLimits bounds what clients may cost the edge: time per connection, and memory across all routes.
// Load fills in every default, so no field is zero unless zero is a valid setting.
type EdgeLimits struct {
	// HeaderTimeout is how long a client may take to send a request's header (default 10s).
	HeaderTimeout time.Duration
	// BodyTimeout is the longest a request body may go without a byte before the request gets 408
	// (default 30s).
	BodyTimeout time.Duration
	// KeepAliveTimeout is how long an idle keep-alive connection stays open (default 2m).
	KeepAliveTimeout time.Duration
	// SendTimeout is the longest the edge waits for a client to take the next piece of an answer
	// (16 KiB over HTTP/1, any byte over HTTP/2) before it closes the connection (default 60s).
	SendTimeout time.Duration
	// TunnelTimeout closes a connection that has switched protocols (a WebSocket) once no byte has
	// passed it, either way, for this long: both sides, client and tenant (default 1h; 0 for no bound,
	// else at least 1s).
	TunnelTimeout time.Duration
	// MaxHeaderBytes is the largest request header accepted; a larger one gets 431 (default 32KiB,
	// between 1KiB and 1MiB).
	MaxHeaderBytes int64
	// MaxHeld is the most requests held at once across all routes; beyond it a request gets 503 at once
	// (default 20000). Each route's Hold.MaxRequests applies as well.
	MaxHeld int
	// MaxHeldBytes is the most memory held requests may keep across all routes, counting headers and
	// in-memory bodies; beyond it a request gets 503 at once (default 256MiB).
	MaxHeldBytes int64
	// BodyMemory is how much of one buffered request body is kept in memory; the rest goes to a
	// temporary file in BodyBufferDir (default 64KiB, at most 16MiB; 0 sends every body to a file).
	BodyMemory int64
	// BodyBufferDir is the directory of those temporary files: an absolute path, or "" for
	// os.TempDir() at run time. Load does not check that it exists.
	BodyBufferDir string
	// MaxSpillFiles is the most of those files open at once across all routes (0: the serving
	// activator derives it from the open-file limit); MaxSpillBytes the most bytes they hold together
	// (default 1GiB). A body with no room gets 503.
	MaxSpillFiles int
	MaxSpillBytes int64
	// TLSHandshakeTimeout bounds one TLS handshake (default 10s); MaxTLSHandshakes is how many may be
	// in flight at once (default 256).
	TLSHandshakeTimeout time.Duration
	MaxTLSHandshakes    int
	// MaxConns is the most edge connections open at once, plain and TLS together; at it the
	// connection idle longest (or silent longest) is closed for a new one, and when none may be a new
	// one waits (package connlimit). 0, the
	// default, leaves it to the serving process, which derives it from its open-file limit
	// (cmd/activator).
	MaxConns int
	// EventLoops is how many event loops serve warm keep-alive HTTP/1.1 connections beside net/http
	// (internal/warmloop; issue 17's warm path): EventLoopsAuto, the default (the key left out), for
	// one per CPU the serving process may use, which it decides (cmd/activator); 0 for none; at most
	// MaxEventLoops. Read at start.
	EventLoops int
}

// EventLoopsAuto is edge.event_loops left out: the serving process starts one loop per CPU it may
// use. It cannot be written in a config.
const EventLoopsAuto = -1

// MaxEventLoops bounds edge.event_loops: each is an epoll instance and a goroutine, and more than the CPUs gain
// nothing.
const MaxEventLoops = 64

// Route returns the route with the given name, or nil.
func (c *Config) Route(name string) *Route {
	for _, r := range c.Routes {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// Route is one tenant: where its requests come from, how to wake it and when to let it sleep. Its
// bools sit together, so that it stays within the 512-byte size class: at 100,000 routes, a Route in
// the next class (576) is 6.4 MB more of the activator's memory (response_timeout's 8 bytes did that).
type Route struct {
	Name       string
	Hosts      []string // exact ("app.example.com") or leading wildcard ("*.example.com"), lower case
	PathPrefix string   // "" or a prefix starting with "/"
	Backing    string   // "exec", "unit", "kvm", "redfish"
	Upstream   Upstream
	// MaxUpstreamConns bounds the requests proxied to the upstream at once (one connection each);
	// more wait for one to finish, in arrival order.
	MaxUpstreamConns int
	// RequestBuffering has a request's whole body read before the request takes an upstream slot, so a
	// slow upload cannot hold one (default true). False streams bodies, for streaming uploads.
	RequestBuffering bool
	// DetailedErrors has the edge's error bodies quote a failed wake's cause (a tenant's output tail,
	// a backend's words) to anonymous clients, for development (default false: phase and wake id only).
	DetailedErrors bool
	// Instance is set for an entry of instances:: it has no Hosts and no PathPrefix, and no request
	// reaches it; it wakes as a requirement or from the admin API.
	Instance bool
	// MaxBody is the largest request body accepted, buffered or not; a larger one gets 413 (default
	// 100MiB; 0 means no limit).
	MaxBody int64
	Health  Health
	// Idle is how long the route stays awake after its last in-flight request ends; 0 means never sleep.
	Idle time.Duration
	// ResponseTimeout bounds how long the tenant may take to begin its answer (its head) once a
	// request has been sent to it; past it the request gets 504 (default 5m; 0 means no bound).
	ResponseTimeout time.Duration
	// WakeBudget bounds a whole wake: backend start plus health gate.
	WakeBudget time.Duration
	// SleepBudget bounds one Sleep call.
	SleepBudget time.Duration
	Hold        Hold
	Backoff     Backoff
	// WaitingPage is what browser navigations get while the tenant wakes (people.go).
	WaitingPage WaitingPage
	// Ignore matches requests that neither wake the tenant nor keep it awake (people.go).
	Ignore Ignore
	// KeepWarm are windows in which the tenant is woken at the start and never idle-stopped
	// (schedule.go).
	KeepWarm []Window
	// WakeAt are schedules that pre-wake the tenant (schedule.go).
	WakeAt []Schedule
	// Settings is what the backing's SettingsDecoder returned for this route. For a fleet it is the
	// first member's (each member's own is in Fleet.Members): the route's block alone may lack a key
	// that every member sets.
	Settings any
	// Requires names the instances (instances:) that must be awake, each past its own health gate,
	// before this tenant starts: in the order written, deduplicated. Load has checked that every name
	// exists and that there is no cycle.
	Requires []string
	// Fleet, when set, backs the route or instance with several members of its backing instead of one
	// tenant; Upstream is then the first member's.
	Fleet *Fleet
}

// Fleet is N named members of one backing behind one route or instance (fleet:).
type Fleet struct {
	// Members in the order written; at least one, with unique names.
	Members []Member
	// MinReady is the quorum (min_ready): requests are released once this many members have passed
	// their health gates. Between 1 and len(Members); the default is all of them.
	MinReady int
	// Serial wakes the members one after another (serial: true), for hardware that must not power on
	// all at once; the default wakes them all in parallel. Either way the rollup is the same.
	Serial bool
}

// Member is one member of a fleet.
type Member struct {
	// Name is the member's name (the nameRE form), unique in its fleet.
	Name string
	// Upstream is where the member listens; its health gate probes it with the route's health block.
	Upstream Upstream
	// Settings is the backing's SettingsDecoder's result for the route's backing block with the
	// member's own block laid over it, key by key.
	Settings any
}

// MemberRoute returns the Route a fleet member's backend is opened with: r with the member's name
// ("<route>.<member>", which no route can have), upstream and settings, and no fleet.
func (r *Route) MemberRoute(m Member) *Route {
	c := *r
	c.Name = r.Name + "." + m.Name
	c.Upstream = m.Upstream
	c.Settings = m.Settings
	c.Fleet = nil
	c.Requires = nil
	return &c
}

// Upstream is where a woken tenant listens.
type Upstream struct {
	Network string // "tcp" or "unix"
	Address string // host:port or a socket path
}

// ParseUpstream accepts "host:port", "unix:/path" or an absolute "/path" (a unix socket). The host is
// an IP address or a DNS name, and the port a number in 1-65535.
func ParseUpstream(s string) (Upstream, error) {
	switch {
	case s == "":
		return Upstream{}, fmt.Errorf("upstream is empty")
	case strings.HasPrefix(s, "unix:"):
		p := strings.TrimPrefix(s, "unix:")
		if !strings.HasPrefix(p, "/") {
			return Upstream{}, fmt.Errorf("unix socket path %q must be absolute", p)
		}
		return Upstream{Network: "unix", Address: p}, nil
	case strings.HasPrefix(s, "/"):
		return Upstream{Network: "unix", Address: s}, nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return Upstream{}, fmt.Errorf("upstream %q is neither host:port nor a unix socket path", s)
	}
	if host == "" {
		return Upstream{}, fmt.Errorf("upstream %q has no host", s)
	}
	if port == "" || port == "0" {
		return Upstream{}, fmt.Errorf("upstream %q needs a fixed port", s)
	}
	if _, err := checkPort(port); err != nil {
		return Upstream{}, fmt.Errorf("upstream %q: %w", s, err)
	}
	if err := checkAddrHost(host); err != nil {
		return Upstream{}, fmt.Errorf("upstream %q: %w", s, err)
	}
	return Upstream{Network: "tcp", Address: s}, nil
}

// String renders the upstream the way ParseUpstream accepts it.
func (u Upstream) String() string {
	if u.Network == "unix" {
		return "unix:" + u.Address
	}
	return u.Address
}

// Dial connects to the upstream.
func (u Upstream) Dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, u.Network, u.Address)
}

// Health is the gate a woken tenant must pass before held requests are released.
type Health struct {
	Path string // default "/"
	// Host is the probe's Host header: health.host, by default the route's first exact host (Load
	// fills it in). Empty (a route with only wildcard hosts) sends the upstream's address.
	Host      string
	MinStatus int           // default 200
	MaxStatus int           // default 399
	Interval  time.Duration // the longest pause between probes (default 1s); probing starts at a few ms
	Timeout   time.Duration // one probe's limit (default 2s)
	Passes    int           // consecutive passes required (default 1)
	// FailFastAfter ends a wake at once when this many consecutive failing probes are answered with
	// the same 4xx status other than 408, 425 and 429: a health path that can never pass (default 3;
	// 0 turns the rule off).
	FailFastAfter int
	// Budget bounds the health phase alone; 0 means whatever is left of the wake budget.
	Budget time.Duration
	// TCP (health.tcp) makes the gate a connect check, for requirements that speak no HTTP (a
	// database): a probe passes when a TCP or unix connect to the upstream succeeds, and sends nothing.
	// Load then leaves Path, Host, MinStatus, MaxStatus and FailFastAfter zero.
	TCP bool
}

// Hold limits the requests held while a route wakes.
type Hold struct {
	MaxRequests int           // default 10000
	MaxTime     time.Duration // default: wake budget + sleep budget
}

// Backoff spaces wake attempts after a failed wake, so a crash-looping tenant is not restarted on every
// request.
type Backoff struct {
	Initial time.Duration // default 1s
	Max     time.Duration // default 1m
}
