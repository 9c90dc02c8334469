package redfish

// Credentials the BMC rejected are not tried again by the background loops (the watch of an awake node,
// the undo of a failed wake) until they change: each failed login counts towards the BMC account's
// lockout. Each test drives the backend against the simulator over real HTTP, counts the logins it
// refused (redfishtest.Server.FailedLogins), and paces the loops by events (stepper), not the clock.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/activator/activator/internal/backend/redfish/redfishtest"
	"github.com/activator/activator/internal/tenant"
)

// rotated is the password the tests set on the BMC side.
const rotated = "R0tated-BMC-pw-2"

// stepper stands in for Backend.pause in the background loops: each pause is announced on at, then
// held until the test lets the loop go on. A loop's round runs between two pauses, so the test counts
// rounds by events.
type stepper struct {
	at   chan time.Duration
	next chan struct{}
}

func newStepper() *stepper {
	return &stepper{at: make(chan time.Duration), next: make(chan struct{})}
}

func (s *stepper) pause(ctx context.Context, d time.Duration) error {
	select {
	case s.at <- d:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	select {
	case <-s.next:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// waiting returns once the loop pauses, within budget: the round before is over.
func (s *stepper) waiting(t *testing.T, who string) {
	t.Helper()
	select {
	case <-s.at:
	case <-time.After(budget):
		t.Fatalf("%s: did not pause within %v", who, budget)
	}
}

// release lets the paused loop go on, and returns at once.
func (s *stepper) release(t *testing.T, who string) {
	t.Helper()
	select {
	case s.next <- struct{}{}:
	case <-time.After(budget):
		t.Fatalf("%s: not paused within %v", who, budget)
	}
}

// round lets the paused loop do one round and returns once it pauses again.
func (s *stepper) round(t *testing.T, who string) {
	t.Helper()
	s.release(t, who)
	s.waiting(t, who)
}

// lines counts the log lines that contain all of want.
func lines(logs string, want ...string) int {
	n := 0
	for l := range strings.Lines(logs) {
		all := true
		for _, w := range want {
			all = all && strings.Contains(l, w)
		}
		if all {
			n++
		}
	}
	return n
}

// okReads counts the reads of node-1 the BMC answered.
func okReads(reqs []redfishtest.Request) int {
	n := 0
	for _, r := range reqs {
		if r.Method == "GET" && strings.HasSuffix(r.Path, "/Systems/node-1") && r.Status == 200 {
			n++
		}
	}
	return n
}

// TestWatchStopsOnRejectedCredentials: the password changes on the BMC only, while the node is awake.
// The watch's next round is refused; it then stops logging in (one failed login over many rounds,
// not one per round, which locked BMC accounts), says so once, and keeps the Life. Once the password
// file holds the BMC's password, the next round logs in and reads again, and the watch notices a
// node that powers off.
func TestWatchStopsOnRejectedCredentials(t *testing.T) {
	for _, auth := range []string{"session", "basic"} {
		t.Run(auth, func(t *testing.T) {
			e := newEnv(t, envConfig{yaml: "auth: " + auth + "\n"})
			st := newStepper()
			e.b.pause = st.pause
			life := e.mustWake(t)
			st.waiting(t, "the watch")
			st.round(t, "the watch")
			if n := e.sim.FailedLogins(); n != 0 {
				t.Fatalf("%d failed logins with the right password", n)
			}

			e.sim.SetPassword(rotated)
			const rounds = 20
			for range rounds {
				st.round(t, "the watch")
			}
			if n := e.sim.FailedLogins(); n != 1 {
				t.Fatalf("%d failed logins in %d watch rounds after the BMC's password changed, want 1", n, rounds)
			}
			if err := life.Err(); err != nil {
				t.Fatalf("the rejected credentials ended the Life: %v", err)
			}
			// The route's status says so too (tenant.Warner), naming what makes the watch go on.
			if w := e.b.Warning(); !strings.Contains(w, "rejected the credentials") || !strings.Contains(w, e.s.PasswordFile) {
				t.Errorf("Warning() = %q while the watch is held back, want the rejection and the password file", w)
			}
			logs := e.logs.String()
			if n := lines(logs, "level=WARN", "stops logging in", e.sim.URL, testUser, e.s.PasswordFile); n != 1 {
				t.Fatalf("the stop was logged %d times at WARN (with the BMC, the user and the password file), want once:\n%s", n, logs)
			}
			if strings.Contains(logs, rotated) || strings.Contains(logs, testPassword) {
				t.Fatal("the logs hold a password")
			}

			// Another wrong password in the file costs one failed login more, and is said once more.
			e.rotatePasswordFile(t, "also-wrong-pw-3")
			for range 5 {
				st.round(t, "the watch")
			}
			if n := e.sim.FailedLogins(); n != 2 {
				t.Fatalf("%d failed logins after a second wrong password, want 2", n)
			}
			if n := lines(e.logs.String(), "level=WARN", "stops logging in"); n != 2 {
				t.Fatalf("the stop was logged %d times at WARN, want twice (once per rejected password)", n)
			}

			e.rotatePasswordFile(t, rotated)
			reads := okReads(e.sim.Requests())
			st.round(t, "the watch")
			if got := okReads(e.sim.Requests()); got != reads+1 {
				t.Fatalf("the round after the password file changed made %d reads, want 1", got-reads)
			}
			if n := e.sim.FailedLogins(); n != 2 {
				t.Fatalf("%d failed logins after the password file was fixed, want still 2", n)
			}
			if !strings.Contains(e.logs.String(), "watch resumes") {
				t.Errorf("the resumption was not logged:\n%s", e.logs)
			}
			if w := e.b.Warning(); w != "" {
				t.Errorf("Warning() = %q once the watch resumed, want none", w)
			}

			if err := e.sim.SetPowerState("node-1", redfishtest.Off); err != nil {
				t.Fatal(err)
			}
			st.release(t, "the watch")
			select {
			case <-life.Done():
			case <-time.After(budget):
				t.Fatalf("the watch did not notice the node powered off within %v", budget)
			}
			if !errors.Is(life.Err(), ErrPoweredOff) {
				t.Fatalf("Life = %v, want ErrPoweredOff", life.Err())
			}
		})
	}
}

// TestRefusedSleepLeavesWatchQuiet: a sleep refused for its credentials (a fleet member's, say, while
// the fleet counts as asleep) leaves the node awake and watched; the watch does not log in with the
// credentials the sleep saw rejected.
func TestRefusedSleepLeavesWatchQuiet(t *testing.T) {
	e := newEnv(t, envConfig{})
	st := newStepper()
	e.b.pause = st.pause
	life := e.mustWake(t)
	st.waiting(t, "the watch")
	e.sim.SetPassword(rotated)
	err := e.sleep(t)
	if !errors.Is(err, ErrCredentials) || Phase(err) != PhaseShutdown {
		t.Fatalf("Sleep = %v, want ErrCredentials in phase shutdown", err)
	}
	if life.Err() != nil {
		t.Fatalf("the refused sleep ended the Life: %v", life.Err())
	}
	st.waiting(t, "the watch restarted by the failed sleep")
	for range 10 {
		st.round(t, "the watch")
	}
	if n := e.sim.FailedLogins(); n != 1 {
		t.Fatalf("%d failed logins, want 1 (the sleep's): the watch logged in with rejected credentials", n)
	}
	if got := e.sim.PowerState("node-1"); got != redfishtest.On {
		t.Fatalf("PowerState = %s, want On", got)
	}
}

// TestUndoWaitsForNewCredentials: the BMC's password changes while a wake waits for the node to come
// on, so the wake fails for its credentials after its Reset. The undo then waits, without logging
// in, until the password file changes, and powers the node off.
func TestUndoWaitsForNewCredentials(t *testing.T) {
	e := newEnv(t, envConfig{})
	st := newStepper()
	e.b.pause = st.pause
	e.sim.SetStuckPoweringOn("node-1", true)
	done := make(chan error, 1)
	go func() {
		_, err := e.wake(t)
		done <- err
	}()
	waitFor(t, e.sim, "the Reset", func() bool { return len(e.sim.Resets("node-1")) == 1 })
	e.sim.SetPassword(rotated)
	var err error
	select {
	case err = <-done:
	case <-time.After(budget):
		t.Fatalf("the wake did not end within %v", budget)
	}
	if !errors.Is(err, ErrCredentials) || Phase(err) != PhasePowerOn {
		t.Fatalf("Wake = %v, want ErrCredentials in phase power_on", err)
	}
	st.waiting(t, "the undo")
	for range 10 {
		st.round(t, "the undo")
	}
	if n := e.sim.FailedLogins(); n != 1 {
		t.Fatalf("%d failed logins, want 1 (the wake's): the undo logged in with rejected credentials", n)
	}
	if got := e.sim.PowerState("node-1"); got != redfishtest.PoweringOn {
		t.Fatalf("PowerState = %s, want PoweringOn (nothing could be done yet)", got)
	}
	e.rotatePasswordFile(t, rotated)
	st.release(t, "the undo")
	waitFor(t, e.sim, "the node powered off by the undo", func() bool { return e.sim.PowerState("node-1") == redfishtest.Off })
	if n := e.sim.FailedLogins(); n != 1 {
		t.Fatalf("%d failed logins, want still 1", n)
	}
}

// TestRoutesOfOneBMCShareRejections: two routes of one Provider on one BMC, with the same account and
// password (two files), both awake. The BMC's password changes: the first watch to find out costs one
// failed login, and the other route's watch does not try the same credentials again. A route whose
// file gets the new password resumes at once; the other stays quiet until its own file changes.
func TestRoutesOfOneBMCShareRejections(t *testing.T) {
	p := NewProvider(Options{})
	sim := newSharedSim(t)
	a := openOn(t, p, sim, "metal-a", "node-1", 2*time.Minute)
	b := openOn(t, p, sim, "metal-b", "node-2", 2*time.Minute)
	sa, sb := newStepper(), newStepper()
	a.pause, b.pause = sa.pause, sb.pause
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	for _, be := range []*Backend{a, b} {
		if _, err := be.Wake(ctx, tenant.Discard); err != nil {
			t.Fatal(err)
		}
	}
	sa.waiting(t, "route a's watch")
	sb.waiting(t, "route b's watch")

	sim.SetPassword(rotated)
	for range 5 {
		sa.round(t, "route a's watch")
		sb.round(t, "route b's watch")
	}
	if n := sim.FailedLogins(); n != 1 {
		t.Fatalf("%d failed logins by the two routes' watches, want 1", n)
	}

	if err := os.WriteFile(b.s.PasswordFile, []byte(rotated+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	reads := len(sim.Requests())
	sb.round(t, "route b's watch")
	if got := count(sim.Requests()[reads:], "GET", "/Systems/node-2"); got != 1 {
		t.Fatalf("route b read node-2 %d times in the round after its file changed, want 1", got)
	}
	reads = len(sim.Requests())
	for range 3 {
		sa.round(t, "route a's watch")
	}
	if got := sim.Requests()[reads:]; len(got) != 0 {
		t.Fatalf("route a, whose file still holds the rejected password, sent %+v", got)
	}
	if err := os.WriteFile(a.s.PasswordFile, []byte(rotated+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sa.round(t, "route a's watch")
	if got := count(sim.Requests()[reads:], "GET", "/Systems/node-1"); got != 1 {
		t.Fatalf("route a read node-1 %d times in the round after its file changed, want 1", got)
	}
	if n := sim.FailedLogins(); n != 1 {
		t.Fatalf("%d failed logins, want still 1", n)
	}
}

// TestRejectionsForgetTheOldest: a BMC's rejections remember at most maxRejections credentials, the
// most recent; a success forgets one; a fingerprint depends on the user and the password.
func TestRejectionsForgetTheOldest(t *testing.T) {
	r := newRejections(nil, false)
	if r.fingerprint("a", "bc") == r.fingerprint("ab", "c") {
		t.Fatal("fingerprints do not tell user and password apart")
	}
	if a, b := r.fingerprint("u", "p"), r.fingerprint("u", "p"); a != b {
		t.Fatal("two fingerprints of the same credentials differ")
	}
	if newRejections(nil, false).fingerprint("u", "p") == r.fingerprint("u", "p") {
		t.Fatal("two BMCs' fingerprints of one password are equal: the key is not per BMC")
	}
	ids := make([]credsID, maxRejections+1)
	for i := range ids {
		ids[i] = r.fingerprint("user", fmt.Sprintf("pw-%d", i))
		r.reject(ids[i])
	}
	if _, ok := r.rejected(ids[0]); ok {
		t.Error("the oldest rejection is still remembered past maxRejections")
	}
	for _, id := range ids[1:] {
		if _, ok := r.rejected(id); !ok {
			t.Fatal("a recent rejection was forgotten")
		}
	}
	r.accept(ids[1])
	if _, ok := r.rejected(ids[1]); ok {
		t.Error("credentials that worked are still remembered as rejected")
	}
}
