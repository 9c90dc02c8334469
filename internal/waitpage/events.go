package waitpage

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"
)

// EventsPath is the path the edge reserves, on every host it serves, for a waiting page's event
// stream. It lies under "/.activator/", a dot-directory no tenant is expected to serve (as
// "/.well-known/" is for RFC 8615), so the edge can answer it before routing by path prefix without
// taking a path from any route. The page finds its stream through View.EventsURL, which the edge sets,
// typically to EventsPath + "?wake=" + the wake id.
const EventsPath = "/.activator/wake-events"

// State is where a wake stands, as the page shows it.
type State int

const (
	// Waking: the wake is in progress; Event.Phase is the phase it is in.
	Waking State = iota
	// Ready: the tenant passed its health gate; the page reloads.
	Ready
	// Failed: the wake failed; Event.Cause says why, in words fit for strangers.
	Failed
)

// String is the state's SSE event name: "phase", "ready" or "failed".
func (s State) String() string {
	switch s {
	case Ready:
		return "ready"
	case Failed:
		return "failed"
	}
	return "phase"
}

// Event is a snapshot of one wake. Phases lists every phase begun so far, oldest first, so a page that
// missed a snapshot (or connected late) still shows all of them.
type Event struct {
	State      State
	Phase      string   // the current phase ("" before the first)
	Phases     []string // every phase begun, in order; the last is Phase
	Elapsed    time.Duration
	Expected   time.Duration // 0: no estimate yet
	WakeID     string
	Cause      string        // Failed only: the short client message (the tenant's output: detailed_errors)
	RetryAfter time.Duration // Failed only: the route's failure backoff
}

// eventData is Event as the page's script reads it.
type eventData struct {
	Phase        string   `json:"phase"`
	Phases       []string `json:"phases"`
	ElapsedMS    int64    `json:"elapsed_ms"`
	ExpectedMS   int64    `json:"expected_ms"`
	WakeID       string   `json:"wake_id"`
	Cause        string   `json:"cause,omitempty"`
	RetryAfterMS int64    `json:"retry_after_ms,omitempty"`
}

// Source is a wake's progress as Events reads it. Watch returns the wake's state now and a channel
// that is closed when it next changes (a new phase, ready, failed); once the state is Ready or Failed
// it does not change again and the channel may be nil. Watch must not block. Elapsed may be computed at
// each call: Events sends a snapshot only when its state or phases changed.
type Source interface {
	Watch() (Event, <-chan struct{})
}

// Progress is a Source the edge can feed from a wake: Phase as each phase begins, then Ready or Fail
// once. It broadcasts by closing a channel, replaced on each change, so any number of streams follow
// it without a goroutine of their own. Safe for concurrent use.
type Progress struct {
	start time.Time

	mu      sync.Mutex    // guards the fields below
	ev      Event         // Elapsed is set when the state becomes final
	changed chan struct{} // closed on the next change; nil once final
}

// NewProgress starts following wake id, begun at start, expected to take expected (0: no estimate).
func NewProgress(wakeID string, start time.Time, expected time.Duration) *Progress {
	return &Progress{
		start:   start,
		ev:      Event{State: Waking, WakeID: wakeID, Expected: expected},
		changed: make(chan struct{}),
	}
}

// Phase records that the wake entered phase name. It does nothing once the wake is ready or failed,
// or when name is already the current phase.
func (p *Progress) Phase(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ev.State != Waking || name == p.ev.Phase {
		return
	}
	p.ev.Phase = name
	p.ev.Phases = append(slices.Clip(p.ev.Phases), name)
	p.notifyLocked(false)
}

// Ready records that the tenant is ready. Only the first of Ready and Fail counts.
func (p *Progress) Ready() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ev.State != Waking {
		return
	}
	p.ev.State = Ready
	p.notifyLocked(true)
}

// Fail records that the wake failed: cause is the short client message (the tenant's output only
// with the route's detailed_errors), retryAfter the route's failure backoff. Only the first of Ready and Fail counts.
func (p *Progress) Fail(cause string, retryAfter time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ev.State != Waking {
		return
	}
	p.ev.State, p.ev.Cause, p.ev.RetryAfter = Failed, cause, retryAfter
	p.notifyLocked(true)
}

// notifyLocked wakes every watcher; final freezes Elapsed and stops replacing the channel.
func (p *Progress) notifyLocked(final bool) {
	close(p.changed)
	if final {
		p.ev.Elapsed = time.Since(p.start)
		p.changed = nil
		return
	}
	p.changed = make(chan struct{})
}

// Watch implements Source.
func (p *Progress) Watch() (Event, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ev := p.ev
	ev.Phases = slices.Clone(p.ev.Phases)
	if ev.State == Waking {
		ev.Elapsed = time.Since(p.start)
	}
	return ev, p.changed
}

// Stream bounds. A stream ends after maxStream even if the wake does not (the wake has its own budget,
// and the page reloads when its stream ends); each write must finish within writeTimeout.
const (
	heartbeatEvery = 15 * time.Second
	maxStream      = 10 * time.Minute
	writeTimeout   = 10 * time.Second
)

// Events answers r with src's progress as Server-Sent Events: an "event: phase" for the state when it
// starts and for each change of phase, then one "event: ready" or "event: failed", each with the JSON
// of the snapshot ({"phase","phases","elapsed_ms","expected_ms","wake_id","cause","retry_after_ms"})
// and flushed at once. A comment line keeps the connection open every 15 s. It returns after the
// ready or failed event, when r's context ends (the client went), when a write fails or takes longer
// than 10 s, or after 10 minutes; it starts no goroutine. A ResponseWriter that cannot flush gets 500.
func Events(w http.ResponseWriter, r *http.Request, src Source) {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Accel-Buffering", "no") // a buffering proxy in front would hold every event
	if err := rc.Flush(); errors.Is(err, http.ErrNotSupported) {
		h.Del("Content-Type")
		http.Error(w, "event stream not supported", http.StatusInternalServerError)
		return
	}
	send := func(frame func(io.Writer) error) bool {
		if err := rc.SetWriteDeadline(time.Now().Add(writeTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return false
		}
		return frame(w) == nil && rc.Flush() == nil
	}
	heartbeat := time.NewTicker(heartbeatEvery)
	defer heartbeat.Stop()
	deadline := time.NewTimer(maxStream)
	defer deadline.Stop()
	sent := -1 // phases in the last event sent; -1 before the first
	for {
		ev, changed := src.Watch()
		if sent < 0 || ev.State != Waking || len(ev.Phases) != sent {
			if !send(func(w io.Writer) error { return writeEvent(w, ev) }) {
				return
			}
			sent = len(ev.Phases)
		}
		if ev.State != Waking {
			return
		}
		select {
		case <-changed:
		case <-heartbeat.C:
			if !send(func(w io.Writer) error { _, err := io.WriteString(w, ": heartbeat\n\n"); return err }) {
				return
			}
		case <-deadline.C:
			return
		case <-r.Context().Done():
			return
		}
	}
}

// writeEvent writes one SSE event: its name and one data line of JSON (json.Marshal never emits a
// newline, and escapes <, > and &).
func writeEvent(w io.Writer, ev Event) error {
	data, err := json.Marshal(toEventData(ev))
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev.State, data)
	return err
}

func toEventData(ev Event) eventData {
	phases := ev.Phases
	if phases == nil {
		phases = []string{}
	}
	return eventData{
		Phase:        ev.Phase,
		Phases:       phases,
		ElapsedMS:    ev.Elapsed.Milliseconds(),
		ExpectedMS:   ev.Expected.Milliseconds(),
		WakeID:       ev.WakeID,
		Cause:        ev.Cause,
		RetryAfterMS: ev.RetryAfter.Milliseconds(),
	}
}
