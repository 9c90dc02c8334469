package redfish

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/activator/activator/internal/tenant"
)

// Fault kinds. Every error the backend returns from talking to the BMC matches (errors.Is) exactly
// one of them, and the kind decides what happens next, within the call and (as its tenant.Class, see
// BMCError.FaultClass) for the next wake.
var (
	// ErrCredentials: the BMC answered 401 or 403. Terminal: the call is not retried.
	ErrCredentials = errors.New("credentials rejected by BMC")
	// ErrConfig: the configuration does not match the BMC (the system does not exist, 404; no allowed
	// Reset type; several systems and none named) or cannot be used (the password file cannot be read).
	// Terminal.
	ErrConfig = errors.New("configuration does not match the BMC")
	// ErrThrottled: the BMC answered 429 or 503, possibly with Retry-After. Every call of the Provider's
	// routes to that BMC waits as long as it asks (poll_interval without Retry-After), as long as the
	// phase budget allows. Throttle.
	ErrThrottled = errors.New("throttled by BMC")
	// ErrAmbiguous: connection refused or reset, a 5xx, a per-call timeout, a garbled answer. Whether
	// the request took effect is unknown: reads are retried, and a Reset is re-issued only after
	// re-reading PowerState shows it did not land. Retryable.
	ErrAmbiguous = errors.New("BMC unreachable or failing")
	// ErrRejected: the BMC refused the request (400, 405, 409, ...). Terminal.
	ErrRejected = errors.New("request rejected by BMC")
	// ErrTLS: the TLS connection to the BMC failed: its certificate is not trusted (unknown authority,
	// wrong host name, expired) or the handshake failed. Terminal: retrying cannot fix a certificate.
	ErrTLS = errors.New("TLS connection to BMC failed")
	// ErrNotReached: a power state was not reached within its phase budget (see *StateError).
	// Retryable.
	ErrNotReached = errors.New("power state not reached")
)

// The fault classes this backing reports, checked by the compiler.
var (
	_ tenant.Classer = (*BMCError)(nil)
	_ tenant.Classer = (*StateError)(nil)
)

// BMCError is one failed exchange with the BMC. Its message never contains the password or any
// token. It matches its class (one of the Err* sentinels above) with errors.Is.
type BMCError struct {
	// Op is what was attempted: "log in", "read power state", "reset On", ...
	Op string
	// Status is the HTTP status, 0 when there was no answer.
	Status int
	// RetryAfter is the wait the BMC asked for (429/503 with Retry-After), 0 if none.
	RetryAfter time.Duration
	// Class is the fault class sentinel.
	Class error
	// Detail is a short, sanitized description of the cause.
	Detail string
}

func (e *BMCError) Error() string {
	msg := fmt.Sprintf("%s: %v", e.Op, e.Class)
	if e.Status != 0 {
		msg += fmt.Sprintf(" (HTTP %d)", e.Status)
	}
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	if e.RetryAfter > 0 {
		round := time.Second // what is left of a Retry-After (see throttleGate.wait) is not to the nanosecond
		if e.RetryAfter < time.Second {
			round = time.Millisecond
		}
		msg += fmt.Sprintf(" (retry after %v)", e.RetryAfter.Round(round))
	}
	return msg
}

func (e *BMCError) Unwrap() error { return e.Class }

// FaultClass implements tenant.Classer. Credentials, configuration, a refused request and TLS are
// terminal: no retry helps until an operator acts. A 429 or 503 is a throttle, which the BMC's gate
// backs off for all the Provider's routes on it. An ambiguous failure is retryable: reads are
// idempotent, and a Reset whose answer was lost is re-issued, by this backing or by the next wake, only
// after PowerState has been read again (see Backend.action).
func (e *BMCError) FaultClass() tenant.Class {
	switch e.Class {
	case ErrCredentials, ErrConfig, ErrRejected, ErrTLS:
		return tenant.ClassTerminal
	case ErrThrottled:
		return tenant.ClassThrottle
	default: // ErrAmbiguous
		return tenant.ClassRetryable
	}
}

// StateError reports a power state that was not reached in time, with the last state observed and
// the budget of the wait.
type StateError struct {
	Node string
	Want string
	// Last is the last PowerState read ("" if none could be read).
	Last  string
	After time.Duration
	// Key and Budget are the setting that bounded the wait ("power_on_budget", "shutdown_grace",
	// "power_off_budget") and its value.
	Key    string
	Budget time.Duration
	// Cause is why the wait ended: context.DeadlineExceeded when the phase budget or the caller's
	// deadline ran out, or context.Canceled.
	Cause error
	// BMC and Silent are set when the BMC had stopped answering by the end of the wait: its endpoint, and
	// when the first request it left unanswered was sent. LastAnswer is then how long after the wake
	// (or sleep) began the BMC last answered, or negative when it did not answer since.
	BMC        string
	Silent     time.Time
	LastAnswer time.Duration
	op         string // "wake", "sleep" or "undo", for the message
	cut        bool   // the caller's context ended the wait before Budget did
}

func (e *StateError) Error() string {
	last := e.Last
	if last == "" {
		last = "in an unknown power state"
	}
	msg := fmt.Sprintf("%s still %s after %v (want %s%s)", e.Node, last, e.After.Round(time.Millisecond), e.Want, e.budget())
	if e.Silent.IsZero() {
		return msg
	}
	answer := fmt.Sprintf("no answer since the %s began", e.op)
	if e.LastAnswer >= 0 {
		round := 100 * time.Millisecond
		if e.LastAnswer < time.Second {
			round = time.Millisecond
		}
		answer = fmt.Sprintf("last answer %v into the %s", e.LastAnswer.Round(round), e.op)
	}
	return fmt.Sprintf("BMC %s stopped answering at %s (%s); %s", e.BMC, e.Silent.Format("15:04:05"), answer, msg)
}

// budget is the message's note of the wait's budget: "; power_on_budget 5m0s", or what ended the wait
// first.
func (e *StateError) budget() string {
	switch {
	case e.Key == "":
		return ""
	case e.cut && errors.Is(e.Cause, context.Canceled):
		return fmt.Sprintf("; canceled before %s %v ran out", e.Key, e.Budget)
	case e.cut:
		return fmt.Sprintf("; cut short by the %s's deadline, before %s %v ran out", e.op, e.Key, e.Budget)
	}
	return fmt.Sprintf("; %s %v", e.Key, e.Budget)
}

func (e *StateError) Unwrap() []error { return []error{ErrNotReached, e.Cause} }

// FaultClass implements tenant.Classer: a state not reached in time is retryable.
func (e *StateError) FaultClass() tenant.Class { return tenant.ClassRetryable }

// PhaseError names the phase ("reset", "power_on", "shutdown", "power_off") a wake or sleep died in.
type PhaseError struct {
	Phase string
	Err   error
}

func (e *PhaseError) Error() string { return fmt.Sprintf("phase %s: %v", e.Phase, e.Err) }
func (e *PhaseError) Unwrap() error { return e.Err }

// Phase returns the phase err died in, or "".
func Phase(err error) string {
	var pe *PhaseError
	if errors.As(err, &pe) {
		return pe.Phase
	}
	return ""
}

// ended is the error of call op cut short by its caller's context (cause: the context's cause): the
// phase's time ran out, or the wait was called off. Retryable.
func ended(op string, cause error) error {
	return tenant.Retryable(fmt.Errorf("%s: %w", op, cause))
}

// retryable reports whether err is worth another attempt within bmc.retry. The rule is narrower than
// err's tenant.Class: a power state not reached in time is for the next wake to retry, not the call.
func retryable(err error) bool {
	return errors.Is(err, ErrAmbiguous) || errors.Is(err, ErrThrottled)
}
