// Package redfish is the bare-metal backing: it wakes a route's node by powering it on through its
// BMC's Redfish service (ComputerSystem.Reset) and puts it to sleep by shutting it down, using gofish.
//
// A wake reads PowerState and, unless the node is already On, issues the first Reset type of
// reset_order that the system allows, then polls PowerState until On within power_on_budget. The
// activator's health gate on the node's own service is the next phase. A sleep issues
// GracefulShutdown, awaits Off within shutdown_grace and, when force_off is set, falls back to ForceOff
// and awaits Off within power_off_budget.
//
// BMC faults are classified (ErrCredentials, ErrConfig, ErrThrottled, ErrAmbiguous, ErrRejected, ErrTLS)
// and the class decides whether a call is retried. A Reset whose outcome is ambiguous is re-issued only
// after re-reading PowerState shows it did not land, so a retry never double-toggles a power button.
// Every error Wake, Sleep, Adopt and Check return has a tenant.Class (tenant.ClassOf): terminal for
// credentials, configuration, a refused request and TLS; throttle for a BMC asking to slow down;
// retryable for an ambiguous failure and a power state not reached in time.
//
// A BMC that answers 429 (or 503) holds back every call to it, from all the routes a Provider opened on
// the same endpoint, until its Retry-After (poll_interval without one) has passed: the routes of one
// BMC back off together.
//
// While a node is awake, a background poll of PowerState (every watch_interval) ends its Life when it
// powers off on its own. The poll belongs to the Backend and stops on Sleep and Close.
//
// A failed wake is undone: once it has issued a power-on Reset (or found the node powering on), a
// background undo powers the node off as Sleep would, at once if it is on its way up, or when it turns
// on within the route's sleep_budget after the failure (a BMC that carried the Reset out late). The
// undo belongs to the Backend; the next Wake, Sleep or Close stops and joins it first.
//
// Credentials are read from a file or the environment at each login, and again after the BMC rejects
// a reused client; they never appear in logs, errors or metrics. Credentials the BMC rejected are
// remembered by fingerprint, for all the routes a Provider opened on that BMC: no login with them goes
// to the BMC again, from a wake, a sleep, a check or a background loop (the watch, the undo), until they
// change, a call with them succeeds, or the timed retry, one login per BMC an hour; a wake or sleep
// held back fails at once with ErrCredentials, saying so. Failed logins, which a BMC counts towards the
// account's lockout, so stay a few an hour whatever the request rate.
package redfish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// Phase names reported to the activator's Tracker and named by PhaseError.
const (
	PhaseReset    = "reset"    // read PowerState and issue the power-on Reset
	PhasePowerOn  = "power_on" // await PowerState On
	PhaseShutdown = "shutdown" // GracefulShutdown and await Off within shutdown_grace
	PhasePowerOff = "power_off"
)

// Redfish PowerState values the backend acts on.
const (
	stateOn          = "On"
	stateOff         = "Off"
	statePoweringOn  = "PoweringOn"
	statePoweringOff = "PoweringOff"
	stateUnknown     = "Unknown"
)

// Options configures a Provider.
type Options struct {
	// Logger receives the backing's logs, scoped per route (default: discarded).
	Logger *slog.Logger
	// OneShot is for a process that checks routes and exits (`activator check`): errors about
	// credentials held back give no advice that only a running server can follow (its wake and
	// sleep commands, the timed retry an hour later).
	OneShot bool
}

// The contract this backing keeps, checked by the compiler: were a method's signature to drift, the
// activator would silently stop finding the ability.
var (
	_ tenant.Opener  = (*Provider)(nil)
	_ tenant.Checker = (*Provider)(nil)
	_ tenant.Backend = (*Backend)(nil)
	_ tenant.Adopter = (*Backend)(nil)
	_ tenant.Closer  = (*Backend)(nil)
	_ tenant.Warner  = (*Backend)(nil)
)

// Warning says, while the BMC holds the route's credentials rejected, so that its wakes and sleeps
// fail without logging in and its background loop (the watch of the awake node, the undo of a failed
// wake) sends nothing, what ends that; "" otherwise. It does no I/O (see bmc.warning).
func (b *Backend) Warning() string {
	loop := ""
	if l := b.held.Load(); l != nil {
		loop = *l
	}
	return b.bmc.warning(loop)
}

// Provider opens redfish backends. The backends it opens on one BMC endpoint share that BMC's throttle
// gate (see throttleGate) and the credentials it rejected (see rejections); nothing else.
type Provider struct {
	log       *slog.Logger
	endpoints endpoints
}

// NewProvider returns a Provider.
func NewProvider(o Options) *Provider {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Provider{log: log.With("backing", "redfish"), endpoints: endpoints{oneShot: o.OneShot}}
}

// Open returns the Backend of a route whose Settings is a *Settings (from Decode). It does not contact
// the BMC: that happens on the first Adopt, Wake, Sleep or Check. Its errors are terminal.
func (p *Provider) Open(r *registry.Route) (tenant.Backend, error) {
	s, ok := r.Settings.(*Settings)
	if !ok || s == nil {
		return nil, tenant.Terminal(fmt.Errorf("route %q: redfish settings missing (got %T)", r.Name, r.Settings))
	}
	ep, release := p.endpoints.acquire(s.Endpoint)
	b, err := newBackend(s, p.log.With("route", r.Name), r.Name, ep)
	if err != nil {
		release()
		return nil, err
	}
	b.release = sync.OnceFunc(release)
	return b, nil
}

// Check logs in, finds the route's system, reads its PowerState and checks that the BMC allows one of
// reset_order (and GracefulShutdown or ForceOff when sleep is graceful). It never changes power.
func (p *Provider) Check(ctx context.Context, r *registry.Route) error {
	be, err := p.Open(r)
	if err != nil {
		return err
	}
	b := be.(*Backend)
	defer func() { _ = b.Close(ctx) }()
	st, err := b.bmc.read(ctx)
	if err != nil {
		return err
	}
	if _, err := b.pickReset(st); err != nil {
		return err
	}
	if b.s.Sleep == SleepGraceful && !b.allows(st, "GracefulShutdown") && !(b.s.ForceOff && b.allows(st, "ForceOff")) {
		return &BMCError{Op: "check", Class: ErrConfig, Detail: "the system allows neither GracefulShutdown nor (with force_off) ForceOff"}
	}
	return nil
}

// Backend powers one node on and off. See the package documentation.
type Backend struct {
	s       *Settings
	log     *slog.Logger
	bmc     *bmc
	release func() // gives the BMC endpoint's state back to the Provider, at Close
	// pause waits d or until ctx is done between the rounds of the background loops (the watch, the
	// undo): the package's pause; tests hold it on events, to count rounds without the clock.
	pause func(ctx context.Context, d time.Duration) error
	// held is the name of the background loop held back by rejected credentials (roundRead), for the
	// route's status (Warning); nil while none is.
	held atomic.Pointer[string]

	mu    sync.Mutex   // guards the fields below
	life  *tenant.Life // the current Life while awake, nil while asleep
	watch *watcher     // the background poll of the current Life
	undo  *watcher     // the background undo of the last failed wake (see startUndo)
}

var (
	_ tenant.Backend = (*Backend)(nil)
	_ tenant.Adopter = (*Backend)(nil)
	_ tenant.Closer  = (*Backend)(nil)
)

// newBackend returns a Backend for settings s; name is how messages call the node until its system Id
// is known. It does not contact the BMC. ep is the state of its BMC endpoint (throttle gate, rejected
// credentials), shared by every route of one Provider on that BMC. Its errors are terminal.
func newBackend(s *Settings, log *slog.Logger, name string, ep *endpointState) (*Backend, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	node := s.System
	if node == "" {
		node = name
	}
	m, err := newBMC(s, log, name, node, ep)
	if err != nil {
		return nil, err
	}
	return &Backend{s: s, log: log, bmc: m, release: func() {}, pause: pause}, nil
}

// Adopt reads PowerState: a node already On is adopted as awake, with a Life watched like a woken one.
func (b *Backend) Adopt(ctx context.Context) (*tenant.Life, bool, error) {
	st, err := b.bmc.read(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("redfish adopt: %w", err)
	}
	if st.PowerState != stateOn {
		return nil, false, nil
	}
	b.log.Info("node already On: adopted as awake", "system", st.ID)
	return b.awake(), true, nil
}

// Wake powers the node on, unless it is already On, and returns once PowerState is On. On an awake
// node it returns the current Life at once. Phases: "reset", then "power_on". It first stops (and
// joins) the undo of a previous failed wake. When it fails after issuing the Reset (or finding the
// node powering on), it starts an undo (see startUndo) unless sleep is none, and notes so on t.
func (b *Backend) Wake(ctx context.Context, t tenant.Tracker) (*tenant.Life, error) {
	if t == nil {
		t = tenant.Discard
	}
	b.mu.Lock()
	if b.life != nil && b.life.Err() == nil {
		l := b.life
		b.mu.Unlock()
		return l, nil
	}
	b.mu.Unlock()
	b.stopWatch()
	b.stopUndo()

	life, started, err := b.wake(ctx, t)
	if err != nil && started && b.s.Sleep != SleepNone {
		t.Note(fmt.Sprintf("wake failed: %s will be powered off should it come on within %v", b.bmc.nodeName(), b.s.undoWindow))
		b.startUndo()
	}
	return life, err
}

// wake is Wake's work; started reports whether it issued a power-on Reset (or found one under way),
// so that a failure has something to undo.
func (b *Backend) wake(ctx context.Context, t tenant.Tracker) (life *tenant.Life, started bool, err error) {
	op := &operation{name: "wake", began: time.Now()}
	t.Phase(PhaseReset)
	st, err := b.bmc.read(ctx)
	if err != nil {
		return nil, false, b.wakeErr(PhaseReset, err)
	}
	op.last = st.PowerState
	if st.PowerState == statePoweringOff {
		// Let the shutdown finish: a Reset now might be refused or be taken as a second button press.
		t.Note(fmt.Sprintf("%s is powering off: waiting for Off before the Reset", b.bmc.nodeName()))
		if err := b.await(ctx, op, stateOff, "power_on_budget", b.s.PowerOnBudget.D()); err != nil {
			return nil, false, b.wakeErr(PhaseReset, err)
		}
		if st, err = b.bmc.read(ctx); err != nil {
			return nil, false, b.wakeErr(PhaseReset, err)
		}
		op.last = st.PowerState
	}
	switch st.PowerState {
	case stateOn:
		t.Note(fmt.Sprintf("%s is already On: no Reset", b.bmc.nodeName()))
		return b.awake(), false, nil
	case statePoweringOn:
		t.Note(fmt.Sprintf("%s is already powering on: no Reset", b.bmc.nodeName()))
	default:
		if _, err := b.pickReset(st); err != nil {
			return nil, false, b.wakeErr(PhaseReset, err)
		}
		// From here on the Reset may land, even when its answer says otherwise or comes too late.
		if err := b.powerOn(ctx, t, st); err != nil {
			return nil, true, b.wakeErr(PhaseReset, err)
		}
	}

	tenant.PhaseWithin(t, PhasePowerOn, b.s.PowerOnBudget.D())
	if err := b.await(ctx, op, stateOn, "power_on_budget", b.s.PowerOnBudget.D()); err != nil {
		return nil, true, b.wakeErr(PhasePowerOn, err)
	}
	return b.awake(), true, nil
}

// operation is one wake or sleep, for the messages of its waits: its name, when it began, and the last
// PowerState read.
type operation struct {
	name  string
	began time.Time
	last  string
}

// powerOn issues the first allowed Reset of reset_order. When the answer is ambiguous (or throttled),
// it re-reads PowerState and re-issues the Reset only if the node is still neither On nor powering on.
func (b *Backend) powerOn(ctx context.Context, t tenant.Tracker, st *systemState) error {
	rt, err := b.pickReset(st)
	if err != nil {
		return err
	}
	t.Note(fmt.Sprintf("%s is %s: Reset %s", b.bmc.nodeName(), orUnknown(st.PowerState), rt))
	b.log.Info("powering node on", "system", st.ID, "power_state", st.PowerState, "reset_type", rt)
	return b.action(ctx, st, rt, func(ps string) bool { return ps == stateOn || ps == statePoweringOn })
}

// action POSTs Reset rt and, after an ambiguous or throttled failure, re-reads PowerState: when landed
// reports the Reset took effect, it is not re-issued. Attempts are bounded like reads; when they run
// out on an ambiguous answer, the outcome is settled by one more read (see settle).
func (b *Backend) action(ctx context.Context, st *systemState, rt string, landed func(string) bool) error {
	first := true
	err := b.bmc.retry(ctx, func() error {
		if !first {
			cur, err := b.bmc.read(ctx)
			if err != nil {
				return err
			}
			if landed(cur.PowerState) {
				b.log.Info("Reset landed although its answer was lost; not re-issuing", "reset_type", rt, "power_state", cur.PowerState)
				return nil
			}
			st = cur
		}
		first = false
		err := b.bmc.reset(ctx, st, rt)
		if errors.Is(err, ErrRejected) {
			// Some BMCs refuse a Reset that has become moot (409 for On while already powering on).
			if cur, rerr := b.bmc.read(ctx); rerr == nil && landed(cur.PowerState) {
				b.log.Info("BMC refused the Reset, but the node is already where it should go", "reset_type", rt, "power_state", cur.PowerState)
				return nil
			}
		}
		return err
	})
	if !errors.Is(err, ErrAmbiguous) {
		return err
	}
	return b.settle(ctx, rt, landed, err)
}

// settle reads PowerState once more after the attempts at Reset rt ran out on an ambiguous failure
// (err): a Reset that landed after all is a success, and one that did not is err, retryable now that
// it is settled. When PowerState cannot be read (or ctx is done), err says that the outcome is unknown;
// it is still retryable, as the next wake reads PowerState before any Reset, and the undo of a failed
// wake watches for a late landing meanwhile.
func (b *Backend) settle(ctx context.Context, rt string, landed func(string) bool, err error) error {
	var cur *systemState
	rerr := context.Cause(ctx)
	if rerr == nil {
		cur, rerr = b.bmc.readOnce(ctx)
	}
	switch {
	case rerr != nil:
		b.log.Warn("cannot tell whether the Reset landed", "reset_type", rt, "err", rerr)
		return fmt.Errorf("%w; whether Reset %s landed is unknown: PowerState could not be read again", err, rt)
	case landed(cur.PowerState):
		b.log.Info("Reset landed although its answer was lost", "reset_type", rt, "power_state", cur.PowerState)
		return nil
	}
	return tenant.Retryable(fmt.Errorf("%w; PowerState read again: %s, so Reset %s did not land", err, orUnknown(cur.PowerState), rt))
}

// pickReset returns the first Reset type of reset_order that the system allows.
func (b *Backend) pickReset(st *systemState) (string, error) {
	for _, rt := range b.s.ResetOrder {
		if b.allows(st, rt) {
			return rt, nil
		}
	}
	return "", &BMCError{Op: "choose Reset type", Class: ErrConfig,
		Detail: fmt.Sprintf("the system allows %v, none of reset_order %v", st.Resets, b.s.ResetOrder)}
}

// allows reports whether the system allows Reset type rt; a BMC that lists nothing allows everything.
func (b *Backend) allows(st *systemState, rt string) bool {
	return len(st.Resets) == 0 || slices.Contains(st.Resets, rt)
}

// await polls PowerState until it equals want, within budget (the setting key) and ctx. A read error
// ends the wait at once (reads retry ambiguous failures themselves); running out of time reports the
// budget, the last state seen (op.last, updated by every read) and, when the BMC had stopped answering
// for at least a poll interval, since when. The loop is bounded by budget in time and by its poll count.
func (b *Backend) await(ctx context.Context, op *operation, want, key string, budget time.Duration) error {
	if want == "" || want == stateUnknown {
		return tenant.Terminal(fmt.Errorf("cannot wait for power state %q", want))
	}
	start := time.Now()
	pctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	timedOut := func(cause error) error {
		e := &StateError{Node: b.bmc.nodeName(), Want: want, Last: op.last, After: time.Since(start), Cause: cause,
			Key: key, Budget: budget, op: op.name, cut: ctx.Err() != nil}
		if since, last, ok := b.bmc.live.silence(b.s.PollInterval.D()); ok {
			e.BMC, e.Silent = b.s.Endpoint, since
			e.LastAnswer = -1
			if !last.Before(op.began) {
				e.LastAnswer = last.Sub(op.began)
			}
		}
		return e
	}
	polls := int(budget/max(b.s.PollInterval.D(), time.Millisecond)) + 2
	for range polls {
		st, err := b.bmc.read(pctx)
		if err == nil {
			op.last = st.PowerState
			if op.last == want {
				return nil
			}
		}
		if pctx.Err() != nil {
			return timedOut(context.Cause(pctx))
		}
		if err != nil {
			return err
		}
		if err := pause(pctx, b.s.PollInterval.D()); err != nil {
			return timedOut(err)
		}
	}
	return timedOut(context.DeadlineExceeded)
}

func (b *Backend) wakeErr(phase string, err error) error {
	b.log.Warn("wake failed", "phase", phase, "err", err)
	return fmt.Errorf("redfish wake of %s: %w", b.bmc.nodeName(), &PhaseError{Phase: phase, Err: err})
}

func (b *Backend) sleepErr(phase string, err error) error {
	b.log.Warn("sleep failed", "phase", phase, "err", err)
	return fmt.Errorf("redfish sleep of %s: %w", b.bmc.nodeName(), &PhaseError{Phase: phase, Err: err})
}

// Sleep powers the node off as configured: with sleep: graceful, GracefulShutdown and a wait for Off
// within shutdown_grace ("shutdown"), then, if the node is still on and force_off is set, ForceOff and
// a wait for Off within power_off_budget ("power_off"). With sleep: none it leaves the node on. A node
// already Off is left alone and Sleep returns nil. Sleep ends the current Life with ErrSlept once the
// node is off; when Sleep fails, the Life goes on and stays watched.
func (b *Backend) Sleep(ctx context.Context) error {
	b.stopWatch()
	b.stopUndo()
	b.mu.Lock()
	life := b.life
	b.mu.Unlock()
	if b.s.Sleep == SleepNone {
		b.log.Info("sleep: none: leaving the node powered on")
		b.endLife(life)
		return nil
	}
	err := b.powerOff(ctx, "sleep")
	if err != nil {
		if life != nil && life.Err() == nil {
			b.startWatch(life)
		}
		return err
	}
	b.endLife(life)
	return nil
}

// powerOff shuts the node down for Sleep (name "sleep") or the undo of a failed wake ("undo"):
// GracefulShutdown awaited within shutdown_grace, then, with force_off, ForceOff awaited within
// power_off_budget, when the node ignored the GracefulShutdown or the BMC refused it.
func (b *Backend) powerOff(ctx context.Context, name string) error {
	op := &operation{name: name, began: time.Now()}
	st, err := b.bmc.read(ctx)
	if err != nil {
		return b.sleepErr(PhaseShutdown, err)
	}
	op.last = st.PowerState
	if st.PowerState == stateOff {
		return nil
	}
	offLanded := func(ps string) bool { return ps == stateOff || ps == statePoweringOff }
	canForce := b.s.ForceOff && b.allows(st, "ForceOff")
	if b.allows(st, "GracefulShutdown") {
		b.log.Info("shutting node down", "system", st.ID, "power_state", st.PowerState, "reset_type", "GracefulShutdown")
		err := error(nil)
		if st.PowerState != statePoweringOff {
			err = b.action(ctx, st, "GracefulShutdown", offLanded)
		}
		switch {
		case err == nil:
			err = b.await(ctx, op, stateOff, "shutdown_grace", b.s.ShutdownGrace.D())
			if err == nil {
				return nil
			}
			if !errors.Is(err, ErrNotReached) || !canForce || ctx.Err() != nil {
				return b.sleepErr(PhaseShutdown, err)
			}
			b.log.Warn("node ignored GracefulShutdown within shutdown_grace: ForceOff", "shutdown_grace", b.s.ShutdownGrace.D(), "err", err)
			tenant.NoteForcedSleep(ctx, fmt.Sprintf("%s still on %s (shutdown_grace) after GracefulShutdown: ForceOff", st.ID, b.s.ShutdownGrace.D()))
		case errors.Is(err, ErrRejected) && canForce && ctx.Err() == nil:
			b.log.Warn("BMC refused GracefulShutdown: ForceOff", "err", err)
			tenant.NoteForcedSleep(ctx, fmt.Sprintf("the BMC refused GracefulShutdown for %s: ForceOff", st.ID))
		default:
			return b.sleepErr(PhaseShutdown, err)
		}
	} else if !canForce {
		return b.sleepErr(PhaseShutdown, &BMCError{Op: "choose Reset type", Class: ErrConfig,
			Detail: fmt.Sprintf("the system allows %v: neither GracefulShutdown nor (with force_off) ForceOff", st.Resets)})
	}
	st, err = b.bmc.read(ctx)
	if err != nil {
		return b.sleepErr(PhasePowerOff, err)
	}
	if st.PowerState != stateOff {
		if err := b.action(ctx, st, "ForceOff", func(ps string) bool { return ps == stateOff }); err != nil {
			return b.sleepErr(PhasePowerOff, err)
		}
	}
	if err := b.await(ctx, op, stateOff, "power_off_budget", b.s.PowerOffBudget.D()); err != nil {
		return b.sleepErr(PhasePowerOff, err)
	}
	return nil
}

// Close stops the background poll and the undo of a failed wake, logs out of the BMC and gives the
// BMC endpoint's state (throttle gate, rejected credentials) back to the Provider. It leaves the node's power as it is: a node left On is
// adopted by the next activator.
func (b *Backend) Close(ctx context.Context) error {
	b.stopWatch()
	b.stopUndo()
	b.bmc.logout(ctx)
	b.release()
	return nil
}

// awake records a new Life for a node that is On and starts watching it.
func (b *Backend) awake() *tenant.Life {
	life := tenant.NewLife()
	b.mu.Lock()
	b.life = life
	b.mu.Unlock()
	b.startWatch(life)
	return life
}

func (b *Backend) endLife(life *tenant.Life) {
	if life != nil {
		life.End(tenant.ErrSlept)
	}
	b.mu.Lock()
	if b.life == life {
		b.life = nil
	}
	b.mu.Unlock()
}

func orUnknown(s string) string {
	if s == "" {
		return stateUnknown
	}
	return s
}
