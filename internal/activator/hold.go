package activator

// The hold: how a request waits for its tenant (acquire), for an upstream slot (admit), and gives
// both back.

import (
	"context"
	"fmt"
	"time"
)

// acquire returns once the instance is awake and counts the caller as in flight; release must be
// called when the response is complete. It starts a wake when the instance is asleep, joins the wake in
// progress, waits out a stop in progress, and gives up with the caller's ctx, the hold limit, the hold
// timeout or the activator's shutdown (ErrClosed: see Server.Drain and Server.Shutdown). It is
// acquireFor without the process-wide caps (admin wakes).
func (in *instance) acquire(ctx context.Context, trig trigger) (release func(), err error) {
	return in.acquireFor(ctx, trig, nil)
}

// acquireFor is acquire for a request that counts against the process-wide caps: when the instance
// is not awake, the request is charged to c's account before it is held, or refused with ErrEdgeFull
// without starting or joining anything; it stays charged after the hold until admit gives it an
// upstream slot (or the request fails), and c.heldFor tells admit how long it was held. An awake
// instance returns at once without touching c: the warm path costs no atomic beyond the instance's
// lock. c nil counts nothing.
func (in *instance) acquireFor(ctx context.Context, trig trigger, c *holdCharge) (release func(), err error) {
	var (
		limit     context.Context // ends at the hold limit or the server's end (holdLimitLocked); nil until first held
		heldSince time.Time
	)
	// One function-level defer (open-coded, nothing on the heap), not two defers inside the loop, which
	// the compiler must allocate: a held request's own cost counts 100,000 times in a herd.
	defer func() {
		if limit != nil {
			d := in.now().Sub(heldSince)
			in.series.holdEnd(d)
			if c != nil {
				c.heldFor = d // the charge stays until the request has an upstream slot (admit)
			}
		}
	}()
	for {
		in.mu.Lock()
		if limit != nil {
			in.held-- // counted as held by the previous turn
		}
		if in.state == Awake && !in.closed {
			in.inflight++
			in.disarmIdleLocked()
			in.mu.Unlock()
			return in.releaseFn, nil
		}
		if c != nil && limit == nil {
			if err := c.take(); err != nil {
				in.mu.Unlock()
				return nil, err
			}
		}
		wait, att, err := in.holdLocked(trig, limit == nil)
		first := err == nil && limit == nil
		if first {
			limit = in.holdLimitLocked()
		}
		in.mu.Unlock()
		if err != nil {
			c.give()
			return nil, err
		}
		c.noteWake(att) // for its Server-Timing (servertiming.go)
		if first {
			heldSince = in.now()
			in.series.holdBegin()
		}
		if release, again, err := in.awaitHeld(ctx, wait, att, limit); !again {
			if err == nil && c != nil {
				c.handedBy = att
			}
			return release, err
		}
	}
}

// awaitHeld waits out one turn of a held request: for the wake it joined (att) or the stop in
// progress (att nil, wait is the stop's channel). It reports again when the request must take
// another turn (the stop ended, or the wake ended without handing the request over). limit ends at
// the request's hold limit, or when Server.Shutdown ends the root context: then every request still
// held is answered.
func (in *instance) awaitHeld(ctx context.Context, wait <-chan struct{}, att *attempt, limit context.Context) (release func(), again bool, err error) {
	// Once the activator drains, a request held behind a stop is answered at once (no wake follows
	// that stop).
	var drain <-chan struct{}
	if att == nil {
		drain = in.drain
	}
	select {
	case <-wait:
	case <-ctx.Done():
		in.leave(att)
		return nil, false, ctx.Err()
	case <-limit.Done():
		in.leave(att)
		if in.root.Err() != nil {
			return nil, false, ErrClosed
		}
		he := &HoldTimeoutError{Route: in.route.Name, MaxTime: in.route.Hold.MaxTime}
		if att != nil {
			he.WakeID = att.rec.rec.ID // written once, by newTracker
		}
		return nil, false, he
	case <-drain:
		in.leave(nil)
		return nil, false, ErrClosed
	}
	if att != nil {
		att.noteRelease(in.now())
		if att.err != nil {
			in.leave(att)
			return nil, false, att.err
		}
		if att.handedOver { // written before done was closed
			att.depart()
			return in.releaseFn, false, nil
		}
	}
	return nil, true, nil
}

// holdSlots is how many hold limits a route's hold.max_time is cut into: see holdLimitLocked.
const holdSlots = 64

// holdLimitLocked returns what a request held from now on waits on for its hold limit: a context that
// ends once it has been held for hold.max_time, or with the server's root context. Requests first held
// within one slot of time (hold.max_time ÷ holdSlots) share one, which ends a slot after the first of
// them reaches max_time, so a held request costs neither a timer of its own nor a fourth channel to
// wait on, and is held for max_time and at most a 64th more. A slot's context is never canceled
// early: it ends by itself, and only the route's held requests wait on it.
func (in *instance) holdLimitLocked() context.Context {
	now := time.Now() // the runtime's clock, which the context's timer runs on (in.now may be a test's)
	if s := in.holdSlot; s != nil && now.Before(s.end) {
		return s.ctx
	}
	width := in.route.Hold.MaxTime / holdSlots
	ctx, cancel := context.WithTimeout(in.root, in.route.Hold.MaxTime+width)
	in.holdSlot = &holdSlot{ctx: ctx, cancel: cancel, end: now.Add(width)}
	return ctx
}

// holdSlot is the hold limit shared by the requests first held before end (holdLimitLocked).
type holdSlot struct {
	ctx    context.Context
	cancel context.CancelFunc // kept to satisfy the context's contract; the deadline cancels it
	end    time.Time
}

// holdLocked counts a request that found the instance not awake as held, and returns what it waits on:
// the wake it starts (asleep, or failed with the backoff over) or joins (waking; first is the request's
// first turn, which counts as joining the wake), or the stop in progress (att nil). It returns an error
// instead when the instance is closed or draining (no wake starts once the activator shuts down),
// retiring (errRetired), backing off, or holding its maximum.
func (in *instance) holdLocked(trig trigger, first bool) (wait <-chan struct{}, att *attempt, err error) {
	if err := in.refuseLocked(); err != nil {
		return nil, nil, err
	}
	if in.state == Stopping {
		// A request's first turn counts against hold.max_requests behind a stop too (it did not, so
		// a herd arriving during a stop was held past the cap); a later turn was counted already.
		if first && in.held >= in.route.Hold.MaxRequests {
			return nil, nil, ErrHoldFull
		}
		in.held++
		return in.stopDone, nil, nil
	}
	if in.held >= in.route.Hold.MaxRequests {
		return nil, nil, ErrHoldFull
	}
	if in.state == Waking {
		att = in.wake
		if first {
			att.rec.joined()
			in.series.joinedWake()
		}
	} else {
		att = in.beginWakeLocked(trig)
	}
	att.waiters++
	in.held++
	return att.done, att, nil
}

// refuseLocked says why a caller that found the instance not awake can neither start nor join a wake
// here (nil when it can): the instance is closed or draining (no wake starts once the activator shuts
// down), retiring (errRetired), or backing off after a failed wake.
func (in *instance) refuseLocked() error {
	if in.draining() || (in.closed && !in.retiring) {
		in.noteQuietLocked() // a request held before (behind a stop) leaves: shutdown may wait for that
		return ErrClosed
	}
	if in.retiring && in.state != Waking {
		// Replaced or removed by a reload: no new wake here, and no wait behind this instance's stop
		// (it ends in its retirement). The request goes to the route's current instance, whose first
		// wake waits for this one to retire. A wake already running is joined: it was started for
		// requests held before the reload, and the tenant it wakes serves them all.
		in.maybeRetireLocked() // a request held behind the stop leaves: that may have been the last
		return errRetired
	}
	if in.state == Failed {
		if left := in.until.Sub(in.now()); left > 0 {
			return &BackoffError{Route: in.route.Name, RetryAfter: left, Last: in.lastErr}
		}
	}
	return nil
}

// awaitWake returns once the instance is awake and counts the caller as in flight, for a caller that
// is not a request: an admin wake, a dependent's requirement, a schedule. It starts a wake when the
// instance is asleep, joins the wake in progress (noted in c, which may be nil), and waits out a stop
// in progress, as acquire does; it is not held, though. It counts in no hold figure (held,
// hold.max_requests, the hold histogram, a wake record's joined and released requests), and only ctx,
// the wake's own budget and the activator's shutdown bound it, not hold.max_time. Found with the
// real binary: on a route whose hold.max_time was below its start time, `activator wake` said it timed
// out while the wake went on to succeed, a dependent failed its requirement the same way, and an admin
// wake took a visitor's place in a full hold (or was refused one).
func (in *instance) awaitWake(ctx context.Context, trig trigger, c *holdCharge) (release func(), err error) {
	for {
		in.mu.Lock()
		if in.state == Awake && !in.closed {
			in.inflight++
			in.disarmIdleLocked()
			in.mu.Unlock()
			return in.releaseFn, nil
		}
		if err := in.refuseLocked(); err != nil {
			in.mu.Unlock()
			return nil, err
		}
		var att *attempt
		wait, drain := in.stopDone, in.drain // a stop in progress; once the activator drains, no wake follows it
		if in.state != Stopping {
			if att = in.wake; in.state != Waking {
				att = in.beginWakeLocked(trig)
			}
			att.quiet++ // the hand-over counts the caller in flight, as it does held requests
			wait, drain = att.done, nil
		}
		in.mu.Unlock()
		c.noteWake(att)
		var err error
		select {
		case <-wait:
		case <-ctx.Done():
			err = ctx.Err()
		case <-in.root.Done():
			err = ErrClosed
		case <-drain:
			err = ErrClosed
		}
		switch {
		case att == nil && err != nil:
			return nil, err
		case att == nil: // the stop ended: wake the tenant again
			continue
		case err != nil:
			in.giveUpQuiet(att)
			return nil, err
		case att.err != nil:
			return nil, att.err
		case att.handedOver: // written before done was closed
			return in.releaseFn, nil
		}
	}
}

// giveUpQuiet is leave for an awaitWake caller on att that gives up: one the wake already counted in
// flight (it succeeded just as the caller gave up) is released.
func (in *instance) giveUpQuiet(att *attempt) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if att.handedOver {
		in.releaseLocked()
		return
	}
	att.quiet--
}

// admit waits for one of the route's upstream slots; done gives it back. A herd released at once
// queues here, each request parked right after it left the hold, instead of every one of them first
// building its outgoing request and then queueing for a connection inside the transport.
//
// The wait is bounded by what is left of the request's hold budget: hold.max_time less c.heldFor,
// the time it was already held (0 for a request that found the route awake, or a nil c). Past it the request gets
// ErrUpstreamBusy, so requests that keep every slot (slow uploads with buffering off, long polls)
// make the others fail in bounded time instead of queueing without end. A route without a
// hold.max_time (hand-built in tests) waits without bound.
//
// c is the request's charge (nil counts nothing). A request that was held is still charged, and one
// that must wait for a slot is charged now, or refused with ErrEdgeFull: while it waits it keeps its
// header and buffered body as a held request does. admit gives the charge back when it returns.
// Before, a released herd's requests, and requests to an awake route whose slots were all taken,
// kept their bodies uncounted for up to hold.max_time.
func (in *instance) admit(ctx context.Context, c *holdCharge) (done func(), err error) {
	defer c.give()
	var heldFor time.Duration
	if c != nil {
		heldFor = c.heldFor
	}
	select {
	case in.slots <- struct{}{}:
		return in.unadmitFn, nil
	default:
	}
	if err := c.take(); err != nil {
		return nil, err
	}
	var expired <-chan time.Time
	if budget := in.route.Hold.MaxTime; budget > 0 {
		left := budget - heldFor
		if left <= 0 {
			return nil, in.busy(heldFor)
		}
		t := time.NewTimer(left)
		defer t.Stop()
		expired = t.C
	}
	select {
	case in.slots <- struct{}{}:
		return in.unadmitFn, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-expired:
		return nil, in.busy(heldFor)
	}
}

// busy is the error of a request that waited for an upstream slot for the rest of its hold budget; it
// is logged, throttled. Found by an operator trial: 6,125 requests released from a herd got 503 this
// way with no word in the log, counted with every other 503.
func (in *instance) busy(heldFor time.Duration) error {
	t := in.busyLog.Load()
	if t == nil {
		in.busyLog.CompareAndSwap(nil, &throttle{})
		t = in.busyLog.Load()
	}
	if n, write := t.note(in.now(), failedEvery); write {
		in.logger().Warn("requests waited for a connection to the upstream past hold.max_time: answered 503",
			"requests", n, "max_upstream_conns", cap(in.slots), "hold_max_time", in.route.Hold.MaxTime,
			"fix", "raise max_upstream_conns if the tenant takes more at once; each stream, WebSocket or unbuffered upload keeps one for its whole life")
	}
	return fmt.Errorf("route %q: %w: all %d in use for the rest of hold.max_time (%v, %v of it held)",
		in.route.Name, ErrUpstreamBusy, cap(in.slots), in.route.Hold.MaxTime, heldFor.Round(time.Millisecond))
}

func (in *instance) unadmit() { <-in.slots }

// leave gives up a hold: the caller's ctx ended, its hold timed out, or the wake it waited on (att;
// nil for a stop) failed. A request the wake already counted as in flight (it succeeded just as the
// caller gave up) is released instead.
func (in *instance) leave(att *attempt) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if att != nil && att.handedOver {
		att.depart()
		in.releaseLocked()
		return
	}
	in.held--
	if att != nil {
		att.waiters--
	}
	in.maybeRetireLocked()
}

// release ends one in-flight request; the last one starts the idle clock.
func (in *instance) release() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.releaseLocked()
}

func (in *instance) releaseLocked() {
	in.inflight--
	if in.ho != nil && in.ho.carried > 0 {
		// One of the requests in flight at the handover, which the heir counts too (see handover).
		in.ho.carried--
		in.ho.heir.release()
	}
	if in.inflight == 0 && in.state == Awake {
		in.armIdleLocked()
	}
	in.maybeRetireLocked()
}
