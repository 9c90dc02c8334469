package unit

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	godbus "github.com/godbus/dbus/v5"

	"github.com/activator/activator/internal/backend/backendtest"
	"github.com/activator/activator/internal/foreign"
	"github.com/activator/activator/internal/systemdtest"
	"github.com/activator/activator/internal/tenant"
)

// The fault class of each failure the unit backing reports, read with tenant.ClassOf, against a real
// systemd --user manager. Wake returns once the start job is queued, so what the job's outcome says
// ends the Life instead: the activator's health gate returns that error (health.ErrGone wrapping the
// Life's), and these tests read it from the Life.

// wakeOutcome wakes b and returns the wake's failure: Wake's error, or else the error the Life ends
// with. It waits for the undoing of a failed start to finish, so the next Wake starts afresh.
func wakeOutcome(t *testing.T, b *Backend) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	life, err := b.Wake(ctx, tenant.Discard)
	if err == nil {
		err = waitLife(t, life)
	}
	if serr := b.settle(ctx); serr != nil {
		t.Fatal(serr)
	}
	return err
}

// A unit the manager cannot load, as no such unit or a masked one: nothing but an operator helps.
func TestTerminalNotLoaded(t *testing.T) {
	m := systemdtest.Start(t)
	p := newProvider(t)

	t.Run("no_such_unit", func(t *testing.T) {
		missing := route(m, uniq("nosuch")+".service", 1, SleepStop)
		b, err := p.Open(missing)
		if err != nil {
			t.Fatal(err)
		}
		err = wakeOutcome(t, b.(*Backend))
		if !strings.Contains(err.Error(), "LoadState=not-found") {
			t.Fatalf("Wake = %v, want it to say the unit is not found", err)
		}
		backendtest.WantClass(t, err, tenant.ClassTerminal)
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		backendtest.WantClass(t, p.Check(ctx, missing), tenant.ClassTerminal)
	})

	t.Run("masked", func(t *testing.T) {
		f := newFixture(t, m, p, SleepStop, systemdtest.Demo{})
		if err := os.Remove(filepath.Join(m.UnitDir, f.unit)); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("/dev/null", filepath.Join(m.UnitDir, f.unit)); err != nil {
			t.Fatal(err)
		}
		m.Reload(t)
		err := wakeOutcome(t, f.b)
		if !strings.Contains(err.Error(), "masked") {
			t.Fatalf("Wake = %v, want it to say the unit is masked", err)
		}
		backendtest.WantClass(t, err, tenant.ClassTerminal)
	})
}

// A unit whose executable is missing, or whose upstream another process holds: no retry helps.
func TestTerminalStart(t *testing.T) {
	m := systemdtest.Start(t)
	p := newProvider(t)

	t.Run("missing_executable", func(t *testing.T) {
		f := newFixture(t, m, p, SleepStop, systemdtest.Demo{ExecStart: "/nonexistent/activator-test-app"})
		err := wakeOutcome(t, f.b)
		var je *JobError
		if !errors.As(err, &je) || je.State.ExecMainStatus != exitExec {
			t.Fatalf("Wake = %v, want a *JobError with ExecMainStatus %d", err, exitExec)
		}
		backendtest.WantClass(t, err, tenant.ClassTerminal)
	})

	t.Run("foreign_holder", func(t *testing.T) {
		f := newFixture(t, m, p, SleepStop, systemdtest.Demo{})
		ln, err := net.Listen("tcp", f.r.Upstream.Address)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		err = wakeOutcome(t, f.b)
		var held *foreign.HeldError
		if !errors.As(err, &held) {
			t.Fatalf("Wake = %v, want a *foreign.HeldError", err)
		}
		backendtest.WantClass(t, err, tenant.ClassTerminal)
	})
}

// A start job that fails (here its ExecStartPre) may succeed next time.
func TestRetryableStartJob(t *testing.T) {
	m := systemdtest.Start(t)
	f := newFixture(t, m, newProvider(t), SleepStop, systemdtest.Demo{Service: []string{"ExecStartPre=/bin/false"}})
	err := wakeOutcome(t, f.b)
	var je *JobError
	if !errors.As(err, &je) || je.Result != "failed" {
		t.Fatalf("Wake = %v, want a *JobError with job result failed", err)
	}
	backendtest.WantClass(t, err, tenant.ClassRetryable)
}

// startLimited is Demo d with a start limit of one start an hour, overriding Demo's
// StartLimitIntervalSec=0.
func startLimited(d systemdtest.Demo) systemdtest.Demo {
	d.Unit = append(d.Unit, "StartLimitIntervalSec=1h", "StartLimitBurst=1")
	return d
}

// wantThrottled fails t unless err is a start job systemd refused for its start limit, classed
// throttle.
func wantThrottled(t *testing.T, err error) {
	t.Helper()
	var je *JobError
	if !errors.As(err, &je) || !je.Refused && je.State.Result != "start-limit-hit" {
		t.Fatalf("wake = %v, want a *JobError the start limit refused", err)
	}
	backendtest.WantClass(t, err, tenant.ClassThrottle)
}

// Started again within its start limit (one start an hour), a unit is refused by systemd: a throttle.
// systemd says start-limit-hit in Result only when the run before succeeded; after a failed run
// Result keeps that run's, and the refusal shows as a failed start job that ran nothing (the
// unit's InvocationID unchanged).
func TestThrottleStartLimit(t *testing.T) {
	m := systemdtest.Start(t)
	p := newProvider(t)

	t.Run("after_a_crash", func(t *testing.T) {
		f := newFixture(t, m, p, SleepStop, startLimited(systemdtest.Demo{Env: []string{"DEMOAPP_EXIT_CODE=3"}}))
		// A tenant that exits before it is ready is retryable: a crash at start may be transient.
		first := wakeOutcome(t, f.b)
		if !strings.Contains(first.Error(), "ExecMainStatus=3") {
			t.Fatalf("first wake = %v, want the exit status 3", first)
		}
		backendtest.WantClass(t, first, tenant.ClassRetryable)
		second := wakeOutcome(t, f.b)
		wantThrottled(t, second)
		if !strings.Contains(second.Error(), "StartLimitBurst=1") {
			t.Errorf("message %q does not name the start limit", second)
		}
	})

	t.Run("after_a_sleep", func(t *testing.T) {
		f := newFixture(t, m, p, SleepStop, startLimited(systemdtest.Demo{}))
		// A stopped unit that nothing references is unloaded, and its start count with it; an active
		// target ordered after it (After= only: it starts nothing) keeps it loaded.
		pin := uniq("pin") + ".target"
		m.WriteUnit(t, pin, "[Unit]\nAfter="+f.unit+"\n")
		m.StartUnit(t, pin)
		f.wake(t)
		f.sleep(t)
		second := wakeOutcome(t, f.b)
		var je *JobError
		if !errors.As(second, &je) || je.State.Result != "start-limit-hit" {
			t.Fatalf("wake after a clean stop = %v, want Result=start-limit-hit", second)
		}
		wantThrottled(t, second)
	})
}

// The D-Bus errors no retry gets past are terminal. A user manager grants its own user everything, so
// access denied cannot be provoked here: these are the errors godbus hands over, by name.
func TestDBusFaultNames(t *testing.T) {
	cases := []struct {
		name string
		want tenant.Class
	}{
		{"org.freedesktop.DBus.Error.AccessDenied", tenant.ClassTerminal},
		{"org.freedesktop.DBus.Error.InteractiveAuthorizationRequired", tenant.ClassTerminal},
		{"org.freedesktop.systemd1.NoSuchUnit", tenant.ClassTerminal},
		{"org.freedesktop.DBus.Error.NoReply", tenant.ClassRetryable},
		{"org.freedesktop.systemd1.TransactionIsDestructive", tenant.ClassRetryable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := dbusFault(godbus.Error{Name: c.name, Body: []any{"refused"}})
			if got := tenant.ClassOf(err); got != c.want {
				t.Fatalf("ClassOf(%s) = %q, want %q", c.name, got, c.want)
			}
		})
	}
}
