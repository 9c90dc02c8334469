// Package kvm is the activator's QEMU backing: each route is one guest, launched and owned by the
// backend as a qemu-system-x86_64 process and driven over one QMP monitor (go-qemu).
//
// A guest sleeps in one of three modes: pause (QMP stop; wake is cont, in milliseconds), snapshot (the
// guest's state saved in the snapshot dir, QEMU quits; wake starts QEMU with -incoming and loads it)
// and poweroff (ACPI power button, QEMU quits; wake is a cold boot). A snapshot holds only the device
// state when the guest's RAM is a shared file of the route's (ramfile.go), else RAM and device state.
// QEMU daemonizes, its pid file and QMP socket live in the route's private runtime dir, so a restarted
// activator adopts a guest that is still running (Adopt). Guests do not outlive the activator's shutdown (Close quits them) unless
// keep_running_on_exit is set.
package kvm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/activator/activator/internal/foreign"
	"github.com/activator/activator/internal/privdir"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// Phase names reported to the Tracker during a wake.
const (
	PhaseQEMUStart = "qemu_start" // spawn QEMU until it has daemonized
	PhaseQMP       = "qmp"        // connect the QMP monitor
	PhaseRestore   = "restore"    // load the snapshot (snapshot mode)
	PhaseRunning   = "running"    // cont, until the guest runs
)

// ErrClosed ends the Life of a guest that Close stopped (or left running).
var ErrClosed = errors.New("kvm backend closed")

// Options configure the Provider.
type Options struct {
	// Logger receives the backing's logs, scoped per route (default: discard).
	Logger *slog.Logger
}

// The contract this backing keeps, checked by the compiler: were a method's signature to drift, the
// activator would silently stop finding the ability.
var (
	_ tenant.Opener  = (*Provider)(nil)
	_ tenant.Checker = (*Provider)(nil)
	_ tenant.Backend = (*Backend)(nil)
	_ tenant.Stopper = (*Backend)(nil)
	_ tenant.Adopter = (*Backend)(nil)
	_ tenant.Closer  = (*Backend)(nil)
)

// Provider opens kvm routes. It keeps the backends it opened until they close, so that one route's
// backend never cleans up a snapshot dir another open route names (leftover.go).
type Provider struct {
	log *slog.Logger

	mu   sync.Mutex            // guards open
	open map[*Backend]struct{} // opened and not closed yet
}

// New returns a Provider.
func New(o Options) *Provider {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Provider{log: log, open: map[*Backend]struct{}{}}
}

// ownerOf names the route of a backend p opened and has not seen close, other than self, whose
// snapshot_dir is dir ("" when none). p may be nil (a Backend built by hand): none.
func (p *Provider) ownerOf(dir string, self *Backend) string {
	if p == nil {
		return ""
	}
	dir = filepath.Clean(dir)
	p.mu.Lock()
	defer p.mu.Unlock()
	for b := range p.open {
		if b != self && filepath.Clean(b.s.SnapshotDir) == dir {
			return b.name
		}
	}
	return ""
}

// closed forgets b, which Close has closed.
func (p *Provider) closed(b *Backend) {
	if p == nil {
		return
	}
	p.mu.Lock()
	delete(p.open, b)
	p.mu.Unlock()
}

// Open returns the route's Backend. r.Settings must be the *Settings Decode returned. Open starts
// no guest; the accelerator and, in snapshot mode, where the guest's RAM lives are chosen here (and
// logged with the reasons), and a snapshot on disk that the route's config does not use (an earlier
// snapshot_dir's, or a RAM file the sleep mode has no use for) is logged, kept until the guest boots
// or is restored (leftover.go).
func (p *Provider) Open(r *registry.Route) (tenant.Backend, error) {
	s, ok := r.Settings.(*Settings)
	if !ok || s == nil {
		return nil, fmt.Errorf("kvm: route %q has no kvm settings (got %T)", r.Name, r.Settings)
	}
	bin, err := exec.LookPath(s.QEMU)
	if err != nil {
		return nil, tenant.Terminal(fmt.Errorf("kvm: qemu binary: %w", err))
	}
	// Made now, private, so that nobody else can make them or anything in them before the backing
	// reads them (a pid file, the record of snapshot dirs, a snapshot to resume).
	if err := dirsPrivate(s, privdir.Make); err != nil {
		return nil, tenant.Terminal(err)
	}
	log := p.log.With("route", r.Name, "backing", "kvm")
	accel, reason := chooseAccel(s.Accel, readHostFacts())
	log.Info("kvm accelerator chosen", "accel", accel, "reason", reason)
	var ram ramPlan
	if s.Sleep == SleepSnapshot {
		ram = planRAM(s, readRAMHost(context.Background(), bin, s))
		log.Info("kvm snapshot RAM chosen", "ram", ram.mode(), "reason", ram.reason)
	}
	b := &Backend{name: r.Name, s: s, p: newPaths(s), bin: bin, accel: accel, ram: ram, log: log, prov: p}
	b.sayLeft()
	p.mu.Lock()
	p.open[b] = struct{}{}
	p.mu.Unlock()
	return b, nil
}

// Check verifies, without starting a guest, that the host can run the route's guest: the QEMU
// binary, the boot files, zstd for compressed snapshots, /dev/kvm when accel is kvm, and, in snapshot
// mode, where the guest's RAM lives (logged with the reason, as Open does) and that a configured
// snapshot_ram: file can be had. All it reports is terminal: the host or the route's settings must
// change.
func (p *Provider) Check(ctx context.Context, r *registry.Route) error {
	s, ok := r.Settings.(*Settings)
	if !ok || s == nil {
		return tenant.Terminal(fmt.Errorf("no kvm settings (got %T)", r.Settings))
	}
	var errs []error
	bin, err := exec.LookPath(s.QEMU)
	if err != nil {
		errs = append(errs, fmt.Errorf("qemu: %w", err))
	}
	if err := bootFiles(s); err != nil {
		errs = append(errs, err)
	}
	if err := dirsPrivate(s, privdir.CheckIfExists); err != nil {
		errs = append(errs, err)
	}
	if s.Sleep == SleepSnapshot && s.SnapshotCompress == "zstd" {
		if _, err := exec.LookPath("zstd"); err != nil {
			errs = append(errs, fmt.Errorf("snapshot_compress zstd: %w", err))
		}
	}
	if s.Accel == AccelKVM {
		if h := readHostFacts(); h.devKVM != nil {
			errs = append(errs, fmt.Errorf("accel kvm: %w", h.devKVM))
		}
	}
	if s.Sleep == SleepSnapshot && bin != "" {
		h := readRAMHost(ctx, bin, s)
		plan := planRAM(s, h)
		p.log.Info("kvm snapshot RAM chosen", "route", r.Name, "backing", "kvm", "ram", plan.mode(), "reason", plan.reason)
		if why := h.problem(s.SnapshotDir); s.SnapshotRAM == RAMFile && why != "" {
			errs = append(errs, fmt.Errorf("snapshot_ram file: %s", why))
		}
	}
	return tenant.Terminal(errors.Join(errs...))
}

// Notes says which snapshot mode a snapshot route gets on this host, and why (tenant.Noter): the RAM
// file, or a copy of the RAM into the snapshot; with standby, what the standby QEMU costs; and, for a
// guest on QEMU's user network that is not restricted, what it can reach on the host.
func (p *Provider) Notes(ctx context.Context, r *registry.Route) []string {
	s, ok := r.Settings.(*Settings)
	if !ok || s == nil {
		return nil
	}
	notes := snapshotNotes(ctx, s)
	if s.Network.Mode == NetUser && !s.Network.Restrict {
		notes = append(notes, "network: the guest reaches the host's loopback through QEMU's user network (10.0.2.2 is the host's 127.0.0.1): an admin API there without admin_token_file, the edge and other tenants' ports; set network.restrict: true to isolate it (it then reaches nothing outside either)")
	}
	return notes
}

// snapshotNotes is Notes for a snapshot route: its RAM mode and, with standby, its cost.
func snapshotNotes(ctx context.Context, s *Settings) []string {
	if s.Sleep != SleepSnapshot {
		return nil
	}
	bin, err := exec.LookPath(s.QEMU)
	if err != nil {
		return nil // Check reports it
	}
	plan := planRAM(s, readRAMHost(ctx, bin, s))
	notes := []string{fmt.Sprintf("snapshot RAM: %s (%s)", plan.mode(), plan.reason)}
	if s.Standby {
		cost := "one idle QEMU"
		if s.Network.Mode == NetUser {
			cost += ", holding the forwarded port"
		}
		notes = append(notes, "standby: a QEMU waits with -incoming defer while the guest sleeps ("+cost+"), started at each snapshot sleep and, for a snapshot left on disk, at start-up; a wake loads the snapshot into it")
	}
	return notes
}

var _ tenant.Noter = (*Provider)(nil)

// Backend is one route's guest. The activator serialises Wake, Sleep, Adopt and Close; the backend
// serialises them too (op), and its instance's goroutines report QEMU's end through instanceGone.
type Backend struct {
	name  string
	s     *Settings
	p     paths
	bin   string
	accel string
	ram   ramPlan // snapshot mode: where the guest's RAM lives
	log   *slog.Logger
	prov  *Provider // the Provider that opened it (nil when built by hand)

	op sync.Mutex     // serialises Wake, Sleep, Adopt and Close
	wg sync.WaitGroup // instance goroutines; joined by Close

	mu      sync.Mutex   // guards the fields below
	inst    *instance    // the QEMU process (running or paused), nil when none
	life    *tenant.Life // the current wake's Life, nil while asleep
	standby *instance    // standby: true: the QEMU waiting for the next restore (standby.go), nil when none
	closed  bool

	retiring chan struct{} // closed once the QEMU the last snapshot sleep quit is gone (retire); guarded by op
	lost     string        // why retire lost the last snapshot, for the next wake's record; guarded by op after settle
	begun    bool          // an Adopt or a Wake has run, so what an earlier activator left is settled; guarded by op

	gen      sync.Mutex // guards savedGen and the RAM file's sidecar (ramfile.go)
	savedGen string     // the generation of the last save while it may still be resumed; "" once a QEMU maps the RAM file again

	dirsMu   sync.Mutex // guards dirNoted and the route's record of snapshot dirs (leftover.go)
	dirNoted bool       // the snapshot dir is in the record
}

var (
	_ tenant.Backend   = (*Backend)(nil)
	_ tenant.Adopter   = (*Backend)(nil)
	_ tenant.Closer    = (*Backend)(nil)
	_ tenant.Preparer  = (*Backend)(nil)
	_ tenant.Forgetter = (*Backend)(nil)
)

// Wake brings the guest up: an awake guest returns its Life at once; a paused one is continued, under
// a new Life (a guest paused under a Life that has not ended, which a sleep that failed half-way
// leaves, counts as paused: that Life ends); in snapshot mode the snapshot is restored (a missing,
// refused or unusable one falls back to a cold boot, with the reason noted); otherwise QEMU boots the
// guest. It first waits for the QEMU the last snapshot sleep quit to be gone (settle). Wake returns
// once the guest runs; the health gate is the activator's. A failed Wake leaves no QEMU running.
func (b *Backend) Wake(ctx context.Context, t tenant.Tracker) (*tenant.Life, error) {
	b.op.Lock()
	defer b.op.Unlock()
	b.begun = true
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("kvm wake: %w", err)
	}
	b.mu.Lock()
	inst, life, closed := b.inst, b.life, b.closed
	b.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if err := b.settle(ctx); err != nil {
		return nil, fmt.Errorf("kvm wake: %w", err)
	}
	if inst != nil && life != nil {
		if st, _ := inst.state(); st == "running" && life.Err() == nil {
			return life, nil
		}
		// A guest that does not run is not awake, whatever its Life says: a pause that failed
		// half-way (the guest stopped, the wait for it did not end) leaves exactly that. That
		// Life is over; the guest is continued under a new one.
		t.Note("guest not running under its Life (a sleep that failed half-way?): continuing it")
		b.asleep(inst, false)
	}
	if inst != nil {
		if st, _ := inst.state(); st != "" {
			t.Note("guest found with QMP status " + st) // the last observed state, for explain
		}
		life, err := b.resume(ctx, t, inst)
		if err == nil {
			return life, nil
		}
		b.log.Warn("resuming the paused guest failed; booting a new one", "err", err)
		t.Note(fmt.Sprintf("resume failed (%v): booting a new guest", err))
		b.discard(inst)
		if ctx.Err() != nil {
			return nil, err
		}
	}
	// A standby QEMU (standby.go) is settled first: one that cannot take the snapshot is dropped, and
	// gone, before the port is checked; one that can holds the port, as ours.
	sb := b.usableStandby(ctx)
	if err := b.checkForeign(ctx, sb); err != nil {
		b.dropStandby(sb)
		return nil, err
	}
	if b.s.Sleep == SleepSnapshot {
		if life, err := b.restoreOrExplain(ctx, t, sb); life != nil || err != nil {
			return life, err
		}
	} else {
		b.dropStandby(sb)
	}
	return b.boot(ctx, t)
}

// restoreOrExplain restores the guest's snapshot. When there is none, or it is refused or does not
// load, it notes why in the wake record and returns neither a Life nor an error: the wake boots
// instead. It returns the errors a boot would meet too (ctx ended, the RAM file held by another QEMU).
func (b *Backend) restoreOrExplain(ctx context.Context, t tenant.Tracker, sb *instance) (*tenant.Life, error) {
	life, err := b.restore(ctx, t, sb)
	lost := b.lost
	b.lost = ""
	var re *refusedError
	switch {
	case err == nil:
		return life, nil
	case ctx.Err() != nil || errors.Is(err, errRAMBusy):
		return nil, err
	case errors.Is(err, errNoSnapshot) && lost != "":
		t.Note(lost + ": cold boot")
	case errors.Is(err, errNoSnapshot):
		t.Note("no snapshot file: cold boot")
	case errors.As(err, &re) && re.savedBy != "":
		b.log.Warn("snapshot refused: another route saved it; cold boot instead", "saved_by", re.savedBy, "err", err)
		t.Note(fmt.Sprintf("%v: cold boot instead", err))
	case errors.As(err, &re):
		b.log.Warn("snapshot refused; cold boot instead", "err", err)
		t.Note(fmt.Sprintf("%v: cold boot instead", err))
	default:
		b.log.Warn("snapshot restore failed; cold boot instead", "err", err)
		t.Note(fmt.Sprintf("snapshot restore failed (%v): cold boot instead", err))
	}
	return nil, nil
}

// checkForeign fails a wake that would launch QEMU when something else already answers on the
// guest's forwarded host port (foreign.Check): the host-forward would fail, or the stranger answer for
// the guest. It runs once per wake, before any QEMU of ours is launched (an orphan of this route is
// reaped first): a restore that fails leaves a QEMU child (its exec: reader) holding the port for a
// moment after QEMU is gone, which the cold boot that follows must not take for a stranger.
// The standby QEMU sb (nil: none) holds the port while it waits: that holder is ours.
func (b *Backend) checkForeign(ctx context.Context, sb *instance) error {
	if b.s.Network.Mode != NetUser {
		return nil
	}
	b.reapOrphan(sb)
	var ours []int
	if sb != nil {
		ours = append(ours, sb.pid)
	}
	addr := net.JoinHostPort(b.s.hostAddr, strconv.Itoa(b.s.hostPort))
	if err := foreign.Check(ctx, "tcp", addr, ours...); err != nil {
		return fmt.Errorf("kvm wake: qemu not launched: %w", err)
	}
	return nil
}

// resume continues a paused guest.
func (b *Backend) resume(ctx context.Context, t tenant.Tracker, inst *instance) (*tenant.Life, error) {
	tenant.PhaseWithin(t, PhaseRunning, b.s.Budgets.Running.D())
	if err := b.running(ctx, t, inst, true); err != nil {
		return nil, err
	}
	return b.awake(inst)
}

// boot cold-boots a new guest; in file mode on a fresh RAM file.
//
// A cold boot supersedes every snapshot the route has saved, in whatever mode saved it (unless the
// route keeps its snapshot by design, keep_snapshot): from here on the guest's disk moves on, and a
// later wake in snapshot mode must not resume the memory of an older boot. Found with reloads from
// snapshot to poweroff and back: the guest resumed the RAM of two boots before, over a disk the boots
// since had written. So it also removes a RAM file this config does not use, and, once the guest runs,
// what the route left in its earlier snapshot dirs (leftover.go).
func (b *Backend) boot(ctx context.Context, t tenant.Tracker) (*tenant.Life, error) {
	var l launch
	if b.ram.file {
		ram, err := b.freshRAM()
		if err != nil {
			return nil, fmt.Errorf("%s: qemu not launched: %w", PhaseQEMUStart, err)
		}
		l.ram = ram
	}
	if !b.s.KeepSnapshot {
		had := b.savedSnapshot()
		if err := b.removeSnapshots(); err != nil {
			if l.ram != nil {
				l.ram.Close()
			}
			return nil, fmt.Errorf("%s: qemu not launched: remove the route's old snapshot: %w", PhaseQEMUStart, err)
		}
		if had != "" && b.s.Sleep != SleepSnapshot {
			// The route slept by snapshot before a reload changed its sleep mode: the saved memory is
			// gone with this boot, and the record says so (found by an operator trial: it did not).
			t.Note(fmt.Sprintf("discarded the snapshot %s that an earlier sleep: snapshot left: this route now sleeps by %s, and a cold boot supersedes it", had, b.s.Sleep))
		}
	}
	b.dropUnusedRAM("cold-boots")
	inst, err := b.start(ctx, t, l)
	if err != nil {
		return nil, err
	}
	tenant.PhaseWithin(t, PhaseRunning, b.s.Budgets.Running.D())
	if err := b.running(ctx, t, inst, false); err != nil {
		b.discard(inst)
		return nil, err
	}
	life, err := b.awake(inst)
	if err != nil {
		b.discard(inst)
		return nil, err
	}
	b.leaveOldDirs("cold-booted") // only now: a config that cannot boot the guest has not moved it on
	return life, nil
}

// running waits, within budgets.running, until QEMU reports the guest running; with cont it first
// continues the guest (instance.cont: QMP cont, and a wake-up for a guest that suspended itself to
// RAM as it was put to sleep, which t is told of).
func (b *Backend) running(ctx context.Context, t tenant.Tracker, inst *instance, cont bool) error {
	budget := b.s.Budgets.Running.D()
	rctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	inst.setWantRun(true)
	var st string // the guest's status, when cont has just asked for it
	if cont {
		var woke bool
		var err error
		st, woke, err = inst.cont(rctx)
		if err != nil {
			inst.setWantRun(false)
			last := func() string { return "QMP cont unanswered, " + guestState(inst) }
			return fmt.Errorf("%s: %w", PhaseRunning, overBudget(ctx, rctx, PhaseRunning, budget, last, err))
		}
		if woke {
			t.Note("the guest had suspended itself to RAM (ACPI S3) as it was put to sleep: woke it (system_wakeup)")
		}
	}
	var err error
	if st == "" {
		st, err = inst.queryStatus(rctx)
	}
	if err == nil && st != "running" {
		err = inst.waitFor(rctx, func(s, _ string) (bool, error) { return s == "running", nil })
	}
	if err != nil {
		err = overBudget(ctx, rctx, PhaseRunning, budget, func() string { return guestState(inst) }, fmt.Errorf("guest not running: %w", err))
		return fmt.Errorf("%s: %w", PhaseRunning, err)
	}
	return nil
}

// guestState is the guest's last run state as QEMU reported it: "guest still paused".
func guestState(inst *instance) string {
	if st, _ := inst.state(); st != "" {
		return "guest still " + st
	}
	return "guest state not reported yet"
}

// awake records inst as the running guest and returns its new Life, unless QEMU died meanwhile.
func (b *Backend) awake(inst *instance) (*tenant.Life, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if inst.isGone() {
		return nil, fmt.Errorf("qemu exited as the guest started: %w", inst.goneErr)
	}
	b.inst = inst
	b.life = tenant.NewLife()
	return b.life, nil
}

// start launches QEMU for l and connects its monitor. It closes l.ram (QEMU has its own descriptor).
func (b *Backend) start(ctx context.Context, t tenant.Tracker, l launch) (*instance, error) {
	if l.ram != nil {
		defer l.ram.Close()
	}
	budget := b.s.Budgets.QEMUStart.D()
	tenant.PhaseWithin(t, PhaseQEMUStart, budget)
	if err := bootFiles(b.s); err != nil {
		return nil, fmt.Errorf("%s: qemu not launched: %w", PhaseQEMUStart, err)
	}
	if err := privdir.Make(b.s.RuntimeDir); err != nil {
		return nil, fmt.Errorf("%s: runtime dir: %w", PhaseQEMUStart, err)
	}
	b.reapOrphan(nil)
	sctx, cancel := context.WithTimeout(ctx, budget)
	pid, err := spawn(sctx, b.bin, argv(b.name, b.s, b.p, b.accel, l), b.p, l.ram)
	err = overBudget(ctx, sctx, PhaseQEMUStart, budget, func() string { return starting(b.p) }, err)
	cancel()
	if err != nil {
		removeStale(b.p)
		return nil, fmt.Errorf("%s: %w", PhaseQEMUStart, err)
	}
	b.log.Info("qemu started", "qemu_pid", pid, "incoming", l.incoming, "ram_file", l.ram != nil, "accel", b.accel)

	tenant.PhaseWithin(t, PhaseQMP, b.s.Budgets.QMP.D())
	inst, err := b.attach(ctx, pid)
	if err != nil {
		_ = killAndWait(pid)
		removeStale(b.p)
		return nil, fmt.Errorf("%s: %w", PhaseQMP, err)
	}
	inst.ramFile = l.ram != nil
	return inst, nil
}

// attach connects the monitor of QEMU pid and starts the instance's goroutines, within budgets.qmp.
// A socket that refuses connections while QEMU comes up is dialed again until that budget ends.
func (b *Backend) attach(ctx context.Context, pid int) (*instance, error) {
	budget := b.s.Budgets.QMP.D()
	qctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	mon, err := dial(qctx, b.p.sock, &b.wg)
	if err != nil {
		last := func() string {
			return fmt.Sprintf("no QMP greeting on %s yet (last attempt: %v)", b.p.sock, lastAttempt(err))
		}
		return nil, overBudget(ctx, qctx, PhaseQMP, budget, last, err)
	}
	inst := newInstance(pid, mon, b.log, b.instanceGone, b.instanceStopped)
	inst.logs = []string{b.p.console, b.p.log}
	inst.start(&b.wg)
	if _, err := inst.queryStatus(qctx); err != nil {
		inst.detach()
		last := func() string { return "QMP connected, query-status unanswered" }
		return nil, overBudget(ctx, qctx, PhaseQMP, budget, last, err)
	}
	return inst, nil
}

// reapOrphan kills a QEMU of this route that runs without the backend knowing (one Adopt did not
// take), so the new one does not trip over its pid-file lock; stale files are removed. keep (nil:
// none) is a standby QEMU the wake will use (standby.go): the pid file and the QMP socket are its own.
func (b *Backend) reapOrphan(keep *instance) {
	pid, err := readPid(b.p.pid)
	if keep != nil && err == nil && pid == keep.pid {
		return
	}
	if err == nil && isOurQEMU(pid, b.p.sock) {
		b.log.Warn("killing an orphaned qemu of this route", "qemu_pid", pid)
		_ = killAndWait(pid)
	}
	removeStale(b.p)
}

// discard kills inst (if still running) and forgets it; its Life, if any, ends.
func (b *Backend) discard(inst *instance) {
	b.mu.Lock()
	if b.inst == inst {
		b.inst = nil
		if b.life != nil {
			b.life.End(errors.New("guest discarded after a failed wake"))
			b.life = nil
		}
	}
	b.mu.Unlock()
	if !inst.isGone() {
		inst.kill()
	}
	inst.close()
	removeStale(b.p)
}

// instanceGone is the instance's report that QEMU exited. For the current instance, it ends the Life
// with the reason and forgets the instance; deliberate stops forget it first, so this does nothing.
func (b *Backend) instanceGone(inst *instance, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inst != inst {
		return
	}
	b.inst = nil
	removeStale(b.p)
	b.log.Warn("guest stopped on its own", "err", err, "qemu_pid", inst.pid, "qemu_log", logTail(b.p.log, 500))
	if b.life != nil {
		b.life.End(err)
		b.life = nil
	}
}

// instanceStopped is the instance's report of a STOP the backend did not ask for: the guest no longer
// serves, so its Life ends; the next Wake continues it.
func (b *Backend) instanceStopped(inst *instance) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inst != inst || b.life == nil {
		return
	}
	b.log.Warn("guest paused behind the backend's back", "qemu_pid", inst.pid)
	b.life.End(errors.New("guest paused (QMP STOP) without a sleep"))
	b.life = nil
}

// Sleep puts the guest to sleep in the configured mode. A guest already asleep (paused, or no QEMU)
// is left as it is. If a snapshot cannot be written the guest is continued and the error returned.
func (b *Backend) Sleep(ctx context.Context) error {
	b.op.Lock()
	defer b.op.Unlock()
	b.mu.Lock()
	inst, life := b.inst, b.life
	b.mu.Unlock()
	if inst == nil || life == nil {
		return nil
	}
	var err error
	switch b.s.Sleep {
	case SleepPause:
		err = b.pause(ctx, inst)
	case SleepSnapshot:
		err = b.snapshot(ctx, inst)
	case SleepPoweroff:
		err = b.poweroff(ctx, inst)
	}
	if err != nil {
		return fmt.Errorf("kvm sleep (%s): %w", b.s.Sleep, err)
	}
	return nil
}

// Stop quits QEMU whatever the sleep mode (tenant.Stopper). The activator calls it after a wake
// whose guest never turned healthy: a broken guest must not be paused or snapshotted only to be resumed
// broken, nor be asked politely through ACPI. A standby QEMU is killed too (the snapshot stays); a
// guest with no QEMU is left as it is.
func (b *Backend) Stop(ctx context.Context) error {
	b.op.Lock()
	defer b.op.Unlock()
	b.mu.Lock()
	inst, sb := b.inst, b.standby
	b.standby = nil
	b.mu.Unlock()
	b.dropStandby(sb)
	if inst == nil {
		return nil
	}
	b.cutPower(ctx, inst)
	return nil
}

// cutPower ends the guest's Life and quits its QEMU (killed past budgets.quit), dropping the RAM file:
// nothing is saved, and the next wake boots.
func (b *Backend) cutPower(ctx context.Context, inst *instance) {
	b.asleep(inst, true)
	inst.setWantRun(false)
	inst.quit(ctx, b.s.Budgets.Quit.D())
	inst.close()
	removeStale(b.p)
	b.dropRAM()
}

// suspendedAtSleep reports whether the guest of a sleep that has stopped expecting it to run is
// suspended to RAM (ACPI S3): it suspended itself as the sleep began. A pause leaves such a guest as it
// is (the next wake wakes it: instance.cont). A snapshot and a power-off cannot: QEMU 7.2 resumes a
// snapshot of a suspended guest as a reset (TestGuestSuspendedAsItSlept), and a suspended guest
// hears no power button, so the sleep pressed it for all of budgets.powerdown and then reported a
// guest that ignored it. Those sleeps cut its power at once instead (cutPower), and say why in the
// sleep's record, forced: a suspending guest has written what it had, but its memory is lost.
func (b *Backend) suspendedAtSleep(ctx context.Context, inst *instance) bool {
	if st, err := inst.queryStatus(ctx); err != nil || st != "suspended" {
		return false
	}
	b.log.Warn("the guest had suspended itself to RAM (ACPI S3) as it was put to sleep: quitting its QEMU; the next wake boots it", "sleep", b.s.Sleep, "fix", suspendFix)
	tenant.NoteForcedSleep(ctx, fmt.Sprintf("the guest had suspended itself to RAM (ACPI S3) as it was put to sleep, which sleep: %s cannot save: QEMU quit; the next wake boots it", b.s.Sleep))
	b.cutPower(ctx, inst)
	return true
}

// pause stops the guest's CPUs; QEMU keeps its RAM.
func (b *Backend) pause(ctx context.Context, inst *instance) error {
	inst.setWantRun(false)
	if err := inst.mon.run(ctx, nil, "stop", nil); err != nil {
		inst.stopFailed(err)
		return err
	}
	if err := inst.waitFor(ctx, func(s, _ string) (bool, error) { return s != "running", nil }); err != nil {
		return err
	}
	if st, _ := inst.state(); st == "suspended" { // the stop did nothing: see instance.cont
		tenant.NoteSleep(ctx, "the guest had suspended itself to RAM (ACPI S3) as it was put to sleep: left so, its memory kept; the next wake wakes it")
	}
	b.asleep(inst, false)
	return nil
}

// asleep ends the current Life with ErrSlept; forget also drops the instance (QEMU is gone).
func (b *Backend) asleep(inst *instance, forget bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.life != nil {
		b.life.End(tenant.ErrSlept)
		b.life = nil
	}
	if forget && b.inst == inst {
		b.inst = nil
	}
}

// poweroff presses the ACPI power button, and again at each fifth of the powerdown budget (at least
// a second apart) while the guest runs, for up to the budget; then QEMU is told to quit (and killed
// past the quit budget). One press is not enough: a guest whose power-button handler (acpid,
// systemd-logind) starts after its web server can be woken, pass its gate and be put to sleep before
// it listens to the button, and the press is lost; QEMU's quit is then a cut of the power. OpenStack
// Nova presses again for the same reason (shutdown_retry_interval).
func (b *Backend) poweroff(ctx context.Context, inst *instance) error {
	inst.setWantRun(false)
	budget := b.s.Budgets.Powerdown.D()
	pctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	// Within the budget: a QEMU that answers nothing is quit after budgets.powerdown, as before, not
	// after the whole sleep_budget.
	if b.suspendedAtSleep(pctx, inst) {
		return nil
	}
	b.asleep(inst, true)
	began := time.Now()
	again := time.NewTicker(pressEvery(budget))
	defer again.Stop()
	presses := 0
	press := func() {
		if pctx.Err() != nil {
			return // the budget ended as the ticker fired: the quit below follows, not another press
		}
		presses++
		err := inst.mon.run(pctx, nil, "system_powerdown", nil)
		select {
		case <-inst.fatal: // the guest is powering off: the monitor may already be gone
		default:
			if err != nil && pctx.Err() == nil { // one cut short by the budget's end is not a failure
				b.log.Warn("system_powerdown failed", "press", presses, "err", err)
			}
		}
	}
	press()
	fatal := inst.fatal
wait:
	for {
		select {
		case <-inst.gone:
			took := time.Since(began).Round(time.Millisecond)
			b.log.Info("guest powered off", "presses", presses, "took", took)
			if presses > 1 {
				tenant.NoteSleep(ctx, fmt.Sprintf("the guest powered off %s after the first press of the power button, at press %d", took, presses))
			}
			break wait
		case <-fatal:
			// Shutting down (SHUTDOWN seen): no more presses; wait for QEMU's end, or the budget.
			fatal = nil
			again.Stop()
		case <-again.C:
			press()
		case <-pctx.Done():
			within := fmt.Sprintf("budgets.powerdown (%s)", budget)
			if ctx.Err() != nil {
				within = "the sleep's time (sleep_budget)"
			}
			b.log.Warn("guest did not power off in time; quitting qemu", "within", within, "presses", presses)
			tenant.NoteForcedSleep(ctx, fmt.Sprintf("the guest did not power off within %s, after %d presses of the power button: QEMU quit, cutting its power", within, presses))
			inst.quit(context.Background(), b.s.Budgets.Quit.D())
			break wait
		}
	}
	inst.close()
	removeStale(b.p)
	return nil
}

// pressEvery is how often poweroff presses the power button again within budget.
func pressEvery(budget time.Duration) time.Duration {
	return max(budget/5, time.Second)
}

// Adopt finds a QEMU of this route still running from an earlier activator (pid file and QMP socket
// in the runtime dir) and takes it over as it is: running is awake, paused is asleep. Stale files are
// removed; a QEMU in any other state is killed.
func (b *Backend) Adopt(ctx context.Context) (*tenant.Life, bool, error) {
	b.op.Lock()
	defer b.op.Unlock()
	b.begun = true
	pid, err := readPid(b.p.pid)
	if err != nil || !isOurQEMU(pid, b.p.sock) {
		if _, serr := os.Stat(b.p.sock); serr == nil || err == nil {
			b.log.Info("removing stale qemu runtime files", "dir", b.s.RuntimeDir)
		}
		removeStale(b.p)
		return nil, false, nil
	}
	inst, err := b.attach(ctx, pid)
	if err != nil {
		return nil, false, fmt.Errorf("adopt qemu pid %d: %w", pid, err)
	}
	st, _ := inst.state()
	inst.ramFile = holdsFile(pid, b.ramPath())
	if b.s.Sleep == SleepSnapshot && slices.Contains([]string{"running", "paused", "postmigrate", "suspended"}, st) {
		// The live guest supersedes a snapshot left from before (an activator that died mid-sleep),
		// and what the route left in its earlier snapshot dirs.
		_ = b.removeSnapshots()
		b.leaveOldDirs("was adopted running")
	}
	switch st {
	case "running":
		inst.setWantRun(true)
		life, err := b.awake(inst)
		if err != nil {
			inst.close()
			return nil, false, err
		}
		b.log.Info("adopted running guest", "qemu_pid", pid)
		return life, true, nil
	case "suspended":
		// The guest suspended itself to RAM while no activator watched it: see the SUSPEND event
		// (instance.handle). It is not resumed from the older snapshot either (removed above).
		b.log.Warn("adopted qemu's guest had suspended itself to RAM (ACPI S3) while no activator watched it; killing it: the next wake boots it", "qemu_pid", pid)
		inst.kill()
		inst.close()
		removeStale(b.p)
		return nil, false, nil
	case "paused", "postmigrate":
		b.mu.Lock()
		gone := inst.isGone()
		if !gone {
			b.inst = inst
		}
		b.mu.Unlock()
		if gone {
			inst.close()
			return nil, false, nil
		}
		b.log.Info("adopted paused guest", "qemu_pid", pid, "status", st)
		return nil, false, nil
	default:
		b.log.Warn("adopted qemu is in an unusable state; killing it", "qemu_pid", pid, "status", st)
		inst.kill()
		inst.close()
		removeStale(b.p)
		return nil, false, nil
	}
}

// Close quits the guest (its Life ends with ErrClosed) unless keep_running_on_exit is set, in which
// case the monitor is closed and QEMU left running for the next activator to adopt. A standby QEMU is
// killed either way (the snapshot stays for the next activator). The first Close logs the snapshot
// it leaves on disk (sayKept). Close joins every goroutine the backend started; later Wakes fail with
// ErrClosed.
func (b *Backend) Close(ctx context.Context) error {
	b.op.Lock()
	defer b.op.Unlock()
	b.mu.Lock()
	again := b.closed
	b.closed = true
	b.mu.Unlock()
	// The last sleep's retire may be starting a standby QEMU: let it finish, so the standby is
	// dropped below. (Should ctx end first, retire sees closed and drops the standby itself.)
	_ = b.settle(ctx)
	b.mu.Lock()
	inst, life, sb := b.inst, b.life, b.standby
	b.inst, b.life, b.standby = nil, nil, nil
	b.mu.Unlock()
	b.dropStandby(sb)
	if life != nil {
		life.End(ErrClosed)
	}
	if inst != nil {
		if b.s.KeepRunningOnExit {
			b.log.Info("leaving the guest running (keep_running_on_exit)", "qemu_pid", inst.pid)
			inst.detach()
		} else {
			inst.quit(ctx, b.s.Budgets.Quit.D())
			inst.close()
			removeStale(b.p)
			b.dropRAM()
		}
	}
	b.prov.closed(b)
	done := make(chan struct{})
	go func() {
		b.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		if !again {
			b.sayKept()
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("kvm close: %w", ctx.Err())
	}
}

// dirsPrivate applies check (privdir.Make, or privdir.CheckIfExists to change nothing) to
// runtime_dir and snapshot_dir, naming the key of each that fails: the backing trusts what it finds
// there (a pid file it signals, the record of snapshot dirs it cleans up, a snapshot it resumes), and
// the fallback under $TMPDIR is a path any local user can make first.
func dirsPrivate(s *Settings, check func(string) error) error {
	var errs []error
	for _, d := range []struct{ key, path string }{{"runtime_dir", s.RuntimeDir}, {"snapshot_dir", s.SnapshotDir}} {
		if err := check(d.path); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w (fix: a directory only this user and root can write, every step of the path to it too: a group-writable one is refused even for a private group)", d.key, err))
		}
	}
	return errors.Join(errs...)
}

// sinceMs is a log helper.
func sinceMs(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }
