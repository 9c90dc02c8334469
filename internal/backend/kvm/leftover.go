package kvm

// What the backing leaves on disk, and until when.
//
// A route's snapshot dir holds its guest's RAM file (the guest's size) and snapshot. When a reload
// or a restart gives the route another snapshot_dir, or a sleep mode that uses none, those files
// were left for good (found by an operator trial). They are removed once the guest has moved on
// under the new config: its first cold boot or restore there supersedes them, as a cold boot
// supersedes the snapshot in its own dir (boot). Until then they are kept, and Open says so: a config
// switched back before that resumes them, if the disk identity check (disk.go) lets it. To know the
// earlier dirs, the backing records in the route's runtime dir every snapshot dir it writes into
// (dirsName) before it writes there. Only the names the backing writes are removed, only in a
// dir the route wrote into, and never in a dir another open route of this activator names as its
// snapshot_dir (registry.Owner keeps two routes of one config apart; a reload can hand one route's
// old dir to another).
//
// A route that a reload removes has no next backend to supersede its snapshot: the activator tells
// its backend so once it has closed (Forget), and the same rules decide what goes. One removed while
// the activator did not run is not known to the next activator (its runtime dir, where the record
// lives, is named by the config that no longer has it), and stays.
//
// A snapshot refused by the checks before a restore, or that QEMU could not load, is moved aside
// under a name of its own (the refusal's time), so a second refusal does not overwrite the evidence
// of the first; the newest keepRefused are kept, as one may be the guest's size.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/activator/activator/internal/privdir"
)

const (
	// dirsName is the route's record, in its runtime dir, of the snapshot dirs its backing has
	// written into and not yet emptied: its config's, and earlier ones.
	dirsName = "snapshot-dirs.json"
	// keepRefused is how many refused snapshots a snapshot dir keeps: the newest.
	keepRefused = 2
	// stampLayout names a refused snapshot by when it was moved aside: UTC, to the nanosecond, so
	// that names sort as their times do.
	stampLayout = "20060102T150405.000000000Z"
)

// snapshotFiles are the names the backing writes in a snapshot dir, refused snapshots aside: the RAM
// file, the device state, the copied snapshot in either compression, their sidecars and temp files.
var snapshotFiles = []string{
	ramBase, ramBase + genExt, ramBase + genExt + ".tmp",
	devBase, devBase + ".tmp", devBase + genExt, devBase + genExt + ".tmp",
	snapBase, snapBase + ".tmp", snapBase + genExt, snapBase + genExt + ".tmp",
	snapBase + ".zst", snapBase + ".zst.tmp", snapBase + ".zst" + genExt, snapBase + ".zst" + genExt + ".tmp",
}

// ramSnapshotFiles are those of a RAM-file snapshot: a guest whose RAM is no file (copy, or another
// sleep mode) has no use for them.
var ramSnapshotFiles = []string{ramBase, ramBase + genExt, devBase, devBase + genExt}

// dirsRecord is the content of dirsName.
type dirsRecord struct {
	SnapshotDirs []string `json:"snapshot_dirs"`
}

// readDirs reads the route's record of snapshot dirs (none when there is no record).
func (b *Backend) readDirs() []string {
	var rec dirsRecord
	err := readSidecar(b.p.dirs, &rec)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		b.log.Warn("kvm snapshot dir record unreadable: earlier snapshot dirs are not cleaned up", "file", b.p.dirs, "err", err)
	}
	return rec.SnapshotDirs
}

func (b *Backend) writeDirs(dirs []string) error {
	if err := privdir.Make(b.s.RuntimeDir); err != nil {
		return err
	}
	return writeSidecar(b.p.dirs, dirsRecord{SnapshotDirs: dirs})
}

// useSnapshotDir readies the snapshot dir for a write: it is recorded (once per backend) in the
// route's record, then created private. A record that cannot be written is logged: the write goes
// ahead, and only the cleanup of this dir after a later change of snapshot_dir is lost.
func (b *Backend) useSnapshotDir() error {
	b.dirsMu.Lock()
	if !b.dirNoted {
		b.dirNoted = true
		dirs, cur := b.readDirs(), filepath.Clean(b.s.SnapshotDir)
		if !slices.ContainsFunc(dirs, func(d string) bool { return filepath.Clean(d) == cur }) {
			if err := b.writeDirs(append(dirs, cur)); err != nil {
				b.log.Warn("kvm snapshot dir not recorded: should snapshot_dir change, its files will not be cleaned up", "dir", b.s.SnapshotDir, "err", err)
			}
		}
	}
	b.dirsMu.Unlock()
	return privdir.Make(b.s.SnapshotDir)
}

// leaveOldDirs removes what the backing left in the route's earlier snapshot dirs (its record's,
// other than the config's), now that the guest has moved on under this config (how: "cold-booted",
// "was restored", "was adopted running", "slept"). A dir that another open route names as its
// snapshot_dir is left alone and forgotten; one whose RAM file a QEMU still maps (an adopted guest of
// the earlier config) stays in the record, for the next time. Safe for concurrent use.
func (b *Backend) leaveOldDirs(how string) {
	b.dirsMu.Lock()
	defer b.dirsMu.Unlock()
	dirs := b.readDirs()
	cur := filepath.Clean(b.s.SnapshotDir)
	keep, changed := dirs[:0:0], false
	for _, dir := range dirs {
		if filepath.Clean(dir) == cur {
			keep = append(keep, dir)
			continue
		}
		switch owner := b.prov.ownerOf(dir, b); {
		case owner == b.name: // the route's backend under its earlier config, not closed yet
			keep = append(keep, dir)
			continue
		case owner != "":
			b.log.Info("kvm earlier snapshot_dir left as it is: another route's now", "dir", dir, "owner", owner)
			changed = true
			continue
		}
		if b.removeLeft(dir, "kvm snapshot files removed from an earlier snapshot_dir", fmt.Sprintf("the guest %s under snapshot_dir %s", how, cur)) {
			changed = true
		} else {
			keep = append(keep, dir)
		}
	}
	if changed {
		if err := b.writeDirs(keep); err != nil {
			b.log.Warn("kvm snapshot dir record not updated", "file", b.p.dirs, "err", err)
		}
	}
}

// removeLeft removes the backing's files from dir, a snapshot dir the route's backend wrote into and
// no longer uses (an earlier one, or any once the route is gone: Forget), and logs under msg what it
// removed, and what it kept: refused snapshots (evidence), a RAM file a QEMU maps, and files under the
// backing's names that it did not write (removeRegular). It reports whether nothing of the backing's
// is left to remove there.
func (b *Backend) removeLeft(dir, msg, why string) bool {
	names := snapshotFiles
	ram := filepath.Join(dir, ramBase)
	// Locked only when it is the backing's (never opened through a symlink); removeRegular names
	// one that is not as refused.
	if fi, err := os.Lstat(ram); err == nil && notOurs(fi) == "" {
		if f, err := lockRAM(ram, false); err == nil {
			defer f.Close() // held while the RAM file goes: no QEMU can map it meanwhile
		} else if !errors.Is(err, fs.ErrNotExist) {
			b.log.Warn("kvm RAM file kept: a QEMU maps it, or it cannot be locked; its dir stays in the route's record", "file", ram, "bytes", sizeOf(ram), "why", why, "err", err)
			names = slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == ramBase || n == ramBase+genExt })
		}
	}
	r := removeRegular(dir, names)
	if len(r.removed) > 0 || len(r.refused) > 0 {
		kept, _ := describe(dir, refusedIn(dir))
		b.log.Info(msg, "dir", dir, "removed", or(strings.Join(r.removed, ", "), "nothing"), "bytes", r.bytes, "why", why,
			"kept", or(kept, "nothing"), "refused", or(strings.Join(r.refused, ", "), "nothing"))
	}
	if r.err != nil {
		b.log.Warn("kvm snapshot files not all removed; the dir stays in the route's record", "dir", dir, "why", why, "err", r.err)
		return false
	}
	return len(names) == len(snapshotFiles)
}

// dropUnusedRAM removes a RAM-file snapshot (the RAM file, the device state and their sidecars) from
// the route's snapshot dir when the guest's RAM is no file (sleep: pause or poweroff, or
// snapshot_ram: copy): left by the route under an earlier config, and superseded now that the guest
// boots or is restored (how). A RAM file a QEMU maps is left.
func (b *Backend) dropUnusedRAM(how string) {
	if b.ram.file {
		return
	}
	f, err := lockRAM(b.ramPath(), false)
	if err != nil {
		return // none, or a QEMU maps it
	}
	defer f.Close()
	b.gen.Lock()
	b.savedGen = ""
	b.gen.Unlock()
	r := removeRegular(b.s.SnapshotDir, ramSnapshotFiles)
	if len(r.removed) > 0 || len(r.refused) > 0 {
		b.log.Info("kvm RAM-file snapshot removed: this config does not use it", "dir", b.s.SnapshotDir, "removed", or(strings.Join(r.removed, ", "), "nothing"), "bytes", r.bytes,
			"why", fmt.Sprintf("the guest %s, and its RAM is no file (%s)", how, b.ramUse()), "refused", or(strings.Join(r.refused, ", "), "nothing"))
	}
	if r.err != nil {
		b.log.Warn("kvm RAM-file snapshot not all removed", "dir", b.s.SnapshotDir, "err", r.err)
	}
}

// ramUse says why the guest's RAM is no file: its sleep mode, or the snapshot RAM plan.
func (b *Backend) ramUse() string {
	if b.s.Sleep != SleepSnapshot {
		return "sleep: " + b.s.Sleep
	}
	return "snapshot_ram " + b.ram.mode()
}

// sayLeft logs, as the route is opened, the snapshots on disk that its config does not use: in its
// earlier snapshot dirs, and a RAM-file snapshot in its own when the guest's RAM is no file. They
// are kept until the guest boots or is restored under this config.
func (b *Backend) sayLeft() {
	cur := filepath.Clean(b.s.SnapshotDir)
	for _, dir := range b.readDirs() {
		if filepath.Clean(dir) == cur {
			continue
		}
		if files, bytes := describe(dir, snapshotFiles); files != "" {
			b.log.Info("kvm snapshot kept in an earlier snapshot_dir", "dir", dir, "files", files, "bytes", bytes,
				"until", fmt.Sprintf("removed once the guest boots or is restored under snapshot_dir %s; a config back on %s before that resumes it", cur, dir))
		}
	}
	if b.ram.file {
		return
	}
	names, until := ramSnapshotFiles, "removed once the guest boots or is restored; a config back on snapshot_ram: file before that resumes it"
	if b.s.Sleep != SleepSnapshot {
		names, until = snapshotFiles, "removed at the guest's next boot; a config back on sleep: snapshot before that resumes it"
	}
	if files, bytes := describe(cur, names); files != "" {
		b.log.Info("kvm snapshot kept that this config does not use", "dir", cur, "files", files, "bytes", bytes, "ram", b.ramUse(), "until", until)
	}
}

// sayKept logs the snapshot the backend leaves in its snapshot dir as it closes (a reload that
// replaces or removes the route, or the activator's shutdown): the route's next backend resumes it or
// cleans it up, and for a route a reload removed the activator asks Forget next; but a route gone from
// the config of a restarted activator has neither (tenant.Closer says nothing of why it closes).
func (b *Backend) sayKept() {
	if files, bytes := describe(b.s.SnapshotDir, snapshotFiles); files != "" {
		b.log.Info("kvm snapshot kept as the route's backend closes", "dir", b.s.SnapshotDir, "files", files, "bytes", bytes,
			"until", "the route's next config or activator resumes it, or removes it once its guest runs under another snapshot_dir or sleep mode; a reload that removes the route removes it (kvm snapshot files of a removed route removed); a route missing from a restarted activator's config leaves it: remove these files by hand")
	}
}

// Forget removes what the backing keeps on disk for the route, now that a reload has removed it
// (tenant.Forgetter: the activator calls it once Close has run): the snapshot in its snapshot dir
// (device state and RAM file, or the copy) and what it left in earlier ones, within leftover's
// rules: only in a dir the route's record names, or whose snapshot says this route saved it (the
// record goes with a tmpfs runtime dir at a host restart; the sidecar stays), never in a dir another
// open route names as its snapshot_dir (a reload that hands it over, or adds this route back), only
// the backing's own names as regular files of the activator's user, refused snapshots kept as
// evidence, and a RAM file a QEMU maps kept. A guest that still runs (left by Close with
// keep_running_on_exit) keeps everything: its RAM is in use. The record itself goes once nothing in it
// is left; the runtime dir and its logs stay. Forget before Close is an error.
func (b *Backend) Forget(ctx context.Context) error {
	b.op.Lock()
	defer b.op.Unlock()
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if !closed {
		return errors.New("kvm forget: the backend is not closed")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("kvm forget: %w", err)
	}
	cur := filepath.Clean(b.s.SnapshotDir)
	if pid, err := readPid(b.p.pid); err == nil && isOurQEMU(pid, b.p.sock) {
		files, bytes := describe(cur, snapshotFiles)
		b.log.Warn("kvm snapshot of a removed route kept: its guest still runs (keep_running_on_exit); quit it, then remove these files by hand",
			"qemu_pid", pid, "dir", cur, "files", or(files, "none"), "bytes", bytes)
		return nil
	}
	b.dirsMu.Lock()
	defer b.dirsMu.Unlock()
	dirs := b.readDirs()
	if !slices.ContainsFunc(dirs, func(d string) bool { return filepath.Clean(d) == cur }) {
		if b.savedHere() {
			dirs = append(dirs, cur)
		} else if files, bytes := describe(cur, snapshotFiles); files != "" {
			b.log.Warn("kvm snapshot files of a removed route kept: neither the route's record nor a snapshot there says the backing wrote them",
				"dir", cur, "files", files, "bytes", bytes, "record", b.p.dirs)
		}
	}
	var keep []string
	for _, dir := range dirs {
		if owner := b.prov.ownerOf(dir, b); owner != "" {
			b.log.Info("kvm snapshot of a removed route left as it is: another route's snapshot_dir now", "dir", dir, "owner", owner)
			continue
		}
		if !b.removeLeft(dir, "kvm snapshot files of a removed route removed", "the route was removed from the config") {
			keep = append(keep, dir)
		}
	}
	if len(keep) > 0 {
		if err := b.writeDirs(keep); err != nil {
			b.log.Warn("kvm snapshot dir record not updated", "file", b.p.dirs, "err", err)
		}
		return nil
	}
	if r := removeRegular(b.s.RuntimeDir, []string{dirsName}); r.err != nil || len(r.refused) > 0 {
		b.log.Warn("kvm snapshot dir record of a removed route not removed", "file", b.p.dirs, "refused", or(strings.Join(r.refused, ", "), "nothing"), "err", r.err)
	}
	return nil
}

// savedHere reports whether a snapshot in the route's snapshot dir (the device state's sidecar, or a
// copy's) says this route saved it (checkOwner).
func (b *Backend) savedHere() bool {
	file, other := b.snapFile()
	for _, side := range []string{b.devPath() + genExt, file + genExt, other + genExt} {
		var saved struct {
			Route string `json:"route"`
		}
		if fi, err := os.Lstat(side); err != nil || notOurs(fi) != "" {
			continue
		}
		if err := readSidecar(side, &saved); err == nil && saved.Route == b.name {
			return true
		}
	}
	return false
}

// removal is what removeRegular did in a dir.
type removal struct {
	removed []string // "NAME (N bytes)"
	refused []string // names of the backing's found as something it did not write: "NAME (a symlink)"
	bytes   int64    // the size of those removed
	err     error    // the first failure
}

// removeRegular removes those of names that are regular files in dir owned by the activator's user,
// and says what it removed and what it refused: the backing writes regular files, as its own user, so
// a symlink, a directory or another user's file under one of its names is not its own, and is left.
func removeRegular(dir string, names []string) removal {
	var r removal
	fail := func(err error) {
		if r.err == nil {
			r.err = err
		}
	}
	for _, n := range names {
		path := filepath.Join(dir, n)
		fi, err := os.Lstat(path)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				fail(err)
			}
			continue
		}
		if why := notOurs(fi); why != "" {
			r.refused = append(r.refused, fmt.Sprintf("%s (%s)", n, why))
			continue
		}
		if err := os.Remove(path); err != nil {
			fail(err)
			continue
		}
		r.removed = append(r.removed, fmt.Sprintf("%s (%d bytes)", n, fi.Size()))
		r.bytes += fi.Size()
	}
	return r
}

// notOurs says why a file found under one of the backing's names is not one the backing wrote ("" when
// it may be): it is not a regular file, or another user owns it.
func notOurs(fi fs.FileInfo) string {
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return "a symlink"
	case !fi.Mode().IsRegular():
		return "not a regular file"
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Sprintf("owned by uid %d, not the activator's", st.Uid)
	}
	return ""
}

// describe lists those of names that are regular files in dir ("NAME (N bytes), ...", "" for none)
// and their total size.
func describe(dir string, names []string) (string, int64) {
	var out []string
	var bytes int64
	for _, n := range names {
		path := filepath.Join(dir, n)
		if fi, err := os.Lstat(path); err == nil && fi.Mode().IsRegular() {
			out = append(out, fmt.Sprintf("%s (%d bytes)", n, fi.Size()))
			bytes += fi.Size()
		}
	}
	return strings.Join(out, ", "), bytes
}

// sizeOf is the size of the file at path (-1 when it cannot be read).
func sizeOf(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return -1
	}
	return fi.Size()
}

// refusedRE matches a refused snapshot's file: the snapshot or its sidecar, then the time it was
// moved aside (none for one an older activator moved aside), then ".bad".
var refusedRE = regexp.MustCompile(`^(` + regexp.QuoteMeta(devBase) + `|` + regexp.QuoteMeta(snapBase+".zst") + `|` + regexp.QuoteMeta(snapBase) + `)(` +
	regexp.QuoteMeta(genExt) + `)?(?:\.(\d{8}T\d{6}\.\d{9}Z))?` + regexp.QuoteMeta(badExt) + `$`)

// refusal is one refused snapshot in a snapshot dir: its files (the snapshot and its sidecar, as far
// as they are there), by when it was moved aside ("" for an older activator's, which come first).
type refusal struct {
	base, stamp string
	files       []string
}

// refusals lists the refused snapshots in dir, oldest first.
func refusals(dir string) []refusal {
	ents, _ := os.ReadDir(dir)
	var out []refusal
	for _, e := range ents {
		m := refusedRE.FindStringSubmatch(e.Name())
		if m == nil || !e.Type().IsRegular() {
			continue
		}
		i := slices.IndexFunc(out, func(r refusal) bool { return r.base == m[1] && r.stamp == m[3] })
		if i < 0 {
			out = append(out, refusal{base: m[1], stamp: m[3]})
			i = len(out) - 1
		}
		out[i].files = append(out[i].files, e.Name())
	}
	slices.SortFunc(out, func(a, b refusal) int {
		return strings.Compare(a.stamp+"\x00"+a.base, b.stamp+"\x00"+b.base)
	})
	return out
}

// refusedIn names every refused snapshot's file in dir.
func refusedIn(dir string) []string {
	var names []string
	for _, r := range refusals(dir) {
		names = append(names, r.files...)
	}
	return names
}

// nextStamp is the time to name the next refusal in dir by: now, or just after the newest refusal
// there, should the clock have gone back.
func nextStamp(dir string, now time.Time) string {
	now = now.UTC()
	for _, r := range refusals(dir) {
		if t, err := time.Parse(stampLayout, r.stamp); err == nil && !now.After(t) {
			now = t.Add(time.Nanosecond)
		}
	}
	return now.Format(stampLayout)
}

// moveAside renames a snapshot that must not be tried again (and its sidecar) to FILE.<time>.bad
// (nextStamp), keeps the newest keepRefused refusals of its dir (pruneRefused), and says where it
// went in err.
func (b *Backend) moveAside(src snapshotSource, err error) error {
	dir := filepath.Dir(src.file)
	stamp := nextStamp(dir, time.Now())
	dst := src.file + "." + stamp + badExt
	if rerr := os.Rename(src.file, dst); rerr != nil {
		return err
	}
	if src.side != "" {
		_ = os.Rename(src.side, src.side+"."+stamp+badExt)
	}
	b.pruneRefused(dir)
	return fmt.Errorf("%w (moved aside to %s)", err, filepath.Base(dst))
}

// pruneRefused removes the refused snapshots in dir but the newest keepRefused, and logs what it
// removed and what it kept.
func (b *Backend) pruneRefused(dir string) {
	all := refusals(dir)
	if len(all) <= keepRefused {
		return
	}
	var names []string
	for _, r := range all[:len(all)-keepRefused] {
		names = append(names, r.files...)
	}
	rm := removeRegular(dir, names)
	var kept []string
	for _, r := range all[len(all)-keepRefused:] {
		kept = append(kept, r.files...)
	}
	keptDesc, _ := describe(dir, kept)
	b.log.Info("kvm older refused snapshots removed", "dir", dir, "removed", strings.Join(rm.removed, ", "), "bytes", rm.bytes, "kept", keptDesc, "keep", keepRefused,
		"refused", or(strings.Join(rm.refused, ", "), "nothing"))
	if rm.err != nil {
		b.log.Warn("kvm older refused snapshots not all removed", "dir", dir, "err", rm.err)
	}
}
