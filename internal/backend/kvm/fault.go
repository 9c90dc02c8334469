package kvm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"time"

	"github.com/activator/activator/internal/tenant"
)

// Fault classes (tenant.ClassOf) of what Wake, Sleep, Stop, Adopt, Close and Check return.
//
//   - terminal: QEMU or zstd missing, /dev/kvm unusable with accel: kvm, a boot file (kernel, initrd,
//     disk) gone since the config was loaded, the guest's forwarded port held by another process
//     (*foreign.HeldError), a permission error;
//   - retryable: a phase that ran out of its budget (*BudgetError), QEMU exiting before it daemonized
//     or as the guest started, anything else.
//
// Nothing here is a throttle: QEMU never asks the activator to slow down.

// BudgetError is a wake phase that ran out of its own budget (budgets.qemu_start, qmp, restore or
// running), as opposed to the route's wake budget: "guest still paused after 10s (budgets.running)".
// It is retryable: QEMU under load, or a guest slow to boot, may make it next time.
type BudgetError struct {
	Phase  string        // PhaseQEMUStart, PhaseQMP, PhaseRestore or PhaseRunning: also its budget's key
	Budget time.Duration // the phase's budget
	Last   string        // the last state observed, e.g. "guest still paused"
	Err    error         // what the phase's wait returned (wraps context.DeadlineExceeded)
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("%s after %v (budgets.%s)", e.Last, e.Budget, e.Phase)
}

// Unwrap returns the phase's own error.
func (e *BudgetError) Unwrap() error { return e.Err }

// FaultClass implements tenant.Classer: retryable.
func (e *BudgetError) FaultClass() tenant.Class { return tenant.ClassRetryable }

// overBudget returns err as a *BudgetError when it was the phase's budget that ended the phase:
// pctx, the phase's context derived from the wake's ctx, ran out while ctx still runs. last describes
// the state observed last; it is called only then. Otherwise err is returned as it is.
func overBudget(ctx, pctx context.Context, phase string, budget time.Duration, last func() string, err error) error {
	if err == nil || ctx.Err() != nil || !errors.Is(pctx.Err(), context.DeadlineExceeded) {
		return err
	}
	return &BudgetError{Phase: phase, Budget: budget, Last: last(), Err: err}
}

// startFault classifies the error of starting QEMU's binary: one that is gone or cannot be executed
// (it was found when the route was opened, and has changed since) is terminal.
func startFault(err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.ENOEXEC) ||
		errors.Is(err, syscall.ENOTDIR) {
		return tenant.Terminal(err)
	}
	return err
}

// bootFiles reports, as a terminal error, each of the route's boot files (kernel, initrd, disk) that
// cannot be found any more: Decode checked them when the config was loaded, and a QEMU started
// without one fails with a message only a person reads.
func bootFiles(s *Settings) error {
	var errs []error
	for _, f := range []struct{ key, path string }{{"kernel", s.Kernel}, {"initrd", s.Initrd}, {"disk", s.Disk}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.key, err))
		}
	}
	return tenant.Terminal(errors.Join(errs...))
}
