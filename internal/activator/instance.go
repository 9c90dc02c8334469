package activator

import (
	"context"
	"log/slog"
	"net/http/httputil"
	"sync"
	"sync/atomic"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
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

func (s State) String() string { return allStates[s] }

// Sleep reasons, as in activator_sleeps_total{reason}.
const (
	ReasonIdle     = "idle"
	ReasonAdmin    = "admin"
	ReasonExited   = "exited"
	ReasonReload   = "reload"
	ReasonShutdown = "shutdown"
)

// instance is one route's tenant as the activator sees it. It owns the state machine, the single wake,
// the in-flight count and the idle clock. Its goroutines (wake, sleep, life watch) are joined by close.
//
// What only a woken route needs — its reverse proxy, health gate and route-scoped logger — is built on
// first use: with 10,000 configured routes, most of which never wake, building them up front was a
// third of the activator's heap.
type instance struct {
	route   *registry.Route
	backend tenant.Backend
	newGate func() Gate
	prober  Gate // built by the first wake; used only by runWake, which never runs twice at once
	// proxy is built on the first request and kept for the instance's life, so its connection pool
	// survives reloads.
	proxy atomic.Pointer[httputil.ReverseProxy]
	// slots admits requests to the proxy: one token per request being proxied, max_upstream_conns in
	// all. Requests past it wait here, in arrival order, before the proxy builds anything for them.
	slots chan struct{}
	count func(code int) // activator_requests_total for this route
	// releaseFn is in.release, bound once: a method value made per request is an allocation per
	// request.
	releaseFn func()
	holdM     atomic.Pointer[holdMetrics] // see holdMetrics
	baseLog   *slog.Logger
	logOnce   sync.Once
	log       *slog.Logger // baseLog with the route's attributes; use logger()
	metrics   *Metrics
	root      context.Context // the server's lifetime; wakes and sleeps derive from it, never from a request
	now       func() time.Time
	// after, when set, is closed once the instance this one replaced has finished retiring: a changed
	// route must not wake its tenant while the old instance may still run it.
	after <-chan struct{}

	wg sync.WaitGroup // joins every goroutine the instance starts

	mu       sync.Mutex // guards the fields below
	state    State
	wake     *attempt      // the wake in progress (Waking) or the last one
	stopDone chan struct{} // closed when the sleep in progress (Stopping) ends
	life     *tenant.Life  // the awake tenant's life
	lifeGen  uint64        // incremented on every state change away from Awake; stale watchers check it
	awakeEnd chan struct{} // closed when the instance leaves Awake: stops that period's life watcher
	inflight int           // requests being proxied
	held     int           // requests waiting for a wake
	idle     *time.Timer   // armed while Awake with no in-flight requests
	idleGen  uint64        // the idle timer that may fire; older timers are ignored
	fails    int           // consecutive failed wakes
	until    time.Time     // Failed: no new wake before this
	lastErr  *WakeError
	lastRec  *WakeRecord
	lastAtt  *attempt    // lastRec's attempt, for its release figures
	lastSlp  string      // reason of the last sleep
	slpErr   *SleepError // the last sleep's failure; nil once a sleep succeeds
	since    time.Time   // when state last changed
	closed   bool        // no new goroutines once set
	retiring bool        // removed or replaced: sleep as soon as nothing is in flight
	retired  chan struct{}
}

func newInstance(root context.Context, r *registry.Route, b tenant.Backend, log *slog.Logger, m *Metrics, now func() time.Time, newGate func() Gate) *instance {
	in := &instance{
		route:   r,
		backend: b,
		newGate: newGate,
		slots:   make(chan struct{}, upstreamConns(r)),
		count:   m.requestCounter(r.Name),
		baseLog: log,
		metrics: m,
		root:    root,
		now:     now,
		since:   now(),
		retired: make(chan struct{}),
	}
	in.releaseFn = in.release
	m.setState(r.Name, "", Asleep.String())
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
		in.idleGen++
		if in.idle != nil {
			in.idle.Stop()
		}
	}
	if s == Awake && in.state != Awake {
		in.awakeEnd = make(chan struct{})
	}
	in.metrics.setState(in.route.Name, in.state.String(), s.String())
	in.state = s
	in.since = in.now()
}
