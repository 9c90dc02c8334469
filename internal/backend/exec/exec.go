// Package exec is the exec backing: a route's tenant is a plain executable the activator starts as a
// child process on Wake and stops (or freezes) on Sleep.
//
// The child is started directly from argv (never through a shell) in its own process group, with the
// parent-death signal set to SIGKILL (it is forked from one of a few OS threads that live as long as
// the activator, and no thread waits for it: fork.go). Where the activator has a writable cgroup v2 (Containment, decided at start-up by
// Contain), the child is also cloned straight into a cgroup of its own, named after the route below
// the activator's cgroup_root, so its whole process tree is known whatever it does: Sleep and Close end
// that tree with cgroup.kill (a grandchild that left the process group with setsid or a double fork
// included), a tenant whose main process exits cleanly while its cgroup still holds processes has
// daemonized and is reported so (*DaemonError), and the next activator kills what a SIGKILLed one
// left. `sleep: freeze` freezes that cgroup instead of stopping the tenant, and memory_max, cpu_max
// and pids_max are written to it. Without cgroups, stop signals and SIGKILL go to the process group,
// the activator is a child subreaper and reaps the group's grandchildren on sleep, and a process that
// leaves the group is beyond the backend's reach.
//
// Its stdout and
// stderr are drained continuously (a chatty child never blocks), logged line by line at Info within a
// rate limit (100 lines at once, then 20 a second; suppressed lines are counted and reported at Warn),
// and the last 64 KiB kept whole: a child that exits on its own ends its Life with an *ExitError that
// quotes the end of that output.
//
// The child inherits the activator's environment, minus LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES and
// NOTIFY_SOCKET (meant for the activator itself) and minus every variable the config names as a secret
// (Options.SecretEnv), plus the listen mode's variables and the route's env. A secret's name that the
// route's own env sets explicitly is the operator's choice, and the child gets that value.
//
// How the child learns where to listen is the route's `listen` mode: in the environment (PORT and HOST,
// or SOCKET), as an inherited pre-bound socket (systemd's LISTEN_FDS protocol, through a shim: see
// package shim), or not at all.
//
// With `standby: true` each sleep that stopped the tenant spawns the next child at once, held by its
// shim before the exec until a wake lets it go on (standby.go).
//
// Ownership: a Backend owns its child, its standby, the goroutines that spawn, drain and reap them,
// and (in listen_fds mode) the listening socket, from the first Wake until Close, which joins them all.
package exec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/activator/activator/internal/backend/exec/shim"
	"github.com/activator/activator/internal/backend/exec/shim/native"
	"github.com/activator/activator/internal/cgroup"
	"github.com/activator/activator/internal/foreign"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// Phases this backing reports to the wake Tracker.
const (
	PhaseSpawn       = "spawn"        // fork and exec of the child
	PhaseReadyMarker = "ready_marker" // waiting for the ready marker in the child's output
	PhaseThaw        = "thaw"         // sleep: freeze: thawing the tenant's cgroup
)

// ErrClosed is returned by Wake after Close, and ends the Life of a child that Close stopped.
var ErrClosed = errors.New("exec backend closed")

// Options configure a Provider.
type Options struct {
	// Logger receives the backing's logs, including the lines the children print (at Info, with keys
	// route, stream, pid and line) up to a rate limit per child, and at Warn "tenant output
	// rate-limited: suppressed N lines" (keys route, stream, pid and suppressed) for the lines beyond
	// it. Default: slog.Default().
	Logger *slog.Logger
	// Shim is the executable re-executed as the listen_fds shim where the native shim and /bin/sh are
	// not used (default: os.Executable()). It must link package shim, which every program importing
	// this package does.
	Shim string
	// SecretEnv returns the names of the environment variables that hold secrets (a Redfish route's
	// password_env, the admin token's variable): none reaches a child through the activator's own
	// environment. It is called at every spawn, so a reload that names a new secret applies to the next
	// child; it must be safe for concurrent use. Nil: no names.
	SecretEnv func() []string
	// Containment is how children are contained (Contain); nil: process groups only, without the
	// child subreaper, as before cgroups (tests). Provider.Open sets it to the Provider's.
	Containment *Containment

	// standbys counts the standbys waiting in all of a Provider's backends, for maxStandbys; set by
	// Provider.Open. Nil: not counted (tests).
	standbys *atomic.Int64
	// native is the path of the native shim (package shim/native), which then starts every child that
	// needs a shim; set by Provider.Open where the shim opened. "": /bin/sh or Shim.
	native string
}

// The contract this backing keeps, checked by the compiler: were a method's signature to drift, the
// activator would silently stop finding the ability.
var (
	_ tenant.Opener       = (*Provider)(nil)
	_ tenant.Checker      = (*Provider)(nil)
	_ tenant.SharedCloser = (*Provider)(nil)
	_ tenant.Backend      = (*Backend)(nil)
	_ tenant.Closer       = (*Backend)(nil)
	_ tenant.Stopper      = (*Backend)(nil)
	_ tenant.Preparer     = (*Backend)(nil)
)

// Provider opens exec backends. It holds the Containment (from Contain until Close) and knows the
// latest Backend of each route, for Usage.
type Provider struct {
	opts Options

	standbys atomic.Int64 // standbys waiting in its backends (maxStandbys)

	mu   sync.Mutex // guards the fields below
	cont *Containment
	live map[string]*Backend // route -> its latest Backend; closed ones are dropped by Usage
	// checkRoot is the config's cgroup_root for Check before Contain (CheckRoot); probed is what
	// probing it found, made by the first such Check: the probe reads /proc/self/mountinfo and
	// /proc/self/cgroup, and made afresh for each route it was 9 of the 16 s `activator check` took
	// at 100,000 routes.
	checkRoot string
	probed    *Containment
	// native is the native shim, opened for the first route that needs a shim (nativeLocked); nil
	// before, or where it did not open (nativeErr says why).
	native      *native.Shim
	nativeErr   error
	nativeTried bool
}

// NewProvider returns a Provider. Its backends use o.Containment until Contain sets one.
func NewProvider(o Options) *Provider {
	return &Provider{opts: o, cont: o.Containment, live: map[string]*Backend{}}
}

// Contain decides how this Provider's tenants are contained (see Contain, the function) and, with
// cgroups, kills what an earlier activator left in the cgroup root. Call it once, at start-up, before
// the first Open; root is the config's cgroup_root.
func (p *Provider) Contain(ctx context.Context, root string) error {
	c, err := Contain(ctx, root, p.opts.Logger)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cont = c
	return nil
}

// CheckRoot tells Check, when Contain has not run (`activator check`), which cgroup_root the config
// names, so that it judges that root rather than the automatic one. It creates and locks nothing.
func (p *Provider) CheckRoot(root string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.checkRoot, p.probed = root, nil
}

// Close releases the Containment and the native shim (tenant.SharedCloser), after every Backend has
// been closed.
func (p *Provider) Close() error {
	p.mu.Lock()
	c, n := p.cont, p.native
	p.cont, p.native = nil, nil
	p.mu.Unlock()
	return errors.Join(c.Close(), n.Close())
}

// nativeLocked opens the native shim on its first call and returns it, or nil where it did not open:
// the exec backing then starts shims through /bin/sh or its own binary, as Options.Shim says, which
// costs a listen_fds wake about 0.8 ms more (3 ms through its own binary). That is logged once, with why.
func (p *Provider) nativeLocked() *native.Shim {
	if !p.nativeTried {
		p.nativeTried = true
		p.native, p.nativeErr = native.Open()
		switch {
		case errors.Is(p.nativeErr, native.ErrUnsupported):
		case p.nativeErr != nil:
			log := p.opts.Logger
			if log == nil {
				log = slog.Default()
			}
			log.Warn("exec: the native shim is unavailable; listen_fds tenants and standbys start through /bin/sh or the activator's own binary instead", "err", p.nativeErr)
		}
	}
	return p.native
}

// Open returns the Backend of r, whose Settings must be what Decode returned.
func (p *Provider) Open(r *registry.Route) (tenant.Backend, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	o := p.opts
	o.Containment = p.cont
	o.standbys = &p.standbys
	if s, ok := r.Settings.(*Settings); ok && s != nil && needsShim(s) {
		if n := p.nativeLocked(); n != nil {
			o.native = n.Path()
		}
	}
	b, err := New(r, o)
	if err != nil {
		return nil, err
	}
	p.live[r.Name] = b
	return b, nil
}

// Check reports what of r's settings this host cannot honour (tenant.Checker): `sleep: freeze` and
// limits without cgroups, and limits whose controller is not enabled for the cgroup root; and, unless
// cgroup_root is off, that tenants are contained by process group only. Before Contain (`activator
// check`) it looks at the automatic root, creating nothing.
func (p *Provider) Check(ctx context.Context, r *registry.Route) error {
	s, ok := r.Settings.(*Settings)
	if !ok || s == nil {
		return tenant.Terminal(fmt.Errorf("route %q has no exec settings (got %T)", r.Name, r.Settings))
	}
	p.mu.Lock()
	c := p.cont
	if c == nil {
		if p.probed == nil {
			p.probed = probe(p.checkRoot)
		}
		c = p.probed
	}
	p.mu.Unlock()
	err := c.check(s)
	if !c.cgroup && c.reason != "cgroup_root: off" {
		// Terminal as a fact of the host: checking again finds the same until an operator delegates a
		// cgroup (or sets cgroup_root: off to accept it).
		err = errors.Join(tenant.Terminal(fmt.Errorf("exec tenants are contained by process group only here (%s): a process that leaves its group (setsid, double fork) can outlive the activator", c.reason)), err)
	}
	return err
}

// Usage is one tenant cgroup's usage, for metrics.
type Usage struct {
	Route string
	cgroup.Stat
}

// Usage reads the cgroup usage of each route's latest Backend that has had a cgroup (from its first
// wake until Close), sorted by route: CPU time summed over all its wakes, and the memory and pids of
// a tenant that runs or is frozen (HasMemory and HasPids false otherwise).
func (p *Provider) Usage() []Usage {
	p.mu.Lock()
	defer p.mu.Unlock()
	// Sorted once they are found: sorting every route's name first allocated and sorted all of them
	// at every scrape (about 9 MB at 100,000 routes, of which only the woken have a cgroup).
	var us []Usage
	for route, b := range p.live {
		st, ok, closed := b.usage()
		if closed {
			delete(p.live, route)
			continue
		}
		if ok {
			us = append(us, Usage{Route: route, Stat: st})
		}
	}
	slices.SortFunc(us, func(a, b Usage) int { return strings.Compare(a.Route, b.Route) })
	return us
}

// Backend runs one route's child process. It implements tenant.Backend, tenant.Closer and
// tenant.Stopper. Wake, Sleep, Stop, Close and PID are safe for concurrent use.
type Backend struct {
	baseLog  *slog.Logger
	logOnce  sync.Once
	log      *slog.Logger // baseLog with the route's attributes, made on first use; use logger()
	route    string
	settings *Settings
	upstream registry.Upstream
	shim     string          // the executable that keeps package shim's protocol: Options.native, or Options.Shim
	native   bool            // shim is the native shim, which every shimmed child uses, without /bin/sh
	secrets  func() []string // Options.SecretEnv; nil for none
	cont     *Containment    // nil: process groups only
	standbys *atomic.Int64   // Options.standbys
	closing  chan struct{}   // closed by Close: aborts a Wake waiting for the ready marker
	wg       sync.WaitGroup

	cpuUsed atomic.Int64 // CPU time of the tenant's earlier cgroups, in ns (each wake gets a new one)

	mu     sync.Mutex // guards the fields below
	closed bool
	group  *cgroup.Group // the name of the tenant's cgroups, claimed at the first spawn; nil before
	proc   *proc         // the latest child, possibly exited; nil before the first Wake
	// standby (standby: true) is the next child, started at the last sleep or with the route (Prepare)
	// and waiting at its gate; nil when there is none. It holds the route's cgroup while it waits, so
	// no other child starts before it is released or dropped.
	standby *standby
	ln      net.Listener // listen_fds mode: bound at the first spawn, kept across sleeps, closed by Close
	lnFile  *os.File     // a dup of ln's socket, handed to each child as fd 3
}

// logger is the route's logger. It is made on first use: with thousands of configured routes that
// never wake, a logger each (a copy of the handler with the route's attributes) was a tenth of the
// activator's heap.
func (b *Backend) logger() *slog.Logger {
	b.logOnce.Do(func() { b.log = b.baseLog.With("backing", "exec", "route", b.route) })
	return b.log
}

// New returns r's Backend. It starts nothing: the first Wake spawns the child (and, in listen_fds mode,
// binds the upstream), or with standby: true Prepare its standby.
func New(r *registry.Route, o Options) (*Backend, error) {
	s, ok := r.Settings.(*Settings)
	if !ok || s == nil {
		return nil, fmt.Errorf("exec: route %q has no exec settings (got %T)", r.Name, r.Settings)
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	b := &Backend{
		baseLog:  log,
		route:    r.Name,
		settings: s,
		upstream: r.Upstream,
		shim:     o.Shim,
		secrets:  o.SecretEnv,
		cont:     o.Containment,
		standbys: o.standbys,
		closing:  make(chan struct{}),
	}
	if o.native != "" {
		b.shim, b.native = o.native, true
	}
	if needsShim(s) && b.shim == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("exec: listen_fds and standby need the activator's own executable as a shim: %w", err)
		}
		b.shim = exe
	}
	return b, nil
}

// Wake spawns the child and returns its Life while it runs; it never waits for the child to exit. With
// a ready marker configured it returns only once a line of output contains the marker, and fails with
// the child's *ExitError if it exits first (or, after killing the child, with ctx's error). Wake on a
// running child returns its Life at once. A failed Wake leaves no child running.
func (b *Backend) Wake(ctx context.Context, t tenant.Tracker) (*tenant.Life, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("exec: wake: %w", err)
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, ErrClosed
	}
	if p := b.proc; p != nil && p.isFrozen() && !p.exited() {
		defer b.mu.Unlock()
		t.Phase(PhaseThaw)
		return b.thawLocked(ctx, p)
	}
	if p := b.proc; p != nil {
		if life := p.liveLife(); life != nil {
			b.mu.Unlock()
			return life, nil
		}
		// Its Life ended but its owner is still killing what is left and reaping: wait, so that the old
		// tree is gone (and its port free) before a new child starts.
		select {
		case <-p.done:
		case <-ctx.Done():
			b.mu.Unlock()
			return nil, fmt.Errorf("exec: wake: the previous child (pid %d) is still being reaped: %w", p.pid, ctx.Err())
		}
	}
	t.Phase(PhaseSpawn)
	if b.settings.Listen != ListenFDs { // in listen_fds mode the activator holds the upstream itself
		if err := foreign.Check(ctx, b.upstream.Network, b.upstream.Address); err != nil {
			b.mu.Unlock()
			return nil, fmt.Errorf("exec: %w", err)
		}
	}
	p, standby := b.releaseStandbyLocked(ctx, t), true
	if p == nil {
		standby = false
		var err error
		if p, err = b.spawnLocked(ctx, nil); err != nil {
			b.mu.Unlock()
			return nil, err
		}
	}
	b.proc = p
	b.mu.Unlock()
	b.logger().Info("spawned", "pid", p.pid, "argv", b.settings.Argv, "listen", string(b.settings.Listen), "standby", standby)

	if p.marker == nil {
		return p.currentLife(), nil
	}
	t.Phase(PhaseReadyMarker)
	var cause error
	select {
	case <-p.ready:
		return p.currentLife(), nil
	case <-p.done:
		select {
		case <-p.ready: // printed the marker, then exited: the Life tells
			return p.currentLife(), nil
		default:
		}
		t.Note(fmt.Sprintf("exited before printing the ready marker %q", b.settings.ReadyMarker))
		return nil, p.failed
	case <-ctx.Done():
		cause = ctx.Err()
	case <-b.closing:
		cause = ErrClosed
	}
	t.Note(fmt.Sprintf("ready marker %q not seen: %v; killing pid %d", b.settings.ReadyMarker, cause, p.pid))
	if err := b.stop(context.Background(), p, syscall.SIGKILL, 0, cause); err != nil {
		b.logger().Error("kill after failed wake", "pid", p.pid, "err", err)
	}
	return nil, fmt.Errorf("exec: waiting for ready marker %q: %w", b.settings.ReadyMarker, cause)
}

// Sleep puts the tenant to sleep in the route's mode. stop (the default): the stop signal to the
// child's process group, SIGKILL to the whole tenant (its cgroup, or its process group) after the
// stop grace or at once when ctx ends, and it returns once the child has been reaped. freeze: it
// freezes the tenant's cgroup and returns once the kernel says it is frozen; the processes stay, and
// the next Wake thaws them. Either way the Life ends with tenant.ErrSlept. A failed freeze leaves the
// tenant running (thawed) and its Life going on. Sleep with no child running returns nil.
func (b *Backend) Sleep(ctx context.Context) error {
	b.mu.Lock()
	p := b.proc
	b.mu.Unlock()
	if p == nil {
		return nil
	}
	if b.settings.Sleep == SleepFreeze && p.running() {
		return b.freeze(ctx, p)
	}
	if err := b.stop(ctx, p, b.settings.StopSignal, b.settings.StopGrace, tenant.ErrSlept); err != nil {
		return err
	}
	if b.settings.Standby && !tenant.IsLastSleep(ctx) { // no standby for a route that a reload retires
		b.prepareStandby(ctx, "at the last sleep")
	}
	return nil
}

// Stop stops the tenant for real whatever the sleep mode (tenant.Stopper), thawing a frozen one
// first: the stop signal, then SIGKILL after the stop grace. The activator calls it after a failed
// health gate, so a broken tenant is never parked to be thawed broken.
func (b *Backend) Stop(ctx context.Context) error {
	b.mu.Lock()
	p := b.proc
	b.mu.Unlock()
	if p == nil {
		return nil
	}
	b.unfreeze(ctx, p)
	return b.stop(ctx, p, b.settings.StopSignal, b.settings.StopGrace, tenant.ErrSlept)
}

// freeze freezes p's cgroup and ends its Life with ErrSlept.
func (b *Backend) freeze(ctx context.Context, p *proc) error {
	if p.group == nil {
		return tenant.Terminal(fmt.Errorf("exec: sleep: freeze needs the tenant in a cgroup of its own, and exec tenants are not in cgroups here (%s); the tenant keeps running", b.cont.reasonOr()))
	}
	if err := p.group.Freeze(ctx); err != nil {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reapGrace)
		defer cancel()
		if terr := p.group.Thaw(tctx); terr != nil {
			b.logger().Error("thaw after a failed freeze", "pid", p.pid, "err", terr)
		}
		return fmt.Errorf("exec: sleep: freeze: %w; the tenant keeps running", err)
	}
	p.mu.Lock()
	p.frozen = true
	life := p.life
	p.mu.Unlock()
	life.End(tenant.ErrSlept)
	b.logger().Info("frozen", "pid", p.pid, "cgroup", p.group.Dir())
	return nil
}

// thawLocked thaws a frozen p and gives it a new Life. A thaw that fails kills the tenant: a failed
// Wake leaves nothing running.
func (b *Backend) thawLocked(ctx context.Context, p *proc) (*tenant.Life, error) {
	if err := p.group.Thaw(ctx); err != nil {
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reapGrace)
		defer cancel()
		if kerr := b.stop(kctx, p, syscall.SIGKILL, 0, tenant.ErrSlept); kerr != nil {
			b.logger().Error("kill after a failed thaw", "pid", p.pid, "err", kerr)
		}
		return nil, fmt.Errorf("exec: thaw %s: %w", p.group.Dir(), err)
	}
	life := tenant.NewLife()
	p.mu.Lock()
	p.frozen = false
	p.life = life
	p.mu.Unlock()
	b.logger().Info("thawed", "pid", p.pid)
	if p.exited() { // died while thawing: its owner ended the old Life only, so end this one too
		life.End(p.failed)
		return nil, fmt.Errorf("exec: the tenant died while it was thawed: %w", p.failed)
	}
	return life, nil
}

// unfreeze thaws p if Sleep froze it, so that a stop signal reaches it; best effort (SIGKILL reaches a
// frozen tenant anyway).
func (b *Backend) unfreeze(ctx context.Context, p *proc) {
	if !p.isFrozen() {
		return
	}
	if err := p.group.Thaw(ctx); err != nil {
		b.logger().Warn("thaw before stop", "pid", p.pid, "err", err)
	}
	p.mu.Lock()
	p.frozen = false
	p.mu.Unlock()
}

// spawnLocked starts the next child in a new cgroup (see groupLocked); gate (nil: none) makes it a
// standby, waiting at that pipe's read end before its exec.
func (b *Backend) spawnLocked(ctx context.Context, gate *os.File) (*proc, error) {
	g, err := b.groupLocked(ctx)
	if err != nil {
		return nil, err
	}
	sp, err := b.specLocked(gate)
	if err != nil {
		return nil, err
	}
	p, err := b.startLocked(sp, g, gate != nil)
	if err != nil {
		return nil, fmt.Errorf("exec: start %s: %w", sp.path, err)
	}
	return p, nil
}

// groupLocked makes a new cgroup for the next child, with its limits, or returns nil without cgroups.
// The group is new at every spawn, never one reused after cgroup.kill: on some kernels (seen on 6.18)
// every process cloned into a group that was once killed is SIGKILLed at birth (clone3's
// CLONE_INTO_CGROUP compares the kill counts of the wrong groups). Its owner removes it once the
// child is gone. The name, the route's, is claimed at the first spawn and kept until Close.
func (b *Backend) groupLocked(ctx context.Context) (*cgroup.Group, error) {
	if b.cont == nil || !b.cont.cgroup {
		if b.settings.Sleep == SleepFreeze || len(b.settings.Limits.controllers()) > 0 {
			return nil, b.cont.checkOrOff(b.settings)
		}
		return nil, nil
	}
	if b.group == nil {
		if err := b.cont.check(b.settings); err != nil {
			return nil, fmt.Errorf("exec: %w", err)
		}
		if err := b.cont.enable(b.settings.Limits); err != nil {
			return nil, fmt.Errorf("exec: enable cgroup controllers: %w", err)
		}
		g := b.cont.claim(b.route)
		b.group = &g
	}
	g := *b.group
	// One mkdir on the spawn's critical path; the stats of a make-if-missing are for what is rare.
	err := unix.Mkdir(g.Dir(), 0o755)
	if errors.Is(err, unix.EEXIST) { // a group whose removal failed: clear it away
		if err := g.Kill(ctx); err != nil {
			return nil, fmt.Errorf("exec: clear the tenant's old cgroup: %w", err)
		}
		if err := g.Remove(); err != nil {
			return nil, fmt.Errorf("exec: clear the tenant's old cgroup: %w", err)
		}
		err = unix.Mkdir(g.Dir(), 0o755)
	}
	if errors.Is(err, unix.ENOENT) { // the root itself is gone: make it again, and lock it again
		if err = b.cont.root.Make(); err == nil {
			if err = b.cont.retake(); err != nil {
				return nil, fmt.Errorf("exec: %w", tenant.Terminal(err))
			}
			err = unix.Mkdir(g.Dir(), 0o755)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("exec: cgroup: create %s: %w", g.Dir(), err)
	}
	if b.cont.mark {
		_ = unix.Setxattr(g.Dir(), markAttr, []byte(b.route), 0)
	}
	for _, l := range b.settings.Limits.controllers() {
		if err := g.Write(l.file, l.value); err != nil {
			_ = g.Remove()
			return nil, fmt.Errorf("exec: %s: %w", l.key, err)
		}
	}
	return &g, nil
}

// retire removes the cgroup of a child that is gone, adding its CPU time to the tenant's total.
func (b *Backend) retire(g *cgroup.Group) {
	if st, err := g.Stat(); err == nil {
		b.cpuUsed.Add(int64(st.CPU))
	}
	if err := g.Remove(); err != nil {
		b.logger().Warn("remove the tenant's cgroup", "err", err)
	}
}

// usage is the tenant's cgroup usage: the CPU time of all its cgroups so far, and the running one's
// memory and pids. ok is false before the first cgroup; closed reports whether b is closed.
func (b *Backend) usage() (st cgroup.Stat, ok, closed bool) {
	b.mu.Lock()
	p, named, closed := b.proc, b.group != nil, b.closed
	b.mu.Unlock()
	if !named {
		return st, false, closed
	}
	if p != nil && p.group != nil && !p.exited() {
		st, _ = p.group.Stat()
		if p.exited() { // retired meanwhile: its CPU may be counted in cpuUsed already
			st = cgroup.Stat{}
		}
	}
	st.CPU += time.Duration(b.cpuUsed.Load())
	return st, true, closed
}

// Close stops the child as Sleep does (stop signal, SIGKILL after the grace or as soon as ctx ends;
// its Life ends with ErrClosed), kills a standby, releases the pre-bound listener and joins every
// goroutine of the backend. Wake fails with ErrClosed afterwards. Close is idempotent.
func (b *Backend) Close(ctx context.Context) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	close(b.closing)
	p, sb := b.proc, b.standby
	b.standby = nil
	if sb != nil {
		b.countStandby(-1)
	}
	b.mu.Unlock()

	var errs []error
	if sb != nil {
		if err := b.dropStandby(ctx, sb, ErrClosed); err != nil {
			errs = append(errs, err)
		}
	}
	if p != nil {
		b.unfreeze(ctx, p)
		if err := b.stop(ctx, p, b.settings.StopSignal, b.settings.StopGrace, ErrClosed); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		b.wg.Wait() // an unreapable child keeps its owner goroutine: then do not hang on it
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	if g := b.group; g != nil && len(errs) == 0 {
		b.cont.release(*g) // its last group is gone: the owner removed it
	}
	if b.ln != nil {
		if err := b.ln.Close(); err != nil {
			errs = append(errs, fmt.Errorf("exec: close listener: %w", err))
		}
		b.lnFile.Close()
		b.ln, b.lnFile = nil, nil
	}
	return errors.Join(errs...)
}

// PID is the pid of the running child, or 0.
func (b *Backend) PID() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.proc == nil || !b.proc.running() {
		return 0
	}
	return b.proc.pid
}

// stop stops p: sig to its process group, then SIGKILL to the whole tenant (its cgroup, or its
// process group) after grace or when ctx ends (at once when sig is SIGKILL or grace is 0); it returns
// once p has been reaped and its cgroup emptied. why is the Life's end reason.
func (b *Backend) stop(ctx context.Context, p *proc, sig syscall.Signal, grace time.Duration, why error) error {
	p.markStopping(why)
	if sig != syscall.SIGKILL && grace > 0 {
		if err := p.signal(sig); err != nil {
			b.logger().Warn("stop signal", "pid", p.pid, "signal", sig.String(), "err", err)
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-p.done:
			return nil
		case <-t.C:
			b.logger().Warn("still running after the stop grace, killing", "pid", p.pid, "signal", sig.String(), "stop_grace", grace)
			tenant.NoteForcedSleep(ctx, fmt.Sprintf("still running %s (stop_grace) after %s: killed (SIGKILL)", grace, unix.SignalName(sig)))
		case <-ctx.Done():
			b.logger().Warn("stop interrupted, killing", "pid", p.pid, "err", ctx.Err())
			tenant.NoteForcedSleep(ctx, fmt.Sprintf("the sleep's time ran out (%v) while the tenant did not exit on %s: killed (SIGKILL)", ctx.Err(), unix.SignalName(sig)))
		}
	}
	if err := p.kill(); err != nil {
		return fmt.Errorf("exec: kill pid %d: %w", p.pid, err)
	}
	t := time.NewTimer(reapGrace)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
		return fmt.Errorf("exec: pid %d not reaped %v after SIGKILL", p.pid, reapGrace)
	}
}

// specLocked builds the command line, environment and inherited files of the next child, binding the
// upstream first in listen_fds mode. gate (nil: none) is the read end of a standby's gate pipe, which
// the child inherits and its shim waits on.
func (b *Backend) specLocked(gate *os.File) (spec, error) {
	s := b.settings
	sp := spec{path: s.Path, args: s.Argv, dir: s.Dir}
	secret := b.secretNames()
	sp.secrets = secret
	env := inheritedEnv(secret)
	switch s.Listen {
	case ListenEnv:
		switch b.upstream.Network {
		case "tcp":
			host, port, err := net.SplitHostPort(b.upstream.Address)
			if err != nil {
				return spec{}, tenant.Terminal(fmt.Errorf("exec: upstream %s: %w", b.upstream, err))
			}
			env = append(env, "HOST="+host, "PORT="+port)
		case "unix":
			// A child killed earlier may have left its socket file behind; many apps then fail to bind.
			if err := removeStaleSocket(b.upstream.Address); err != nil {
				return spec{}, err
			}
			env = append(env, "SOCKET="+b.upstream.Address)
		}
	case ListenFDs:
		if err := b.listenLocked(); err != nil {
			return spec{}, err
		}
		env = append(env, "LISTEN_FDS=1", "LISTEN_FDNAMES="+b.route)
		sp.extra = []*os.File{b.lnFile}
	}
	for _, k := range sortedKeys(s.Env) {
		env = append(env, k+"="+s.Env[k])
	}
	// A shim runs between fork and the tenant's exec when the tenant's LISTEN_PID must be its own pid,
	// which only such a process can write (listen_fds; see package shim), and in a standby, which waits
	// at its gate before it execs the tenant.
	if fds := s.Listen == ListenFDs; fds || gate != nil {
		gateFD := 0
		if gate != nil {
			gateFD = 3 + len(sp.extra)
			sp.extra = append(sp.extra, gate)
		}
		if sh := binSh(); !b.native && sh != "" && s.Argv[0] == s.Path && shellSafeEnv(env) {
			sp.path = sh
			sp.args = append([]string{"sh", "-c", shellShim(fds, gateFD), s.Path}, s.Argv[1:]...)
		} else {
			mode := shim.ModeExec
			if fds {
				mode = shim.ModeListenFDs
			}
			env = append(env, shim.Env+"="+mode)
			if gate != nil {
				env = append(env, shim.GateEnv+"="+strconv.Itoa(gateFD))
			}
			sp.path = b.shim
			sp.args = append([]string{shim.Arg0, s.Path}, s.Argv...)
		}
	}
	sp.env = env
	return sp, nil
}

// needsShim reports whether s's children start through a shim: listen_fds, to set LISTEN_PID, and
// standbys, which wait at their gate.
func needsShim(s *Settings) bool { return s.Listen == ListenFDs || s.Standby }

// shellShim is the shim as a /bin/sh script. With a gate (a standby's pipe, at descriptor gate; 0:
// none) it first reads a line from it, exiting with shim.Cancelled at end of file, and closes it; in
// listen_fds mode it sets LISTEN_PID to the shell's pid, which exec keeps; then it execs the tenant ($0)
// with its arguments.
//
// The native shim (package shim/native, about 0.1 ms) is preferred to both where it opened; this is
// the fallback elsewhere. Why a shell when package shim exists: that shim is the activator's own 17 MB
// binary, whose exec and Go runtime start cost about 2.4 ms per listen_fds wake here (page faults,
// mostly); dash costs about 0.8 ms, and a waiting dash holds 0.1 MiB of its own where a waiting shim
// holds 1 MiB. The shell is used only
// where it changes nothing the tenant can see but PWD (which the shell sets to the working directory):
// argv[0] must be the resolved path itself, since `exec "$0"` makes it so, and every environment name
// must be one a POSIX shell passes on (dash drops others, such as "a.b" or "my-var"). Otherwise, or
// without /bin/sh, package shim does it.
func shellShim(listenFDs bool, gate int) string {
	var sc strings.Builder
	if gate > 0 {
		fmt.Fprintf(&sc, `read -r go <&%d || exit %d; exec %d<&-; `, gate, shim.Cancelled, gate)
	}
	if listenFDs {
		sc.WriteString(`export LISTEN_PID=$$; `)
	}
	sc.WriteString(`exec "$0" "$@"`)
	return sc.String()
}

// binSh is /bin/sh if it exists, else "". It is asked at every spawn (one stat, about a microsecond),
// not cached in a package variable.
func binSh() string {
	if fi, err := os.Stat("/bin/sh"); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
		return "/bin/sh"
	}
	return ""
}

// shellSafeEnv reports whether every name in env is a POSIX shell name ([A-Za-z_][A-Za-z0-9_]*), which a
// shell passes on to what it execs.
func shellSafeEnv(env []string) bool {
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if name == "" {
			return false
		}
		for i, c := range name {
			letter := c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
			if !letter && (i == 0 || c < '0' || c > '9') {
				return false
			}
		}
	}
	return true
}

// listenLocked binds the upstream once; the socket then stays open across sleeps, like a systemd
// socket unit, so connections made while the child starts wait in the backlog instead of being
// refused.
func (b *Backend) listenLocked() error {
	if b.ln != nil {
		return nil
	}
	u := b.upstream
	if u.Network == "unix" {
		if err := removeStaleSocket(u.Address); err != nil {
			return err
		}
	}
	ln, err := net.Listen(u.Network, u.Address)
	if err != nil {
		return bindFault(fmt.Errorf("exec: bind upstream %s for listen_fds: %w", u, err))
	}
	fl, ok := ln.(interface{ File() (*os.File, error) })
	if !ok {
		ln.Close()
		return fmt.Errorf("exec: bind upstream %s: %T has no file descriptor", u, ln)
	}
	f, err := fl.File()
	if err != nil {
		ln.Close()
		return fmt.Errorf("exec: bind upstream %s: %w", u, err)
	}
	b.ln, b.lnFile = ln, f
	b.logger().Info("bound upstream for listen_fds", "upstream", u.String())
	return nil
}

// removeStaleSocket removes a unix socket file nobody answers on; it refuses to remove anything else.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("exec: upstream socket: %w", err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return tenant.Terminal(fmt.Errorf("exec: upstream %s exists and is not a socket", path))
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return tenant.Terminal(fmt.Errorf("exec: upstream socket %s is in use by another process", path))
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("exec: remove stale socket: %w", err)
	}
	return nil
}

// inheritedEnv is the activator's environment without what must not leak into a child: socket
// activation and notification variables meant for the activator itself, the shim marker, and the
// variables named in secret. The route's own env is added after it, so a secret's name set there
// explicitly still reaches the child.
func inheritedEnv(secret []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "NOTIFY_SOCKET", shim.Env, shim.GateEnv:
			continue
		}
		if slices.Contains(secret, k) {
			continue
		}
		env = append(env, kv)
	}
	return env
}
