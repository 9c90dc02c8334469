package exec

import (
	"errors"
	"io/fs"
	"syscall"

	"github.com/activator/activator/internal/tenant"
)

// Fault classes (tenant.ClassOf) of what Wake, Sleep, Stop, Close and Check return. The typed errors
// carry their own: *ExitError is retryable, *DaemonError and *foreign.HeldError are terminal. The
// helpers here classify the errors of the operating system that have no type of this package. What
// none of them classifies falls to ClassOf's rule: terminal for a permission error, else retryable.
//
// Nothing here is a throttle: no one on the other side of a fork asks the activator to slow down.

// startFault classifies the error of starting the child. The executable or the working directory is
// gone or unusable (it was checked when the config was loaded, and has changed since): terminal. A
// fork that failed for want of memory, processes or descriptors: retryable.
func startFault(err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.ENOEXEC) ||
		errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.ELOOP) || errors.Is(err, syscall.ENAMETOOLONG) {
		return tenant.Terminal(err)
	}
	return err
}

// bindFault classifies the error of binding the upstream in listen_fds mode. The address is held by
// another process (the activator does not probe first in this mode: it binds) or is not an address of
// this host: terminal.
func bindFault(err error) error {
	if errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EADDRNOTAVAIL) {
		return tenant.Terminal(err)
	}
	return err
}
