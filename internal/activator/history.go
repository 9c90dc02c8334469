package activator

// A route's history: its recent wakes and sleeps, for `activator explain` and GET /routes/{name}/wakes.

import (
	"errors"
	"slices"
	"sync"
	"time"
)

// HistorySize is how many events (wakes and sleeps) a route's history keeps: the newest, in a ring.
const HistorySize = 50

// Event kinds, as Event.Kind names them.
const (
	EventWake  = "wake"
	EventSleep = "sleep"
)

// Event is one entry of a route's history: a finished wake (Wake set) or sleep (Sleep set).
type Event struct {
	Kind  string       `json:"kind"`
	Wake  *WakeRecord  `json:"wake,omitempty"`
	Sleep *SleepRecord `json:"sleep,omitempty"`
}

// SleepRecord explains one sleep: why, how long the backing took, and how it ended. A tenant that
// stopped on its own is a sleep with reason ReasonExited, no duration, and its Life's error.
type SleepRecord struct {
	Route    string        `json:"route"`
	Backing  string        `json:"backing"`
	Reason   string        `json:"reason"` // ReasonIdle, ReasonAdmin, ReasonReload or ReasonExited
	Started  time.Time     `json:"started"`
	Duration time.Duration `json:"duration_ns"`
	Result   string        `json:"result"` // ResultOK or ResultFailed; "exited" for ReasonExited
	Error    string        `json:"error,omitempty"`
	// Notes are what the backing said of how the sleep went (tenant.NoteSleep): what it had to force,
	// such as a SIGKILL after the stop grace or a guest's power cut after it ignored the power button.
	Notes []string `json:"notes,omitempty"`
	// Forced is set when the backing had to force the sleep (tenant.NoteForcedSleep): the tenant is
	// off, so Result is ResultOK, but it was not let finish what it was doing.
	Forced bool `json:"forced,omitempty"`
	// OutputTail is the end of the tenant's output, when the error carries it (see outputTail). It is
	// for the admin API only: edge error bodies never quote it.
	OutputTail string `json:"output_tail,omitempty"`
}

// history is a route's ring of events. An instance writes to it as its wakes and sleeps end; a changed
// route's new instance shares its predecessor's (see Server.Apply), so the old instance's last sleep
// lands in the same ring and nothing is lost across a reload. The ring is made by the first event:
// most routes of a large config never wake, and it is most of an idle route's memory.
type history struct {
	mu   sync.Mutex                 // guards the fields below
	ring *[HistorySize]historyEntry // nil until the first event
	next int                        // where the next event goes
	n    int                        // events held, up to HistorySize
}

type historyEntry struct {
	ev  Event
	att *attempt // a wake's attempt, whose release figures fill in after the event was added
}

func newHistory() *history { return &history{} }

// add appends ev, dropping the oldest event once the ring is full. att, for a wake, is its attempt.
func (h *history) add(ev Event, att *attempt) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ring == nil {
		h.ring = new([HistorySize]historyEntry)
	}
	h.ring[h.next] = historyEntry{ev: ev, att: att}
	h.next = (h.next + 1) % HistorySize
	h.n = min(h.n+1, HistorySize)
}

// last returns the n events that ended last (all of them when n <= 0), in the order they began.
func (h *history) last(n int) []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	if n <= 0 || n > h.n {
		n = h.n
	}
	out := make([]Event, 0, n)
	for i := h.next - n; i < h.next; i++ {
		e := h.ring[(i+HistorySize)%HistorySize]
		if e.ev.Wake != nil && (e.att != nil || e.ev.Wake.live()) {
			w := e.ev.Wake.current() // a fleet's rows as they are now
			if e.att != nil {
				w = e.att.withRelease(w)
			}
			e.ev.Wake = &w
		}
		out = append(out, e.ev)
	}
	// In the order they began: the ring has them in the order they ended, and a long wake (or one
	// of a reload's new instance, which shares the ring) ends after a sleep that began later, which
	// `activator explain` then listed after it (found by an operator trial).
	slices.SortStableFunc(out, func(a, b Event) int { return a.started().Compare(b.started()) })
	return out
}

// started is when the event began.
func (e Event) started() time.Time {
	if e.Wake != nil {
		return e.Wake.Started
	}
	if e.Sleep != nil {
		return e.Sleep.Started
	}
	return time.Time{}
}

// recordSleep records a sleep of in's tenant for reason that began at start and ended with err, with
// the backing's notes and whether it was forced.
func (in *instance) recordSleep(reason string, start time.Time, err error, notes []string, forced bool) {
	rec := SleepRecord{Route: in.route.Name, Backing: in.route.Backing, Reason: reason, Started: start,
		Duration: in.now().Sub(start), Result: ResultOK, Notes: notes, Forced: forced}
	if err != nil {
		rec.Result, rec.Error, rec.OutputTail = ResultFailed, err.Error(), outputTail(err)
	}
	if reason == ReasonExited {
		rec.Result = ReasonExited // not a sleep that failed: the tenant ended, and err is how
	}
	in.hist.add(Event{Kind: EventSleep, Sleep: &rec}, nil)
}

// outputTail is the output tail err carries, if any: the backings' errors that quote a tenant's output
// (exec's ExitError) say so with a Tail method.
func outputTail(err error) string {
	var t interface{ Tail() string }
	if errors.As(err, &t) {
		return t.Tail()
	}
	return ""
}
