package kvm

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/activator/activator/internal/tenant"
)

// plant writes each of names into dir, its own name as its content.
func plant(t *testing.T, dir string, names ...string) {
	t.Helper()
	must(t, os.MkdirAll(dir, 0o700))
	for _, n := range names {
		must(t, os.WriteFile(filepath.Join(dir, n), []byte(n), 0o600))
	}
}

// closeNow closes b, as the activator's retirement does before it asks Forget.
func closeNow(t *testing.T, b *Backend) {
	t.Helper()
	must(t, b.Close(context.Background()))
}

// TestForgetRemovesWhatTheBackingWrote: once a reload has removed the route and its backend has
// closed, Forget removes the snapshot from the route's snapshot_dir and from the earlier dirs its
// record names, and the record; within leftover's rules: the backing's names only, as regular files
// of the activator's user (a symlink, a directory or another user's file under one of them is refused
// and named as such), refused snapshots kept as evidence, a dir another open route now names left as
// it is, a RAM file a QEMU holds kept (and its dir kept in the record), a dir the record does not name
// untouched unless a snapshot there says this route saved it. Before Close it removes nothing. No
// QEMU runs: the files are planted.
func TestForgetRemovesWhatTheBackingWrote(t *testing.T) {
	needQEMU(t)

	t.Run("the rules", func(t *testing.T) {
		dir := shortDir(t)
		tap := newLogTap(t)
		p := New(Options{Logger: tap.logger()})
		r := cheapRoute(t, dir, "sleep: snapshot\n")
		cur := r.Settings.(*Settings).SnapshotDir
		old := filepath.Join(dir, "old-snap")      // an earlier snapshot_dir of the route
		taken := filepath.Join(dir, "taken-snap")  // an earlier one, another route's now
		stranger := filepath.Join(dir, "stranger") // never the route's: not in its record
		b := openWith(t, p, r)
		other := withSettings(r, func(s *Settings) { s.SnapshotDir, s.RuntimeDir = taken, filepath.Join(dir, "run2") })
		other.Name = "other"
		openWith(t, p, other)

		plant(t, cur, fileSnapshot...)
		plant(t, cur, "operator-notes.txt", devBase+".20200102T030405.000000006Z"+badExt, devBase+genExt+".20200102T030405.000000006Z"+badExt)
		outside := filepath.Join(dir, "outside")
		plant(t, dir, "outside")
		must(t, os.Symlink(outside, filepath.Join(cur, snapBase)))
		must(t, os.Mkdir(filepath.Join(cur, snapBase+".zst"), 0o700))
		plant(t, old, fileSnapshot...)
		plant(t, taken, fileSnapshot...)
		plant(t, stranger, fileSnapshot...)
		foreign := ""
		if os.Geteuid() == 0 {
			plant(t, old, snapBase)
			must(t, os.Chown(filepath.Join(old, snapBase), 4242, 4242))
			foreign = snapBase
		}
		must(t, b.writeDirs([]string{old, cur, taken}))

		if err := b.Forget(context.Background()); err == nil {
			t.Error("Forget on an open backend: no error")
		}
		if got := present(cur, fileSnapshot...); !slices.Equal(got, fileSnapshot) {
			t.Fatalf("Forget before Close removed files: %s holds %q, want %q", cur, got, fileSnapshot)
		}

		closeNow(t, b)
		must(t, b.Forget(context.Background()))
		for _, d := range []string{cur, old} {
			if got := present(d, fileSnapshot...); len(got) > 0 {
				t.Errorf("after Forget, %s still holds %q", d, got)
			}
		}
		for _, d := range []string{taken, stranger} {
			if got := present(d, fileSnapshot...); !slices.Equal(got, fileSnapshot) {
				t.Errorf("after Forget, %s (not the removed route's to clean) holds %q, want %q left", d, got, fileSnapshot)
			}
		}
		for _, keep := range []string{"operator-notes.txt", devBase + ".20200102T030405.000000006Z" + badExt, snapBase + ".zst"} {
			if !exists(filepath.Join(cur, keep)) {
				t.Errorf("%s, not the backing's to remove, is gone", filepath.Join(cur, keep))
			}
		}
		if fi, err := os.Lstat(filepath.Join(cur, snapBase)); err != nil || fi.Mode()&os.ModeSymlink == 0 || !exists(outside) {
			t.Errorf("the symlink %s or its target was removed (%v)", filepath.Join(cur, snapBase), err)
		}
		if foreign != "" && !exists(filepath.Join(old, foreign)) {
			t.Errorf("%s, owned by another user, was removed", filepath.Join(old, foreign))
		}
		line := tap.find(`msg="kvm snapshot files of a removed route removed"`, "dir="+cur+" ", ramBase+" (")
		if line == "" || !strings.Contains(line, snapBase+" (a symlink)") || !strings.Contains(line, snapBase+".zst (not a regular file)") ||
			!strings.Contains(line, "kept=\""+devBase+".20200102T030405.000000006Z"+badExt) {
			t.Errorf("the log line for %s does not name what it removed (the RAM file), refused (the symlink, the directory) and kept (the refused snapshot): %q", cur, line)
		}
		if foreign != "" && tap.find(`msg="kvm snapshot files of a removed route removed"`, "dir="+old+" ", foreign+" (owned by uid 4242") == "" {
			t.Errorf("no log line names %s as refused: another user's", filepath.Join(old, foreign))
		}
		if tap.find("another route's snapshot_dir now", "dir="+taken, "owner=other") == "" {
			t.Errorf("no log line says %s was left as route other's", taken)
		}
		if _, err := os.Lstat(b.p.dirs); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the removed route's record %s is still there (%v)", b.p.dirs, err)
		}
	})

	t.Run("a RAM file in use stays, and its dir in the record", func(t *testing.T) {
		dir := shortDir(t)
		b := open(t, cheapRoute(t, dir, "sleep: snapshot\n"))
		old := filepath.Join(dir, "old-snap")
		plant(t, old, fileSnapshot...)
		must(t, b.writeDirs([]string{old}))
		held, err := lockRAM(filepath.Join(old, ramBase), false) // as a QEMU that maps it holds it
		must(t, err)
		defer held.Close()
		closeNow(t, b)
		must(t, b.Forget(context.Background()))
		if got := present(old, fileSnapshot...); !slices.Equal(got, []string{ramBase, ramBase + genExt}) {
			t.Errorf("%s holds %q, want the RAM file in use and its sidecar only", old, got)
		}
		if got := b.readDirs(); !slices.Equal(got, []string{old}) {
			t.Errorf("the record names %q, want %q, to clean it later", got, []string{old})
		}
	})

	t.Run("not in the record", func(t *testing.T) {
		for _, tc := range []struct {
			savedBy string
			gone    bool
		}{{"guest", true}, {"other", false}, {"", false}} {
			t.Run("saved by "+strconv.Quote(tc.savedBy), func(t *testing.T) {
				dir := shortDir(t)
				tap := newLogTap(t)
				b := openWith(t, New(Options{Logger: tap.logger()}), cheapRoute(t, dir, "sleep: snapshot\n"))
				cur := b.s.SnapshotDir
				plant(t, cur, ramBase, ramBase+genExt, devBase)
				must(t, writeSidecar(b.devPath()+genExt, devSidecar{Generation: "g", Route: tc.savedBy}))
				closeNow(t, b)
				must(t, b.Forget(context.Background()))
				got := present(cur, fileSnapshot...)
				switch {
				case tc.gone && len(got) > 0:
					t.Errorf("a snapshot the route saved, with the record lost: %s still holds %q", cur, got)
				case !tc.gone && !slices.Equal(got, fileSnapshot):
					t.Errorf("a snapshot the route cannot show it saved: %s holds %q, want %q kept", cur, got, fileSnapshot)
				case !tc.gone && tap.find("kept: neither the route's record", "dir="+cur) == "":
					t.Errorf("no log line says why %s was kept", cur)
				}
			})
		}
	})

	t.Run("a guest left running", func(t *testing.T) {
		dir := shortDir(t)
		b := open(t, cheapRoute(t, dir, "sleep: snapshot\n"))
		plant(t, b.s.SnapshotDir, fileSnapshot...)
		must(t, b.writeDirs([]string{b.s.SnapshotDir}))
		closeNow(t, b)
		// A process whose command line names the route's QMP socket, as a QEMU left running by
		// keep_running_on_exit does.
		stop := fakeQEMU(t, b.p)
		defer stop()
		must(t, b.Forget(context.Background()))
		if got := present(b.s.SnapshotDir, fileSnapshot...); !slices.Equal(got, fileSnapshot) {
			t.Errorf("with the guest's QEMU running, %s holds %q, want %q kept", b.s.SnapshotDir, got, fileSnapshot)
		}
	})
}

// fakeQEMU starts a process that isOurQEMU takes for the route's QEMU (its command line names the
// QMP socket as QEMU's -qmp does) and writes its pid file; stop kills it and waits for it.
func fakeQEMU(t *testing.T, p paths) (stop func()) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(p.pid), 0o700))
	cmd := exec.Command("sleep")
	cmd.Args = []string{"unix:" + p.sock + ",server=on", "infinity"} // argv[0] names the socket
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start a stand-in process: %v", err)
	}
	stop = func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	must(t, os.WriteFile(p.pid, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600))
	if !isOurQEMU(cmd.Process.Pid, p.sock) {
		stop()
		t.Fatalf("the stand-in pid %d is not taken for the route's QEMU", cmd.Process.Pid)
	}
	return stop
}

// TestSnapshotOfAnotherRouteIsRefused: a snapshot records the route that saved it, and another route
// (sharing its snapshot_dir by mistake, or renamed) refuses it: the refusal names both routes, and the
// snapshot is moved aside (FILE.<time>.bad) as any refused one is. A snapshot from before sidecars
// named their route is resumed as before. No QEMU: the checks before a restore.
func TestSnapshotOfAnotherRouteIsRefused(t *testing.T) {
	for _, mode := range []string{RAMCopy, RAMFile} {
		for _, savedBy := range []string{"guest", "old-name", ""} {
			t.Run(mode+"/saved by "+strconv.Quote(savedBy), func(t *testing.T) {
				dir := t.TempDir()
				b := &Backend{name: "guest", s: &Settings{SnapshotDir: dir, SnapshotCompress: "none", Memory: 1}, ram: ramPlan{file: mode == RAMFile}, log: testLogger(t)}
				file := filepath.Join(dir, snapBase)
				if mode == RAMFile {
					file = b.devPath()
					must(t, os.WriteFile(file, []byte("device state"), 0o600))
					sum, n, err := hashFile(file)
					must(t, err)
					must(t, writeSidecar(file+genExt, devSidecar{Generation: "g", Bytes: n, SHA256: sum, RAMBytes: b.ramBytes(), Route: savedBy}))
					must(t, os.WriteFile(b.ramPath(), make([]byte, b.ramBytes()), 0o600))
					must(t, writeSidecar(b.ramPath()+genExt, ramSidecar{Generation: "g", Bytes: b.ramBytes(), HostBoot: hostBootID()}))
				} else {
					must(t, os.WriteFile(file, []byte("snapshot"), 0o600))
					must(t, writeSidecar(file+genExt, snapSidecar{Bytes: int64(len("snapshot")), Route: savedBy}))
				}
				src, err := b.findSnapshot(false)
				if src.ram != nil {
					src.ram.Close()
				}
				var re *refusedError
				if savedBy != "old-name" {
					if err != nil {
						t.Fatalf("a snapshot saved by %q: %v, want it resumed by route guest", savedBy, err)
					}
					return
				}
				if !errors.As(err, &re) || re.savedBy != "old-name" || !strings.Contains(err.Error(), `saved by route "old-name", not by this route "guest"`) {
					t.Fatalf("another route's snapshot: %v, want a refusal naming both routes", err)
				}
				if exists(file) || len(refusedIn(dir)) != 2 {
					t.Errorf("the refused snapshot was not moved aside with its sidecar: %s there %v, refused files %q", file, exists(file), refusedIn(dir))
				}
			})
		}
	}
}

// TestForgetAfterTheLastSleep: a real guest, put to sleep by snapshot as a reload's retirement does
// (a last sleep, then Close), leaves its snapshot; Forget, which the activator calls once the reload
// has removed the route, removes it and says so, with the sizes.
func TestForgetAfterTheLastSleep(t *testing.T) {
	g := needGuest(t)
	tap := newLogTap(t)
	r := route(t, g, SleepSnapshot, "")
	b := openWith(t, New(Options{Logger: tap.logger()}), r)
	wake(t, b, r.Upstream, tenant.Discard)
	retireB(t, b)
	dir := b.s.SnapshotDir
	saved := present(dir, append(fileSnapshot, snapBase, snapBase+genExt)...)
	if len(saved) == 0 {
		t.Fatalf("the last sleep left no snapshot in %s", dir)
	}
	must(t, b.Forget(context.Background()))
	if got := present(dir, snapshotFiles...); len(got) > 0 {
		t.Errorf("after Forget, %s still holds %q", dir, got)
	}
	for _, f := range saved {
		if tap.find(`msg="kvm snapshot files of a removed route removed"`, "dir="+dir+" ", f+" (") == "" {
			t.Errorf("no log line names the removed %s", filepath.Join(dir, f))
		}
	}
}

// TestRenamedRouteColdBoots: a snapshot names the route that saved it. A route renamed with its
// snapshot_dir kept (or another route given that dir) does not resume the first one's guest: it
// cold-boots, its wake record and its log name both routes, and the snapshot is moved aside.
func TestRenamedRouteColdBoots(t *testing.T) {
	g := needGuest(t)
	r := route(t, g, SleepSnapshot, "")
	b1 := open(t, r)
	wake(t, b1, r.Upstream, tenant.Discard)
	boot1 := get(t, r.Upstream, "/boot_id")
	retireB(t, b1)

	tap := newLogTap(t)
	renamed := withSettings(r, func(*Settings) {})
	renamed.Name = "renamed"
	b2 := openWith(t, New(Options{Logger: tap.logger()}), renamed)
	rec := &recorder{}
	wake(t, b2, r.Upstream, rec)
	if boot := get(t, r.Upstream, "/boot_id"); boot == boot1 {
		t.Fatalf("route renamed resumed route guest's boot %s", boot)
	}
	_, notes := rec.get()
	if !slices.ContainsFunc(notes, func(n string) bool {
		return strings.Contains(n, `saved by route "guest", not by this route "renamed"`) && strings.Contains(n, "cold boot instead")
	}) {
		t.Errorf("the wake's notes %q do not say the snapshot was route guest's", notes)
	}
	if tap.find("another route saved it", "route=renamed", "saved_by=guest") == "" {
		t.Error("no log line names both routes")
	}
	if len(refusedIn(b2.s.SnapshotDir)) == 0 {
		t.Errorf("the refused snapshot was not kept in %s as FILE.<time>.bad", b2.s.SnapshotDir)
	}
}
