package exec

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"syscall"

	"github.com/activator/activator/internal/backend/exec/shim/native"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// A standby (`standby: true`) is the route's next child, started with the route (Prepare, before its
// first wake) and at each sleep, and stopped before its exec: the shim (the native shim; without it
// /bin/sh, or package shim where a shell would change what the tenant sees) is cloned into the
// tenant's next cgroup with the tenant's environment and files, and blocks reading a pipe, the gate. A
// wake writes a line to the gate and the shim execs the tenant, keeping its pid. What a cold wake then
// no longer does on its way to the tenant's exec is the cgroup's mkdir, the command line and
// environment, the pipes, the clone and the shim's own start (the kvm backing's standby QEMU is the
// same idea).
//
// What it costs: while the route sleeps, one waiting process (the native shim: 16 KiB RSS; a dash:
// 1.7 MiB, 0.1 MiB of it its own) in the tenant's cgroup, counted against its pids_max and
// memory_max; at most maxStandbys in one activator. Like a running tenant, it holds a thread of the
// activator's only among the first maxDedicated children (fork.go).
//
// What it changes nothing about: the foreign-listener check runs at the wake, as without a standby;
// the secrets scrubbed from the environment are those of the wake (a standby started before a reload
// that names another secret is dropped, not released); a reload that removes or changes the route
// makes a new Backend, and Close kills the old one's standby (whose last sleep, marked
// tenant.LastSleep, starts none); a standby that died while the route slept (killed, the OOM killer)
// is noticed at the wake, which spawns as if there were none.
type standby struct {
	p    *proc
	gate *os.File // the write end of the gate pipe; the child holds the read end
	at   string   // when it was started, for the wake's note: "at the last sleep", "with the route"
}

// maxStandbys bounds the standbys waiting at once in one activator. Each is a process kept for a
// sleeping route, in the kernel's process table and memory (page tables, a stack, its share of the
// host's pid_max) however little RSS it has of its own: a config of 100,000 routes with standby must
// not keep 100,000 idle processes. A sleep beyond the bound starts no standby and says so.
const maxStandbys = 1000

// errStandbyDropped ends the Life of a standby that a wake did not use.
var errStandbyDropped = errors.New("exec: standby dropped")

// prepareStandby starts the standby after a sleep has stopped the tenant, or before the route's first
// wake (Prepare); at says which, for the wake's note. A failure is logged, not returned: the sleep
// succeeded, and the next wake spawns as it would without standby.
func (b *Backend) prepareStandby(ctx context.Context, at string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.standby != nil || (b.proc != nil && !b.proc.exited()) {
		return // a wake since the sleep has a child running already
	}
	if !b.countStandby(1) {
		b.logger().Warn("no standby; the next wake spawns", "err", fmt.Sprintf("%d standbys wait already, the most one activator keeps (each is a process kept while its route sleeps)", maxStandbys))
		return
	}
	r, w, err := pipe(false) // the gate: the shim's read blocks until the wake writes
	if err != nil {
		b.countStandby(-1)
		b.logger().Warn("no standby; the next wake spawns", "err", err)
		return
	}
	p, err := b.spawnLocked(ctx, r)
	r.Close() // the child has its own
	if err != nil {
		b.countStandby(-1)
		w.Close()
		b.logger().Warn("no standby; the next wake spawns", "err", err)
		return
	}
	b.standby = &standby{p: p, gate: w, at: at}
	b.logger().Info("standby started", "pid", p.pid)
}

// Prepare starts the standby of the route's first wake (tenant.Preparer), with standby: true: the
// activator calls it when the route starts asleep, so the first wake after start-up or a reload is
// as quick as one after a sleep. As there, a failure is logged and the wake spawns; with a child
// running already (a wake came first) or after Close it does nothing.
func (b *Backend) Prepare(ctx context.Context) {
	if b.NeedsPrepare() {
		b.prepareStandby(ctx, "with the route")
	}
}

// NeedsPrepare reports whether the route has standby: true (tenant.Preparer).
func (b *Backend) NeedsPrepare() bool { return b.settings.Standby }

// countStandby adds d (1 or −1) to the standbys waiting, and reports false, undoing it, when one
// more would exceed maxStandbys.
func (b *Backend) countStandby(d int64) bool {
	if b.standbys == nil {
		return true
	}
	if b.standbys.Add(d) > maxStandbys {
		b.standbys.Add(-1)
		return false
	}
	return true
}

// releaseStandbyLocked lets the standby exec the tenant and returns it, or returns nil when there is
// none or it cannot be used (it is dropped, and t told why), for the caller to spawn instead.
func (b *Backend) releaseStandbyLocked(ctx context.Context, t tenant.Tracker) *proc {
	sb := b.standby
	if sb == nil {
		return nil
	}
	b.standby = nil
	b.countStandby(-1)
	p := sb.p
	var why string
	switch {
	case p.exited():
		why = "it exited while the route slept"
	case !sameNames(p.secrets, b.secretNames()):
		why = "the config names other secrets than when it started"
	default:
		p.mu.Lock()
		p.standby = false
		p.mu.Unlock()
		_, err := sb.gate.Write([]byte{'\n'})
		if err == nil {
			sb.gate.Close()
			t.Note(fmt.Sprintf("released the standby started %s (pid %d)", sb.at, p.pid))
			return p
		}
		p.mu.Lock()
		p.standby = true
		p.mu.Unlock()
		why = fmt.Sprintf("its gate: %v", err)
	}
	t.Note(fmt.Sprintf("the standby (pid %d) was not used: %s; spawning", p.pid, why))
	b.logger().Warn("standby not used; spawning", "pid", p.pid, "why", why)
	if err := b.dropStandby(ctx, sb, errStandbyDropped); err != nil {
		b.logger().Error("drop the standby", "pid", p.pid, "err", err)
	}
	return nil
}

// dropStandby kills a standby and waits until it is reaped and its cgroup removed.
func (b *Backend) dropStandby(ctx context.Context, sb *standby, why error) error {
	err := b.stop(ctx, sb.p, syscall.SIGKILL, 0, why)
	sb.gate.Close()
	return err
}

// sameNames reports whether a and b hold the same names, in any order.
func sameNames(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}

// secretNames is Options.SecretEnv's list now, or nil.
func (b *Backend) secretNames() []string {
	if b.secrets == nil {
		return nil
	}
	return b.secrets()
}

// Notes says what a route's standby costs, and when a route that needs a shim cannot have the native
// one, why (tenant.Noter).
func (p *Provider) Notes(_ context.Context, r *registry.Route) []string {
	s, ok := r.Settings.(*Settings)
	if !ok || s == nil || !needsShim(s) {
		return nil
	}
	p.mu.Lock()
	n, nerr := p.nativeLocked(), p.nativeErr
	p.mu.Unlock()
	var notes []string
	if n == nil && nerr != nil && !errors.Is(nerr, native.ErrUnsupported) {
		notes = append(notes, "shim: the native shim is unavailable here ("+nerr.Error()+"); this route's children start through /bin/sh or the activator's own binary, about 0.8 ms or 3 ms more per listen_fds wake")
	}
	if !s.Standby {
		return notes
	}
	holder := "the activator's shim"
	switch {
	case n != nil:
		holder = "the native shim (" + native.Name + ", 16 KiB RSS)"
	case binSh() != "" && s.Argv[0] == s.Path:
		holder = "a /bin/sh (the activator's shim where the environment has names a shell does not pass on)"
	}
	return append(notes, "standby: while the route sleeps, "+holder+" waits in the tenant's next cgroup, one process; a wake lets it exec the tenant")
}

var _ tenant.Noter = (*Provider)(nil)
