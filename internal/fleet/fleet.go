// Package fleet wakes the members of a fleet, all at once or one by one, and decides the wake: it
// succeeds once a quorum of members is up (min_ready), and fails at once, cancelling the members still
// waking, when enough have failed that the quorum can no longer be reached. It classifies each member's
// outcome as up, timeout (a retry may help) or error (a terminal fault), the same rollup whether the
// members were awaited in parallel or in turn. A lost quorum is put on a member that failed terminally
// if one did (see QuorumError).
//
// It knows nothing of HTTP or backings: a Member is a function that brings one member up and through
// its health gate. internal/activator builds them.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/activator/activator/internal/tenant"
)

// Status is a member's outcome in a wake.
type Status string

const (
	Up        Status = "up"        // woke and passed its health gate
	Timeout   Status = "timeout"   // a retryable or throttle fault: it did not get there within budget
	Error     Status = "error"     // a terminal fault: configuration, permission, credentials
	Cancelled Status = "cancelled" // stopped by a fast-fail (CancelledBy names the culprit) or by the wake's end
	Waking    Status = "waking"    // not settled yet (or, when serial, not started)
)

// Member is one member's wake, as the caller runs it.
type Member struct {
	Name string
	// Wake brings the member up and through its health gate, within ctx; nil means up.
	Wake func(ctx context.Context) error
	// Phase reports the phase the member is in (the one a failure or a cancellation found it in);
	// nil reports none.
	Phase func() string
}

// Result is one member's outcome.
type Result struct {
	Name   string
	Status Status
	// Class is the fault's class, for Timeout and Error.
	Class tenant.Class
	// Phase is the phase the member failed in or had reached when it was cancelled; "" for a serial
	// member cancelled before it started.
	Phase string
	Err   error
	// CancelledBy names the member whose failure cancelled this one (a fast-fail); "" when the wake
	// itself was cancelled (shutdown).
	CancelledBy string
}

// Options shape a wake.
type Options struct {
	// MinReady is the quorum, between 1 and the number of members (out of range: all of them).
	MinReady int
	// Serial awaits the members one by one, in order, instead of all at once.
	Serial bool
	// OnUp is called, from the member's goroutine, when member i is up; before Decided closes if it
	// completes the quorum.
	OnUp func(i int)
	// OnSettled is called, from the member's goroutine, once member i has settled, with its result:
	// after its result is recorded and, when it decides the wake, after Decided has closed. A member
	// cancelled before it started (serial) settles too.
	OnSettled func(i int, res Result)
}

// QuorumError is a fleet wake that failed: the quorum can no longer be reached. Its class is the
// culprit's. The culprit is the first member that failed terminally, if any did: it fails every wake
// until someone fixes it, whichever member's failure came last (a retryable timeout named instead
// pointed the operator at the wrong fix; found by an operator trial). Else it is the member whose
// failure made the quorum unreachable. Others are the members that had failed besides it.
type QuorumError struct {
	Up, Members, MinReady int
	Culprit               Result
	Others                []Result // in the order they failed
}

func (e *QuorumError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "fleet: min_ready %d of %d can no longer be reached (%d up): member %q failed in phase %s (%s): %v",
		e.MinReady, e.Members, e.Up, e.Culprit.Name, orNone(e.Culprit.Phase), e.Culprit.Class, e.Culprit.Err)
	for _, o := range e.Others {
		fmt.Fprintf(&b, "; member %q failed too, in phase %s (%s): %v", o.Name, orNone(o.Phase), o.Class, o.Err)
	}
	return b.String()
}

func (e *QuorumError) Unwrap() error            { return e.Culprit.Err }
func (e *QuorumError) FaultClass() tenant.Class { return e.Culprit.Class }

func orNone(p string) string {
	if p == "" {
		return "(none)"
	}
	return p
}

// errFastFail is the cause the members still waking are cancelled with when the quorum is lost.
var errFastFail = errors.New("fleet fast-fail")

// Run is one fleet wake in progress.
type Run struct {
	members   []Member
	min       int
	onUp      func(int)
	onSettled func(int, Result)
	cancel    context.CancelCauseFunc

	decided chan struct{} // closed once the quorum is up, or lost
	done    chan struct{} // closed once every member has settled

	mu        sync.Mutex
	results   []Result
	up        int
	failed    []int        // the members that failed (timeout or error), in the order they did
	err       *QuorumError // set when the quorum was lost
	cancelled bool         // set when every member settled with neither quorum nor its loss
}

// Start begins waking members under ctx and returns at once. ctx bounds every member; cancelling it
// cancels those still waking (their results say Cancelled with no culprit, unless ctx's deadline
// passed: that is a Timeout).
func Start(ctx context.Context, members []Member, opts Options) *Run {
	ctx, cancel := context.WithCancelCause(ctx)
	r := &Run{members: members, min: opts.MinReady, onUp: opts.OnUp, onSettled: opts.OnSettled, cancel: cancel,
		decided: make(chan struct{}), done: make(chan struct{}), results: make([]Result, len(members))}
	if r.min <= 0 || r.min > len(members) {
		r.min = len(members)
	}
	for i, m := range members {
		r.results[i] = Result{Name: m.Name, Status: Waking}
	}
	if len(members) == 0 {
		close(r.decided)
		close(r.done)
		cancel(nil)
		return r
	}
	go r.run(ctx, opts.Serial)
	return r
}

func (r *Run) run(ctx context.Context, serial bool) {
	defer close(r.done)
	defer r.cancel(nil)
	defer r.undecided()
	if serial {
		for i := range r.members {
			if ctx.Err() != nil {
				r.settle(ctx, i, ctx.Err(), false)
				continue
			}
			r.settle(ctx, i, r.members[i].Wake(ctx), true)
		}
		return
	}
	var wg sync.WaitGroup
	for i := range r.members {
		wg.Go(func() { r.settle(ctx, i, r.members[i].Wake(ctx), true) })
	}
	wg.Wait()
}

// undecided ends a wake that every member settled without deciding: members were cancelled (the
// wake's ctx ended) before the quorum was up or lost. Err is then ErrCancelled, with no culprit.
func (r *Run) undecided() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.up >= r.min || r.err != nil {
		return
	}
	r.cancelled = true
	close(r.decided)
}

// ErrCancelled is Err of a wake whose members were cancelled before the quorum was up or lost.
var ErrCancelled = errors.New("fleet wake cancelled")

// settle records member i's outcome, decides the wake when it completes or loses the quorum, and then
// tells OnSettled.
func (r *Run) settle(ctx context.Context, i int, err error, started bool) {
	m := r.members[i]
	phase := ""
	if m.Phase != nil && started {
		phase = m.Phase()
	}
	if err == nil && r.onUp != nil {
		r.onUp(i)
	}
	res := r.record(ctx, i, phase, err)
	if r.onSettled != nil {
		r.onSettled(i, res)
	}
}

// record is settle's part under the lock: it returns member i's result.
func (r *Run) record(ctx context.Context, i int, phase string, err error) Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := &r.results[i]
	res.Phase, res.Err = phase, err
	switch {
	case err == nil:
		res.Status = Up
		r.up++
		if r.up == r.min && r.err == nil {
			close(r.decided)
		}
		return *res
	case errors.Is(context.Cause(ctx), errFastFail):
		res.Status, res.CancelledBy = Cancelled, r.err.Culprit.Name
		return *res
	case ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
		res.Status = Cancelled
		return *res
	}
	res.Class = tenant.ClassOf(err)
	res.Status = Timeout
	if res.Class == tenant.ClassTerminal {
		res.Status = Error
	}
	r.failed = append(r.failed, i)
	if r.up < r.min && r.err == nil && len(r.failed) > len(r.members)-r.min {
		r.err = r.lostLocked(i)
		close(r.decided)
		r.cancel(errFastFail)
	}
	return *res
}

// lostLocked is the QuorumError of a quorum that member last's failure made unreachable: its culprit
// is the first member that failed terminally, else last.
func (r *Run) lostLocked(last int) *QuorumError {
	culprit := last
	for _, i := range r.failed {
		if r.results[i].Status == Error {
			culprit = i
			break
		}
	}
	qe := &QuorumError{Up: r.up, Members: len(r.members), MinReady: r.min, Culprit: r.results[culprit]}
	for _, i := range r.failed {
		if i != culprit {
			qe.Others = append(qe.Others, r.results[i])
		}
	}
	return qe
}

// Decided is closed once the quorum is up or lost (see Err).
func (r *Run) Decided() <-chan struct{} { return r.decided }

// Done is closed once every member has settled: after Decided, members that had not settled go on
// (the stragglers of a quorum, or the cancelled members of a fast-fail winding down).
func (r *Run) Done() <-chan struct{} { return r.done }

// Err is nil once the quorum is up, or the *QuorumError that lost it. It is meaningful after Decided.
func (r *Run) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.err != nil:
		return r.err
	case r.cancelled:
		return ErrCancelled
	}
	return nil
}

// Results returns every member's outcome so far, in member order.
func (r *Run) Results() []Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Result(nil), r.results...)
}

// Cancel cancels the members still waking, with cause (nil: context.Canceled), and returns at once;
// Done tells when they have settled.
func (r *Run) Cancel(cause error) { r.cancel(cause) }

// Rollup renders results as the one-line form: "up, up, timeout, up, error".
func Rollup(results []Result) string {
	var b []byte
	for i, res := range results {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(b, res.Status...)
	}
	return string(b)
}
