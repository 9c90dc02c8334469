// Package activator owns the edge: it routes each request by Host and path prefix to a route's
// instance, holds the request while the instance wakes (exactly one wake however many requests arrive),
// releases every held request together once the health gate passes, proxies, and puts the instance back
// to sleep when its idle window passes with nothing in flight.
//
// It declares the Backend it needs (backend.go) and never imports a backend: internal/backend/split
// provides them, and cmd/activator wires everything.
package activator

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/activator/activator/internal/bodybuf"
	"github.com/activator/activator/internal/health"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
	"github.com/activator/activator/internal/waitpage"
	"github.com/activator/activator/internal/warmloop"
)

// Options configure a Server.
type Options struct {
	Opener  tenant.Opener
	Logger  *slog.Logger
	Metrics *Metrics // nil records nothing
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
	// Pacer times the default health gates' fast pauses (health.Pacer). The caller owns it: it
	// outlives the Server, and the caller closes it after Shutdown has returned. nil: the gates pause
	// on timers, up to a millisecond late in an idle process.
	Pacer *health.Pacer
	// NewGate builds a route's health gate (tests); default health.New with Pacer.
	NewGate func(r *registry.Route) Gate
	// ParkAbove is how many requests the edge holds before it parks more (park.go); 0 is the default
	// (parkAbove), a negative value parks from the first (tests).
	ParkAbove int
	// SpillFiles is edge.max_spill_files when the config leaves it out: cmd/activator derives it
	// from the open-file limit. 0: no bound then.
	SpillFiles int
}

// Server is the activator: the edge handler, the instances and the admin operations. Create it with
// New, give it a config with Apply (again on every reload), serve ServeHTTP on the edge listener and
// Admin on the admin listener, and call Shutdown once at exit.
type Server struct {
	opts Options
	root context.Context
	stop context.CancelFunc
	log  *slog.Logger
	// drain is closed by Drain, under mu, when closed is set: the instances read it to refuse new
	// wakes.
	drain chan struct{}
	// prepares bounds the backends preparing for their first wake at once (instance.prepare): the
	// exec backing's standbys each cost a spawn.
	prepares chan struct{}

	table atomic.Pointer[table] // the routing table requests read without locking
	// peers is every instance of the running config by name (a copy of instances that is never
	// written again), for the wakes' requirement lookups (peer).
	peers atomic.Pointer[map[string]*instance]
	held  heldAccount // requests held across all routes, for edge.max_held and max_held_bytes
	// spills bounds the request bodies' spill files across all routes (edge.max_spill_files,
	// edge.max_spill_bytes); spillLog throttles the lines about bodies that could not be buffered.
	spills   bodybuf.Spills
	spillLog throttle
	// streams counts the waiting pages' event streams open across all routes (waiting.go).
	streams atomic.Int64
	// resume serves parked connections again (park.go); nil: nothing is parked. Set before serving.
	resume    *http.Server
	parkAbove int64 // parkAbove, but for tests
	parking   parkCount
	hangOnce  sync.Once
	hang      *hangups // made by the first park (Server.hangups)
	// loops serve warm keep-alive connections (loop.go); nil: none. Set before serving, with the
	// connection cap's hook for the connections they hand back and forth.
	loops         *warmloop.Group
	loopConnState func(net.Conn, http.ConnState)

	mu        sync.Mutex // guards the fields below; held across Apply so reloads do not interleave
	instances map[string]*instance
	applied   bool // Apply has run once: routes it finds new from then on were added by a reload
	retiring  []*instance
	checks    map[string]error // SetCheckError's findings, by route name
	closed    bool             // set by Drain: no config is applied any more
	// builtinPage is the built-in waiting page, made by the first Apply that needs it (waiting.go).
	builtinPage *waitpage.Page
}

// New returns a Server whose wakes live until Shutdown.
func New(opts Options) *Server {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.NewGate == nil {
		opts.NewGate = func(r *registry.Route) Gate {
			return health.New(r.Upstream, r.Health, health.WithPacer(opts.Pacer))
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	root, stop := context.WithCancel(context.Background())
	s := &Server{opts: opts, root: root, stop: stop, log: opts.Logger, drain: make(chan struct{}), prepares: make(chan struct{}, prepareAtOnce), instances: map[string]*instance{},
		checks: map[string]error{}}
	s.table.Store(&table{})
	return s
}

// namedChanges is how many added routes, how many changed and how many removed ones, one Apply logs by name; beyond
// that it logs their numbers once. A reload that edits every one of 100,000 routes logged a line per
// route, which journald's rate limit (10,000 lines in 30 s by default) answers by dropping what the
// activator logs next: the wakes that follow the reload.
const namedChanges = 20

// Apply makes cfg the running configuration. Unchanged routes keep their instance (and their awake
// tenant). A changed route gets a new instance whose first wake waits until the old one has retired;
// the old one finishes its in-flight and held requests, sleeps, and closes. Removed routes retire the
// same way, and then their backends forget the tenant (tenant.Forgetter, instance.forget). Held requests are never dropped. If a backend cannot be opened, nothing changes and the
// error names the route; likewise if cfg.Edge.BodyBufferDir cannot hold spill files. cfg.Edge's
// per-request limits (body, hold caps) apply from the next request on.
func (s *Server) Apply(cfg *registry.Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if err := checkBodyDir(cfg.Edge.BodyBufferDir); err != nil {
		return err
	}
	pages, err := s.waitingPagesLocked(cfg)
	if err != nil {
		return err
	}
	all := slices.Concat(cfg.Routes, cfg.Instances)
	changed := changedTenants(all, s.instances)
	next := make(map[string]*instance, len(all))
	var opened []*instance
	for _, r := range all {
		if old, ok := s.instances[r.Name]; ok && !changed[r.Name] {
			// Keyed by the old route's name, as buildTable keys hosts by the old route's: an unchanged
			// route keeps nothing of cfg, so that the config of a reload that changes nothing is garbage
			// as a whole once applied, not a string per route pinning the memory its parse used.
			next[old.route.Name] = old
			continue
		}
		// A route whose tenant is the same (only keys of the edge changed) keeps it: the new instance
		// borrows the old one's backend (a fleet's, members and all), and takes the tenant over,
		// running, when the old one retires.
		var from *instance
		if old, ok := s.instances[r.Name]; ok && old.route.SameTenant(r) {
			from = old
		}
		in, err := s.openLocked(r, from)
		if err != nil {
			for _, in := range opened {
				in.teardown()
			}
			return err
		}
		next[r.Name] = in
		opened = append(opened, in)
	}
	prev := s.instances
	s.instances = next
	for _, r := range cfg.Routes {
		next[r.Name].pages.page.Store(pages[r.Name])
	}
	s.peers.Store(&next)
	for name := range s.checks {
		if next[name] == nil {
			delete(s.checks, name)
		}
	}
	for name, old := range prev {
		if next[name] != old {
			s.retiring = append(s.retiring, old)
		}
	}
	// What the new instances' first wakes wait for is complete before any request can reach them, and
	// before a handover below can start one.
	gone := s.removedUpstreamsLocked(next)
	for _, in := range opened {
		if in.route.Upstream.Address != "" { // a fleet's members have the upstreams
			in.after = append(in.after, gone[in.route.Upstream]...)
		}
	}
	s.table.Store(buildTable(cfg, next))
	files := cfg.Edge.MaxSpillFiles
	if files == 0 {
		files = s.opts.SpillFiles
	}
	s.spills.SetLimits(int64(files), cfg.Edge.MaxSpillBytes)
	// Only now, with the new table published, are the replaced instances retired. Retired first, they
	// stopped their tenants while the table still routed to them, for as long as building it took
	// (hundreds of milliseconds at 100,000 routes): a warm route's requests then woke the tenant again
	// through the retiring instance, or got 503 once it had closed. A request that looked its route up
	// before the swap and reaches a retiring instance is handed on (acquireRouted).
	changes, removals := 0, 0
	for name, old := range prev {
		if next[name] != old {
			tenant := "" // what becomes of the running tenant, for the log line
			if heir := next[name]; heir != nil && heir.awaitsHandover() {
				old.bequeath(heir)
				tenant = "kept running (only keys of the edge changed)"
			} else if heir != nil {
				tenant = "not kept (" + heir.route.TenantChange(old.route) + "): put to sleep once the old instance's requests end; the next request wakes it"
			}
			old.retire(retireGrace(cfg, next[name])) // it deletes the route's metric series once it has retired, unless next[name] holds them
			if next[name] == nil {
				if removals++; removals <= namedChanges {
					s.log.Info("route removed", "route", name)
				}
			} else if changes++; changes <= namedChanges {
				s.log.Info("route changed", "route", name, "tenant", tenant)
			}
		}
	}
	additions := 0
	if len(prev) > 0 || s.applied { // the first config's routes are the start-up's, not additions
		for name := range next {
			if prev[name] == nil {
				if additions++; additions <= namedChanges {
					s.log.Info("route added", "route", name)
				}
			}
		}
	}
	s.applied = true
	if changes > namedChanges || removals > namedChanges || additions > namedChanges {
		s.log.Info("more routes added, changed or removed than are named one by one", "added", additions, "changed", changes, "removed", removals, "named_at_most", namedChanges)
	}
	for _, in := range next {
		in.setGrace(retireGrace(cfg, in))
	}
	for _, in := range opened {
		in.start()
		in.prepare(s.prepares)
		in.startSchedule()
	}
	s.pruneRetiredLocked()
	return nil
}

// retireGrace is how long a replaced or removed instance's requests in flight may keep it from
// sleeping (instance.retire): shutdown_grace, as a restart would give them, but at most half of the
// new instance's hold.max_time, so that a request held for the new instance's first wake, which
// waits for the old one to retire, keeps half its hold for the old tenant's stop and the new one's
// wake. 0 (configs built by hand, without either): no bound.
func retireGrace(cfg *registry.Config, successor *instance) time.Duration {
	grace := cfg.ShutdownGrace
	if successor != nil {
		if half := successor.route.Hold.MaxTime / 2; half > 0 && (grace == 0 || half < grace) {
			grace = half
		}
	}
	return grace
}

// openLocked opens r's backend (a fleet's members' backends) and returns its new instance, not yet
// started; with from, the instance r replaces when its tenant is the same, it borrows from's backend
// instead (a fleet's with a view of its own: fleetView), and waits for from to hand the tenant over
// (instance.inherit).
func (s *Server) openLocked(r *registry.Route, from *instance) (*instance, error) {
	var (
		b  tenant.Backend
		fb *fleetBackend
	)
	if from != nil {
		b = from.backend
		if from.fleet != nil {
			fb = from.fleet.fleetBackend
		}
	} else if r.Fleet != nil {
		var err error
		if fb, err = openFleet(s.opts.Opener, r, s.opts.NewGate); err != nil {
			return nil, err
		}
		b = fb
	} else {
		var err error
		if b, err = s.opts.Opener.Open(r); err != nil {
			return nil, err
		}
	}
	in := newInstance(s.root, r, b, s.log, s.opts.Metrics, s.opts.Now, func() Gate { return s.opts.NewGate(r) })
	if fb != nil {
		in.fleet = newFleetView(fb, r, in)
		if from == nil {
			in.fleet.own()
		} else {
			// The fleet is from's until the handover (inherit), but the route's series are this
			// instance's from now on: its fleet series too, or they would be gone until the handover,
			// which waits for a wake in progress.
			in.fleet.seriesIfWoken()
		}
	}
	in.after = s.predecessorsLocked(r.Name)
	if from != nil {
		// The backend is from's until it hands it over (inherit). The first wake waits for that, not
		// for from to retire: from hands its tenant over at once, and retires only once its own requests
		// in flight are done, which a WebSocket can make hours.
		in.ho = &handover{inheriting: true, lent: true, arrived: make(chan struct{})}
		in.after = slices.DeleteFunc(in.after, func(ch <-chan struct{}) bool { return ch == from.retired })
		in.after = append(in.after, in.ho.arrived)
	}
	if old, ok := s.instances[r.Name]; ok {
		in.hist = old.hist // a changed route keeps its history
		in.pages = old.pages
		// And its last wake and sleep, for the status: a failed wake that an alert sends the operator
		// to look up was gone from `activator status` and GET /routes after the reload meant to fix it
		// (found by an operator trial). The backoff is not kept: the new config may have fixed it.
		old.mu.Lock()
		in.lastRec, in.lastAtt, in.lastSlp = old.lastRec, old.lastAtt, old.lastSlp
		old.mu.Unlock()
	}
	in.drain = s.drain
	in.checkErr = s.checks[r.Name]
	in.peer = s.peer
	in.trusted = s.TrustedProxy
	in.tunnel = s.tunnelTimeout
	return in, nil
}

// changedTenants returns the names in all whose instance must be replaced: new, changed, or requiring
// (directly or not) one that is. A dependent is replaced with its requirement so that it lets go of
// the old one, which can then sleep and retire, and the new one's first wake (which waits for that)
// is not held up by a dependent that goes on holding the old one until its idle window passes.
func changedTenants(all []*registry.Route, cur map[string]*instance) map[string]bool {
	changed := map[string]bool{}
	for _, r := range all {
		if old, ok := cur[r.Name]; !ok || !old.route.Same(r) {
			changed[r.Name] = true
		}
	}
	for grew := true; grew; {
		grew = false
		for _, r := range all {
			if changed[r.Name] {
				continue
			}
			if slices.ContainsFunc(r.Requires, func(n string) bool { return changed[n] }) {
				changed[r.Name], grew = true, true
			}
		}
	}
	return changed
}

// peer returns the running config's instance of that name (route or instance), or nil: what a wake
// looks its requirements up with (chain.go). It does not lock.
func (s *Server) peer(name string) *instance {
	if m := s.peers.Load(); m != nil {
		return (*m)[name]
	}
	return nil
}

// predecessorsLocked returns the retired channels of the route's live instance and of every instance
// of that name still retiring: a route removed by one reload and added back by the next must wait for
// the old instance's sleep too.
func (s *Server) predecessorsLocked(name string) []<-chan struct{} {
	var out []<-chan struct{}
	if old, ok := s.instances[name]; ok {
		out = append(out, old.retired)
	}
	for _, old := range s.retiring {
		if old.route.Name == name {
			out = append(out, old.retired)
		}
	}
	return out
}

// removedUpstreamsLocked returns, by upstream, the retired channels of the instances still retiring
// whose route the config being applied (next) no longer has: a route renamed by a reload, or removed
// while another takes over its upstream. A new route's first wake waits for those at its upstream as
// for a predecessor of its own name. Found with the real binary: a route renamed while its tenant was
// awake woke its own tenant beside the old one, found the old one listening, and failed (terminal)
// calling the activator's own tenant a stranger. A route that keeps its name has its own predecessor
// wait; counting it here too would make every route that shares an upstream wait for every other.
// Called once the reload's replaced instances are in s.retiring.
func (s *Server) removedUpstreamsLocked(next map[string]*instance) map[registry.Upstream][]<-chan struct{} {
	gone := map[registry.Upstream][]<-chan struct{}{}
	for _, old := range s.retiring {
		if next[old.route.Name] == nil && old.route.Upstream.Address != "" {
			gone[old.route.Upstream] = append(gone[old.route.Upstream], old.retired)
		}
	}
	return gone
}

func (s *Server) pruneRetiredLocked() {
	s.retiring = slices.DeleteFunc(s.retiring, func(in *instance) bool {
		select {
		case <-in.retired:
			in.wg.Wait()
			return true
		default:
			return false
		}
	})
}

// Drain begins the activator's shutdown and returns at once. From then on no config is applied and no
// wake starts: a request to an awake route is still served, and one that would have to wait for a
// wake gets 503 with Retry-After at once (ErrClosed), as do the requests already held behind a stop,
// which no wake would follow. Requests held on a wake in progress go on waiting for it; Shutdown
// decides for how long. Drain is idempotent, and Shutdown calls it.
func (s *Server) Drain() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.drain)
	}
}

// Shutdown stops the activator within ctx, draining first (Drain). Each route is closed as soon as it
// has nothing held or in flight and no wake or sleep running: its backend's Close then decides, within
// ctx, what happens to a running tenant (exec children get their stop signal and, as far as ctx
// allows, their stop_grace; systemd units are left running for the next activator to adopt). When
// only the reserve is left of ctx's time (answerReserve), and at once if ctx has no deadline, the
// requests still held get 503 with Retry-After, wakes in progress are canceled, and every route is
// closed once its wake has ended, even with requests in flight: those go on against a tenant that is
// being stopped until the edge cuts them. Shutdown returns once every instance is closed and its
// goroutines joined, or with ctx's error when ctx ends first.
//
// Shutdown does not wait for the edge's connections: the caller stops accepting first and shuts its
// http.Server down alongside, with the same ctx (http.Server.Shutdown waits for held requests, which
// only Shutdown answers).
func (s *Server) Shutdown(ctx context.Context) error {
	s.Drain()
	// The loops' idle connections close now, as the edge's http.Server closes its own; their
	// requests in progress finish first.
	loopsDone := make(chan error, 1)
	go func() { loopsDone <- s.drainLoops(ctx) }()
	s.mu.Lock()
	all := make([]*instance, 0, len(s.instances)+len(s.retiring))
	for _, in := range s.instances {
		all = append(all, in)
	}
	all = append(all, s.retiring...)
	s.mu.Unlock()

	cut := make(chan struct{})
	var closing sync.WaitGroup
	for _, in := range all {
		closing.Go(func() { in.shutdown(ctx, cut) })
	}
	closed := make(chan struct{})
	go func() { closing.Wait(); close(closed) }()

	var atCut <-chan time.Time // nil: no deadline, cut at once
	if deadline, ok := ctx.Deadline(); ok {
		left := time.Until(deadline)
		t := time.NewTimer(left - answerReserve(left))
		defer t.Stop()
		atCut = t.C
	}
	if atCut != nil {
		select {
		case <-closed:
		case <-atCut:
		case <-ctx.Done():
		}
	}
	// The cut: held requests are answered, wakes end, and the routes still open close.
	close(cut)
	s.stop()
	joined := make(chan struct{})
	go func() {
		<-closed
		for _, in := range all {
			in.wg.Wait()
		}
		close(joined)
	}()
	select {
	case <-joined:
	case <-ctx.Done():
		return fmt.Errorf("shutdown: %w", ctx.Err())
	}
	// The parked requests are answered by the resume server's handler (park.go), and the caller shuts
	// that server down next: each must be in the handler first.
	if err := s.parking.wait(ctx); err != nil {
		return fmt.Errorf("shutdown: parked requests not yet handed back: %w", err)
	}
	if err := <-loopsDone; err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	s.hangOnce.Do(func() {}) // none made from now on
	s.hang.close()
	return nil
}

// answerReserve is what Shutdown keeps of a shutdown's time left for the end: for writing the answers of
// the requests still held and stopping the tenants of the routes still open. A tenth, at most a second.
func answerReserve(left time.Duration) time.Duration { return max(0, min(time.Second, left/10)) }

// TrustedProxy reports whether peer is inside the running config's trusted_proxies: a proxy whose
// X-Forwarded-* and Forwarded the upstream clients pass on as the client's (internal/upstream), and
// whose connections must open with a PROXY header on a listener that asks for one (trust.Wrap). It
// reads the routing table, so it follows reloads; it is safe for concurrent use.
func (s *Server) TrustedProxy(peer netip.Addr) bool { return s.table.Load().trusts(peer) }

// tunnelTimeout is the running config's edge.tunnel_timeout, which the upstream clients ask at each
// switch of protocols (a WebSocket's 101): a reload bounds the tunnels that open after it.
func (s *Server) tunnelTimeout() time.Duration { return s.table.Load().edge.TunnelTimeout }

// ProxyProtocol reports which edge listeners the running config has expect a PROXY header
// (proxy_protocol): what the listeners ask as they accept each connection (trust.Wrap), so a reload
// turns it on or off for the connections accepted after it. It is safe for concurrent use.
func (s *Server) ProxyProtocol() registry.ProxyProtocol { return s.table.Load().proxy }

// ServeHTTP is the edge: route, hold, proxy.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor == 1 && r.ContentLength != 0 {
		// Until takeBody has the body (and takes this back), an answer closes the connection: net/http
		// would read an unread body's rest before writing it, with no deadline (the edge has no
		// ReadTimeout, and edge.body_timeout bounds only the bodies the edge takes), so a client that
		// declared a body and sent none held its refused request's connection, busy, for ever
		// (TestRefusedBeforeItsBody).
		w.Header().Set("Connection", "close")
	}
	if w, r = s.hygiene(w, r); r == nil {
		return // refused before routing (hygiene.go)
	}
	t := s.table.Load()
	hdr, err := measureHeader(r, &t.edge)
	if err != nil {
		s.opts.Metrics.requestCounter(unknownRoute)(writeError(w, r, err))
		return
	}
	if r.URL.Path == waitpage.EventsPath {
		s.serveEvents(w, r, t) // on every host, before routing by path (waiting.go)
		return
	}
	rt := t.lookup(r.Host, r.URL.Path)
	if rt == nil {
		writeError(w, r, fmt.Errorf("%w %q", ErrUnknownHost, hostOnly(r.Host)))
		s.opts.Metrics.requestCounter("_unknown")(http.StatusNotFound)
		return
	}
	sw := &statusWriter{ResponseWriter: w}
	if r.ProtoMajor == 2 {
		sw.stall = t.edge.SendTimeout
	}
	parked := false
	defer func() {
		if !parked { // a parked request is counted when it is answered (park.go)
			rt.count(sw.statusCode())
			sw.abortIfGone()
		}
	}()
	// A browser navigation to a route that is not awake gets the waiting page at once (waiting.go). The
	// warm path pays the one atomic load.
	if !rt.in.awake.Load() && waitpage.Wanted(r) && !rt.in.ignores(r) && rt.in.serveWaiting(sw, r) {
		return
	}
	// The body first: a slow upload must neither wake the tenant nor hold, nor take a slot. While the
	// edge reads it, the request waits at the edge as a held one does, for as long as its client takes,
	// and counts as one: else only edge.max_conns bounded them, and one HTTP/2 connection carries 250.
	charge := holdCharge{acct: &s.held, lim: &t.edge, bytes: hdr}
	if buffersBody(r, rt.in.route) {
		if err := charge.take(); err != nil {
			sw.fail(r, err)
			return
		}
	}
	body, err := s.takeBody(sw, r, rt.in.route, &t.edge)
	if err == nil {
		if err = charge.grow(body.InMemory()); err != nil {
			body.Close()
		}
	}
	if err != nil {
		charge.give()
		sw.fail(r, err)
		return
	}
	if parked = s.park(w, r, rt, body, charge); parked {
		return // held without this goroutine or the connection's buffers
	}
	defer body.Close()
	var release func()
	rt, release, err = s.acquireRouted(rt, r, &charge)
	s.answer(sw, r, rt.in, &charge, release, err)
	if s.loops != nil {
		s.toLoop(w, sw, r, rt.in)
	}
}

// reroutes bounds how many times acquireRouted follows a route to its new instance: once per reload
// that lands while the request is held, which a few cover.
const reroutes = 4

// acquireRouted is acquireRequest on rt's instance, or, when a reload has replaced that instance
// (errRetired), on the instance the table routes r to now, which it returns with the release. A
// request looks its route up once, before it is held; a reload that lands meanwhile retires the
// instance it found, which serves it if it is awake and else hands it on. The instance is retired only
// after the new table is published (Apply), and Apply runs under s.mu: taking it once waits out an
// Apply that is publishing, so the lookup that follows sees the new table. A route the reload removed
// is answered as an unknown host, as its next request would be.
func (s *Server) acquireRouted(rt *routed, r *http.Request, c *holdCharge) (*routed, func(), error) {
	for range reroutes {
		release, err := rt.in.acquireRequest(r, c)
		if !errors.Is(err, errRetired) {
			return rt, release, err
		}
		s.mu.Lock()
		//lint:ignore SA2001 an empty critical section: it waits for an Apply that holds s.mu to finish
		s.mu.Unlock()
		next := s.table.Load().lookup(r.Host, r.URL.Path)
		if next == nil {
			return rt, nil, fmt.Errorf("%w %q", ErrUnknownHost, hostOnly(r.Host))
		}
		rt = next
	}
	return rt, nil, ErrClosed
}

// answer answers r once its hold is over: with err, or through the route's upstream, once a slot is
// free, with release called when it is done.
func (s *Server) answer(sw *statusWriter, r *http.Request, in *instance, charge *holdCharge, release func(), err error) {
	if err != nil {
		charge.give()
		charge.writer(sw) // a request that was held is answered with its Server-Timing and wake id too
		sw.fail(r, err)
		return
	}
	defer release()
	// A herd released at once parks in admit; what it builds for its response comes after, so the
	// last of them leaves the hold sooner.
	done, err := in.admit(r.Context(), charge)
	out := charge.writer(sw) // sw; for a request that was held, with Server-Timing and the wake id (servertiming.go)
	if err != nil {
		sw.fail(r, err) // the client went away, or no slot came within the hold budget
		return
	}
	defer done()
	in.serve(out, r)
}

// Wake wakes the named route and waits for the result (admin API). A reload that replaces the route's
// instance while the wake waits to begin (errRetired) sends it to the new one, as acquireRouted does
// for requests.
func (s *Server) Wake(ctx context.Context, route string) error {
	for range reroutes {
		in := s.instance(route) // under s.mu: never an instance an Apply has begun to replace
		if in == nil {
			return fmt.Errorf("%w: %q", errNoRoute, route)
		}
		if err := in.wakeNow(ctx); !errors.Is(err, errRetired) {
			return err
		}
	}
	return ErrClosed
}

// Sleep puts the named route to sleep and waits until it is asleep (admin API).
func (s *Server) Sleep(ctx context.Context, route string) error {
	in := s.instance(route)
	if in == nil {
		return fmt.Errorf("%w: %q", errNoRoute, route)
	}
	return in.sleepNow(ctx, ReasonAdmin)
}

// Statuses reports every route, in config order.
func (s *Server) Statuses() []Status {
	t := s.table.Load()
	out := make([]Status, 0, len(t.order))
	for _, in := range t.order {
		out = append(out, in.status())
	}
	return out
}

var errNoRoute = errors.New("no such route")

func (s *Server) instance(name string) *instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.instances[name]
}

// statusWriter records the status code. It unwraps for http.ResponseController, so flushing and the
// hijack that WebSocket upgrades need reach the real writer.
type statusWriter struct {
	http.ResponseWriter
	code int
	n    int64     // body bytes written
	body *streamed // the request's unbuffered, bounded body, if any (see streamed.cause)
	// stall, for an HTTP/2 request, is edge.send_timeout: each write and flush of its answer sets the
	// stream's write deadline that far ahead (bound). 0 for HTTP/1, whose connections keep the bound
	// themselves (framingConn.Write).
	stall time.Duration
	gone  bool // fail found the client gone, and wrote no answer: see abortIfGone
}

// bound gives an HTTP/2 answer's next write stall to reach the client. A stream waits for its
// client's flow-control window, which a client that reads its connection but not the answer never
// grants: the connection's own WriteByteTimeout then never fires, and the stream kept its route's
// upstream slot for ever (TestStalledClientsGiveBackUpstreamSlots/h2c got 503 at hold.max_time).
func (w *statusWriter) bound() {
	if w.stall > 0 {
		_ = http.NewResponseController(w.ResponseWriter).SetWriteDeadline(time.Now().Add(w.stall))
	}
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 || w.code < 200 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	w.bound()
	n, err := w.ResponseWriter.Write(b)
	w.n += int64(n)
	return n, err
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		w.bound()
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack takes the connection for a switch of protocols: the ReverseProxy's answer to an Upgrade (a
// WebSocket), which writes the tenant's 101 on the hijacked connection itself, past WriteHeader. It
// counts as that 101; before, as the 200 of a handler that wrote nothing. (http.ResponseController
// finds it before Unwrap; the edge's own hijack, parking, takes the writer under this one.)
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil && w.code == 0 {
		w.code = http.StatusSwitchingProtocols
	}
	return c, brw, err
}

// fail answers r with err (writeError), unless the client went away (r's context ended): then nobody
// is there to read an answer, and only the metrics see one, 499. It is the edge's one "client went
// away" check, for the hold, the upstream slot and the upstream exchange alike. A body refused for its
// length or its silence is answered all the same: net/http ends the context on the read error, but
// the client is still there (bodyRefused).
func (w *statusWriter) fail(r *http.Request, err error) {
	if err = w.body.cause(err); r.Context().Err() != nil && !bodyRefused(err) {
		w.code, w.gone = 499, true
		return
	}
	writeError(w, r, err)
}

// abortIfGone ends a request that fail found its client gone from without an answer: it aborts the
// connection (over HTTP/2, the stream) with http.ErrAbortHandler, which net/http recovers silently.
// Returned from instead, the handler let net/http write an empty "200 OK", and a client that had only
// half-closed its connection after its request (its FIN ends the request's context as a departure
// does) read that, before the wake had even finished, as its answer (found with real sockets; a
// parked request is answered instead, park.go). The edge's handlers call it last, in their first
// deferred function, so that everything else has unwound.
func (w *statusWriter) abortIfGone() {
	if w.gone {
		panic(http.ErrAbortHandler)
	}
}

func (w *statusWriter) statusCode() int {
	if w.code == 0 {
		return http.StatusOK
	}
	return w.code
}

func hostOnly(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		return host
	}
	return strings.TrimSuffix(h, ".")
}

// SetCheckError records that route's live host check (tenant.Checker) failed at start-up; nil clears
// it. It neither blocks nor wakes anything, so a slow or failing check holds up no other route. The
// route's status shows it (check_error), and a wake of the route that fails carries it in its error
// and its record. It holds for the route's name across reloads until cleared, or until a config
// without that route is applied.
func (s *Server) SetCheckError(route string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		delete(s.checks, route)
	} else {
		s.checks[route] = err
	}
	if in := s.instances[route]; in != nil {
		in.setCheckError(err)
	}
}
