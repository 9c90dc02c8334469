package kvm

import (
	"context"
	"os"

	"github.com/activator/activator/internal/tenant"
)

// standby: true. Under TCG, starting QEMU is the largest part of a restore that the backing does
// itself (the rest is the guest re-translating its code in the new process). A standby QEMU is that
// start done as the guest goes to sleep: QEMU with -incoming defer, on the RAM file when the save is
// the device state, waiting on its monitor. A wake loads the snapshot into it and continues it.
//
// The standby changes nothing about which snapshot may be resumed: a QEMU waiting for a migration does
// not write the guest's RAM, and the wake checks the device state and claims the RAM file as a restore
// into a new QEMU does (savedRAM), the standby's lock on the RAM file standing in for the backend's.
// A standby that is gone, does not hold the route's RAM file, or does not fit the snapshot found is
// killed, and the wake goes on as without one.

// startStandby starts the standby QEMU for the save on disk (shared: the save is the device state,
// bound to the RAM file), unless the backend is closed, within the budgets of a QEMU start and ctx. A
// QEMU that does not start is logged and left out: the next wake starts its own. Called from
// retire's goroutine, after QEMU quit, and from Prepare, under op.
func (b *Backend) startStandby(ctx context.Context, shared bool) {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return
	}
	l := launch{incoming: true}
	if shared {
		f, err := lockRAM(b.ramPath(), false)
		if err != nil {
			b.log.Warn("no standby qemu: RAM file", "err", err)
			return
		}
		l.ram = f
	}
	ctx, cancel := context.WithTimeout(ctx, b.s.Budgets.QEMUStart.D()+b.s.Budgets.QMP.D())
	defer cancel()
	inst, err := b.start(ctx, tenant.Discard, l)
	if err != nil {
		b.log.Warn("no standby qemu; the next wake starts one", "err", err)
		return
	}
	b.mu.Lock()
	closed = b.closed
	if !closed {
		b.standby = inst
	}
	b.mu.Unlock()
	if closed {
		b.discard(inst)
		return
	}
	b.log.Info("standby qemu waiting for the next wake", "qemu_pid", inst.pid, "ram_file", inst.ramFile)
}

// NeedsPrepare reports whether the route has a standby to start before its first wake (tenant.Preparer):
// standby: true, which only snapshot mode has.
func (b *Backend) NeedsPrepare() bool { return b.s.Standby && b.s.Sleep == SleepSnapshot }

// Prepare starts the standby QEMU for the route's first wake under this activator (tenant.Preparer),
// when a snapshot an earlier activator left is on disk and no guest runs: what this activator's own
// sleep would have left waiting. It does nothing before an Adopt or a Wake has settled what an earlier
// activator left (a QEMU of this route still running, or its standby, which Adopt kills), after one
// found a guest or started a QEMU, once a sleep has started its own standby, or after Close. A
// snapshot it cannot tell is whole is still the wake's to check: the standby waits, and a wake whose
// checks refuse the snapshot drops it and boots, as after a sleep.
func (b *Backend) Prepare(ctx context.Context) {
	if !b.NeedsPrepare() {
		return
	}
	b.op.Lock()
	defer b.op.Unlock()
	b.mu.Lock()
	busy := b.closed || b.inst != nil || b.life != nil || b.standby != nil
	b.mu.Unlock()
	if busy || !b.begun || b.retiring != nil {
		return
	}
	if b.ram.file {
		if !exists(b.devPath()) || !exists(b.ramPath()) {
			return // no device state to load, or none bound to a RAM file: a wake boots
		}
		b.startStandby(ctx, true)
		return
	}
	if file, other := b.snapFile(); exists(file) || exists(other) {
		b.startStandby(ctx, false)
	}
}

// exists reports whether path names something (a file the backing keeps in its own directories).
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// takeStandby returns the standby QEMU (nil when there is none) and forgets it: the caller uses it or
// drops it. Called under op, after settle.
func (b *Backend) takeStandby() *instance {
	b.mu.Lock()
	defer b.mu.Unlock()
	sb := b.standby
	b.standby = nil
	return sb
}

// usableStandby takes the standby QEMU if one waits and can take the snapshot (standbyFits); one that
// cannot is dropped, and gone, before it returns nil. Called under op, after settle.
func (b *Backend) usableStandby(ctx context.Context) *instance {
	sb := b.takeStandby()
	if sb != nil && !b.standbyFits(ctx, sb) {
		b.log.Info("standby qemu unusable (gone, or not on this snapshot); starting a new one")
		b.dropStandby(sb)
		return nil
	}
	return sb
}

// dropStandby kills sb (nil: none) and waits until it is gone, so its lock on the RAM file and the
// forwarded port are free again.
func (b *Backend) dropStandby(sb *instance) {
	if sb != nil {
		b.discard(sb)
	}
}

// standbyFits reports whether sb can take the snapshot the route has: alive and waiting for the
// migration (asked over QMP: a standby killed moments ago may not have been noticed yet, and a restore
// into it would fail and set the snapshot aside), and either on the route's RAM file (which it must
// hold) with a device state saved, or, without a RAM file, on a route whose guest RAM is not a file (a
// copied snapshot).
func (b *Backend) standbyFits(ctx context.Context, sb *instance) bool {
	if sb.isGone() || !alive(sb.pid) {
		return false
	}
	qctx, cancel := context.WithTimeout(ctx, b.s.Budgets.QMP.D())
	defer cancel()
	if st, err := sb.queryStatus(qctx); err != nil || st != "inmigrate" {
		return false
	}
	if !sb.ramFile {
		return !b.ram.file
	}
	if _, err := os.Stat(b.devPath()); err != nil {
		return false
	}
	return holdsFile(sb.pid, b.ramPath())
}
