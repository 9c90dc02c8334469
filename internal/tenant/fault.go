package tenant

// Fault classes: what a failed wake or sleep means for the next attempt.

import (
	"errors"
	"os"
	"os/exec"
)

// Class is a fault's class. Every error a backing reports has exactly one (ClassOf).
type Class string

const (
	// ClassRetryable: the backing did not get there in time, or hit a transient fault (propagation
	// lag, a connection refused while the tenant boots, a reset). Retried inside the phase's budget
	// with backoff and jitter; the next wake may succeed.
	ClassRetryable Class = "retryable"
	// ClassThrottle: the other side asked to slow down (HTTP 429, a BMC's Retry-After). Backed off
	// across the whole backing, not per request.
	ClassThrottle Class = "throttle"
	// ClassTerminal: configuration, permission or credentials (401/403, a certificate that is not
	// trusted, a missing binary, an invalid setting). Failed at once and never retried: a retry cannot
	// help until an operator changes something.
	ClassTerminal Class = "terminal"
)

// Classer is implemented by errors that know their class. ClassOf finds the first one in an error's
// chain.
type Classer interface {
	FaultClass() Class
}

// Fault is an error with its class attached by the backing that reported it.
type Fault struct {
	Class Class
	Err   error
}

func (f *Fault) Error() string     { return f.Err.Error() }
func (f *Fault) Unwrap() error     { return f.Err }
func (f *Fault) FaultClass() Class { return f.Class }

// Classify returns err with class c attached (nil for a nil err). ClassOf reads the outermost class in
// a chain, so a backing that settled an ambiguous outcome (it read the state again) reclassifies by
// wrapping.
func Classify(c Class, err error) error {
	if err == nil {
		return nil
	}
	return &Fault{Class: c, Err: err}
}

// Terminal is Classify(ClassTerminal, err).
func Terminal(err error) error { return Classify(ClassTerminal, err) }

// Retryable is Classify(ClassRetryable, err).
func Retryable(err error) error { return Classify(ClassRetryable, err) }

// ClassOf returns err's class: that of the outermost Classer in its chain; else terminal for a
// missing executable or a permission error; else retryable (a deadline among them). An error no rule
// classifies counts as retryable because the activator never gives up on a tenant for good: the next
// wake tries again after the route's backoff either way, and a terminal class would claim to know more
// than the backing said. ClassOf(nil) is "".
func ClassOf(err error) Class {
	if err == nil {
		return ""
	}
	var c Classer
	if errors.As(err, &c) {
		return c.FaultClass()
	}
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrPermission) {
		return ClassTerminal
	}
	return ClassRetryable
}
