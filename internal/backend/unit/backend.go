package unit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"syscall"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"

	"github.com/activator/activator/internal/activator"
)

// Phase names this backing adds to activator.PhaseStart.
const (
	PhaseThaw     = "thaw"     // freeze mode: ThawUnit on a frozen unit
	PhaseContinue = "continue" // sigstop mode: SIGCONT to the unit's processes
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

	mu   sync.Mutex      // guards the fields below
	life *activator.Life // the current awake period; nil while asleep
	w    *watch          // life's watch on the bus
}

var (
	_ activator.Backend = (*Backend)(nil)
	_ activator.Adopter = (*Backend)(nil)
	_ activator.Closer  = (*Backend)(nil)
)

// Settings returns the route's settings.
func (b *Backend) Settings() Settings { return b.s }

// Wake brings the unit up and returns once the manager reports it active; the activator's health gate
// runs after it.
//
//   - With a Life that has not ended, Wake returns it at once without talking to systemd.
//   - An active unit is taken as it is: no second start job. In sigstop mode its processes get SIGCONT
//     (harmless when they run), in freeze mode a frozen unit is thawed.
//   - Otherwise a start job runs (mode "replace"). A job that ends in anything but "done" fails the
//     wake with a *JobError naming the job result and the unit's Result/ActiveState/SubState and main
//     process status, after the unit has been stopped again. A canceled ctx stops the unit as well: a
//     failed Wake leaves nothing running.
//
// The returned Life ends with an *ExitError when the unit stops or is restarted behind the activator's
// back, with ErrSlept when Sleep or Stop put it down.
func (b *Backend) Wake(ctx context.Context, t activator.Tracker) (*activator.Life, error) {
	if l := b.current(); l != nil {
		return l, nil
	}
	t.Phase(activator.PhaseStart)
	st, err := b.quickState(ctx)
	if err != nil {
		return nil, err
	}
	if st.LoadState != "loaded" {
		return nil, fmt.Errorf("unit %s cannot be started: LoadState=%s (is the unit file installed? daemon-reload?)", b.s.Unit, st.LoadState)
	}
	if st.Active() {
		if err := b.resume(ctx, st, t); err != nil {
			return nil, err
		}
		return b.track(ctx)
	}
	if err := b.start(ctx); err != nil {
		return nil, err
	}
	life, err := b.track(ctx)
	if err != nil {
		b.cleanup(ctx, "unit not active after its start job")
		return nil, err
	}
	return life, nil
}

// current returns the Life of the current awake period if it has not ended.
func (b *Backend) current() *activator.Life {
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

// state reads the unit's state.
func (b *Backend) state(ctx context.Context) (st UnitState, err error) {
	err = b.bus.do(ctx, func(l *link) (err error) {
		st, err = readState(ctx, l.c, b.s.Unit)
		return err
	})
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
func (b *Backend) resume(ctx context.Context, st UnitState, t activator.Tracker) error {
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

// job runs a start or stop job in mode "replace" and returns its result. If the connection drops while
// the job runs, the job is issued again on a new connection: systemd merges it with the running one,
// or finishes it at once when the unit is already where the job would take it.
func (b *Backend) job(ctx context.Context, kind string) (string, error) {
	var res string
	err := b.bus.do(ctx, func(l *link) error {
		call := l.c.StartUnitContext
		if kind == "stop" {
			call = l.c.StopUnitContext
		}
		ch := make(chan string, 1)
		if _, err := call(ctx, b.s.Unit, "replace", ch); err != nil {
			return err
		}
		select {
		case res = <-ch:
			return nil
		case <-l.ctx.Done():
			return errLinkLost
		case <-ctx.Done():
			return fmt.Errorf("waiting for the %s job: %w", kind, context.Cause(ctx))
		}
	})
	return res, err
}

// start runs a start job. Anything but "done" stops the unit again and returns a *JobError.
func (b *Backend) start(ctx context.Context) error {
	res, err := b.job(ctx, "start")
	if err != nil {
		if ctx.Err() != nil {
			// The job may have been queued before the wake gave up.
			b.cleanup(ctx, "wake canceled")
		}
		return fmt.Errorf("unit %s: start: %w", b.s.Unit, err)
	}
	if res == "done" {
		return nil
	}
	rctx, cancel := b.cleanupContext(ctx)
	st, rerr := b.state(rctx)
	cancel()
	b.cleanup(ctx, "start job "+res)
	jerr := &JobError{Unit: b.s.Unit, Job: "start", Result: res, State: st}
	if rerr != nil {
		return fmt.Errorf("%w (and reading the unit's state failed: %v)", jerr, rerr)
	}
	return jerr
}

// track starts an awake period: it registers the watch, then confirms the unit is active (so a death
// between the start job and the registration is not missed) and records its invocation.
func (b *Backend) track(ctx context.Context) (*activator.Life, error) {
	life := activator.NewLife()
	w := b.bus.watch(b.s.Unit, life)
	st, err := b.quickState(ctx)
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
	b.mu.Lock()
	b.life, b.w = life, w
	b.mu.Unlock()
	b.log.Debug("unit awake", "sub_state", st.SubState)
	return life, nil
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
// death behind the activator's back.
func (b *Backend) end() *activator.Life {
	b.mu.Lock()
	life, w := b.life, b.w
	b.life, b.w = nil, nil
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
		life.End(activator.ErrSlept)
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
		life.End(activator.ErrSlept)
	}
	return err
}

// stopUnit runs a stop job; a unit systemd does not know counts as stopped.
func (b *Backend) stopUnit(ctx context.Context) error {
	res, err := b.job(ctx, "stop")
	if err != nil {
		if dbusErrorName(err) == "org.freedesktop.systemd1.NoSuchUnit" {
			return nil
		}
		return fmt.Errorf("unit %s: stop: %w", b.s.Unit, err)
	}
	if res == "done" {
		return nil
	}
	st, _ := b.state(ctx)
	return &JobError{Unit: b.s.Unit, Job: "stop", Result: res, State: st}
}

func (b *Backend) freeze(ctx context.Context) error {
	st, err := b.state(ctx)
	if err != nil {
		return err
	}
	if !st.Active() || st.FreezerState == "frozen" {
		return nil
	}
	if err := b.bus.do(ctx, func(l *link) error { return l.c.FreezeUnit(ctx, b.s.Unit) }); err != nil {
		return unsupported(b.s.Unit, "freeze", err)
	}
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
	return b.signal(ctx, syscall.SIGSTOP)
}

// Adopt reports whether the unit is already awake and, if so, adopts it as it is (same MainPID, no
// restart) and watches it. A frozen unit (freeze mode) counts as asleep; in sigstop mode an active
// unit gets SIGCONT, since a previous activator may have left it stopped.
func (b *Backend) Adopt(ctx context.Context) (*activator.Life, bool, error) {
	st, err := b.state(ctx)
	if err != nil {
		return nil, false, err
	}
	if !st.Active() {
		return nil, false, nil
	}
	if b.s.Sleep == SleepFreeze && st.FreezerState != "running" && st.FreezerState != "" {
		return nil, false, nil
	}
	if b.s.Sleep == SleepSIGSTOP {
		if err := b.resume(ctx, st, activator.Discard); err != nil {
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

// Close stops watching the unit and leaves it as it is: units outlive the activator (the next one
// adopts them). A Life still running ends with an error saying so.
func (b *Backend) Close(context.Context) error {
	if life := b.end(); life != nil {
		life.End(errBackendClosed)
	}
	return nil
}
