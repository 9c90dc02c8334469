package activator

import (
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/activator/activator/internal/bodybuf"
	"github.com/activator/activator/internal/tenant"
	"github.com/activator/activator/internal/upstream"
)

// Sentinels callers branch on.
var (
	// ErrHoldFull: the route already holds its maximum number of requests.
	ErrHoldFull = errors.New("too many requests are waiting for this route to wake")
	// ErrHoldTimeout: the request waited longer than the route's hold.max_time.
	ErrHoldTimeout = errors.New("timed out waiting for the route to wake")
	// ErrUnknownHost: no route matches the request's Host and path.
	ErrUnknownHost = errors.New("no route for this host")
	// ErrClosed: the route is shutting down (activator shutdown or route removed).
	ErrClosed = errors.New("route is shutting down")
	// errRetired: the instance a request reached was replaced (or removed) by a reload, and has not
	// started or joined a wake for it; the edge asks the route's current instance instead
	// (Server.acquireRouted). Answered like ErrClosed if it ever reaches a client.
	errRetired = errors.New("route was replaced by a reload")
	// ErrEdgeFull: the requests held across all routes are at edge.max_held, or keep edge.max_held_bytes;
	// the wrapping error names which.
	ErrEdgeFull = errors.New("the edge holds as many requests as it may")
	// ErrUpstreamBusy: the request waited for one of the route's max_upstream_conns slots for what was
	// left of its hold.max_time.
	ErrUpstreamBusy = errors.New("timed out waiting for a connection to the route's upstream")
	// ErrHeaderTooLarge: the request line and header are longer than edge.max_header_bytes.
	ErrHeaderTooLarge = errors.New("request header too large")
	// ErrBodyRead: the client's request body could not be read (malformed, or the client left).
	ErrBodyRead = errors.New("cannot read the request body")
	// ErrBodyBuffer: the request body could not be buffered (its spill file failed: a full or
	// unwritable edge.body_buffer_dir).
	ErrBodyBuffer = errors.New("cannot buffer the request body")
)

// Request-body limits answer with bodybuf's sentinels: bodybuf.ErrTooLarge (413) and
// bodybuf.ErrIdle (408), from the buffered read and from a streamed body alike.

// WakeError is a failed wake as held requests see it: the phase it died in and why. Err is for the log,
// the admin API and the wake record; a client reads it only from a route with detailed_errors (see
// clientMessage), since it may quote the tenant's output (paths, config names).
type WakeError struct {
	Route  string
	Phase  string
	WakeID string // the failed wake's WakeRecord.ID
	Err    error
	// RetryAfter is how long the route refuses new wakes (its failure backoff).
	RetryAfter time.Duration
	// Detailed is the route's detailed_errors: the client's error body may quote Err.
	Detailed bool
	// Class is the fault's class, and Culprit where the wake failed (WakeRecord.Culprit).
	Class   tenant.Class
	Culprit *Culprit
}

func (e *WakeError) Error() string {
	return fmt.Sprintf("route %q: wake failed in phase %s%s: %v", e.Route, e.Phase, e.classNote(), e.Err)
}

// classNote is " (terminal fault)" and the like, or "" for a failure without a class.
func (e *WakeError) classNote() string {
	if e == nil || e.Class == "" {
		return ""
	}
	return " (" + string(e.Class) + " fault)"
}

// FaultClass is the class the wake record gave the failure.
func (e *WakeError) FaultClass() tenant.Class { return e.Class }

func (e *WakeError) Unwrap() error { return e.Err }

// BackoffError is returned while a route waits out its failure backoff after a failed wake.
type BackoffError struct {
	Route      string
	RetryAfter time.Duration
	Last       *WakeError
}

func (e *BackoffError) Error() string {
	return fmt.Sprintf("route %q: last wake failed, next attempt in %v: %v", e.Route, e.RetryAfter.Round(time.Millisecond), e.Last.Err)
}

func (e *BackoffError) Unwrap() error { return e.Last }

// HoldTimeoutError is a request held past its route's hold.max_time (ErrHoldTimeout): it names the
// route and, when the request waited for a wake, that wake's id, which the answer carries as the
// failed wake's does. Found by an operator trial: the 504's body named neither.
type HoldTimeoutError struct {
	Route   string
	MaxTime time.Duration
	WakeID  string // the wake the request waited for; "" behind a stop
}

func (e *HoldTimeoutError) Error() string {
	if e.WakeID == "" {
		return fmt.Sprintf("route %q: %v (hold.max_time %v)", e.Route, ErrHoldTimeout, e.MaxTime)
	}
	return fmt.Sprintf("route %q: %v (hold.max_time %v); the wake goes on", e.Route, ErrHoldTimeout, e.MaxTime)
}

func (e *HoldTimeoutError) Unwrap() error { return ErrHoldTimeout }

// UpstreamError is a proxy failure after the route was awake (connection refused, reset). Its Error
// is the whole text, for the log; the client reads only the failure's class (upstreamCause).
type UpstreamError struct {
	Route string
	Err   error
}

func (e *UpstreamError) Error() string {
	return fmt.Sprintf("route %q: upstream failed: %v", e.Route, e.Err)
}

func (e *UpstreamError) Unwrap() error { return e.Err }

// SleepError is a sleep that failed: the backing could not stop, freeze, pause or power off the
// tenant, which may still run.
type SleepError struct {
	Route  string
	Reason string // why it was put to sleep: idle, admin, reload, …
	Err    error
}

func (e *SleepError) Error() string {
	return fmt.Sprintf("route %q: sleep (%s) failed; the tenant may still run: %v", e.Route, e.Reason, e.Err)
}

func (e *SleepError) Unwrap() error { return e.Err }

// statusFor maps an error to the HTTP status and Retry-After the client gets. It is the only place that
// decides this.
func statusFor(err error) (code int, retryAfter time.Duration) {
	var (
		we *WakeError
		be *BackoffError
		ue *UpstreamError
		se *SleepError
		ie *IgnoredError
		qe *RequiredError
	)
	switch {
	case errors.As(err, &qe):
		return statusRequired, 0
	case errors.As(err, &ie):
		if ie.Status == http.StatusServiceUnavailable {
			return ie.Status, ignoredRetryAfter
		}
		return ie.Status, 0
	case errors.Is(err, ErrMethod):
		return http.StatusNotImplemented, 0
	case errors.Is(err, ErrTarget), errors.Is(err, ErrMalformed):
		return http.StatusBadRequest, 0
	case errors.Is(err, ErrUnknownHost):
		return http.StatusNotFound, 0
	case errors.Is(err, ErrHeaderTooLarge):
		return http.StatusRequestHeaderFieldsTooLarge, 0
	// The body's errors come first: a streamed body fails inside the proxy, as an UpstreamError.
	case errors.Is(err, bodybuf.ErrTooLarge):
		return http.StatusRequestEntityTooLarge, 0
	case errors.Is(err, bodybuf.ErrIdle):
		return http.StatusRequestTimeout, 0
	case errors.Is(err, ErrBodyRead):
		return http.StatusBadRequest, 0
	case errors.Is(err, ErrBodyBuffer):
		return http.StatusInternalServerError, 0
	case errors.Is(err, bodybuf.ErrSpillsFull):
		return http.StatusServiceUnavailable, time.Second
	case errors.Is(err, ErrEdgeFull), errors.Is(err, ErrUpstreamBusy):
		return http.StatusServiceUnavailable, time.Second
	case errors.Is(err, ErrHoldTimeout):
		return http.StatusGatewayTimeout, 0
	case errors.Is(err, ErrHoldFull):
		return http.StatusServiceUnavailable, time.Second
	case errors.Is(err, ErrClosed), errors.Is(err, errRetired):
		return http.StatusServiceUnavailable, time.Second
	case errors.As(err, &be):
		return http.StatusServiceUnavailable, be.RetryAfter
	case errors.As(err, &we):
		return http.StatusServiceUnavailable, we.RetryAfter
	case errors.As(err, &ue) && errors.Is(ue.Err, upstream.ErrResponseTimeout):
		return http.StatusGatewayTimeout, 0
	case errors.As(err, &ue) && outOfFiles(ue.Err):
		// The edge could not open a socket to the tenant: the edge is full, not the tenant broken.
		return http.StatusServiceUnavailable, time.Second
	case errors.As(err, &ue), errors.As(err, &se):
		return http.StatusBadGateway, 0
	}
	return http.StatusInternalServerError, 0
}

// clientMessage is err's text as the client reads it. A request body's errors are told short, and
// without what lies under them (a socket address, a spill file's path, the transport's words): the
// limit's own words with its detail ("request body too large: more than 1024 bytes"), else the
// sentinel alone.
func clientMessage(err error) string {
	for _, sentinel := range [...]error{bodybuf.ErrTooLarge, bodybuf.ErrIdle, bodybuf.ErrSpillsFull, ErrBodyRead, ErrBodyBuffer} {
		if !errors.Is(err, sentinel) {
			continue
		}
		if sentinel == ErrBodyRead || sentinel == ErrBodyBuffer {
			return sentinel.Error()
		}
		for e := err; e != nil; e = errors.Unwrap(e) {
			if strings.HasPrefix(e.Error(), sentinel.Error()) {
				return e.Error()
			}
		}
		return sentinel.Error()
	}
	// Any other error may quote a backend or a tenant, and with them where they live: an upstream
	// failure is told as its class alone; a failed wake as its phase alone (its cause quotes the
	// tenant's output), unless the route has detailed_errors; a failed sleep without its cause; the
	// rest without addresses (withoutAddresses).
	var (
		ue *UpstreamError
		se *SleepError
	)
	// The outermost of a backoff and a failed wake is the route's own: a dependent's failed wake
	// wraps its requirement's backoff, and told as that, it named the requirement and its phase where
	// the dependent's own answer says phase requires (found with the real binary).
	be, we := outerWakeFailure(err)
	switch {
	case errors.As(err, &ue):
		return fmt.Sprintf("route %q: upstream failed: %s", ue.Route, upstreamCause(ue.Err))
	case be != nil && be.Last != nil && !be.Last.Detailed:
		return fmt.Sprintf("route %q: the last wake failed in phase %s%s; next attempt in %v", be.Route, be.Last.Phase,
			be.Last.classNote(), retrySeconds(be.RetryAfter)*time.Second) // as Retry-After says it: rounded up
	case we != nil && !we.Detailed:
		return fmt.Sprintf("route %q: wake failed in phase %s%s", we.Route, we.Phase, we.classNote())
	case errors.As(err, &se):
		return fmt.Sprintf("route %q: sleep failed", se.Route)
	}
	return withoutAddresses(err.Error())
}

// outerWakeFailure returns the first *BackoffError or *WakeError down err's chain (one of them set),
// or neither.
func outerWakeFailure(err error) (*BackoffError, *WakeError) {
	for ; err != nil; err = errors.Unwrap(err) {
		switch e := err.(type) {
		case *BackoffError:
			return e, nil
		case *WakeError:
			return nil, e
		}
	}
	return nil, nil
}

// retrySeconds is d in whole seconds, rounded up: what Retry-After and the answer's body both say, so
// that they agree (the body rounded to the nearest: "next attempt in 1s" beside "Retry-After: 2").
func retrySeconds(d time.Duration) time.Duration {
	return time.Duration(math.Ceil(d.Seconds()))
}

// writeError answers a request with err's status and a short body (clientMessage) naming the failed
// phase and the wake's id when a wake failed: HTML for browsers, JSON for Accept: application/json,
// plain text otherwise. The id is what an operator looks up in the logs and the admin API, which have
// the cause.
func writeError(w http.ResponseWriter, r *http.Request, err error) int {
	code, retry := statusFor(err)
	h := w.Header()
	if retry > 0 {
		h.Set("Retry-After", strconv.Itoa(int(retrySeconds(retry))))
	}
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	msg := clientMessage(err)
	phase, wakeID, class := "", "", tenant.Class("")
	var (
		we *WakeError
		he *HoldTimeoutError
	)
	if errors.As(err, &we) {
		phase, wakeID, class = we.Phase, we.WakeID, we.Class
	} else if errors.As(err, &he) {
		wakeID = he.WakeID
	}
	accept := r.Header.Get("Accept")
	switch {
	case strings.Contains(accept, "application/json"):
		h.Set("Content-Type", "application/json")
		w.WriteHeader(code)
		body := map[string]any{"status": code, "error": msg}
		if phase != "" {
			body["phase"] = phase
		}
		if wakeID != "" {
			body["wake_id"] = wakeID
		}
		if class != "" {
			body["fault_class"] = class
		}
		if retry > 0 {
			body["retry_after_seconds"] = int(retrySeconds(retry))
		}
		_ = json.NewEncoder(w).Encode(body)
	case strings.Contains(accept, "text/html"):
		h.Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(code)
		// Readable on a phone: the message wraps however long it is (a <pre> would run off the screen).
		fmt.Fprintf(w, "<!doctype html><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"+
			"<title>%d %s</title><h1>%d %s</h1><p style=\"white-space:pre-wrap;overflow-wrap:anywhere\">%s</p>\n",
			code, http.StatusText(code), code, http.StatusText(code), html.EscapeString(msg))
		if wakeID != "" {
			fmt.Fprintf(w, "<p>wake id: <code>%s</code></p>\n", html.EscapeString(wakeID))
		}
	default:
		h.Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(code)
		fmt.Fprintf(w, "%d %s: %s\n", code, http.StatusText(code), msg)
		if wakeID != "" {
			fmt.Fprintf(w, "wake id: %s\n", wakeID)
		}
	}
	return code
}
