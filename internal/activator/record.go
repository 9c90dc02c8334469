package activator

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/activator/activator/internal/fleet"
	"github.com/activator/activator/internal/health"
	"github.com/activator/activator/internal/tenant"

	"github.com/activator/activator/internal/waitpage"
)

// WakeRecord explains one wake: what triggered it, each phase and how long it took, the decisions the
// backend noted, and how it ended. It is what `activator status`, GET /routes and the wake log line show.
type WakeRecord struct {
	// ID names this wake attempt (newWakeID): the error body a held request gets quotes it, so an
	// operator can find the cause in the logs and the admin API.
	ID          string        `json:"wake_id"`
	Route       string        `json:"route"`
	Backing     string        `json:"backing"`
	Trigger     string        `json:"trigger"` // a trigger: "request", "admin", "adopt", "sleep_failed"
	Started     time.Time     `json:"started"`
	Duration    time.Duration `json:"duration_ns"`
	Budget      time.Duration `json:"wake_budget_ns,omitempty"` // the route's wake_budget, which bounds the whole wake
	Phases      []PhaseRecord `json:"phases"`
	Notes       []string      `json:"notes,omitempty"`
	Result      string        `json:"result"` // a Result constant
	Error       string        `json:"error,omitempty"`
	FailedPhase string        `json:"failed_phase,omitempty"`
	Joined      int           `json:"joined_requests"` // requests that joined this wake after it began
	// Released counts the held requests let go when the wake ended (the first and the joined ones);
	// ReleaseSpread is the time from the wake's end (its health gate passing) until the last of them
	// had left the hold. Both fill in as the requests go, after Result is final.
	Released      int           `json:"released_requests,omitempty"`
	ReleaseSpread time.Duration `json:"release_spread_ns,omitempty"`
	// OutputTail is the end of the tenant's output when the wake's error carries it (outputTail). It is
	// for the admin API only: edge error bodies never quote it (docs/security.md).
	OutputTail string `json:"output_tail,omitempty"`

	// Outcome is the wake's one outcome: OutcomeSucceeded, OutcomeFailed or OutcomeCancelled; "" while
	// it runs. Result says more (ok, adopted, …) for the succeeded ones.
	Outcome string `json:"outcome,omitempty"`
	// Class is a failed wake's fault class (tenant.Class): retryable, throttle or terminal.
	Class string `json:"fault_class,omitempty"`
	// Culprit is what a failed wake failed on: this tenant, a requirement, or a fleet member, with its
	// phase and class. It is set only when the failure was found there; a cancelled wake has none.
	Culprit *Culprit `json:"culprit,omitempty"`
	// CancelledBy says what cancelled a cancelled wake: CancelShutdown, the only cause there is (a
	// reload lets a wake in progress finish; a fleet member cancelled by a fast-fail says so in its
	// MemberRecord, and the fleet's own record is the failure).
	CancelledBy string `json:"cancelled_by,omitempty"`
	// Requires is what this wake's requirements (requires:) did for it, in the order written: each one's
	// own wake record when this wake started or joined one, or only its state when it was already awake.
	// A nested record is as it was when the requirement let this wake go on, but for a fleet's member
	// rows, which read as in the fleet's own record (see Members).
	Requires []RequiredWake `json:"requires,omitempty"`
	// Members is a fleet's rollup, in member order (fleet.go). The rows say what the members are now:
	// a member still waking when the quorum was up reads "waking" until it settles, and one that came
	// up reads "exited" or "stopped" once it has left the fleet it joined (the outcome never changes).
	Members []MemberRecord `json:"members,omitempty"`
	// rollup, in a fleet's record, gives Members as they are now. Every copy of the record (the
	// route's last wake, its history, the copies nested in its dependents' records) shares it, and
	// current reads it.
	rollup memberRows
}

// memberRows gives a fleet wake's member rows as they are now (fleet.go's fleetWake).
type memberRows interface{ rows() []MemberRecord }

// current is r with the member rows of every fleet wake in it, its own and its requirements', as
// they are now. What is shared with r is not changed.
func (r WakeRecord) current() WakeRecord {
	if r.rollup != nil {
		r.Members = r.rollup.rows()
	}
	cloned := false
	for i, q := range r.Requires {
		if q.Wake == nil || !q.Wake.live() {
			continue
		}
		if !cloned {
			r.Requires, cloned = slices.Clone(r.Requires), true
		}
		w := q.Wake.current()
		r.Requires[i].Wake = &w
	}
	return r
}

// live reports whether r, or a record nested in it, is a fleet's, whose rows current reads.
func (r *WakeRecord) live() bool {
	if r.rollup != nil {
		return true
	}
	for _, q := range r.Requires {
		if q.Wake != nil && q.Wake.live() {
			return true
		}
	}
	return false
}

// Outcomes: every finished wake record has exactly one.
const (
	OutcomeSucceeded = "succeeded"
	OutcomeFailed    = "failed"
	OutcomeCancelled = "cancelled"
)

// What cancels a wake (WakeRecord.CancelledBy, MemberRecord.CancelledBy for a fast-fail names the
// culprit member instead).
const (
	CancelShutdown = "shutdown"
)

// Culprit names where a failed wake failed: the instance (this route, or the requirement that
// failed), the fleet member if there was one, the phase and the fault's class.
type Culprit struct {
	Instance string `json:"instance"`
	Member   string `json:"member,omitempty"`
	Phase    string `json:"phase,omitempty"`
	Class    string `json:"fault_class"`
}

func (c *Culprit) String() string {
	s := c.Instance
	if c.Member != "" {
		s += " member " + c.Member
	}
	if c.Phase != "" {
		s += " in phase " + c.Phase
	}
	return s + " (" + c.Class + ")"
}

// RequiredWake is one requirement's part in a wake: Wake is its record when the requirement was
// woken for it (or the wake in progress joined), nil with State "awake" when it was awake already.
type RequiredWake struct {
	Instance string      `json:"instance"`
	State    string      `json:"state"` // "awake" (nothing to do), "woken" (Wake is its record) or "failed"
	Wake     *WakeRecord `json:"wake,omitempty"`
}

// MemberRecord is one fleet member's part in a wake.
type MemberRecord struct {
	Name     string `json:"name"`
	Upstream string `json:"upstream"`
	// Status is a fleet.Status (up, timeout, error, cancelled, waking) or, for a member that came up,
	// what became of it after: memberExited, memberStopped (fleet.go).
	Status string `json:"status"`
	Class  string `json:"fault_class,omitempty"`
	Phase  string `json:"phase,omitempty"` // the phase it failed in, or had reached when cancelled
	Error  string `json:"error,omitempty"`
	// CancelledBy names the culprit member of the fast-fail that cancelled this one.
	CancelledBy string        `json:"cancelled_by,omitempty"`
	Phases      []PhaseRecord `json:"phases,omitempty"`
	Notes       []string      `json:"notes,omitempty"`
}

// PhaseRecord is one phase of a wake: when it began (from the wake's start), how long it took, and the
// budget of its own that bounded it, if any (health.budget for the health phase; 0 when only the
// wake's budget applied).
type PhaseRecord struct {
	Name     string        `json:"name"`
	Start    time.Duration `json:"start_ns"`
	Duration time.Duration `json:"duration_ns"`
	Budget   time.Duration `json:"budget_ns,omitempty"`
}

// Result values.
const (
	ResultOK          = "ok"
	ResultFailed      = "failed"
	ResultAdopted     = "adopted"      // an adopt found the tenant running and took it as awake
	ResultAdoptAsleep = "adopt_asleep" // an adopt found no tenant running (or could not tell)
	ResultRunning     = "in_progress"
)

// trigger is what started a wake, as WakeRecord.Trigger names it.
type trigger string

const (
	triggerRequest trigger = "request" // a request found the route asleep
	triggerAdmin   trigger = "admin"   // the admin API
	triggerAdopt   trigger = "adopt"   // a new instance asks the backend for a tenant already running
	// triggerSleepFailed: a sleep failed and the tenant may still run; the route takes it back.
	triggerSleepFailed trigger = "sleep_failed"
	triggerSchedule    trigger = "schedule" // a keep_warm window's start or a wake_at time (schedule.go)
	// triggerReload: a reload changed only keys of the edge, and the route's new instance takes over
	// the tenant its predecessor kept running (inherit).
	triggerReload trigger = "reload"
)

// tracker is the Tracker the activator hands to a backend: it builds a WakeRecord. The admin API reads
// a snapshot while the wake runs, so it is guarded.
type tracker struct {
	now func() time.Time
	// deadline, set before the wake starts, is when a fleet member's wake budget ends (zero: not a
	// member's tracker): a phase budget past it is shown as what was left (PhaseBudget).
	deadline time.Time

	mu         sync.Mutex // guards the fields below
	rec        WakeRecord
	phaseStart time.Time
	// provisional: the last phase is the activator's generic "start", which the backend's first named
	// phase replaces (keeping its start time), so records read "spawn=…", not "start=0s spawn=…".
	provisional bool
	// progress is the waiting pages' view of this wake (waiting.go), fed with each named phase; set
	// before the wake starts. nil: none.
	progress *waitpage.Progress
}

// current is the phase the wake failed in once failed has named it, else the name of the phase in
// progress (or the last one), "" before the first.
func (t *tracker) current() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rec.FailedPhase != "" {
		return t.rec.FailedPhase
	}
	if n := len(t.rec.Phases); n > 0 {
		return t.rec.Phases[n-1].Name
	}
	return ""
}

// setRollup makes the record a fleet's, whose member rows rows gives as they are now.
func (t *tracker) setRollup(rows memberRows) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rec.rollup = rows
}

func newTracker(route, backing string, trig trigger, now func() time.Time) *tracker {
	t := &tracker{now: now}
	t.rec = WakeRecord{ID: newWakeID(), Route: route, Backing: backing, Trigger: string(trig), Started: now(), Result: ResultRunning}
	return t
}

// newWakeID returns a wake's id: 12 random hex digits, unique enough to grep the logs for, and
// telling a stranger nothing (no count of wakes, no time).
func newWakeID() string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it crashes the program instead)
	return hex.EncodeToString(b[:])
}

// Phase implements Tracker.
func (t *tracker) Phase(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.provisional {
		t.provisional = false
		t.rec.Phases[len(t.rec.Phases)-1].Name = name
		t.showLocked(name)
		return
	}
	t.nextLocked(name)
	t.showLocked(name)
}

// begin starts the activator's generic phase, which the backend's first Phase call renames.
func (t *tracker) begin(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.nextLocked(name)
	t.provisional = true
}

// then ends the phase in progress and starts name. Unlike Phase it never renames begin's phase, which
// keeps its name when the backend named none of its own: the activator calls it once the backend is done.
func (t *tracker) then(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n := len(t.rec.Phases); t.provisional && n > 0 {
		t.showLocked(t.rec.Phases[n-1].Name) // begin's phase, which the backend did not rename
	}
	t.provisional = false
	t.nextLocked(name)
	t.showLocked(name)
}

// showLocked tells the waiting pages that phase name began. begin's provisional phase is shown once
// it is known to keep its name, so a page does not list "start" before the backend's own first phase.
func (t *tracker) showLocked(name string) {
	if t.progress != nil {
		t.progress.Phase(name)
	}
}

func (t *tracker) nextLocked(name string) {
	t.closePhaseLocked()
	t.phaseStart = t.now()
	t.rec.Phases = append(t.rec.Phases, PhaseRecord{Name: name, Start: t.phaseStart.Sub(t.rec.Started)})
}

// budgets records the wake's budget and, when phase > 0, the budget of the phase in progress.
func (t *tracker) budgets(wake, phase time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rec.Budget = wake
	if n := len(t.rec.Phases); n > 0 && phase > 0 {
		t.rec.Phases[n-1].Budget = phase
	}
}

// PhaseBudget implements tenant.Budgeter: the phase in progress is bounded by d, or by what is left
// of the wake budget when that is less (a member's tracker), to the second (to the millisecond below
// one): a power_on_budget that defaults to the wake_budget reads as it, not as the wake budget less
// the milliseconds since the wake began. A fleet's later members, serial: true, showed power_on's
// 30 s when 12 s were left (found by an operator trial).
func (t *tracker) PhaseBudget(d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.deadline.IsZero() {
		left := t.deadline.Sub(t.now())
		if left >= time.Second {
			left = left.Round(time.Second)
		} else {
			left = max(left.Round(time.Millisecond), time.Millisecond) // 0 would read as no budget of its own
		}
		d = min(d, left)
	}
	if n := len(t.rec.Phases); n > 0 {
		t.rec.Phases[n-1].Budget = d
	}
}

// Note implements Tracker.
func (t *tracker) Note(msg string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rec.Notes = append(t.rec.Notes, msg)
}

// end ends the phase in progress without starting another (the next Phase, begin or then starts one).
func (t *tracker) end() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closePhaseLocked()
}

func (t *tracker) closePhaseLocked() {
	if n := len(t.rec.Phases); n > 0 && t.rec.Phases[n-1].Duration == 0 {
		d := t.now().Sub(t.phaseStart)
		if d <= 0 {
			d = 1 // a phase that happened took some time; 0 means "still running"
		}
		t.rec.Phases[n-1].Duration = d
	}
}

func (t *tracker) joined() {
	t.mu.Lock()
	t.rec.Joined++
	t.mu.Unlock()
}

// failed names the phase in progress as the one the wake failed in, before a cleanup phase follows it.
func (t *tracker) failed() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n := len(t.rec.Phases); n > 0 {
		t.rec.FailedPhase = t.rec.Phases[n-1].Name
	}
}

// finish closes the last phase and sets the result. A failed wake's FailedPhase is the one named by
// failed, else the last phase.
func (t *tracker) finish(result string, err error) WakeRecord {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil && t.rec.FailedPhase == "" && len(t.rec.Phases) > 0 {
		t.rec.FailedPhase = t.rec.Phases[len(t.rec.Phases)-1].Name
	}
	t.provisional = false
	t.closePhaseLocked()
	t.rec.Duration = t.now().Sub(t.rec.Started)
	t.rec.Result = result
	if err != nil {
		t.rec.Error = err.Error()
		t.rec.OutputTail = outputTail(err)
	}
	return t.snapshotLocked()
}

// amend applies fn to the record and returns a snapshot of the result.
func (t *tracker) amend(fn func(*WakeRecord)) WakeRecord {
	t.mu.Lock()
	defer t.mu.Unlock()
	fn(&t.rec)
	return t.snapshotLocked()
}

func (t *tracker) snapshot() WakeRecord {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.snapshotLocked()
}

func (t *tracker) snapshotLocked() WakeRecord {
	r := t.rec
	r.Phases = append([]PhaseRecord(nil), r.Phases...)
	r.Notes = append([]string(nil), r.Notes...)
	if r.Result == ResultRunning {
		r.Duration = t.now().Sub(r.Started)
	}
	return r.current()
}

// setRequires records what the wake's requirements did for it.
func (t *tracker) setRequires(parts []RequiredWake) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rec.Requires = parts
}

// settleRecord gives a finished record its one outcome. A wake that failed while the activator shut
// down was cancelled by the shutdown, whatever the backing made of the cancellation, and names no
// culprit. A failed one names where it failed: the requirement's own culprit, the fleet member the
// lost quorum is put on (fleet.QuorumError), or else this tenant in the phase it failed in.
func (in *instance) settleRecord(rec *WakeRecord, err error) {
	switch {
	case err == nil:
		rec.Outcome = OutcomeSucceeded
		return
	case in.root.Err() != nil:
		rec.Outcome, rec.CancelledBy = OutcomeCancelled, CancelShutdown
		return
	}
	rec.Outcome = OutcomeFailed
	rec.Class = string(classOf(err))
	var (
		re *RequirementError
		qe *fleet.QuorumError
	)
	switch {
	case errors.As(err, &re):
		rec.Culprit = re.culprit()
	case errors.As(err, &qe):
		rec.Culprit = &Culprit{Instance: in.route.Name, Member: qe.Culprit.Name, Phase: qe.Culprit.Phase, Class: string(qe.Culprit.Class)}
	default:
		rec.Culprit = &Culprit{Instance: in.route.Name, Phase: rec.FailedPhase, Class: rec.Class}
	}
}

// classOf is err's fault class (tenant.ClassOf), knowing the health gate's terminal fault: a health
// path that keeps answering the same client error can never pass.
func classOf(err error) tenant.Class {
	if errors.Is(err, health.ErrWrongPath) {
		return tenant.ClassTerminal
	}
	return tenant.ClassOf(err)
}
