package redfish

// Failures are reported as they are, and undone (issue 13 §3): each test drives the backend against
// the simulator over real HTTP(S).

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/activator/activator/internal/backend/redfish/redfishtest"
	"github.com/activator/activator/internal/tenant"
)

// waitFor waits until cond holds, re-checking it at every change of the simulator, within budget.
func waitFor(t *testing.T, sim *redfishtest.Server, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(budget)
	defer deadline.Stop()
	for n := 0; ; n++ {
		changed := sim.Changed() // before the check: a change in between is not missed
		if cond() {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("%s: not within %v (%d changes seen)", what, budget, n)
		}
	}
}

// rotatePasswordFile writes p into the backend's password file.
func (e *env) rotatePasswordFile(t *testing.T, p string) {
	t.Helper()
	if err := os.WriteFile(e.s.PasswordFile, []byte(p+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestLateResetIsUndone: the BMC accepts the Reset but carries it out after the wake has given up.
// The backend keeps watching after the failed wake and powers the node off once it turns on.
func TestLateResetIsUndone(t *testing.T) {
	e := newEnv(t, envConfig{yaml: "power_on_budget: 300ms\n"})
	release := e.sim.HoldResets("node-1")
	_, err := e.wake(t)
	if !errors.Is(err, ErrNotReached) || Phase(err) != PhasePowerOn {
		t.Fatalf("Wake = %v, want ErrNotReached in phase power_on", err)
	}
	if got := e.sim.PowerState("node-1"); got != redfishtest.Off {
		t.Fatalf("PowerState right after the failed wake = %s, want Off (the Reset is held)", got)
	}
	release() // the Reset lands, after the wake failed
	waitFor(t, e.sim, "the late Reset undone", func() bool {
		return e.sim.PowerState("node-1") == redfishtest.Off && len(e.sim.Resets("node-1")) == 2
	})
	if got := e.sim.Resets("node-1"); !slices.Equal(got, []string{"On", "GracefulShutdown"}) {
		t.Fatalf("Resets = %v, want [On GracefulShutdown]", got)
	}
	if !strings.Contains(e.logs.String(), "came on after its wake failed") {
		t.Fatalf("the undo was not logged:\n%s", e.logs)
	}
}

// TestFailedWakeOfStuckNodeIsUndone: the node hangs PoweringOn past the budget; the failed wake powers
// it off at once.
func TestFailedWakeOfStuckNodeIsUndone(t *testing.T) {
	e := newEnv(t, envConfig{yaml: "power_on_budget: 300ms\nforce_off: true\n"})
	e.sim.SetStuckPoweringOn("node-1", true)
	if _, err := e.wake(t); !errors.Is(err, ErrNotReached) {
		t.Fatalf("Wake = %v, want ErrNotReached", err)
	}
	waitFor(t, e.sim, "the stuck node powered off", func() bool { return e.sim.PowerState("node-1") == redfishtest.Off })
}

// TestWakeCancelsUndo: a Wake right after a failed one stops the undo and joins it, so the undo never
// powers off the node the new Wake brought up.
func TestWakeCancelsUndo(t *testing.T) {
	e := newEnv(t, envConfig{yaml: "power_on_budget: 300ms\n"})
	release := e.sim.HoldResets("node-1")
	if _, err := e.wake(t); err == nil {
		t.Fatal("Wake with a held Reset succeeded")
	}
	release()
	life := e.mustWake(t)
	e.b.mu.Lock()
	undo := e.b.undo
	e.b.mu.Unlock()
	if undo != nil {
		t.Fatal("an undo still runs after the next Wake")
	}
	if got := e.sim.PowerState("node-1"); got != redfishtest.On {
		t.Fatalf("PowerState after Wake = %s, want On", got)
	}
	if life.Err() != nil {
		t.Fatalf("Life ended: %v", life.Err())
	}
}

// TestUndoJoinedByClose: Close stops the undo of a failed wake and leaves no goroutine behind.
func TestUndoJoinedByClose(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	sim, err := redfishtest.New(redfishtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	r := testRoute()
	r.Settings = decode(t, r, "endpoint: "+sim.URL+"\npoll_interval: 5ms\npower_on_budget: 100ms\n")
	be, err := NewProvider(Options{}).Open(r)
	if err != nil {
		t.Fatal(err)
	}
	b := be.(*Backend)
	sim.HoldResets("node-1")
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if _, err := b.Wake(ctx, tenant.Discard); err == nil {
		t.Fatal("Wake with a held Reset succeeded")
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPasswordRotation: the password changes on the BMC and in the password file while the backend
// runs; the next wake reads the file again after the 401 and logs in once more, without a restart.
func TestPasswordRotation(t *testing.T) {
	for _, auth := range []string{"basic", "session"} {
		t.Run(auth, func(t *testing.T) {
			e := newEnv(t, envConfig{yaml: "auth: " + auth + "\n"})
			e.mustWake(t)
			if err := e.sleep(t); err != nil {
				t.Fatal(err)
			}
			const rotated = "R0tated-BMC-pw-2"
			e.sim.SetPassword(rotated)
			e.rotatePasswordFile(t, rotated)
			before := len(e.sim.Requests())
			e.mustWake(t)
			reqs := e.sim.Requests()[before:]
			rejected := 0
			for _, r := range reqs {
				if r.Status == 401 {
					rejected++
				}
			}
			if rejected != 1 {
				t.Fatalf("%d requests answered 401 after the rotation, want exactly 1: %+v", rejected, reqs)
			}
			if got := e.sim.PowerState("node-1"); got != redfishtest.On {
				t.Fatalf("PowerState = %s, want On", got)
			}
			if strings.Contains(e.logs.String(), rotated) {
				t.Fatal("the logs hold the rotated password")
			}
		})
	}
}

// TestCorrectedPasswordFile: a wake with a wrong password fails; once the file is corrected, the next
// wake logs in with it (the rejected client was not kept).
func TestCorrectedPasswordFile(t *testing.T) {
	for _, auth := range []string{"basic", "session"} {
		t.Run(auth, func(t *testing.T) {
			e := newEnv(t, envConfig{password: "wrong-password-123", yaml: "auth: " + auth + "\n"})
			if _, err := e.wake(t); !errors.Is(err, ErrCredentials) {
				t.Fatalf("Wake = %v, want ErrCredentials", err)
			}
			e.rotatePasswordFile(t, testPassword)
			e.mustWake(t)
		})
	}
}

// TestWrongPasswordFailsAtLogin: with basic auth the login itself makes an authenticated call, so a
// wrong password fails there, with an error naming the route, the BMC and the user, never the password.
func TestWrongPasswordFailsAtLogin(t *testing.T) {
	for _, auth := range []string{"basic", "session"} {
		t.Run(auth, func(t *testing.T) {
			const wrong = "wrong-password-123"
			e := newEnv(t, envConfig{password: wrong, yaml: "auth: " + auth + "\n"})
			_, err := e.wake(t)
			var be *BMCError
			if !errors.Is(err, ErrCredentials) || !errors.As(err, &be) {
				t.Fatalf("Wake = %v, want a *BMCError of class ErrCredentials", err)
			}
			if !strings.HasPrefix(be.Op, "log in") {
				t.Fatalf("failed in %q, want at log in", be.Op)
			}
			msg := err.Error()
			for _, want := range []string{`route "metal"`, e.sim.URL, `"` + testUser + `"`, auth + " auth", "credentials rejected by BMC (HTTP 401)"} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q does not mention %q", msg, want)
				}
			}
			if strings.Contains(msg, wrong) {
				t.Fatalf("error %q holds the password", msg)
			}
			if got := count(e.sim.Requests(), "GET", "/Systems/node-1"); got != 0 {
				t.Fatalf("the system was read %d times after a failed login", got)
			}
		})
	}
}

// TestUntrustedCertificateFailsFast: the BMC's self-signed certificate is not trusted; the wake fails
// at once naming the certificate problem, after one handshake and no retry.
func TestUntrustedCertificateFailsFast(t *testing.T) {
	for _, auth := range []string{"basic", "session", "auto"} {
		t.Run(auth, func(t *testing.T) {
			e := newEnv(t, envConfig{tls: true, untrusted: true, yaml: "auth: " + auth + "\n"})
			_, err := e.wake(t)
			if !errors.Is(err, ErrTLS) {
				t.Fatalf("Wake = %v, want ErrTLS", err)
			}
			for _, want := range []string{"certificate", "tls.ca_file"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
			if n := e.sim.Connections(); n != 1 {
				t.Fatalf("%d connections (handshakes) to the BMC, want exactly 1: no retry", n)
			}
			if n := len(e.sim.Requests()); n != 0 {
				t.Fatalf("%d requests got through an untrusted handshake", n)
			}
		})
	}
}

// TestHTTPSToPlainBMCFailsFast: an https:// endpoint on a BMC that speaks plain HTTP is a TLS fault,
// terminal at once, naming the likely cause; it was retried as a BMC failing until the wake's budget
// ran out (net/http reports it as a plain error, not a tls.RecordHeaderError).
func TestHTTPSToPlainBMCFailsFast(t *testing.T) {
	e := newEnv(t, envConfig{httpsPlain: true, yaml: "auth: basic\n"})
	_, err := e.wake(t)
	if !errors.Is(err, ErrTLS) || !strings.Contains(err.Error(), "plain http") {
		t.Fatalf("Wake = %v, want ErrTLS saying the endpoint may be plain http", err)
	}
	if n := e.sim.Connections(); n != 1 {
		t.Fatalf("%d connections to the BMC, want exactly 1: no retry", n)
	}
}

// TestHungBMCNamedWhenTheBudgetEnds: a BMC that takes every connection and never answers fails the
// wake when its budget ends mid-try (2.5 s: two tries of the 1 s per-call timeout, cut in the third);
// the error says what the tries before found ("no answer within the per-call timeout"), not only
// "context deadline exceeded", which told the operator nothing `activator check` had not said better.
func TestHungBMCNamedWhenTheBudgetEnds(t *testing.T) {
	e := newEnv(t, envConfig{yaml: "auth: basic\ntimeout: 1s\n"})
	e.sim.Inject(redfishtest.Fault{Delay: time.Hour, Count: 1000})
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	_, err := e.b.Wake(ctx, tenant.Discard)
	if err == nil || !strings.Contains(err.Error(), "no answer within the per-call timeout") {
		t.Fatalf("Wake = %v, want it to say the BMC gave no answer within the per-call timeout", err)
	}
}

// TestSilentBMCNamedInTimeout: the BMC stops answering after the Reset; the timeout says so.
func TestSilentBMCNamedInTimeout(t *testing.T) {
	e := newEnv(t, envConfig{yaml: "auth: basic\npower_on_budget: 1s\n"})
	e.sim.SetNeverPowersOn("node-1", true)
	// The first read of the system (before the Reset) is answered, every later one held unanswered.
	e.sim.Inject(redfishtest.Fault{Method: "GET", PathSuffix: "/Systems/node-1"})
	e.sim.Inject(redfishtest.Fault{Method: "GET", PathSuffix: "/Systems/node-1", Delay: time.Hour, Count: 1000})
	_, err := e.wake(t)
	if !errors.Is(err, ErrNotReached) || Phase(err) != PhasePowerOn {
		t.Fatalf("Wake = %v, want ErrNotReached in phase power_on", err)
	}
	for _, want := range []string{"BMC " + e.sim.URL + " stopped answering at ", "(last answer ", " into the wake)", "node-1 still Off after"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	var se *StateError
	if !errors.As(err, &se) || se.Silent.IsZero() {
		t.Fatalf("StateError = %+v, want the time the BMC went silent", se)
	}
}

// TestAnsweringBMCNotCalledSilent: a plain timeout with a BMC that answers says nothing of silence.
func TestAnsweringBMCNotCalledSilent(t *testing.T) {
	e := newEnv(t, envConfig{yaml: "power_on_budget: 300ms\n"})
	e.sim.SetNeverPowersOn("node-1", true)
	_, err := e.wake(t)
	if !errors.Is(err, ErrNotReached) || strings.Contains(err.Error(), "stopped answering") {
		t.Fatalf("Wake = %v, want ErrNotReached without 'stopped answering'", err)
	}
}

// TestRefusedGracefulShutdown: a BMC refusing GracefulShutdown is followed by ForceOff with force_off;
// without it the sleep fails, and says so, and the node stays awake and watched.
func TestRefusedGracefulShutdown(t *testing.T) {
	refuse := redfishtest.Fault{Status: 400, Method: "POST", PathSuffix: "/Actions/ComputerSystem.Reset"}
	t.Run("force_off", func(t *testing.T) {
		e := newEnv(t, envConfig{yaml: "force_off: true\n"})
		life := e.mustWake(t)
		e.sim.Inject(refuse)
		if err := e.sleep(t); err != nil {
			t.Fatalf("Sleep = %v, want ForceOff after the refused GracefulShutdown", err)
		}
		if got := e.sim.Resets("node-1"); !slices.Equal(got, []string{"On", "ForceOff"}) {
			t.Fatalf("Resets = %v, want [On ForceOff] (GracefulShutdown refused)", got)
		}
		if want := []string{"the BMC refused GracefulShutdown for node-1: ForceOff"}; !slices.Equal(e.sleepNotes, want) || !e.sleepForced {
			t.Errorf("the sleep noted %q (forced %v), want %q, forced", e.sleepNotes, e.sleepForced, want)
		}
		if got := e.sim.PowerState("node-1"); got != redfishtest.Off {
			t.Fatalf("PowerState = %s, want Off", got)
		}
		if !errors.Is(life.Err(), tenant.ErrSlept) {
			t.Fatalf("Life = %v, want ended with ErrSlept", life.Err())
		}
	})
	t.Run("no force_off", func(t *testing.T) {
		e := newEnv(t, envConfig{})
		life := e.mustWake(t)
		e.sim.Inject(refuse)
		err := e.sleep(t)
		if !errors.Is(err, ErrRejected) || Phase(err) != PhaseShutdown {
			t.Fatalf("Sleep = %v, want ErrRejected in phase shutdown", err)
		}
		if got := e.sim.PowerState("node-1"); got != redfishtest.On {
			t.Fatalf("PowerState = %s, want On", got)
		}
		if life.Err() != nil {
			t.Fatalf("a failed Sleep ended the Life: %v", life.Err())
		}
	})
}
