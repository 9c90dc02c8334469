package kvm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// withSettings returns a copy of r whose kvm settings edit has changed: the same route under a new
// config.
func withSettings(r *registry.Route, edit func(s *Settings)) *registry.Route {
	r2 := *r
	s2 := *r.Settings.(*Settings)
	edit(&s2)
	r2.Settings = &s2
	return &r2
}

// retireB is what a reload that replaces or removes the route does to its backend: a last sleep
// (tenant.LastSleep), then Close.
func retireB(t *testing.T, b *Backend) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := b.Sleep(tenant.LastSleep(ctx)); err != nil {
		t.Fatalf("Sleep: %v", err)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// fileSnapshot is what a file-mode sleep leaves in snapshot_dir.
var fileSnapshot = []string{ramBase, ramBase + genExt, devBase, devBase + genExt}

// present lists which of names are in dir.
func present(dir string, names ...string) []string {
	var got []string
	for _, n := range names {
		if exists(filepath.Join(dir, n)) {
			got = append(got, n)
		}
	}
	return got
}

// TestAbandonedSnapshotDir: the snapshot a route leaves in a snapshot_dir its config no longer uses
// (snapshot_dir changed, sleep no longer snapshot) is removed once the route's guest has moved on
// under the new config (its first boot or restore there), and the log names what went and its size;
// until then it is kept, and said to be, since switching back resumes it. Nothing else in the old
// directory is touched, nor a directory another route now has. Found by an operator trial: the old
// directory kept its RAM file, the guest's size, for good.
func TestAbandonedSnapshotDir(t *testing.T) {
	g := needGuest(t)

	t.Run("snapshot_dir changed by a reload", func(t *testing.T) {
		tap := newLogTap(t)
		p := New(Options{Logger: tap.logger()})
		r := route(t, g, SleepSnapshot, "")
		dirA := r.Settings.(*Settings).SnapshotDir
		dirB := filepath.Join(filepath.Dir(dirA), "snap-b")
		b1 := openWith(t, p, r)
		wake(t, b1, r.Upstream, tenant.Discard)
		boot1 := get(t, r.Upstream, "/boot_id")
		notes := filepath.Join(dirA, "operator-notes.txt") // not the backing's: never removed
		must(t, os.WriteFile(notes, []byte("mine"), 0o600))
		refused := filepath.Join(dirA, devBase+".20200102T030405.000000006Z"+badExt) // evidence: kept
		must(t, os.WriteFile(refused, []byte("refused"), 0o600))
		retireB(t, b1)
		fi, err := os.Stat(filepath.Join(dirA, ramBase))
		if err != nil {
			t.Fatalf("the retired route's RAM file: %v", err)
		}
		ramBytes := strconv.FormatInt(fi.Size(), 10)
		// The closing backend says what it leaves on disk: nothing else will if the route was removed.
		if tap.find("snapshot", "dir="+dirA+" ", ramBase+" ("+ramBytes+" bytes)") == "" {
			t.Errorf("the route's last sleep and Close left %s (%s bytes) without a word in the log", dirA, ramBytes)
		}

		rB := withSettings(r, func(s *Settings) { s.SnapshotDir = dirB })
		b2 := openWith(t, p, rB)
		// Until the guest runs under the new config, the old snapshot is its latest state: kept.
		if got := present(dirA, fileSnapshot...); !slices.Equal(got, fileSnapshot) {
			t.Fatalf("before any wake under snapshot_dir %s, %s holds %q, want the whole snapshot %q", dirB, dirA, got, fileSnapshot)
		}
		rec := &recorder{}
		wake(t, b2, r.Upstream, rec)
		if boot := get(t, r.Upstream, "/boot_id"); boot == boot1 {
			t.Fatalf("under snapshot_dir %s the guest resumed boot %s from %s", dirB, boot, dirA)
		}
		if got := present(dirA, fileSnapshot...); len(got) > 0 {
			t.Errorf("after the guest booted under snapshot_dir %s, the abandoned %s still holds %q", dirB, dirA, got)
		}
		if !exists(notes) {
			t.Errorf("%s, not the backing's, was removed", notes)
		}
		if !exists(refused) || tap.find("removed", "dir="+dirA+" ", "kept=\""+filepath.Base(refused)) == "" {
			t.Errorf("the refused snapshot %s was removed with the abandoned snapshot, or not named as kept", refused)
		}
		if tap.find("removed", "dir="+dirA+" ", ramBase+" ("+ramBytes+" bytes)") == "" {
			t.Errorf("no log line names the removed RAM file %s and its size %s", filepath.Join(dirA, ramBase), ramBytes)
		}

		// And back: the snapshot the guest left in B goes once it boots in A again.
		sleepB(t, b2)
		retireB(t, b2)
		b3 := openWith(t, p, r)
		wake(t, b3, r.Upstream, tenant.Discard)
		if got := present(dirB, fileSnapshot...); len(got) > 0 {
			t.Errorf("after the guest booted under snapshot_dir %s again, the abandoned %s still holds %q", dirA, dirB, got)
		}
	})

	t.Run("sleep mode changed by a restart", func(t *testing.T) {
		for _, to := range []string{SleepPause, SleepPoweroff} {
			t.Run(to, func(t *testing.T) {
				r := route(t, g, SleepSnapshot, "")
				dir := r.Settings.(*Settings).SnapshotDir
				b1 := open(t, r)
				wake(t, b1, r.Upstream, tenant.Discard)
				sleepB(t, b1)
				must(t, b1.Close(context.Background()))

				tap := newLogTap(t)
				b2 := openWith(t, New(Options{Logger: tap.logger()}), withSettings(r, func(s *Settings) { s.Sleep = to }))
				if got := present(dir, fileSnapshot...); !slices.Equal(got, fileSnapshot) {
					t.Fatalf("before any wake in %s mode, %s holds %q, want the whole snapshot %q", to, dir, got, fileSnapshot)
				}
				if tap.find("kept", "dir="+dir+" ", ramBase+" (") == "" {
					t.Errorf("opening the route in %s mode over the snapshot in %s said nothing of it", to, dir)
				}
				wake(t, b2, r.Upstream, tenant.Discard)
				if got := present(dir, fileSnapshot...); len(got) > 0 {
					t.Errorf("after a cold boot in %s mode, %s still holds %q", to, dir, got)
				}
				if tap.find("removed", "dir="+dir+" ", ramBase+" (") == "" {
					t.Errorf("no log line names the removed RAM file %s", filepath.Join(dir, ramBase))
				}
			})
		}
	})

	t.Run("switched away and back before a wake", func(t *testing.T) {
		r := route(t, g, SleepSnapshot, "")
		dirA := r.Settings.(*Settings).SnapshotDir
		b1 := open(t, r)
		wake(t, b1, r.Upstream, tenant.Discard)
		boot1 := get(t, r.Upstream, "/boot_id")
		retireB(t, b1)
		b2 := open(t, withSettings(r, func(s *Settings) { s.SnapshotDir = filepath.Join(filepath.Dir(dirA), "snap-b") }))
		must(t, b2.Close(context.Background()))
		b3 := open(t, r)
		rec := &recorder{}
		wake(t, b3, r.Upstream, rec)
		if boot := get(t, r.Upstream, "/boot_id"); boot != boot1 {
			phases, notes := rec.get()
			t.Fatalf("back on %s before any wake elsewhere: boot %s, want the snapshot's %s resumed (phases %q, notes %q)", dirA, boot, boot1, phases, notes)
		}
	})

	t.Run("the old dir is now another route's", func(t *testing.T) {
		tap := newLogTap(t)
		p := New(Options{Logger: tap.logger()})
		r := route(t, g, SleepSnapshot, "")
		dirA := r.Settings.(*Settings).SnapshotDir
		b1 := openWith(t, p, r)
		wake(t, b1, r.Upstream, tenant.Discard)
		retireB(t, b1)
		// One reload gives the route a new snapshot_dir and another route the old one.
		other := withSettings(r, func(s *Settings) { s.RuntimeDir = filepath.Join(shortDir(t), "run") })
		other.Name = "other"
		openWith(t, p, other)
		b2 := openWith(t, p, withSettings(r, func(s *Settings) { s.SnapshotDir = filepath.Join(filepath.Dir(dirA), "snap-b") }))
		wake(t, b2, r.Upstream, tenant.Discard)
		if got := present(dirA, fileSnapshot...); !slices.Equal(got, fileSnapshot) {
			t.Errorf("%s, now route other's snapshot_dir, holds %q after the first route's boot elsewhere, want %q left alone", dirA, got, fileSnapshot)
		}
	})
}

// TestRefusedSnapshotsKeepTheNewestTwo: each refused snapshot is moved aside under a name of its own,
// the one the wake's note gives, so a second refusal does not overwrite the evidence of the first;
// and only the newest two refusals of a snapshot_dir are kept (one may be the guest's size), older
// ones (those named as an older activator named them included) are removed, saying so. No QEMU: the
// refusals are those of the checks before a restore.
func TestRefusedSnapshotsKeepTheNewestTwo(t *testing.T) {
	dir := t.TempDir()
	tap := newLogTap(t)
	b := &Backend{s: &Settings{SnapshotDir: dir, SnapshotCompress: "none"}, ram: ramPlan{file: true}, log: tap.logger()}
	// What an older activator moved aside, by its one name.
	must(t, os.WriteFile(filepath.Join(dir, snapBase+badExt), []byte("copy 0"), 0o600))
	must(t, os.WriteFile(filepath.Join(dir, snapBase+genExt+badExt), []byte("{}"), 0o600))

	movedTo := regexp.MustCompile(`moved aside to ([^) ]+)\)`)
	var kept []string // each refusal's file, as its note names it
	for i, file := range []string{devBase, devBase, snapBase} {
		body := file + " " + strconv.Itoa(i+1)
		must(t, os.WriteFile(filepath.Join(dir, file), []byte(body), 0o600))
		must(t, os.WriteFile(filepath.Join(dir, file+genExt), []byte("not a sidecar"), 0o600))
		_, err := b.findSnapshot(false)
		var re *refusedError
		m := movedTo.FindStringSubmatch(errString(err))
		if !errors.As(err, &re) || m == nil {
			t.Fatalf("refusal %d: findSnapshot = %v, want a refusal saying where the snapshot went", i+1, err)
		}
		kept = append(kept, m[1])
		if got, err := os.ReadFile(filepath.Join(dir, m[1])); err != nil || string(got) != body {
			t.Errorf("refusal %d: %s holds %q (%v), want the refused %q", i+1, m[1], got, err, body)
		}
	}
	// The newest two refusals, each with its sidecar, and nothing else.
	want := []string{kept[1], sidecarOf(kept[1]), kept[2], sidecarOf(kept[2])}
	slices.Sort(want)
	var got []string
	ents, err := os.ReadDir(dir)
	must(t, err)
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if !slices.Equal(got, want) {
		t.Errorf("snapshot_dir holds %q, want the newest two refusals %q", got, want)
	}
	if kept[0] == kept[1] {
		t.Errorf("two refusals were moved aside to the same name %s", kept[0])
	}
	for _, old := range []string{snapBase + badExt, kept[0]} {
		if tap.find("removed", "dir="+dir+" ", old+" (") == "" {
			t.Errorf("no log line says %s was removed", filepath.Join(dir, old))
		}
	}
}

// sidecarOf names the sidecar moved aside with the refused snapshot bad: guest.dev.<when>.bad goes
// with guest.dev.gen.<when>.bad.
func sidecarOf(bad string) string {
	for _, base := range []string{snapBase + ".zst", snapBase, devBase} {
		if rest, ok := strings.CutPrefix(bad, base); ok {
			return base + genExt + rest
		}
	}
	return bad + "?"
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestFailedWakeKeepsTheEarlierSnapshot: what the route left in an earlier snapshot_dir goes only once
// the guest runs under the new config. A wake that fails first (here the new config's disk is gone)
// has not moved the guest on, and a config put back resumes the snapshot, so it is left, and the dir
// stays in the route's record. No guest boots: the wake fails before QEMU starts.
func TestFailedWakeKeepsTheEarlierSnapshot(t *testing.T) {
	needQEMU(t)
	dir := shortDir(t)
	disk := filepath.Join(dir, "disk.img")
	must(t, os.WriteFile(disk, nil, 0o644))
	b := open(t, cheapRoute(t, dir, "sleep: pause\ndisk: "+disk+"\n"))
	old := filepath.Join(dir, "old-snap")
	must(t, os.MkdirAll(old, 0o700))
	for _, f := range fileSnapshot {
		must(t, os.WriteFile(filepath.Join(old, f), []byte(f), 0o600))
	}
	must(t, b.writeDirs([]string{old}))
	must(t, os.Remove(disk))
	wakeErr(t, b, tenant.Discard)
	if got := present(old, fileSnapshot...); !slices.Equal(got, fileSnapshot) {
		t.Errorf("after a wake that failed under the new config, the earlier %s holds %q, want %q", old, got, fileSnapshot)
	}
	if got := b.readDirs(); !slices.Equal(got, []string{old}) {
		t.Errorf("the route's record of snapshot dirs is %q, want %q still", got, []string{old})
	}
}
