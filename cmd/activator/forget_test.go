package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/testenv"
)

// TestReloadRemovesTheGuestsSnapshot: through a real `activator serve`, as an operator would. A kvm
// guest put to sleep by snapshot keeps its snapshot (the device state and the RAM file, or the copy)
// across a reload that changes only a key of the edge (the route's new instance takes the backend
// over) and one that changes the guest (its new backend resumes it); a reload that removes the route
// has it removed, once, after the route's last sleep and close, saying what it removed. Before, the
// snapshot, as large as the guest's memory, stayed on disk for good.
func TestReloadRemovesTheGuestsSnapshot(t *testing.T) {
	g := needTestGuest(t)
	dir := qemuRunDir(t)
	snap := filepath.Join(dir, "snap")
	port := testenv.FreePort(t)
	vm := func(idle, budget string) string {
		return fmt.Sprintf(`  - name: vm
    hosts: [vm.test]
    backing: kvm
    upstream: "127.0.0.1:%d"
    idle: %s
    wake_budget: 2m
    sleep_budget: %s
    health: {path: /, interval: 20ms, timeout: 250ms}
    kvm: {kernel: %q, initrd: %q, append: %q, accel: tcg, memory: 128, sleep: snapshot, runtime_dir: %q, snapshot_dir: %q}
`, port, idle, budget, g.kernel, g.initrd, g.append, filepath.Join(dir, "run"), snap)
	}
	keep := configYAML(t, appRoute{Name: "keep"})
	s := startServed(t, keep+vm("10m", "1m"))

	ctx, cancel := context.WithTimeout(context.Background(), 3*patience)
	defer cancel()
	if a := getFresh(ctx, s.edge, "vm.test", "/"); a.err != nil || a.code != http.StatusOK {
		t.Fatalf("GET vm.test: %d %q %v, want 200 from the guest", a.code, a.body, a.err)
	}
	if code, out := runMain(t, "sleep", "vm", "--admin", s.admin); code != 0 {
		t.Fatalf("sleep: exit %d:\n%s", code, out)
	}
	// The sleep returns once the device state is saved; its QEMU quits and the RAM file's binding (the
	// sidecars) is put in place after, off the sleep's path (kvm's retire). The whole snapshot is
	// what the reloads must keep.
	saved := waitSnapshot(t, snap, []string{"guest.ram", "guest.ram.gen", "guest.dev", "guest.dev.gen"})

	// An edge key (the heir takes the backend), then the guest's own sleep_budget (a new backend):
	// the route stays, and so does its snapshot.
	s.rewrite(keep+vm("20m", "1m"), 1)
	s.rewrite(keep+vm("20m", "2m"), 2)
	s.waitStatus("vm", "asleep under its third config", func(st activator.Status) bool { return st.State == "asleep" })
	if got := snapshotIn(t, snap); strings.Join(got, " ") != strings.Join(saved, " ") {
		t.Fatalf("after reloads that keep the route, %s holds %q, want the snapshot %q", snap, got, saved)
	}
	if n := len(s.logs.matching("removed tenant forgotten: its backend let go of what it kept for a next wake")); n != 0 {
		t.Fatalf("a route the reloads kept was forgotten %d times", n)
	}

	s.rewrite(keep, 3)
	recs := s.waitLogged("kvm snapshot files of a removed route removed", 1)
	if got := snapshotIn(t, snap); len(got) > 0 {
		t.Errorf("after the reload that removed route vm, %s still holds %q", snap, got)
	}
	for _, f := range saved {
		if removed, _ := recs[0]["removed"].(string); !strings.Contains(removed, f+" (") {
			t.Errorf("the log record %v does not name the removed %s", recs[0], f)
		}
	}
	s.waitLogged("removed tenant forgotten: its backend let go of what it kept for a next wake", 1) // once Forget has returned
	if pid := qemuPID(dir); pid != 0 {
		t.Errorf("QEMU pid %d still runs for the removed route", pid)
	}
	s.sigterm()
	s.wait()
	if n := len(s.logs.matching("kvm snapshot files of a removed route removed")); n != 1 {
		t.Errorf("%d removals logged by the end, want the reload's one", n)
	}
	if n := len(s.logs.matching("removed tenant forgotten: its backend let go of what it kept for a next wake")); n != 1 {
		t.Errorf("route vm forgotten %d times by the end, want once", n)
	}
}

// snapshotIn lists the snapshot files of the kvm backing in dir: the device state and RAM file or
// the copy, with their sidecars.
// waitSnapshot waits, within patience, until dir holds want (snapshotIn's order), and returns it.
func waitSnapshot(t *testing.T, dir string, want []string) []string {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(patience)
	defer deadline.Stop()
	for {
		got := snapshotIn(t, dir)
		if slices.Equal(got, want) {
			return got
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("%s holds %q after the sleep, want %q within %v", dir, got, want, patience)
		}
	}
}

func snapshotIn(t *testing.T, dir string) []string {
	t.Helper()
	var got []string
	for _, f := range []string{"guest.ram", "guest.ram.gen", "guest.dev", "guest.dev.gen", "guest.snap", "guest.snap.gen"} {
		if _, err := os.Lstat(filepath.Join(dir, f)); err == nil {
			got = append(got, f)
		}
	}
	return got
}
