package unit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"

	"github.com/activator/activator/internal/foreign"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// Phase names this backing adds to tenant.PhaseStart.
const (
	PhaseState    = "state"    // sigstop and freeze modes: reading the unit's state (is it running, frozen?)
	PhaseThaw     = "thaw"     // freeze mode: ThawUnit on a frozen unit
	PhaseContinue = "continue" // sigstop mode: SIGCONT to the unit's processes
	PhaseStopping = "stopping" // a unit still stopping (deactivating): waiting for its stop to finish
)

// errBackendClosed ends the Life of a route whose backend was closed while its unit ran.
var errBackendClosed = errors.New("unit backend closed (the unit keeps running)")

// Backend wakes and sleeps one route's unit. Wake and Sleep are not called concurrently (the
// activator's contract); the watcher ends the Life concurrently, which Life allows.
type Backend struct {
	s           Settings
	bus         *bus
	log         *slog.Logger
	sleepBudget time.Duration // bounds the cleanup stop after a failed or canceled wake
	upstream    registry.Upstream
	closeOnce   sync.Once // Close lets go of the unit's entry in the bus's seenLog once

	mu      sync.Mutex   // guards the fields below
	life    *tenant.Life // the current awake period; nil while asleep
	w       *watch       // life's watch on the bus; nil until its start job has finished
	pending *startJob    // the start job of life, until it finishes or is aborted
	lastInv []byte       // the InvocationID the unit had when this backend last read it after a start
	// stopped is true while the backend knows the unit is not still stopping: its own stop job
	// finished since the unit was last up. Otherwise (a new backend, a stop that outlasted the sleep's
	// budget, a crash or a stop behind the activator's back) the unit may be deactivating, and Wake
	// reads its state before a start job (see waitStopped).
	stopped bool
	// parked is true while the unit is frozen or SIGSTOPped by this backend's Sleep (or, in freeze mode,
	// found frozen by Adopt), until a wake or Stop: a thaw then is someone else's (outside).
	parked bool
}

var (
	_ tenant.Backend = (*Backend)(nil)
	_ tenant.Adopter = (*Backend)(nil)
	_ tenant.Closer  = (*Backend)(nil)
)

// Settings returns the route's settings.
func (b *Backend) Settings() Settings { return b.s }

// Wake brings the unit up. A Wake on a stopped unit returns as soon as the manager has queued the start
// job: the activator's health gate then runs while the job completes, so a unit's wake costs the app's
// start-up plus one D-Bus call rather than the start job, the property reads around it and the gate
// one after the other. The start job's outcome still decides: if it ends in anything but "done", or
// the unit is not active once it has, the Life ends with the reason (and the health gate with it) and
// the unit is stopped again.
//
//   - With a Life that has not ended, Wake returns it at once without talking to systemd.
//   - In stop mode the start job is queued without reading the unit first: on a unit that is already
//     active (started by someone else) systemd finishes it at once and nothing restarts.
//   - In sigstop and freeze modes the unit's state is read first: an active unit is taken as it is,
//     with SIGCONT (harmless when its processes run) or a thaw; no start job.
//   - A unit found running without the activator (started by someone else while the route slept,
//     restarted after a SIGSTOP, thawed after a freeze) is a note in the wake's record and a log
//     line, with the time it started (see outside). In stop mode that is learned from the manager's
//     signals, which precede the start job's reply: no read is added to the wake.
//   - Before a start job, a unit without a paired .socket fails the wake when something else already
//     answers at the route's upstream (see checkForeign).
//   - A start job that ends in anything but "done" ends the Life with a *JobError naming the job
//     result and the unit's Result/ActiveState/SubState and main process status (for the result
//     "assert", the Assert*= that failed). A job "done" that leaves the unit inactive ends it with an
//     *ExitError, which names the Condition*= that skipped the start. A canceled ctx before the job is
//     queued stops the unit: a failed Wake leaves nothing running.
//
// The returned Life ends with an *ExitError when the unit stops or is restarted behind the activator's
// back, with ErrSlept when Sleep or Stop put it down.
func (b *Backend) Wake(ctx context.Context, t tenant.Tracker) (*tenant.Life, error) {
	if l := b.current(); l != nil {
		return l, nil
	}
	if err := b.settle(ctx); err != nil {
		return nil, err
	}
	unread := true // whether the unit's state is still unread
	if b.s.Sleep != SleepStop {
		// Its own phase: without it, a SIGCONT wake's record read "start=0.6ms continue=…", as if a
		// start job had run.
		t.Phase(PhaseState)
		seq := b.bus.seen.mark(b.s.Unit)
		st, err := b.quickState(ctx)
		if err != nil {
			return nil, err
		}
		b.bus.seen.settle(b.s.Unit, st, seq)
		unread = false
		t.Note(fmt.Sprintf("%s found %s/%s", b.s.Unit, st.ActiveState, st.SubState)) // the last observed state, for explain
		if st.LoadState != "loaded" {
			return nil, notLoaded(b.s.Unit, st.LoadState)
		}
		if st.Active() {
			if how := b.outside(st); how != "" {
				b.noteOutside(ctx, t, st, how)
			}
			if err := b.resume(ctx, st, t); err != nil {
				return nil, err
			}
			return b.track(ctx)
		}
		if err := b.waitStopped(ctx, t, st); err != nil {
			return nil, err
		}
	} else if _, known := b.bus.seen.state(b.s.Unit); !known || !b.knownStopped() {
		// The unit may still be stopping, or nothing has been heard of it since the connection was made:
		// two property Gets, which also give the signals' log its state (seenLog.settle).
		seq := b.bus.seen.mark(b.s.Unit)
		st, err := b.stopState(ctx)
		if err != nil {
			return nil, err
		}
		b.bus.seen.settle(b.s.Unit, st, seq)
		if err := b.waitStopped(ctx, t, st); err != nil {
			return nil, err
		}
	}
	t.Phase(tenant.PhaseStart)
	if err := b.checkForeign(ctx, unread); err != nil {
		return nil, err
	}
	// What the manager says of the unit's condition check is kept until finishStart has read the
	// job's outcome: the unit may be unloaded, and the check's state lost, by then.
	b.bus.checks.expect(b.s.Unit)
	ch, l, err := b.queueJob(ctx, "start")
	if err != nil {
		b.bus.checks.drop(b.s.Unit)
		if ctx.Err() != nil {
			// The job may have been queued before the wake gave up.
			b.cleanup(ctx, "wake canceled")
		}
		switch dbusErrorName(err) {
		case "org.freedesktop.systemd1.NoSuchUnit":
			return nil, notLoaded(b.s.Unit, "not-found")
		case "org.freedesktop.systemd1.UnitMasked":
			return nil, notLoaded(b.s.Unit, "masked")
		}
		return nil, fmt.Errorf("unit %s: start: %w", b.s.Unit, err)
	}
	// The manager replied to StartUnit after sending every signal of the unit's changes before it
	// took the call (the job runs, and the unit changes, only after the reply): what they last said
	// is the unit as the job found it. A unit running or starting then was started by someone else,
	// the job merged with that start or finished at once.
	if st, ok := b.bus.seen.state(b.s.Unit); ok && st.upOrStarting() {
		b.noteOutside(ctx, t, st, "started")
	}
	life := tenant.NewLife()
	p := &startJob{life: life, done: make(chan struct{}), prevInv: b.lastInvocation()}
	// The job's remainder runs on a context detached from the wake's (which the activator cancels once
	// the gate passes) but bounded by the same deadline.
	jctx := context.WithoutCancel(ctx)
	if dl, ok := ctx.Deadline(); ok {
		jctx, p.cancel = context.WithDeadline(jctx, dl)
	} else {
		jctx, p.cancel = context.WithCancel(jctx)
	}
	b.mu.Lock()
	b.life, b.pending, b.stopped, b.parked = life, p, false, false
	b.mu.Unlock()
	go b.finishStart(jctx, p, ch, l)
	return life, nil
}

// checkForeign fails a start when something already answers at the route's upstream (foreign.Check):
// started, the unit would fail to bind while the stranger passed the health gate. A unit paired with
// a .socket is not checked (systemd's socket listens there by design). unread says the unit's state
// was not read yet (stop mode skips that read): then a held address may be the unit itself, active
// behind the backend's back, which is read only when the address is held.
//
// A holder inside the unit's own control group is the unit too, whatever its state (activating,
// say, under someone else's start job, which the wake's merges with): not a stranger.
func (b *Backend) checkForeign(ctx context.Context, unread bool) error {
	if b.s.Socket != "" || b.upstream.Address == "" {
		return nil
	}
	err := foreign.Check(ctx, b.upstream.Network, b.upstream.Address)
	if err == nil {
		return nil
	}
	if unread {
		if st, serr := b.quickState(ctx); serr == nil && st.Active() {
			return nil
		}
	}
	if he, ok := errors.AsType[*foreign.HeldError](err); ok && he.PID > 0 && b.owns(ctx, he.PID) {
		return nil
	}
	return fmt.Errorf("unit %s not started: %w", b.s.Unit, err)
}

// owns reports whether process pid runs in the unit's control group (or one below it).
func (b *Backend) owns(ctx context.Context, pid int) bool {
	var cg string
	err := b.bus.do(ctx, func(l *link) error {
		p, err := l.c.GetServicePropertyContext(ctx, b.s.Unit, "ControlGroup")
		if err == nil {
			cg, _ = p.Value.Value().(string)
		}
		return err
	})
	if err != nil || cg == "" {
		return false
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	return err == nil && inCgroup(string(data), cg)
}

// inCgroup reports whether a /proc/PID/cgroup text places the process in cgroup cg or below it, in
// any hierarchy (systemd names the unit's group by the same path in each).
func inCgroup(procCgroup, cg string) bool {
	for line := range strings.Lines(procCgroup) {
		_, path, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		if _, path, ok = strings.Cut(path, ":"); ok && (path == cg || strings.HasPrefix(path, cg+"/")) {
			return true
		}
	}
	return false
}

// knownStopped reports whether the backend knows the unit is not still stopping (see Backend.stopped).
func (b *Backend) knownStopped() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stopped
}

// stopState reads what waitStopped decides on, ActiveState and SubState, in two property Gets.
func (b *Backend) stopState(ctx context.Context) (st UnitState, err error) {
	err = b.bus.do(ctx, func(l *link) (err error) {
		st, err = readProps(ctx, l.c, b.s.Unit, "ActiveState", "SubState")
		return err
	})
	return st, err
}

// waitStopped waits, when st says the unit is still stopping (deactivating), for that stop to finish:
// a stop job of its own, which systemd merges with the one running. The stop may be a sleep's that
// outlasted sleep_budget (a tenant that drains, or ignores SIGTERM until TimeoutStopSec= kills it), or
// one behind the activator's back. A start job queued instead would wait behind the stop while the
// old processes still answered, so the health gate could pass on a tenant about to be killed (and
// without a .socket, checkForeign would call the unit's own process a stranger).
func (b *Backend) waitStopped(ctx context.Context, t tenant.Tracker, st UnitState) error {
	if st.ActiveState != "deactivating" {
		return nil
	}
	t.Phase(PhaseStopping)
	t.Note(fmt.Sprintf("unit %s was still stopping (%s/%s): the start waits for the stop to finish", b.s.Unit, st.ActiveState, st.SubState))
	res, err := b.job(ctx, "stop")
	switch {
	case err != nil && ctx.Err() != nil:
		return fmt.Errorf("unit %s was still stopping (SubState=%s) when the wake's budget ran out: %w", b.s.Unit, st.SubState, err)
	case err != nil:
		return fmt.Errorf("unit %s: waiting for its stop to finish: %w", b.s.Unit, err)
	case res != "done":
		st, _ := b.state(ctx)
		return &JobError{Unit: b.s.Unit, Job: "stop", Result: res, State: st}
	}
	return nil
}

// notLoaded is the terminal error of a unit the manager cannot load (not-found, masked, bad-setting):
// no start succeeds until an operator installs or fixes its file.
func notLoaded(unit, loadState string) error {
	return tenant.Terminal(fmt.Errorf("unit %s cannot be started: LoadState=%s (is the unit file installed? daemon-reload?)", unit, loadState))
}

// startJob is a start job Wake has queued and not yet seen finish.
type startJob struct {
	life    *tenant.Life
	cancel  context.CancelFunc // ends the wait for the job
	done    chan struct{}      // closed when finishStart has returned
	prevInv []byte             // Backend.lastInv when the job was queued
	aborted bool               // guarded by Backend.mu: Sleep, Stop or Close took over
}

// lastInvocation returns the InvocationID the unit had after the latest start this backend saw.
func (b *Backend) lastInvocation() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lastInv
}

// saw records the InvocationID of a unit read after a start.
func (b *Backend) saw(st UnitState) {
	if len(st.InvocationID) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lastInv = st.InvocationID
}

// finishStart waits for a queued start job and turns its outcome into the awake period: a watch on
// the unit when it is active, else the Life ended with why and the unit stopped again. If Sleep, Stop
// or Close abort it first, it leaves the unit and the Life to them.
func (b *Backend) finishStart(ctx context.Context, p *startJob, ch <-chan string, l *link) {
	defer close(p.done)
	defer p.cancel()
	defer b.bus.checks.drop(b.s.Unit)
	res, err := b.awaitJob(ctx, "start", ch, l)
	var w *watch
	switch {
	case err != nil:
		err = fmt.Errorf("unit %s: start: %w", b.s.Unit, err)
	case res != "done":
		rctx, cancel := b.cleanupContext(ctx)
		st, rerr := b.state(rctx)
		cancel()
		// Every start that runs anything gets a new InvocationID; a failed one that left the unit's
		// as it was, on a unit with a start limit, is one the manager refused for that limit.
		refused := res == "failed" && rerr == nil && st.StartLimitIntervalUSec != 0 && len(p.prevInv) > 0 &&
			bytes.Equal(st.InvocationID, p.prevInv)
		b.saw(st)
		err = &JobError{Unit: b.s.Unit, Job: "start", Result: res, State: st, Refused: refused}
		if rerr != nil {
			err = fmt.Errorf("%w (and reading the unit's state failed: %v)", err, rerr)
		}
	default:
		w, err = b.watchLife(ctx, p.life)
	}
	b.mu.Lock()
	if p.aborted {
		b.mu.Unlock()
		b.bus.unwatch(w)
		return
	}
	if err == nil {
		b.w = w
		b.mu.Unlock()
		return
	}
	if b.life == p.life {
		b.life = nil
	}
	b.mu.Unlock()
	p.life.End(err)
	b.cleanup(ctx, "start job did not leave the unit active")
}

// settle waits for a start job that ended badly to finish stopping the unit again.
func (b *Backend) settle(ctx context.Context) error {
	b.mu.Lock()
	p := b.pending
	b.mu.Unlock()
	if p == nil {
		return nil
	}
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("unit %s: waiting for the previous start to be undone: %w", b.s.Unit, context.Cause(ctx))
	}
}

// current returns the Life of the current awake period if it has not ended.
func (b *Backend) current() *tenant.Life {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.life != nil && b.life.Err() == nil {
		return b.life
	}
	return nil
}

// quickState reads the few properties the wake path decides on (see readQuick).
func (b *Backend) quickState(ctx context.Context) (st UnitState, err error) {
	err = b.bus.do(ctx, func(l *link) (err error) {
		st, err = readQuick(ctx, l.c, b.s.Unit, b.s.Sleep == SleepFreeze)
		return err
	})
	return st, err
}

// liveState reads whether the unit is active and its invocation (see readLive).
func (b *Backend) liveState(ctx context.Context) (st UnitState, err error) {
	err = b.bus.do(ctx, func(l *link) (err error) {
		st, err = readLive(ctx, l.c, b.s.Unit)
		return err
	})
	return st, err
}

// state reads the unit's state. While a start job of this backend's is out, the outcome of the unit's
// condition check comes from the manager's signals when the unit was reloaded since (checkLog.fill):
// the read's reply follows every signal the manager sent before it.
func (b *Backend) state(ctx context.Context) (st UnitState, err error) {
	err = b.bus.do(ctx, func(l *link) (err error) {
		st, err = readState(ctx, l.c, b.s.Unit)
		return err
	})
	if err == nil {
		st = b.bus.checks.fill(b.s.Unit, st)
	}
	return st, err
}

// signal sends sig to every process of the unit.
func (b *Backend) signal(ctx context.Context, sig syscall.Signal) error {
	err := b.bus.do(ctx, func(l *link) error {
		return l.c.KillUnitWithTarget(ctx, b.s.Unit, sddbus.All, int32(sig))
	})
	if err != nil {
		return fmt.Errorf("unit %s: %v: %w", b.s.Unit, sig, err)
	}
	return nil
}

// resume makes an active unit serve again: SIGCONT (sigstop mode), thaw (freeze mode), nothing (stop
// mode: an active unit we hold no Life for was started by someone else, or adopted).
func (b *Backend) resume(ctx context.Context, st UnitState, t tenant.Tracker) error {
	switch b.s.Sleep {
	case SleepSIGSTOP:
		t.Phase(PhaseContinue)
		return b.signal(ctx, syscall.SIGCONT)
	case SleepFreeze:
		if st.FreezerState == "running" || st.FreezerState == "" {
			t.Note("unit already active and not frozen: no start job")
			return nil
		}
		t.Phase(PhaseThaw)
		if err := b.bus.do(ctx, func(l *link) error { return l.c.ThawUnit(ctx, b.s.Unit) }); err != nil {
			return unsupported(b.s.Unit, "thaw", err)
		}
	default:
		t.Note("unit already active: taken as it is, no start job")
	}
	return nil
}

// job runs a start or stop job in mode "replace" and returns its result.
func (b *Backend) job(ctx context.Context, kind string) (string, error) {
	ch, l, err := b.queueJob(ctx, kind)
	if err != nil {
		return "", err
	}
	return b.awaitJob(ctx, kind, ch, l)
}

// queueJob issues a start or stop job in mode "replace" and returns the channel its result arrives on
// and the connection it was issued on.
func (b *Backend) queueJob(ctx context.Context, kind string) (<-chan string, *link, error) {
	ch := make(chan string, 1)
	var on *link
	err := b.bus.do(ctx, func(l *link) error {
		call := l.c.StartUnitContext
		if kind == "stop" {
			call = l.c.StopUnitContext
		}
		if _, err := call(ctx, b.s.Unit, "replace", ch); err != nil {
			return err
		}
		on = l
		return nil
	})
	return ch, on, err
}

// awaitJob waits for the result of a job queued on l. If the connection drops meanwhile, the job is
// issued again (once) on a new connection: systemd merges it with the running one, or finishes it at
// once when the unit is already where the job would take it.
func (b *Backend) awaitJob(ctx context.Context, kind string, ch <-chan string, l *link) (string, error) {
	for reissued := false; ; reissued = true {
		select {
		case res := <-ch:
			return res, nil
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for the %s job: %w", kind, context.Cause(ctx))
		case <-l.ctx.Done():
			if reissued {
				return "", errLinkLost
			}
			b.log.Info("connection to systemd dropped while a job ran; issuing it again", "job", kind)
			var err error
			if ch, l, err = b.queueJob(ctx, kind); err != nil {
				return "", err
			}
		}
	}
}

// track starts an awake period for a unit that is already active (resumed or adopted).
func (b *Backend) track(ctx context.Context) (*tenant.Life, error) {
	life := tenant.NewLife()
	w, err := b.watchLife(ctx, life)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.life, b.w, b.stopped, b.parked = life, w, false, false
	b.mu.Unlock()
	return life, nil
}

// watchLife registers a watch that ends life when the unit stops, then confirms the unit is active
// (so a death between the start and the registration is not missed) and records its invocation.
func (b *Backend) watchLife(ctx context.Context, life *tenant.Life) (*watch, error) {
	w := b.bus.watch(b.s.Unit, life)
	st, err := b.liveState(ctx)
	if err == nil {
		b.saw(st)
	}
	if err == nil && !st.Active() {
		full, ferr := b.state(ctx) // explain with Result and ExecMainStatus
		if ferr == nil {
			st = full
		}
		err = &ExitError{Unit: b.s.Unit, State: st}
	}
	if err != nil {
		b.bus.unwatch(w)
		return nil, err
	}
	w.setInvocation(st.InvocationID)
	b.log.Debug("unit awake", "active_state", st.ActiveState)
	return w, nil
}

// cleanupContext is a context for undoing a failed wake: detached from the wake's (possibly
// canceled) context, bounded by the route's sleep budget.
func (b *Backend) cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	budget := b.sleepBudget
	if budget <= 0 {
		budget = 30 * time.Second
	}
	return context.WithTimeout(context.WithoutCancel(ctx), budget)
}

// cleanup stops the unit after a failed or canceled wake.
func (b *Backend) cleanup(ctx context.Context, why string) {
	cctx, cancel := b.cleanupContext(ctx)
	defer cancel()
	if err := b.stopUnit(cctx); err != nil {
		b.log.Warn("could not stop the unit after a failed wake", "why", why, "err", err)
	}
}

// end closes the current awake period: the watch goes first, so stopping the unit does not read as a
// death behind the activator's back. A start job still pending is aborted first.
func (b *Backend) end() *tenant.Life {
	b.mu.Lock()
	p := b.pending
	if p != nil {
		p.aborted = true
		b.pending = nil
	}
	b.mu.Unlock()
	if p != nil {
		// A start job still running is abandoned here (the caller's stop job replaces it); wait for
		// finishStart so it cannot publish a watch after us.
		p.cancel()
		<-p.done
	}
	b.mu.Lock()
	life, w := b.life, b.w
	b.life, b.w, b.parked = nil, nil, false
	b.mu.Unlock()
	b.bus.unwatch(w)
	return life
}

// Sleep puts the unit to sleep in the route's mode and ends the Life with ErrSlept:
//
//   - stop: a stop job (a unit that is already inactive, failed or unknown counts as asleep);
//   - freeze: FreezeUnit on an active unit; an error wrapping ErrUnsupported where the host cannot
//     freeze (the unit keeps running then; the mode is never downgraded);
//   - sigstop: SIGSTOP to every process of an active unit.
//
// After a failed health gate the activator calls Sleep; in freeze and sigstop modes that parks a
// broken tenant rather than stopping it. Callers that know the wake failed should call Stop instead.
func (b *Backend) Sleep(ctx context.Context) error {
	life := b.end()
	var err error
	switch b.s.Sleep {
	case SleepFreeze:
		err = b.freeze(ctx)
	case SleepSIGSTOP:
		err = b.sigstop(ctx)
	default:
		err = b.stopUnit(ctx)
	}
	if life != nil {
		life.End(tenant.ErrSlept)
	}
	return err
}

// Stop stops the unit whatever the sleep mode (thawing a frozen unit first; the stop job's SIGTERM
// comes with SIGCONT, so SIGSTOPped processes terminate too) and ends the Life with ErrSlept. It is
// for a wake whose health gate failed: the next Wake starts the unit afresh.
func (b *Backend) Stop(ctx context.Context) error {
	life := b.end()
	if b.s.Sleep == SleepFreeze {
		// Best effort: an unfrozen or inactive unit refuses, which is fine.
		_ = b.bus.do(ctx, func(l *link) error { return l.c.ThawUnit(ctx, b.s.Unit) })
	}
	err := b.stopUnit(ctx)
	if life != nil {
		life.End(tenant.ErrSlept)
	}
	return err
}

// stopUnit runs a stop job; a unit systemd does not know counts as stopped. A stop that systemd had
// to finish with SIGKILL (the unit outlived TimeoutStopSec=) is done too, with the unit's Result
// "timeout": that is noted for the sleep's record as forced (tenant.NoteForcedSleep), as the exec
// backing notes its own SIGKILL after stop_grace. It costs a sleep one property Get (readResult).
func (b *Backend) stopUnit(ctx context.Context) error {
	res, err := b.job(ctx, "stop")
	if err != nil {
		if dbusErrorName(err) == "org.freedesktop.systemd1.NoSuchUnit" {
			b.setStopped()
			return nil
		}
		if ctx.Err() != nil {
			// The job goes on in systemd: the unit is still stopping, which the next Wake waits for.
			return fmt.Errorf("unit %s: still stopping when the budget ran out (systemd carries on with the stop; is its TimeoutStopSec= longer than sleep_budget?): %w", b.s.Unit, err)
		}
		return fmt.Errorf("unit %s: stop: %w", b.s.Unit, err)
	}
	if res == "done" {
		b.setStopped()
		var result string
		err := b.bus.do(ctx, func(l *link) (err error) {
			result, err = readResult(ctx, l.c, b.s.Unit)
			return err
		})
		if err == nil && result == "timeout" {
			tenant.NoteForcedSleep(ctx, fmt.Sprintf("unit %s outlived its TimeoutStopSec: systemd killed it (Result=timeout)", b.s.Unit))
		}
		return nil
	}
	st, _ := b.state(ctx)
	return &JobError{Unit: b.s.Unit, Job: "stop", Result: res, State: st}
}

// setStopped records that the unit's stop finished (see Backend.stopped).
func (b *Backend) setStopped() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopped = true
}

func (b *Backend) freeze(ctx context.Context) error {
	st, err := b.state(ctx)
	if err != nil {
		return err
	}
	if !st.Active() {
		return nil
	}
	if st.FreezerState != "frozen" {
		if err := b.bus.do(ctx, func(l *link) error { return l.c.FreezeUnit(ctx, b.s.Unit) }); err != nil {
			return unsupported(b.s.Unit, "freeze", err)
		}
	}
	b.setParked()
	return nil
}

func (b *Backend) sigstop(ctx context.Context) error {
	st, err := b.state(ctx)
	if err != nil {
		return err
	}
	if !st.Active() {
		return nil
	}
	if err := b.signal(ctx, syscall.SIGSTOP); err != nil {
		return err
	}
	b.setParked()
	return nil
}

// setParked records that Sleep froze or SIGSTOPped the unit (see Backend.parked).
func (b *Backend) setParked() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.parked = true
}

// Adopt reports whether the unit is already awake and, if so, adopts it as it is (same MainPID, no
// restart) and watches it. A reload that changes the route's sleep mode while the unit is parked
// adopts what the old mode left, so whatever the mode a park is undone first (see adoptPlan): a frozen
// unit is thawed (it counts as asleep in freeze mode, where Wake thaws it), and an active unit's
// processes get SIGCONT, since SIGSTOP leaves no trace in the unit's state.
func (b *Backend) Adopt(ctx context.Context) (*tenant.Life, bool, error) {
	seq := b.bus.seen.mark(b.s.Unit)
	st, err := b.state(ctx)
	if err != nil {
		return nil, false, err
	}
	b.bus.seen.settle(b.s.Unit, st, seq)
	awake, thaw, cont := adoptPlan(b.s.Sleep, st)
	if !awake {
		if st.Active() && st.Frozen() {
			// Parked in this route's mode by an activator before this one: asleep, and its own.
			b.saw(st)
			b.setParked()
		}
		return nil, false, nil
	}
	if thaw {
		if err := b.bus.do(ctx, func(l *link) error { return l.c.ThawUnit(ctx, b.s.Unit) }); err != nil {
			return nil, false, unsupported(b.s.Unit, "thaw before adopting", err)
		}
		b.log.Info("thawed a frozen unit before adopting it", "sleep", b.s.Sleep)
	}
	if cont {
		if err := b.signal(ctx, syscall.SIGCONT); err != nil {
			return nil, false, err
		}
	}
	life, err := b.track(ctx)
	if err != nil {
		return nil, false, err
	}
	b.log.Info("adopted an active unit", "main_pid", st.MainPID)
	return life, true, nil
}

// adoptPlan decides what Adopt does with a unit in state st when the route's mode is mode: whether it
// is awake, and whether a park must be undone first, by thawing it or by SIGCONT to its processes.
// An activator in another mode (before a reload, or before a restart) may have parked it either way.
// SIGCONT goes to every active unit: a SIGSTOPped process shows nowhere in the unit's state, and to a
// process that runs SIGCONT does nothing.
func adoptPlan(mode SleepMode, st UnitState) (awake, thaw, cont bool) {
	frozen := st.FreezerState != "running" && st.FreezerState != "" // frozen, freezing or thawing
	switch {
	case !st.Active():
		return false, false, false
	case frozen && mode == SleepFreeze:
		return false, false, false // parked in this route's own mode: Wake thaws it
	case frozen:
		return true, true, true
	}
	return true, false, true
}

// Close stops watching the unit and leaves it as it is: units outlive the activator (the next one
// adopts them). A Life still running ends with an error saying so.
func (b *Backend) Close(context.Context) error {
	if life := b.end(); life != nil {
		life.End(errBackendClosed)
	}
	b.closeOnce.Do(func() { b.bus.seen.drop(b.s.Unit) })
	return nil
}
