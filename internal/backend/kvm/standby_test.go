package kvm

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// standbyPid is the pid of the route's standby QEMU, after checking that it waits for a migration
// and (file mode) holds the RAM file, whose binding to the device state it left as the save wrote it.
func standbyPid(t *testing.T, b *Backend) int {
	t.Helper()
	b.mu.Lock()
	sb := b.standby
	b.mu.Unlock()
	if sb == nil {
		t.Fatal("no standby QEMU after the sleep")
	}
	if pid := qemuPid(b.p); pid != sb.pid {
		t.Fatalf("pid file names %d, the standby is %d", pid, sb.pid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if st, err := sb.queryStatus(ctx); err != nil || st != "inmigrate" {
		t.Fatalf("standby QEMU status %q (%v), want inmigrate", st, err)
	}
	if b.ram.file {
		if !holdsFile(sb.pid, b.ramPath()) {
			t.Fatal("standby QEMU does not hold the RAM file")
		}
		if _, err := checkDevice(b.devPath()); err != nil {
			t.Fatalf("device state beside the standby: %v", err)
		}
		if _, err := os.Stat(b.ramPath() + genExt); err != nil {
			t.Fatalf("RAM file sidecar beside the standby: %v, want the save's", err)
		}
	}
	return sb.pid
}

// wakeIntoStandby wakes b, whose standby QEMU waits, and checks that the guest was restored into that
// QEMU (no qemu_start phase) and is the boot boot1 names.
func wakeIntoStandby(t *testing.T, b *Backend, r *registry.Route, boot1 string) {
	t.Helper()
	sbPid := standbyPid(t, b)
	rec := &recorder{}
	wake(t, b, r.Upstream, rec)
	if phases, notes := rec.get(); !slices.Equal(phases, []string{PhaseRestore, PhaseRunning}) {
		t.Errorf("wake from the standby: phases %q (notes %q), want %q", phases, notes, []string{PhaseRestore, PhaseRunning})
	}
	if pid := qemuPid(b.p); pid != sbPid {
		t.Errorf("guest runs in qemu %d, want the standby %d", pid, sbPid)
	}
	if boot := get(t, r.Upstream, "/boot_id"); boot != boot1 {
		t.Fatalf("boot id changed across the restore into the standby: %s -> %s", boot1, boot)
	}
}

// TestStandby: with standby, a snapshot sleep leaves a QEMU waiting for the migration, and the next
// wake restores into it (no qemu_start phase, the same boot). A standby that died, or a snapshot that
// is gone, puts the wake back on its usual path; Close leaves no QEMU behind.
func TestStandby(t *testing.T) {
	g := needGuest(t)
	for _, c := range []struct{ name, extra, ram string }{
		{"file", "standby: true", RAMFile},
		{"copy", "standby: true\nsnapshot_ram: copy", RAMCopy},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := route(t, g, SleepSnapshot, c.extra)
			b := open(t, r)
			if b.ram.mode() != c.ram {
				t.Fatalf("snapshot RAM %s (%s), want %s", b.ram.mode(), b.ram.reason, c.ram)
			}
			wake(t, b, r.Upstream, tenant.Discard)
			boot1 := get(t, r.Upstream, "/boot_id")

			// Restored into the standby.
			sleepB(t, b)
			wakeIntoStandby(t, b, r, boot1)
			if c.ram == RAMFile {
				checkRAMInUse(t, b)
			}

			// The standby died while the guest slept: the wake starts a QEMU of its own.
			sleepB(t, b)
			killPid(standbyPid(t, b))
			rec := &recorder{}
			wake(t, b, r.Upstream, rec)
			if phases, notes := rec.get(); !slices.Equal(phases, []string{PhaseQEMUStart, PhaseQMP, PhaseRestore, PhaseRunning}) {
				t.Errorf("wake after the standby died: phases %q (notes %q), want a restore into a new QEMU", phases, notes)
			}
			if boot := get(t, r.Upstream, "/boot_id"); boot != boot1 {
				t.Fatalf("boot id changed across the restore: %s -> %s", boot1, boot)
			}

			// No snapshot any more: the standby is dropped and the guest boots.
			sleepB(t, b)
			standbyPid(t, b)
			if err := b.removeSnapshots(); err != nil {
				t.Fatal(err)
			}
			rec = &recorder{}
			wake(t, b, r.Upstream, rec)
			if _, notes := rec.get(); !slices.ContainsFunc(notes, func(n string) bool { return strings.Contains(n, "cold boot") }) {
				t.Errorf("wake without a snapshot: notes %q, want a cold boot", notes)
			}
			if boot := get(t, r.Upstream, "/boot_id"); boot == boot1 {
				t.Fatal("same boot id after a cold boot")
			}

			// Close kills the standby.
			sleepB(t, b)
			sbPid := standbyPid(t, b)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := b.Close(ctx); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if alive(sbPid) {
				t.Fatalf("standby qemu %d still running after Close", sbPid)
			}
		})
	}
}

// TestStandbyRefusesUnboundRAM: a standby changes nothing about which RAM file is resumed. A device
// state whose RAM file lost its binding is refused and the guest boots, with the standby gone.
func TestStandbyRefusesUnboundRAM(t *testing.T) {
	g := needGuest(t)
	r := route(t, g, SleepSnapshot, "standby: true")
	b := open(t, r)
	wake(t, b, r.Upstream, tenant.Discard)
	boot1 := get(t, r.Upstream, "/boot_id")
	sleepB(t, b)
	sbPid := standbyPid(t, b)
	if err := os.Remove(b.ramPath() + genExt); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	wake(t, b, r.Upstream, rec)
	if _, notes := rec.get(); !slices.ContainsFunc(notes, func(n string) bool { return strings.Contains(n, "refused") }) {
		t.Errorf("notes %q, want the snapshot refused", notes)
	}
	if boot := get(t, r.Upstream, "/boot_id"); boot == boot1 {
		t.Fatal("the unbound RAM file was resumed (same boot id)")
	}
	if alive(sbPid) {
		t.Fatalf("standby qemu %d still running", sbPid)
	}
}

// TestNotesStandby: check says what a standby route costs, beside its snapshot mode.
func TestNotesStandby(t *testing.T) {
	g := needGuest(t)
	for _, c := range []struct {
		extra string
		want  bool
	}{{"", false}, {"standby: true", true}} {
		notes := New(Options{}).Notes(context.Background(), route(t, g, SleepSnapshot, c.extra))
		got := slices.ContainsFunc(notes, func(n string) bool { return strings.HasPrefix(n, "standby: ") })
		if got != c.want || len(notes) == 0 || !strings.HasPrefix(notes[0], "snapshot RAM: ") {
			t.Errorf("%q: notes %q, want the snapshot RAM mode and a standby note: %v", c.extra, notes, c.want)
		}
	}
}

// TestStandbyPrepare: a route with standby whose guest an earlier activator snapshotted gets its
// standby QEMU before the first wake under the next one (Prepare, after the Adopt that found nothing
// running), and that wake restores into it. Prepare starts nothing before an Adopt, with a guest
// awake, or without a snapshot; the standby a crashed activator left is the next Adopt's to kill.
func TestStandbyPrepare(t *testing.T) {
	g := needGuest(t)
	for _, c := range []struct{ name, extra string }{
		{"file", "standby: true"},
		{"copy", "standby: true\nsnapshot_ram: copy"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			r := route(t, g, SleepSnapshot, c.extra)
			b1 := open(t, r)
			b1.Prepare(ctx) // a first start: no Adopt yet, and no snapshot either
			if b1.standby != nil || qemuPid(b1.p) != 0 {
				t.Fatal("Prepare before any Adopt started a QEMU")
			}
			wake(t, b1, r.Upstream, tenant.Discard)
			boot1 := get(t, r.Upstream, "/boot_id")
			b1.Prepare(ctx)
			if b1.standby != nil {
				t.Fatal("Prepare with the guest awake started a standby")
			}
			sleepB(t, b1)
			standbyPid(t, b1)
			if err := b1.Close(ctx); err != nil { // the snapshot stays; the standby does not
				t.Fatalf("Close: %v", err)
			}

			// The next activator.
			b2 := open(t, r)
			if _, awake, err := b2.Adopt(ctx); awake || err != nil {
				t.Fatalf("Adopt after a snapshot sleep: awake %v, %v; want asleep", awake, err)
			}
			b2.Prepare(ctx)
			wakeIntoStandby(t, b2, r, boot1)

			// A standby left by an activator that crashed: the next Adopt kills it, and Prepare
			// starts a new one.
			sleepB(t, b2)
			left := standbyPid(t, b2)
			b2.mu.Lock()
			b2.standby.detach() // as if the activator died: the QEMU runs on, nobody holds it
			b2.standby = nil
			b2.mu.Unlock()
			b3 := open(t, r)
			if _, awake, err := b3.Adopt(ctx); awake || err != nil {
				t.Fatalf("Adopt of the left standby: awake %v, %v; want asleep", awake, err)
			}
			if alive(left) {
				t.Fatalf("the left standby %d still runs after the next Adopt", left)
			}
			b3.Prepare(ctx)
			if pid := standbyPid(t, b3); pid == left {
				t.Fatalf("standby %d is the left one", pid)
			}
			if err := b2.Close(ctx); err != nil {
				t.Fatalf("Close: %v", err)
			}

			// Without a snapshot, Prepare starts nothing.
			if err := b3.Close(ctx); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if err := b3.removeSnapshots(); err != nil {
				t.Fatal(err)
			}
			b4 := open(t, r)
			if _, awake, err := b4.Adopt(ctx); awake || err != nil {
				t.Fatalf("Adopt: awake %v, %v", awake, err)
			}
			b4.Prepare(ctx)
			if b4.standby != nil || qemuPid(b4.p) != 0 {
				t.Fatal("Prepare without a snapshot started a QEMU")
			}
		})
	}
}
