package activator

// Keep-warm windows and scheduled wakes: one scheduler goroutine per instance whose route has
// keep_warm or wake_at, on one timer re-armed to the route's next event.

import (
	"context"
	"errors"
	"time"

	"github.com/activator/activator/internal/registry"
)

// What a ScheduledEvent is.
const (
	eventWindowStart = "keep_warm start"
	eventWindowEnd   = "keep_warm end"
	eventWakeAt      = "wake_at"
)

// recheck bounds the scheduler's timer. A timer runs on the monotonic clock, which a wall-clock step
// (an NTP correction, a VM resumed after a pause) does not move: the scheduler looks at the wall
// clock again at least this often, so such an event is at most this late.
const recheck = time.Minute

// ScheduledEvent is a route's next keep_warm or wake_at event, as the status reports it.
type ScheduledEvent struct {
	At   time.Time `json:"at"`   // in the window's or the schedule's zone
	What string    `json:"what"` // "keep_warm start", "keep_warm end" or "wake_at"
	Text string    `json:"text"` // the window or schedule as written
}

// nextEvent returns route r's first keep_warm or wake_at event after now, and, when now is inside a
// keep_warm window, until when the route is kept warm (the latest end of the windows now is inside).
// ok is false when r has no event to come.
func nextEvent(r *registry.Route, now time.Time) (ev ScheduledEvent, warmUntil time.Time, ok bool) {
	take := func(at time.Time, what, text string) {
		// At one time, a window's start or a wake_at wins over a window's end: the next look is for
		// events after the one taken, so a window that ends as the next begins lost the next's start
		// (found with the real binary), and a wake_at at a window's end never fired. Either wake starts
		// the idle clock again, as the end would have (a wake of an awake tenant is a request's release).
		if !at.IsZero() && (!ok || at.Before(ev.At) || at.Equal(ev.At) && what != eventWindowEnd && ev.What == eventWindowEnd) {
			ev, ok = ScheduledEvent{At: at, What: what, Text: text}, true
		}
	}
	for _, w := range r.KeepWarm {
		if w.Contains(now) {
			end := windowEnd(w, now)
			take(end, eventWindowEnd, w.Text)
			if end.After(warmUntil) {
				warmUntil = end
			}
		}
		take(w.NextStart(now), eventWindowStart, w.Text)
	}
	for _, s := range r.WakeAt {
		take(s.Next(now), eventWakeAt, s.Text) // zero when the schedule never matches (30 February)
	}
	return ev, warmUntil, ok
}

// windowEnd is the end of w's occurrence that holds t, on w's wall clock. registry.Window.End adds the
// end's minutes to midnight as elapsed time, which is an hour off on the days the clocks change.
func windowEnd(w registry.Window, t time.Time) time.Time {
	t = t.In(w.Zone)
	day := t.Day()
	if w.From >= w.To && t.Hour()*60+t.Minute() >= w.From { // the evening part: it ends tomorrow
		day++
	}
	return time.Date(t.Year(), t.Month(), day, 0, w.To, 0, 0, w.Zone)
}

// keptWarm reports whether t lies inside one of the route's keep_warm windows: the idle clock then
// puts no tenant to sleep (armIdleLocked).
func (in *instance) keptWarm(t time.Time) bool {
	for _, w := range in.route.KeepWarm {
		if w.Contains(t) {
			return true
		}
	}
	return false
}

// startSchedule starts the route's scheduler when it has keep_warm windows or wake_at schedules. Apply
// calls it once the instance serves; retire and shutdown stop it (stopScheduleLocked), and the
// instance's WaitGroup joins it.
func (in *instance) startSchedule() {
	if len(in.route.KeepWarm) == 0 && len(in.route.WakeAt) == 0 {
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed || in.retiring || in.stopSched != nil {
		return
	}
	ctx, cancel := context.WithCancel(in.root)
	in.stopSched = cancel
	in.wg.Add(1)
	go in.runSchedule(ctx)
}

// stopScheduleLocked stops the scheduler, if one runs; a scheduled wake it is waiting for goes on
// without it.
func (in *instance) stopScheduleLocked() {
	if in.stopSched != nil {
		in.stopSched()
		in.stopSched = nil
	}
}

// runSchedule is the scheduler: it wakes the tenant at once when it starts inside a window, then at
// each window's start and each wake_at time, and lets the idle clock run again at each window's end.
// It ends with ctx.
func (in *instance) runSchedule(ctx context.Context) {
	defer in.wg.Done()
	if now := in.now(); in.keptWarm(now) {
		in.scheduledWake(ctx, ScheduledEvent{At: now, What: eventWindowStart, Text: "route started inside the window"})
	}
	for {
		now := in.now()
		ev, _, ok := nextEvent(in.route, now)
		wait := recheck
		if ok {
			wait = min(wait, ev.At.Sub(now))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if now = in.now(); !ok || now.Before(ev.At) {
			continue // the bound, or a clock set back: look again
		}
		switch ev.What {
		case eventWindowEnd:
			in.windowEnded()
		case eventWindowStart:
			if in.keptWarm(now) { // not when a clock step skipped the whole window
				in.scheduledWake(ctx, ev)
			}
		case eventWakeAt:
			in.scheduledWake(ctx, ev)
		}
	}
}

// scheduledWake wakes the tenant for ev the way the admin API does (wakeNow), detached from every
// request, and waits for the result. A tenant already awake has its idle clock started again, as by a
// request. A failed wake is in the wake record and backs off as usual; the scheduler does not retry
// it before its next event. An event that finds the route backing off from an earlier failure tries
// once when the backoff is over (a window's start, only if the window has not ended by then): no wake
// was tried at all, and a keep_warm window that began a minute into a long backoff stayed cold to its
// end (found with the real binary).
func (in *instance) scheduledWake(ctx context.Context, ev ScheduledEvent) {
	in.logger().Info("scheduled wake", "event", ev.What, "schedule", ev.Text)
	release, err := in.awaitWake(ctx, triggerSchedule, nil)
	var be *BackoffError
	if errors.As(err, &be) {
		in.logger().Info("scheduled wake waits for the route's backoff", "event", ev.What, "schedule", ev.Text, "retry_in", be.RetryAfter)
		t := time.NewTimer(be.RetryAfter)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if ev.What == eventWindowStart && !in.keptWarm(in.now()) {
			return
		}
		release, err = in.awaitWake(ctx, triggerSchedule, nil)
	}
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, ErrClosed) {
			in.logger().Warn("scheduled wake failed", "event", ev.What, "schedule", ev.Text, "err", err)
		}
		return
	}
	release()
}

// windowEnded lets the idle clock of an awake tenant with nothing in flight start again at a window's
// end: the idle window counts from the later of the last request's end and the window's end.
func (in *instance) windowEnded() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.state == Awake && in.inflight == 0 && in.held == 0 && !in.keptWarm(in.now()) {
		in.armIdleLocked()
	}
}

// scheduleStatus fills in s's next event and, inside a window, until when the route is kept warm.
func (in *instance) scheduleStatus(s *Status) {
	if len(in.route.KeepWarm) == 0 && len(in.route.WakeAt) == 0 {
		return
	}
	ev, until, ok := nextEvent(in.route, in.now())
	if ok {
		s.NextEvent = &ev
	}
	if !until.IsZero() {
		s.KeepWarmUntil = &until
	}
}
