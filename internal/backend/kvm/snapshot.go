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

// snapshot stops the guest, migrates its RAM and device state into the snapshot file, and quits QEMU.
// QEMU writes through `exec:` (cat or zstd, run by QEMU's /bin/sh); the writer writes a temp file and
// renames it once complete, so the snapshot file exists only when whole. If the snapshot fails, the
// guest is continued (it stays awake) and the error returned.
func (b *Backend) snapshot(ctx context.Context, inst *instance) error {
	started := time.Now()
	final, other := b.snapFile()
	tmp := final + ".tmp"
	if err := privateDir(b.s.SnapshotDir); err != nil {
		return fmt.Errorf("snapshot dir: %w", err)
	}
	for _, f := range []string{final, other, tmp} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove old snapshot: %w", err)
		}
	}

	inst.setWantRun(false)
	if err := inst.mon.run(ctx, nil, "stop", nil); err != nil {
		inst.setWantRun(true)
		return err
	}
	err := b.migrateOut(ctx, inst, tmp, final)
	if err != nil {
		_ = os.Remove(tmp)
		_ = os.Remove(final)
		b.rollback(inst)
		return err
	}

	b.asleep(inst, true)
	inst.quit(ctx, b.s.Budgets.Quit.D())
	inst.close()
	removeStale(b.p)
	fi, _ := os.Stat(final)
	var size int64
	if fi != nil {
		size = fi.Size()
	}
	b.log.Info("guest snapshot written", "file", final, "bytes", size, "ms", sinceMs(started))
	return nil
}

// migrateOut runs the outgoing migration into tmp and waits until the writer has renamed it to final
// and the file is on disk.
func (b *Backend) migrateOut(ctx context.Context, inst *instance, tmp, final string) error {
	caps := map[string]any{"capabilities": []map[string]any{{"capability": "events", "state": true}}}
	if err := inst.mon.run(ctx, nil, "migrate-set-capabilities", caps); err != nil {
		return err
	}
	if err := inst.mon.run(ctx, nil, "migrate-set-parameters", map[string]any{"max-bandwidth": maxBandwidth}); err != nil {
		return err
	}
	writer := "cat"
	if b.s.SnapshotCompress == "zstd" {
		writer = "zstd -q -1 -c"
	}
	// QEMU kills the writer (TERM, then KILL) shortly after closing its pipe; ignoring TERM gives the
	// writer time to flush, and the rename happens only after a complete write.
	uri := fmt.Sprintf("exec:trap '' TERM; %s > %s && mv -f %s %s", writer, shellQuote(tmp), shellQuote(tmp), shellQuote(final))
	if err := inst.mon.run(ctx, nil, "migrate", map[string]any{"uri": uri}); err != nil {
		return err
	}
	err := inst.waitFor(ctx, func(_, m string) (bool, error) {
		switch m {
		case "completed":
			return true, nil
		case "failed", "cancelled":
			return false, fmt.Errorf("migration %s", m)
		}
		return false, nil
	})
	if err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = inst.mon.run(cctx, nil, "migrate_cancel", nil)
			cancel()
		}
		if m := b.migrationError(inst); m != "" {
			err = fmt.Errorf("%w: %s", err, m)
		}
		return fmt.Errorf("snapshot: %w", err)
	}
	// The writer finishes moments after QEMU reports completion; bound the wait so a writer that was
	// killed (no file will come) fails the sleep without using up the whole sleep budget.
	wctx, cancel := context.WithTimeout(ctx, b.s.Budgets.Quit.D())
	defer cancel()
	if err := waitFile(wctx, final, tmp); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	return syncFile(final)
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
	if err := inst.mon.run(ctx, nil, "cont", nil); err == nil {
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

// syncFile flushes file and its directory to disk.
func syncFile(file string) error {
	for _, p := range []string{file, filepath.Dir(file)} {
		f, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("sync snapshot: %w", err)
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return fmt.Errorf("sync snapshot: %w", err)
		}
	}
	return nil
}

// restore starts QEMU waiting for a migration, loads the snapshot file into it and continues the guest.
// It returns an error wrapping errNoSnapshot when there is no file. A file that does not load is moved
// aside (".bad") so the next wake does not try it again.
func (b *Backend) restore(ctx context.Context, t tenant.Tracker) (*tenant.Life, error) {
	file, other := b.snapFile()
	if _, err := os.Stat(file); err != nil {
		if _, oerr := os.Stat(other); oerr != nil {
			return nil, fmt.Errorf("%w in %s", errNoSnapshot, b.s.SnapshotDir)
		}
		file = other
	}
	started := time.Now()
	inst, err := b.start(ctx, t, true)
	if err != nil {
		return nil, err
	}
	tenant.PhaseWithin(t, PhaseRestore, b.s.Budgets.Restore.D())
	if err := b.migrateIn(ctx, inst, file); err != nil {
		b.discard(inst)
		if msg := logTail(b.p.log, 300); msg != "" {
			err = fmt.Errorf("%w: qemu: %s", err, strings.ReplaceAll(msg, "\n", "; "))
		}
		if ctx.Err() == nil {
			if rerr := os.Rename(file, file+".bad"); rerr == nil {
				err = fmt.Errorf("%w (moved aside to %s.bad)", err, filepath.Base(file))
			}
		}
		return nil, fmt.Errorf("%s: %w", PhaseRestore, err)
	}
	life, err := b.resume(ctx, t, inst)
	if err != nil {
		b.discard(inst)
		return nil, err
	}
	if !b.s.KeepSnapshot {
		if err := os.Remove(file); err != nil {
			b.log.Warn("cannot remove the restored snapshot", "err", err)
		}
	}
	b.log.Info("guest restored from snapshot", "file", file, "ms", sinceMs(started))
	return life, nil
}

// migrateIn loads file into a QEMU started with -incoming defer, within budgets.restore.
func (b *Backend) migrateIn(ctx context.Context, inst *instance, file string) error {
	budget := b.s.Budgets.Restore.D()
	rctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	last := func() string {
		st, m := inst.state()
		return fmt.Sprintf("snapshot still loading (QMP status %s, migration %s)", or(st, "unknown"), or(m, "not started"))
	}
	return overBudget(ctx, rctx, PhaseRestore, budget, last, b.loadSnapshot(rctx, inst, file))
}

// loadSnapshot runs the incoming migration of file, until ctx ends.
func (b *Backend) loadSnapshot(ctx context.Context, inst *instance, file string) error {
	caps := map[string]any{"capabilities": []map[string]any{{"capability": "events", "state": true}}}
	if err := inst.mon.run(ctx, nil, "migrate-set-capabilities", caps); err != nil {
		return err
	}
	reader := "cat"
	if filepath.Ext(file) == ".zst" {
		reader = "zstd -q -d -c"
	}
	uri := fmt.Sprintf("exec:%s %s", reader, shellQuote(file))
	if err := inst.mon.run(ctx, nil, "migrate-incoming", map[string]any{"uri": uri}); err != nil {
		return err
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
