package exec

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	osexec "os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/backend/backendtest"
	"github.com/activator/activator/internal/backend/exec/shim"
	"github.com/activator/activator/internal/backend/exec/shim/native"
	"github.com/activator/activator/internal/demoapp"
	"github.com/activator/activator/internal/foreign"
	"github.com/activator/activator/internal/health"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
	"github.com/activator/activator/internal/testenv"
)

// budget bounds every wait in these tests. It is a generous upper bound that turns a hang into a
// failure, never a timing assertion.
const budget = 2 * time.Minute

var tagSeq atomic.Int64

// fixture is one backend over a demoapp child, plus what a test needs to look at it from outside.
type fixture struct {
	b   *Backend
	up  registry.Upstream
	tag string // EXEC_TEST_TAG value in the child's environment, to find it in /proc
}

// newFixture decodes an exec block (YAML) for a demoapp child on up, opens the backend and registers
// its Close. The child's argv is this test binary; env gets ACTIVATOR_DEMOAPP=1 and a unique tag. The
// backend logs warnings and errors to the test's output.
func newFixture(t *testing.T, up registry.Upstream, block string) *fixture {
	t.Helper()
	return newFixtureLog(t, up, block, testLogger(t))
}

// newFixtureLog is newFixture with the backend logging to log.
func newFixtureLog(t *testing.T, up registry.Upstream, block string, log *slog.Logger) *fixture {
	t.Helper()
	return newFixtureOpts(t, up, block, Options{Logger: log})
}

// newFixtureOpts is newFixture with the backend's Options o.
func newFixtureOpts(t *testing.T, up registry.Upstream, block string, o Options) *fixture {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tag := fmt.Sprintf("%d-%d", os.Getpid(), tagSeq.Add(1))
	r := &registry.Route{Name: "app", Upstream: up}
	y := fmt.Sprintf("argv: [%q]\n", self) + block
	var node yaml.Node
	if err := yaml.Unmarshal([]byte(y), &node); err != nil {
		t.Fatalf("test YAML: %v\n%s", err, y)
	}
	s, err := Decode(r, &node)
	if err != nil {
		t.Fatalf("Decode: %v\n%s", err, y)
	}
	st := s.(*Settings)
	if st.Env == nil {
		st.Env = map[string]string{}
	}
	st.Env[demoapp.ChildEnv] = "1"
	st.Env["GORACE"] = "atexit_sleep_ms=0" // a -race child otherwise lingers a second at exit
	st.Env["EXEC_TEST_TAG"] = tag
	r.Settings = st
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
		}
	})
	return f
}

func (f *fixture) subject() backendtest.Subject {
	return backendtest.Subject{
		Backend:  f.b,
		Upstream: f.up,
		Body:     "hello from demoapp",
		Budget:   budget,
		Kill: func(t *testing.T) {
			t.Helper()
			pid := f.b.PID()
			if pid <= 0 {
				t.Fatal("Kill: no child running")
			}
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatalf("kill -9 %d: %v", pid, err)
			}
		},
		Awake: func(t *testing.T) bool { return len(tagged(f.tag)) > 0 },
	}
}

func (f *fixture) wake(t *testing.T) *tenant.Life {
	t.Helper()
	return backendtest.Wake(t, f.subject())
}

// testLogger logs warnings and errors to the test's output; child output lines (Info) are dropped.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// tagged lists the live (non-zombie) processes whose environment holds EXEC_TEST_TAG=tag.
func tagged(tag string) []int { return testenv.PidsWithEnv("EXEC_TEST_TAG", tag) }

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// "pid (comm) S ...": the state follows the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return false
	}
	return stat[i+2] != 'Z' && stat[i+2] != 'X'
}

// waitFor polls cond every few milliseconds until it holds, failing after budget.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(budget)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("%s: not within %v", what, budget)
		}
	}
}

func tempSocket(t testing.TB) registry.Upstream {
	t.Helper()
	dir, err := os.MkdirTemp("", "exec")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return registry.Upstream{Network: "unix", Address: filepath.Join(dir, "app.sock")}
}

func TestConformance(t *testing.T) {
	cases := []struct {
		name   string
		up     func(t testing.TB) registry.Upstream
		block  string
		native bool // listen_fds through the native shim, as the Provider starts it; else /bin/sh or the Go shim
	}{
		{"tcp_env", testenv.FreeTCP, "listen: env\n", false},
		{"unix_env", tempSocket, "", false},
		{"tcp_listen_fds", testenv.FreeTCP, "listen: listen_fds\n", true},
		{"unix_listen_fds", tempSocket, "listen: listen_fds\n", true},
		{"tcp_listen_fds_shell", testenv.FreeTCP, "listen: listen_fds\n", false},
		// A variable name no shell passes on: the activator's own binary is the shim instead of /bin/sh.
		{"tcp_listen_fds_self_shim", testenv.FreeTCP, "listen: listen_fds\nenv: {demo.var: \"1\"}\n", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := Options{Logger: testLogger(t)}
			if c.native {
				o.native = nativeShim(t)
			}
			backendtest.Run(t, func(t *testing.T) backendtest.Subject {
				return newFixtureOpts(t, c.up(t), c.block, o).subject()
			})
		})
	}
}

// A child that prints far more than a pipe buffer holds before listening still starts and serves.
func TestChattyChild(t *testing.T) {
	f := newFixture(t, testenv.FreeTCP(t), "env: {DEMOAPP_CHATTY: \"20000\"}\n")
	f.wake(t)
	backendtest.Get(t, f.subject())
	out := f.b.proc.out.Bytes()
	if len(out) > TailSize {
		t.Errorf("kept %d bytes of output, want at most %d", len(out), TailSize)
	}
	if !bytes.Contains(out, []byte("demoapp ready on")) {
		t.Errorf("output tail lacks the ready line; tail ends %q", out[max(0, len(out)-300):])
	}
}

// recorder is a Tracker that records phases and notes; Phase may run a hook.
type recorder struct {
	mu      sync.Mutex
	phases  []string
	notes   []string
	onPhase func(name string)
}

func (r *recorder) Phase(name string) {
	r.mu.Lock()
	r.phases = append(r.phases, name)
	r.mu.Unlock()
	if r.onPhase != nil {
		r.onPhase(name)
	}
}

func (r *recorder) Note(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes = append(r.notes, msg)
}

func TestExitBeforeReady(t *testing.T) {
	const env = "env: {DEMOAPP_EXIT_CODE: \"3\", DEMOAPP_EXIT_MESSAGE: \"config.toml: no such file\"}\n"
	checkExit := func(t *testing.T, err error) {
		t.Helper()
		var ee *ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("error %v (%T) is not an *ExitError", err, err)
		}
		if ee.Code != 3 || ee.Signal != 0 {
			t.Errorf("code %d signal %v, want code 3", ee.Code, ee.Signal)
		}
		if want := "exited with code 3: config.toml: no such file"; ee.Error() != want {
			t.Errorf("message %q, want %q", ee.Error(), want)
		}
	}

	t.Run("ready_marker", func(t *testing.T) {
		f := newFixture(t, testenv.FreeTCP(t), env+"ready_marker: demoapp ready\n")
		rec := &recorder{}
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		life, err := f.b.Wake(ctx, rec)
		if err == nil {
			t.Fatalf("Wake succeeded (life %v), want the exit error", life)
		}
		checkExit(t, err)
		if pid := f.b.PID(); pid != 0 {
			t.Errorf("PID() = %d after a failed wake, want 0", pid)
		}
		if got := strings.Join(rec.phases, ","); got != "spawn,ready_marker" {
			t.Errorf("phases %s, want spawn,ready_marker", got)
		}
	})

	t.Run("no_marker", func(t *testing.T) {
		f := newFixture(t, testenv.FreeTCP(t), env)
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		life, err := f.b.Wake(ctx, tenant.Discard)
		if err != nil {
			t.Fatalf("Wake: %v", err)
		}
		select {
		case <-life.Done():
		case <-ctx.Done():
			t.Fatal("the child's exit did not end its Life")
		}
		checkExit(t, life.Err())
	})
}

func TestReadyMarker(t *testing.T) {
	// The marker line is printed after the app listens, half a second after it starts: when Wake
	// returns the very first probe must pass.
	f := newFixture(t, testenv.FreeTCP(t), "ready_marker: tenant-is-up\nenv: {DEMOAPP_READY: tenant-is-up, DEMOAPP_START_DELAY: 500ms}\n")
	rec := &recorder{}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	life, err := f.b.Wake(ctx, rec)
	if err != nil {
		t.Fatalf("Wake: %v", err)
	}
	if !bytes.Contains(f.b.proc.out.Bytes(), []byte("tenant-is-up")) {
		t.Fatalf("Wake returned before the marker was printed; output so far %q", f.b.proc.out.Bytes())
	}
	p := health.New(f.up, registry.Health{Path: "/healthz", MinStatus: 200, MaxStatus: 299, Timeout: budget, Passes: 1})
	if err := p.Probe(ctx); err != nil {
		t.Fatalf("first probe right after Wake: %v", err)
	}
	if got := strings.Join(rec.phases, ","); got != "spawn,ready_marker" {
		t.Errorf("phases %s, want spawn,ready_marker", got)
	}
	if life.Err() != nil {
		t.Errorf("life ended: %v", life.Err())
	}
}

// A wake canceled while waiting for the marker kills the child.
func TestReadyMarkerCanceled(t *testing.T) {
	f := newFixture(t, testenv.FreeTCP(t), "ready_marker: never-printed\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := &recorder{onPhase: func(name string) {
		if name == PhaseReadyMarker {
			cancel()
		}
	}}
	_, err := f.b.Wake(ctx, rec)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Wake: %v, want context.Canceled", err)
	}
	if pids := tagged(f.tag); len(pids) > 0 {
		t.Fatalf("a canceled wake left %v running", pids)
	}
	if f.b.PID() != 0 {
		t.Fatalf("PID() = %d after a canceled wake", f.b.PID())
	}
}

// TestStopGrace: a child that ignores the stop signal is killed after stop_grace, and the sleep says so
// in its notes (the sleep's record); one that honours it exits within the grace, and the sleep notes
// nothing.
func TestStopGrace(t *testing.T) {
	cases := []struct {
		name       string
		block      string
		wantSignal syscall.Signal // how the child ended
		wantNotes  []string
	}{
		// A short grace: the outcome is SIGKILL however slow the machine.
		{"ignores_term", "stop_grace: 300ms\nenv: {DEMOAPP_IGNORE_TERM: \"1\"}\n", syscall.SIGKILL,
			[]string{"still running 300ms (stop_grace) after SIGTERM: killed (SIGKILL)"}},
		// A long grace that a child honouring SIGTERM never reaches.
		{"honours_term", "stop_grace: 1h\n", 0, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, testenv.FreeTCP(t), c.block)
			life := f.wake(t)
			p := f.b.proc
			ctx, cancel := context.WithTimeout(context.Background(), f.subject().Budget)
			defer cancel()
			ctx, notes := tenant.WithSleepNotes(ctx)
			if err := f.b.Sleep(ctx); err != nil {
				t.Fatalf("Sleep: %v", err)
			}
			if got := notes.List(); !slices.Equal(got, c.wantNotes) {
				t.Errorf("the sleep noted %q, want %q", got, c.wantNotes)
			}
			if got, want := notes.Forced(), c.wantSignal == syscall.SIGKILL; got != want {
				t.Errorf("the sleep marked forced %v, want %v", got, want)
			}
			if !errors.Is(life.Err(), tenant.ErrSlept) {
				t.Errorf("life ended with %v, want ErrSlept", life.Err())
			}
			if p.exit.Signal != c.wantSignal {
				t.Errorf("child ended %q, want signal %v", p.exit.Status(), c.wantSignal)
			}
			if c.wantSignal == 0 && p.exit.Code != 0 {
				t.Errorf("child ended %q, want a clean exit", p.exit.Status())
			}
			if pids := tagged(f.tag); len(pids) > 0 {
				t.Errorf("after Sleep, %v still run", pids)
			}
		})
	}
}

func TestStopSignal(t *testing.T) {
	// INT is honoured by demoapp even when it ignores TERM.
	f := newFixture(t, testenv.FreeTCP(t), "stop_signal: INT\nstop_grace: 1h\nenv: {DEMOAPP_IGNORE_TERM: \"1\"}\n")
	f.wake(t)
	p := f.b.proc
	backendtest.Sleep(t, f.subject())
	if p.exit.Signal != 0 || p.exit.Code != 0 {
		t.Errorf("child ended %q, want a clean exit on SIGINT", p.exit.Status())
	}
}

// The child dies with its parent even when the parent is SIGKILLed (Pdeathsig).
func TestNoOrphans(t *testing.T) {
	for _, mode := range []ListenMode{ListenEnv, ListenFDs} {
		t.Run(string(mode), func(t *testing.T) {
			up := testenv.FreeTCP(t)
			line, kill := startParent(t, up, parentEnv+"="+string(mode))
			var pid int
			if _, err := fmt.Sscanf(line, "pid %d", &pid); err != nil || pid <= 0 {
				t.Fatalf("parent said %q", line)
			}
			kill()
			waitFor(t, fmt.Sprintf("child %d to die with its SIGKILLed parent", pid), func() bool { return !alive(pid) })
		})
	}
}

// startParent runs this test binary as an activator stand-in (runParent, configured by env) whose
// child serves up. It returns the parent's first line once that child passes a health probe, and kill,
// which SIGKILLs the parent and reaps it (run at cleanup too, unless called).
func startParent(t *testing.T, up registry.Upstream, env ...string) (line string, kill func()) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(up.Address)
	parent := osexec.Command(self)
	parent.Env = append(append(os.Environ(), parentPortEnv+"="+port), env...)
	parent.Stderr = t.Output()
	stdin, err := parent.StdinPipe() // held open: the parent waits on it
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	kill = func() {
		once.Do(func() {
			_ = parent.Process.Signal(syscall.SIGKILL)
			_ = parent.Wait()
			stdin.Close()
		})
	}
	t.Cleanup(kill)
	line, err = bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("reading from the parent: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	probe := health.New(up, registry.Health{Path: "/healthz", MinStatus: 200, MaxStatus: 299,
		Interval: 50 * time.Millisecond, Timeout: 5 * time.Second, Passes: 1})
	if err := probe.Wait(ctx, nil); err != nil {
		t.Fatalf("the parent's child never served: %v", err)
	}
	return line, kill
}

// Go terminates the OS thread of a goroutine that exits while locked to it, and Linux sends the
// parent-death signal when the thread that forked the child exits. Threads retired that way must never
// take a child with them. The test makes the runtime put every idle thread to work (goroutines blocked
// in raw syscalls need one thread each), then retires all of those threads.
func TestThreadExitDoesNotKillChild(t *testing.T) {
	f := newFixture(t, testenv.FreeTCP(t), "")
	life := f.wake(t)
	pid, tid := f.b.PID(), f.b.proc.tid
	for round := 0; round < 3; round++ {
		churnThreads(t, 32)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid)); err != nil {
		t.Errorf("the thread %d that forked the child is gone: %v", tid, err)
	}
	backendtest.Get(t, f.subject())
	if err := life.Err(); err != nil {
		t.Fatalf("child died when unrelated threads exited: %v", err)
	}
	if !alive(pid) {
		t.Fatalf("child %d died when unrelated threads exited", pid)
	}
}

// churnThreads occupies n threads at once with goroutines locked to them and blocked in a raw read(2)
// (so idle threads are taken first), then lets them exit locked, which makes the runtime terminate
// those threads.
func churnThreads(t *testing.T, n int) {
	t.Helper()
	var fds [2]int
	if err := syscall.Pipe2(fds[:], syscall.O_CLOEXEC); err != nil { // blocking fds: read(2) parks the thread
		t.Fatal(err)
	}
	defer syscall.Close(fds[0])
	var locked atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			locked.Add(1)
			var b [1]byte
			syscall.Read(fds[0], b[:])
		}()
	}
	waitFor(t, "goroutines to lock their threads", func() bool { return locked.Load() == int64(n) })
	syscall.Close(fds[1]) // EOF for every reader
	wg.Wait()
}

func TestWakeAfterClose(t *testing.T) {
	f := newFixture(t, testenv.FreeTCP(t), "")
	f.wake(t)
	if err := f.b.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := f.b.Wake(context.Background(), tenant.Discard); !errors.Is(err, ErrClosed) {
		t.Fatalf("Wake after Close: %v, want ErrClosed", err)
	}
	if err := f.b.Close(context.Background()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// listen_fds keeps the socket bound across sleeps: a connection made while asleep waits in the backlog
// and is served by the next child.
func TestListenFDsBacklog(t *testing.T) {
	f := newFixture(t, testenv.FreeTCP(t), "listen: listen_fds\n")
	f.wake(t)
	backendtest.Sleep(t, f.subject())
	conn, err := net.Dial("tcp", f.up.Address)
	if err != nil {
		t.Fatalf("dial while asleep: %v (the pre-bound socket should accept into its backlog)", err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("GET / HTTP/1.0\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	f.wake(t)
	conn.SetReadDeadline(time.Now().Add(budget))
	resp, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.HasPrefix(resp, "HTTP/1.0 200") {
		t.Fatalf("queued request: %q, %v", resp, err)
	}
	// Close releases the socket.
	if err := f.b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c, err := net.Dial("tcp", f.up.Address); err == nil {
		c.Close()
		t.Fatal("upstream still accepts after Close")
	}
}

func TestNoGoroutineLeak(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), goleak.IgnoreTopFunction(testenv.ForkingThreads))
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []ListenMode{ListenEnv, ListenFDs} {
		r := &registry.Route{Name: "leak", Upstream: testenv.FreeTCP(t), Settings: &Settings{
			Argv: []string{self}, Path: self, Env: map[string]string{demoapp.ChildEnv: "1", "GORACE": "atexit_sleep_ms=0"},
			ReadyMarker: "demoapp ready", Listen: mode, StopSignal: syscall.SIGTERM, StopGrace: time.Minute,
		}}
		b, err := New(r, Options{Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		for i := 0; i < 2; i++ {
			if _, err := b.Wake(ctx, tenant.Discard); err != nil {
				t.Fatalf("Wake: %v", err)
			}
			if err := b.Sleep(ctx); err != nil {
				t.Fatalf("Sleep: %v", err)
			}
		}
		if _, err := b.Wake(ctx, tenant.Discard); err != nil {
			t.Fatalf("Wake: %v", err)
		}
		if err := b.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		cancel()
	}
}

func TestProviderOpen(t *testing.T) {
	p := NewProvider(Options{Logger: testLogger(t)})
	self, _ := os.Executable()
	b, err := p.Open(&registry.Route{Name: "x", Upstream: testenv.FreeTCP(t), Settings: &Settings{Argv: []string{self}, Path: self, Listen: ListenFDs}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	eb, ok := b.(*Backend)
	if !ok {
		t.Fatalf("Open returned %T", b)
	}
	// The Provider opens the native shim for the first route that needs a shim, where the platform
	// has one, and Close releases it.
	if nativeHere() {
		if !eb.native || !strings.HasPrefix(eb.shim, "/proc/self/fd/") {
			t.Errorf("a listen_fds Backend's shim is %q (native %v), want the Provider's native shim (%v)", eb.shim, eb.native, p.nativeErr)
		}
	}
	if _, err := p.Open(&registry.Route{Name: "y", Settings: "not exec settings"}); err == nil {
		t.Fatal("Open accepted a route without exec settings")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Readlink(eb.shim); eb.native && err == nil {
		t.Errorf("the native shim %s is still open after the Provider's Close", eb.shim)
	}
}

func TestExitErrorMessage(t *testing.T) {
	var many strings.Builder
	for i := 0; i < 30; i++ {
		fmt.Fprintf(&many, "line %d\n", i)
	}
	long := strings.Repeat("x", 5000) + "\nlast\n"
	cases := []struct {
		name string
		e    ExitError
		want string
	}{
		{"code", ExitError{Code: 3, Output: []byte("boom\n")}, "exited with code 3: boom"},
		{"no_output", ExitError{Code: 1}, "exited with code 1 (no output)"},
		{"signal", ExitError{Code: -1, Signal: syscall.SIGKILL, Output: []byte("a\nb\n")}, "killed by SIGKILL: a\nb"},
		{"last_10_lines", ExitError{Code: 2, Output: []byte(many.String())}, "exited with code 2: line 20\nline 21\nline 22\nline 23\nline 24\nline 25\nline 26\nline 27\nline 28\nline 29"},
		{"at_most_2k", ExitError{Code: 2, Output: []byte(long)}, "exited with code 2: last"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.e.Error(); got != c.want {
				t.Errorf("got %q\nwant %q", got, c.want)
			}
		})
	}
}

func TestTailKeepsTheEnd(t *testing.T) {
	var tl tail
	line := []byte(strings.Repeat("y", 99) + "\n")
	for i := 0; i < 5000; i++ {
		tl.Write(line)
	}
	tl.Write([]byte("the end\n"))
	got := tl.Bytes()
	if len(got) != TailSize {
		t.Errorf("kept %d bytes, want %d", len(got), TailSize)
	}
	if !bytes.HasSuffix(got, []byte("the end\n")) {
		t.Errorf("tail does not end with the last write: %q", got[len(got)-20:])
	}
}

// nativeShim opens the native shim for one test and returns its path, or skips the test where the
// platform has none.
func nativeShim(t *testing.T) string {
	t.Helper()
	n, err := native.Open()
	if errors.Is(err, native.ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n.Path()
}

// spec is the command line, environment and files of f's next child.
func (f *fixture) spec(t *testing.T) spec {
	t.Helper()
	f.b.mu.Lock()
	defer f.b.mu.Unlock()
	sp, err := f.b.specLocked(nil)
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

// nativeHere reports whether this platform has a native shim (linux/amd64).
func nativeHere() bool {
	n, err := native.Open()
	n.Close()
	return !errors.Is(err, native.ErrUnsupported)
}

// TestShimChoice: listen_fds children start through the native shim where it opened, whatever their
// environment and argv[0]; without it through /bin/sh when that changes nothing they can see, and
// through the activator's own binary otherwise.
func TestShimChoice(t *testing.T) {
	t.Run("native", func(t *testing.T) {
		path := nativeShim(t)
		f := newFixtureOpts(t, testenv.FreeTCP(t), "listen: listen_fds\nenv: {my-var: \"1\"}\n", Options{Logger: testLogger(t), native: path})
		f.b.settings.Argv = append([]string{"alias"}, f.b.settings.Argv[1:]...)
		sp := f.spec(t)
		if sp.path != path || sp.args[0] != shim.Arg0 || sp.args[1] != f.b.settings.Path || sp.args[2] != "alias" || !slices.Contains(sp.env, shim.Env+"="+shim.ModeListenFDs) {
			t.Fatalf("shim %s %q env %q: want the native shim %s with package shim's argv and marker", sp.path, sp.args, sp.env, path)
		}
	})
	if binSh() == "" {
		t.Skip("no /bin/sh: the activator's own binary is always the shim")
	}
	cases := []struct {
		name  string
		block string
		sh    bool
	}{
		{"plain", "listen: listen_fds\n", true},
		{"variable no shell passes on", "listen: listen_fds\nenv: {my-var: \"1\"}\n", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, testenv.FreeTCP(t), c.block)
			sp := f.spec(t)
			want := c.sh && shellSafeEnv(inheritedEnv(nil)) // the test's own environment counts too
			if got := sp.path == binSh(); got != want {
				t.Fatalf("shim %s %q, want /bin/sh: %v", sp.path, sp.args, want)
			}
			if want && (sp.args[3] != f.b.settings.Path || slices.Contains(sp.env, shim.Env+"=1")) {
				t.Fatalf("shell shim args %q env %q: want the tenant's path as $0 and no shim marker", sp.args, sp.env)
			}
		})
	}
	// An argv[0] that is not the resolved path itself: exec "$0" would change what the tenant sees.
	f := newFixture(t, testenv.FreeTCP(t), "listen: listen_fds\n")
	f.b.settings.Argv = append([]string{"alias"}, f.b.settings.Argv[1:]...)
	if sp := f.spec(t); sp.path == binSh() {
		t.Fatalf("argv[0] %q differs from the path, yet the shim is /bin/sh", "alias")
	}
}

func TestShellSafeEnv(t *testing.T) {
	for env, want := range map[string]bool{"A=1": true, "_x9=": true, "PATH=/bin:/usr/bin": true, "9A=1": false, "a.b=1": false, "my-var=1": false, "=x": false} {
		if got := shellSafeEnv([]string{"OK=1", env}); got != want {
			t.Errorf("shellSafeEnv(%q) = %v, want %v", env, got, want)
		}
	}
}

// TestForeignListener: a stray server from an earlier run already holds the tenant's upstream. The
// wake fails at once naming the holder, spawns nothing, and never passes a gate against the stray.
func TestForeignListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	up := registry.Upstream{Network: "tcp", Address: ln.Addr().String()}
	f := newFixture(t, up, "")
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	life, err := f.b.Wake(ctx, tenant.Discard)
	var held *foreign.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("Wake with the upstream held by another listener = %v, %v; want a *foreign.HeldError", life, err)
	}
	if held.PID != os.Getpid() {
		t.Errorf("holder pid %d, want this process's %d", held.PID, os.Getpid())
	}
	if pids := tagged(f.tag); len(pids) > 0 {
		t.Errorf("the failed wake spawned %v anyway", pids)
	}
}
