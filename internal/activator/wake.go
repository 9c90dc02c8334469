package activator

// The wake: one attempt at a time, detached from every request, gated on health, released together.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/activator/activator/internal/health"
	"github.com/activator/activator/internal/tenant"
)

// attempt is one wake. done is closed when it ends; err is written before that and read only after.
type attempt struct {
	done chan struct{}
	err  error
	rec  *tracker
	life *tenant.Life // the tenant's Life, once the attempt has made the instance Awake (guarded by instance.mu)
	// The release of the requests held on it, for the wake record: how many left the hold once done
	// was closed, and when the last of them did (UnixNano), so the record can show how long letting a
	// herd go took.
	released    atomic.Int64
	lastRelease atomic.Int64
	// waiters counts the requests held on this attempt (guarded by instance.mu). When the wake
	// succeeds, publishLocked moves them from held to in flight in one step and sets handedOver before
	// it closes done, so a released request goes straight to the proxy without taking instance.mu
	// again: a herd released at once would otherwise queue on that one mutex.
	waiters    int
	handedOver bool
	// quiet counts the callers waiting on this attempt that are not requests (awaitWake: admin wakes,
	// requirements, schedules), guarded by instance.mu: they are in flight from the hand-over too, but
	// count in no hold figure.
	quiet int
	// pending counts the requests handed over (waiters, at the hand-over) that have not yet left the
	// hold; the last to leave closes settled (depart), as does a backstop timer a second after the
	// hand-over. A parked request waits for settled before its connection is handed back (park.go).
	pending    atomic.Int64
	settled    chan struct{}
	settleOnce sync.Once
	// timing is the wake's phases as Server-Timing entries (servertiming.go), written before done is
	// closed.
	timing string
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

// depart notes that one request the attempt handed over has left the hold (noteRelease's caller, or
// leave when the request's context ended as the hand-over came); the last one settles the attempt.
func (a *attempt) depart() {
	if a.pending.Add(-1) == 0 {
		a.settle()
	}
}

func (a *attempt) settle() { a.settleOnce.Do(func() { close(a.settled) }) }

// settleBackstop bounds how long a parked request waits for its herd to settle, should a request
// handed over never be counted out (which depart's callers rule out; a bug there must not hold
// connections until their clients give up).
const settleBackstop = time.Second

// awaitSettled waits until every request the attempt handed over has left the hold, or ctx ends.
// Parked requests wait here before their hand-back (about 30 µs each: net/http's buffers and a new
// goroutine): otherwise the ones that left the hold first do theirs while the rest of the herd is
// still queued to leave, and whatever the scheduler queued behind them waits that long.
func (a *attempt) awaitSettled(ctx context.Context) {
	select {
	case <-a.settled:
	case <-ctx.Done():
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

// Gate is the health gate a woken tenant must pass; *health.Prober is the real one.
type Gate interface {
	// Wait returns nil once the tenant is healthy, health.ErrGone if gone closes first, an error
	// wrapping health.ErrWrongPath once the health path keeps answering the same client error, or an
	// error when ctx ends.
	Wait(ctx context.Context, gone <-chan struct{}) error
}

// ConnGate is a Gate that can also hand over the connection its passing probe used (nil when the
// tenant did not keep it alive). The activator gives it to the route's proxy, so the first released
// request goes out on a connection the tenant has already accepted and served: no dial, and no
// accept in a process that has just started. *health.Prober is one.
type ConnGate interface {
	WaitConn(ctx context.Context, gone <-chan struct{}) (net.Conn, error)
}

// start adopts a running tenant when the backend can tell. It runs as a wake whose waiters see the
// adopted state (or an asleep instance they then wake).
func (in *instance) start() {
	if _, ok := in.backend.(tenant.Adopter); !ok {
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.ho.waiting() {
		return // the backend was adopted from by the predecessor, which hands its tenant over (inherit)
	}
	if in.state != Asleep {
		return // a dependent started at the same reload has woken it already (chain.go)
	}
	in.beginWakeLocked(triggerAdopt)
}

// prepare lets the backend get ready for the instance's first wake (tenant.Preparer: the exec and kvm
// backings' standbys), in a goroutine of its own, once every predecessor of the route has retired (their
// tenant may still hold what the preparation needs, such as the upstream's port) and the wake under
// way as the instance started has ended (the adopt, which may find the tenant running or clear away
// what an earlier activator left; or a dependent's wake). It takes one of
// slots (the Server's prepares) while it runs, so that a start-up with a thousand standby routes spawns
// them a few at a time, not all at once beside the first requests. It gives up when the activator
// shuts down or the instance retires first.
func (in *instance) prepare(slots chan struct{}) {
	p, ok := in.backend.(tenant.Preparer)
	if !ok || !p.NeedsPrepare() {
		return
	}
	in.mu.Lock()
	first := in.wake // the adopt start began, if any
	inheriting := in.ho.waiting()
	in.mu.Unlock()
	if inheriting {
		return // the predecessor's backend, with its tenant or its standby: nothing to prepare
	}
	before := in.after
	if first != nil {
		before = append([]<-chan struct{}{first.done}, in.after...)
	}
	in.wg.Add(1)
	go func() {
		defer in.wg.Done()
		if !awaitAll(before, in.root.Done(), in.retired) {
			return
		}
		select {
		case slots <- struct{}{}:
		case <-in.root.Done():
			return
		case <-in.retired:
			return
		}
		defer func() { <-slots }()
		p.Prepare(in.root)
	}()
}

// awaitAll waits until every channel of chs is closed, in order, and reports true; or until stop or
// stop2 (nil: none) is closed first, and reports false. It is how a wake and a preparation wait for the
// route's predecessors to retire.
func awaitAll(chs []<-chan struct{}, stop, stop2 <-chan struct{}) bool {
	for _, ch := range chs {
		select {
		case <-ch:
		case <-stop:
			return false
		case <-stop2:
			return false
		}
	}
	return true
}

// beginWakeLocked moves to Waking and starts the wake goroutine.
func (in *instance) beginWakeLocked(trig trigger) *attempt {
	att := &attempt{done: make(chan struct{}), settled: make(chan struct{}), rec: newTracker(in.route.Name, in.route.Backing, trig, in.now)}
	in.followLocked(att) // the waiting pages' view of it (waiting.go)
	// An adopt or a reload's handover is no wake the duration series count.
	if trig != triggerAdopt && trig != triggerReload {
		in.series.wakeBegun(in.route.Backing)
	}
	in.wake = att
	in.setStateLocked(Waking)
	in.wg.Add(1)
	go in.runWake(att, trig)
	return att
}

// runWake performs one wake, in two steps: wakeAndGate without the lock, then publishLocked, which
// releases every waiter together by closing att.done.
func (in *instance) runWake(att *attempt, trig trigger) {
	defer in.wg.Done()
	out := in.wakeAndGate(att.rec, trig)
	in.mu.Lock()
	woke := in.publishLocked(att, out)
	in.maybeRetireLocked()
	in.mu.Unlock()
	if woke {
		in.logger().Info("woke", "wake_id", out.rec.ID, "trigger", out.rec.Trigger, "duration", out.rec.Duration, "phases", phaseAttr(out.rec.Phases),
			"joined", out.rec.Joined, "notes", out.rec.Notes)
	}
}

// wakeOutcome is what the unlocked part of a wake found, for publishLocked to apply.
type wakeOutcome struct {
	life  *tenant.Life // the tenant's life, when awake
	awake bool         // false when an adopt found no tenant running
	err   error
	rec   WakeRecord // the finished record
	holds []func()   // the holds on the requirements, kept while the tenant is awake (chain.go)
	// handedOver: a request's wake took over the tenant a reload's predecessor handed over (inherit).
	handedOver bool
}

// phaseAdopt is the phase of a wake that asks the backend for a tenant already running.
const phaseAdopt = "adopt"

// phasePredecessor is the phase of a changed route's first wake that waits for the instance the
// reload replaced (or an earlier one of the same name, removed and added back) to retire.
const phasePredecessor = "predecessor"

// pending reports whether any of chs is still open.
func pending(chs []<-chan struct{}) bool {
	for _, ch := range chs {
		select {
		case <-ch:
		default:
			return true
		}
	}
	return false
}

// wakeAndGate starts (or adopts) the tenant and waits for its health gate, on a context detached from
// every request and bounded by the wake budget. A tenant it started or adopted that never passes the
// gate is stopped before it returns. It runs without the lock; only the wake goroutine uses in.prober.
func (in *instance) wakeAndGate(rec *tracker, trig trigger) wakeOutcome {
	ctx, cancel := context.WithTimeout(in.root, in.route.WakeBudget)
	defer cancel()
	if trig == triggerAdmin {
		ctx = tenant.ByOperator(ctx)
	}
	rec.budgets(in.route.WakeBudget, 0)
	if pending(in.after) {
		// The instance a reload replaced is still putting its tenant to sleep (its requests in flight
		// keep it for at most the reload's grace: retireGrace). The wake says so, or its record would
		// show seconds that no phase explains.
		rec.then(phasePredecessor)
		awaitAll(in.after, ctx.Done(), nil) // past the budget, the wake goes on to fail on ctx
		rec.end()
	}
	out := wakeOutcome{awake: true}
	started := false // a tenant runs that a failure must stop
	if trig != triggerAdopt && in.inherited() {
		// A request's wake that waited for the predecessor's handover, which handed a tenant over:
		// it takes that over, as the reload's own wake would have (inherit).
		trig, out.handedOver = triggerReload, true
	}
	if trig == triggerAdopt || trig == triggerReload {
		if trig == triggerAdopt {
			out.life, out.awake = in.adopt(ctx, rec)
		} else {
			out.life, out.awake = in.takeOver(rec)
		}
		if started = out.awake; started {
			out.holds, out.err = in.wakeRequirements(ctx, rec) // an adopted tenant holds them as a woken one does
		}
	} else if out.holds, out.err = in.wakeRequirements(ctx, rec); out.err == nil {
		out.life, out.err = in.startTenant(ctx, rec)
		started = out.err == nil
	}
	if out.err == nil && out.awake && in.fleet == nil { // a fleet's members pass gates of their own
		out.err = in.gate(ctx, rec, out.life)
	}
	if out.err != nil && started {
		// Adopted or started, a tenant that does not pass is stopped: left running, the next wake
		// would take the same broken tenant again (an adopted unit still SIGSTOPped by an activator in
		// another sleep mode failed every gate until someone stopped it by hand).
		in.stopUnhealthy(rec)
	}
	if out.err != nil {
		releaseAll(out.holds) // what was woken for this wake alone sleeps after its idle window
		out.holds = nil
	}
	rec.finish(wakeResult(trig, out.awake, out.err), out.err)
	out.rec = rec.amend(func(r *WakeRecord) { in.settleRecord(r, out.err) }) // the tracker's too: nested copies read it
	return out
}

// adopt asks the backend for a tenant that is already running. A failed adopt is logged and taken as
// "nothing running": the next request wakes the tenant the ordinary way.
func (in *instance) adopt(ctx context.Context, rec *tracker) (life *tenant.Life, awake bool) {
	rec.Phase(phaseAdopt)
	life, awake, err := in.backend.(tenant.Adopter).Adopt(ctx)
	if err != nil {
		in.logger().Warn("adopt failed; treating the tenant as asleep", "err", err)
		return nil, false
	}
	return life, awake
}

// phaseHandover is the phase of a reload's wake in which the route's new instance takes over the
// tenant its predecessor kept running (inherit).
const phaseHandover = "handover"

// inherited reports whether the predecessor handed over a Life that no wake has taken over yet.
func (in *instance) inherited() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.ho != nil && in.ho.legacy != nil
}

// takeOver takes the Life the predecessor handed over (inherit): the tenant runs on, and the wake goes
// on to the health gate, this config's. A tenant that ended meanwhile is none: the route is asleep.
func (in *instance) takeOver(rec *tracker) (life *tenant.Life, awake bool) {
	rec.Phase(phaseHandover)
	in.mu.Lock()
	if in.ho != nil {
		life, in.ho.legacy = in.ho.legacy, nil
	}
	in.mu.Unlock()
	if life == nil || life.Err() != nil {
		rec.Note("the tenant the replaced instance kept running ended before the handover")
		return nil, false
	}
	// The notes say what the handover found, as of the handover: the record is the route's last wake,
	// which its status shows through sleeps and reloads until the next wake, and "the tenant runs on"
	// or "2 of 3 members ready" read as now on a route asleep since, or with all three ready since
	// (found by an operator trial). How the members are now is the status's members.
	rec.Note("the reload changed only keys of the edge: the replaced instance handed the tenant over, running")
	if in.fleet != nil {
		// Not gated again, member by member: each passed its gate as it came up, and the route's
		// health block applies from each member's next wake (fleetView.gateMember).
		rec.Note(fmt.Sprintf("%d of %d members were ready at the handover (min_ready %d); they were not probed again",
			in.fleet.ready(), len(in.fleet.members), in.fleet.minReady()))
	}
	return life, true
}

// startTenant wakes the tenant through the backend, which names its own phases.
func (in *instance) startTenant(ctx context.Context, rec *tracker) (*tenant.Life, error) {
	rec.begin(tenant.PhaseStart)
	life, err := in.backend.Wake(ctx, rec)
	if err == nil && life == nil {
		err = errors.New("backend returned no Life")
	}
	return life, err
}

// gate waits for the health gate, within the route's health budget. The connection of the probe that
// passed, if the tenant kept it, goes to the route's proxy (see ConnGate).
func (in *instance) gate(ctx context.Context, rec *tracker, life *tenant.Life) error {
	rec.then(tenant.PhaseHealth)
	rec.budgets(in.route.WakeBudget, in.route.Health.Budget)
	if b := in.route.Health.Budget; b > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b)
		defer cancel()
	}
	if in.prober == nil {
		in.prober = in.newGate()
	}
	return waitGate(ctx, in.prober, rec, life, in.adoptUpstream)
}

// waitGate waits for gate to pass while life goes on, notes in rec what the gate says of how it passed
// (health.WithNote), and gives adopt the passing probe's connection when the gate hands one over
// (ConnGate). A tenant gone meanwhile fails it with health.ErrGone and the Life's error.
func waitGate(ctx context.Context, gate Gate, rec *tracker, life *tenant.Life, adopt func(net.Conn)) error {
	ctx = health.WithNote(ctx, rec.Note)
	var err error
	if cg, ok := gate.(ConnGate); ok {
		var c net.Conn
		if c, err = cg.WaitConn(ctx, life.Done()); c != nil {
			adopt(c)
		}
	} else {
		err = gate.Wait(ctx, life.Done())
	}
	if errors.Is(err, health.ErrGone) {
		err = fmt.Errorf("%w: %w", err, life.Err())
	}
	return err
}

// stopUnhealthy stops a tenant that started (or was adopted) but never turned healthy: it must not
// keep running behind our back. The stop is a phase of its own, so the record shows how long the gate
// took (at most its budget) apart from how long the tenant took to stop.
func (in *instance) stopUnhealthy(rec *tracker) {
	rec.failed()
	rec.Phase(tenant.PhaseStop)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(in.root), in.route.SleepBudget)
	defer cancel()
	stop := in.backend.Sleep
	if st, ok := in.backend.(tenant.Stopper); ok {
		stop = st.Stop
	}
	if err := stop(ctx); err != nil {
		rec.Note("stopping the unhealthy tenant failed: " + err.Error())
	}
	in.dropUpstream()
}

// wakeResult is the Result of a wake that trig started and that ended with err.
func wakeResult(trig trigger, awake bool, err error) string {
	switch {
	case err != nil:
		return ResultFailed
	case trig != triggerAdopt && trig != triggerReload:
		return ResultOK
	case awake:
		return ResultAdopted
	}
	return ResultAdoptAsleep
}

// yieldBelow bounds the releases after which the wake yields its CPU to the first released request
// (publishLocked). A herd's release is bounded by the CPU, not by one handoff, and a yield would put
// this goroutine, holding the instance's lock, behind thousands of runnable ones.
const yieldBelow = 64

// publishLocked applies a wake's outcome: Failed with a backoff, Asleep (an adopt that found nothing),
// or Awake with every waiter moved to in flight. It closes att.done, which releases the waiters.
func (in *instance) publishLocked(att *attempt, out wakeOutcome) (woke bool) {
	if out.err == nil && out.awake && in.checkErr != nil {
		in.checkWokeLocked()
	}
	if out.err != nil && in.checkErr != nil {
		// What the host check found at start-up (a port held by another process) is likely the cause.
		out.rec.Notes = append(slices.Clip(out.rec.Notes), "the host check at start-up failed: "+in.checkErr.Error())
		out.err = fmt.Errorf("%w (the host check at start-up had found: %v)", out.err, in.checkErr)
	}
	in.lastRec, in.lastAtt = &out.rec, att
	att.timing = timingEntries(out.rec.Phases)
	in.hist.add(Event{Kind: EventWake, Wake: &out.rec}, att)
	switch {
	case out.err != nil:
		in.failLocked(att, out)
		close(att.done)
	case !out.awake:
		in.setStateLocked(Asleep)
		close(att.done)
	default:
		in.holds = out.holds
		in.awakeLocked(att, out.life)
		close(att.done)
		if att.waiters > 0 && att.waiters < yieldBelow {
			// The held requests are on their way, and need not the lock: the first of them waits to
			// run on this CPU, which it gets now. Left waiting while this goroutine went on, it was
			// stolen by an idle CPU woken for it, tens of microseconds later on a virtual machine.
			runtime.Gosched()
		}
		// Not in their path: the watch on the tenant, the metrics, and the log line (runWake's,
		// once the lock is let go).
		in.watchAwakeLocked(att, out.life)
		if woke = out.rec.Result == ResultOK; woke {
			in.series.wakeDone(out.rec)
		} else if out.rec.Trigger == string(triggerReload) || out.handedOver {
			if in.ho != nil && !in.ho.since.IsZero() {
				in.since, in.ho.since = in.ho.since, time.Time{} // the same tenant, awake since then
			}
			if in.fleet != nil {
				in.checkHandedLocked()
			}
			in.logger().Info("took over the running tenant from the replaced instance", "wake_id", out.rec.ID, "duration", out.rec.Duration)
		} else {
			in.logger().Info("adopted a running tenant")
		}
	}
	in.endProgressLocked(att, out) // after the state: a page that reloads on ready finds the route awake
	return woke
}

// checkWokeLocked clears what the host check found at start-up, now that the tenant woke: it (a BMC's
// password since corrected, a port since freed) no longer stands in its way, and the status must stop
// saying it does. A fleet's members' findings are not the fleet's: each goes when its member comes up
// (fleetBackend.clearCheck), and stays for a member that does not, though the fleet is up without it.
func (in *instance) checkWokeLocked() {
	left, gone := error(nil), in.checkErr
	if in.fleet != nil {
		left, gone = checkLeft(in.checkErr, func(string) bool { return false }, true)
		if gone == nil {
			return
		}
	}
	in.logger().Info("the route woke: the host check's finding no longer holds", "was", gone)
	in.checkErr = left
}

// checkHandedLocked clears the host check's findings of the members of a fleet handed over by a reload
// that are ready: they came up under the replaced instance, which cleared them there
// (fleetBackend.clearCheck), and will not come up again for this one, whose finding at start-up is the
// server's (openLocked) until the reload's own host check sets it again. A finding that check has set
// already (checkOwn) stays: it is about members that were up when it was made.
func (in *instance) checkHandedLocked() {
	if in.checkErr == nil || in.checkOwn {
		// A finding of a check since this instance opened (the reload's own) is news about members
		// that are up already: being up says nothing against it.
		return
	}
	left, gone := checkLeft(in.checkErr, in.fleet.isReady, false)
	if gone == nil {
		return
	}
	in.checkErr = left
	in.logger().Info("fleet members up when the reload handed the fleet over: the host check's finding no longer holds for them", "was", gone)
}

// failLocked moves to Failed after a failed wake and sets the backoff, doubled on each consecutive
// failure up to backoff.max, that att's waiters and later requests see.
func (in *instance) failLocked(att *attempt, out wakeOutcome) {
	in.fails++
	backoff := in.route.Backoff.Initial << min(in.fails-1, 20)
	if backoff > in.route.Backoff.Max || backoff <= 0 {
		backoff = in.route.Backoff.Max
	}
	rec := out.rec
	we := &WakeError{Route: in.route.Name, Phase: rec.FailedPhase, WakeID: rec.ID, Err: out.err, RetryAfter: backoff,
		Detailed: in.route.DetailedErrors, Class: tenant.Class(rec.Class), Culprit: rec.Culprit}
	in.lastErr = we
	att.err = we
	in.until = in.now().Add(backoff)
	in.setStateLocked(Failed)
	if rec.Outcome == OutcomeCancelled { // by the shutdown: no failure to alert on
		in.logger().Info("wake cancelled by the shutdown", "wake_id", rec.ID, "trigger", rec.Trigger, "phase", rec.FailedPhase,
			"duration", rec.Duration, "phases", phaseAttr(rec.Phases), "err", out.err)
		return
	}
	in.logger().Warn("wake failed", "wake_id", rec.ID, "trigger", rec.Trigger, "phase", rec.FailedPhase, "duration", rec.Duration,
		"phases", phaseAttr(rec.Phases), "retry_in", backoff, "err", out.err)
	in.series.wakeDone(rec)
}

// awakeLocked moves to Awake with the tenant's life: att's waiters are in flight from now on (they leave
// without the lock). watchAwakeLocked, under the same lock once they are released, does the rest.
func (in *instance) awakeLocked(att *attempt, life *tenant.Life) {
	att.life = life
	in.fails = 0
	in.lastErr = nil
	in.setStateLocked(Awake)
	in.held -= att.waiters
	in.inflight += att.waiters + att.quiet
	att.pending.Store(int64(att.waiters))
	att.handedOver = true
}

// watchAwakeLocked is the rest of awakeLocked, done once the waiters are released: the backstop of
// att's settling, the watch on the tenant, and the idle clock when no request came with the wake.
func (in *instance) watchAwakeLocked(att *attempt, life *tenant.Life) {
	if att.waiters == 0 {
		att.settle()
	} else {
		time.AfterFunc(settleBackstop, att.settle)
	}
	in.wg.Add(1)
	go in.watch(life, in.lifeGen, in.awakeEnd)
	if in.inflight == 0 && in.held == 0 {
		// Waiters, if any, will acquire and release; with none the idle clock starts now.
		in.armIdleLocked()
	}
}

// watch notices a tenant that stops on its own while awake.
func (in *instance) watch(life *tenant.Life, gen uint64, awakeEnd <-chan struct{}) {
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
	if in.slpErr != nil {
		// A sleep that failed left the tenant running; it is gone now, and the failure with it (the
		// status said "the tenant may still run" over a route shown asleep).
		in.slpErr = nil
		in.series.sleepFailed(false)
	}
	// Before the state changes: a wake after it must keep the connection its gate hands over.
	in.dropUpstream()
	in.recordSleep(ReasonExited, in.now(), life.Err(), nil, false)
	in.lastSlp = ReasonExited
	in.series.slept(ReasonExited, false)
	awakeFor := in.now().Sub(in.since)
	in.setStateLocked(Asleep)
	if len(in.dependents) > 0 {
		// An instance stays awake while anything awake requires it (config.md): one whose tenant
		// stopped on its own under awake dependents is woken again, at once, or a backoff.initial
		// after its last wake if it ran for less than that (a tenant that dies at once must not be
		// restarted in a tight loop). Found with the real binary: a node powered off behind the
		// activator's back (and an exec requirement killed) stayed down while the routes requiring
		// it went on serving without it.
		after := max(0, in.route.Backoff.Initial-awakeFor)
		in.logger().Info("waking it again: awake dependents require it", "required_by", in.requiredByLocked(), "in", after)
		time.AfterFunc(after, in.rewakeForDependents)
	}
}

// rewakeForDependents wakes the instance again for its awake dependents (see watch), unless it has
// woken, closed or lost them meanwhile.
func (in *instance) rewakeForDependents() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.state == Asleep && len(in.dependents) > 0 && !in.closed && !in.retiring && !in.draining() {
		in.beginWakeLocked(triggerRequired)
	}
}

// kick starts a wake if the instance is asleep (or its failure backoff is over) and returns at once.
func (in *instance) kick() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed || in.retiring || in.draining() {
		return
	}
	if in.state == Asleep || (in.state == Failed && !in.now().Before(in.until)) {
		in.beginWakeLocked(triggerAdmin)
	}
}

// wakeNow wakes the instance without a request (admin API) and waits for the result.
func (in *instance) wakeNow(ctx context.Context) error {
	release, err := in.awaitWake(ctx, triggerAdmin, nil)
	if err != nil {
		return err
	}
	release()
	return nil
}

// prepareAtOnce is how many backends of one Server prepare for their first wake at a time
// (instance.prepare): an exec standby's spawn is about 0.65 ms of this machine's CPU, and the edge's
// requests need the rest of it.
const prepareAtOnce = 2
