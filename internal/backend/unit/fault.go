package unit

import (
	"errors"
	"io"
	"net"
	"syscall"

	godbus "github.com/godbus/dbus/v5"

	"github.com/activator/activator/internal/tenant"
)

// Fault classes (tenant.ClassOf) of what Wake, Sleep, Stop, Adopt, Close and Check return:
//
//   - terminal: a unit the manager cannot load (no such unit, masked, a bad setting), a unit whose
//     executable cannot be run (ExecMainStatus 203), a sleep mode the host cannot do (ErrUnsupported),
//     D-Bus access denied, the upstream held by another process (*foreign.HeldError);
//   - throttle: systemd refused the start for its start limit (Result=start-limit-hit, or a failed
//     start job that ran nothing: JobError.Refused);
//   - retryable: a start job that failed or timed out, a unit that exited before it was ready, a start
//     that a Condition*= skipped or an Assert*= refused (the next wake checks again), a manager that
//     cannot be reached or dropped the connection, a wake budget that ran out.

// cldExited and exitExec are the ExecMainCode and ExecMainStatus of a main process that systemd could
// not execute (CLD_EXITED, and systemd's EXIT_EXEC: the binary is missing or not executable).
const (
	cldExited = 1
	exitExec  = 203
)

// class is the fault class of a unit found in state s after a start that did not leave it active, or
// after it stopped on its own.
func (s UnitState) class() tenant.Class {
	switch {
	case s.Result == "start-limit-hit":
		// The manager asks to slow down: no start succeeds before StartLimitIntervalSec has passed.
		return tenant.ClassThrottle
	case s.LoadState != "" && s.LoadState != "loaded":
		return tenant.ClassTerminal
	case s.ExecMainCode == cldExited && s.ExecMainStatus == exitExec:
		return tenant.ClassTerminal
	}
	// A crash or a failed start may be transient (a dependency not up yet, an out-of-memory kill);
	// the next wake retries after the activator's backoff.
	return tenant.ClassRetryable
}

// terminalNames are the D-Bus errors that no retry gets past: the caller may not do it, or the unit
// cannot be had as configured.
var terminalNames = map[string]bool{
	"org.freedesktop.DBus.Error.AccessDenied":                     true,
	"org.freedesktop.DBus.Error.AuthFailed":                       true,
	"org.freedesktop.DBus.Error.InteractiveAuthorizationRequired": true, // polkit said no
	"org.freedesktop.DBus.Error.NotSupported":                     true,
	"org.freedesktop.systemd1.NoSuchUnit":                         true,
	"org.freedesktop.systemd1.UnitMasked":                         true,
	"org.freedesktop.systemd1.LoadFailed":                         true,
	"org.freedesktop.systemd1.BadUnitSetting":                     true,
	"org.freedesktop.systemd1.OnlyByDependency":                   true, // RefuseManualStart=yes
}

// dbusFault classifies an error a call to the manager returned: terminal for the names above, else
// as it is (ClassOf: retryable, or terminal for a permission error).
func dbusFault(err error) error {
	if terminalNames[dbusErrorName(err)] {
		return tenant.Terminal(err)
	}
	return err
}

// authFault classifies a failed authentication: the bus refused the activator's credentials
// (terminal), unless the connection itself broke meanwhile (a manager restarting).
func authFault(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) || errors.Is(err, godbus.ErrClosed) {
		return err
	}
	return tenant.Terminal(err)
}
