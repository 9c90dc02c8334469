package redfish

// Every fault the backing reports has its class (issue 15 §3), and a throttle is backed off across the
// routes of one BMC (§4). Each test drives the backend against the simulator over real HTTP(S).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/activator/activator/internal/backend/redfish/redfishtest"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// resetOf1 is the path of node-1's Reset action.
const resetOf1 = "/Systems/node-1/Actions/ComputerSystem.Reset"

// TestFaultClasses: one fault of each class, from Wake, seen by tenant.ClassOf through the PhaseError
// and the "redfish wake of" wrapping, and on the PhaseError's own cause.
func TestFaultClasses(t *testing.T) {
	cases := []struct {
		name    string
		cfg     envConfig
		setup   func(e *env)
		want    tenant.Class
		kind    error
		phase   string
		mention string
	}{
		{name: "401: wrong password", cfg: envConfig{password: "wrong-password-123"},
			want: tenant.ClassTerminal, kind: ErrCredentials, phase: PhaseReset, mention: "(HTTP 401)"},
		{name: "untrusted certificate", cfg: envConfig{tls: true, untrusted: true},
			want: tenant.ClassTerminal, kind: ErrTLS, phase: PhaseReset, mention: "tls.ca_file"},
		{name: "no such system", cfg: envConfig{yaml: "system: node-9\n"},
			want: tenant.ClassTerminal, kind: ErrConfig, phase: PhaseReset, mention: `"node-9"`},
		{name: "429 with Retry-After on the Reset", setup: func(e *env) {
			e.sim.Inject(redfishtest.Fault{Status: 429, RetryAfter: time.Hour, Method: "POST", PathSuffix: resetOf1})
		}, want: tenant.ClassThrottle, kind: ErrThrottled, phase: PhaseReset, mention: "(retry after 1h0m0s)"},
		{name: "power state not reached within power_on_budget", cfg: envConfig{yaml: "power_on_budget: 300ms\n"},
			setup: func(e *env) { e.sim.SetNeverPowersOn("node-1", true) },
			want:  tenant.ClassRetryable, kind: ErrNotReached, phase: PhasePowerOn, mention: "power_on_budget 300ms"},
		{name: "connection refused", setup: func(e *env) { e.sim.Close() },
			want: tenant.ClassRetryable, kind: ErrAmbiguous, phase: PhaseReset, mention: "connection refused"},
		{name: "5xx on every call", setup: func(e *env) { e.sim.Inject(redfishtest.Fault{Status: 500, Count: 1000}) },
			want: tenant.ClassRetryable, kind: ErrAmbiguous, phase: PhaseReset, mention: "(HTTP 500)"},
		{name: "5xx on every Reset, settled by a read", setup: func(e *env) {
			e.sim.Inject(redfishtest.Fault{Status: 500, Count: 1000, Method: "POST", PathSuffix: resetOf1})
		}, want: tenant.ClassRetryable, kind: ErrAmbiguous, phase: PhaseReset, mention: "PowerState read again: Off, so Reset On did not land"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, c.cfg)
			if c.setup != nil {
				c.setup(e)
			}
			_, err := e.wake(t)
			if got := tenant.ClassOf(err); got != c.want {
				t.Errorf("ClassOf(%v) = %q, want %q", err, got, c.want)
			}
			var pe *PhaseError
			if !errors.As(err, &pe) || pe.Phase != c.phase {
				t.Fatalf("Wake = %v, want a PhaseError of phase %s", err, c.phase)
			}
			if got := tenant.ClassOf(pe.Err); got != c.want {
				t.Errorf("ClassOf(the PhaseError's cause) = %q, want %q", got, c.want)
			}
			if !errors.Is(err, c.kind) {
				t.Errorf("Wake = %v, want it to match %v", err, c.kind)
			}
			if !strings.Contains(err.Error(), c.mention) {
				t.Errorf("Wake = %q, want it to mention %q", err, c.mention)
			}
		})
	}
}

// TestFaultClassesBeyondWake: Sleep, Adopt, Check and Open classify their errors too.
func TestFaultClassesBeyondWake(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	wrong := newEnv(t, envConfig{password: "wrong-password-123"})
	if _, _, err := wrong.b.Adopt(ctx); tenant.ClassOf(err) != tenant.ClassTerminal {
		t.Errorf("Adopt with a wrong password = %v (class %q), want terminal", err, tenant.ClassOf(err))
	}
	if err := NewProvider(Options{}).Check(ctx, wrong.route); tenant.ClassOf(err) != tenant.ClassTerminal {
		t.Errorf("Check with a wrong password = %v (class %q), want terminal", err, tenant.ClassOf(err))
	}
	if _, err := NewProvider(Options{}).Open(testRoute()); tenant.ClassOf(err) != tenant.ClassTerminal {
		t.Errorf("Open without settings = %v (class %q), want terminal", err, tenant.ClassOf(err))
	}
	r := testRoute()
	r.Settings = decode(t, r, "endpoint: https://10.0.0.17\n")
	r.Settings.(*Settings).TLS.CAFile = filepath.Join(t.TempDir(), "gone.pem") // removed after Decode
	if _, err := NewProvider(Options{}).Open(r); tenant.ClassOf(err) != tenant.ClassTerminal || !strings.Contains(err.Error(), "tls.ca_file") {
		t.Errorf("Open with a missing tls.ca_file = %v (class %q), want terminal, naming tls.ca_file", err, tenant.ClassOf(err))
	}

	e := newEnv(t, envConfig{yaml: "shutdown_grace: 200ms\n"})
	e.mustWake(t)
	e.sim.SetIgnoreGraceful("node-1", true)
	err := e.sleep(t)
	if tenant.ClassOf(err) != tenant.ClassRetryable || !errors.Is(err, ErrNotReached) || Phase(err) != PhaseShutdown {
		t.Fatalf("Sleep of a node ignoring GracefulShutdown = %v (class %q), want retryable ErrNotReached in phase shutdown", err, tenant.ClassOf(err))
	}
	if !strings.Contains(err.Error(), "node-1 still On after") || !strings.Contains(err.Error(), "shutdown_grace 200ms") {
		t.Fatalf("Sleep = %q, want the last state and the budget", err)
	}
}

// budgetTracker records phases with the budget each was given (tenant.Budgeter).
type budgetTracker struct {
	recTracker
	budgets map[string]time.Duration
}

func (b *budgetTracker) PhaseBudget(d time.Duration) {
	b.budgets[b.phases[len(b.phases)-1]] = d
}

// TestPowerOnPhaseBudget: the wake record shows power_on with its budget; a timeout names the phase,
// the budget and the last state seen; a wake called off in power_on says so rather than blame the budget.
func TestPowerOnPhaseBudget(t *testing.T) {
	e := newEnv(t, envConfig{yaml: "power_on_budget: 300ms\n"})
	e.sim.SetNeverPowersOn("node-1", true)
	tr := &budgetTracker{budgets: map[string]time.Duration{}}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	_, err := e.b.Wake(ctx, tr)
	if want := []string{PhaseReset, PhasePowerOn}; !slices.Equal(tr.phases, want) {
		t.Fatalf("phases = %v, want %v", tr.phases, want)
	}
	if got := tr.budgets; len(got) != 1 || got[PhasePowerOn] != 300*time.Millisecond {
		t.Fatalf("phase budgets = %v, want power_on 300ms only", got)
	}
	for _, want := range []string{"phase power_on: ", "node-1 still Off after ", "(want On; power_on_budget 300ms)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Wake = %q, want it to mention %q", err, want)
		}
	}

	e2 := newEnv(t, envConfig{})
	e2.sim.SetNeverPowersOn("node-1", true)
	wctx, stop := context.WithCancel(context.Background())
	defer stop()
	_, err = e2.b.Wake(wctx, &cancelAt{phase: PhasePowerOn, cancel: stop})
	if !errors.Is(err, ErrNotReached) || !strings.Contains(err.Error(), "(want On; canceled before power_on_budget 2m0s ran out)") {
		t.Fatalf("Wake canceled in power_on = %v, want ErrNotReached saying it was canceled within the budget", err)
	}
}

// cancelAt cancels the wake as it enters phase.
type cancelAt struct {
	phase  string
	cancel context.CancelFunc
}

func (c *cancelAt) Phase(p string) {
	if p == c.phase {
		c.cancel()
	}
}
func (c *cancelAt) Note(string) {}

// heldPauses stands in for the throttle gates' pause: each wait is reported on waits, then held until
// release is closed.
type heldPauses struct {
	waits   chan time.Duration
	release chan struct{}
}

func newHeldPauses() *heldPauses {
	return &heldPauses{waits: make(chan time.Duration, 1000), release: make(chan struct{})}
}

func (h *heldPauses) pause(ctx context.Context, d time.Duration) error {
	select {
	case h.waits <- d:
	default:
	}
	select {
	case <-h.release:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// next returns the next wait held, within budget.
func (h *heldPauses) next(t *testing.T, who string) time.Duration {
	t.Helper()
	select {
	case d := <-h.waits:
		return d
	case <-time.After(budget):
		t.Fatalf("%s not held at the throttle gate within %v", who, budget)
		return 0
	}
}

// newSharedSim starts a simulated BMC with systems node-1 and node-2, and the test account.
func newSharedSim(t *testing.T) *redfishtest.Server {
	t.Helper()
	sim, err := redfishtest.New(redfishtest.Options{Username: testUser, Password: testPassword, Systems: []redfishtest.System{
		{ID: "node-1", TransitionDelay: 20 * time.Millisecond}, {ID: "node-2", TransitionDelay: 20 * time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	return sim
}

// openOn opens route name, for system on sim, through p; wakeBudget bounds its wake, and its
// power_on_budget.
func openOn(t *testing.T, p *Provider, sim *redfishtest.Server, name, system string, wakeBudget time.Duration) *Backend {
	t.Helper()
	pw := filepath.Join(t.TempDir(), "bmc-password")
	if err := os.WriteFile(pw, []byte(testPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &registry.Route{Name: name, Backing: "redfish", WakeBudget: wakeBudget, SleepBudget: time.Minute}
	r.Settings = decode(t, r, fmt.Sprintf("endpoint: %s\nsystem: %s\nusername: %s\npassword_file: %s\npoll_interval: 10ms\nwatch_interval: 20ms\ntimeout: 5s\n",
		sim.URL, system, testUser, pw))
	be, err := p.Open(r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		_ = be.(*Backend).Close(ctx)
	})
	return be.(*Backend)
}

// wakeAsync wakes b in the background; the result arrives on the channel.
func wakeAsync(ctx context.Context, b *Backend) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := b.Wake(ctx, tenant.Discard)
		done <- err
	}()
	return done
}

// TestThrottleHoldsEveryRouteOfTheBMC: route a's Reset is answered 429 with Retry-After; route b, on
// another system of the same BMC, then waits at the gate before its first call, sending nothing, while
// route c on another BMC goes ahead. Once the wait is over both wakes complete, with one Reset each.
// The gates' pause is held on events, so nothing depends on the clock: the Retry-After is an hour, and
// the wakes' budgets longer.
func TestThrottleHoldsEveryRouteOfTheBMC(t *testing.T) {
	held := newHeldPauses()
	p := NewProvider(Options{})
	p.endpoints.pause = held.pause
	sim, other := newSharedSim(t), newSharedSim(t)
	a := openOn(t, p, sim, "metal-a", "node-1", 3*time.Hour)
	b := openOn(t, p, sim, "metal-b", "node-2", 3*time.Hour)
	c := openOn(t, p, other, "metal-c", "node-1", 3*time.Hour)
	sim.Inject(redfishtest.Fault{Status: 429, RetryAfter: time.Hour, Method: "POST", PathSuffix: resetOf1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	doneA := wakeAsync(ctx, a)
	held.next(t, "route a, after its 429")
	throttled := len(sim.Requests())
	if last := sim.Requests()[throttled-1]; last.Status != 429 || !strings.HasSuffix(last.Path, resetOf1) {
		t.Fatalf("last request before the hold = %+v, want the Reset answered 429", last)
	}
	doneB := wakeAsync(ctx, b)
	if d := held.next(t, "route b"); d < time.Hour-budget || d > time.Hour+time.Hour/10 {
		t.Fatalf("route b held for %v, want the BMC's Retry-After (1h, plus at most a tenth of jitter)", d)
	}
	if got := sim.Requests()[throttled:]; len(got) != 0 {
		t.Fatalf("requests sent to the throttling BMC while held: %+v", got)
	}
	if err := <-wakeAsync(ctx, c); err != nil {
		t.Fatalf("route c, on another BMC: Wake = %v", err)
	}
	if n := len(held.waits); n != 0 {
		t.Fatalf("%d calls held that the throttle does not concern (route c)", n)
	}

	close(held.release)
	for name, done := range map[string]<-chan error{"a": doneA, "b": doneB} {
		if err := <-done; err != nil {
			t.Fatalf("route %s: Wake after the gate opened = %v", name, err)
		}
	}
	for _, id := range []string{"node-1", "node-2"} {
		if got := sim.Resets(id); !slices.Equal(got, []string{"On"}) {
			t.Errorf("%s: Resets = %v, want [On] (the throttled one not carried out)", id, got)
		}
	}
}

// TestThrottleBeyondBudgetHoldsEveryRoute: with a Retry-After longer than the wakes' budgets, route a
// fails at once with a throttle, and so does route b on the same BMC, without sending a request.
func TestThrottleBeyondBudgetHoldsEveryRoute(t *testing.T) {
	p := NewProvider(Options{})
	sim := newSharedSim(t)
	a := openOn(t, p, sim, "metal-a", "node-1", 2*time.Minute)
	b := openOn(t, p, sim, "metal-b", "node-2", 2*time.Minute)
	sim.Inject(redfishtest.Fault{Status: 429, RetryAfter: time.Hour, Method: "POST", PathSuffix: resetOf1})
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if _, err := a.Wake(ctx, tenant.Discard); tenant.ClassOf(err) != tenant.ClassThrottle {
		t.Fatalf("route a: Wake = %v (class %q), want a throttle", err, tenant.ClassOf(err))
	}
	before := len(sim.Requests())
	_, err := b.Wake(ctx, tenant.Discard)
	if tenant.ClassOf(err) != tenant.ClassThrottle || !strings.Contains(err.Error(), "not sent: the BMC answered HTTP 429") {
		t.Fatalf("route b: Wake = %v (class %q), want a throttle, not sent", err, tenant.ClassOf(err))
	}
	var be *BMCError
	if !errors.As(err, &be) || be.RetryAfter <= time.Hour-budget {
		t.Fatalf("route b: Wake = %v, want the BMC's Retry-After left (about 1h)", err)
	}
	if got := sim.Requests()[before:]; len(got) != 0 {
		t.Fatalf("route b sent %d requests to the throttling BMC: %+v", len(got), got)
	}
	if ctx.Err() != nil {
		t.Fatal("the wakes waited out their budget instead of failing at once")
	}
}

// TestGatePerEndpoint: spellings of one endpoint share its state (throttle gate, rejected
// credentials); another port, scheme or path does not; the state is dropped with its last user.
func TestGatePerEndpoint(t *testing.T) {
	var es endpoints
	e1, release1 := es.acquire("https://BMC-7.example")
	for _, same := range []string{"https://bmc-7.example:443", "https://bmc-7.example/"} {
		if e, release := es.acquire(same); e != e1 || e.gate != e1.gate || e.creds != e1.creds {
			t.Errorf("%s: a state of its own, want that of https://BMC-7.example", same)
		} else {
			release()
		}
	}
	for _, other := range []string{"http://bmc-7.example", "https://bmc-7.example:8443", "https://bmc-8.example", "https://bmc-7.example/node-2"} {
		if e, release := es.acquire(other); e == e1 || e.gate == e1.gate || e.creds == e1.creds {
			t.Errorf("%s: shares the state of https://BMC-7.example", other)
		} else {
			release()
		}
	}
	release1()
	if n := len(es.m); n != 0 {
		t.Fatalf("%d endpoint states left after every user released its own", n)
	}
}

// TestStateErrorNamesBudget: a timeout names its budget, and what ended the wait when it was not the
// budget.
func TestStateErrorNamesBudget(t *testing.T) {
	base := StateError{Node: "node-7", Want: "On", Last: "Off", After: 5 * time.Minute, Key: "power_on_budget", Budget: 5 * time.Minute, op: "wake"}
	cases := []struct {
		name  string
		cut   bool
		cause error
		want  string
	}{
		{"budget", false, context.DeadlineExceeded, "node-7 still Off after 5m0s (want On; power_on_budget 5m0s)"},
		{"the wake's deadline", true, context.DeadlineExceeded, "node-7 still Off after 5m0s (want On; cut short by the wake's deadline, before power_on_budget 5m0s ran out)"},
		{"canceled", true, context.Canceled, "node-7 still Off after 5m0s (want On; canceled before power_on_budget 5m0s ran out)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := base
			e.cut, e.Cause = c.cut, c.cause
			if got := e.Error(); got != c.want {
				t.Errorf("Error() = %q, want %q", got, c.want)
			}
		})
	}
}
