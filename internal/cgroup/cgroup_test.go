package cgroup

import (
	"context"
	"fmt"
	"os"
	osexec "os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/activator/activator/internal/testenv"
)

const budget = time.Minute

func TestParseMountinfo(t *testing.T) {
	cases := []struct {
		name, in, want string
		err            bool
	}{
		{"hybrid", "25 1 0:23 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n", "/sys/fs/cgroup/unified", false},
		{"unified", "36 25 0:31 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n", "/sys/fs/cgroup", false},
		{"escaped", `36 25 0:31 / /mnt/my\040cg rw - cgroup2 none rw` + "\n", "/mnt/my cg", false},
		{"v1 only", "30 25 0:26 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n", "", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseMountinfo([]byte(c.in))
			if (err != nil) != c.err || got != c.want {
				t.Errorf("parseMountinfo = %q, %v; want %q (error %v)", got, err, c.want, c.err)
			}
		})
	}
}

var seq atomic.Int64

// testGroup makes a fresh group below this process's own cgroup, unique to the test, and removes it
// (killing what is left in it) when the test ends. It skips, or fails under
// ACTIVATOR_INTEGRATION=required, where no writable cgroup v2 exists.
func testGroup(t *testing.T) Group {
	t.Helper()
	mnt, err := Mount()
	if err != nil {
		testenv.Missing(t, "no cgroup v2: %v", err)
	}
	self, err := Self()
	if err != nil {
		testenv.Missing(t, "no cgroup v2: %v", err)
	}
	g := At(mnt + self).Child(fmt.Sprintf("cgroup-test-%d-%d", os.Getpid(), seq.Add(1)))
	if err := g.Make(); err != nil {
		testenv.Missing(t, "cgroup v2 not writable: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		if err := g.Kill(ctx); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if err := g.Remove(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return g
}

// spawn starts a shell script directly inside g (clone3 CLONE_INTO_CGROUP) and reaps it when the test
// ends.
func spawn(t *testing.T, g Group, script string) *osexec.Cmd {
	t.Helper()
	dir, err := g.OpenDir()
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	cmd := osexec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dir.Fd()), Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// waitProcs polls (external process state) until g holds at least n processes.
func waitProcs(t *testing.T, g Group, n int) []int {
	t.Helper()
	deadline := time.Now().Add(budget)
	for i := 0; ; i++ {
		pids, err := g.Procs()
		if err != nil {
			t.Fatal(err)
		}
		if len(pids) >= n {
			return pids
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %v, want %d processes within %v", g.Dir(), pids, n, budget)
		}
		pause := time.NewTimer(5 * time.Millisecond)
		<-pause.C
	}
}

// Kill ends processes that left the process group and the session (setsid, double fork), with and
// without cgroup.kill.
func TestKillEscapees(t *testing.T) {
	for _, each := range []bool{false, true} {
		t.Run(fmt.Sprintf("freeze_and_kill=%v", each), func(t *testing.T) {
			g := testGroup(t)
			// A double fork into a new session: the escapee's parent is gone, it is in no group of ours.
			spawn(t, g, `( setsid sleep 300 & ) ; sleep 300 & wait`)
			pids := waitProcs(t, g, 3)
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			defer cancel()
			var err error
			if each {
				err = g.killEach(ctx)
				if err == nil {
					err = g.await(ctx, "populated", 0)
				}
			} else {
				err = g.Kill(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			if pop, _ := g.Populated(); pop {
				t.Fatalf("still populated after Kill (had %v)", pids)
			}
			for _, pid := range pids {
				if err := syscall.Kill(pid, 0); err == nil && !zombie(pid) {
					t.Errorf("pid %d survived", pid)
				}
			}
		})
	}
}

func zombie(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

// procState is the state letter of pid in /proc/PID/stat.
func procState(t *testing.T, pid int) byte {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	i := strings.LastIndexByte(string(stat), ')')
	return stat[i+2]
}

func TestFreezeThaw(t *testing.T) {
	g := testGroup(t)
	spawn(t, g, `sleep 300 & wait`)
	pids := waitProcs(t, g, 2)
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if err := g.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	if f, err := g.Frozen(); err != nil || !f {
		t.Fatalf("Frozen = %v, %v after Freeze", f, err)
	}
	if err := g.Thaw(ctx); err != nil {
		t.Fatal(err)
	}
	if f, err := g.Frozen(); err != nil || f {
		t.Fatalf("Frozen = %v, %v after Thaw", f, err)
	}
	for _, pid := range pids {
		if st := procState(t, pid); st != 'S' && st != 'R' {
			t.Errorf("pid %d in state %c after Thaw", pid, st)
		}
	}
}

// A wait on cgroup.events ends with the context.
func TestAwaitBounded(t *testing.T) {
	g := testGroup(t)
	spawn(t, g, `sleep 300`)
	waitProcs(t, g, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := g.await(ctx, "populated", 0)
	if err == nil || !strings.Contains(err.Error(), "populated is 1, waiting for 0") {
		t.Fatalf("await on a populated group = %v, want a timeout naming populated", err)
	}
}

// A wait for an empty group ends without an error when the group is removed: Kill racing a tenant's
// own exit, whose group the exec backing removes, read ENODEV from its cgroup.events (seen as a
// flaky TestCloseKillsTenantsLeft). Another wait on a removed group is still an error.
func TestAwaitRemovedGroup(t *testing.T) {
	g := testGroup(t)
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	if err := g.await(t.Context(), "populated", 0); err != nil {
		t.Errorf("await populated 0 on a removed group = %v, want nil", err)
	}
	if err := g.Kill(t.Context()); err != nil {
		t.Errorf("Kill on a removed group = %v, want nil", err)
	}
	if err := g.await(t.Context(), "frozen", 1); err == nil {
		t.Error("await frozen 1 on a removed group = nil, want an error")
	}
}

func TestStatAndChildren(t *testing.T) {
	g := testGroup(t)
	kid := g.Child("kid")
	if err := kid.Make(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kid.Remove() })
	cmd := spawn(t, kid, `i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done`)
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	st, err := kid.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if st.CPU <= 0 {
		t.Errorf("CPU = %v after a busy loop, want > 0", st.CPU)
	}
	if _, err := os.Stat(kid.Dir() + "/memory.current"); st.HasMemory != (err == nil) {
		t.Errorf("HasMemory = %v, but memory.current: %v", st.HasMemory, err)
	}
	kids, err := g.Children()
	if err != nil || len(kids) != 1 || kids[0] != kid {
		t.Fatalf("Children = %v, %v; want [%v]", kids, err, kid)
	}
	lock, ok, err := g.TryLock()
	if err != nil || !ok {
		t.Fatalf("TryLock = %v, %v", ok, err)
	}
	defer lock.Close()
	if l2, ok, err := g.TryLock(); err != nil || ok {
		if l2 != nil {
			l2.Close()
		}
		t.Fatalf("second TryLock = %v, %v; want held", ok, err)
	}
}
