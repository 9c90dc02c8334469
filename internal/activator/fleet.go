package activator

// Fleets (fleet:): a route or instance backed by several members of one backing. The fleetBackend is
// the instance's Backend: its Wake wakes every member through its own backend and health gate
// (internal/fleet decides the quorum and the rollup), and returns once min_ready members are up; the
// members still waking go on and join when they pass. Requests are spread over the ready members,
// least in flight first.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/activator/activator/internal/fleet"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
	"github.com/activator/activator/internal/upstream"
)

// phaseMembers is a fleet wake's phase in which its members wake, until the quorum is up or lost.
const phaseMembers = "members"

// errNoMember answers a request that reached a fleet with no member ready (it lost its quorum as the
// request arrived).
var errNoMember = errors.New("no fleet member is ready")

// errSleeping cancels the members still waking when the fleet is put to sleep or closed.
var errSleeping = errors.New("the fleet is going to sleep")

// errBelowQuorum cancels the members still waking when the fleet falls below min_ready.
var errBelowQuorum = errors.New("the fleet fell below min_ready")

// What a member that came up is once it has left the fleet it joined (MemberRecord.Status).
const (
	memberExited  = "exited"  // it stopped on its own: Error says how
	memberStopped = "stopped" // the activator stopped it, as the fleet fell below min_ready
	// memberAsleep is a member the wake did not wake: the take-back of a sleep it went down in.
	memberAsleep = "asleep"
)

// fleetMember is one member: its backend and whether it is ready. Its health gate and upstream client
// are the route's instance's (fleetView).
type fleetMember struct {
	// route is the member's Route as its backend was opened (registry.Route.MemberRoute): its name,
	// backing, upstream and settings, which a handover keeps (registry.Route.SameTenant). Its keys of
	// the edge are the opening config's: the gate and the client read the instance's (fleetView.routes).
	route   *registry.Route
	name    string
	index   int // in the fleet's members
	backend tenant.Backend
	// ready: the member passed its gate in its last wake (memberUp), and since then neither has the
	// watcher of that wake's Life seen it end (memberGone) nor has the fleet put the member down
	// (eachMember: a sleep, stop or close, a failed wake, a fall below min_ready). memberUp and
	// memberGone write it under the fleet's mu, eachMember under op; it is read without a lock.
	ready    atomic.Bool
	inflight atomic.Int64
	// ups, guarded by the fleet's mu: how many times the member came up (memberUp). The watcher of a
	// Life acts only while the count is still the one its memberUp set: the Life of an earlier wake may
	// be seen to end after a later wake has made the member ready again, and is no longer its Life.
	ups uint64
	// op serialises the member's backend calls: a straggler's Wake, a Sleep, a Stop and a Close never
	// overlap, as the Backend contract asks.
	op sync.Mutex
	// cameUp, guarded by op: the member passed its gate in its last wake and has not been put down
	// since. One that did not was left with nothing running (a failed Wake leaves nothing, a failed
	// gate is stopped), and is not asked to stop again when the fleet falls below min_ready.
	cameUp bool
	// mayRun, guarded by op: a Wake of the member returned a Life (its wake started it, or found it
	// running), and since then neither a stop of it (wakeMember's, after a failed gate) nor a sleep,
	// stop or close of the fleet (each) has succeeded on it. A failed fleet wake stops only such
	// members (settle): one whose Wake failed was left with nothing running, and one the wake never
	// started was not running; sent a stop, a node whose BMC rejects the credentials logged one more
	// rejected login, and a powered-off node got a power-off.
	mayRun bool
}

// fleetBackend is a fleet route's tenant.Backend: the members and the fleet's state, which a reload
// that keeps the tenant (registry.Route.SameTenant) hands from the route's old instance to its new one
// with the backend (instance.inherit). What it does on its own, as members settle, leave or are
// stopped (its logs, the route's host check, the members' gates and clients), it does for the
// instance that owns it: owner.
type fleetBackend struct {
	// owner is the view of the instance that owns the backend: the one that opened it, then each heir
	// from its handover on (fleetView.own). Never nil once the instance is made (openLocked).
	owner   atomic.Pointer[fleetView]
	spec    *registry.Fleet
	members []*fleetMember
	newGate func(*registry.Route) Gate

	mu      sync.Mutex
	run     *fleet.Run    // the last wake
	wake    *fleetWake    // the last wake's rollup
	settled chan struct{} // closed when the last wake's members have all settled and been cleaned up
	life    *tenant.Life  // the fleet's life while it is up
	// gen is bumped whenever we put the members down (each Sleep, Stop and Close, the settle of a
	// failed wake, a fall below min_ready): a Life a member came up with before, ending after, we ended.
	gen uint64
	// takeBack, after a sleep that members refused, marks them (by index) for the take-back that
	// follows (Wake): only they are woken again. nil: the next wake wakes every member.
	takeBack []bool
}

var (
	_ tenant.Backend = (*fleetBackend)(nil)
	_ tenant.Stopper = (*fleetBackend)(nil)
	_ tenant.Closer  = (*fleetBackend)(nil)
)

// fleetView is an instance's side of its route's fleet: the members' routes under the instance's config
// (their health blocks, max_upstream_conns, the route's response_timeout) and, by member, the health
// gate and upstream client built from them. The instance that opened the fleet and each heir it is
// handed to have a view of their own over the one fleetBackend, so that a handover that changed
// health or response_timeout applies them, as it does for a single tenant, and the old instance's
// requests in flight finish on its own clients, which its teardown closes (dropUpstream).
type fleetView struct {
	*fleetBackend
	in     *instance
	routes []*registry.Route // by member: in.route's registry.Route.MemberRoute
	ups    []atomic.Pointer[upstream.Client]
	// gates are the members' health gates, each built by the member's first wake under this view and
	// guarded by the member's op.
	gates []Gate
}

// newFleetView returns in's view of fb; r is in's route, whose fleet is fb's (registry.Fleet's same).
func newFleetView(fb *fleetBackend, r *registry.Route, in *instance) *fleetView {
	v := &fleetView{fleetBackend: fb, in: in, ups: make([]atomic.Pointer[upstream.Client], len(fb.members)), gates: make([]Gate, len(fb.members))}
	for _, m := range r.Fleet.Members {
		v.routes = append(v.routes, r.MemberRoute(m))
	}
	return v
}

// cur is the view of the instance that owns the fleet now.
func (fb *fleetBackend) cur() *fleetView { return fb.owner.Load() }

// own makes v's instance the fleet's owner: it opened it, or it is the heir it is handed to
// (instance.inherit). The fleet's series are its from then on, if the fleet has woken.
func (v *fleetView) own() {
	v.owner.Store(v)
	v.seriesIfWoken()
}

// seriesIfWoken makes the route's fleet series read from the fleet through v's instance's hold on the
// route's series (instanceMetrics.fleetWoke), if the fleet has woken before: a route's fleet series
// are its newest instance's, and an heir's first wake may be hours away, or never come.
func (v *fleetView) seriesIfWoken() {
	fb := v.fleetBackend
	fb.mu.Lock()
	woken := fb.run != nil
	fb.mu.Unlock()
	if woken {
		v.in.series.fleetWoke(fb)
	}
}

// openFleet opens the backend of each of r's members. On failure it closes those it opened.
func openFleet(o tenant.Opener, r *registry.Route, newGate func(*registry.Route) Gate) (*fleetBackend, error) {
	fb := &fleetBackend{spec: r.Fleet, newGate: newGate}
	for _, m := range r.Fleet.Members {
		mr := r.MemberRoute(m)
		b, err := o.Open(mr)
		if err != nil {
			_ = fb.Close(context.Background())
			return nil, fmt.Errorf("route %q: fleet member %q: %w", r.Name, m.Name, err)
		}
		fb.members = append(fb.members, &fleetMember{route: mr, name: m.Name, index: len(fb.members), backend: b})
	}
	return fb, nil
}

// Wake wakes every member (the take-back of a sleep that members refused: only those, see
// fleetSleepError) and returns once the quorum is up, with the fleet's Life, or lost, with the
// *fleet.QuorumError that names the culprit. Members still waking at that point go on within the wake
// budget: at a quorum they join as they pass, after a fast-fail they are cancelled, and then every
// member that may run is stopped (a failed wake leaves nothing running: see settle).
func (fb *fleetBackend) Wake(ctx context.Context, t tenant.Tracker) (*tenant.Life, error) {
	if err := fb.waitSettled(ctx); err != nil {
		return nil, err
	}
	t.Phase(phaseMembers)
	rec, _ := t.(*tracker)
	fb.mu.Lock()
	only := fb.takeBack
	fb.takeBack = nil
	fb.mu.Unlock()
	if rec == nil || rec.snapshot().Trigger != string(triggerSleepFailed) {
		only = nil
	}
	// The owner's instance: only the instance that owns the backend wakes it.
	v := fb.cur()
	v.in.series.fleetWoke(fb) // its series: from its first wake, read at each scrape

	mctx, cancel := detachWithDeadline(ctx) // stragglers outlive this call, not the wake budget
	deadline, _ := mctx.Deadline()
	trackers := make([]*tracker, len(fb.members))
	var (
		ms  []fleet.Member
		idx []int
	)
	t0 := v.in.now() // every member's phases count from the same instant, so they can be compared
	// w goes to each member's wake (memberUp watches the member for it) before any starts: read from
	// fb.wake, set only once Start had returned, a member up at once took the wake before (nil at the
	// first) for its own, and its exit marked that record's rows, or panicked (found with -race).
	w := &fleetWake{fb: fb, trackers: trackers, t0: t0, after: make([]memberAfter, len(fb.members))}
	for i, m := range fb.members {
		if only != nil && !only[i] {
			continue // it went down in the sleep this wake takes back, and stays down
		}
		tr := newTracker(m.route.Name, m.route.Backing, triggerRequest, v.in.now)
		tr.rec.Started, tr.deadline = t0, deadline
		trackers[i] = tr
		idx = append(idx, i)
		ms = append(ms, fleet.Member{Name: m.name, Phase: tr.current, Wake: func(ctx context.Context) error { return fb.wakeMember(ctx, m, tr, w) }})
	}
	w.idx = idx
	run := fleet.Start(mctx, ms, fleet.Options{MinReady: fb.spec.MinReady, Serial: fb.spec.Serial,
		OnSettled: func(k int, res fleet.Result) { fb.memberSettled(w, fb.members[idx[k]], res) }})
	w.run = run // before w is shared: memberSettled does not read it
	settled := make(chan struct{})
	fb.mu.Lock()
	fb.run, fb.wake, fb.settled = run, w, settled
	fb.mu.Unlock()
	if rec != nil {
		rec.setRollup(w)
	}
	select {
	case <-run.Decided():
	case <-ctx.Done():
		run.Cancel(ctx.Err())
		<-run.Decided()
	}
	err := run.Err()
	var life *tenant.Life
	if err == nil {
		if life, err = fb.up(run, idx); err != nil {
			run.Cancel(errBelowQuorum)
		}
	}
	go fb.settle(w, err != nil, cancel, settled)
	if err != nil {
		return nil, err
	}
	return life, nil
}

// detachWithDeadline returns a context that keeps ctx's deadline but not its cancellation.
func detachWithDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok {
		return context.WithDeadline(context.WithoutCancel(ctx), d)
	}
	return context.WithCancel(context.WithoutCancel(ctx))
}

// settle waits for every member of wake w to settle and, when the wake failed, stops the members that
// may run (fleetMember.mayRun): those that came up, and those it started whose own stop failed. A
// member whose Wake failed, or that the wake never started, is not sent a stop (a power-off, on bare
// metal): it was left with nothing running. The rows of w's record say which members were stopped.
// (The wake's record reads the members' outcomes from its fleetWake as they settle.)
func (fb *fleetBackend) settle(w *fleetWake, failed bool, cancel context.CancelFunc, settled chan struct{}) {
	defer close(settled)
	defer cancel()
	<-w.run.Done()
	if !failed {
		return
	}
	fb.mu.Lock()
	fb.gen++ // the members that came up are stopped by us, not gone on their own
	fb.mu.Unlock()
	in := fb.cur().in
	ctx, cancel := context.WithTimeout(context.WithoutCancel(in.root), in.route.SleepBudget)
	defer cancel()
	err := fb.each(ctx, func(ctx context.Context, m *fleetMember, _ bool) error {
		if !m.mayRun {
			return nil
		}
		err := stopBackend(ctx, m.backend)
		if err != nil {
			w.mark(m, "", nil, "stopping it", ", as the wake failed, failed (it may still run): "+err.Error())
		} else {
			w.mark(m, memberStopped, nil, "stopped", ": the wake failed")
		}
		return err
	})
	if err != nil {
		in.logger().Warn("stopping the fleet after a failed wake failed", "err", err)
	}
}

// memberSettled is told by wake w's run that member m has settled, with res. A member that came up
// takes its finding at start-up out of the route's host check. One that failed is logged at once,
// saying what the fleet does without it as it stands now: a member's failure waited in the log for the
// slowest member to settle, and the line said "the fleet runs without it" as the fleet was being
// stopped below min_ready (found by an operator trial). Up without it, the route's log would otherwise
// say only that the fleet woke.
func (fb *fleetBackend) memberSettled(w *fleetWake, m *fleetMember, res fleet.Result) {
	switch res.Status {
	case fleet.Up:
		fb.clearCheck(m.name)
		return
	case fleet.Timeout, fleet.Error:
	default:
		return // cancelled: the wake, or the fleet, was called off
	}
	fb.mu.Lock()
	up := fb.wake == w && fb.life != nil
	fb.mu.Unlock()
	msg := "fleet member did not come up"
	if up {
		msg += ": the fleet runs without it"
	}
	fb.cur().in.logger().Warn(msg, "member", res.Name, "status", string(res.Status), "phase", res.Phase, "class", string(res.Class),
		"err", res.Err, "ready", fb.ready(), "min_ready", fb.minReady(), "members", len(fb.members))
}

// MemberCheckError is one fleet member's finding in its route's host check at start-up: the check of
// a fleet passes Server.SetCheckError one for each member that failed it, joined (errors.Join). A
// member's finding goes once that member comes up, and stays while it does not: a fleet up on the
// others says nothing of a member whose BMC rejects the credentials (found by an operator trial: the
// fleet's quorum cleared that member's finding, while it failed with the same 401). A finding that
// names no member goes when the fleet comes up, as a single tenant's does.
type MemberCheckError struct {
	Member string
	Err    error
}

func (e *MemberCheckError) Error() string { return e.Err.Error() }
func (e *MemberCheckError) Unwrap() error { return e.Err }

// checkLeft splits a fleet's host check finding err into what still holds and what no longer does:
// a member's finding no longer holds when cleared(member), one that names no member when fleetUp.
// Either is nil when empty.
func checkLeft(err error, cleared func(member string) bool, fleetUp bool) (left, gone error) {
	parts := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		parts = j.Unwrap()
	}
	var keep, drop []error
	for _, p := range parts {
		me, isMember := p.(*MemberCheckError)
		if (isMember && cleared(me.Member)) || (!isMember && fleetUp) {
			drop = append(drop, p)
		} else {
			keep = append(keep, p)
		}
	}
	if len(drop) == 0 {
		return err, nil
	}
	return errors.Join(keep...), errors.Join(drop...)
}

// clearCheck takes member's finding out of the route's host check, now that it came up: the host check
// of the instance that owns the fleet (after a handover, the heir's, whose takeover clears the findings
// of the members ready by then: instance.checkHandedLocked).
func (fb *fleetBackend) clearCheck(member string) {
	in := fb.cur().in
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.checkErr == nil {
		return
	}
	left, gone := checkLeft(in.checkErr, func(n string) bool { return n == member }, false)
	if gone == nil {
		return
	}
	in.checkErr = left
	in.logger().Info("fleet member came up: the host check's finding no longer holds for it", "member", member, "was", gone)
}

// waitSettled waits until the last wake's members have settled and been cleaned up.
func (fb *fleetBackend) waitSettled(ctx context.Context) error {
	fb.mu.Lock()
	settled := fb.settled
	fb.mu.Unlock()
	if settled == nil {
		return nil
	}
	select {
	case <-settled:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("the fleet's last wake has not settled: %w", ctx.Err())
	}
}

// wakeMember brings one member up through its backend and its own health gate, the owner's (a
// member still waking when the fleet is handed over goes on with the gate it began with). A member
// that started and never passed is stopped.
func (fb *fleetBackend) wakeMember(ctx context.Context, m *fleetMember, t *tracker, w *fleetWake) (err error) {
	m.op.Lock()
	defer m.op.Unlock()
	v := fb.cur()
	m.cameUp = false
	defer func() { t.finish(wakeResult(triggerRequest, true, err), err) }() // closes the last phase
	t.begin(tenant.PhaseStart)
	life, err := m.backend.Wake(ctx, t)
	if err == nil && life == nil {
		err = errors.New("backend returned no Life")
	}
	if err != nil {
		return err
	}
	m.mayRun = true
	if err = ctx.Err(); err == nil {
		// The gate's faults are the activator's to classify (a health path that can never pass is
		// terminal), before internal/fleet rolls the member up.
		if err = v.gateMember(ctx, m, t, life); err != nil {
			err = tenant.Classify(classOf(err), err)
		}
	}
	if err != nil { // unhealthy, or cancelled (a fast-fail) once it had started: it must not run on
		t.failed()
		t.Phase(tenant.PhaseStop)
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), v.in.route.SleepBudget)
		defer cancel()
		if serr := stopBackend(sctx, m.backend); serr != nil {
			t.Note("stopping the unhealthy member failed: " + serr.Error())
		} else {
			m.mayRun = false
		}
		return err
	}
	fb.memberUp(m, life, w)
	return nil
}

// gateMember waits for m's health gate under v's config. m.op is held.
func (v *fleetView) gateMember(ctx context.Context, m *fleetMember, t *tracker, life *tenant.Life) error {
	t.then(tenant.PhaseHealth)
	if b := v.in.route.Health.Budget; b > 0 {
		t.PhaseBudget(b)
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b)
		defer cancel()
	}
	gate := v.gates[m.index]
	if gate == nil {
		gate = v.newGate(v.routes[m.index])
		v.gates[m.index] = gate
	}
	return waitGate(ctx, gate, t, life, func(c net.Conn) { v.client(m).Adopt(c) })
}

// memberUp makes m, up in wake w, ready and watches its life: a member that stops on its own leaves
// the pool, and when too few are left for min_ready, the fleet stops (see memberGone). m.op is held.
func (fb *fleetBackend) memberUp(m *fleetMember, life *tenant.Life, w *fleetWake) {
	fb.mu.Lock()
	gen := fb.gen
	m.ups++
	up := m.ups
	m.ready.Store(true) // with ups, under mu: an earlier Life's watcher finds the new count, or ran before
	fb.mu.Unlock()
	m.cameUp = true
	root := fb.cur().in.root // the server's, whichever instance owns the fleet
	go func() {
		select {
		case <-life.Done():
		case <-root.Done():
			return
		}
		fb.memberGone(m, up, gen, w, life.Err())
	}()
}

// memberGone handles the end of member m's Life that memberUp watched: m's up-th coming up
// (fleetMember.ups), in wake w and generation gen. When m has come up again since, the Life is an
// earlier wake's and memberGone changes nothing: its watcher can run after a later wake has made m
// ready again (the scheduler ran it late, or the backend Ended a slept Life late), and marking that
// m not ready failed a wake after a sleep ("exited after it had passed its health gate") or left a
// fleet up without its members. Otherwise m leaves the pool; when we have put the fleet down since gen
// (fleetBackend.gen), that is all. Else m stopped on its own: its row in w's record says so from then
// on, and when too few are left for min_ready, so do the rows of the members the activator stops.
func (fb *fleetBackend) memberGone(m *fleetMember, up, gen uint64, w *fleetWake, why error) {
	fb.mu.Lock()
	if m.ups != up {
		fb.mu.Unlock()
		return // an earlier wake's Life: m's state is the later wake's
	}
	m.ready.Store(false)
	ours := gen != fb.gen // put down by us
	ready := fb.ready()
	life, run := fb.life, fb.run
	below := !ours && life != nil && ready < fb.minReady()
	if below {
		fb.life = nil
		fb.gen++
	}
	fb.mu.Unlock()
	fb.cur().closeIdle(m)
	switch {
	case ours:
		return
	case life == nil: // the fleet is not up yet: up does not count it
		w.mark(m, memberExited, why, "exited on its own", ", after it had passed its health gate")
		return
	case !below:
		w.mark(m, memberExited, why, "exited on its own", fmt.Sprintf("; the fleet stayed up (%d ready, min_ready %d)", ready, fb.minReady()))
		fb.cur().in.logger().Warn("fleet member stopped on its own", "member", m.name, "err", why, "ready", ready)
		return
	}
	w.mark(m, memberExited, why, "exited on its own", fmt.Sprintf(": the fleet fell below min_ready %d and was stopped", fb.minReady()))
	// Below the quorum the fleet is down: the members still waking are called off and the survivors
	// stopped before its Life ends, so that the route is asleep for real and its next wake starts them
	// all. A member that never came up is not asked (see fleetMember.cameUp): asked again, a node whose
	// BMC rejects the credentials logged one more rejected login, and failed the stop.
	run.Cancel(errBelowQuorum)
	in := fb.cur().in
	ctx, cancel := context.WithTimeout(context.WithoutCancel(in.root), in.route.SleepBudget)
	defer cancel()
	err := fb.each(ctx, func(ctx context.Context, o *fleetMember, wasReady bool) error {
		if !o.cameUp {
			return nil // a cancelled member stopped itself (wakeMember), a failed one has nothing running
		}
		err := stopBackend(ctx, o.backend)
		switch {
		case !wasReady:
		case err != nil:
			w.mark(o, "", nil, "stopping it", fmt.Sprintf(", as the fleet fell below min_ready %d when %s exited, failed (it may still run): %v", fb.minReady(), m.name, err))
		default:
			w.mark(o, memberStopped, nil, "stopped", fmt.Sprintf(": the fleet fell below min_ready %d when %s exited", fb.minReady(), m.name))
		}
		return err
	})
	life.End(joinLine(fmt.Errorf("fleet below min_ready %d: member %q stopped: %w", fb.minReady(), m.name, why), err))
}

func (fb *fleetBackend) minReady() int {
	if n := fb.spec.MinReady; n > 0 && n <= len(fb.members) {
		return n
	}
	return len(fb.members)
}

// eachReady calls fn with each member and whether it is ready (fleetGauges).
func (fb *fleetBackend) eachReady(fn func(member string, ready bool)) {
	for _, m := range fb.members {
		fn(m.name, m.ready.Load())
	}
}

// isReady reports whether the member named member is ready.
func (fb *fleetBackend) isReady(member string) bool {
	for _, m := range fb.members {
		if m.name == member {
			return m.ready.Load()
		}
	}
	return false
}

func (fb *fleetBackend) ready() int {
	n := 0
	for _, m := range fb.members {
		if m.ready.Load() {
			n++
		}
	}
	return n
}

// up gives the fleet a new Life, now that run's quorum is up (idx: the fleet's members in run's
// order), unless a member that passed its gate has exited since: run counted it, and the fleet is not
// up on fewer than min_ready. That fails the wake with a *fleet.QuorumError naming the first such
// member, whose row says how it ended. The count and the Life are set under fb.mu, which memberGone
// reads the Life under, so a member that exits after the count takes the fleet down as any other.
func (fb *fleetBackend) up(run *fleet.Run, idx []int) (*tenant.Life, error) {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if ready, min := fb.ready(), fb.minReady(); ready < min {
		qe := &fleet.QuorumError{Up: ready, Members: len(fb.members), MinReady: min}
		for k, res := range run.Results() {
			if m := fb.members[idx[k]]; res.Status == fleet.Up && !m.ready.Load() {
				qe.Culprit = fleet.Result{Name: m.name, Status: memberExited, Class: tenant.ClassRetryable,
					Phase: tenant.PhaseHealth, Err: errors.New("exited after it had passed its health gate, before the quorum was up")}
				break
			}
		}
		return nil, qe
	}
	fb.life = tenant.NewLife()
	return fb.life, nil
}

// Sleep cancels the members still waking, then puts every member that came up to sleep at once. A
// member that never came up was stopped when it failed, and is not asked again: a member whose
// backing cannot even find it (a system the BMC does not have, a BMC that is down) failed every
// fleet sleep, and each failed sleep's take-back powered the members that had gone down up again,
// every idle window, for ever (found with the real binary and cmd/redfish-sim). A member that came
// up and refuses fails the sleep with a *fleetSleepError, which says what becomes of the fleet.
func (fb *fleetBackend) Sleep(ctx context.Context) error {
	return fb.putDown(ctx, func(ctx context.Context, m *fleetMember, wasReady bool) error {
		if !wasReady {
			return nil
		}
		return m.backend.Sleep(ctx)
	})
}

// Stop stops every member, whether it came up or not, and those whose sleep would park them for real.
// Its failures are Sleep's.
func (fb *fleetBackend) Stop(ctx context.Context) error {
	return fb.putDown(ctx, stopMember)
}

// Close closes every member's backend once the last wake has settled.
func (fb *fleetBackend) Close(ctx context.Context) error {
	errs, _, err := fb.down(ctx, func(ctx context.Context, m *fleetMember, _ bool) error {
		if c, ok := m.backend.(tenant.Closer); ok {
			return c.Close(ctx)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return errors.Join(errs...)
}

// putDown is down for a sleep or a stop. When members fail it, it returns a *fleetSleepError and, if
// the members that came up and refused still make min_ready, marks them for the take-back.
func (fb *fleetBackend) putDown(ctx context.Context, op memberOp) error {
	errs, wasReady, err := fb.down(ctx, op)
	if err != nil {
		return err
	}
	fe := &fleetSleepError{minReady: fb.minReady()}
	running := make([]bool, len(fb.members))
	for i, m := range fb.members {
		switch {
		case errs[i] != nil:
			fe.errs = append(fe.errs, errs[i])
			if wasReady[i] {
				fe.running, running[i] = append(fe.running, m.name), true
			}
		case wasReady[i]:
			fe.down = append(fe.down, m.name)
		}
	}
	if len(fe.errs) == 0 {
		return nil
	}
	if fe.takeBack() {
		fb.mu.Lock()
		fb.takeBack = running
		fb.mu.Unlock()
	}
	return fe
}

// down cancels the members still waking, waits for the last wake to settle, then runs op on every
// member at once and ends the fleet's Life. It returns each member's error (nil, or naming the
// member) and whether it had come up; or an error of its own when the wake did not settle in time.
func (fb *fleetBackend) down(ctx context.Context, op memberOp) (errs []error, wasReady []bool, err error) {
	fb.mu.Lock()
	fb.gen++
	run, life := fb.run, fb.life
	fb.life, fb.takeBack = nil, nil
	fb.mu.Unlock()
	if run != nil {
		run.Cancel(errSleeping)
	}
	if err := fb.waitSettled(ctx); err != nil {
		return nil, nil, err
	}
	errs, wasReady = fb.eachMember(ctx, op)
	if life != nil {
		life.End(tenant.ErrSlept)
	}
	return errs, wasReady, nil
}

// fleetSleepError is a fleet's sleep (or stop) that members failed. What went down stays down: it is
// not woken again to undo the sleep. The fleet is what its quorum says of the members that came up
// and refused, which may still run: when they make min_ready, the route takes the fleet back on them
// alone (runSleep, then Wake wakes only them); when they do not, the fleet counts as asleep, and its
// next wake wakes every member (a Wake takes a running tenant as it is).
type fleetSleepError struct {
	errs     []error  // each naming its member
	down     []string // the members that came up and went down
	running  []string // the members that came up and refused: they may still run
	minReady int
}

func (e *fleetSleepError) Error() string {
	var b strings.Builder
	for i, err := range e.errs {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(err.Error())
	}
	went := "no member went down"
	if len(e.down) > 0 {
		went = strings.Join(e.down, ", ") + " went down and stay down"
	}
	switch {
	case len(e.running) == 0:
		fmt.Fprintf(&b, " (%s; the fleet is asleep)", went)
	case e.takeBack():
		fmt.Fprintf(&b, " (%s; %s may still run and make min_ready %d: the fleet is taken back on them alone)",
			went, strings.Join(e.running, ", "), e.minReady)
	default:
		fmt.Fprintf(&b, " (%s; %s may still run, fewer than min_ready %d: the fleet counts as asleep, and its next wake wakes every member)",
			went, strings.Join(e.running, ", "), e.minReady)
	}
	return b.String()
}

func (e *fleetSleepError) Unwrap() []error { return e.errs }

// takeBack reports whether the members that refused make min_ready.
func (e *fleetSleepError) takeBack() bool { return len(e.running) > 0 && len(e.running) >= e.minReady }

// takesBack reports whether the route takes back its tenant after a sleep that failed with err
// (runSleep): always, but for a fleet whose members that refused are too few for min_ready.
func takesBack(err error) bool {
	var fe *fleetSleepError
	return !errors.As(err, &fe) || fe.takeBack()
}

// each runs op on every member's backend at once, each under its member's op lock, and joins their
// errors, each naming its member, on one line (joinLine).
func (fb *fleetBackend) each(ctx context.Context, op memberOp) error {
	errs, _ := fb.eachMember(ctx, op)
	return joinLine(errs...)
}

// joinLine is errors.Join on one line: the errors "; " apart. A fleet's errors name a member each, and
// end up in one line of the log, a sleep's record and the status (errors.Join's newline put a
// member's failure on a line of its own, found by an operator trial). nil when every err is.
func joinLine(errs ...error) error {
	var l lineErrors
	for _, err := range errs {
		if err != nil {
			l = append(l, err)
		}
	}
	if len(l) == 0 {
		return nil
	}
	return l
}

// lineErrors is joinLine's error.
type lineErrors []error

func (l lineErrors) Error() string {
	var b strings.Builder
	for i, err := range l {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(err.Error())
	}
	return b.String()
}

func (l lineErrors) Unwrap() []error { return l }

// eachMember is each, returning each member's error and whether it had come up.
func (fb *fleetBackend) eachMember(ctx context.Context, op memberOp) (errs []error, wasReady []bool) {
	errs, wasReady = make([]error, len(fb.members)), make([]bool, len(fb.members))
	var wg sync.WaitGroup
	for i, m := range fb.members {
		wg.Go(func() {
			m.op.Lock()
			defer m.op.Unlock()
			wasReady[i] = m.ready.Swap(false) // no request goes to it from here on
			if err := op(ctx, m, wasReady[i]); err != nil {
				errs[i] = fmt.Errorf("member %q: %w", m.name, err)
			} else {
				m.cameUp, m.mayRun = false, false // down: a take-back that does not wake it must not stop it again
			}
			fb.cur().closeIdle(m)
		})
	}
	wg.Wait()
	return errs, wasReady
}

// memberOp is what each does to a member: wasReady says whether it had come up (passed its gate).
type memberOp func(ctx context.Context, m *fleetMember, wasReady bool) error

// stopMember stops a member whatever its state (stopBackend).
func stopMember(ctx context.Context, m *fleetMember, _ bool) error {
	return stopBackend(ctx, m.backend)
}

// stopBackend stops b for real: Stop where b can park its tenant, else Sleep.
func stopBackend(ctx context.Context, b tenant.Backend) error {
	if st, ok := b.(tenant.Stopper); ok {
		return st.Stop(ctx)
	}
	return b.Sleep(ctx)
}

// client returns m's upstream client under v's config, built on first use.
func (v *fleetView) client(m *fleetMember) *upstream.Client {
	return v.in.lazyClient(&v.ups[m.index], v.routes[m.index])
}

// closeIdle closes m's idle upstream connections under v, if v has a client for it.
func (v *fleetView) closeIdle(m *fleetMember) {
	if c := v.ups[m.index].Load(); c != nil {
		c.CloseIdle()
	}
}

// pick returns the ready member with the fewest requests in flight, or nil.
func (fb *fleetBackend) pick() *fleetMember {
	var best *fleetMember
	for _, m := range fb.members {
		if m.ready.Load() && (best == nil || m.inflight.Load() < best.inflight.Load()) {
			best = m
		}
	}
	return best
}

// serve proxies r, a request to v's instance, to the least busy ready member, on v's client: a request
// in flight on an instance that has handed the fleet over ends on the clients it began with.
func (v *fleetView) serve(w http.ResponseWriter, r *http.Request) {
	m := v.pick()
	if m == nil {
		v.in.upstreamFailed(w, r, errNoMember)
		return
	}
	m.inflight.Add(1)
	defer m.inflight.Add(-1)
	v.client(m).Serve(w, r)
}

// dropUpstream closes the idle upstream connections of v's clients (the heir's are its own).
func (v *fleetView) dropUpstream() {
	for _, m := range v.members {
		v.closeIdle(m)
	}
}

// fleetWake is one wake of the fleet: its run, its members' trackers, and what became of each member
// that came up once it left the fleet. The wake's record, and every copy of it (WakeRecord.rollup),
// reads its member rows here, so that they say what the members are now.
type fleetWake struct {
	fb       *fleetBackend
	run      *fleet.Run
	idx      []int      // the member index of each of run's members: all, or a take-back's
	trackers []*tracker // by member index; nil for a member the wake did not wake
	t0       time.Time  // when the members' clocks started

	mu    sync.Mutex    // guards after; taken after no other lock but the trackers' and run's own
	after []memberAfter // by member index
}

// memberAfter is what became of a member after it came up: a Status that replaces "up" (none: still
// up), and why.
type memberAfter struct {
	status string
	err    error
	notes  []string
}

// mark records that m, which had come up, is now status ("": unchanged) because of err (nil: none),
// with a note: "<what> at +<time since the wake began><then>".
func (w *fleetWake) mark(m *fleetMember, status string, err error, what, then string) {
	at := w.fb.cur().in.now().Sub(w.t0).Round(time.Millisecond)
	w.mu.Lock()
	defer w.mu.Unlock()
	a := &w.after[m.index]
	if status != "" {
		a.status, a.err = status, err
	}
	a.notes = append(a.notes, what+" at +"+at.String()+then)
}

// rows is the rollup, in member order, with each member's phases: its outcome in the wake, or what
// became of it since.
func (w *fleetWake) rows() []MemberRecord {
	out := make([]MemberRecord, len(w.fb.members))
	for i, m := range w.fb.members {
		out[i] = MemberRecord{Name: m.name, Upstream: m.route.Upstream.String(), Status: memberAsleep,
			Notes: []string{"not woken: it went down in the sleep this wake takes back, which takes back only the members that refused"}}
	}
	for j, res := range w.run.Results() {
		i := w.idx[j]
		snap := w.trackers[i].snapshot()
		row := MemberRecord{Name: res.Name, Upstream: w.fb.members[i].route.Upstream.String(), Status: string(res.Status),
			Class: string(res.Class), Phase: res.Phase, CancelledBy: res.CancelledBy, Phases: snap.Phases, Notes: snap.Notes}
		if res.Err != nil && res.Status != fleet.Cancelled {
			row.Error = res.Err.Error()
		}
		out[i] = row
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, a := range w.after {
		row := &out[i]
		if a.status != "" && row.Status == string(fleet.Up) {
			row.Status, row.Phase = a.status, "" // its notes say when, and the sleep record what followed
			if a.err != nil {
				row.Error = a.err.Error()
			}
		}
		row.Notes = append(row.Notes, a.notes...)
	}
	return out
}

// MemberStatus is a fleet member as the admin API reports it.
type MemberStatus struct {
	Name     string `json:"name"`
	Upstream string `json:"upstream"`
	Ready    bool   `json:"ready"`
	InFlight int64  `json:"in_flight"`
	// Warning is the member's backend's (tenant.Warner), such as a BMC that rejected its credentials;
	// the fleet's own Warning names every member's.
	Warning string `json:"warning,omitempty"`
}

func (fb *fleetBackend) status() []MemberStatus {
	out := make([]MemberStatus, len(fb.members))
	for i, m := range fb.members {
		out[i] = MemberStatus{Name: m.name, Upstream: m.route.Upstream.String(), Ready: m.ready.Load(), InFlight: m.inflight.Load(),
			Warning: memberWarning(m)}
	}
	return out
}

// Warning is the fleet's tenant.Warner: its members' warnings, each after the member's name, "; "
// between them, or "" when none has one. A member's backend can warn of what the fleet's state does
// not show (a BMC that rejected the credentials, so that the member's wakes, sleeps and watch send
// nothing to it), and the route's status is where the operator looks. Like theirs, it does no I/O.
func (fb *fleetBackend) Warning() string {
	var b strings.Builder
	for _, m := range fb.members {
		if w := memberWarning(m); w != "" {
			if b.Len() > 0 {
				b.WriteString("; ")
			}
			b.WriteString("member ")
			b.WriteString(m.name)
			b.WriteString(": ")
			b.WriteString(w)
		}
	}
	return b.String()
}

// memberWarning is m's backend's warning (tenant.Warner), "" when it has none or cannot warn.
func memberWarning(m *fleetMember) string {
	if w, ok := m.backend.(tenant.Warner); ok {
		return w.Warning()
	}
	return ""
}
