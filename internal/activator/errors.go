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
)

// WakeError is a failed wake as held requests see it: the phase it died in and why.
type WakeError struct {
	Route string
	Phase string
	Err   error
	// RetryAfter is how long the route refuses new wakes (its failure backoff).
	RetryAfter time.Duration
}

func (e *WakeError) Error() string {
	return fmt.Sprintf("route %q: wake failed in phase %s: %v", e.Route, e.Phase, e.Err)
}

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

// UpstreamError is a proxy failure after the route was awake (connection refused, reset).
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
	)
	switch {
	case errors.Is(err, ErrUnknownHost):
		return http.StatusNotFound, 0
	case errors.Is(err, ErrHoldTimeout):
		return http.StatusGatewayTimeout, 0
	case errors.Is(err, ErrHoldFull):
		return http.StatusServiceUnavailable, time.Second
	case errors.Is(err, ErrClosed):
		return http.StatusServiceUnavailable, time.Second
	case errors.As(err, &be):
		return http.StatusServiceUnavailable, be.RetryAfter
	case errors.As(err, &we):
		return http.StatusServiceUnavailable, we.RetryAfter
	case errors.As(err, &ue), errors.As(err, &se):
		return http.StatusBadGateway, 0
	}
	return http.StatusInternalServerError, 0
}

// writeError answers a request with err's status and a short body naming the phase and cause: HTML for
// browsers, JSON for Accept: application/json, plain text otherwise.
func writeError(w http.ResponseWriter, r *http.Request, err error) int {
	code, retry := statusFor(err)
	h := w.Header()
	if retry > 0 {
		h.Set("Retry-After", strconv.Itoa(int(math.Ceil(retry.Seconds()))))
	}
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	msg := err.Error()
	phase := ""
	var we *WakeError
	if errors.As(err, &we) {
		phase = we.Phase
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
		if retry > 0 {
			body["retry_after_seconds"] = int(math.Ceil(retry.Seconds()))
		}
		_ = json.NewEncoder(w).Encode(body)
	case strings.Contains(accept, "text/html"):
		h.Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(code)
		fmt.Fprintf(w, "<!doctype html><title>%d %s</title><h1>%d %s</h1><pre>%s</pre>\n",
			code, http.StatusText(code), code, http.StatusText(code), html.EscapeString(msg))
	default:
		h.Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(code)
		fmt.Fprintf(w, "%d %s: %s\n", code, http.StatusText(code), msg)
	}
	return code
}
