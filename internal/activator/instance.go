package activator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http/httputil"
	"sync"
	"sync/atomic"
	"time"

	"github.com/activator/activator/internal/health"
	"github.com/activator/activator/internal/registry"
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

// attempt is one wake. done is closed when it ends; err is written before that and read only after.
type attempt struct {
	done chan struct{}
	err  error
	rec  *tracker
	// The release of the requests held on it, for the wake record: how many left the hold once done
	// was closed, and when the last of them did (UnixNano), so the record can show how long letting a
	// herd go took.
	released    atomic.Int64
	lastRelease atomic.Int64
	// waiters counts the requests held on this attempt (guarded by instance.mu). When the wake
	// succeeds, runWake moves them from held to in flight in one step and sets handedOver before it
	// closes done, so a released request goes straight to the proxy without taking instance.mu again:
	// 10,000 requests re-locking one mutex after a herd's release was most of the release's spread.
	waiters    int
	handedOver bool
}

// noteRelease counts one held request let go at now.
func (a *attempt) noteRelease(now time.Time) {
	a.released.Add(1)
	t := now.UnixNano()
	for {
		last := a.lastRelease.Load()
		if t <= last || a.lastRelease.CompareAndSwap(last, t) {
			return
		}
	}
}

// withRelease returns rec (the attempt's finished record) with its release figures filled in.
func (a *attempt) withRelease(rec WakeRecord) WakeRecord {
	if n := a.released.Load(); n > 0 {
		rec.Released = int(n)
		end := rec.Started.Add(rec.Duration)
		rec.ReleaseSpread = max(0, time.Unix(0, a.lastRelease.Load()).Sub(end))
	}
	return rec
}

// instance is one route's tenant as the activator sees it. It owns the state machine, the single wake,
// the in-flight count and the idle clock. Its goroutines (wake, sleep, life watch) are joined by close.
//
// What only a woken route needs — its reverse proxy, health gate and route-scoped logger — is built on
// first use: with 10,000 configured routes, most of which never wake, building them up front was a
// third of the activator's heap.
type instance struct {
	route   *registry.Route
	backend Backend
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
	life     *Life         // the awake tenant's life
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

// Gate is the health gate a woken tenant must pass; *health.Prober is the real one.
type Gate interface {
	// Wait returns nil once the tenant is healthy, health.ErrGone if gone closes first, or an error
	// when ctx ends.
	Wait(ctx context.Context, gone <-chan struct{}) error
}

// ConnGate is a Gate that can also hand over the connection its passing probe used (nil when the
// tenant did not keep it alive). The activator gives it to the route's proxy, so the first released
// request goes out on a connection the tenant has already accepted and served: no dial, and no
// accept in a process that has just started. *health.Prober is one.
type ConnGate interface {
	WaitConn(ctx context.Context, gone <-chan struct{}) (net.Conn, error)
}

func newInstance(root context.Context, r *registry.Route, b Backend, log *slog.Logger, m *Metrics, now func() time.Time, newGate func() Gate) *instance {
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

// holdMetrics returns the route's hold gauge and histogram, resolved on the first hold (most routes
// of a large config never hold a request, and each series costs memory).
func (in *instance) holdMetrics() *holdMetrics {
	if h := in.holdM.Load(); h != nil {
		return h
	}
	in.holdM.CompareAndSwap(nil, in.metrics.holdFor(in.route.Name))
	return in.holdM.Load()
}

// logger is the route's logger: the server's, with the route's name and backing.
func (in *instance) logger() *slog.Logger {
	in.logOnce.Do(func() { in.log = in.baseLog.With("route", in.route.Name, "backing", in.route.Backing) })
	return in.log
}

// reverseProxy returns the route's proxy, building it on first use.
func (in *instance) reverseProxy() *httputil.ReverseProxy {
	if p := in.proxy.Load(); p != nil {
		return p
	}
	in.proxy.CompareAndSwap(nil, newProxy(in.route))
	return in.proxy.Load()
}

// fast returns the route's fast transport (building the proxy on first use), or nil if the proxy
// has none.
func (in *instance) fast() *fastTransport {
	if lt, ok := in.reverseProxy().Transport.(*lazyTransport); ok {
		if ft, ok := lt.transport().(*fastTransport); ok {
			return ft
		}
	}
	return nil
}

// adoptUpstream gives the route's proxy an open connection to the tenant (see ConnGate).
func (in *instance) adoptUpstream(c net.Conn) {
	if ft := in.fast(); ft != nil {
		ft.adopt(c)
		return
	}
	c.Close()
}

// start adopts a running tenant when the backend can tell. It runs as a wake whose waiters see the
// adopted state (or an asleep instance they then wake).
func (in *instance) start() {
	if _, ok := in.backend.(Adopter); !ok {
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.beginWakeLocked("adopt")
}

// acquire returns once the instance is awake and counts the caller as in flight; release must be
// called when the response is complete. It starts a wake when the instance is asleep, joins the wake in
// progress, waits out a stop in progress, and gives up with the caller's ctx, the hold limit or the hold
// timeout.
func (in *instance) acquire(ctx context.Context, trigger string) (release func(), err error) {
	var (
		timer     *time.Timer // the hold limit; nil until the request is first held
		heldSince time.Time
	)
	// One function-level defer (open-coded, nothing on the heap), not two defers inside the loop, which
	// the compiler must allocate: a held request's own cost counts 10,000 times in a herd.
	defer func() {
		if timer != nil {
			timer.Stop()
			in.holdMetrics().end(in.now().Sub(heldSince))
		}
	}()
	holding := false // counted in in.held from the previous turn; settled under the lock below
	for {
		in.mu.Lock()
		if holding {
			in.held--
			holding = false
		}
		if in.closed {
			in.mu.Unlock()
			return nil, ErrClosed
		}
		var wait <-chan struct{}
		var att *attempt
		switch in.state {
		case Awake:
			in.inflight++
			in.idleGen++ // disarm the idle timer
			if in.idle != nil {
				in.idle.Stop()
			}
			in.mu.Unlock()
			return in.releaseFn, nil
		case Failed:
			if left := in.until.Sub(in.now()); left > 0 {
				e := &BackoffError{Route: in.route.Name, RetryAfter: left, Last: in.lastErr}
				in.mu.Unlock()
				return nil, e
			}
			fallthrough
		case Asleep:
			if in.held >= in.route.Hold.MaxRequests {
				in.mu.Unlock()
				return nil, ErrHoldFull
			}
			att = in.beginWakeLocked(trigger)
			att.waiters++
			wait = att.done
		case Waking:
			if in.held >= in.route.Hold.MaxRequests {
				in.mu.Unlock()
				return nil, ErrHoldFull
			}
			att = in.wake
			att.waiters++
			wait = att.done
			if timer == nil {
				att.rec.joined()
				in.metrics.joinedWake(in.route.Name)
			}
		case Stopping:
			wait = in.stopDone
		}
		in.held++
		in.mu.Unlock()

		if timer == nil {
			heldSince = in.now()
			in.holdMetrics().begin()
			timer = time.NewTimer(in.route.Hold.MaxTime)
		}
		select {
		case <-wait:
		case <-ctx.Done():
			in.leave(att)
			return nil, ctx.Err()
		case <-timer.C:
			in.leave(att)
			return nil, ErrHoldTimeout
		}
		if att != nil {
			att.noteRelease(in.now())
			if att.err != nil {
				in.leave(att)
				return nil, att.err
			}
			if att.handedOver { // written before done was closed
				return in.releaseFn, nil
			}
		}
		holding = true
	}
}

// admit waits for one of the route's upstream slots; done gives it back. A herd released at once
// queues here, each request parked right after it left the hold, instead of every one of them first
// building its outgoing request and then queueing for a connection inside the transport.
func (in *instance) admit(ctx context.Context) (done func(), err error) {
	select {
	case in.slots <- struct{}{}:
		return in.unadmit, nil
	default:
	}
	select {
	case in.slots <- struct{}{}:
		return in.unadmit, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (in *instance) unadmit() { <-in.slots }

// leave gives up a hold: the caller's ctx ended, its hold timed out, or the wake it waited on (att;
// nil for a stop) failed. A request the wake already counted as in flight (it succeeded just as the
// caller gave up) is released instead.
func (in *instance) leave(att *attempt) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if att != nil && att.handedOver {
		in.releaseLocked()
		return
	}
	in.held--
	if att != nil {
		att.waiters--
	}
	in.maybeRetireLocked()
}

// release ends one in-flight request; the last one starts the idle clock.
func (in *instance) release() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.releaseLocked()
}

func (in *instance) releaseLocked() {
	in.inflight--
	if in.inflight == 0 && in.state == Awake {
		in.armIdleLocked()
	}
	in.maybeRetireLocked()
}

// armIdleLocked starts the idle clock. The timer's callback only flips state and starts the owned sleep
// goroutine; a generation counter makes a timer that fired late (after a new request) harmless.
func (in *instance) armIdleLocked() {
	if in.route.Idle <= 0 || in.closed {
		return
	}
	in.idleGen++
	gen := in.idleGen
	if in.idle != nil {
		in.idle.Stop()
	}
	in.idle = time.AfterFunc(in.route.Idle, func() {
		in.mu.Lock()
		defer in.mu.Unlock()
		if gen != in.idleGen || in.state != Awake || in.inflight > 0 || in.held > 0 {
			return
		}
		in.beginSleepLocked(ReasonIdle)
	})
}

// beginWakeLocked moves to Waking and starts the wake goroutine.
func (in *instance) beginWakeLocked(trigger string) *attempt {
	att := &attempt{done: make(chan struct{}), rec: newTracker(in.route.Name, in.route.Backing, trigger, in.now)}
	in.wake = att
	in.setStateLocked(Waking)
	in.wg.Add(1)
	go in.runWake(att, trigger == "adopt")
	return att
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

// runWake performs one wake: backend start, then the health gate, on a context detached from every
// request and bounded by the wake budget. All waiters are released together by closing att.done.
func (in *instance) runWake(att *attempt, adopt bool) {
	defer in.wg.Done()
	rec := att.rec
	ctx, cancel := context.WithTimeout(in.root, in.route.WakeBudget)
	defer cancel()

	var (
		life  *Life
		err   error
		awake = true
	)
	if in.after != nil {
		select {
		case <-in.after:
		case <-ctx.Done():
		}
	}
	if adopt {
		rec.Phase("adopt")
		life, awake, err = in.backend.(Adopter).Adopt(ctx)
		if err != nil {
			in.logger().Warn("adopt failed; treating the tenant as asleep", "err", err)
			awake, err = false, nil
		}
	} else {
		rec.begin(PhaseStart)
		life, err = in.backend.Wake(ctx, rec)
		if err == nil && life == nil {
			err = errors.New("backend returned no Life")
		}
	}
	if err == nil && awake {
		rec.mu.Lock()
		rec.provisional = false
		rec.mu.Unlock()
		rec.Phase(PhaseHealth)
		hctx := ctx
		if b := in.route.Health.Budget; b > 0 {
			var hcancel context.CancelFunc
			hctx, hcancel = context.WithTimeout(ctx, b)
			defer hcancel()
		}
		if in.prober == nil {
			in.prober = in.newGate()
		}
		if cg, ok := in.prober.(ConnGate); ok {
			var c net.Conn
			if c, err = cg.WaitConn(hctx, life.Done()); c != nil {
				in.adoptUpstream(c)
			}
		} else {
			err = in.prober.Wait(hctx, life.Done())
		}
		if errors.Is(err, health.ErrGone) {
			err = fmt.Errorf("%w: %w", err, life.Err())
		}
		if err != nil && !adopt {
			// The tenant started but never turned healthy: it must not keep running behind our back.
			// The stop is a phase of its own, so the record shows how long the gate took (at most
			// its budget) apart from how long the tenant took to stop.
			rec.failed()
			rec.Phase(PhaseStop)
			sctx, scancel := context.WithTimeout(context.WithoutCancel(in.root), in.route.SleepBudget)
			stop := in.backend.Sleep
			if st, ok := in.backend.(Stopper); ok {
				stop = st.Stop
			}
			if serr := stop(sctx); serr != nil {
				rec.Note("stopping the unhealthy tenant failed: " + serr.Error())
			}
			scancel()
		}
	}

	result := ResultOK
	switch {
	case err != nil:
		result = ResultFailed
	case adopt && awake:
		result = ResultAdopted
	case adopt:
		result = "adopt_asleep"
	}
	final := rec.finish(result, err)

	in.mu.Lock()
	defer in.mu.Unlock()
	in.lastRec, in.lastAtt = &final, att
	switch {
	case err != nil:
		in.fails++
		backoff := in.route.Backoff.Initial << min(in.fails-1, 20)
		if backoff > in.route.Backoff.Max || backoff <= 0 {
			backoff = in.route.Backoff.Max
		}
		we := &WakeError{Route: in.route.Name, Phase: final.FailedPhase, Err: err, RetryAfter: backoff}
		in.lastErr = we
		att.err = we
		in.until = in.now().Add(backoff)
		in.setStateLocked(Failed)
		in.logger().Warn("wake failed", "trigger", final.Trigger, "phase", final.FailedPhase, "duration", final.Duration,
			"phases", phaseAttr(final.Phases), "retry_in", backoff, "err", err)
		in.metrics.wakeDone(final)
	case !awake:
		in.setStateLocked(Asleep)
	default:
		in.fails = 0
		in.lastErr = nil
		in.life = life
		in.setStateLocked(Awake)
		// The requests held on this wake are in flight from now on; they leave without the lock.
		in.held -= att.waiters
		in.inflight += att.waiters
		att.handedOver = true
		gen := in.lifeGen
		in.wg.Add(1)
		go in.watch(life, gen, in.awakeEnd)
		if in.inflight == 0 && in.held == 0 {
			// Waiters, if any, will acquire and release; with none the idle clock starts now.
			in.armIdleLocked()
		}
	}
	close(att.done)
	// The held requests are on their way; the log line and the metrics are not in their path.
	if err == nil && awake {
		if final.Result == ResultOK {
			in.logger().Info("woke", "trigger", final.Trigger, "duration", final.Duration, "phases", phaseAttr(final.Phases),
				"joined", final.Joined, "notes", final.Notes)
			in.metrics.wakeDone(final)
		} else {
			in.logger().Info("adopted a running tenant")
		}
	}
	in.maybeRetireLocked()
}

// watch notices a tenant that stops on its own while awake.
func (in *instance) watch(life *Life, gen uint64, awakeEnd <-chan struct{}) {
	defer in.wg.Done()
	select {
	case <-life.Done():
	case <-awakeEnd:
		return
	case <-in.root.Done():
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if gen != in.lifeGen || in.state != Awake {
		return // we put it to sleep ourselves
	}
	in.logger().Warn("tenant stopped on its own", "err", life.Err(), "inflight", in.inflight)
	in.lastSlp = ReasonExited
	in.metrics.slept(in.route.Name, ReasonExited)
	in.setStateLocked(Asleep)
}

// beginSleepLocked moves an awake instance to Stopping and starts the sleep goroutine.
func (in *instance) beginSleepLocked(reason string) chan struct{} {
	done := make(chan struct{})
	in.stopDone = done
	in.setStateLocked(Stopping)
	in.wg.Add(1)
	go in.runSleep(reason, done)
	return done
}

func (in *instance) runSleep(reason string, done chan struct{}) {
	defer in.wg.Done()
	start := in.now()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(in.root), in.route.SleepBudget)
	err := in.backend.Sleep(ctx)
	cancel()
	in.mu.Lock()
	defer in.mu.Unlock()
	in.lastSlp = reason
	in.metrics.slept(in.route.Name, reason)
	in.slpErr = nil
	if err != nil {
		// The instance is marked asleep all the same: the next request wakes it, and a backing's
		// wake takes a tenant it finds still running as it is (a unit still active, a node still
		// on). The failure stays in the status and the admin sleep's answer until a sleep succeeds.
		in.slpErr = &SleepError{Route: in.route.Name, Reason: reason, Err: err}
		in.metrics.sleepFailed(in.route.Name)
		in.logger().Error("sleep failed; the tenant may still run", "reason", reason, "err", err)
	} else {
		in.logger().Info("slept", "reason", reason, "duration", in.now().Sub(start))
	}
	in.setStateLocked(Asleep)
	close(done)
	in.maybeRetireLocked()
}

// sleepNow puts the instance to sleep (admin API). It waits for a wake in progress, and returns once
// the instance is asleep; requests that arrive meanwhile wake it again afterwards. When the sleep it
// started failed, it returns that *SleepError (the instance is marked asleep all the same).
func (in *instance) sleepNow(ctx context.Context, reason string) error {
	for {
		in.mu.Lock()
		var wait <-chan struct{}
		switch in.state {
		case Asleep, Failed:
			in.mu.Unlock()
			return nil
		case Waking:
			wait = in.wake.done
		case Stopping:
			wait = in.stopDone
		case Awake:
			done := in.beginSleepLocked(reason)
			in.mu.Unlock()
			select {
			case <-done:
			case <-ctx.Done():
				return ctx.Err()
			}
			in.mu.Lock()
			defer in.mu.Unlock()
			if in.slpErr != nil {
				return in.slpErr
			}
			return nil
		}
		in.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// kick starts a wake if the instance is asleep (or its failure backoff is over) and returns at once.
func (in *instance) kick() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return
	}
	if in.state == Asleep || (in.state == Failed && !in.now().Before(in.until)) {
		in.beginWakeLocked("admin")
	}
}

// wakeNow wakes the instance without a request (admin API) and waits for the result.
func (in *instance) wakeNow(ctx context.Context) error {
	release, err := in.acquire(ctx, "admin")
	if err != nil {
		return err
	}
	release()
	return nil
}

// retire marks the instance as removed: it sleeps (reason) as soon as no request is in flight or held,
// then closes. retired is closed when that is done.
func (in *instance) retire() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.retiring = true
	in.maybeRetireLocked()
}

func (in *instance) maybeRetireLocked() {
	if !in.retiring || in.closed || in.inflight > 0 || in.held > 0 {
		return
	}
	switch in.state {
	case Awake:
		in.beginSleepLocked(ReasonReload)
	case Asleep, Failed:
		in.closed = true
		in.wg.Add(1)
		go func() {
			defer in.wg.Done()
			in.closeBackend()
			close(in.retired)
		}()
	}
	// Waking or Stopping: runWake/runSleep call back here when they finish.
}

// shutdown stops accepting requests and joins every goroutine; the backend's Close decides what
// happens to a running tenant. Called once, when the activator exits.
func (in *instance) shutdown() {
	in.mu.Lock()
	wasClosed := in.closed
	in.closed = true
	in.idleGen++
	if in.idle != nil {
		in.idle.Stop()
	}
	in.mu.Unlock()
	in.wg.Wait()
	if !wasClosed {
		in.closeBackend()
	}
}

func (in *instance) closeBackend() {
	if c, ok := in.backend.(Closer); ok {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(in.root), in.route.SleepBudget)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			in.logger().Warn("closing the backend failed", "err", err)
		}
	}
}

// Status is a route's state as the admin API reports it.
type Status struct {
	Route       string      `json:"route"`
	Backing     string      `json:"backing"`
	Hosts       []string    `json:"hosts"`
	PathPrefix  string      `json:"path_prefix,omitempty"`
	Upstream    string      `json:"upstream"`
	State       string      `json:"state"`
	Since       time.Time   `json:"since"`
	InFlight    int         `json:"in_flight"`
	Held        int         `json:"held"`
	Idle        string      `json:"idle"`
	LastWake    *WakeRecord `json:"last_wake,omitempty"`
	CurrentWake *WakeRecord `json:"current_wake,omitempty"`
	LastError   string      `json:"last_error,omitempty"`
	RetryAt     *time.Time  `json:"retry_at,omitempty"`
	LastSleep   string      `json:"last_sleep_reason,omitempty"`
	// LastSleepError is the last sleep's failure (the tenant may still run), until a sleep succeeds.
	LastSleepError string `json:"last_sleep_error,omitempty"`
}

func (in *instance) status() Status {
	in.mu.Lock()
	defer in.mu.Unlock()
	s := Status{
		Route: in.route.Name, Backing: in.route.Backing, Hosts: in.route.Hosts, PathPrefix: in.route.PathPrefix,
		Upstream: in.route.Upstream.String(), State: in.state.String(), Since: in.since,
		InFlight: in.inflight, Held: in.held, Idle: in.route.Idle.String(), LastSleep: in.lastSlp,
	}
	if in.lastRec != nil {
		last := in.lastAtt.withRelease(*in.lastRec)
		s.LastWake = &last
	}
	if in.state == Waking && in.wake != nil {
		cur := in.wake.rec.snapshot()
		s.CurrentWake = &cur
	}
	if in.lastErr != nil {
		s.LastError = in.lastErr.Error()
	}
	if in.slpErr != nil {
		s.LastSleepError = in.slpErr.Error()
	}
	if in.state == Failed {
		u := in.until
		s.RetryAt = &u
	}
	return s
}

// phaseAttr renders phases for a log line: "start=1.2ms health=3.4ms".
func phaseAttr(ps []PhaseRecord) string {
	var b []byte
	for i, p := range ps {
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(b, p.Name...)
		b = append(b, '=')
		b = append(b, p.Duration.Round(10*time.Microsecond).String()...)
	}
	return string(b)
}
