package redfish

// Credentials the BMC rejected are not sent again by wakes and sleeps either, only by the timed retry
// (retryRejected) or once they change: each failed login counts towards the BMC account's lockout, and
// under steady requests a route wakes once per backoff.max. Each test drives the backend against the
// simulator over real HTTP, counts the logins it refused (redfishtest.Server.FailedLogins), and steps
// the clock of the BMC's record of rejections (testClock) instead of waiting an hour.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/activator/activator/internal/backend/redfish/redfishtest"
	"github.com/activator/activator/internal/tenant"
)

// wrongPassword is what the password file holds in the tests where the BMC rejects it.
const wrongPassword = "wrong-password-123"

// testClock is a clock the test steps.
type testClock struct {
	mu sync.Mutex // guards t
	t  time.Time
}

func newTestClock() *testClock {
	return &testClock{t: time.Date(2025, 3, 4, 9, 0, 0, 0, time.Local)}
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// wantHeld checks that err is a login held back (ErrCredentials, nothing sent) whose message says
// what an operator needs: the BMC, where the password comes from, when the BMC rejected it, what to
// do, and when the timed retry comes.
func wantHeld(t *testing.T, what string, err error, endpoint, pwFile string, rejectedAt time.Time) {
	t.Helper()
	if !errors.Is(err, ErrCredentials) {
		t.Fatalf("%s = %v, want ErrCredentials", what, err)
	}
	msg := err.Error()
	for _, want := range []string{"not sent", endpoint, "password_file " + pwFile, "rejected these credentials at " + rejectedAt.Format(time.TimeOnly),
		"Put the right password in", "timed retry at " + rejectedAt.Add(retryRejected).Format(time.TimeOnly)} {
		if !strings.Contains(msg, want) {
			t.Errorf("%s: error %q does not say %q", what, msg, want)
		}
	}
	if strings.Contains(msg, wrongPassword) || strings.Contains(msg, testPassword) {
		t.Fatalf("%s: error %q holds a password", what, msg)
	}
}

// TestWakesHeldBackByRejectedCredentials: the password file holds a password the BMC rejects, and
// requests keep coming: three hours of them, one wake a minute (the default backoff.max). Each wake
// logged in and was refused, 60 failed logins an hour, which locks BMC accounts. Now the first is
// refused at the BMC, and the others fail at once without sending anything, saying why, except for the
// timed retry, one an hour: four failed logins in three hours. Once the file holds the right
// password, the next wake logs in at once.
func TestWakesHeldBackByRejectedCredentials(t *testing.T) {
	for _, auth := range []string{"session", "basic"} {
		t.Run(auth, func(t *testing.T) {
			clk := newTestClock()
			e := newEnv(t, envConfig{password: wrongPassword, yaml: "auth: " + auth + "\n", now: clk.now})
			start := clk.now()
			if _, err := e.wake(t); !errors.Is(err, ErrCredentials) || !strings.Contains(err.Error(), "(HTTP 401)") {
				t.Fatalf("first Wake = %v, want ErrCredentials (HTTP 401)", err)
			}
			if n := e.sim.FailedLogins(); n != 1 {
				t.Fatalf("%d failed logins after the first wake, want 1", n)
			}

			const every, span = time.Minute, 3 * time.Hour
			var failedAt []time.Duration // when, since the first wake, a wake cost a failed login
			lastRejected := start
			for d := every; d <= span; d += every {
				clk.advance(every)
				logins, reqs := e.sim.FailedLogins(), len(e.sim.Requests())
				_, err := e.wake(t)
				if !errors.Is(err, ErrCredentials) || Phase(err) != PhaseReset {
					t.Fatalf("Wake at +%v = %v, want ErrCredentials in phase reset", d, err)
				}
				if e.sim.FailedLogins() > logins {
					failedAt = append(failedAt, d)
					lastRejected = clk.now()
					continue
				}
				if sent := e.sim.Requests()[reqs:]; len(sent) != 0 {
					t.Fatalf("Wake at +%v, held back, sent %+v", d, sent)
				}
				if d%(time.Hour) == 30*time.Minute { // one held wake in each hour: its message
					wantHeld(t, fmt.Sprintf("Wake at +%v", d), err, e.sim.URL, e.s.PasswordFile, lastRejected)
				}
			}
			if want := []time.Duration{time.Hour, 2 * time.Hour, 3 * time.Hour}; !slices.Equal(failedAt, want) {
				t.Fatalf("wakes that cost a failed login, after the first: at +%v, want +%v (the timed retry, one each %v)", failedAt, want, retryRejected)
			}
			if n, bound := e.sim.FailedLogins(), 1+int(span/retryRejected); n != bound {
				t.Fatalf("%d failed logins in %v of wakes each %v, want %d", n, span, every, bound)
			}
			// The route's status says so (tenant.Warner).
			w := e.b.Warning()
			for _, want := range []string{"rejected the credentials", e.sim.URL, "wakes and sleeps send nothing", e.s.PasswordFile} {
				if !strings.Contains(w, want) {
					t.Errorf("Warning() = %q, does not say %q", w, want)
				}
			}

			e.rotatePasswordFile(t, testPassword)
			e.mustWake(t)
			if n := e.sim.FailedLogins(); n != 4 {
				t.Fatalf("%d failed logins once the file holds the right password, want still 4", n)
			}
			if w := e.b.Warning(); w != "" {
				t.Errorf("Warning() = %q after a wake that worked, want none", w)
			}
			if strings.Contains(e.logs.String(), testPassword) || strings.Contains(e.logs.String(), wrongPassword) {
				t.Fatal("the logs hold a password")
			}
		})
	}
}

// TestTimedRetryNoticesTheBMCPutRight: the BMC rejects the password the file holds, then the account
// is put right on the BMC (its password set to the file's), the file untouched. Wakes stay held back,
// sending nothing, until the timed retry, which logs in and wakes the node.
func TestTimedRetryNoticesTheBMCPutRight(t *testing.T) {
	clk := newTestClock()
	e := newEnv(t, envConfig{password: wrongPassword, now: clk.now})
	if _, err := e.wake(t); !errors.Is(err, ErrCredentials) {
		t.Fatalf("Wake = %v, want ErrCredentials", err)
	}
	e.sim.SetPassword(wrongPassword)
	clk.advance(retryRejected - time.Second)
	reqs := len(e.sim.Requests())
	if _, err := e.wake(t); !errors.Is(err, ErrCredentials) {
		t.Fatalf("Wake before the timed retry = %v, want ErrCredentials", err)
	}
	if sent := e.sim.Requests()[reqs:]; len(sent) != 0 {
		t.Fatalf("the wake before the timed retry sent %+v", sent)
	}
	clk.advance(time.Second)
	e.mustWake(t)
	if got := e.sim.PowerState("node-1"); got != redfishtest.On {
		t.Fatalf("PowerState = %s, want On", got)
	}
	if n := e.sim.FailedLogins(); n != 1 {
		t.Fatalf("%d failed logins, want 1", n)
	}
	if !strings.Contains(e.logs.String(), "the timed retry") {
		t.Errorf("the timed retry was not logged:\n%s", e.logs)
	}
	if w := e.b.Warning(); w != "" {
		t.Errorf("Warning() = %q after the timed retry worked, want none", w)
	}
}

// TestRoutesOfOneBMCShareTheTimedRetry: four routes of one Provider on one BMC (fleet members are such
// routes), each with a file holding the same password, which the BMC rejects. They wake at once, as a
// fleet's members do: one login goes to the BMC and the others wait for it, then fail without sending
// theirs. When the timed retry is due and all four wake at once again, one of them logs in: one failed
// login per BMC each time, not one per route.
func TestRoutesOfOneBMCShareTheTimedRetry(t *testing.T) {
	var systems []redfishtest.System
	for i := range 4 {
		systems = append(systems, redfishtest.System{ID: fmt.Sprintf("node-%d", i+1), TransitionDelay: 20 * time.Millisecond})
	}
	sim, err := redfishtest.New(redfishtest.Options{Username: testUser, Password: testPassword, Systems: systems})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	clk := newTestClock()
	p := NewProvider(Options{})
	p.endpoints.now = clk.now
	var routes []*Backend
	for i, s := range systems {
		b := openOn(t, p, sim, fmt.Sprintf("metal-%d", i+1), s.ID, 2*time.Minute)
		if err := os.WriteFile(b.s.PasswordFile, []byte(wrongPassword+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		routes = append(routes, b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	wakeAll := func(when string) {
		t.Helper()
		var results []<-chan error
		for _, b := range routes {
			results = append(results, wakeAsync(ctx, b))
		}
		for i, r := range results {
			if err := <-r; !errors.Is(err, ErrCredentials) {
				t.Fatalf("route %d: Wake %s = %v, want ErrCredentials", i+1, when, err)
			}
		}
	}

	wakeAll("with a new password")
	if n := sim.FailedLogins(); n != 1 {
		t.Fatalf("%d failed logins after four routes woke at once with a password the BMC rejects, want 1", n)
	}
	clk.advance(retryRejected / 2)
	wakeAll("held back")
	if n := sim.FailedLogins(); n != 1 {
		t.Fatalf("%d failed logins after four routes woke again before the timed retry, want still 1", n)
	}
	clk.advance(retryRejected / 2)
	wakeAll("at the timed retry")
	if n := sim.FailedLogins(); n != 2 {
		t.Fatalf("%d failed logins after four routes woke when the timed retry was due, want 2", n)
	}
}

// TestSleepsHeldBackByRejectedCredentials: the BMC's password changes while the node is awake. The
// idle sleep is refused at its login; the next ones (each idle timeout) fail at once, send nothing,
// and say so: the node stays On, its Life goes on, and the sleep fails as what it is. Once the file
// holds the new password, the sleep powers the node off.
func TestSleepsHeldBackByRejectedCredentials(t *testing.T) {
	clk := newTestClock()
	e := newEnv(t, envConfig{now: clk.now})
	st := newStepper()
	e.b.pause = st.pause // the watch waits on the test, quiet
	life := e.mustWake(t)
	e.sim.SetPassword(rotated)
	rejectedAt := clk.now()
	if err := e.sleep(t); !errors.Is(err, ErrCredentials) || Phase(err) != PhaseShutdown {
		t.Fatalf("Sleep = %v, want ErrCredentials in phase shutdown", err)
	}
	for i := range 5 {
		clk.advance(5 * time.Minute)
		reqs := len(e.sim.Requests())
		err := e.sleep(t)
		if Phase(err) != PhaseShutdown || !strings.HasPrefix(err.Error(), "redfish sleep of node-1: ") {
			t.Fatalf("Sleep %d = %v, want a failed sleep in phase shutdown", i+2, err)
		}
		wantHeld(t, fmt.Sprintf("Sleep %d", i+2), err, e.sim.URL, e.s.PasswordFile, rejectedAt)
		if sent := e.sim.Requests()[reqs:]; len(sent) != 0 {
			t.Fatalf("Sleep %d, held back, sent %+v", i+2, sent)
		}
	}
	if n := e.sim.FailedLogins(); n != 1 {
		t.Fatalf("%d failed logins after six sleeps, want 1", n)
	}
	if got := e.sim.PowerState("node-1"); got != redfishtest.On {
		t.Fatalf("PowerState = %s, want On", got)
	}
	if err := life.Err(); err != nil {
		t.Fatalf("the held sleeps ended the Life: %v", err)
	}
	if got := e.sim.Resets("node-1"); !slices.Equal(got, []string{"On"}) {
		t.Fatalf("Resets = %v, want only the wake's On", got)
	}

	e.rotatePasswordFile(t, rotated)
	if err := e.sleep(t); err != nil {
		t.Fatalf("Sleep once the file holds the new password: %v", err)
	}
	if got := e.sim.PowerState("node-1"); got != redfishtest.Off {
		t.Fatalf("PowerState = %s, want Off", got)
	}
	if n := e.sim.FailedLogins(); n != 1 {
		t.Fatalf("%d failed logins, want still 1", n)
	}
}

// TestWatchTakesTheTimedRetry: the watch of an awake node, held back by a rejected password, logs in
// at the timed retry too (once, however many rounds), and so notices the account put right on the BMC
// while the file is unchanged; the stop is logged once, not again at each failed retry.
func TestWatchTakesTheTimedRetry(t *testing.T) {
	clk := newTestClock()
	e := newEnv(t, envConfig{now: clk.now})
	st := newStepper()
	e.b.pause = st.pause
	e.mustWake(t)
	st.waiting(t, "the watch")
	e.sim.SetPassword(rotated)
	for range 5 {
		st.round(t, "the watch")
	}
	if n := e.sim.FailedLogins(); n != 1 {
		t.Fatalf("%d failed logins, want 1", n)
	}
	clk.advance(retryRejected)
	for range 5 {
		st.round(t, "the watch")
	}
	if n := e.sim.FailedLogins(); n != 2 {
		t.Fatalf("%d failed logins after the timed retry was due, want 2", n)
	}
	if n := lines(e.logs.String(), "level=WARN", "stops logging in"); n != 1 {
		t.Fatalf("the stop was logged %d times at WARN, want once", n)
	}

	e.sim.SetPassword(testPassword) // put back on the BMC; the file never changed
	clk.advance(retryRejected)
	reads := okReads(e.sim.Requests())
	st.round(t, "the watch")
	if got := okReads(e.sim.Requests()); got != reads+1 {
		t.Fatalf("the watch's round at the timed retry made %d reads, want 1", got-reads)
	}
	if !strings.Contains(e.logs.String(), "watch resumes") {
		t.Errorf("the resumption was not logged:\n%s", e.logs)
	}
	if w := e.b.Warning(); w != "" {
		t.Errorf("Warning() = %q once the watch resumed, want none", w)
	}
	if n := e.sim.FailedLogins(); n != 2 {
		t.Fatalf("%d failed logins, want still 2", n)
	}
}

// TestForbiddenResetHoldsNothingBack: a 403 to the Reset of a client the BMC let in (an account
// without the privilege to Reset) says nothing against the password: it is not a failed login, and
// the next wake logs in and tries again rather than being held back for an hour.
func TestForbiddenResetHoldsNothingBack(t *testing.T) {
	// With session auth the refused client is replaced by a fresh login that tries the Reset again.
	for auth, refusals := range map[string]int{"session": 2, "basic": 1} {
		t.Run(auth, func(t *testing.T) {
			e := newEnv(t, envConfig{yaml: "auth: " + auth + "\n", now: newTestClock().now})
			e.sim.Inject(redfishtest.Fault{Status: 403, Method: "POST", PathSuffix: "/Actions/ComputerSystem.Reset", Count: refusals})
			_, err := e.wake(t)
			if !errors.Is(err, ErrCredentials) || !strings.Contains(err.Error(), "(HTTP 403)") {
				t.Fatalf("Wake = %v, want ErrCredentials (HTTP 403)", err)
			}
			if w := e.b.Warning(); w != "" {
				t.Errorf("Warning() = %q after a forbidden Reset, want none", w)
			}
			e.mustWake(t)
			if got := e.sim.PowerState("node-1"); got != redfishtest.On {
				t.Fatalf("PowerState = %s, want On", got)
			}
			if n := e.sim.FailedLogins(); n != 0 {
				t.Fatalf("%d failed logins, want none", n)
			}
		})
	}
}

// TestBasicClientsShareTheRejection: with basic auth every request carries the password, so a client
// logged in before the BMC's password changed sends it again with each call. Two routes on one BMC,
// both awake with such clients; the password changes on the BMC. The first route's sleep is refused
// (one failed login); the second route's sleep does not send the rejected password with its own
// client, and fails at once.
func TestBasicClientsShareTheRejection(t *testing.T) {
	sim := newSharedSim(t)
	clk := newTestClock()
	p := NewProvider(Options{})
	p.endpoints.now = clk.now
	var routes []*Backend
	for i, id := range []string{"node-1", "node-2"} {
		b := openOn(t, p, sim, fmt.Sprintf("metal-%d", i+1), id, 2*time.Minute)
		b.s.Auth = AuthBasic
		routes = append(routes, b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	for _, b := range routes {
		st := newStepper()
		b.pause = st.pause // the watches wait on the test, quiet
		if _, err := b.Wake(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	sim.SetPassword(rotated)
	for i, b := range routes {
		if err := b.Sleep(ctx); !errors.Is(err, ErrCredentials) || Phase(err) != PhaseShutdown {
			t.Fatalf("route %d: Sleep = %v, want ErrCredentials in phase shutdown", i+1, err)
		}
	}
	if n := sim.FailedLogins(); n != 1 {
		t.Fatalf("%d failed logins after two routes' basic clients slept, want 1", n)
	}
}

// TestOperatorWakeTriesRejectedCredentials: the account is put right on the BMC with the password file
// untouched, as in TestTimedRetryNoticesTheBMCPutRight, but an operator asks for the wake by name
// (`activator wake`: tenant.ByOperator) long before the timed retry. That wake logs in at once and
// wakes the node; a request's wake meanwhile stays held back. The operator's attempt takes the place
// of the timed retry: rejected again, the next automatic retry is an hour after it.
func TestOperatorWakeTriesRejectedCredentials(t *testing.T) {
	clk := newTestClock()
	e := newEnv(t, envConfig{password: wrongPassword, now: clk.now})
	if _, err := e.wake(t); !errors.Is(err, ErrCredentials) {
		t.Fatalf("Wake = %v, want ErrCredentials", err)
	}
	clk.advance(time.Minute)
	reqs := len(e.sim.Requests())
	if _, err := e.wake(t); !errors.Is(err, ErrCredentials) {
		t.Fatalf("a request's Wake = %v, want ErrCredentials (held back)", err)
	}
	if sent := e.sim.Requests()[reqs:]; len(sent) != 0 {
		t.Fatalf("a request's wake sent %+v", sent)
	}

	// An operator tries while the password is still wrong on the BMC: one more failed login, and the
	// timed retry moves to an hour after it.
	ctx, cancel := context.WithTimeout(tenant.ByOperator(context.Background()), budget)
	defer cancel()
	if _, err := e.b.Wake(ctx, tenant.Discard); !errors.Is(err, ErrCredentials) || !strings.Contains(err.Error(), "(HTTP 401)") {
		t.Fatalf("the operator's Wake = %v, want the BMC's 401", err)
	}
	if n := e.sim.FailedLogins(); n != 2 {
		t.Fatalf("%d failed logins, want 2 (the first, the operator's)", n)
	}
	clk.advance(retryRejected - time.Second)
	if _, err := e.wake(t); !errors.Is(err, ErrCredentials) || strings.Contains(err.Error(), "(HTTP 401)") {
		t.Fatalf("a request's Wake an hour after the first rejection = %v, want held back (the operator took the retry)", err)
	}

	// Put right on the BMC; the operator's next wake logs in at once.
	e.sim.SetPassword(wrongPassword)
	if _, err := e.b.Wake(ctx, tenant.Discard); err != nil {
		t.Fatalf("the operator's Wake after the BMC was put right = %v", err)
	}
	if got := e.sim.PowerState("node-1"); got != redfishtest.On {
		t.Fatalf("PowerState = %s, want On", got)
	}
	if n := e.sim.FailedLogins(); n != 2 {
		t.Fatalf("%d failed logins, want 2", n)
	}
	if !strings.Contains(e.logs.String(), "an operator asked for this wake or sleep by name") {
		t.Errorf("the operator's retry was not logged:\n%s", e.logs)
	}
}

// TestRemedyNamesTheRouteToWake: the held-back error's advice names the route an operator can wake
// or put to sleep: a fleet member's fleet, not the member's own route, which `activator wake` refuses
// (found by an operator trial: "pool.c" is not a valid route name).
func TestRemedyNamesTheRouteToWake(t *testing.T) {
	for route, want := range map[string]string{"metal": "metal", "pool.c": "pool", "render.node-07": "render"} {
		if got := operatorRoute(route); got != want {
			t.Errorf("operatorRoute(%q) = %q, want %q", route, got, want)
		}
	}
	clk := newTestClock()
	e := newEnv(t, envConfig{password: wrongPassword, now: clk.now})
	_, _ = e.wake(t)
	_, err := e.wake(t)
	if msg := fmt.Sprint(err); !strings.Contains(msg, "`activator wake metal` (or `activator sleep metal`, for a node to be off)") {
		t.Errorf("held error %q does not name the commands", msg)
	}
}

// TestSecondRouteGetsTheAdvice: two routes on one BMC are logged in when its password changes. The
// first to call is refused, logs in again with the file's password and is refused again; the second,
// refused on its session, does not log in (those credentials are known rejected) and fails with the
// same advice as a held-back login, and warns. Found by an operator trial: the second's error was the
// bare "credentials rejected by BMC (HTTP 401)", with no word of what to do, and no warning.
func TestSecondRouteGetsTheAdvice(t *testing.T) {
	systems := []redfishtest.System{{ID: "node-1", TransitionDelay: 20 * time.Millisecond}, {ID: "node-2", TransitionDelay: 20 * time.Millisecond}}
	sim, err := redfishtest.New(redfishtest.Options{Username: testUser, Password: testPassword, Systems: systems})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	p := NewProvider(Options{})
	a := openOn(t, p, sim, "metal-1", "node-1", 2*time.Minute)
	b := openOn(t, p, sim, "metal-2", "node-2", 2*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	for _, r := range []*Backend{a, b} {
		if err := <-wakeAsync(ctx, r); err != nil {
			t.Fatalf("Wake: %v", err)
		}
	}
	sim.SetPassword("rotated-on-the-bmc")
	if err := a.Sleep(ctx); !errors.Is(err, ErrCredentials) {
		t.Fatalf("first route's Sleep = %v, want ErrCredentials", err)
	}
	if n := sim.FailedLogins(); n != 1 {
		t.Fatalf("%d failed logins after the first route's sleep, want 1", n)
	}
	err = b.Sleep(ctx)
	if !errors.Is(err, ErrCredentials) {
		t.Fatalf("second route's Sleep = %v, want ErrCredentials", err)
	}
	for _, want := range []string{"not sent", "Put the right password in", "`activator sleep metal-2`"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("second route's error %q does not say %q", err, want)
		}
	}
	if w := b.Warning(); w == "" {
		t.Error("the second route does not warn")
	}
	if n := sim.FailedLogins(); n != 1 {
		t.Errorf("%d failed logins, want still 1", n)
	}
}

// TestCheckGivesNoServerAdvice: `activator check` (Options.OneShot) checks two routes of one BMC with
// a password it rejects. The first is refused at the BMC; the second is held back, sending nothing, and
// its error names the fix but not the server's commands or its timed retry, meaningless in a process
// that exits (found by an operator trial: check advised `activator wake pool.b`).
func TestCheckGivesNoServerAdvice(t *testing.T) {
	e := newEnv(t, envConfig{password: wrongPassword})
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	p := NewProvider(Options{OneShot: true})
	// The endpoint's record lives while a backend on it is open: the check's runs overlap (liveCheck
	// checks routes at once), which this one held open stands for.
	keep, err := p.Open(e.route)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = keep.(*Backend).Close(ctx) }()
	if err := p.Check(ctx, e.route); !errors.Is(err, ErrCredentials) || !strings.Contains(err.Error(), "(HTTP 401)") {
		t.Fatalf("first Check = %v, want the BMC's 401", err)
	}
	second := *e.route
	second.Name = "metal-2"
	err = p.Check(ctx, &second)
	if !errors.Is(err, ErrCredentials) {
		t.Fatalf("second Check = %v, want ErrCredentials", err)
	}
	msg := err.Error()
	for _, want := range []string{"not sent", "Put the right password in", "this check sends rejected credentials once per run"} {
		if !strings.Contains(msg, want) {
			t.Errorf("second Check's error %q does not say %q", msg, want)
		}
	}
	for _, not := range []string{"activator wake", "activator sleep", "timed retry"} {
		if strings.Contains(msg, not) {
			t.Errorf("second Check's error %q says %q, which a check process cannot follow", msg, not)
		}
	}
	if n := e.sim.FailedLogins(); n != 1 {
		t.Errorf("%d failed logins, want 1", n)
	}
}

// TestHeldSleepsWarnOnce: the BMC rejects the password while the node is awake, and the idle clock
// asks for a sleep again after each idle window. Each sleep is held back, which takes the node back as
// awake and starts its watch anew; the watch's WARN that it stops logging in was said again by each new
// watch, once per idle window, for one condition. It is said once, then again only when the condition
// changes (another wrong password), and the resumption once when it clears; after that, the next
// rejection is a new condition, said again, also when it came about by a sleep that worked (found by
// an operator trial).
func TestHeldSleepsWarnOnce(t *testing.T) {
	stops := func(e *env) int { return lines(e.logs.String(), "level=WARN", "power-state watch stops logging in") }
	resumes := func(e *env) int { return lines(e.logs.String(), "level=INFO", "power-state watch resumes") }
	// heldSleeps has the idle clock ask for n sleeps, each held back, with some watch rounds between.
	heldSleeps := func(t *testing.T, e *env, clk *testClock, st *stepper, n int) {
		t.Helper()
		for i := range n {
			clk.advance(5 * time.Minute)
			if err := e.sleep(t); !errors.Is(err, ErrCredentials) {
				t.Fatalf("held-back Sleep %d = %v, want ErrCredentials", i+1, err)
			}
			st.waiting(t, "the watch restarted by the held-back sleep")
			for range 3 {
				st.round(t, "the watch")
			}
		}
	}

	clk := newTestClock()
	e := newEnv(t, envConfig{now: clk.now})
	st := newStepper()
	e.b.pause = st.pause
	life := e.mustWake(t)
	st.waiting(t, "the watch")
	e.sim.SetPassword(rotated)
	st.round(t, "the watch")
	if n := stops(e); n != 1 {
		t.Fatalf("the watch's first rejected round logged the stop %d times at WARN, want once:\n%s", n, e.logs)
	}
	heldSleeps(t, e, clk, st, 4)
	if n := stops(e); n != 1 {
		t.Fatalf("after 4 held-back sleeps the stop was logged %d times at WARN, want once (one condition):\n%s", n, e.logs)
	}
	if err := life.Err(); err != nil {
		t.Fatalf("the held-back sleeps ended the Life: %v", err)
	}
	if w := e.b.Warning(); !strings.Contains(w, "the power-state watch send nothing") {
		t.Errorf("Warning() = %q, want the held-back watch named", w)
	}

	// Another wrong password in the file is another condition: said once more, not once per sleep.
	e.rotatePasswordFile(t, "also-wrong-pw-3")
	st.round(t, "the watch")
	heldSleeps(t, e, clk, st, 3)
	if n := stops(e); n != 2 {
		t.Fatalf("after a second wrong password and 3 held-back sleeps the stop was logged %d times at WARN, want twice:\n%s", n, e.logs)
	}
	if n := e.sim.FailedLogins(); n != 2 {
		t.Fatalf("%d failed logins, want 2 (one per wrong password)", n)
	}

	// The right password: the watch resumes, said once.
	e.rotatePasswordFile(t, rotated)
	st.round(t, "the watch")
	st.round(t, "the watch")
	if n := resumes(e); n != 1 {
		t.Fatalf("the resumption was logged %d times at INFO, want once:\n%s", n, e.logs)
	}
	// The BMC's password changes again: a new condition, said again.
	e.sim.SetPassword(testPassword)
	st.round(t, "the watch")
	heldSleeps(t, e, clk, st, 2)
	if n := stops(e); n != 3 {
		t.Fatalf("after the BMC rejected the password that had resumed the watch, the stop was logged %d times at WARN, want 3:\n%s", n, e.logs)
	}

	// The BMC is put right (its password set back to the file's) and the timed retry comes at a sleep,
	// which works: the node is off. Woken again, its watch is rejected once more with the same
	// password as before the sleep: the sleep that worked ended the condition, so this is said again.
	e.sim.SetPassword(rotated)
	clk.advance(retryRejected)
	if err := e.sleep(t); err != nil {
		t.Fatalf("Sleep at the timed retry, the BMC put right: %v", err)
	}
	e.mustWake(t)
	st.waiting(t, "the watch of the node woken again")
	e.sim.SetPassword(testPassword)
	st.round(t, "the watch")
	if n := stops(e); n != 4 {
		t.Fatalf("a rejection after a sleep that worked logged the stop %d times in all at WARN, want 4:\n%s", n, e.logs)
	}
}
