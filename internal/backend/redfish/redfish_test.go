package redfish

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/activator/activator/internal/backend/backendtest"
	"github.com/activator/activator/internal/backend/redfish/redfishtest"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

func TestConformance(t *testing.T) {
	cases := []struct {
		name string
		tls  bool
		auth string
		sim  redfishtest.Options
	}{
		{name: "http-session", auth: "session"},
		{name: "http-basic", auth: "basic"},
		{name: "https-session", tls: true, auth: "session"},
		{name: "https-basic", tls: true, auth: "basic"},
		{name: "https-auto-without-sessionservice", tls: true, auth: "auto", sim: redfishtest.Options{NoSessionService: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			backendtest.Run(t, func(t *testing.T) backendtest.Subject {
				e := newEnv(t, envConfig{tls: c.tls, sim: c.sim, yaml: "auth: " + c.auth + "\nforce_off: true\n"})
				return backendtest.Subject{
					Backend:  e.b,
					Upstream: registry.Upstream{Network: "tcp", Address: e.addr},
					Body:     "hello from node-1",
					Budget:   budget,
					Kill: func(t *testing.T) {
						if err := e.sim.SetPowerState("node-1", redfishtest.Off); err != nil {
							t.Fatal(err)
						}
					},
					// On or on its way: a node left PoweringOn by a failed wake is not asleep.
					Awake: func(t *testing.T) bool { return e.sim.PowerState("node-1") != redfishtest.Off },
					FailWake: func(t *testing.T) func() {
						e.sim.SetStuckPoweringOn("node-1", true)
						return func() { e.sim.SetStuckPoweringOn("node-1", false) }
					},
					HoldWake: func(t *testing.T) func() { return e.sim.HoldResets("node-1") },
				}
			})
		})
	}
}

func TestWakeOfOnNodeIssuesNoReset(t *testing.T) {
	e := newEnv(t, envConfig{sim: redfishtest.Options{Systems: []redfishtest.System{{ID: "node-1", PowerState: redfishtest.On}}}})
	tr := &recTracker{}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if _, err := e.b.Wake(ctx, tr); err != nil {
		t.Fatal(err)
	}
	if got := e.sim.Resets("node-1"); len(got) != 0 {
		t.Fatalf("Resets = %v, want none", got)
	}
	if got := count(e.sim.Requests(), "POST", "/Actions/ComputerSystem.Reset"); got != 0 {
		t.Fatalf("Reset POSTs = %d, want 0", got)
	}
	if !slices.Equal(tr.phases, []string{PhaseReset}) || len(tr.notes) != 1 || !strings.Contains(tr.notes[0], "already On") {
		t.Fatalf("phases %q notes %q, want [reset] and an 'already On' note", tr.phases, tr.notes)
	}
}

func TestOneWakeOneReset(t *testing.T) {
	cases := []struct {
		name    string
		allowed []string
		order   string
		want    string
	}{
		{name: "default order", want: "On"},
		{name: "first allowed of the order", allowed: []string{"ForceOn", "ForceOff", "GracefulShutdown", "PushPowerButton"}, want: "ForceOn"},
		{name: "power button only", allowed: []string{"PushPowerButton"}, want: "PushPowerButton"},
		{name: "configured order", order: "reset_order: [PushPowerButton, On]\n", want: "PushPowerButton"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, envConfig{yaml: c.order, sim: redfishtest.Options{Systems: []redfishtest.System{
				{ID: "node-1", ResetTypes: c.allowed, TransitionDelay: 30 * time.Millisecond}}}})
			tr := &recTracker{}
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			defer cancel()
			if _, err := e.b.Wake(ctx, tr); err != nil {
				t.Fatal(err)
			}
			if got := e.sim.Resets("node-1"); !slices.Equal(got, []string{c.want}) {
				t.Fatalf("Resets = %v, want [%s]", got, c.want)
			}
			if got := count(e.sim.Requests(), "POST", "/Actions/ComputerSystem.Reset"); got != 1 {
				t.Fatalf("Reset POSTs = %d, want 1", got)
			}
			if got := e.sim.PowerState("node-1"); got != redfishtest.On {
				t.Fatalf("PowerState after Wake = %s, want On", got)
			}
			if !slices.Equal(tr.phases, []string{PhaseReset, PhasePowerOn}) {
				t.Fatalf("phases = %q, want [reset power_on]", tr.phases)
			}
			// A second Wake of the awake node returns the same Life and issues nothing.
			l1, _ := e.wake(t)
			l2 := e.mustWake(t)
			if l1 != l2 {
				t.Fatal("Wake of an awake node returned a new Life")
			}
			if got := count(e.sim.Requests(), "POST", "/Actions/ComputerSystem.Reset"); got != 1 {
				t.Fatalf("Reset POSTs after repeated Wakes = %d, want 1", got)
			}
		})
	}
}

func TestNoAllowedResetTypeIsConfigError(t *testing.T) {
	e := newEnv(t, envConfig{sim: redfishtest.Options{Systems: []redfishtest.System{{ID: "node-1", ResetTypes: []string{"ForceOff", "Nmi"}}}}})
	_, err := e.wake(t)
	if !errors.Is(err, ErrConfig) || Phase(err) != PhaseReset {
		t.Fatalf("Wake = %v, want ErrConfig in phase reset", err)
	}
	if got := e.sim.Resets("node-1"); len(got) != 0 {
		t.Fatalf("Resets = %v, want none", got)
	}
}

func TestCredentialsRejected(t *testing.T) {
	for _, auth := range []string{"session", "basic"} {
		t.Run(auth, func(t *testing.T) {
			e := newEnv(t, envConfig{password: "wrong-password-123", yaml: "auth: " + auth + "\n"})
			_, err := e.wake(t)
			if err == nil {
				t.Fatal("Wake with wrong credentials succeeded")
			}
			if !errors.Is(err, ErrCredentials) || !strings.Contains(err.Error(), "credentials rejected by BMC") {
				t.Fatalf("Wake = %v, want ErrCredentials mentioning credentials", err)
			}
			if Phase(err) != PhaseReset {
				t.Fatalf("phase = %q, want reset", Phase(err))
			}
			reqs := e.sim.Requests()
			rejected := 0
			for i, r := range reqs {
				if r.Status == 401 {
					rejected++
					if i != len(reqs)-1 {
						t.Fatalf("requests went on after the 401: %+v", reqs)
					}
				}
			}
			if rejected != 1 {
				t.Fatalf("%d requests answered 401, want exactly 1 (no hammering): %+v", rejected, reqs)
			}
			if got := count(reqs, "POST", "/Actions/ComputerSystem.Reset"); got != 0 {
				t.Fatalf("Reset POSTs = %d, want 0", got)
			}
		})
	}
}

func TestNeverPowersOn(t *testing.T) {
	e := newEnv(t, envConfig{yaml: "power_on_budget: 300ms\n"})
	e.sim.SetNeverPowersOn("node-1", true)
	_, err := e.wake(t)
	if err == nil {
		t.Fatal("Wake of a node that never powers on succeeded")
	}
	if !errors.Is(err, ErrNotReached) || !errors.Is(err, context.DeadlineExceeded) || Phase(err) != PhasePowerOn {
		t.Fatalf("Wake = %v, want ErrNotReached in phase power_on", err)
	}
	for _, want := range []string{"node-1 still Off after", "power_on"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("Wake error %q does not mention %q", err, want)
		}
	}
	var se *StateError
	if !errors.As(err, &se) || se.Last != "Off" || se.Want != "On" {
		t.Fatalf("StateError = %+v, want last Off, want On", se)
	}
	if got := e.sim.Resets("node-1"); len(got) != 1 {
		t.Fatalf("Resets = %v, want exactly one", got)
	}
}

func TestTransientFaultsThenWakes(t *testing.T) {
	cases := []struct {
		name   string
		faults []redfishtest.Fault
	}{
		{"500 twice", []redfishtest.Fault{{Status: 500, Count: 2}}},
		{"connections dropped twice", []redfishtest.Fault{{Drop: true, Count: 2}}},
		{"Reset POST answered 500", []redfishtest.Fault{{Status: 500, Method: "POST", PathSuffix: "/Actions/ComputerSystem.Reset"}}},
		{"Reset POST dropped before it landed", []redfishtest.Fault{{Drop: true, Method: "POST", PathSuffix: "/Actions/ComputerSystem.Reset"}}},
		{"Reset landed but its answer was lost", []redfishtest.Fault{{Drop: true, Handled: true, Method: "POST", PathSuffix: "/Actions/ComputerSystem.Reset"}}},
		{"BMC slower than the per-call timeout", []redfishtest.Fault{{Delay: time.Minute, Method: "GET", PathSuffix: "/Systems/node-1"}}},
		{"throttled with Retry-After", []redfishtest.Fault{{Status: 429, RetryAfter: time.Second}}},
		{"503 on the Reset", []redfishtest.Fault{{Status: 503, Method: "POST", PathSuffix: "/Actions/ComputerSystem.Reset"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, order := range []string{"", "reset_order: [PushPowerButton]\n"} {
				e := newEnv(t, envConfig{yaml: order + "timeout: 1s\n"})
				for _, f := range c.faults {
					e.sim.Inject(f)
				}
				if _, err := e.wake(t); err != nil {
					t.Fatalf("%sWake: %v", order, err)
				}
				if got := e.sim.Resets("node-1"); len(got) != 1 {
					t.Fatalf("%sResets carried out = %v, want exactly one", order, got)
				}
				if got := e.sim.PowerState("node-1"); got != redfishtest.On {
					t.Fatalf("PowerState = %s, want On", got)
				}
			}
		})
	}
}

func TestPersistentFailureGivesUp(t *testing.T) {
	e := newEnv(t, envConfig{})
	e.sim.Inject(redfishtest.Fault{Status: 500, Count: 1000})
	_, err := e.wake(t)
	if !errors.Is(err, ErrAmbiguous) || Phase(err) != PhaseReset {
		t.Fatalf("Wake = %v, want ErrAmbiguous in phase reset", err)
	}
	if n := len(e.sim.Requests()); n > 2*maxAttempts {
		t.Fatalf("%d requests: the retry is not bounded", n)
	}
}

func TestThrottleBeyondBudgetFailsFast(t *testing.T) {
	e := newEnv(t, envConfig{})
	e.sim.Inject(redfishtest.Fault{Status: 429, RetryAfter: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	_, err := e.b.Wake(ctx, tenant.Discard)
	var be *BMCError
	if !errors.Is(err, ErrThrottled) || !errors.As(err, &be) || be.RetryAfter != time.Hour {
		t.Fatalf("Wake = %v, want ErrThrottled carrying Retry-After 1h", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Wake waited out its whole budget instead of failing when the BMC asked for more")
	}
}

func TestSystemNotFound(t *testing.T) {
	e := newEnv(t, envConfig{yaml: "system: node-9\n"})
	_, err := e.wake(t)
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), `"node-9"`) || !strings.Contains(err.Error(), "node-1") {
		t.Fatalf("Wake = %v, want ErrConfig naming node-9 and the systems present", err)
	}
	if got := count(e.sim.Requests(), "GET", "/Systems"); got != 1 {
		t.Fatalf("Systems collection read %d times, want once (no retry of a config error)", got)
	}
}

func TestSystemByNameAmongSeveral(t *testing.T) {
	e := newEnv(t, envConfig{yaml: "system: web-7\n", sim: redfishtest.Options{Systems: []redfishtest.System{
		{ID: "A1", Name: "web-7"}, {ID: "B2", Name: "db-1"}}}})
	e.mustWake(t)
	if a, b := e.sim.PowerState("A1"), e.sim.PowerState("B2"); a != "On" || b != "Off" {
		t.Fatalf("power states A1=%s B2=%s, want On and Off", a, b)
	}
	// Without system, several systems are a configuration error.
	e2 := newEnv(t, envConfig{sim: redfishtest.Options{Systems: []redfishtest.System{{ID: "A1"}, {ID: "B2"}}}})
	if _, err := e2.wake(t); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "set system") {
		t.Fatalf("Wake = %v, want ErrConfig asking to set system", err)
	}
}

func TestSystemVanishesIsConfigError(t *testing.T) {
	e := newEnv(t, envConfig{})
	e.mustWake(t)
	e.sim.Inject(redfishtest.Fault{Status: 404, PathSuffix: "/Systems/node-1", Count: 100})
	err := e.sleep(t)
	if !errors.Is(err, ErrConfig) || Phase(err) != PhaseShutdown {
		t.Fatalf("Sleep = %v, want ErrConfig in phase shutdown", err)
	}
}

func TestIdleSleepIsGraceful(t *testing.T) {
	e := newEnv(t, envConfig{})
	life := e.mustWake(t)
	if err := e.sleep(t); err != nil {
		t.Fatal(err)
	}
	if got := e.sim.Resets("node-1"); !slices.Equal(got, []string{"On", "GracefulShutdown"}) {
		t.Fatalf("Resets = %v, want [On GracefulShutdown]", got)
	}
	if got := e.sim.PowerState("node-1"); got != "Off" {
		t.Fatalf("PowerState = %s, want Off", got)
	}
	select {
	case <-life.Done():
		if !errors.Is(life.Err(), tenant.ErrSlept) {
			t.Fatalf("Life ended with %v, want ErrSlept", life.Err())
		}
	default:
		t.Fatal("Sleep did not end the Life")
	}
}

func TestIgnoredGracefulShutdown(t *testing.T) {
	t.Run("force_off", func(t *testing.T) {
		e := newEnv(t, envConfig{yaml: "force_off: true\nshutdown_grace: 200ms\n"})
		e.mustWake(t)
		e.sim.SetIgnoreGraceful("node-1", true)
		if err := e.sleep(t); err != nil {
			t.Fatal(err)
		}
		if got := e.sim.Resets("node-1"); !slices.Equal(got, []string{"On", "GracefulShutdown", "ForceOff"}) {
			t.Fatalf("Resets = %v, want [On GracefulShutdown ForceOff]", got)
		}
		if got := e.sim.PowerState("node-1"); got != "Off" {
			t.Fatalf("PowerState = %s, want Off", got)
		}
		if !strings.Contains(e.logs.String(), "ForceOff") {
			t.Fatal("the fallback to ForceOff was not logged")
		}
		if want := []string{"node-1 still on 200ms (shutdown_grace) after GracefulShutdown: ForceOff"}; !slices.Equal(e.sleepNotes, want) || !e.sleepForced {
			t.Errorf("the sleep noted %q (forced %v), want %q, forced", e.sleepNotes, e.sleepForced, want)
		}
	})
	t.Run("no force_off", func(t *testing.T) {
		e := newEnv(t, envConfig{yaml: "shutdown_grace: 200ms\n"})
		life := e.mustWake(t)
		e.sim.SetIgnoreGraceful("node-1", true)
		err := e.sleep(t)
		if !errors.Is(err, ErrNotReached) || Phase(err) != PhaseShutdown || !strings.Contains(err.Error(), "node-1 still On after") {
			t.Fatalf("Sleep = %v, want 'still On' in phase shutdown", err)
		}
		if got := e.sim.Resets("node-1"); slices.Contains(got, "ForceOff") {
			t.Fatalf("Resets = %v: ForceOff without force_off", got)
		}
		if life.Err() != nil {
			t.Fatalf("a failed Sleep ended the Life: %v", life.Err())
		}
		// The node is still watched: powering it off ends the Life.
		if err := e.sim.SetPowerState("node-1", "Off"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-life.Done():
			if !errors.Is(life.Err(), ErrPoweredOff) {
				t.Fatalf("Life ended with %v, want ErrPoweredOff", life.Err())
			}
		case <-time.After(budget):
			t.Fatal("Life did not end after the node powered off")
		}
	})
}

func TestSleepNoneLeavesNodeOn(t *testing.T) {
	e := newEnv(t, envConfig{yaml: "sleep: none\n"})
	life := e.mustWake(t)
	if err := e.sleep(t); err != nil {
		t.Fatal(err)
	}
	if got := e.sim.PowerState("node-1"); got != "On" {
		t.Fatalf("PowerState = %s, want On", got)
	}
	if !errors.Is(life.Err(), tenant.ErrSlept) {
		t.Fatalf("Life = %v, want ended with ErrSlept", life.Err())
	}
	e.mustWake(t)
	if got := e.sim.Resets("node-1"); !slices.Equal(got, []string{"On"}) {
		t.Fatalf("Resets = %v, want [On]", got)
	}
}

func TestAdopt(t *testing.T) {
	for _, state := range []string{"On", "Off"} {
		t.Run(state, func(t *testing.T) {
			e := newEnv(t, envConfig{sim: redfishtest.Options{Systems: []redfishtest.System{{ID: "node-1", PowerState: state}}}})
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			defer cancel()
			life, awake, err := e.b.Adopt(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if awake != (state == "On") || (life != nil) != awake {
				t.Fatalf("Adopt = (%v, %v), want awake %v", life, awake, state == "On")
			}
			if awake {
				if l := e.mustWake(t); l != life {
					t.Fatal("Wake after adopting an On node returned a new Life")
				}
				if got := e.sim.Resets("node-1"); len(got) != 0 {
					t.Fatalf("Resets = %v, want none", got)
				}
			}
		})
	}
}

func TestExpiredSessionLogsInAgain(t *testing.T) {
	e := newEnv(t, envConfig{yaml: "auth: session\n"})
	e.mustWake(t)
	e.sim.ExpireSessions()
	if err := e.sleep(t); err != nil {
		t.Fatal(err)
	}
	if got := count(e.sim.Requests(), "POST", "/SessionService/Sessions"); got != 2 {
		t.Fatalf("session logins = %d, want 2", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if err := e.b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.sim.Sessions(); n != 0 {
		t.Fatalf("%d sessions left open after Close", n)
	}
}

func TestCredentialsNeverLeak(t *testing.T) {
	var errs []error
	var logs []string
	run := func(c envConfig, f func(e *env)) {
		e := newEnv(t, c)
		f(e)
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		_ = e.b.Close(ctx)
		logs = append(logs, e.logs.String())
	}
	for _, auth := range []string{"session", "basic"} {
		run(envConfig{yaml: "auth: " + auth + "\n", password: testPassword + "-wrong"}, func(e *env) {
			_, err := e.wake(t)
			errs = append(errs, err)
		})
		run(envConfig{yaml: "auth: " + auth + "\nforce_off: true\nshutdown_grace: 100ms\n"}, func(e *env) {
			e.sim.Inject(redfishtest.Fault{Status: 500})
			e.sim.Inject(redfishtest.Fault{Drop: true})
			_, err := e.wake(t)
			errs = append(errs, err)
			e.sim.SetIgnoreGraceful("node-1", true)
			errs = append(errs, e.sleep(t))
			e.sim.Inject(redfishtest.Fault{Status: 401, Count: 100})
			_, err = e.wake(t)
			errs = append(errs, err)
		})
	}
	tokens := []string{testPassword, "tok-"}
	for _, err := range errs {
		if err == nil {
			continue
		}
		for _, s := range tokens {
			if strings.Contains(err.Error(), s) {
				t.Errorf("error %q contains a secret", err)
			}
		}
	}
	all := strings.Join(logs, "\n")
	if !strings.Contains(all, "level=DEBUG") {
		t.Fatal("captured no debug logs: the check would prove nothing")
	}
	for _, s := range tokens {
		if strings.Contains(all, s) {
			t.Errorf("logs contain a secret (%q...):\n%s", s[:4], all)
		}
	}
}

func TestRedactsEchoedSecrets(t *testing.T) {
	e := newEnv(t, envConfig{})
	e.b.bmc.addSecret(testPassword)
	err := e.b.bmc.classify(context.Background(), "log in", errors.New("bad request: password="+testPassword))
	if strings.Contains(err.Error(), testPassword) || !strings.Contains(err.Error(), "[redacted]") {
		t.Fatalf("classify = %q, want the password redacted", err)
	}
}

// TestSecretsBounded: every login adds its password and session token to what is scrubbed; the list
// keeps the newest, so a long-running activator does not keep every token it was given, and the
// current password is still scrubbed after many logins.
func TestSecretsBounded(t *testing.T) {
	e := newEnv(t, envConfig{})
	for i := range 100 {
		e.b.bmc.addSecret(testPassword)
		e.b.bmc.addSecret(fmt.Sprintf("token-%03d", i))
	}
	if n := len(e.b.bmc.secrets); n > maxSecrets {
		t.Fatalf("%d secrets kept after 100 logins, want at most %d", n, maxSecrets)
	}
	msg := e.b.bmc.redact("echo: " + testPassword + " token-099 token-000")
	if strings.Contains(msg, testPassword) || strings.Contains(msg, "token-099") {
		t.Fatalf("redact = %q, want the password and the newest token scrubbed", msg)
	}
	if !strings.Contains(msg, "token-000") {
		t.Fatalf("redact = %q: the oldest token should have been let go", msg)
	}
}

// TestClassifyPassedDeadline: a call cut by the caller's deadline before ctx is marked done (its error
// an "i/o timeout", ctx.Err() still nil) is the caller's deadline, not a BMC that did not answer within
// the per-call timeout. pastDeadline holds that moment still.
func TestClassifyPassedDeadline(t *testing.T) {
	e := newEnv(t, envConfig{})
	cut := &url.Error{Op: "Get", URL: "https://bmc/redfish/v1/Systems/1", Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}}
	err := e.b.bmc.classify(pastDeadline{t.Context()}, "read power state", cut)
	var be *BMCError
	if !errors.Is(err, context.DeadlineExceeded) || errors.As(err, &be) {
		t.Errorf("classify = %v (%T), want the caller's context.DeadlineExceeded, not a BMCError", err, err)
	}
}

// pastDeadline is a context whose deadline has passed but which is not yet marked done.
type pastDeadline struct{ context.Context }

func (pastDeadline) Deadline() (time.Time, bool) { return time.Unix(1, 0), true }

func TestCheck(t *testing.T) {
	e := newEnv(t, envConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	p := NewProvider(Options{})
	if err := p.Check(ctx, e.route); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if got := count(e.sim.Requests(), "POST", "/Actions/ComputerSystem.Reset"); got != 0 {
		t.Fatalf("Check issued %d Resets", got)
	}
	if n := e.sim.Sessions(); n != 0 {
		t.Fatalf("Check left %d sessions open", n)
	}
}

func TestNoGoroutineLeak(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	func() {
		sim, err := redfishtest.New(redfishtest.Options{Systems: []redfishtest.System{{ID: "n", ServiceAddr: "127.0.0.1:0", TransitionDelay: 10 * time.Millisecond}}})
		if err != nil {
			t.Fatal(err)
		}
		defer sim.Close()
		r := testRoute()
		r.Settings = decode(t, r, "endpoint: "+sim.URL+"\npoll_interval: 5ms\nwatch_interval: 5ms\n")
		be, err := NewProvider(Options{}).Open(r)
		if err != nil {
			t.Fatal(err)
		}
		b := be.(*Backend)
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		if _, err := b.Wake(ctx, tenant.Discard); err != nil {
			t.Fatal(err)
		}
		if err := b.Sleep(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Wake(ctx, tenant.Discard); err != nil {
			t.Fatal(err)
		}
		if err := b.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}()
}

func TestSessionAuthWithoutSessionService(t *testing.T) {
	e := newEnv(t, envConfig{yaml: "auth: session\n", sim: redfishtest.Options{NoSessionService: true}})
	_, err := e.wake(t)
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "no SessionService") {
		t.Fatalf("Wake = %v, want ErrConfig about the missing SessionService", err)
	}
	if n := len(e.sim.Requests()); n != 1 {
		t.Fatalf("%d requests, want just the service root (no retry of a config error)", n)
	}
}

func TestRefusedButMootResetIsFine(t *testing.T) {
	e := newEnv(t, envConfig{})
	// The Reset is carried out, but the BMC answers 409 as some do when a second request races it.
	e.sim.Inject(redfishtest.Fault{Status: 409, Method: "POST", PathSuffix: "/Actions/ComputerSystem.Reset"})
	if err := e.sim.SetPowerState("node-1", "On"); err != nil {
		t.Fatal(err)
	}
	st, err := e.b.bmc.read(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	st.PowerState = "Off" // as read a moment before the node came on
	if err := e.b.powerOn(t.Context(), tenant.Discard, st); err != nil {
		t.Fatalf("powerOn = %v, want nil: the node is On", err)
	}
	e2 := newEnv(t, envConfig{})
	e2.sim.Inject(redfishtest.Fault{Status: 409, Method: "POST", PathSuffix: "/Actions/ComputerSystem.Reset"})
	if _, err := e2.wake(t); !errors.Is(err, ErrRejected) || Phase(err) != PhaseReset {
		t.Fatalf("Wake = %v, want ErrRejected in phase reset when the node stays Off", err)
	}
}
