package activator

import (
	"context"
	"log/slog"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
	"github.com/activator/activator/internal/upstream"
)

// State is an instance's lifecycle state.
type State int

// States: asleep → waking → awake → stopping → asleep; failed after a failed wake, until its backoff
// runs out.
const (
	Asleep State = iota
	Waking
	Awake
	Stopping
	Failed
)

func (s State) String() string {
	switch s {
	case Asleep:
		return "asleep"
	case Waking:
		return "waking"
	case Awake:
		return "awake"
	case Stopping:
		return "stopping"
	case Failed:
		return "failed"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// parseState is State.String's inverse.
func parseState(name string) (State, bool) {
	for s := Asleep; s <= Failed; s++ {
		if s.String() == name {
			return s, true
		}
	}
	return 0, false
}

// StateNames are the names of the states a route can be in, as Status.State gives them.
func StateNames() []string {
	var names []string
	for s := Asleep; s <= Failed; s++ {
		names = append(names, s.String())
	}
	return names
}

// Sleep reasons, as in activator_sleeps_total{reason}.
const (
	ReasonIdle   = "idle"
	ReasonAdmin  = "admin"
	ReasonExited = "exited"
	ReasonReload = "reload"
)

// instance is one route's tenant as the activator sees it. It owns the state machine, the single wake,
// the in-flight count, the idle clock and the route's metric series. Its goroutines (wake, sleep, life
// watch, retirement, the keep_warm/wake_at scheduler) are joined by shutdown.
//
// What only a woken route needs (its upstream client, health gate and route-scoped logger) is built on
// first use, because most routes of a large config never wake.
type instance struct {
	// Set by newInstance (after, by Apply before the instance starts) and never written again.
	route   *registry.Route
	backend tenant.Backend
	newGate func() Gate
	baseLog *slog.Logger
	series  *instanceMetrics // the route's series, held until the instance retires; nil records nothing
	count   func(code int)   // activator_requests_total for this route
	// The instance as the event loop's target (loop.go), made at its first use; noLoop: the loop
	// cannot dial its upstream.
	loopT     atomic.Pointer[loopTarget]
	noLoop    atomic.Bool
	releaseFn func()          // in.release bound once: a method value made per request is an allocation
	unadmitFn func()          // in.unadmit bound once, for the same reason
	root      context.Context // the server's lifetime; wakes and sleeps derive from it, never from a request
	now       func() time.Time
	// slots admits requests to the proxy: one token per request being proxied, max_upstream_conns in
	// all. Requests past it wait here, in arrival order, before the proxy builds anything for them.
	slots chan struct{}
	// after holds the retired channels of every instance of this route name still retiring when this
	// one was made (the one it replaced, and any removed earlier): its first wake waits for them all,
	// so two instances never run one tenant.
	after   []<-chan struct{}
	retired chan struct{} // closed once the instance has retired (see retire)
	// hist is the route's history of wakes and sleeps; a changed route's new instance shares its
	// predecessor's (Apply). It has its own lock.
	hist *history
	// pages is the route's waiting page (waiting.go); a changed route's new instance shares its
	// predecessor's (Apply).
	pages *routePage
	// drain is the Server's, closed when the activator begins to shut down (Server.Drain): from then on
	// no wake starts. Set by Apply, like after.
	drain <-chan struct{}
	// filter is the route's ignore: matcher (filter.go); nil without one. releaseIgnoredFn is
	// in.releaseIgnored bound once, like releaseFn.
	filter           *filter
	releaseIgnoredFn func()
	// peer finds an instance of the running config by name: the requirements (chain.go) are looked up
	// at each wake, so a reload that replaces one is seen by the next. Set by Apply.
	peer func(name string) *instance
	// trusted is Server.TrustedProxy, for the upstream clients (nil trusts no proxy). Set by Apply.
	trusted func(netip.Addr) bool
	// tunnel is Server.tunnelTimeout, for the upstream clients (nil bounds no tunnel). Set by Apply.
	tunnel func() time.Duration
	// fleet is the instance's view of the route's fleet of members (fleet.go), nil for a single
	// tenant; then backend is the fleet's (fleet.fleetBackend), which a reload that keeps the tenant
	// hands on to the route's next instance with its own view.
	fleet *fleetView

	// Built on first use, each by its own synchronisation.
	logOnce sync.Once
	log     *slog.Logger // baseLog with the route's attributes; use logger()
	// up is the upstream client, built on first use and kept for the instance's life (see client).
	up atomic.Pointer[upstream.Client]

	// Used only by the wake goroutine, of which there is at most one at a time.
	prober Gate // built by the first wake

	wg sync.WaitGroup // joins every goroutine the instance starts

	// awake mirrors state == Awake (written with it, under mu) for the edge's one lock-free check
	// before it considers the waiting page.
	awake atomic.Bool

	mu       sync.Mutex // guards the fields below
	state    State
	since    time.Time     // when state last changed
	wake     *attempt      // the wake in progress (Waking) or the last one
	stopDone chan struct{} // closed when the sleep in progress (Stopping) ends
	lifeGen  uint64        // incremented on every state change away from Awake; stale watchers check it
	awakeEnd chan struct{} // closed when the instance leaves Awake: stops that period's life watcher
	inflight int           // requests being proxied
	unseen   int           // ignored requests being proxied: a sleep waits for them, the idle clock does not (filter.go)
	idleDue  uint64        // the idle timer of this generation found only ignored requests in flight (filter.go)
	held     int           // requests waiting for a wake
	holdSlot *holdSlot     // the hold limit requests held now share (holdLimitLocked); nil until the first
	fails    int           // consecutive failed wakes
	until    time.Time     // Failed: no new wake before this
	lastErr  *WakeError
	lastRec  *WakeRecord
	lastAtt  *attempt    // lastRec's attempt, for its release figures
	lastSlp  string      // reason of the last sleep
	slpErr   *SleepError // the last sleep's failure; nil once a sleep succeeds
	checkErr error       // the route's host check at start-up failed with this (Server.SetCheckError)
	// checkOwn: checkErr was set on this instance (setCheckError: a host check since it opened, the
	// reload's own), not carried over from the Server's record when it opened. A handover clears only
	// what was carried over (checkHandedLocked).
	checkOwn bool
	closed   bool // no new goroutines once set
	retiring bool // removed or replaced: sleep as soon as nothing is in flight
	// cutDue is set once a retiring instance's grace has ended (retire): from then on its requests
	// still in flight do not keep it from sleeping and closing. cut is the grace's timer.
	cutDue bool
	cut    *time.Timer
	// idle is the idle clock, armed while Awake with nothing in flight. It is made on the first arm,
	// then only Reset and Stopped, so the in-flight count dropping to 0 allocates nothing. idleArmed:
	// Reset and neither stopped since nor seen by idleFired. idleStale counts the firings that a Stop
	// came too late for: their idleFired has started and must do nothing (sleep.go).
	idle      *time.Timer
	idleArmed bool
	idleStale int
	idleGen   uint64 // moved on by every arm and disarm: an ignored-only sleep due holds for one (filter.go)
	// stopSched stops the route's keep_warm/wake_at scheduler (schedule.go); nil when none runs.
	stopSched context.CancelFunc
	// quiet is made by shutdown while it waits for the instance to go quiet, and closed (and cleared)
	// by the next change of what is held, in flight, waking or stopping (noteQuietLocked).
	quiet chan struct{}
	// drained is quiet for an admin sleep waiting for the requests in flight (drainInFlight), and
	// grace how long it waits: the reload's grace (retireGrace), set by Apply.
	drained chan struct{}
	grace   time.Duration
	// holds are this instance's holds on its requirements while it is awake (chain.go); dependents
	// counts, by name, the dependents holding this one.
	holds      []func()
	dependents map[string]int

	// busyLog throttles the log of requests refused for want of an upstream slot (busy), made at the
	// first of them.
	busyLog atomic.Pointer[throttle]

	// ho is the instance's part in a reload that hands the route's tenant on (sleep.go): nil for
	// nearly every instance, which owns its backend from start to end. A pointer, not the fields: at
	// 100,000 routes every byte of an instance is 100 kB.
	ho *handover
}

// newInstance returns route r's instance, asleep. It holds the route's metric series from now on (see
// Metrics.open) and lets go of them once it has retired or shut down.
func newInstance(root context.Context, r *registry.Route, b tenant.Backend, log *slog.Logger, m *Metrics, now func() time.Time, newGate func() Gate) *instance {
	series := m.open(r.Name)
	in := &instance{
		route:   r,
		backend: b,
		newGate: newGate,
		baseLog: log,
		series:  series,
		count:   series.requestCounter(),
		root:    root,
		now:     now,
		slots:   make(chan struct{}, upstreamConns(r)),
		retired: make(chan struct{}),
		hist:    newHistory(),
		pages:   &routePage{},
		since:   now(),
	}
	in.releaseFn, in.unadmitFn = in.release, in.unadmit
	in.filter, in.releaseIgnoredFn = newFilter(&r.Ignore, series), in.releaseIgnored
	return in
}

// logger is the route's logger: the server's, with the route's name and backing.
func (in *instance) logger() *slog.Logger {
	in.logOnce.Do(func() { in.log = in.baseLog.With("route", in.route.Name, "backing", in.route.Backing) })
	return in.log
}

func (in *instance) setStateLocked(s State) {
	if in.state == Awake && s != Awake {
		in.lifeGen++
		close(in.awakeEnd)
		in.disarmIdleLocked()
	}
	if s == Awake && in.state != Awake {
		in.awakeEnd = make(chan struct{})
	}
	if s == Asleep || s == Failed {
		in.letGoLocked() // its requirements may sleep once their idle windows pass (chain.go)
	}
	in.series.setState(s)
	in.state = s
	in.awake.Store(s == Awake)
	in.since = in.now()
}

func (in *instance) setCheckError(err error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.checkErr, in.checkOwn = err, true
}
