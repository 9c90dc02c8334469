package activator

// What the admin API reports of an instance.

import (
	"time"

	"github.com/activator/activator/internal/tenant"
)

// Status is a route's state as the admin API reports it.
type Status struct {
	Route string `json:"route"`
	// Kind is "route", or "instance" for an entry of instances: (no hosts; woken as a requirement).
	Kind        string      `json:"kind"`
	Backing     string      `json:"backing"`
	Hosts       []string    `json:"hosts"`
	PathPrefix  string      `json:"path_prefix,omitempty"`
	Upstream    string      `json:"upstream,omitempty"` // none for a fleet: Members has each member's
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
	// CheckError is what the route's host check found at start-up (Server.SetCheckError).
	CheckError string `json:"check_error,omitempty"`
	// RunningOutside is the backing's word, while the route is asleep or failed, that its tenant runs
	// all the same, started without the activator (tenant.Outsider): a unit an operator started by hand.
	RunningOutside string `json:"running_outside,omitempty"`
	// Warning is the backing's word of a condition to put right that the state does not show
	// (tenant.Warner): a BMC that rejected the credentials, so that the awake node is not watched.
	Warning string `json:"warning,omitempty"`
	// Filtered counts the requests the route's ignore: matched since it started (filter.go); none
	// without ignore:. InFlight includes the ignored requests being served.
	Filtered *FilterCounts `json:"filtered,omitempty"`
	// NextEvent is the route's next keep_warm or wake_at event; KeepWarmUntil, inside a keep_warm
	// window, is when the route stops being kept warm (schedule.go).
	NextEvent     *ScheduledEvent `json:"next_event,omitempty"`
	KeepWarmUntil *time.Time      `json:"keep_warm_until,omitempty"`
	// Requires are the instances this one requires (requires:); RequiredBy the awake dependents that
	// hold it awake now.
	Requires   []string `json:"requires,omitempty"`
	RequiredBy []string `json:"required_by,omitempty"`
	// Members are a fleet's members, each ready or not; MinReady is its quorum.
	Members  []MemberStatus `json:"members,omitempty"`
	MinReady int            `json:"min_ready,omitempty"`
}

func (in *instance) status() Status {
	in.mu.Lock()
	defer in.mu.Unlock()
	s := Status{
		Route: in.route.Name, Backing: in.route.Backing, Hosts: in.route.Hosts, PathPrefix: in.route.PathPrefix,
		Upstream: in.route.Upstream.String(), State: in.state.String(), Since: in.since,
		InFlight: in.inflight + in.unseen, Held: in.held, Idle: in.route.Idle.String(), LastSleep: in.lastSlp,
	}
	if in.lastRec != nil {
		last := in.lastAtt.withRelease(in.lastRec.current()) // a fleet's rows as they are now
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
	if in.checkErr != nil {
		s.CheckError = in.checkErr.Error()
	}
	if in.state == Failed {
		u := in.until
		s.RetryAt = &u
	}
	if o, ok := in.backend.(tenant.Outsider); ok && (in.state == Asleep || in.state == Failed) {
		s.RunningOutside = o.RunningOutside()
	}
	if w, ok := in.backend.(tenant.Warner); ok {
		s.Warning = w.Warning()
	}
	in.scheduleStatus(&s)
	s.Filtered = in.filter.snapshot()
	s.Kind = "route"
	if in.route.Instance {
		s.Kind = "instance"
	}
	s.Requires, s.RequiredBy = in.route.Requires, in.requiredByLocked()
	if in.fleet != nil {
		s.Upstream = "" // a fleet has none of its own (the registry's Route.Upstream is its first member's)
		s.Members, s.MinReady = in.fleet.status(), in.fleet.minReady()
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
