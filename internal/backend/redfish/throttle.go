package redfish

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// throttleGate holds back every call to one BMC endpoint while the BMC has asked to slow down (429, or
// 503), so that the routes sharing the BMC wait out its Retry-After together instead of each finding
// the throttle on its own. It is shared by every Backend a Provider opened on the endpoint (see endpoints);
// it is safe for concurrent use.
type throttleGate struct {
	// pause waits d or until ctx is done (the package's pause; tests hold it on an event instead).
	pause func(ctx context.Context, d time.Duration) error

	mu     sync.Mutex // guards the fields below
	until  time.Time  // calls wait until then; zero or past when the BMC has not asked to slow down
	status int        // the HTTP status that last extended until
}

func newThrottleGate(p func(context.Context, time.Duration) error) *throttleGate {
	if p == nil {
		p = pause
	}
	return &throttleGate{pause: p}
}

// hold makes calls wait d from now, unless an earlier answer already holds them longer.
func (g *throttleGate) hold(d time.Duration, status int) {
	until := time.Now().Add(d)
	g.mu.Lock()
	defer g.mu.Unlock()
	if until.After(g.until) {
		g.until, g.status = until, status
	}
}

// wait returns nil once call op may go out: at once while the gate is open, else once its hold has
// passed, plus a jitter of up to a tenth of the wait so that the held calls do not all go out at the
// same instant. It waits once: a call that the BMC throttles again holds the gate anew. When ctx's
// deadline comes before the gate opens it fails at once with an ErrThrottled *BMCError, the wait left
// as its RetryAfter, rather than sleep out the budget; when ctx ends during the wait, with ctx's cause.
func (g *throttleGate) wait(ctx context.Context, op string) error {
	g.mu.Lock()
	until, status := g.until, g.status
	g.mu.Unlock()
	d := time.Until(until)
	if d <= 0 {
		return nil
	}
	jitter := rand.N(d/10 + 1)
	if dl, ok := ctx.Deadline(); ok {
		if dl.Before(until) {
			return &BMCError{Op: op, Class: ErrThrottled, RetryAfter: d,
				Detail: fmt.Sprintf("not sent: the BMC answered HTTP %d to an earlier call and asked every caller to wait, longer than this one has left", status)}
		}
		jitter = min(jitter, dl.Sub(until)/2)
	}
	if err := g.pause(ctx, d+jitter); err != nil {
		return ended(op+": waiting out the BMC's Retry-After", err)
	}
	return nil
}
