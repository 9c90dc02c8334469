// Package tenant is the contract between the edge and the backings, in the spirit of
// database/sql/driver: internal/activator consumes it, each internal/backend/* package implements it,
// and neither side imports the other. It holds the Backend a route's tenant is driven through, its
// optional abilities (found by type assertion), the Life that reports a woken tenant's end, the
// Tracker a wake reports its phases to, the SleepNotes a sleep reports to, and the Opener that builds
// a route's Backend.
package tenant

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/activator/activator/internal/registry"
)

// Backend wakes and sleeps one route's tenant. The activator owns the decision of when; a Backend
// knows only how. Implementations live in internal/backend/* and never see HTTP.
//
// The activator never calls Wake and Sleep concurrently for one Backend, and never calls either after
// Close. Both must be safe to call in any state:
//   - Wake on an awake tenant returns at once with its current Life.
//   - Sleep on a tenant that is already asleep (or gone) returns nil.
type Backend interface {
	// Wake brings the tenant up and returns once the backend considers it started (process spawned,
	// guest running, node powered on); the activator's health gate runs after it. A backend may return
	// earlier, while its start is still completing (the unit backing returns once its start job is
	// queued), so that the gate overlaps the rest: then the Life must end, with the reason, if that
	// start fails, and the backend must undo it. ctx carries the route's wake budget and is detached
	// from any request; the activator cancels it once the gate has passed. Wake reports progress to t:
	// each call to t.Phase starts a named phase (see the Phase* constants for the common names); t must
	// not be used after Wake returns.
	//
	// The returned Life must be ended by the backend when the tenant stops on its own (exited,
	// crashed, powered itself off, stopped by an operator), with the reason. A failed Wake must leave
	// nothing running.
	Wake(ctx context.Context, t Tracker) (*Life, error)

	// Sleep puts the tenant to sleep in the route's configured mode (stop, freeze, pause, snapshot,
	// power off). ctx carries the route's sleep budget. After Sleep returns nil the upstream must not
	// be serving. Sleep may End the Life returned by Wake (with ErrSlept); the activator ignores Life
	// ends it caused.
	Sleep(ctx context.Context) error
}

// operatorKey marks a Wake's or Sleep's ctx (ByOperator).
type operatorKey struct{}

// ByOperator marks ctx for a Wake or Sleep that an operator asked for by the route's name (the admin
// API's wake and sleep: `activator wake`, `activator sleep`), as against one a request, a schedule, an
// idle window or a reload began. A backend may then try, once, what it holds back from the automatic
// ones: a person asked, now, and is there to read the answer (a BMC's rejected credentials, in the
// redfish backing).
func ByOperator(ctx context.Context) context.Context {
	return context.WithValue(ctx, operatorKey{}, true)
}

// IsByOperator reports whether ctx was marked by ByOperator.
func IsByOperator(ctx context.Context) bool {
	by, _ := ctx.Value(operatorKey{}).(bool)
	return by
}

// lastSleepKey marks a Sleep's ctx (LastSleep).
type lastSleepKey struct{}

// LastSleep marks ctx for a Sleep that Close follows: the route was removed or replaced by a reload.
// A backend may then skip what only a next wake would use (the exec backing's standby).
func LastSleep(ctx context.Context) context.Context {
	return context.WithValue(ctx, lastSleepKey{}, true)
}

// IsLastSleep reports whether ctx was marked by LastSleep.
func IsLastSleep(ctx context.Context) bool {
	last, _ := ctx.Value(lastSleepKey{}).(bool)
	return last
}

// sleepNotesKey carries a Sleep's notes (WithSleepNotes).
type sleepNotesKey struct{}

// SleepNotes are what a Sleep says of how it went beside its error: that it had to force what it was
// asked to do politely (a SIGKILL after the stop grace, a guest's power cut after it ignored the
// power button), or took more than one try. The activator puts them in the sleep's record, as a
// Tracker's notes go in a wake's. Safe for concurrent use.
type SleepNotes struct {
	mu     sync.Mutex
	notes  []string
	forced bool
}

// WithSleepNotes returns ctx carrying a new SleepNotes for one Sleep, and the notes.
func WithSleepNotes(ctx context.Context) (context.Context, *SleepNotes) {
	n := &SleepNotes{}
	return context.WithValue(ctx, sleepNotesKey{}, n), n
}

// NoteSleep adds a note to the SleepNotes ctx carries, if any: a backend calls it from Sleep (and
// whatever Sleep calls, with its ctx) whatever called Sleep.
func NoteSleep(ctx context.Context, note string) { noteSleep(ctx, note, false) }

// NoteForcedSleep is NoteSleep for a sleep that had to force what it asked politely: a SIGKILL
// after the stop grace, a node's ForceOff, a guest's power cut, systemd's kill after
// TimeoutStopSec=. The tenant is off, so the sleep succeeded, but whatever it had not written is lost:
// the activator marks the sleep's record forced and counts it (activator_sleeps_forced_total).
func NoteForcedSleep(ctx context.Context, note string) { noteSleep(ctx, note, true) }

func noteSleep(ctx context.Context, note string, forced bool) {
	if n, ok := ctx.Value(sleepNotesKey{}).(*SleepNotes); ok {
		n.mu.Lock()
		n.notes = append(n.notes, note)
		n.forced = n.forced || forced
		n.mu.Unlock()
	}
}

// Forced reports whether NoteForcedSleep was called.
func (n *SleepNotes) Forced() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.forced
}

// List returns the notes so far, in the order they were made.
func (n *SleepNotes) List() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.notes)
}

// Adopter is implemented by backends whose tenants can outlive the activator (systemd units, QEMU
// guests, bare-metal nodes). Adopt is called once, before the first Wake, and reports whether the
// tenant is already awake; an awake tenant is adopted as is (its idle clock starts) instead of being
// restarted. An error is logged and the tenant treated as asleep.
type Adopter interface {
	Adopt(ctx context.Context) (life *Life, awake bool, err error)
}

// Outsider is implemented by backends that can see their tenant run without the activator: a systemd
// unit started by hand while its route sleeps. RunningOutside says so in one line, or returns "" when
// the tenant does not run so or the backend cannot tell. It must not do I/O: the admin API asks it of
// every route that is not awake in a listing. The activator only shows it in the route's status;
// the next Wake takes the running tenant (and its record says so).
type Outsider interface {
	RunningOutside() string
}

// Warner is implemented by backends that can tell of a condition the operator must put right which
// the route's state does not show: a BMC that rejected the credentials, whose awake node is no longer
// watched for it. Warning says so in one line, or returns "" when there is none. Like RunningOutside
// it must not do I/O; the activator shows it in the route's status, in any state.
type Warner interface {
	Warning() string
}

// Preparer is implemented by backends that can get ready for a first Wake ahead of it, off its path
// (the exec and kvm backings' standbys). The activator calls Prepare once per backend it opens (at
// start-up, and for a route a reload adds or changes, once the route's old backend has been closed),
// in a goroutine of its own, after the Adopt (or a dependent's Wake) that began as the backend opened
// has ended; a request may wake the route before or while Prepare runs. Prepare must not wake the
// tenant, must be safe to call concurrently with Adopt, Wake, Sleep and Close (and do nothing after
// Close, or once a tenant runs), and logs its own failures: a backend that could not prepare wakes as
// it would have without. NeedsPrepare says, without I/O, whether this backend has anything to
// prepare: the activator starts nothing for one that has not (a goroutine each for 100,000 idle
// routes was 18 MiB of RSS).
type Preparer interface {
	NeedsPrepare() bool
	Prepare(ctx context.Context)
}

// Closer is implemented by backends that hold resources or own tenants that must not outlive the
// activator (exec children, QEMU processes unless configured otherwise). Close is called once, when the
// route is removed by a reload (after Sleep; then Forget, for a Forgetter) or when the activator shuts
// down (without Sleep: the backend decides what shutdown means for its tenant).
type Closer interface {
	Close(ctx context.Context) error
}

// Forgetter is implemented by backends that leave something of their tenant on the host when they
// close, for the route's next backend to resume (a kvm guest's snapshot and RAM file): Close cannot
// tell a reload that changes the route from one that removes it, nor from a shutdown. The activator
// calls Forget once, after Close, when the tenant is gone from the running config: a reload removed
// its route, gave the route's name another backing, or took the member out of its fleet. It calls it
// only once the retiring instance has put the tenant to sleep without a failure (or found it asleep)
// and closed the backend, and never for a backend a reload hands on to a new instance (same route,
// same tenant), for a route a later reload added back before the old instance retired, for an
// instance a shutdown closes before it has retired (Close may have left the tenant running), or for a
// route that was gone from the config while the activator did not run: it cannot know of that one.
// Forget removes only what the backend itself wrote for this route, and logs what it removed and what
// it kept. A route added back by a later reload waits for it: its first wake waits for the old
// instance's retirement, which ends after Forget.
type Forgetter interface {
	Forget(ctx context.Context) error
}

// Stopper is implemented by backends whose Sleep can leave the tenant parked rather than stopped
// (freeze, SIGSTOP, pause). After a wake whose tenant never turned healthy, the activator calls Stop
// instead of Sleep: a broken tenant must really stop, not be parked to be resumed broken.
type Stopper interface {
	Stop(ctx context.Context) error
}

// Opener opens the Backend for a route. Each backing implements it for its own routes, and
// internal/backend/split implements it for all of them by dispatching on Route.Backing.
type Opener interface {
	Open(r *registry.Route) (Backend, error)
}

// Checker is an optional Opener ability: a live check of a route's settings against the host (e.g.
// "this systemd cannot freeze units"), run by `activator check` and at load. It must not wake anything.
type Checker interface {
	Check(ctx context.Context, r *registry.Route) error
}

// Noter is an optional Opener ability: what `activator check` reports about a route besides its
// problems, such as the mode a setting resolves to on this host ("snapshot RAM: file"). Like Check it
// must not wake anything.
type Noter interface {
	Notes(ctx context.Context, r *registry.Route) []string
}

// SharedCloser is an optional Opener ability, for openers that hold resources their routes' Backends
// share (the unit backing's D-Bus connections). Close is called once, when the activator shuts down,
// after every route's Backend has been closed.
type SharedCloser interface {
	Close() error
}

// Tracker receives one wake's progress; the activator turns it into the wake record, logs and metrics.
// A Tracker is safe for use by one goroutine at a time.
type Tracker interface {
	// Phase marks the start of a named phase; the previous phase ends now.
	Phase(name string)
	// Note adds a line to the wake's explanation, e.g. "snapshot file corrupt, cold boot instead".
	Note(msg string)
}

// Common phase names. Backends may add their own (kvm: "qmp", "restore"; redfish: "power_on").
const (
	PhaseStart  = "start"  // the backend's first step (spawn, start job, QEMU launch, Reset)
	PhaseHealth = "health" // the activator's health gate
	PhaseStop   = "stop"   // after a failed gate: stopping the tenant that started but never turned healthy
)

// Discard is a Tracker that records nothing, for tests and adoption.
var Discard Tracker = discard{}

type discard struct{}

func (discard) Phase(string) {}
func (discard) Note(string)  {}

// ErrSlept is the Life error a backend may use when the tenant ended because Sleep stopped it.
var ErrSlept = errors.New("put to sleep")

// Life tracks one woken tenant. The backend creates it in Wake and calls End when the tenant stops;
// everyone else waits on Done and reads Err.
type Life struct {
	done chan struct{}
	once sync.Once
	err  error // written once, before done is closed
}

// NewLife returns a Life that has not ended.
func NewLife() *Life { return &Life{done: make(chan struct{})} }

// End records why the tenant stopped and closes Done. Only the first call counts; a nil err is
// recorded as "exited".
func (l *Life) End(err error) {
	l.once.Do(func() {
		if err == nil {
			err = errors.New("exited")
		}
		l.err = err
		close(l.done)
	})
}

// Done is closed when the tenant has stopped.
func (l *Life) Done() <-chan struct{} { return l.done }

// Err is why the tenant stopped, or nil while it runs.
func (l *Life) Err() error {
	select {
	case <-l.done:
		return l.err
	default:
		return nil
	}
}

// Budgeter is an optional Tracker ability: it records the budget of the phase in progress, so that
// the wake record shows each phase beside the budget that bounded it. The activator's tracker has it.
type Budgeter interface {
	PhaseBudget(d time.Duration)
}

// PhaseWithin starts phase name on t, as t.Phase does, and records that budget bounds it when t can
// (Budgeter). Backings call it for the phases their settings give a budget of their own (power_on,
// qemu_start, …).
func PhaseWithin(t Tracker, name string, budget time.Duration) {
	t.Phase(name)
	if b, ok := t.(Budgeter); ok && budget > 0 {
		b.PhaseBudget(budget)
	}
}
