package activator

// Sleep and retirement: the idle clock, putting the tenant down, and closing the instance.

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// armIdleLocked starts the idle clock, or starts it again from now. The timer's callback (idleFired)
// only flips state and starts the owned sleep goroutine.
func (in *instance) armIdleLocked() {
	if in.route.Idle <= 0 || in.closed {
		return
	}
	in.disarmIdleLocked()
	if in.idle == nil {
		in.idle = time.AfterFunc(in.route.Idle, in.idleFired)
	} else {
		in.idle.Reset(in.route.Idle)
	}
	in.idleArmed = true
}

// disarmIdleLocked stops the idle clock and moves idleGen on. A Stop that fails found the timer fired:
// its idleFired has started and is counted stale, so that it cannot take the window of a later arm for
// its own.
func (in *instance) disarmIdleLocked() {
	in.idleGen++
	if !in.idleArmed {
		return
	}
	in.idleArmed = false
	if !in.idle.Stop() {
		in.idleStale++
	}
}

// idleFired is the idle timer's callback. The firings are alike, so which of them is stale does not
// matter, only how many: one that finds none left stale runs after the arm in force has fired, so that
// arm's whole window has passed with nothing counted in flight (an acquire would have disarmed it).
func (in *instance) idleFired() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.idleStale > 0 {
		in.idleStale--
		return
	}
	in.idleArmed = false
	if in.state != Awake || in.inflight > 0 || in.held > 0 || in.keptWarm(in.now()) {
		return // inside a keep_warm window, the window's end starts the idle clock again (schedule.go)
	}
	if in.postponeIdleLocked(in.idleGen) {
		return // ignored requests in flight: the last of them starts the sleep (filter.go)
	}
	in.beginSleepLocked(ReasonIdle)
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

// drainInFlightFor is drainInFlight for an admin sleep; the other sleeps begin with nothing in flight
// (idle), or after a grace of their own (a reload's, instance.retire).
func (in *instance) drainInFlightFor(reason string) (left int, grace time.Duration) {
	if reason != ReasonAdmin {
		return 0, 0
	}
	return in.drainInFlight()
}

// stopOrSleep stops the tenant whatever its sleep mode (tenant.Stopper), or puts it to sleep when the
// backend cannot stop it otherwise.
func (in *instance) stopOrSleep(ctx context.Context) error {
	if st, ok := in.backend.(tenant.Stopper); ok {
		return st.Stop(ctx)
	}
	return in.backend.Sleep(ctx)
}

func (in *instance) runSleep(reason string, done chan struct{}) {
	defer in.wg.Done()
	start := in.now()
	// The requests in flight first, then the backend's budget: counted from the sleep's start, a grace
	// as long as sleep_budget (30s each by default) left the stop nothing, and an exec tenant was killed
	// with SIGKILL at once, noted as one that ignored SIGTERM.
	left, grace := in.drainInFlightFor(reason)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(in.root), in.route.SleepBudget)
	if reason == ReasonAdmin {
		ctx = tenant.ByOperator(ctx)
	}
	if reason == ReasonReload { // a retiring instance's sleep: its teardown closes the backend next
		ctx = tenant.LastSleep(ctx)
	}
	ctx, notes := tenant.WithSleepNotes(ctx)
	var err error
	if left > 0 {
		// A tenant parked under them (frozen, stopped with SIGSTOP, paused) would leave them unanswered
		// until its next wake: stopped, they end with it.
		tenant.NoteSleep(ctx, fmt.Sprintf("%d requests still in flight after %v: the tenant was stopped, whatever its sleep mode, so that they end with it", left, grace))
		err = in.stopOrSleep(ctx)
	} else {
		err = in.backend.Sleep(ctx)
	}
	cancel()
	// While Stopping nothing is proxied and no wake starts, so no connection a wake's gate handed over
	// is dropped.
	in.dropUpstream()
	in.mu.Lock()
	defer in.mu.Unlock()
	in.lastSlp = reason
	// A forced sleep is one that succeeded by force; one that failed is a failure, whatever it tried.
	said, forced := notes.List(), notes.Forced() && err == nil
	in.recordSleep(reason, start, err, said, forced)
	if err == nil { // a failed sleep counts in activator_sleep_failures_total only
		in.series.slept(reason, forced)
	}
	in.slpErr = nil
	takeBack := err != nil && takesBack(err)
	if err != nil {
		in.slpErr = &SleepError{Route: in.route.Name, Reason: reason, Err: err}
		msg := "sleep failed; taking the tenant back as awake"
		if !takeBack {
			msg = "sleep failed; too few of the fleet's members may still run for min_ready: it counts as asleep"
		}
		in.logger().Error(msg, "reason", reason, "err", err, "notes", said)
	} else {
		in.logger().Info("slept", "reason", reason, "duration", in.now().Sub(start), "forced", forced, "notes", said)
	}
	in.series.sleepFailed(err != nil)
	in.setStateLocked(Asleep)
	close(done)
	if takeBack && !in.retiring && !in.closed && !in.draining() {
		// A failed sleep is not a sleep: the tenant may still run (a freeze the host cannot do, a
		// node that will not power off). The route takes it back at once, through the backing's Wake
		// (which takes a running tenant as it is) and the health gate, so that its state is the
		// tenant's; the failure stays in the status until a sleep succeeds. A retiring instance
		// closes its backend instead, and a draining one starts no wake. A fleet is taken back only
		// when the members that refused make its quorum, and on them alone (fleetSleepError).
		in.beginWakeLocked(triggerSleepFailed)
	}
	in.maybeRetireLocked()
}

// sleepNow puts the instance to sleep (admin API). It waits for a wake in progress, and returns once
// the instance is asleep; requests that arrive meanwhile wake it again afterwards. When the sleep it
// started failed, it returns that *SleepError; the instance is then waking again (see runSleep), or,
// a fleet with too few members left running for its quorum, asleep.
func (in *instance) sleepNow(ctx context.Context, reason string) error {
	for {
		in.mu.Lock()
		if in.closed {
			in.mu.Unlock()
			return ErrClosed // its backend is closed, or about to be: no sleep may start
		}
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
			if len(in.dependents) > 0 {
				err := &RequiredError{Instance: in.route.Name, By: in.requiredByLocked()}
				in.mu.Unlock()
				return err
			}
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

// retire marks the instance as removed or replaced: it sleeps (ReasonReload) as soon as no request is
// in flight or held, then closes its backend and its upstream connections and lets go of the route's
// metric series, and, when the running config no longer has its tenant, has the backend forget it
// (forget). retired is closed when that is done.
func (in *instance) retire(grace time.Duration) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.retiring = true
	in.stopScheduleLocked()
	in.maybeRetireLocked()
	if !in.closed && grace > 0 {
		in.cut = time.AfterFunc(grace, in.graceEnded)
	}
}

// graceEnded ends a retiring instance's grace (retire): requests still in flight, a WebSocket or an
// event stream that could stay open for hours, no longer keep it from sleeping. They go on against a
// tenant being put to sleep, and end when it stops, as they do when a shutdown's grace ends. Without
// this, the route's new instance, whose first wake waits for this one to retire, could not wake while
// a single WebSocket stayed open, and every new request to the route got 504 at its hold.max_time.
func (in *instance) graceEnded() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed || in.inflight+in.unseen == 0 {
		return
	}
	in.cutDue = true
	if in.ho.heirOf() != nil {
		// Nothing sleeps under them: the tenant is handed over running as soon as the wake or sleep in
		// progress ends (handOverLocked), whatever is in flight.
		in.maybeRetireLocked()
		return
	}
	in.logger().Warn("requests still in flight when the reload's grace ended: the replaced instance sleeps under them",
		"in_flight", in.inflight+in.unseen, "state", in.state.String())
	in.maybeRetireLocked()
}

func (in *instance) maybeRetireLocked() {
	in.noteQuietLocked() // every path that lowers held, in flight, waking or stopping comes here
	if !in.retiring || in.closed || in.ho.waiting() || in.held > 0 {
		return
	}
	if in.ho.passedOn() {
		in.closeHandedLocked()
		return
	}
	if in.state == Awake && in.ho.heirOf() != nil {
		// At once, whatever is in flight: waiting for those to end held every new request to the route
		// for up to the reload's grace (one event stream was enough), with the route shown asleep, for
		// a change of idle (found by an operator trial).
		in.handOverLocked()
		return
	}
	if in.inflight+in.unseen > 0 && !in.cutDue {
		return
	}
	switch in.state {
	case Awake:
		in.beginSleepLocked(ReasonReload)
	case Asleep, Failed:
		in.closed = true
		if in.cut != nil {
			in.cut.Stop()
		}
		heir := in.ho.heirOf()
		if heir != nil {
			in.ho.lent = true // the heir's from now on: it inherits no tenant, only the backend
		}
		// What the backend keeps of the tenant may go once it is closed, if the tenant is gone from
		// the config (forget): not when an heir takes the backend on, nor after a sleep that failed,
		// whose tenant may still run.
		forget, failed := heir == nil, in.slpErr != nil
		in.wg.Add(1)
		go func() {
			defer in.wg.Done()
			in.teardown()
			if forget {
				in.forget(failed) // before retired closes: a route added back meanwhile waits for it
			}
			close(in.retired)
			if heir != nil {
				heir.inherit(nil)
			}
		}()
	}
	// Waking or Stopping: runWake/runSleep call back here when they finish.
}

// handover is an instance's part in a reload that hands the route's tenant on, when only keys of the
// edge changed (registry.Route.SameTenant): Apply gives the route's new instance, the heir, the old
// one's backend, and the old one hands the heir its tenant, running, when it retires, instead of
// putting it to sleep (handOverLocked, inherit). Guarded by the instance's mu. Its methods take a nil
// handover as an instance's that owns its backend throughout.
//
// The old instance hands the tenant over as soon as it is awake, with its requests in flight going on
// (a proxied request needs the tenant's upstream, not the backend): the heir counts them in flight as
// its own (receive), so that its idle clock does not start under them, and the old instance, which
// counts them too, forwards each one's end to it (releaseLocked). The old instance retires once they
// are done (closeHandedLocked). Lock order: an instance may take its heir's mu under its own, never
// the reverse.
type handover struct {
	heir       *instance     // the old instance's: who takes its tenant over
	inheriting bool          // the heir's: waiting for the handover; it neither adopts, prepares nor retires before
	lent       bool          // the backend is another's to close: the heir's after the handover, the old one's before it
	legacy     *tenant.Life  // the heir's: the Life handed over, for the wake that takes it over (takeOver)
	arrived    chan struct{} // the heir's: closed once inherit has run; its first wake waits for it (instance.after)
	passed     bool          // the old instance's: the tenant (or its absence) was handed over
	carried    int           // the old instance's: its requests in flight the heir also counts, not yet ended
	since      time.Time     // the heir's: since when the tenant handed over has been awake, for its status
}

func (h *handover) waiting() bool     { return h != nil && h.inheriting }
func (h *handover) ownsBackend() bool { return h == nil || !h.lent }
func (h *handover) passedOn() bool    { return h != nil && h.passed }

func (h *handover) heirOf() *instance {
	if h == nil {
		return nil
	}
	return h.heir
}

// bequeath makes heir, which Apply gave this instance's backend, the one to take its tenant over when
// it retires (Apply calls it just before retire).
func (in *instance) bequeath(heir *instance) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.ho == nil {
		in.ho = &handover{}
	}
	in.ho.heir = heir
}

// awaitsHandover reports whether the instance borrowed its predecessor's backend (openLocked) and
// waits for its tenant.
func (in *instance) awaitsHandover() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.ho.waiting()
}

// handOverLocked retires an awake instance whose heir takes its tenant over (instance.heir): instead of
// putting the tenant to sleep it lets go of it as it is and hands the heir the tenant's Life with the
// backend, at once; its requests in flight go on, counted by the heir too (see handover), and it
// closes once they are done. The route's state series is the heir's to set: it is left as it is.
func (in *instance) handOverLocked() {
	life, heir, since := in.wake.life, in.ho.heir, in.since
	in.ho.lent, in.ho.passed = true, true
	if in.cut != nil {
		in.cut.Stop() // nothing waits for it to retire any more
	}
	in.lifeGen++ // its watcher must not take what follows for a death (the heir watches the Life)
	close(in.awakeEnd)
	in.disarmIdleLocked()
	in.state, in.since = Asleep, in.now()
	in.awake.Store(false)
	in.letGoLocked()
	if heir.receive(in.inflight, since) {
		in.ho.carried = in.inflight
	}
	in.wg.Add(1)
	go func() {
		defer in.wg.Done()
		heir.inherit(life)
	}()
	in.closeHandedLocked()
}

// receive counts n requests in flight on the predecessor as the instance's own, until the predecessor
// forwards their ends (release), and notes since when the tenant it hands over has been awake (the
// status's since goes on from there, not from the handover); it reports whether it did: a closed
// instance takes nothing.
func (in *instance) receive(n int, since time.Time) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return false
	}
	in.inflight += n
	in.ho.since = since
	return true
}

// closeHandedLocked closes an instance that has handed its tenant over (handOverLocked), once its
// requests in flight are done: its upstream connections, its hold on the metric series; not the
// backend, which is the heir's.
func (in *instance) closeHandedLocked() {
	if in.closed || in.inflight+in.unseen > 0 {
		return
	}
	in.closed = true
	in.wg.Add(1)
	go func() {
		defer in.wg.Done()
		in.teardown()
		close(in.retired)
	}()
}

// inherit is the predecessor's handover (handOverLocked), or, with life nil, its word that it retired
// with no tenant running: the backend is this instance's from now on. A running tenant is taken over
// by a wake (triggerReload) that goes through this config's health gate, as an adopted one does; a
// retiring heir then hands it on, or puts it to sleep, as its own retirement decides. An heir shut down
// meanwhile passes the backend on to its own heir, or closes it.
func (in *instance) inherit(life *tenant.Life) {
	in.mu.Lock()
	in.ho.inheriting = false
	defer close(in.ho.arrived) // after legacy is set: a wake waiting for it takes the tenant over
	if in.closed {
		heir := in.ho.heir
		in.ho.lent = heir != nil
		in.mu.Unlock()
		if heir != nil {
			heir.inherit(life)
			return
		}
		in.closeBackend(context.WithoutCancel(in.root))
		return
	}
	defer in.mu.Unlock()
	in.ho.lent = false
	if in.fleet != nil {
		in.fleet.own() // what the fleet does on its own (members that leave it, stop, settle) is ours now
	}
	if life != nil && life.Err() == nil {
		switch in.state {
		case Asleep:
			in.ho.legacy = life
			in.beginWakeLocked(triggerReload)
			return
		case Waking:
			// A request reached the new instance before the handover, and its wake waits for it
			// (instance.after): that wake takes the tenant over, where it would have started it again.
			in.ho.legacy = life
			return
		}
	}
	in.maybeRetireLocked()
}

// draining reports whether the activator has begun to shut down (Server.Drain): no wake starts then.
func (in *instance) draining() bool {
	select {
	case <-in.drain:
		return true
	default:
		return false
	}
}

// noteQuietLocked tells a shutdown waiting for the instance (see shutdown) that what is held, in flight,
// waking or stopping may have changed. Every path that lowers one of them calls it.
func (in *instance) noteQuietLocked() {
	if in.quiet != nil {
		close(in.quiet)
		in.quiet = nil
	}
	if in.drained != nil {
		close(in.drained)
		in.drained = nil
	}
}

// drainInFlight waits, for an admin sleep, until the requests in flight as the sleep began have been
// answered, for at most the instance's grace (the reload's: shutdown_grace, at most half the route's
// hold.max_time). The instance is Stopping meanwhile, so new requests wait behind the sleep and the
// number only falls. It returns how many are still in flight then. Found with the real binary: an
// admin sleep during a wake sent every request the wake released to a tenant being stopped (502,
// "connection refused"), and on a `sleep: freeze` route froze the requests in flight, which got no
// answer at all until their clients gave up.
func (in *instance) drainInFlight() (left int, grace time.Duration) {
	var timeout <-chan time.Time
	for {
		in.mu.Lock()
		left, grace = in.inflight+in.unseen, in.grace
		if left == 0 || grace <= 0 {
			in.mu.Unlock()
			return left, grace
		}
		ch := make(chan struct{})
		in.drained = ch
		in.mu.Unlock()
		if timeout == nil {
			t := time.NewTimer(grace)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-ch:
		case <-timeout:
			in.mu.Lock()
			left = in.inflight + in.unseen
			in.mu.Unlock()
			return left, grace
		case <-in.root.Done():
			return 0, grace // the shutdown decides what happens to them
		}
	}
}

// closableLocked reports whether shutdown may close the instance now: no request is held and no wake or
// sleep is running (the backend must not be closed under either), and nothing is in flight unless cut
// is closed.
func (in *instance) closableLocked(cut <-chan struct{}) bool {
	if in.held > 0 || in.state == Waking || in.state == Stopping {
		return false
	}
	if in.inflight+in.unseen == 0 {
		return true
	}
	select {
	case <-cut:
		return true
	default:
		return false
	}
}

// shutdown closes the instance for the activator's shutdown (Server.Shutdown), once the activator is
// draining: as soon as it is closable, that is when its last held and in-flight requests are done and
// no wake or sleep runs; after cut is closed, requests in flight no longer count (they go on against a
// tenant being stopped until the edge cuts them). Closing stops the idle clock, refuses every later
// request (ErrClosed) and calls teardown with ctx: the backend's Close decides what happens to a running
// tenant, within ctx. An instance that has retired already is left as it is. shutdown returns when ctx
// ends, closed or not; it does not join the instance's goroutines: its life watch ends with the server's
// root context, after which Server.Shutdown waits on in.wg.
func (in *instance) shutdown(ctx context.Context, cut <-chan struct{}) {
	waitCut := cut // nil once seen: closableLocked then reads cut as closed, and the select must not spin
	in.mu.Lock()
	for !in.closed && !in.closableLocked(cut) {
		quiet := make(chan struct{})
		in.quiet = quiet
		in.mu.Unlock()
		select {
		case <-quiet:
		case <-waitCut:
			waitCut = nil
		case <-ctx.Done():
			return
		}
		in.mu.Lock()
	}
	wasClosed := in.closed
	in.closed = true
	in.quiet = nil
	if in.cut != nil {
		in.cut.Stop() // a retiring instance's grace: the shutdown's own decides now
	}
	in.stopScheduleLocked()
	in.disarmIdleLocked()
	if in.state == Awake {
		in.lifeGen++ // Close may end the tenant's Life: that is no death of its own to report
	}
	in.mu.Unlock()
	if !wasClosed {
		in.teardownWithin(ctx)
	}
	// Closed, it needs its requirements no more: they close after it, in reverse order of the wake.
	in.mu.Lock()
	in.letGoLocked()
	in.mu.Unlock()
}

// teardown lets go of what the instance holds: its backend, its upstream connections and its route's
// metric series. It runs once: after the instance's last sleep, when it has retired or at shutdown, or
// when Apply gives up on a config before the instance started.
func (in *instance) teardown() { in.teardownWithin(context.WithoutCancel(in.root)) }

// teardownWithin is teardown with the backend's Close bounded by ctx as well as the route's sleep
// budget (shutdown passes what is left of the activator's shutdown grace).
func (in *instance) teardownWithin(ctx context.Context) {
	in.closeBackend(ctx)
	in.dropUpstream()
	in.series.release()
}

// forget tells the retired instance's backend, or each of its fleet's members', whose tenant the running
// config no longer has that nothing will resume what it keeps (tenant.Forgetter): a route removed by
// a reload leaves a kvm guest's snapshot, as large as the guest's memory, for good otherwise. The
// tenant is still had when the running config has an entry of the route's name with the same backing
// (for a fleet member, a fleet of that name with a member of that name): the entry's backend takes
// over what this one kept (the kvm backing resumes the snapshot, or cleans it up once the guest runs
// under the new settings). peer reads the config Apply last published; a reload that adds the route
// back after this look makes its new instance wait for this one's retired, which closes after Forget.
// Called once, by the retirement, after the backend's Close; failed: the last sleep failed, and the
// tenant may still run: nothing is forgotten then, and the log says so.
func (in *instance) forget(failed bool) {
	if in.peer == nil {
		return // an instance no Apply made: no running config to compare with
	}
	cur := in.peer(in.route.Name)
	if cur != nil && cur.route.Backing != in.route.Backing {
		cur = nil // the name's tenant is another backing's now: this one's is gone
	}
	if in.fleet == nil {
		if cur == nil || cur.route.Fleet != nil {
			in.forgetBackend(in.backend, "", failed)
		}
		return
	}
	for _, m := range in.fleet.members {
		if cur == nil || cur.route.Fleet == nil || !slices.ContainsFunc(cur.route.Fleet.Members, func(o registry.Member) bool { return o.Name == m.name }) {
			in.forgetBackend(m.backend, m.name, failed)
		}
	}
}

// forgetBackend calls b's Forget, if it has one, within the route's sleep budget (as Close), and logs
// that it did (member: the fleet member's name, "" for the route's own backend); after a failed last
// sleep it only logs why it did not.
func (in *instance) forgetBackend(b tenant.Backend, member string, failed bool) {
	f, ok := b.(tenant.Forgetter)
	if !ok {
		return
	}
	log := in.logger()
	if member != "" {
		log = log.With("member", member)
	}
	if failed {
		log.Warn("removed tenant not forgotten: its last sleep failed, so it may still run; what its backend kept stays, to be removed by hand")
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(in.root), in.route.SleepBudget)
	defer cancel()
	if err := f.Forget(ctx); err != nil {
		log.Warn("forgetting the removed tenant failed: what its backend kept stays", "err", err)
		return
	}
	log.Debug("removed tenant forgotten: its backend let go of what it kept for a next wake") // the backend logs what it removed
}

func (in *instance) closeBackend(ctx context.Context) {
	in.mu.Lock()
	owns := in.ho.ownsBackend()
	in.mu.Unlock()
	if !owns {
		return // lent to an heir, or not yet handed over to this one: the owner closes it
	}
	if c, ok := in.backend.(tenant.Closer); ok {
		ctx, cancel := context.WithTimeout(ctx, in.route.SleepBudget)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			in.logger().Warn("closing the backend failed", "err", err)
		}
	}
}

// setGrace sets how long an admin sleep waits for the requests in flight (drainInFlight).
func (in *instance) setGrace(d time.Duration) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.grace = d
}
