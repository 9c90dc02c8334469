package exec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/activator/activator/internal/backend/backendtest"
	"github.com/activator/activator/internal/backend/exec/shim"
	"github.com/activator/activator/internal/backend/exec/shim/native"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
	"github.com/activator/activator/internal/testenv"
)

// standbyPID is the pid of f's standby, or 0.
func (f *fixture) standbyPID() int {
	f.b.mu.Lock()
	defer f.b.mu.Unlock()
	if f.b.standby == nil {
		return 0
	}
	return f.b.standby.p.pid
}

// exe is the executable pid runs, from /proc.
func exe(t *testing.T, pid int) string {
	t.Helper()
	p, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		t.Fatalf("pid %d: %v", pid, err)
	}
	return p
}

// environ is pid's environment, from /proc.
func environ(t *testing.T, pid int) []string { return procStrings(t, pid, "environ") }

// cmdline is pid's argv, from /proc.
func cmdline(t *testing.T, pid int) []string { return procStrings(t, pid, "cmdline") }

// procStrings is /proc/<pid>/<file>, a list of NUL-terminated strings. It waits for the file to be
// non-empty: the kernel closes the close-on-exec pipe that cmd.Start waits on before it has laid out
// the new program's arguments and environment, so right after a spawn both can still read empty.
func procStrings(t *testing.T, pid int, file string) []string {
	t.Helper()
	var b []byte
	waitFor(t, fmt.Sprintf("pid %d's %s", pid, file), func() bool {
		var err error
		if b, err = os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file)); err != nil {
			t.Fatalf("pid %d: %v", pid, err)
		}
		return len(b) > 0
	})
	return strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
}

// pipes lists what pid's descriptors link to, from /proc ("pipe:[123]", "socket:[456]", ...).
func pipes(t *testing.T, pid int) []string {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var links []string
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil {
			links = append(links, l)
		}
	}
	return links
}

// TestStandby: with standby: true, a sleep leaves a waiting shim in the tenant's next cgroup (and
// nothing listening), and the next wake lets that process exec the tenant: same pid, the tenant's own
// executable and environment, the gate closed, LISTEN_PID its own in listen_fds mode; then the next
// sleep starts the next standby, and Close kills it.
func TestStandby(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, block string
		cgroup      bool
		gateFD      int
		native      bool // the native shim is the standby, as the Provider starts it; else /bin/sh or the Go shim
	}{
		{"env", "listen: env\n", false, 3, true},
		{"listen_fds", "listen: listen_fds\n", false, 4, true},
		{"env in a cgroup", "listen: env\n", true, 3, true},
		{"listen_fds in a cgroup", "listen: listen_fds\n", true, 4, true},
		{"the shell", "listen: listen_fds\n", false, 4, false},
		// A name no shell passes on: package shim is the standby.
		{"the Go shim", "listen: env\nenv: {my-var: \"1\"}\n", false, 3, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var o Options
			if c.cgroup {
				o.Containment = contained(t)
			}
			if c.native {
				o.native = nativeShim(t)
			}
			o.Logger = testLogger(t)
			f := newFixtureOpts(t, testenv.FreeTCP(t), "standby: true\n"+c.block, o)
			s := f.subject()
			first := f.wake(t)
			backendtest.Sleep(t, s)
			if first.Err() == nil {
				t.Fatal("the first Life goes on after Sleep")
			}
			sb := f.standbyPID()
			if sb == 0 || !alive(sb) {
				t.Fatalf("after Sleep: standby pid %d, alive %v", sb, alive(sb))
			}
			// The standby is a shim: the native one; without it dash, or package shim (the test
			// binary, as the activator's binary, links it) where the environment has a name no shell
			// passes on. The native and Go shims read their mode from the environment.
			arg0, wantArg0 := cmdline(t, sb)[0], "sh"
			if c.native || strings.Contains(c.block, "my-var") || binSh() == "" {
				wantArg0 = shim.Arg0
				mode := shim.ModeExec
				if strings.Contains(c.block, "listen_fds") {
					mode = shim.ModeListenFDs
				}
				if !slices.Contains(environ(t, sb), shim.Env+"="+mode) {
					t.Errorf("the standby's environment lacks %s=%s", shim.Env, mode)
				}
			}
			switch got := exe(t, sb); {
			case c.native && !strings.Contains(got, native.Name):
				t.Errorf("the standby runs %s, want the native shim's memfd %s", got, native.Name)
			case wantArg0 == "sh" && got == self:
				t.Errorf("the shell standby runs the tenant's executable %s before any wake", got)
			}
			if arg0 != wantArg0 {
				t.Errorf("the standby's argv[0] is %q, want %q", arg0, wantArg0)
			}
			gate, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", sb, c.gateFD))
			if err != nil || !strings.HasPrefix(gate, "pipe:") {
				t.Errorf("the standby's fd %d is %q (%v), want its gate pipe", c.gateFD, gate, err)
			}
			if c.cgroup {
				cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", sb))
				if err != nil {
					t.Fatal(err)
				}
				if dir := f.b.group.Dir(); !strings.Contains(string(cg), filepath.Base(dir)) {
					t.Errorf("the standby is in %q, not the tenant's cgroup %s", cg, dir)
				}
			}
			if f.b.PID() != 0 {
				t.Errorf("PID() = %d while only the standby waits; want 0", f.b.PID())
			}

			rec := &recorder{}
			life := backendtest.WakeTracked(t, s, rec)
			if got := f.b.PID(); got != sb {
				t.Fatalf("woken tenant pid %d, want the standby's %d", got, sb)
			}
			if got := exe(t, sb); got != self {
				t.Errorf("the woken tenant runs %s, want %s", got, self)
			}
			env := environ(t, sb)
			for _, kv := range env {
				if strings.HasPrefix(kv, shim.Env+"=") || strings.HasPrefix(kv, shim.GateEnv+"=") {
					t.Errorf("the tenant sees the shim's %s", kv)
				}
			}
			if strings.Contains(c.block, "listen_fds") && !slices.Contains(env, fmt.Sprintf("LISTEN_PID=%d", sb)) {
				t.Errorf("listen_fds tenant's environment lacks LISTEN_PID=%d", sb)
			}
			if fds := pipes(t, sb); slices.Contains(fds, gate) {
				t.Errorf("the tenant holds the standby's gate %s (its pipes: %q)", gate, fds)
			}
			if !slices.ContainsFunc(rec.notes, func(n string) bool { return strings.Contains(n, "released the standby") }) {
				t.Errorf("the wake's notes %q do not say it used the standby", rec.notes)
			}
			if f.standbyPID() != 0 {
				t.Error("the released standby is still the standby")
			}

			backendtest.Sleep(t, s)
			if life.Err() == nil {
				t.Fatal("the standby's Life goes on after Sleep")
			}
			next := f.standbyPID()
			if next == 0 || next == sb {
				t.Fatalf("after the second Sleep: standby %d (the last was %d)", next, sb)
			}
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			defer cancel()
			if err := f.b.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if alive(next) {
				t.Errorf("standby %d alive after Close", next)
			}
		})
	}
}

// TestStandbyDied: a standby killed while the route slept is noticed at the wake, which says so and
// spawns a new child.
func TestStandbyDied(t *testing.T) {
	f := newFixture(t, testenv.FreeTCP(t), "standby: true\n")
	s := f.subject()
	f.wake(t)
	backendtest.Sleep(t, s)
	sb := f.standbyPID()
	if sb == 0 {
		t.Fatal("no standby after Sleep")
	}
	if err := syscall.Kill(sb, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	f.b.mu.Lock()
	p := f.b.standby.p
	f.b.mu.Unlock()
	<-p.done // reaped by its owner
	rec := &recorder{}
	backendtest.WakeTracked(t, s, rec)
	if pid := f.b.PID(); pid == 0 || pid == sb {
		t.Fatalf("after the standby died, the wake's tenant is pid %d (the standby was %d)", pid, sb)
	}
	if !slices.ContainsFunc(rec.notes, func(n string) bool { return strings.Contains(n, "exited while the route slept") }) {
		t.Errorf("the wake's notes %q do not say why the standby was not used", rec.notes)
	}
}

// TestStandbySecretsChanged: a standby started before a reload named a variable as a secret holds that
// variable; the wake drops it and spawns a child without it, as a wake without standby would.
func TestStandbySecretsChanged(t *testing.T) {
	const secret = "EXEC_TEST_STANDBY_SECRET"
	t.Setenv(secret, "hunter2")
	var names atomic.Pointer[[]string]
	names.Store(&[]string{})
	f := newFixtureOpts(t, testenv.FreeTCP(t), "standby: true\n", Options{
		Logger:    testLogger(t),
		SecretEnv: func() []string { return *names.Load() },
	})
	s := f.subject()
	f.wake(t)
	backendtest.Sleep(t, s)
	sb := f.standbyPID()
	if sb == 0 || !slices.Contains(environ(t, sb), secret+"=hunter2") {
		t.Fatalf("standby %d: want it started with %s, not yet a secret", sb, secret)
	}
	names.Store(&[]string{secret}) // a reload names it
	rec := &recorder{}
	backendtest.WakeTracked(t, s, rec)
	pid := f.b.PID()
	if pid == sb {
		t.Fatal("the wake released a standby whose environment holds a variable now named a secret")
	}
	if alive(sb) {
		t.Errorf("the dropped standby %d is alive", sb)
	}
	for _, kv := range environ(t, pid) {
		if strings.HasPrefix(kv, secret+"=") {
			t.Errorf("the tenant's environment holds the secret: %s", kv)
		}
	}
	if !slices.ContainsFunc(rec.notes, func(n string) bool { return strings.Contains(n, "other secrets") }) {
		t.Errorf("the wake's notes %q do not say why the standby was not used", rec.notes)
	}
}

// TestStandbyPrepare: Prepare (the activator's call when a route starts asleep) starts the standby of
// the route's first wake, which that wake releases; with a child running already, without standby:
// true and after Close it starts none.
func TestStandbyPrepare(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	for _, listen := range []string{"env", "listen_fds"} {
		t.Run(listen, func(t *testing.T) {
			f := newFixture(t, testenv.FreeTCP(t), "standby: true\nlisten: "+listen+"\n")
			f.b.Prepare(ctx)
			sb := f.standbyPID()
			if sb == 0 || !alive(sb) {
				t.Fatalf("after Prepare: standby pid %d", sb)
			}
			rec := &recorder{}
			backendtest.WakeTracked(t, f.subject(), rec)
			if got := f.b.PID(); got != sb {
				t.Fatalf("the first wake's tenant is pid %d, want the prepared standby's %d", got, sb)
			}
			if !slices.ContainsFunc(rec.notes, func(n string) bool { return strings.Contains(n, "released the standby started with the route") }) {
				t.Errorf("the first wake's notes %q do not say it used the standby started with the route", rec.notes)
			}
			f.b.Prepare(ctx)
			if pid := f.standbyPID(); pid != 0 {
				t.Errorf("Prepare with the tenant running started standby %d", pid)
			}
			if err := f.b.Close(ctx); err != nil {
				t.Fatal(err)
			}
			f.b.Prepare(ctx)
			if pid := f.standbyPID(); pid != 0 {
				t.Errorf("Prepare after Close started standby %d", pid)
			}
			if pids := tagged(f.tag); len(pids) > 0 {
				t.Errorf("after Close, processes %v of the route run", pids)
			}
		})
	}
	f := newFixture(t, testenv.FreeTCP(t), "")
	f.b.Prepare(ctx)
	if pids := tagged(f.tag); len(pids) > 0 || f.standbyPID() != 0 {
		t.Errorf("Prepare without standby: true started %v", pids)
	}
}

// TestStandbyNotes: `activator check` says what a standby costs, and says nothing without one.
func TestStandbyNotes(t *testing.T) {
	p := NewProvider(Options{})
	on := &registry.Route{Name: "a", Settings: &Settings{Argv: []string{"/bin/true"}, Path: "/bin/true", Standby: true}}
	n := p.Notes(context.Background(), on)
	if len(n) != 1 || !strings.HasPrefix(n[0], "standby: ") {
		t.Fatalf("Notes with standby = %q", n)
	}
	if nativeHere() && !strings.Contains(n[0], "native shim") {
		t.Errorf("Notes with standby = %q, want it to name the native shim that holds the standby", n)
	}
	p.Close()
	off := &registry.Route{Name: "b", Settings: &Settings{Argv: []string{"/bin/true"}, Path: "/bin/true"}}
	if n := p.Notes(context.Background(), off); n != nil {
		t.Errorf("Notes without standby = %q", n)
	}
	fds := &registry.Route{Name: "c", Settings: &Settings{Argv: []string{"/bin/true"}, Path: "/bin/true", Listen: ListenFDs}}
	if n := p.Notes(context.Background(), fds); n != nil {
		t.Errorf("Notes of listen_fds with the native shim = %q, want none", n)
	}
	// A native shim that did not open is noted, with why, for each route that needs a shim.
	q := NewProvider(Options{})
	q.nativeTried, q.nativeErr = true, errors.New("trial run: permission denied")
	if n := q.Notes(context.Background(), fds); len(n) != 1 || !strings.Contains(n[0], "native shim is unavailable here (trial run: permission denied)") {
		t.Errorf("Notes of listen_fds without the native shim = %q", n)
	}
	if n := q.Notes(context.Background(), on); len(n) != 2 || !strings.Contains(n[1], "/bin/sh") {
		t.Errorf("Notes of a standby without the native shim = %q", n)
	}
}

// TestStandbyNotOnLastSleep: the sleep of a route a reload retires (tenant.LastSleep) starts no
// standby: Close follows at once.
func TestStandbyNotOnLastSleep(t *testing.T) {
	f := newFixture(t, testenv.FreeTCP(t), "standby: true\n")
	f.wake(t)
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if err := f.b.Sleep(tenant.LastSleep(ctx)); err != nil {
		t.Fatal(err)
	}
	if pid := f.standbyPID(); pid != 0 {
		t.Errorf("the last sleep started standby %d", pid)
	}
	if pids := tagged(f.tag); len(pids) > 0 {
		t.Errorf("after the last sleep, processes %v of the route run", pids)
	}
}

// TestStandbyBound: with maxStandbys waiting already a sleep starts none (and the wake after it
// spawns); below it one starts, and the count goes down again when a wake releases it or Close drops
// it.
func TestStandbyBound(t *testing.T) {
	var n atomic.Int64
	n.Store(maxStandbys)
	f := newFixtureOpts(t, testenv.FreeTCP(t), "standby: true\n", Options{Logger: testLogger(t), standbys: &n})
	s := f.subject()
	f.wake(t)
	backendtest.Sleep(t, s)
	if pid := f.standbyPID(); pid != 0 || n.Load() != maxStandbys {
		t.Fatalf("at the bound: standby %d, count %d; want none and %d", pid, n.Load(), maxStandbys)
	}
	n.Store(maxStandbys - 1)
	f.wake(t)
	backendtest.Sleep(t, s)
	if pid := f.standbyPID(); pid == 0 || n.Load() != maxStandbys {
		t.Fatalf("below the bound: standby %d, count %d; want one and %d", pid, n.Load(), maxStandbys)
	}
	f.wake(t) // released
	if n.Load() != maxStandbys-1 {
		t.Errorf("after the release the count is %d, want %d", n.Load(), maxStandbys-1)
	}
	backendtest.Sleep(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if err := f.b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n.Load() != maxStandbys-1 {
		t.Errorf("after Close dropped the standby the count is %d, want %d", n.Load(), maxStandbys-1)
	}
}

func TestSameNames(t *testing.T) {
	for _, c := range []struct {
		a, b []string
		want bool
	}{
		{nil, nil, true},
		{nil, []string{}, true},
		{[]string{"A", "B"}, []string{"B", "A"}, true},
		{[]string{"A", "A"}, []string{"A"}, true},
		{[]string{"A"}, []string{"A", "B"}, false},
		{[]string{"A"}, nil, false},
	} {
		if got := sameNames(c.a, c.b); got != c.want {
			t.Errorf("sameNames(%q, %q) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}
