package exec

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"golang.org/x/sys/unix"

	"github.com/activator/activator/internal/backend/backendtest"
	"github.com/activator/activator/internal/cgroup"
	"github.com/activator/activator/internal/demoapp"
	"github.com/activator/activator/internal/foreign"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
	"github.com/activator/activator/internal/testenv"
)

// testRoot is a cgroup_root of this test's own (every test and test process needs one: the start-up
// cleanup kills whatever an unheld root holds), below this process's cgroup. It skips, or fails under
// ACTIVATOR_INTEGRATION=required, where no writable cgroup v2 exists. The root's directory is removed
// when the test ends.
func testRoot(t testing.TB) string {
	t.Helper()
	mnt, err := cgroup.Mount()
	if err != nil {
		testenv.Missing(t, "no cgroup v2: %v", err)
	}
	self, err := cgroup.Self()
	if err != nil {
		testenv.Missing(t, "no cgroup v2: %v", err)
	}
	root := filepath.Join(self, fmt.Sprintf("exec-test-%d-%d", os.Getpid(), tagSeq.Add(1)))
	if err := os.Mkdir(filepath.Join(mnt, root), 0o755); err != nil {
		testenv.Missing(t, "cgroup v2 not writable: %v", err)
	}
	t.Cleanup(func() {
		g := cgroup.At(filepath.Join(mnt, root))
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		kids, _ := g.Children()
		for _, k := range kids {
			if err := k.Kill(ctx); err != nil {
				t.Errorf("cleanup: %v", err)
			}
			_ = k.Remove()
			t.Errorf("tenant cgroup %s outlived the test", k.Dir())
		}
		_ = g.Remove()
	})
	return root
}

// contained returns a cgroup Containment over a fresh testRoot, closed when the test ends.
func contained(t testing.TB) *Containment {
	t.Helper()
	_, c := containAt(t)
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Containment.Close: %v", err)
		}
	})
	return c
}

// containAt returns a cgroup Containment over a fresh testRoot, and the root: the test closes it.
func containAt(t testing.TB) (string, *Containment) {
	t.Helper()
	root := testRoot(t)
	c, err := Contain(context.Background(), root, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if !c.cgroup {
		testenv.Missing(t, "no cgroup containment: %s", c.reason)
	}
	return root, c
}

// newShellFixture is newFixture for a tenant started through /bin/sh -c script, with $0 the test
// binary (a demoapp child).
func newShellFixture(t *testing.T, up registry.Upstream, script, block string, o Options) *fixture {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tag := fmt.Sprintf("%d-%d", os.Getpid(), tagSeq.Add(1))
	r := &registry.Route{Name: "app", Upstream: up}
	y := fmt.Sprintf("argv: [/bin/sh, -c, %q, %q]\n", script, self) + block
	var node yaml.Node
	if err := yaml.Unmarshal([]byte(y), &node); err != nil {
		t.Fatalf("test YAML: %v\n%s", err, y)
	}
	s, err := Decode(r, &node)
	if err != nil {
		t.Fatalf("Decode: %v\n%s", err, y)
	}
	st := s.(*Settings)
	st.Env = map[string]string{demoapp.ChildEnv: "1", "GORACE": "atexit_sleep_ms=0", "EXEC_TEST_TAG": tag}
	r.Settings = st
	if o.Logger == nil {
		o.Logger = testLogger(t)
	}
	b, err := New(r, o)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{b: b, up: up, tag: tag}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		if err := b.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
		if pids := tagged(tag); len(pids) > 0 {
			t.Errorf("after Close, processes %v of this backend still run", pids)
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return f
}

// The conformance suite, with the tenant in a cgroup of its own; with a ready marker, a start that
// hangs (DEMOAPP_HOLD_FILE) stages the suite's failed wake.
func TestConformanceCgroup(t *testing.T) {
	for _, marker := range []bool{false, true} {
		t.Run(fmt.Sprintf("ready_marker=%v", marker), func(t *testing.T) {
			backendtest.Run(t, func(t *testing.T) backendtest.Subject {
				hold := filepath.Join(t.TempDir(), "hold")
				block := fmt.Sprintf("env: {DEMOAPP_HOLD_FILE: %q}\n", hold)
				if marker {
					block += "ready_marker: demoapp ready\n"
				}
				f := newFixtureOpts(t, testenv.FreeTCP(t), block, Options{Logger: testLogger(t), Containment: contained(t)})
				s := f.subject()
				if marker {
					s.FailWake = func(t *testing.T) func() {
						if err := os.WriteFile(hold, nil, 0o644); err != nil {
							t.Fatal(err)
						}
						return func() { _ = os.Remove(hold) }
					}
				}
				return s
			})
		})
	}
}

// escapees is a wrapper that leaves two processes outside its process group before it execs the
// server: one through setsid, one through a double fork into a new session.
const escapees = `setsid sleep 300 & ( setsid sleep 300 & ) ; exec "$0"`

// Sleep ends the whole tree, including what left the process group (setsid, a double fork).
func TestSleepKillsEscapees(t *testing.T) {
	f := newShellFixture(t, testenv.FreeTCP(t), escapees, "", Options{Containment: contained(t)})
	f.wake(t)
	backendtest.Get(t, f.subject())
	waitFor(t, "the wrapper's three processes", func() bool { return len(tagged(f.tag)) == 3 })
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if err := f.b.Sleep(ctx); err != nil {
		t.Fatal(err)
	}
	if pids := tagged(f.tag); len(pids) > 0 {
		t.Fatalf("after Sleep, processes %v that left the process group still run", pids)
	}
}

// Without cgroups (process group, parent-death signal, child subreaper), what the group's SIGKILL
// killed is reaped: no zombie of the tenant's is left with the activator.
func TestProcessGroupReapsGrandchildren(t *testing.T) {
	if err := prctlSubreaper(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) })
	// A grandchild in the tenant's group whose parent exits: reparented to us (the subreaper).
	f := newShellFixture(t, testenv.FreeTCP(t), `( sleep 300 & ) ; exec "$0"`, "", Options{})
	f.wake(t)
	waitFor(t, "the grandchild", func() bool { return len(tagged(f.tag)) == 2 })
	var orphan int
	for _, pid := range tagged(f.tag) {
		if pid != f.b.PID() {
			orphan = pid
		}
	}
	waitFor(t, "the grandchild to be reparented to the test", func() bool { return ppid(orphan) == os.Getpid() })
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if err := f.b.Sleep(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", orphan)); err == nil {
		t.Fatalf("grandchild %d not reaped after Sleep (state %q)", orphan, procStat(orphan))
	}
}

// A tenant that daemonizes fails its wake with a message saying so, and what it left is killed.
func TestDaemonizingTenant(t *testing.T) {
	const daemonize = `( setsid "$0" & ) ; exit 0`
	for _, marker := range []bool{false, true} {
		t.Run(fmt.Sprintf("ready_marker=%v", marker), func(t *testing.T) {
			block := ""
			if marker {
				block = "ready_marker: never printed\n"
			}
			f := newShellFixture(t, testenv.FreeTCP(t), daemonize, block, Options{Containment: contained(t)})
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			defer cancel()
			life, err := f.b.Wake(ctx, tenant.Discard)
			if !marker {
				if err != nil {
					t.Fatal(err)
				}
				select {
				case <-life.Done():
				case <-ctx.Done():
					t.Fatal("the daemonizing tenant's Life never ended")
				}
				err = life.Err()
			}
			var de *DaemonError
			if !errors.As(err, &de) || len(de.Leftovers) == 0 {
				t.Fatalf("got %v, want a *DaemonError with leftovers", err)
			}
			if want := "the tenant forked into the background; run it in the foreground (nginx: `daemon off;`)"; !strings.HasPrefix(err.Error(), want) {
				t.Errorf("message %q, want it to start %q", err, want)
			}
			if pids := tagged(f.tag); len(pids) > 0 {
				t.Errorf("the daemon's processes %v still run", pids)
			}
		})
	}
}

// sleep: freeze freezes the cgroup (the tenant stops answering, its processes stay) and Wake thaws
// it (the same processes answer again); Stop then ends it for real, frozen or not.
func TestFreezeThaw(t *testing.T) {
	c := contained(t)
	f := newShellFixture(t, testenv.FreeTCP(t), `sleep 300 & exec "$0"`, "sleep: freeze\n", Options{Containment: c})
	life := f.wake(t)
	backendtest.Get(t, f.subject())
	pid := f.b.PID()
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if err := f.b.Sleep(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(life.Err(), tenant.ErrSlept) {
		t.Errorf("Life after a freeze: %v, want ErrSlept", life.Err())
	}
	g := *f.b.proc.group
	if frozen, err := g.Frozen(); err != nil || !frozen {
		t.Fatalf("cgroup frozen = %v, %v after Sleep", frozen, err)
	}
	if n := len(tagged(f.tag)); n != 2 {
		t.Fatalf("%d processes after the freeze, want both kept", n)
	}
	// Frozen: the kernel accepts the connection, nobody answers.
	hc := &http.Client{Timeout: 200 * time.Millisecond}
	if resp, err := hc.Get("http://" + f.up.Address + "/"); err == nil {
		resp.Body.Close()
		t.Fatal("a frozen tenant answered")
	}
	rec := &recorder{}
	life2, err := f.b.Wake(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(rec.phases, ","); got != PhaseThaw {
		t.Errorf("wake phases %q, want %q", got, PhaseThaw)
	}
	if life2.Err() != nil || f.b.PID() != pid {
		t.Fatalf("after thaw: life %v, pid %d (was %d)", life2.Err(), f.b.PID(), pid)
	}
	backendtest.Get(t, f.subject())
	// Frozen again, then stopped for real (a tenant that fails its gate after a thaw).
	if err := f.b.Sleep(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if pids := tagged(f.tag); len(pids) > 0 {
		t.Fatalf("after Stop, processes %v still run", pids)
	}
	if _, err := os.Stat(g.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the tenant's cgroup %s is still there after Stop: %v", g.Dir(), err)
	}
}

// sleep: freeze without cgroups fails the sleep, naming why, and leaves the tenant running.
func TestFreezeWithoutCgroup(t *testing.T) {
	c, err := Contain(context.Background(), "off", testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	f := newFixtureOpts(t, testenv.FreeTCP(t), "", Options{Logger: testLogger(t), Containment: c})
	f.b.settings.Sleep = SleepFreeze // Decode allows it; Check and the wake report it
	_, err = f.b.Wake(context.Background(), tenant.Discard)
	if err == nil || !strings.Contains(err.Error(), "sleep: freeze is unavailable") {
		t.Fatalf("Wake = %v, want sleep: freeze unavailable", err)
	}
}

// Check names each setting the host cannot honour: limits whose controller is not enabled for the
// cgroup root (on a host where it is, the limit is fine), and freeze and limits without cgroups.
func TestCheckLimits(t *testing.T) {
	settings := func(t *testing.T, block string) *registry.Route {
		s, errs, _ := decodeYAML(t, tcp, "argv: [/bin/true]\n"+block)
		if errs != nil {
			t.Fatal(errs)
		}
		return &registry.Route{Name: "app", Upstream: tcp, Settings: s}
	}
	c := contained(t)
	have, err := cgroup.At(filepath.Dir(c.root.Dir())).Controllers()
	if err != nil {
		t.Fatal(err)
	}
	p := NewProvider(Options{Containment: c})
	for _, l := range []struct{ key, ctrl, value string }{{"memory_max", "memory", "64MiB"}, {"cpu_max", "cpu", "0.5"}, {"pids_max", "pids", "10"}} {
		err := p.Check(context.Background(), settings(t, l.key+": "+l.value+"\n"))
		available := strings.Contains(" "+strings.Join(have, " ")+" ", " "+l.ctrl+" ")
		switch {
		case available && err != nil:
			t.Errorf("%s with the %s controller enabled: %v", l.key, l.ctrl, err)
		case !available && (err == nil || !strings.Contains(err.Error(), l.key+" is unavailable: the "+l.ctrl+" controller is not enabled")):
			t.Errorf("%s without the %s controller: Check = %v, want it unavailable", l.key, l.ctrl, err)
		}
	}
	if err := p.Check(context.Background(), settings(t, "sleep: freeze\n")); err != nil {
		t.Errorf("sleep: freeze with cgroups: %v", err)
	}

	off, err := Contain(context.Background(), "off", testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	err = NewProvider(Options{Containment: off}).Check(context.Background(), settings(t, "sleep: freeze\npids_max: 10\n"))
	for _, want := range []string{"sleep: freeze is unavailable", "pids_max is unavailable: exec tenants are not in cgroups here (cgroup_root: off)"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("without cgroups: Check = %v, want %q", err, want)
		}
	}
}

// Two activators never share a cgroup root: the second is refused while the first holds it.
func TestRootHeld(t *testing.T) {
	root := testRoot(t)
	c, err := Contain(context.Background(), root, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := Contain(context.Background(), root, testLogger(t)); err == nil || !strings.Contains(err.Error(), "held by another running activator") {
		t.Fatalf("second Contain on a held root = %v, want it refused", err)
	}
}

// A tenant started through a wrapper (sh -c 'server & wait') outlives a SIGKILLed activator only until
// the next one starts: Contain, at start-up, kills it, and its port is free again.
func TestRestartKillsOrphans(t *testing.T) {
	root := testRoot(t)
	up := testenv.FreeTCP(t)
	tag := fmt.Sprintf("%d-%d", os.Getpid(), tagSeq.Add(1))
	t.Cleanup(func() {
		for _, pid := range tagged(tag) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	_, kill := startParent(t, up, parentEnv+"="+string(ListenEnv), parentRootEnv+"="+root, parentTagEnv+"="+tag)
	kill()
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	// The wrapper dies of its parent-death signal; the server, its child, is an orphan that keeps
	// the port.
	waitFor(t, "the wrapper to die with the activator", func() bool { return len(tagged(tag)) == 1 })
	c, err := Contain(ctx, root, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if pids := tagged(tag); len(pids) > 0 {
		t.Fatalf("after the restart's Contain, the orphaned tenant %v still runs", pids)
	}
	ln, err := net.Listen("tcp", up.Address)
	if err != nil {
		t.Fatalf("the orphan's port is still taken: %v", err)
	}
	ln.Close()
}

func ppid(pid int) int {
	f := strings.Fields(procStat(pid))
	if len(f) < 2 {
		return 0
	}
	var n int
	fmt.Sscan(f[1], &n)
	return n
}

// procStat is the part of /proc/PID/stat after the command: "S 1234 …" (state, ppid, …).
func procStat(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		return strings.TrimSpace(s[i+1:])
	}
	return s
}

// TestDaemonizingNginx: the issue's own finding, with real nginx started without `daemon off;`. It
// forks its master into the background and exits 0. The wake fails saying so, the background master
// and its workers are killed (the port is free again), and the next wake fails the same way instead
// of passing its gate against a stray daemon.
func TestDaemonizingNginx(t *testing.T) {
	nginx, err := osexec.LookPath("nginx")
	if err != nil {
		testenv.Missing(t, "nginx is not installed (apt-get install nginx-light): %v", err)
		return
	}
	dir := t.TempDir()
	up := testenv.FreeTCP(t)
	conf := fmt.Sprintf(`worker_processes 2;
pid %s/nginx.pid;
error_log stderr;
events {}
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  server { listen %s; return 200 "hello from nginx\n"; }
}
`, dir, up.Address)
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf("exec %s -p %s -c nginx.conf", nginx, dir)
	f := newShellFixture(t, up, script, "", Options{Containment: contained(t)})
	for round := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		life, err := f.b.Wake(ctx, tenant.Discard)
		if err == nil {
			select {
			case <-life.Done():
				err = life.Err()
			case <-ctx.Done():
				cancel()
				t.Fatalf("round %d: nginx forked into the background and its Life never ended", round)
			}
		}
		cancel()
		var de *DaemonError
		if !errors.As(err, &de) {
			t.Fatalf("round %d: got %v, want a *DaemonError", round, err)
		}
		if !strings.Contains(err.Error(), "daemon off;") {
			t.Errorf("round %d: message %q does not tell how to run nginx in the foreground", round, err)
		}
		if held := foreign.Check(context.Background(), up.Network, up.Address); held != nil {
			t.Fatalf("round %d: after the failed wake the port is still served: %v", round, held)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "nginx.pid")); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && alive(pid) {
				t.Fatalf("round %d: nginx's background master %d still runs", round, pid)
			}
		}
	}
}

// A frozen tenant killed behind the backend's back: the next Wake starts a fresh child with a live
// Life, never hands out the ended one, and the new child serves.
func TestDiedWhileFrozen(t *testing.T) {
	f := newShellFixture(t, testenv.FreeTCP(t), `exec "$0"`, "sleep: freeze\n", Options{Containment: contained(t)})
	f.wake(t)
	pid := f.b.PID()
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if err := f.b.Sleep(ctx); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil { // reaches a frozen task
		t.Fatal(err)
	}
	waitFor(t, "the frozen child to be reaped", func() bool { return !alive(pid) && f.b.proc.exited() })
	life := backendtest.Wake(t, f.subject()) // Wake, then its health gate
	if life.Err() != nil {
		t.Fatalf("Wake returned an ended Life: %v", life.Err())
	}
	if f.b.PID() == pid {
		t.Fatalf("Wake kept the dead child %d", pid)
	}
	backendtest.Get(t, f.subject())
}

// Usage, read at every /metrics scrape, costs nothing for the routes that never woke (they have no
// cgroup): it sorted every route's name first, about 9 MB a scrape at 100,000 routes.
func TestUsageSkipsIdleRoutes(t *testing.T) {
	s, errs, _ := decodeYAML(t, tcp, "argv: [/bin/true]\n")
	if errs != nil {
		t.Fatal(errs)
	}
	p := NewProvider(Options{Logger: testLogger(t)})
	for i := range 2000 {
		b, err := p.Open(&registry.Route{Name: fmt.Sprintf("r%d", i), Upstream: tcp, Settings: s})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.(*Backend).Close(context.Background()) })
	}
	if us := p.Usage(); len(us) != 0 {
		t.Fatalf("Usage of never-woken routes: %v", us)
	}
	if n := testing.AllocsPerRun(5, func() { p.Usage() }); n != 0 {
		t.Errorf("Usage of 2,000 never-woken routes allocates %.0f objects, want 0", n)
	}
}

// TestCloseKillsTenantsLeft: a tenant still running when the containment closes (a stop that
// outlasted the shutdown's grace) is killed with everything that left its process group, and its
// group removed, before the activator exits. Found with the real binary: after a SIGTERM whose grace
// ended mid-stop, a tenant's setsid child ran on in the cgroup, three runs in three.
func TestCloseKillsTenantsLeft(t *testing.T) {
	_, c := containAt(t)
	f := newShellFixture(t, testenv.FreeTCP(t), escapees, "", Options{Containment: c})
	f.wake(t)
	backendtest.Get(t, f.subject())
	waitFor(t, "the wrapper's three processes", func() bool { return len(tagged(f.tag)) == 3 })
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if pids := tagged(f.tag); len(pids) > 0 {
		t.Fatalf("after the containment closed, the tenant's processes %v still run", pids)
	}
	if _, err := os.Stat(c.root.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the root %s is still there after Close (%v)", c.root.Dir(), err)
	}
}

// TestRootRemovedIsLockedAgain: the root, empty while every tenant sleeps, can be removed by anyone;
// the next spawn makes it again and locks it again, so a second activator on the same root is still
// refused. Before, the lock stayed on the removed directory, and a second activator started, took
// the new root and killed the first one's tenant as an orphan.
func TestRootRemovedIsLockedAgain(t *testing.T) {
	root, c := containAt(t)
	defer c.Close()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.root.Remove())
	f := newFixtureOpts(t, testenv.FreeTCP(t), "", Options{Logger: testLogger(t), Containment: c})
	f.wake(t)
	backendtest.Get(t, f.subject())
	if _, err := Contain(context.Background(), root, testLogger(t)); err == nil || !strings.Contains(err.Error(), "held by another running activator") {
		t.Fatalf("second Contain on the root made again = %v, want it refused", err)
	}
	backendtest.Get(t, f.subject()) // the first one's tenant was not killed as an orphan
}
