package unit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/activator/activator/internal/backend/backendtest"
	"github.com/activator/activator/internal/demoapp"
	"github.com/activator/activator/internal/foreign"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/systemdtest"
	"github.com/activator/activator/internal/tenant"
	"github.com/activator/activator/internal/testenv"
)

func TestMain(m *testing.M) {
	demoapp.RunIfChild()
	os.Exit(m.Run())
}

// budget bounds each operation in these tests: an upper bound that turns a hang into a failure.
const budget = 2 * time.Minute

// tlog is an io.Writer into t.Log.
type tlog struct{ t testing.TB }

func (w tlog) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// newProvider returns a provider closed when t ends.
func newProvider(t testing.TB) *Provider {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := NewProvider(Options{Context: ctx, Logger: slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("provider Close: %v", err)
		}
		cancel()
	})
	return p
}

var unitSeq atomic.Int64

// uniq returns a unit stem no other test uses, in this process or in another one running at the same
// time: root's user managers share one cgroup tree, so units of the same name in two test processes
// would share a cgroup (and see, signal and stop each other's processes).
func uniq(stem string) string { return fmt.Sprintf("%s%d-%d", stem, os.Getpid(), unitSeq.Add(1)) }

// route builds a route for the unit on m's private bus.
func route(m *systemdtest.Manager, unit string, port int, sleep SleepMode) *registry.Route {
	return &registry.Route{
		Name:        "r",
		Backing:     "unit",
		Upstream:    registry.Upstream{Network: "tcp", Address: fmt.Sprintf("127.0.0.1:%d", port)},
		Health:      registry.Health{Path: "/healthz", MinStatus: 200, MaxStatus: 299, Interval: 100 * time.Millisecond, Timeout: 2 * time.Second, Passes: 1},
		WakeBudget:  budget,
		SleepBudget: budget,
		Settings:    &Settings{Unit: unit, Bus: m.Address, Sleep: sleep},
	}
}

// fixture is one demoapp unit and its backend.
type fixture struct {
	m    *systemdtest.Manager
	p    *Provider
	unit string
	r    *registry.Route
	b    *Backend
}

func newFixture(t *testing.T, m *systemdtest.Manager, p *Provider, sleep SleepMode, d systemdtest.Demo) *fixture {
	t.Helper()
	f := &fixture{m: m, p: p, unit: uniq("demo") + ".service"}
	port := testenv.FreePort(t)
	d.Port = port
	m.WriteDemo(t, f.unit, d)
	f.r = route(m, f.unit, port, sleep)
	b, err := p.Open(f.r)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	f.b = b.(*Backend)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		if err := f.b.Stop(ctx); err != nil {
			t.Errorf("cleanup Stop: %v", err)
		}
	})
	return f
}

func (f *fixture) subject() backendtest.Subject {
	return backendtest.Subject{
		Backend:  f.b,
		Upstream: f.r.Upstream,
		Path:     "/",
		Body:     "hello from demoapp",
		Budget:   budget,
		// A crash: SIGKILL to the main process, behind the backend's back.
		Kill:  func(t *testing.T) { f.m.Kill(t, f.unit, "main", syscall.SIGKILL) },
		Awake: func(t *testing.T) bool { return f.m.ActiveState(t, f.unit) == "active" },
	}
}

func (f *fixture) wake(t *testing.T) *tenant.Life {
	t.Helper()
	return backendtest.Wake(t, f.subject())
}

func (f *fixture) sleep(t *testing.T) {
	t.Helper()
	backendtest.Sleep(t, f.subject())
}

func waitLife(t *testing.T, l *tenant.Life) error {
	t.Helper()
	select {
	case <-l.Done():
		return l.Err()
	case <-time.After(budget):
		t.Fatalf("Life did not end within %v", budget)
		return nil
	}
}

func TestConformance(t *testing.T) {
	m := systemdtest.Start(t)
	p := newProvider(t)
	backendtest.Run(t, func(t *testing.T) backendtest.Subject {
		return newFixture(t, m, p, SleepStop, systemdtest.Demo{}).subject()
	})
}

func TestConformanceSIGSTOP(t *testing.T) {
	m := systemdtest.Start(t)
	p := newProvider(t)
	backendtest.Run(t, func(t *testing.T) backendtest.Subject {
		s := newFixture(t, m, p, SleepSIGSTOP, systemdtest.Demo{}).subject()
		s.Awake = nil // a SIGSTOPped unit is still "active" to systemd
		return s
	})
}

// TestFastCycles: twenty sleep/wake cycles in a row trip no start limit (the unit has
// StartLimitIntervalSec=0, as units/app@.service does).
func TestFastCycles(t *testing.T) {
	m := systemdtest.Start(t)
	f := newFixture(t, m, newProvider(t), SleepStop, systemdtest.Demo{})
	for i := 0; i < 20; i++ {
		f.wake(t)
		backendtest.Get(t, f.subject())
		f.sleep(t)
	}
	if st := m.ActiveState(t, f.unit); st != "inactive" {
		t.Fatalf("after 20 cycles the unit is %q, want inactive", st)
	}
}

// TestWakeActiveNoSecondJob: the activator serializes Wake calls; a Wake on a unit that is already
// active (started by someone else, or already woken) must not restart it, and a wake from asleep is
// exactly one start job. In stop mode Wake does not read the unit before queuing its start job (one
// D-Bus call less on every cold wake), so on a unit someone else started it queues one start job,
// which systemd finishes at once. The backend talks to the manager through a proxy that counts the
// StartUnit calls it sends.
func TestWakeActiveNoSecondJob(t *testing.T) {
	m := systemdtest.Start(t)
	f, proxy := proxiedFixture(t, m, SleepStop)

	m.StartUnit(t, f.unit)
	pid := m.MainPID(t, f.unit)
	l1 := f.wake(t)
	l2 := f.wake(t)
	if l1 != l2 {
		t.Fatal("a second Wake on an awake tenant returned a new Life")
	}
	if n := proxy.Calls("StartUnit"); n != 1 {
		t.Fatalf("two Wakes on an active unit sent %d StartUnit calls, want 1 (a no-op start job)", n)
	}
	if got := m.MainPID(t, f.unit); got != pid {
		t.Fatalf("MainPID %d after Wake, want %d (unit restarted)", got, pid)
	}

	// And a wake from asleep is exactly one start job; waking again adds none.
	f.sleep(t)
	f.wake(t)
	f.wake(t)
	if n := proxy.Calls("StartUnit"); n != 2 {
		t.Fatalf("Wake from asleep, then Wake again: %d more StartUnit calls, want 1", n-1)
	}
}

// TestWakeReadsNoFullState: wakes that succeed, and the watches they set up, read the unit with
// property Gets only. readState's GetAll calls cost the manager milliseconds each and are for
// explaining a failure; a watch is checked on every ActiveState and InvocationID change while the unit
// starts, beside the tenant starting. The backend talks to the manager through a proxy that counts the
// calls it sends.
func TestWakeReadsNoFullState(t *testing.T) {
	m := systemdtest.Start(t)
	f, proxy := proxiedFixture(t, m, SleepStop)
	for range 3 {
		f.wake(t)
		backendtest.Get(t, f.subject())
		f.sleep(t)
	}
	if n := proxy.Calls("GetAll"); n != 0 {
		t.Fatalf("three wake/sleep cycles sent %d GetAll calls, want 0", n)
	}
}

// TestWakeActiveSIGSTOPNoJob: in sigstop mode Wake reads the unit first, and an active unit is taken
// as it is (SIGCONT), without a start job.
func TestWakeActiveSIGSTOPNoJob(t *testing.T) {
	m := systemdtest.Start(t)
	f, proxy := proxiedFixture(t, m, SleepSIGSTOP)

	m.StartUnit(t, f.unit)
	pid := m.MainPID(t, f.unit)
	f.wake(t)
	if n := proxy.Calls("StartUnit"); n != 0 {
		t.Fatalf("Wake on an active unit in sigstop mode sent %d StartUnit calls, want 0", n)
	}
	if got := m.MainPID(t, f.unit); got != pid {
		t.Fatalf("MainPID %d after Wake, want %d (unit restarted)", got, pid)
	}
}

// TestStartFailure: a start job that fails ends the wake (the Life, since Wake returns once the job is
// queued) with an error naming the unit, the job result and the exit status, and leaves the unit down.
func TestStartFailure(t *testing.T) {
	m := systemdtest.Start(t)
	f := newFixture(t, m, newProvider(t), SleepStop, systemdtest.Demo{ExecStart: "/nonexistent/activator-test-app"})
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	// Wake returns once the job is queued; the job's failure then ends the Life.
	life, err := f.b.Wake(ctx, tenant.Discard)
	if err == nil {
		err = waitLife(t, life)
	}
	var je *JobError
	if !errors.As(err, &je) {
		t.Fatalf("Wake error %v (%T), want a *JobError", err, err)
	}
	if err := f.b.settle(ctx); err != nil { // the cleanup stop after the failure
		t.Fatal(err)
	}
	if je.Result != "failed" || je.State.ExecMainStatus != 203 || je.State.Result != "exit-code" {
		t.Fatalf("JobError %+v, want result failed, Result exit-code, ExecMainStatus 203 (EXEC)", je)
	}
	for _, want := range []string{f.unit, `"failed"`, "ExecMainStatus=203", "ActiveState=failed", "Result=exit-code"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if st := m.ActiveState(t, f.unit); st == "active" || st == "activating" {
		t.Fatalf("unit is %s after a failed wake", st)
	}
}

// TestJobFailsAfterGate: the health gate runs while the start job completes, so an app can answer
// before its job fails. Here a Type=notify app listens but never sends READY=1: the gate passes, then
// the job times out, and the Life ends with the *JobError and the unit is stopped again.
func TestJobFailsAfterGate(t *testing.T) {
	m := systemdtest.Start(t)
	f := newFixture(t, m, newProvider(t), SleepStop, systemdtest.Demo{Type: "notify", Service: []string{"TimeoutStartSec=2s"}})
	life := f.wake(t) // the gate passed: the app answers
	var je *JobError
	if err := waitLife(t, life); !errors.As(err, &je) || je.State.Result != "timeout" {
		t.Fatalf("Life ended with %v, want a *JobError with the unit's Result=timeout", err)
	}
	if err := f.b.settle(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := m.ActiveState(t, f.unit); st == "active" || st == "activating" {
		t.Fatalf("unit is %s after its start job failed", st)
	}
}

// TestStopDuringStartJob: Stop (the activator's answer to a failed gate) while the start job is still
// running abandons the job, stops the unit and ends the Life with ErrSlept.
func TestStopDuringStartJob(t *testing.T) {
	m := systemdtest.Start(t)
	f := newFixture(t, m, newProvider(t), SleepStop, systemdtest.Demo{Service: []string{"ExecStartPre=/bin/sleep 60"}})
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	life, err := f.b.Wake(ctx, tenant.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// Wake returns once systemd has queued the job, which may not have begun yet.
	m.WaitState(t, f.unit, "activating", budget)
	if err := f.b.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := waitLife(t, life); !errors.Is(err, tenant.ErrSlept) {
		t.Fatalf("Life ended with %v, want ErrSlept", err)
	}
	if st := m.ActiveState(t, f.unit); st == "active" || st == "activating" {
		t.Fatalf("unit is %s after Stop", st)
	}
}

// TestStopTimeoutNoted: a unit that ignores SIGTERM outlives its TimeoutStopSec= and systemd kills it;
// the stop job is still "done", so the sleep succeeds, and it notes the kill for the sleep's record.
// A unit that exits on SIGTERM notes nothing.
func TestStopTimeoutNoted(t *testing.T) {
	m := systemdtest.Start(t)
	cases := []struct {
		name   string
		demo   systemdtest.Demo
		killed bool
	}{
		{"ignores SIGTERM", systemdtest.Demo{Env: []string{"DEMOAPP_IGNORE_TERM=1"}, Service: []string{"TimeoutStopSec=300ms"}}, true},
		{"exits on SIGTERM", systemdtest.Demo{Service: []string{"TimeoutStopSec=1h"}}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, m, newProvider(t), SleepStop, c.demo)
			var want []string
			if c.killed {
				want = []string{"unit " + f.unit + " outlived its TimeoutStopSec: systemd killed it (Result=timeout)"}
			}
			f.wake(t)
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			defer cancel()
			ctx, notes := tenant.WithSleepNotes(ctx)
			if err := f.b.Sleep(ctx); err != nil {
				t.Fatalf("Sleep: %v", err)
			}
			if got := notes.List(); !slices.Equal(got, want) {
				t.Errorf("the sleep noted %q, want %q", got, want)
			}
			if notes.Forced() != c.killed {
				t.Errorf("the sleep marked forced %v, want %v", notes.Forced(), c.killed)
			}
		})
	}
}

// TestExitsAfterStart: a Type=exec app that exits right after its exec fails the wake or ends the Life,
// either way with its exit status.
func TestExitsAfterStart(t *testing.T) {
	m := systemdtest.Start(t)
	f := newFixture(t, m, newProvider(t), SleepStop, systemdtest.Demo{Env: []string{"DEMOAPP_EXIT_CODE=3"}})
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	life, err := f.b.Wake(ctx, tenant.Discard)
	if err == nil {
		err = waitLife(t, life)
	}
	var ee *ExitError
	if !errors.As(err, &ee) || ee.State.ExecMainStatus != 3 {
		t.Fatalf("got %v, want an *ExitError with ExecMainStatus 3", err)
	}
	if !strings.Contains(err.Error(), "ExecMainStatus=3") {
		t.Fatalf("error %q does not show the exit status", err)
	}
}

// TestSIGSTOP: Sleep stops every process of the unit (state T), Wake continues them and they serve, on
// the same MainPID.
func TestSIGSTOP(t *testing.T) {
	m := systemdtest.Start(t)
	f := newFixture(t, m, newProvider(t), SleepSIGSTOP, systemdtest.Demo{})
	f.wake(t)
	pid := m.MainPID(t, f.unit)
	f.sleep(t)
	pids := m.PIDs(t, f.unit)
	if len(pids) == 0 {
		t.Fatal("no processes in the unit after Sleep")
	}
	for _, p := range pids {
		waitProcState(t, p, func(s string) bool { return s == "T" }, "T (stopped)")
	}
	backendtest.NotServing(t, f.subject())
	// The wake's record names what it did: read the unit's state, then SIGCONT; no start job.
	var ph phaseNames
	wctx, wcancel := context.WithTimeout(context.Background(), budget)
	if _, err := f.b.Wake(wctx, &ph); err != nil {
		t.Fatalf("Wake: %v", err)
	}
	wcancel()
	if got := strings.Join(ph, " "); got != PhaseState+" "+PhaseContinue {
		t.Errorf("SIGCONT wake phases %q, want %q", got, PhaseState+" "+PhaseContinue)
	}
	for _, p := range pids {
		waitProcState(t, p, func(s string) bool { return s != "T" }, "running")
	}
	backendtest.Get(t, f.subject())
	if got := m.MainPID(t, f.unit); got != pid {
		t.Fatalf("MainPID %d after the SIGCONT wake, want %d", got, pid)
	}
	// An activator restarted while the unit was parked adopts it and continues its processes.
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	f.sleep(t)
	other, err := newProvider(t).Open(f.r)
	if err != nil {
		t.Fatal(err)
	}
	if _, awake, err := other.(*Backend).Adopt(ctx); err != nil || !awake {
		t.Fatalf("Adopt of a SIGSTOPped unit: awake %v, err %v", awake, err)
	}
	for _, p := range pids {
		waitProcState(t, p, func(s string) bool { return s != "T" }, "running")
	}
	backendtest.Get(t, f.subject())
	_ = other.(*Backend).Close(ctx)

	// A failed gate: Stop really stops the unit, whatever the sleep mode.
	f.sleep(t)
	if err := f.b.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if st := m.ActiveState(t, f.unit); st == "active" {
		t.Fatalf("unit still active after Stop of a SIGSTOPped unit")
	}
}

// waitProcState polls /proc/PID/stat (bounded): the kernel delivers SIGSTOP/SIGCONT asynchronously.
func waitProcState(t *testing.T, pid int, ok func(string) bool, want string) {
	t.Helper()
	deadline := time.Now().Add(budget)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		s, err := systemdtest.ProcState(pid)
		if err != nil {
			t.Fatalf("pid %d: %v", pid, err)
		}
		if ok(s) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d in state %s, want %s", pid, s, want)
		}
		<-tick.C
	}
}

// TestFreeze: where the host can freeze, Sleep freezes and Wake thaws; where it cannot (hybrid cgroup
// layout, as on the CI machines), Check and Sleep say so clearly and nothing is downgraded.
func TestFreeze(t *testing.T) {
	m := systemdtest.Start(t)
	p := newProvider(t)
	f := newFixture(t, m, p, SleepFreeze, systemdtest.Demo{})
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	checkErr := p.Check(ctx, f.r)
	f.wake(t)
	pid := m.MainPID(t, f.unit)
	err := f.b.Sleep(ctx)
	if freezerSupported() != nil {
		t.Logf("no freezer here: Check said %v; Sleep said %v", checkErr, err)
		if !errors.Is(checkErr, ErrUnsupported) {
			t.Errorf("Check: %v, want an error wrapping ErrUnsupported", checkErr)
		}
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "does not support freezing") {
			t.Fatalf("Sleep: %v, want ErrUnsupported with the manager's reason", err)
		}
		if got := m.MainPID(t, f.unit); got != pid || m.ActiveState(t, f.unit) != "active" {
			t.Fatal("the failed freeze changed the unit: the mode must not be downgraded to a stop")
		}
		return
	}
	if checkErr != nil {
		t.Fatalf("Check: %v", checkErr)
	}
	if err != nil {
		t.Fatalf("Sleep: %v", err)
	}
	if fs, _ := m.Props(t, f.unit)["FreezerState"].(string); fs != "frozen" {
		t.Fatalf("FreezerState %q after Sleep, want frozen", fs)
	}
	f.wake(t)
	backendtest.Get(t, f.subject())
	if got := m.MainPID(t, f.unit); got != pid {
		t.Fatalf("MainPID %d after thaw, want %d", got, pid)
	}
}

// TestSocketPair: with a paired .socket (Accept=no, the app takes LISTEN_FDS), Sleep stops the service
// and the socket keeps listening.
func TestSocketPair(t *testing.T) {
	m := systemdtest.Start(t)
	p := newProvider(t)
	port := testenv.FreePort(t)
	base := uniq("sock")
	svc := m.WriteSocketPair(t, base, port, systemdtest.Demo{})
	r := route(m, svc, port, SleepStop)
	r.Settings.(*Settings).Socket = base + ".socket"
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if err := p.Check(ctx, r); err != nil {
		t.Fatalf("Check: %v", err)
	}
	b, err := p.Open(r)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = b.(*Backend).Stop(context.Background()) })
	s := backendtest.Subject{Backend: b, Upstream: r.Upstream, Path: "/", Body: "hello from demoapp", Budget: budget}
	for i := 0; i < 3; i++ {
		backendtest.Wake(t, s)
		backendtest.Get(t, s)
		backendtest.Sleep(t, s)
		if st := m.ActiveState(t, svc); st != "inactive" {
			t.Fatalf("service %s after Sleep, want inactive", st)
		}
		sp := m.Props(t, base+".socket")
		if sp["ActiveState"] != "active" || sp["SubState"] != "listening" {
			t.Fatalf("socket %v/%v after Sleep, want active/listening", sp["ActiveState"], sp["SubState"])
		}
	}
}

// TestStoppedBehindBack: `systemctl stop` by an operator ends the Life with the unit's state.
func TestStoppedBehindBack(t *testing.T) {
	m := systemdtest.Start(t)
	f := newFixture(t, m, newProvider(t), SleepStop, systemdtest.Demo{})
	life := f.wake(t)
	m.StopUnit(t, f.unit)
	err := waitLife(t, life)
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Unit != f.unit {
		t.Fatalf("Life ended with %v, want an *ExitError for %s", err, f.unit)
	}
	if l2 := f.wake(t); l2 == life {
		t.Fatal("Wake returned the ended Life")
	}
}

// TestRestartedBehindBack: a restart by an operator (new invocation, new MainPID) ends the Life even if
// the signals coalesce into "active".
func TestRestartedBehindBack(t *testing.T) {
	m := systemdtest.Start(t)
	f := newFixture(t, m, newProvider(t), SleepStop, systemdtest.Demo{})
	life := f.wake(t)
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	ch := make(chan string, 1)
	if _, err := m.Conn().RestartUnitContext(ctx, f.unit, "replace", ch); err != nil {
		t.Fatalf("restart: %v", err)
	}
	<-ch
	if err := waitLife(t, life); err == nil {
		t.Fatal("nil Life error")
	}
}

// TestAdopt: an active unit is adopted as awake, keeping its MainPID; a later Wake returns the same Life.
func TestAdopt(t *testing.T) {
	m := systemdtest.Start(t)
	f := newFixture(t, m, newProvider(t), SleepStop, systemdtest.Demo{})
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if _, awake, err := f.b.Adopt(ctx); err != nil || awake {
		t.Fatalf("Adopt of an inactive unit: awake %v, err %v; want asleep", awake, err)
	}
	m.StartUnit(t, f.unit)
	pid := m.MainPID(t, f.unit)
	life, awake, err := f.b.Adopt(ctx)
	if err != nil || !awake || life == nil {
		t.Fatalf("Adopt: life %v, awake %v, err %v", life, awake, err)
	}
	if l2 := f.wake(t); l2 != life {
		t.Fatal("Wake after adoption returned a new Life")
	}
	if got := m.MainPID(t, f.unit); got != pid {
		t.Fatalf("MainPID %d after adoption, want %d", got, pid)
	}
	m.Kill(t, f.unit, "main", syscall.SIGKILL)
	if err := waitLife(t, life); err == nil {
		t.Fatal("adopted unit died but its Life ended with nil")
	}
}

// TestReconnect: when the bus drops (systemd restart, daemon-reexec; here a proxy cuts every
// connection), the provider reconnects on its own and still notices a unit that stops.
func TestReconnect(t *testing.T) {
	m := systemdtest.Start(t)
	f, proxy := proxiedFixture(t, m, SleepStop)

	// settled waits for Wake's start job to finish, so the cuts below hit a watched, running unit
	// rather than a start job in flight (which a reconnect would issue again, starting the unit the
	// test has just stopped).
	settled := func(l *tenant.Life) *tenant.Life {
		if err := f.b.settle(context.Background()); err != nil {
			t.Fatal(err)
		}
		return l
	}
	life := settled(f.wake(t))
	for i := 0; i < 3; i++ {
		proxy.Cut()
		// Nobody calls the backend here: only the provider's own reconnection can deliver the stop.
		m.StopUnit(t, f.unit)
		var ee *ExitError
		if err := waitLife(t, life); !errors.As(err, &ee) {
			t.Fatalf("cut %d: Life ended with %v, want an *ExitError", i, err)
		}
		life = settled(f.wake(t))
		backendtest.Get(t, f.subject())
	}
	// A cut with nothing watched: the next call reconnects.
	f.sleep(t)
	proxy.Cut()
	f.wake(t)
	backendtest.Get(t, f.subject())
}

// TestUserBus: bus: user reaches the calling user's manager through $XDG_RUNTIME_DIR/systemd/private.
func TestUserBus(t *testing.T) {
	m := systemdtest.Start(t)
	t.Setenv("XDG_RUNTIME_DIR", m.RuntimeDir)
	f := newFixture(t, m, newProvider(t), SleepStop, systemdtest.Demo{})
	r := *f.r
	s := *f.r.Settings.(*Settings)
	s.Bus = BusUser
	r.Settings = &s
	b, err := f.p.Open(&r)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	subj := f.subject()
	subj.Backend = b
	backendtest.Wake(t, subj)
	backendtest.Get(t, subj)
	backendtest.Sleep(t, subj)
}

func TestCheck(t *testing.T) {
	m := systemdtest.Start(t)
	p := newProvider(t)
	f := newFixture(t, m, p, SleepStop, systemdtest.Demo{})
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if err := p.Check(ctx, f.r); err != nil {
		t.Fatalf("Check of a good route: %v", err)
	}
	missing := route(m, "nosuch.service", 1, SleepStop)
	missing.Settings.(*Settings).Socket = "nosuch.socket"
	err := p.Check(ctx, missing)
	if err == nil || !strings.Contains(err.Error(), "LoadState=not-found") || !strings.Contains(err.Error(), "nosuch.socket") {
		t.Fatalf("Check of a missing unit and socket: %v", err)
	}
	if st := m.ActiveState(t, f.unit); st != "inactive" {
		t.Fatalf("Check woke the unit: %s", st)
	}
	bad := route(&systemdtest.Manager{Address: "unix:path=/nonexistent/private"}, f.unit, 1, SleepStop)
	if err := p.Check(ctx, bad); err == nil {
		t.Fatal("Check of an unreachable bus succeeded")
	}
}

// TestProviderClose: closing the provider stops every goroutine it started.
func TestProviderClose(t *testing.T) {
	m := systemdtest.Start(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	p := NewProvider(Options{Context: context.Background(), Logger: slog.New(slog.DiscardHandler)})
	f := &fixture{m: m, p: p, unit: uniq("demo") + ".service"}
	port := testenv.FreePort(t)
	m.WriteDemo(t, f.unit, systemdtest.Demo{Port: port})
	f.r = route(m, f.unit, port, SleepStop)
	b, err := p.Open(f.r)
	if err != nil {
		t.Fatal(err)
	}
	f.b = b.(*Backend)
	life := f.wake(t)
	f.sleep(t)
	if !errors.Is(life.Err(), tenant.ErrSlept) {
		t.Fatalf("Life after Sleep: %v, want ErrSlept", life.Err())
	}
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := p.Open(f.r); err == nil {
		t.Fatal("Open after Close succeeded")
	}
}

// proxiedFixture is a stop-mode demo unit whose backend reaches the manager through a BusProxy, so a
// test can count the calls sent or cut the connection.
func proxiedFixture(t *testing.T, m *systemdtest.Manager, sleep SleepMode) (*fixture, *systemdtest.BusProxy) {
	t.Helper()
	return proxiedDemo(t, m, sleep, systemdtest.Demo{})
}

// proxiedDemo is proxiedFixture for the demo unit d (its Port is set here).
func proxiedDemo(t *testing.T, m *systemdtest.Manager, sleep SleepMode, d systemdtest.Demo) (*fixture, *systemdtest.BusProxy) {
	t.Helper()
	proxy := m.NewBusProxy(t)
	p := newProvider(t)
	f := &fixture{m: m, p: p, unit: uniq("demo") + ".service"}
	port := testenv.FreePort(t)
	d.Port = port
	m.WriteDemo(t, f.unit, d)
	f.r = route(m, f.unit, port, sleep)
	f.r.Settings.(*Settings).Bus = proxy.Address
	b, err := p.Open(f.r)
	if err != nil {
		t.Fatal(err)
	}
	f.b = b.(*Backend)
	t.Cleanup(func() { _ = f.b.Stop(context.Background()) })
	return f, proxy
}

// phaseNames is an tenant.Tracker that records the names of the phases.
type phaseNames []string

func (p *phaseNames) Phase(name string) { *p = append(*p, name) }
func (p *phaseNames) Note(string)       {}

// TestReloadChangesModeWhileParked: a reload that changes a SIGSTOPped unit's sleep mode gives the route
// a new backend, which adopts the unit the old one left parked. It must continue the unit's processes
// before it calls the unit awake: adopted as it was, every request hung until the health gate gave up.
// The adopted Life, once stopped, is never handed out again by Wake.
func TestReloadChangesModeWhileParked(t *testing.T) {
	m := systemdtest.Start(t)
	p := newProvider(t)
	for _, to := range []SleepMode{SleepStop, SleepFreeze} {
		t.Run("sigstop→"+string(to), func(t *testing.T) {
			f := newFixture(t, m, p, SleepSIGSTOP, systemdtest.Demo{})
			f.wake(t)
			// Read before the SIGSTOP: GetUnitProcesses on a unit whose processes are stopped
			// sometimes gets no answer from the manager here.
			pids := m.PIDs(t, f.unit)
			f.sleep(t)
			for _, pid := range pids {
				waitProcState(t, pid, func(s string) bool { return s == "T" }, "T (stopped)")
			}
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			defer cancel()
			if err := f.b.Close(ctx); err != nil { // the old instance retires; the unit stays parked
				t.Fatal(err)
			}

			r2 := *f.r
			s2 := *f.r.Settings.(*Settings)
			s2.Sleep = to
			r2.Settings = &s2
			ob, err := p.Open(&r2)
			if err != nil {
				t.Fatal(err)
			}
			b2 := ob.(*Backend)
			t.Cleanup(func() { _ = b2.Stop(context.Background()) })
			life, awake, err := b2.Adopt(ctx)
			if err != nil || !awake {
				t.Fatalf("Adopt of the parked unit: awake %v, err %v; want awake", awake, err)
			}
			for _, pid := range pids {
				waitProcState(t, pid, func(s string) bool { return s != "T" }, "running (SIGCONT before adopting)")
			}
			s := f.subject()
			s.Backend = b2
			backendtest.Get(t, s)

			// The adopted period, stopped (as after a failed gate), is over: the next Wake starts a new one.
			if err := b2.Stop(ctx); err != nil {
				t.Fatalf("Stop: %v", err)
			}
			if !errors.Is(life.Err(), tenant.ErrSlept) {
				t.Fatalf("adopted Life after Stop: %v, want ErrSlept", life.Err())
			}
			l2 := backendtest.Wake(t, s)
			if l2 == life || l2.Err() != nil {
				t.Fatalf("Wake after Stop returned the adopted Life again (same %v, ended %v)", l2 == life, l2.Err())
			}
			backendtest.Get(t, s)
		})
	}
}

// TestAdoptPlan: what Adopt does with a unit as it finds it, in each mode, including a park another
// mode left (a reload changed the mode): a frozen unit is thawed unless the new mode is freeze (then it
// is asleep, and Wake thaws it), and an active unit always gets SIGCONT (SIGSTOP leaves no trace in
// the unit's state; to processes that run, SIGCONT does nothing). The hybrid cgroup layout here cannot
// freeze, so freeze→stop is covered by this table alone.
func TestAdoptPlan(t *testing.T) {
	active := UnitState{ActiveState: "active", FreezerState: "running"}
	frozen := UnitState{ActiveState: "active", FreezerState: "frozen"}
	inactive := UnitState{ActiveState: "inactive"}
	cases := []struct {
		mode              SleepMode
		st                UnitState
		awake, thaw, cont bool
	}{
		{SleepStop, inactive, false, false, false},
		{SleepStop, active, true, false, true},
		{SleepStop, frozen, true, true, true},
		{SleepSIGSTOP, active, true, false, true},
		{SleepSIGSTOP, frozen, true, true, true},
		{SleepFreeze, active, true, false, true},
		{SleepFreeze, frozen, false, false, false},
		{SleepFreeze, UnitState{ActiveState: "active", FreezerState: "freezing"}, false, false, false},
		{SleepStop, UnitState{ActiveState: "active"}, true, false, true}, // a systemd without a freezer
	}
	for _, c := range cases {
		awake, thaw, cont := adoptPlan(c.mode, c.st)
		if awake != c.awake || thaw != c.thaw || cont != c.cont {
			t.Errorf("adoptPlan(%s, %s/%s) = awake %v thaw %v cont %v, want %v %v %v", c.mode, c.st.ActiveState, c.st.FreezerState,
				awake, thaw, cont, c.awake, c.thaw, c.cont)
		}
	}
}

// TestForeignHolderFailsTheWake: when something the backend did not start already listens on the
// route's upstream (a stray daemon), the wake fails naming the holder and the unit is not started:
// started, it would fail to bind while the stranger passed the health gate. A unit already active
// (started by someone else) holds its own address, which is no stranger.
func TestForeignHolderFailsTheWake(t *testing.T) {
	m := systemdtest.Start(t)
	p := newProvider(t)
	for _, mode := range []SleepMode{SleepStop, SleepSIGSTOP} {
		t.Run(string(mode), func(t *testing.T) {
			f := newFixture(t, m, p, mode, systemdtest.Demo{})
			ln, err := net.Listen("tcp", f.r.Upstream.Address)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			defer cancel()
			_, err = f.b.Wake(ctx, tenant.Discard)
			ln.Close()
			var he *foreign.HeldError
			if !errors.As(err, &he) || he.PID != os.Getpid() || !strings.Contains(err.Error(), f.unit) {
				t.Fatalf("Wake with the upstream held by this test: %v, want a *foreign.HeldError naming pid %d and the unit", err, os.Getpid())
			}
			if st := m.ActiveState(t, f.unit); st != "inactive" {
				t.Fatalf("unit %s after the refused wake, want inactive (not started)", st)
			}
			// The unit itself, started behind the backend's back, is not a stranger.
			m.StartUnit(t, f.unit)
			waitListening(t, f.r.Upstream.Address)
			f.wake(t)
			backendtest.Get(t, f.subject())
		})
	}
}

// waitListening dials addr until it accepts (bounded: an outcome checked from outside, as WaitState).
func waitListening(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(budget)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not accept: %v", addr, err)
		}
		<-tick.C
	}
}

// phaseLog is a tenant.Tracker that records phases and notes.
type phaseLog struct {
	phases, notes []string
}

func (p *phaseLog) Phase(name string) { p.phases = append(p.phases, name) }
func (p *phaseLog) Note(n string)     { p.notes = append(p.notes, n) }

// TestWakeWaitsForAStopStillRunning: a unit slow to stop (it ignores SIGTERM until systemd's
// TimeoutStopSec= kills it) outlasts the sleep's budget, so the sleep fails while systemd's stop job
// carries on. The next wake finds the unit deactivating with its old process still listening. It must
// wait for the stop, then start the unit afresh: before, it called the unit's own main process a
// stranger holding the upstream and failed the route with a terminal fault until systemd killed it.
func TestWakeWaitsForAStopStillRunning(t *testing.T) {
	m := systemdtest.Start(t)
	f := newFixture(t, m, newProvider(t), SleepStop, systemdtest.Demo{
		Env:     []string{"DEMOAPP_IGNORE_TERM=1"},
		Service: []string{"TimeoutStopSec=1500ms"},
	})
	f.wake(t)
	old := m.MainPID(t, f.unit)
	sctx, scancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	err := f.b.Sleep(sctx)
	scancel()
	if err == nil || !strings.Contains(err.Error(), "still stopping") {
		t.Fatalf("Sleep within 100ms of a unit that takes 1.5s to stop: %v, want an error saying the unit is still stopping", err)
	}
	if st := m.ActiveState(t, f.unit); st != "deactivating" {
		t.Fatalf("unit %s after the sleep gave up, want deactivating (the test needs the stop still running)", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	var log phaseLog
	life, err := f.b.Wake(ctx, &log)
	if err != nil {
		t.Fatalf("Wake while the unit was still stopping: %v", err)
	}
	if !slices.Contains(log.phases, PhaseStopping) {
		t.Errorf("wake phases %q, want %q among them", log.phases, PhaseStopping)
	}
	if !slices.ContainsFunc(log.notes, func(n string) bool { return strings.Contains(n, "still stopping") }) {
		t.Errorf("wake notes %q, want one saying the unit was still stopping", log.notes)
	}
	waitListening(t, f.r.Upstream.Address)
	backendtest.Get(t, f.subject())
	if pid := m.MainPID(t, f.unit); pid == old || pid == 0 {
		t.Errorf("MainPID %d after the wake, want a new process (the old one was %d)", pid, old)
	}
	if life.Err() != nil {
		t.Errorf("Life ended: %v", life.Err())
	}
}

// TestInCgroup: a holder is the unit's own process when /proc/PID/cgroup places it in the unit's
// control group or below, in any hierarchy of a hybrid layout; a sibling whose name extends the unit's
// is not.
func TestInCgroup(t *testing.T) {
	const cg = "/user.slice/user@0.service/app.slice/web.service"
	hybrid := "12:cpu,cpuacct:/user.slice\n1:name=systemd:" + cg + "\n0::/user.slice/user@0.service/app.slice/web.service/sub\n"
	cases := []struct {
		name, text string
		want       bool
	}{
		{"hybrid, named hierarchy and a child group", hybrid, true},
		{"v2 only", "0::" + cg + "\n", true},
		{"a sibling with a longer name", "0::" + cg + "-2\n", false},
		{"another unit", "1:name=systemd:/user.slice/other.service\n0::/user.slice/other.service\n", false},
		{"garbage", "nonsense\n\n", false},
	}
	for _, c := range cases {
		if got := inCgroup(c.text, cg); got != c.want {
			t.Errorf("%s: inCgroup = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestUnitNotes: check warns about start limits and about a TimeoutStopSec= that is not below the
// route's sleep_budget (infinity included), and says nothing about a unit set up as app@.service is.
func TestUnitNotes(t *testing.T) {
	sec := func(s int) uint64 { return uint64(s) * 1_000_000 }
	cases := []struct {
		name string
		st   UnitState
		want []string // a part of each note, in order
	}{
		{"as app@.service", UnitState{TimeoutStopUSec: sec(20)}, nil},
		{"systemd's defaults", UnitState{TimeoutStopUSec: sec(90), StartLimitIntervalUSec: sec(10), StartLimitBurst: 5},
			[]string{"StartLimitIntervalSec=10s, StartLimitBurst=5", "TimeoutStopSec=1m30s, not below the route's sleep_budget 30s"}},
		{"equal to the budget", UnitState{TimeoutStopUSec: sec(30)}, []string{"TimeoutStopSec=30s"}},
		{"infinity", UnitState{TimeoutStopUSec: math.MaxUint64}, []string{"TimeoutStopSec=infinity"}},
	}
	for _, c := range cases {
		got := unitNotes("web.service", c.st, 30*time.Second)
		if len(got) != len(c.want) {
			t.Errorf("%s: notes %q, want %d", c.name, got, len(c.want))
			continue
		}
		for i, part := range c.want {
			if !strings.Contains(got[i], part) || !strings.Contains(got[i], "web.service") {
				t.Errorf("%s: note %q, want it to name web.service and contain %q", c.name, got[i], part)
			}
		}
	}
}

// TestNotesReadTheUnit: Notes reads the live unit: a demo unit with systemd's default stop timeout
// (90 s) on a route with a 30 s sleep budget gets the warning.
func TestNotesReadTheUnit(t *testing.T) {
	m := systemdtest.Start(t)
	p := newProvider(t)
	f := newFixture(t, m, p, SleepStop, systemdtest.Demo{Service: []string{"TimeoutStopSec=90s"}})
	f.r.SleepBudget = 30 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	notes := p.Notes(ctx, f.r)
	if !slices.ContainsFunc(notes, func(n string) bool { return strings.Contains(n, "TimeoutStopSec=1m30s") }) {
		t.Fatalf("Notes %q, want a warning about TimeoutStopSec=1m30s", notes)
	}
}
