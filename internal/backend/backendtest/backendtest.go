// Package backendtest is the conformance suite every backend passes against the real thing (real
// child processes, a real systemd manager, a real QEMU, a Redfish service speaking the protocol).
//
// A backend's test calls Run with a function that builds a fresh Subject per case:
//
//	backendtest.Run(t, func(t *testing.T) backendtest.Subject { ... })
//
// The suite checks the Backend contract documented in internal/tenant: wake serves, wake is
// idempotent, sleep stops serving, sleep is idempotent, a tenant killed behind the backend's back ends
// its Life and the next wake brings it back, a canceled wake leaves nothing running, and (for subjects
// that can stage them, see Subject.FailWake and Subject.HoldWake) a failed wake leaves nothing running,
// even when its effect lands after the failure.
package backendtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/activator/activator/internal/health"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// Subject is one backend under test, with what the suite needs to check it from outside.
type Subject struct {
	Backend  tenant.Backend
	Upstream registry.Upstream
	// Path is fetched after a wake and must answer 200 (default "/").
	Path string
	// Body, when set, must be contained in the response to Path.
	Body string
	// Kill stops the tenant behind the backend's back (kill -9 the child, systemctl stop, kill QEMU, power
	// the node off at the BMC). Nil skips the case.
	Kill func(t *testing.T)
	// Budget bounds each Wake and Sleep (default 2 minutes: generous, since a suite must not depend on
	// the machine's speed; it only turns a hang into a failure).
	Budget time.Duration
	// Awake, when set, reports from outside whether the tenant is running or on its way up (process
	// exists, unit active or activating, QMP status running, PowerState other than Off); the suite checks
	// it against what the backend claims.
	Awake func(t *testing.T) bool
	// FailWake, when set, makes the next wakes start the tenant but never finish (a node stuck
	// PoweringOn, a start job that hangs) until the returned restore is called. The suite gives such a
	// Wake FailBudget, expects it to fail, and then expects Awake to turn false within Budget: a failed
	// Wake must leave nothing running. Needs Awake; nil skips the case.
	FailWake func(t *testing.T) (restore func())
	// HoldWake, when set, makes the backend's next wake action be accepted but held back (a BMC that
	// carries a Reset out long after answering it) until the returned land is called; land makes the
	// held effect take place before it returns, and wakes work normally from then on. The suite gives
	// the held Wake FailBudget and expects it to fail, calls land, and then expects Awake to turn false
	// within Budget: an effect that lands after the failure is undone. Needs Awake; nil skips the case.
	HoldWake func(t *testing.T) (land func())
	// FailBudget bounds a Wake the suite expects to fail (default 1s). It is long enough for the
	// backend to have started its effect; a machine too slow for that weakens the case, not fail it.
	FailBudget time.Duration
}

// Run runs the suite. newSubject is called once per case; it should register its own cleanups.
func Run(t *testing.T, newSubject func(t *testing.T) Subject) {
	t.Helper()
	cases := []struct {
		name string
		fn   func(t *testing.T, s Subject)
	}{
		{"WakeServes", wakeServes},
		{"WakeIsIdempotent", wakeIdempotent},
		{"SleepStopsServing", sleepStops},
		{"SleepWhenAsleep", sleepWhenAsleep},
		{"SleepWakeCycles", cycles},
		{"KilledBehindBack", killed},
		{"CanceledWake", canceledWake},
		{"FailedWakeLeavesNothing", failedWake},
		{"LateEffectUndone", lateEffect},
		{"Close", closeCase},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newSubject(t)
			if s.Path == "" {
				s.Path = "/"
			}
			if s.Budget == 0 {
				s.Budget = 2 * time.Minute
			}
			if s.FailBudget == 0 {
				s.FailBudget = time.Second
			}
			c.fn(t, s)
		})
	}
}

// Wake wakes s and waits for its upstream to pass a health gate, failing t otherwise.
func Wake(t *testing.T, s Subject) *tenant.Life {
	t.Helper()
	return WakeTracked(t, s, tenant.Discard)
}

// WakeTracked is Wake reporting to tr.
func WakeTracked(t *testing.T, s Subject, tr tenant.Tracker) *tenant.Life {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), s.Budget)
	defer cancel()
	life, err := s.Backend.Wake(ctx, tr)
	if err != nil {
		t.Fatalf("Wake: %v", err)
	}
	if life == nil {
		t.Fatal("Wake returned a nil Life")
	}
	p := health.New(s.Upstream, registry.Health{Path: s.Path, MinStatus: 200, MaxStatus: 299,
		Interval: 100 * time.Millisecond, Timeout: 2 * time.Second, Passes: 1})
	if err := p.Wait(ctx, life.Done()); err != nil {
		if errors.Is(err, health.ErrGone) {
			err = fmt.Errorf("%w: %v", err, life.Err())
		}
		t.Fatalf("after Wake, upstream %s never turned healthy: %v", s.Upstream, err)
	}
	return life
}

// Sleep puts s to sleep, failing t on error.
func Sleep(t *testing.T, s Subject) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), s.Budget)
	defer cancel()
	if err := s.Backend.Sleep(ctx); err != nil {
		t.Fatalf("Sleep: %v", err)
	}
}

// Get fetches s.Path from the upstream and checks status 200 and s.Body.
func Get(t *testing.T, s Subject) {
	t.Helper()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return s.Upstream.Dial(ctx) }}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	resp, err := c.Get("http://upstream" + s.Path)
	if err != nil {
		t.Fatalf("GET %s via %s: %v", s.Path, s.Upstream, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: status %d, want 200 (body %q)", s.Path, resp.StatusCode, b)
	}
	if s.Body != "" && !strings.Contains(string(b), s.Body) {
		t.Fatalf("GET %s: body %q does not contain %q", s.Path, b, s.Body)
	}
}

// NotServing checks that the upstream does not answer a health probe within a short timeout (a paused
// guest may accept the connection and then hang: that counts as not serving).
func NotServing(t *testing.T, s Subject) {
	t.Helper()
	p := health.New(s.Upstream, registry.Health{Path: s.Path, MinStatus: 200, MaxStatus: 299, Timeout: 300 * time.Millisecond, Passes: 1})
	if err := p.Probe(context.Background()); err == nil {
		t.Fatalf("upstream %s still serves %s after Sleep", s.Upstream, s.Path)
	}
}

func checkAwake(t *testing.T, s Subject, want bool) {
	t.Helper()
	if s.Awake == nil {
		return
	}
	if got := s.Awake(t); got != want {
		t.Fatalf("tenant awake from outside = %v, want %v", got, want)
	}
}

func wakeServes(t *testing.T, s Subject) {
	Wake(t, s)
	Get(t, s)
	checkAwake(t, s, true)
}

func wakeIdempotent(t *testing.T, s Subject) {
	l1 := Wake(t, s)
	l2 := Wake(t, s)
	Get(t, s)
	select {
	case <-l1.Done():
		if l1 != l2 {
			t.Fatalf("second Wake on an awake tenant restarted it: first life ended with %v", l1.Err())
		}
	default:
	}
}

func sleepStops(t *testing.T, s Subject) {
	Wake(t, s)
	Sleep(t, s)
	NotServing(t, s)
	checkAwake(t, s, false)
	Wake(t, s)
	Get(t, s)
	checkAwake(t, s, true)
}

func sleepWhenAsleep(t *testing.T, s Subject) {
	Sleep(t, s)
	Wake(t, s)
	Sleep(t, s)
	Sleep(t, s)
	NotServing(t, s)
}

func cycles(t *testing.T, s Subject) {
	for i := 0; i < 3; i++ {
		Wake(t, s)
		Get(t, s)
		Sleep(t, s)
	}
}

func killed(t *testing.T, s Subject) {
	if s.Kill == nil {
		t.Skip("the subject has no way to kill its tenant behind the backend's back")
	}
	life := Wake(t, s)
	s.Kill(t)
	select {
	case <-life.Done():
		if life.Err() == nil {
			t.Fatal("Life ended with a nil Err")
		}
	case <-time.After(s.Budget):
		t.Fatalf("tenant killed behind the backend's back, but its Life did not end within %v", s.Budget)
	}
	l2 := Wake(t, s)
	if l2 == life {
		t.Fatal("Wake after the tenant died returned the dead Life")
	}
	Get(t, s)
}

func canceledWake(t *testing.T, s Subject) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Backend.Wake(ctx, tenant.Discard); err == nil {
		// Some backends finish before looking at ctx; then the tenant must be usable and sleep cleanly.
		Sleep(t, s)
	}
	// Whatever happened, the backend must still wake normally afterwards.
	Wake(t, s)
	Get(t, s)
}

// mustFailWake runs a Wake that the subject has set up to fail, bounded by FailBudget.
func mustFailWake(t *testing.T, s Subject) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), s.FailBudget)
	defer cancel()
	life, err := s.Backend.Wake(ctx, tenant.Discard)
	if err == nil {
		t.Fatalf("Wake succeeded (Life %v), want it to fail: its effect never completes", life)
	}
	t.Logf("Wake failed as staged: %v", err)
}

// eventuallyAsleep waits, within Budget, for Awake to report the tenant gone. It polls: the tenant is
// outside the backend, and only the subject can look at it.
func eventuallyAsleep(t *testing.T, s Subject, why string) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(s.Budget)
	defer deadline.Stop()
	for n := 0; s.Awake(t); n++ {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("%s: the tenant is still running %v later (%d looks)", why, s.Budget, n)
		}
	}
}

func failedWake(t *testing.T, s Subject) {
	if s.FailWake == nil || s.Awake == nil {
		t.Skip("the subject cannot make a wake fail after its start (FailWake) or look at its tenant (Awake)")
	}
	restore := s.FailWake(t)
	mustFailWake(t, s)
	eventuallyAsleep(t, s, "after a failed Wake")
	restore()
	// The undo must not get in the way of the next wake.
	Wake(t, s)
	Get(t, s)
	checkAwake(t, s, true)
}

func lateEffect(t *testing.T, s Subject) {
	if s.HoldWake == nil || s.Awake == nil {
		t.Skip("the subject cannot hold a wake's effect back (HoldWake) or look at its tenant (Awake)")
	}
	land := s.HoldWake(t)
	mustFailWake(t, s)
	land()
	eventuallyAsleep(t, s, "after the effect of a failed Wake landed late")
	Wake(t, s)
	Get(t, s)
	checkAwake(t, s, true)
}

func closeCase(t *testing.T, s Subject) {
	c, ok := s.Backend.(tenant.Closer)
	if !ok {
		t.Skip("backend has no Close")
	}
	Wake(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), s.Budget)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// WantClass fails t unless err is an error of class want (tenant.ClassOf): the backings' tests of
// their fault classes share it.
func WantClass(t testing.TB, err error, want tenant.Class) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want a %s one", want)
	}
	if got := tenant.ClassOf(err); got != want {
		t.Fatalf("ClassOf(%v) = %q, want %q", err, got, want)
	}
}
