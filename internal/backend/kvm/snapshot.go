package kvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/activator/activator/internal/tenant"
)

// maxBandwidth lifts QEMU's migration bandwidth cap (32 MiB/s by default, which makes a RAM snapshot
// take seconds). Bytes per second.
const maxBandwidth = int64(1) << 40

// errNoSnapshot is wrapped by restore when there is no snapshot file to restore.
var errNoSnapshot = errors.New("no snapshot file")

// snapFile is the snapshot file for the configured compression; other is the file of the other
// compression (a leftover from a configuration change).
func (b *Backend) snapFile() (file, other string) {
	raw := filepath.Join(b.s.SnapshotDir, snapBase)
	zst := raw + ".zst"
	if b.s.SnapshotCompress == "zstd" {
		return zst, raw
	}
	return raw, zst
}

// snapshot stops the guest, migrates its state into the snapshot dir and has QEMU quit. A guest whose
// RAM is the route's RAM file saves its device state only (saveDevice), bound to the RAM file once
// QEMU has exited; any other guest saves RAM and device state into one file (saveCopy). Either file
// exists only when whole. Sleep returns once it is saved: QEMU's exit (10–20 ms) and the binding
// happen in retire, which the next Wake and Close wait for. If the snapshot fails, the guest is
// continued (it stays awake) and the error returned.
func (b *Backend) snapshot(ctx context.Context, inst *instance) error {
	started := time.Now()
	shared := b.ram.file && inst.ramFile
	if err := b.useSnapshotDir(); err != nil {
		return fmt.Errorf("snapshot dir: %w", err)
	}
	if err := b.removeSnapshots(); err != nil {
		return fmt.Errorf("remove old snapshot: %w", err)
	}

	inst.setWantRun(false)
	if err := inst.mon.run(ctx, nil, "stop", nil); err != nil {
		inst.stopFailed(err)
		return err
	}
	if b.suspendedAtSleep(ctx, inst) {
		return nil
	}
	var saved savedState
	var err error
	if shared {
		saved, err = b.saveDevice(ctx, inst)
	} else {
		saved, err = b.saveCopy(ctx, inst)
	}
	var bd *binding
	if err == nil && shared {
		bd, err = b.prepareBind(saved.dev)
	}
	if err != nil {
		_ = removeFiles(saved.file+".tmp", saved.file, saved.file+genExt)
		b.rollback(inst)
		return err
	}
	b.asleep(inst, true)
	b.retire(inst, saved, bd)
	b.log.Info("guest snapshot written", "file", saved.file, "bytes", saved.dev.Bytes, "ram", saved.mode(), "ms", sinceMs(started))
	return nil
}

// savedState is what a snapshot sleep saved: the file, and, in file mode, the device state's size and
// hash for its sidecar.
type savedState struct {
	file   string
	shared bool // the device state only: the RAM is in the RAM file
	dev    devSidecar
}

func (s savedState) mode() string {
	if s.shared {
		return RAMFile
	}
	return RAMCopy
}

// saveDevice saves the device state of a guest whose RAM is the RAM file: x-ignore-shared leaves the
// shared RAM out of the migration, which the backend receives itself (receiveDevice). Making it
// durable is left to syncSaved.
func (b *Backend) saveDevice(ctx context.Context, inst *instance) (savedState, error) {
	saved := savedState{file: b.devPath(), shared: true}
	caps := []map[string]any{{"capability": "events", "state": true}, {"capability": "x-ignore-shared", "state": true}}
	if err := inst.mon.run(ctx, nil, "migrate-set-capabilities", map[string]any{"capabilities": caps}); err != nil {
		return saved, err
	}
	deadline := time.Now().Add(b.s.Budgets.Quit.D())
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	dev, err := b.receiveDevice(ctx, inst, saved.file, deadline)
	if err != nil {
		return saved, b.migrationFailed(inst, err)
	}
	saved.dev = dev
	return saved, nil
}

// snapSidecar is a copied snapshot's sidecar (guest.snap.gen, or guest.snap.zst.gen): the snapshot's
// size and the guest's disk at the save (disk.go). A copied snapshot without one is not resumed.
type snapSidecar struct {
	Bytes int64   `json:"bytes"`
	Disk  *diskID `json:"disk"`
	Route string  `json:"route,omitempty"` // the route that saved it (checkOwner); "" from an activator before it
}

// saveCopy saves RAM and device state into the snapshot file, writes its sidecar, and flushes both to
// disk. QEMU writes through exec: (cat, or zstd when compressed, run by QEMU's /bin/sh) into a temp
// file the writer renames once complete.
func (b *Backend) saveCopy(ctx context.Context, inst *instance) (savedState, error) {
	final, _ := b.snapFile()
	saved := savedState{file: final}
	caps := map[string]any{"capabilities": []map[string]any{{"capability": "events", "state": true}}}
	if err := inst.mon.run(ctx, nil, "migrate-set-capabilities", caps); err != nil {
		return saved, err
	}
	if err := inst.mon.run(ctx, nil, "migrate-set-parameters", map[string]any{"max-bandwidth": maxBandwidth}); err != nil {
		return saved, err
	}
	writer := "cat"
	if b.s.SnapshotCompress == "zstd" {
		writer = "zstd -q -1 -c"
	}
	// QEMU kills the writer (TERM, then KILL) shortly after closing its pipe; ignoring TERM gives the
	// writer time to flush, and the rename happens only after a complete write. The writer's errors go
	// to the runtime dir, not the snapshot dir, which may be the full disk they are about: QEMU itself
	// only sees its pipe close ("Unable to write to command: Broken pipe").
	tmp := final + ".tmp"
	_ = os.Remove(b.p.writer)
	defer os.Remove(b.p.writer)
	uri := fmt.Sprintf("exec:trap '' TERM; %s > %s 2>%s && mv -f %s %s", writer, shellQuote(tmp), shellQuote(b.p.writer), shellQuote(tmp), shellQuote(final))
	if err := inst.migrate(ctx, "migrate", uri); err != nil {
		return saved, err
	}
	if err := waitMigrated(ctx, inst); err != nil {
		return saved, b.writerFailed(b.migrationFailed(inst, err))
	}
	// The writer finishes moments after QEMU reports completion; bound the wait so a writer that was
	// killed (no file will come) fails the sleep without using up the whole sleep budget.
	wctx, cancel := context.WithTimeout(ctx, b.s.Budgets.Quit.D())
	defer cancel()
	if err := waitFile(wctx, final, tmp); err != nil {
		return saved, b.writerFailed(fmt.Errorf("snapshot: %w", err))
	}
	fi, err := os.Stat(final)
	if err != nil {
		return saved, fmt.Errorf("snapshot: %w", err)
	}
	saved.dev.Bytes = fi.Size()
	disk, err := readDiskID(b.s.Disk)
	if err != nil {
		return saved, err
	}
	if err := writeSidecar(final+genExt, snapSidecar{Bytes: fi.Size(), Disk: disk, Route: b.name}); err != nil {
		return saved, fmt.Errorf("snapshot: %w", err)
	}
	if err := syncPaths(final, final+genExt, filepath.Dir(final)); err != nil {
		return saved, fmt.Errorf("sync snapshot: %w", err)
	}
	return saved, nil
}

// writerFailed adds to err what the copy-mode snapshot writer said, such as "cat: write error: No
// space left on device", when it said anything.
func (b *Backend) writerFailed(err error) error {
	if said := logTail(b.p.writer, 512); said != "" {
		return fmt.Errorf("%w (writing into %s: %s)", err, b.s.SnapshotDir, said)
	}
	return err
}

// migrationFailed cancels a migration that ran out of time and adds QEMU's reason to err.
func (b *Backend) migrationFailed(inst *instance, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = inst.mon.run(cctx, nil, "migrate_cancel", nil)
		cancel()
	}
	if m := b.migrationError(inst); m != "" {
		err = fmt.Errorf("%w: %s", err, m)
	}
	return fmt.Errorf("snapshot: %w", err)
}

// retire has the QEMU of a guest whose snapshot is saved quit (killed past budgets.quit), off the
// sleep's path, then, in file mode, puts the save's binding to the RAM file in place (commitBind needs
// QEMU gone: it holds the RAM file until it exits), or in copy mode removes a RAM file the guest had;
// with standby it then starts the standby QEMU (standby.go). b.retiring is closed once that is done;
// settle waits for it. A binding that cannot be put in place loses the snapshot, which b.lost keeps
// for the next wake's record. Called under op.
func (b *Backend) retire(inst *instance, saved savedState, bd *binding) {
	done := make(chan struct{})
	b.retiring = done
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer close(done)
		inst.quit(context.Background(), b.s.Budgets.Quit.D())
		inst.close()
		removeStale(b.p)
		b.leaveOldDirs("slept") // an adopted QEMU may have mapped an earlier snapshot dir's RAM file
		if !saved.shared {
			b.dropRAM() // a RAM file the guest had (adopted from file mode) is in the copy now
			if b.s.Standby && !b.ram.file {
				b.startStandby(context.Background(), false)
			}
			return
		}
		if err := b.commitBind(bd); err != nil {
			_ = removeFiles(saved.file)
			b.lost = fmt.Sprintf("the last sleep's snapshot was saved but could not be bound to its RAM file (%v)", err)
			b.log.Error("snapshot saved but not bound to its RAM file; the next wake boots", "err", err)
			return
		}
		if b.s.Standby {
			b.startStandby(context.Background(), true)
		}
	}()
}

// settle waits until the QEMU the last sleep retired is gone and its snapshot bound, or ctx ends.
// Called under op, before anything looks at the snapshot or starts a QEMU.
func (b *Backend) settle(ctx context.Context) error {
	if b.retiring == nil {
		return nil
	}
	select {
	case <-b.retiring:
		b.retiring = nil
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the last sleep's qemu to quit: %w", ctx.Err())
	}
}

// migrationError asks QEMU why the last migration failed ("" when it does not say).
func (b *Backend) migrationError(inst *instance) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var info struct {
		ErrorDesc string `json:"error-desc"`
	}
	if err := inst.mon.run(ctx, &info, "query-migrate", nil); err != nil {
		return ""
	}
	return info.ErrorDesc
}

// rollback continues a guest whose snapshot failed, so it stays awake; if that fails too, QEMU is
// killed and the Life ends.
func (b *Backend) rollback(inst *instance) {
	ctx, cancel := context.WithTimeout(context.Background(), b.s.Budgets.Running.D())
	defer cancel()
	inst.setWantRun(true)
	if _, _, err := inst.cont(ctx); err == nil {
		return
	} else {
		b.log.Warn("cannot continue the guest after a failed snapshot; killing it", "err", err)
	}
	b.discard(inst)
}

// waitFile waits (bounded by ctx) until the writer has renamed tmp to final. The writer is QEMU's
// child, so the file's appearance is the only signal.
func waitFile(ctx context.Context, final, tmp string) error {
	err := pollUntil(ctx, func() bool {
		_, err := os.Stat(final)
		return err == nil
	})
	if err != nil {
		return fmt.Errorf("snapshot writer did not finish %s: %w", tmp, err)
	}
	return nil
}

// syncPaths flushes each file or directory to disk.
func syncPaths(paths ...string) error {
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// snapshotSource is what restore loads: the migration stream QEMU reads, its sidecar (file mode), and
// the locked RAM file the guest's memory is mapped from (nil without a RAM file). shared: the RAM is
// in the RAM file, not in the stream.
type snapshotSource struct {
	file, side string
	ram        *os.File
	shared     bool
}

// restore starts QEMU waiting for a migration, loads the snapshot into it and continues the guest. It
// returns an error wrapping errNoSnapshot when there is nothing to restore, a *refusedError for a
// device state that must not be resumed on its RAM file. A snapshot that is refused or does not load
// is moved aside (moveAside: FILE.<time>.bad, the newest two kept) so the next wake does not try it
// again. A restored guest supersedes what the route left in its earlier snapshot dirs, and a RAM file
// its config does not use (leftover.go). sb (nil: none) is a standby QEMU that fits the snapshot
// (usableStandby): the snapshot loads into it instead of a new QEMU.
func (b *Backend) restore(ctx context.Context, t tenant.Tracker, sb *instance) (*tenant.Life, error) {
	src, err := b.findSnapshot(sb != nil && sb.ramFile)
	if err != nil {
		b.dropStandby(sb) // a cold boot follows, on a RAM file of its own
		return nil, err
	}
	started := time.Now()
	inst := sb
	if inst == nil {
		if inst, err = b.start(ctx, t, launch{incoming: true, ram: src.ram}); err != nil {
			return nil, err
		}
	}
	tenant.PhaseWithin(t, PhaseRestore, b.s.Budgets.Restore.D())
	if err := b.migrateIn(ctx, inst, src); err != nil {
		b.discard(inst)
		if msg := logTail(b.p.log, 300); msg != "" {
			err = fmt.Errorf("%w: qemu: %s", err, strings.ReplaceAll(msg, "\n", "; "))
		}
		if ctx.Err() == nil {
			err = b.moveAside(src, err)
		}
		return nil, fmt.Errorf("%s: %w", PhaseRestore, err)
	}
	life, err := b.resume(ctx, t, inst)
	if err != nil {
		b.discard(inst)
		return nil, err
	}
	if !b.s.KeepSnapshot {
		if err := removeFiles(src.file, src.side); err != nil {
			b.log.Warn("cannot remove the restored snapshot", "err", err)
		}
	}
	b.dropUnusedRAM("was restored")
	b.leaveOldDirs("was restored")
	b.log.Info("guest restored from snapshot", "file", src.file, "ram_file", src.shared || src.ram != nil, "standby", sb != nil, "ms", sinceMs(started))
	return life, nil
}

// findSnapshot picks what restore loads. In file mode that is the device state if there is one,
// checked against its RAM file (savedRAM; held: a standby QEMU holds the RAM file, and src.ram stays
// nil). Otherwise it is a copied snapshot, checked against its sidecar (checkCopy) and prefetched into
// the page cache while QEMU starts; in file mode its RAM is loaded into a fresh RAM file. Either is
// checked against the guest's disk (disk.go).
func (b *Backend) findSnapshot(held bool) (snapshotSource, error) {
	if b.ram.file {
		if _, err := os.Stat(b.devPath()); err == nil {
			src := snapshotSource{file: b.devPath(), side: b.devPath() + genExt, shared: true}
			ram, err := b.savedRAM(held)
			var re *refusedError
			if errors.As(err, &re) {
				err = b.moveAside(src, err)
			}
			src.ram = ram
			return src, err
		}
	}
	file, other := b.snapFile()
	if _, err := os.Stat(file); err != nil {
		if _, oerr := os.Stat(other); oerr != nil {
			return snapshotSource{}, fmt.Errorf("%w in %s", errNoSnapshot, b.s.SnapshotDir)
		}
		file = other
	}
	src := snapshotSource{file: file, side: file + genExt}
	if err := b.checkCopy(src); err != nil {
		return snapshotSource{}, b.moveAside(src, err)
	}
	if err := prefetch(file); err != nil {
		b.log.Debug("snapshot prefetch", "err", err)
	}
	if b.ram.file {
		ram, err := b.freshRAM()
		if err != nil {
			return snapshotSource{}, err
		}
		src.ram = ram
	}
	return src, nil
}

// checkCopy refuses a copied snapshot whose sidecar is missing or unreadable, whose size is not the
// size it was saved with, or whose disk has moved on since (*refusedError).
func (b *Backend) checkCopy(src snapshotSource) error {
	var side snapSidecar
	if err := readSidecar(src.side, &side); err != nil {
		return &refusedError{why: fmt.Sprintf("snapshot without a valid sidecar (%v)", err)}
	}
	if err := b.checkOwner(side.Route); err != nil {
		return err
	}
	fi, err := os.Stat(src.file)
	if err != nil {
		return &refusedError{why: fmt.Sprintf("snapshot unreadable (%v)", err)}
	}
	if fi.Size() != side.Bytes {
		return &refusedError{why: fmt.Sprintf("snapshot is %d bytes, saved as %d", fi.Size(), side.Bytes)}
	}
	if why := diskMoved(side.Disk, b.s.Disk); why != "" {
		return &refusedError{why: why}
	}
	return nil
}

// migrateIn loads src into a QEMU started with -incoming defer, within budgets.restore.
func (b *Backend) migrateIn(ctx context.Context, inst *instance, src snapshotSource) error {
	budget := b.s.Budgets.Restore.D()
	rctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	last := func() string {
		st, m := inst.state()
		return fmt.Sprintf("snapshot still loading (QMP status %s, migration %s)", or(st, "unknown"), or(m, "not started"))
	}
	return overBudget(ctx, rctx, PhaseRestore, budget, last, b.loadSnapshot(rctx, inst, src))
}

// loadSnapshot runs the incoming migration of src, until ctx ends.
func (b *Backend) loadSnapshot(ctx context.Context, inst *instance, src snapshotSource) error {
	caps := []map[string]any{{"capability": "events", "state": true}}
	if src.shared {
		caps = append(caps, map[string]any{"capability": "x-ignore-shared", "state": true})
	}
	if err := inst.mon.run(ctx, nil, "migrate-set-capabilities", map[string]any{"capabilities": caps}); err != nil {
		return err
	}
	if src.shared {
		if err := b.sendDevice(ctx, inst, src.file); err != nil {
			return err
		}
	} else {
		reader := "cat"
		if filepath.Ext(src.file) == ".zst" {
			reader = "zstd -q -d -c"
		}
		uri := fmt.Sprintf("exec:%s %s", reader, shellQuote(src.file))
		if err := inst.migrate(ctx, "migrate-incoming", uri); err != nil {
			return err
		}
	}
	return inst.waitFor(ctx, func(s, m string) (bool, error) {
		switch {
		case m == "completed":
			return true, nil
		case m == "failed" || m == "cancelled":
			return false, fmt.Errorf("loading the snapshot %s", m)
		case s != "" && s != "inmigrate":
			return true, nil
		}
		return false, nil
	})
}
