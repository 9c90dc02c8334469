package activator

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"

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
)

// tracker is the Tracker the activator hands to a backend: it builds a WakeRecord. The admin API reads
// a snapshot while the wake runs, so it is guarded.
type tracker struct {
	now func() time.Time

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

// Note implements Tracker.
func (t *tracker) Note(msg string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rec.Notes = append(t.rec.Notes, msg)
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
	return r
}
