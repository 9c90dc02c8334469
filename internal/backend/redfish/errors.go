package redfish

import (
	"errors"
	"fmt"
	"time"
)

// Fault classes. Every error the backend returns from talking to the BMC matches (errors.Is) exactly
// one of them, and the class decides what happens next.
var (
	// ErrCredentials: the BMC answered 401 or 403. Terminal: the call is not retried.
	ErrCredentials = errors.New("credentials rejected by BMC")
	// ErrConfig: the configuration does not match the BMC (the system does not exist, 404; no allowed
	// Reset type; several systems and none named). Terminal.
	ErrConfig = errors.New("configuration does not match the BMC")
	// ErrThrottled: the BMC answered 429 or 503, possibly with Retry-After. Retried after the time it
	// asks for, as long as the phase budget allows.
	ErrThrottled = errors.New("throttled by BMC")
	// ErrAmbiguous: connection refused or reset, a 5xx, a per-call timeout, a garbled answer. Whether
	// the request took effect is unknown: reads are retried, and a Reset is re-issued only after
	// re-reading PowerState shows it did not land.
	ErrAmbiguous = errors.New("BMC unreachable or failing")
	// ErrRejected: the BMC refused the request (400, 405, 409, ...). Terminal.
	ErrRejected = errors.New("request rejected by BMC")
	// ErrTLS: the TLS connection to the BMC failed: its certificate is not trusted (unknown authority,
	// wrong host name, expired) or the handshake failed. Terminal: retrying cannot fix a certificate.
	ErrTLS = errors.New("TLS connection to BMC failed")
	// ErrNotReached: a power state was not reached within its phase budget (see *StateError).
	ErrNotReached = errors.New("power state not reached")
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
		msg += fmt.Sprintf(" (retry after %v)", e.RetryAfter)
	}
	return msg
}

func (e *BMCError) Unwrap() error { return e.Class }

// StateError reports a power state that was not reached in time, with the last state observed.
type StateError struct {
	Node string
	Want string
	// Last is the last PowerState read ("" if none could be read).
	Last  string
	After time.Duration
	// Cause is why the wait ended: context.DeadlineExceeded when the phase budget or the caller's
	// deadline ran out, or context.Canceled.
	Cause error
	// BMC and Silent are set when the BMC had stopped answering by the end of the wait: its endpoint, and
	// when the first request it left unanswered was sent. LastAnswer is then how long after the wake
	// (or sleep) began the BMC last answered, or negative when it did not answer since.
	BMC        string
	Silent     time.Time
	LastAnswer time.Duration
	op         string // "wake" or "sleep", for LastAnswer
}

func (e *StateError) Error() string {
	last := e.Last
	if last == "" {
		last = "in an unknown power state"
	}
	msg := fmt.Sprintf("%s still %s after %v (want %s)", e.Node, last, e.After.Round(time.Millisecond), e.Want)
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

func (e *StateError) Unwrap() []error { return []error{ErrNotReached, e.Cause} }

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

// retryable reports whether err is of a class that is worth another attempt.
func retryable(err error) bool {
	return errors.Is(err, ErrAmbiguous) || errors.Is(err, ErrThrottled)
}
