// Package health owns probing a tenant's upstream: one HTTP GET per probe (or, with health.tcp, one
// connect), and the gate that waits for N consecutive passes, probing every FastPause at first, so a
// fast tenant is released within a fraction of a millisecond of listening while a slow one is not
// hammered. While nothing listens at a loopback upstream, most probes are a kernel lookup instead of a
// refused dial (listen.go). A health path the tenant keeps refusing with the same client error fails
// the gate at once (ErrWrongPath).
package health

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/upstream"
)

// Probe pacing: a pause after each failed probe of 1/PaceDivisor of the time the gate has waited so
// far, at least FastPause and at most the route's health interval. Noticing a tenant that starts
// listening thus costs at most about 0.5 % of its start-up (plus one FastPause): a tenant that listens
// within milliseconds is released within a fraction of one, and one that takes seconds is probed a few
// hundred times, not hammered. (A refused loopback connect costs microseconds.) Pauses below
// preciseBelow are timed on the gate's Pacer (tick.go) when it has one, longer ones on a time.Timer.
const (
	FastPause    = 200 * time.Microsecond
	PaceDivisor  = 200
	preciseBelow = 2 * time.Millisecond
)

// nextPause is the pause after a failed probe, elapsed after the gate began.
func nextPause(elapsed, interval time.Duration) time.Duration {
	return max(min(elapsed/PaceDivisor, interval), FastPause)
}

// ErrGone is returned by Wait when the gone channel closed: the tenant stopped while being gated.
var ErrGone = errors.New("tenant stopped before it turned healthy")

// GateError is returned by Wait when ctx ended before the gate passed. It carries the last probe's
// result so the operator sees "last probe: connection refused", not just a timeout.
type GateError struct {
	Probes int
	Last   error
	Err    error // ctx's error
}

func (e *GateError) Error() string {
	if e.Last == nil {
		return fmt.Sprintf("health gate did not pass (%d probes): %v", e.Probes, e.Err)
	}
	return fmt.Sprintf("health gate did not pass after %d probes: last probe: %v", e.Probes, e.Last)
}

func (e *GateError) Unwrap() error { return e.Err }

// ErrWrongPath is wrapped by the error Wait returns when the tenant answered FailFastAfter probes in a
// row with the same client error (see refusal): it is up and answering, and the gate would only wait
// out its budget. The error's text names the path and the status.
var ErrWrongPath = errors.New("the tenant is up but this path is wrong (set health.path)")

// Prober probes one upstream. It is safe for concurrent use.
type Prober struct {
	cfg registry.Health
	up  registry.Upstream
	req []byte // the probe request, written as is on each fresh connection
	// keepReq is req without "Connection: close", for WaitConn, which hands the passing probe's
	// connection on.
	keepReq []byte
	pacer   *Pacer // nil: every pause is on a time.Timer
	// listen is the lookups that spare a gate its refused dials (listen.go).
	listen listenState
}

// An Option adjusts a Prober built by New.
type Option func(*Prober)

// WithPacer times the gate's fast pauses on pc, which the caller owns: it closes pc once no gate
// built with it waits any more. A nil pc is no Pacer. Without one, every pause is on a time.Timer,
// which in an idle process fires up to a millisecond late (see Pacer).
func WithPacer(pc *Pacer) Option { return func(p *Prober) { p.pacer = pc } }

// New returns a Prober for the upstream with the route's health settings. Zero fields (as in a Health
// built by hand rather than by the registry) take the registry's defaults: path "/", status 200-399,
// a 2s timeout, a 1s interval, one pass; but a zero FailFastAfter is not defaulted: it turns the
// fail-fast rule off. An empty Host sends the upstream's address as Host (localhost over a unix
// socket). With h.TCP a probe is a connect alone: it passes once the dial succeeds, closes the
// connection at once and sends nothing, so path, Host, status and FailFastAfter play no part.
func New(u registry.Upstream, h registry.Health, opts ...Option) *Prober {
	if h.Path == "" {
		h.Path = "/"
	}
	if h.MinStatus == 0 && h.MaxStatus == 0 {
		h.MinStatus, h.MaxStatus = 200, 399
	}
	if h.Timeout <= 0 {
		h.Timeout = registry.DefaultProbeTimeout
	}
	if h.Interval <= 0 {
		h.Interval = registry.DefaultInterval
	}
	if h.Passes < 1 {
		h.Passes = 1
	}
	// The Host a tenant with a Host allow-list (Django, Rails) accepts: the route's (h.Host, which Load
	// fills in from health.host or the first exact host), else the address the probe dials.
	host := h.Host
	switch {
	case !validHost(host) && u.Network == "unix":
		host = "localhost"
	case !validHost(host):
		host = u.Address
	}
	// A probe measures a fresh connection (a pooled one may point at a process that is gone), so it
	// asks the tenant to close it.
	req := "GET " + h.Path + " HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: activator-health\r\n"
	p := &Prober{cfg: h, up: u, req: []byte(req + "Connection: close\r\n\r\n"), keepReq: []byte(req + "\r\n")}
	if at, err := netip.ParseAddrPort(u.Address); err == nil && u.Network == "tcp" && at.Addr().IsLoopback() {
		p.listen.at, p.listen.open = at, newListenSource
		p.listen.refused = p.wrap(refusedAt(at))
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// validHost reports whether h can go into the probe's Host header as is: not empty, and printable
// ASCII without spaces, so that a Health built by hand cannot break the request head. (Load checks
// health.host fully.)
func validHost(h string) bool {
	for i := 0; i < len(h); i++ {
		if h[i] <= ' ' || h[i] >= 0x7f {
			return false
		}
	}
	return h != ""
}

// Probe makes one GET on a fresh connection within the configured timeout and returns nil when the
// status is in range. Redirects are not followed: a 3xx is judged by the status range like any other.
// In TCP mode it dials within the timeout and returns nil when the connect succeeds.
//
// It is one dial, one write and one read in the calling goroutine, not an http.Client round trip: the
// gate probes every FastPause while a tenant starts, and a client's dial and read goroutines per probe
// were CPU taken from the tenant starting on the same cores.
func (p *Prober) Probe(ctx context.Context) error {
	_, _, err := p.probeConn(ctx, false, false)
	return err
}

// probeConn is Probe; with keep set, it asks for a keep-alive answer and returns the connection of a
// passing probe when it can be used again (the answer kept it alive and was read whole), else nil.
// With lateOK set, a probe that its own timeout cut while it waited for the answer to a request that
// went out whole returns that connection as waiting, still open, for lateAnswer; else waiting is nil.
func (p *Prober) probeConn(ctx context.Context, keep, lateOK bool) (c net.Conn, waiting *upstream.Conn, err error) {
	pctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	if p.cfg.TCP {
		err = p.connect(pctx)
	} else {
		c, waiting, err = p.probe(pctx, keep)
	}
	switch {
	case err == nil:
		return c, nil, nil
	case !cut(err):
		// The probe ran its course (refused, reset, an unwanted status): that is its result, even
		// if ctx ended meanwhile.
	case ended(ctx):
		// The caller's ctx ended during the probe: say that, not "i/o timeout".
		err = cmp.Or(ctx.Err(), context.DeadlineExceeded)
	case ended(pctx):
		err = fmt.Errorf("no answer within %v (the probe timeout): %w", p.cfg.Timeout, context.DeadlineExceeded)
		if lateOK && waiting != nil {
			return nil, waiting, p.wrap(err)
		}
	}
	if waiting != nil {
		waiting.Close()
	}
	return nil, nil, p.wrap(err)
}

// lateAnswer waits, until ctx ends, for the answer to the probe whose connection probeConn returned
// waiting, and sends the probe's result to the channel it returns (buffered: the goroutine never
// blocks, and ends when ctx does); after a pass it calls cut. The connection is closed either way: a
// late answer is not handed on.
//
// Why: the probe timeout cuts a probe that waits, and the next probe starts the tenant's work over on a
// new connection. A tenant whose first answer takes a little longer than the timeout then answers
// only a later probe, a whole timeout or more after it could have passed the gate: a guest restored
// from a snapshot under TCG answered its first probe 176-251 ms after resuming (18 restores by hand),
// against the bench's 250 ms timeout, and one that took longer took a timeout and another probe more.
// So such a probe goes on waiting beside the next ones, one at a time, and whichever passes first passes the
// gate.
func (p *Prober) lateAnswer(ctx context.Context, c *upstream.Conn, began time.Time, cut func()) <-chan lateResult {
	res := make(chan lateResult, 1)
	go func() {
		// The probe's cut set a deadline in the past; ctx bounds the wait from now.
		_ = c.SetDeadline(time.Time{})
		stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
		defer stop()
		resp, _, err := c.Answer()
		if err != nil {
			c.Close()
			res <- lateResult{err: p.wrap(err)}
			return
		}
		after := time.Since(began)
		if _, err := p.judge(c, resp, false, stop); err != nil { // judge closes c
			res <- lateResult{err: p.wrap(err)}
			return
		}
		res <- lateResult{after: after}
		cut() // the probe in flight, if any: the gate has what it waits for
	}()
	return res
}

// lateResult is a late probe's: its error, or, when it passed, how long after it began it was answered.
type lateResult struct {
	err   error
	after time.Duration
}

// noteKey is the context key of WithNote's function.
type noteKey struct{}

// WithNote returns ctx carrying note, which Wait and WaitConn on it call with what the operator should
// know of how the gate passed (the activator puts it in the wake's record): a pass on the answer to a
// probe its timeout had cut, which says the timeout is shorter than the tenant's first answer.
func WithNote(ctx context.Context, note func(string)) context.Context {
	return context.WithValue(ctx, noteKey{}, note)
}

// note calls ctx's WithNote function, if any, with msg.
func note(ctx context.Context, msg string) {
	if f, ok := ctx.Value(noteKey{}).(func(string)); ok && f != nil {
		f(msg)
	}
}

// wrap words a failed probe's error: what was tried, then why it failed.
func (p *Prober) wrap(err error) error {
	if p.cfg.TCP {
		return fmt.Errorf("connect check: %w", err)
	}
	return fmt.Errorf("GET %s: %w", p.cfg.Path, err)
}

// connect is a TCP-mode probe: one dial, closed at once.
func (p *Prober) connect(ctx context.Context) error {
	c, err := p.up.Dial(ctx)
	if err != nil {
		return err
	}
	return c.Close()
}

// cut reports whether err is what a dial, read or write returns when its deadline fires or its ctx
// is canceled: how ctx ending cuts a probe short.
func cut(err error) bool {
	var te interface{ Timeout() bool }
	return errors.Is(err, context.Canceled) || errors.As(err, &te) && te.Timeout()
}

// ended reports whether ctx is done or its deadline has passed. The second matters: a dial or read
// cut by ctx's deadline can fail with "i/o timeout" (the netpoller's copy of the deadline) a moment
// before ctx's own timer marks it done, and then ctx.Err() is still nil. Seen in CI: a gate whose
// budget ran out mid-dial reported "last probe: dial tcp …: i/o timeout" instead of the tenant's 503.
func ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// maxProbeBody is as much of a probe's answer as is read; a longer answer's connection is not kept.
const maxProbeBody = 64 << 10

// probe makes one probe. Its connection is an upstream.Conn and the exchange is the upstream pool's
// own (Conn.Get), so a kept connection goes to the pool (Client.Adopt) with the reader that read the
// answer, and the pool's checks of it are the probe's. When the probe fails while it waits for the
// answer to a request that went out whole, waiting is its connection, left open for probeConn to judge
// (which closes it or hands it to lateAnswer); else every connection but a kept one is closed.
func (p *Prober) probe(ctx context.Context, keep bool) (_ net.Conn, waiting *upstream.Conn, _ error) {
	nc, err := p.up.Dial(ctx)
	if err != nil {
		return nil, nil, err
	}
	c := upstream.NewConn(nc)
	// ctx ending (timeout, the caller, or the tenant gone) cuts a probe that waits on a hanging
	// tenant.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req := p.req
	if keep {
		req = p.keepReq
	}
	// Informational answers (100 Continue, 103 Early Hints) before the real one are passed over.
	resp, sent, err := c.Get(req)
	if err != nil {
		if sent {
			return nil, c, err
		}
		c.Close()
		return nil, nil, err
	}
	kept, err := p.judge(c, resp, keep, stop)
	return kept, nil, err
}

// judge reads the answer resp on c and judges its status. With keep, it returns c when the connection
// can carry another request; otherwise, and on failure, it closes c. stop is the cut's registration on
// the probe's context, to tell whether it fired.
func (p *Prober) judge(c *upstream.Conn, resp *http.Response, keep bool, stop func() bool) (net.Conn, error) {
	n, rerr := io.Copy(io.Discard, io.LimitReader(resp.Body, maxProbeBody+1))
	resp.Body.Close()
	if resp.StatusCode < p.cfg.MinStatus || resp.StatusCode > p.cfg.MaxStatus {
		c.Close()
		return nil, &statusError{code: resp.StatusCode, min: p.cfg.MinStatus, max: p.cfg.MaxStatus}
	}
	// Keep the connection only when the answer was read whole, the tenant is willing to keep it, and
	// ctx's deadline did not fire on it (stop reports whether it was). Bytes after the answer are not
	// judged here: the pool's adoption (Client.Adopt) closes such a connection and tells the route's
	// OnUnasked, so the log names the tenant that sent them, as for any other connection.
	if keep && rerr == nil && n <= maxProbeBody && !resp.Close && stop() {
		if c.SetDeadline(time.Time{}) == nil {
			return c, nil
		}
	}
	c.Close()
	return nil, nil
}

// Wait probes at once, then after pauses that grow with the time waited (nextPause: FastPause at first,
// up to the interval), until the configured number of consecutive probes pass (nil), gone is closed
// (ErrGone), FailFastAfter consecutive probes are refused with the same client error (an error
// wrapping ErrWrongPath; see refusal), or ctx ends (*GateError). A probe in flight when gone closes is
// cut short, so ErrGone comes promptly even while a probe waits on an upstream that hangs; a probe
// that passes before Wait sees gone closed still counts, and so does a late pass that has come. A nil
// gone never closes. A probe its timeout cuts while it waits for the answer goes on waiting beside the
// next ones, one at a time, and counts as a pass if it is answered with one (lateAnswer). The
// goroutines Wait starts (to watch gone, and the late probe's) are told to end as Wait returns, or,
// when the gate passed, just after (their end and the gate's lookups closing are left to them, out of
// the released requests' way); the late probe's ends once its connection's deadline, set in the past,
// cuts its read, without being waited for.
func (p *Prober) Wait(ctx context.Context, gone <-chan struct{}) error {
	_, err := p.wait(ctx, gone, false)
	return err
}

// WaitConn is Wait, and also returns the passing probe's connection when the tenant kept it alive
// (else nil): a connection to the tenant that has just answered, which the activator hands to the
// route's proxy for the first released request, saving it a dial and the tenant an accept. Only a
// probe that can pass the gate asks for keep-alive; the connections of the others are closed. The
// caller owns the returned connection. In TCP mode the connection is always nil: each probe's is
// closed at once; so it is when a late probe passed the gate. The connection may hold bytes the tenant
// sent after its answer: hand it to upstream's Client.Adopt, which closes such a one and reports it.
func (p *Prober) WaitConn(ctx context.Context, gone <-chan struct{}) (net.Conn, error) {
	return p.wait(ctx, gone, true)
}

func (p *Prober) wait(ctx context.Context, gone <-chan struct{}, keep bool) (net.Conn, error) {
	var (
		start  = time.Now()
		passes int
		probes int
		last   error
		timer  *time.Timer
		// refused is the client error the last refusals probes in a row were answered with (see
		// refusal); 0 after any other result.
		refused, refusals int
	)
	// Probes run on pctx, which also ends when gone closes.
	pctx, cancel := context.WithCancel(ctx)
	var stop chan struct{} // closed to end the goroutine watching gone
	if gone != nil {
		stop = make(chan struct{})
		go func() {
			select {
			case <-gone:
				cancel()
			case <-stop:
			}
		}()
	}
	// The fast phase pauses on the Pacer's ticks when there are any (tick.go); a gate joins them at
	// its first pause, so one whose first probe passes costs nothing.
	var precise, joined bool
	// While nothing listens at a loopback upstream, probes are counted as refused without a dial. The
	// lookups are opened after the first probe is refused: a tenant already listening (one whose socket
	// the activator holds: listen_fds) never needs them.
	var lc *listenCheck
	// late is the result of the one probe that its timeout cut while it waited for its answer, and
	// that goes on waiting (lateAnswer) while later probes run on lctx, which its pass cancels; nil
	// when there is none. A late pass counts as a probe that passed when it comes; a late failure says
	// less than the probes made since, and is dropped.
	var (
		late    <-chan lateResult
		lctx    = pctx
		lcancel = func() {}
	)
	lateCame := func(r lateResult) (pass bool) {
		late, lctx = nil, pctx
		lcancel()
		if r.err != nil {
			return false
		}
		passes++
		last = nil
		if passes < p.cfg.Passes {
			return false
		}
		note(ctx, fmt.Sprintf("the health gate passed on the answer to a probe that health.timeout (%v) had cut: it came %v after the probe began; a health.timeout above the tenant's first answer saves the probes in between",
			p.cfg.Timeout, r.after.Round(time.Millisecond)))
		return true
	}
	passed := false
	defer func() {
		if precise {
			p.pacer.leave()
		}
		end := func() {
			if stop != nil {
				close(stop)
			}
			lc.close()
			cancel()
		}
		if !passed {
			end()
			return
		}
		// The gate passed: its caller releases the held requests next, and this is not in their way.
		// (Each is a system call, or a goroutine made ready, which wakes an idle CPU: tens of
		// microseconds on a virtual machine.)
		go end()
	}()
	gateErr := func() (net.Conn, error) {
		// ctx.Err() may still be nil when ended(ctx) saw the deadline pass before ctx's timer fired.
		return nil, &GateError{Probes: probes, Last: last, Err: cmp.Or(ctx.Err(), context.DeadlineExceeded)}
	}
	// lateOr ends the wait with err, unless a late pass that has come passes the gate: a select with
	// gone or ctx ready beside it picks at random, and an answer that came is the gate's, as a probe's
	// pass is when gone closed during it.
	lateOr := func(c net.Conn, err error) (net.Conn, error) {
		select {
		case r := <-late:
			if lateCame(r) {
				passed = true
				return nil, nil
			}
		default:
		}
		return c, err
	}
probing:
	for {
		probes++
		final := passes+1 >= p.cfg.Passes // only the probe that can pass the gate keeps its connection
		var c net.Conn
		var err error
		now := time.Now()
		if lc.skip(now) {
			err = p.listen.refused
		} else {
			var waiting *upstream.Conn
			c, waiting, err = p.probeConn(lctx, keep && final, late == nil)
			if waiting != nil {
				lctx, lcancel = context.WithCancel(pctx)
				late = p.lateAnswer(pctx, waiting, now, lcancel)
			}
			lc.dialed(now, err)
		}
		if err == nil && final {
			// The gate passes on this probe, even if gone closed meanwhile (see the doc above).
			passed = true
			return c, nil
		}
		select {
		case r := <-late:
			// The late probe's pass may have cut this one (lateAnswer cancels lctx after a pass); a
			// probe cut so failed nothing, and is neither a failure nor a pass: with health.passes
			// above 1 it reset the late pass it came after.
			cutByLate := r.err == nil && lctx != pctx && lctx.Err() != nil && pctx.Err() == nil
			if lateCame(r) {
				if c != nil {
					c.Close()
				}
				passed = true
				return nil, nil
			}
			if cutByLate && err != nil {
				continue probing
			}
		default:
		}
		if probes == 1 && err != nil {
			lc = p.listen.openCheck()
			lc.dialedAt(now)
		}
		if c != nil {
			c.Close()
		}
		select {
		case <-gone:
			if err != nil {
				return lateOr(nil, ErrGone)
			}
		default:
		}
		switch code := p.refusal(err); {
		case code == 0:
			refused, refusals = 0, 0
		case code == refused:
			refusals++
		default:
			refused, refusals = code, 1
		}
		if p.cfg.FailFastAfter > 0 && refusals >= p.cfg.FailFastAfter {
			// Checked before ctx: an answer that came as the budget ended still says more.
			return nil, p.wrongPath(refused, refusals)
		}
		if err != nil && ended(ctx) {
			// ctx ended during this probe: the previous probe's result says more than "deadline
			// exceeded".
			if last == nil {
				last = err
			}
			return lateOr(gateErr())
		}
		if err != nil {
			passes = 0
			last = err
		} else {
			passes++
			last = nil
		}
		if passes >= p.cfg.Passes {
			// A late pass and this probe's, which was not the final one when it began.
			passed = true
			return nil, nil
		}
		select {
		case <-gone:
			return lateOr(nil, ErrGone)
		case <-ctx.Done():
			return lateOr(gateErr())
		default:
		}
		pause := nextPause(time.Since(start), p.cfg.Interval)
		if pause < preciseBelow && !joined {
			joined = true
			precise = p.pacer.join()
		} else if pause >= preciseBelow && precise {
			p.pacer.leave()
			precise = false
		}
		if precise {
			// As many ticks as make the pause (the first may come early: the ticks are shared).
			n := int((pause + FastPause/2) / FastPause)
			for ; n > 0; n-- {
				tick := p.pacer.tick()
				if tick == nil {
					break
				}
				select {
				case <-gone:
					return lateOr(nil, ErrGone)
				case <-ctx.Done():
					return lateOr(gateErr())
				case r := <-late:
					if lateCame(r) {
						passed = true
						return nil, nil
					}
					continue probing
				case <-tick:
				}
			}
			if n == 0 {
				continue
			}
			// The ticks stopped (the Pacer closed or its source failed): this pause and the
			// rest are on the timer.
			p.pacer.leave()
			precise = false
		}
		if timer == nil {
			timer = time.NewTimer(pause)
			defer timer.Stop()
		} else {
			timer.Reset(pause)
		}
		select {
		case <-gone:
			return lateOr(nil, ErrGone)
		case <-ctx.Done():
			return lateOr(gateErr())
		case r := <-late:
			if lateCame(r) {
				passed = true
				return nil, nil
			}
			// A probe comes next, as after the pause: the timer is reset or drained before its next
			// use (Go's timers since 1.23 drop a stale tick on Reset).
		case <-timer.C:
		}
	}
}

// statusError is a probe answered with a status outside the accepted range.
type statusError struct{ code, min, max int }

func (e *statusError) Error() string {
	return fmt.Sprintf("status %d, want %d-%d", e.code, e.min, e.max)
}

// refusal returns the status of a probe that failed on a client error that asking again will not
// change: a 4xx outside the accepted range other than 408 Request Timeout, 425 Too Early and 429 Too
// Many Requests. It returns 0 for a pass and for any other failure.
func (p *Prober) refusal(err error) int {
	var se *statusError
	if !errors.As(err, &se) {
		return 0
	}
	switch code := se.code; {
	case code < 400 || code > 499, code >= p.cfg.MinStatus && code <= p.cfg.MaxStatus:
		return 0
	case code == http.StatusRequestTimeout, code == http.StatusTooEarly, code == http.StatusTooManyRequests:
		return 0
	default:
		return code
	}
}

// wrongPath is the error that ends a gate whose last n probes were all refused with code.
func (p *Prober) wrongPath(code, n int) error {
	status := strconv.Itoa(code)
	if text := http.StatusText(code); text != "" {
		status += " " + text
	}
	return fmt.Errorf("health check GET %s answered %s %d times in a row: %w", p.cfg.Path, status, n, ErrWrongPath)
}
