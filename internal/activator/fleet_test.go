package activator

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/activator/activator/internal/fleet"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
	"github.com/activator/activator/internal/testenv"
)

// countingBackend is a fakeBackend that counts the wakes in progress across a fleet and blocks each
// until open is closed, so a test can count overlapping starts.
type countingBackend struct {
	*fakeBackend
	active, most *atomic.Int32
	open         <-chan struct{}
}

func (b countingBackend) Wake(ctx context.Context, t tenant.Tracker) (*tenant.Life, error) {
	n := b.active.Add(1)
	defer b.active.Add(-1)
	for m := b.most.Load(); n > m && !b.most.CompareAndSwap(m, n); m = b.most.Load() {
	}
	select {
	case <-b.open:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return b.fakeBackend.Wake(ctx, t)
}

// blockGate never passes: a member that never turns healthy.
type blockGate struct{}

func (blockGate) Wait(ctx context.Context, gone <-chan struct{}) error {
	<-ctx.Done()
	return ctx.Err()
}

func fleetRoute(min int, serial bool, names ...string) *registry.Route {
	r := testRoute("pool")
	r.Health.Budget = 10 * time.Second
	r.Fleet = &registry.Fleet{MinReady: min, Serial: serial}
	for i, n := range names {
		r.Fleet.Members = append(r.Fleet.Members, registry.Member{Name: n,
			Upstream: registry.Upstream{Network: "tcp", Address: "127.0.0.1:" + string(rune('1'+i))}})
	}
	return r
}

// TestFleetRollup: five members, one that never turns healthy (c) and one misconfigured (e). The
// rollup is up, up, timeout, up, error in both modes; with min_ready 3 the wake succeeds, with 4 it
// fails, and the members that came up then read stopped (settle); the parallel wake has all five
// starting at once, the serial one never two.
func TestFleetRollup(t *testing.T) {
	for _, tc := range []struct {
		serial bool
		min    int
	}{{false, 3}, {true, 3}, {false, 4}, {true, 4}} {
		synctest.Test(t, func(t *testing.T) {
			var active, most atomic.Int32
			open := make(chan struct{})
			p := byName{}
			for _, n := range []string{"a", "b", "c", "d", "e"} {
				fb := &fakeBackend{}
				if n == "e" {
					fb.wakeErr = exec.ErrNotFound
				}
				p["pool."+n] = countingBackend{fb, &active, &most, open}
			}
			s := New(Options{Opener: p, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				NewGate: func(r *registry.Route) Gate {
					if r.Name == "pool.c" {
						return blockGate{}
					}
					return passGate{}
				}})
			if err := s.Apply(&registry.Config{Routes: []*registry.Route{fleetRoute(tc.min, tc.serial, "a", "b", "c", "d", "e")}}); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = s.Shutdown(context.Background()) }()
			errc := make(chan error, 1)
			go func() { errc <- s.Wake(t.Context(), "pool") }()
			synctest.Wait()
			if n, want := active.Load(), map[bool]int32{false: 5, true: 1}[tc.serial]; n != want {
				t.Fatalf("serial=%v: %d starts overlap, want %d", tc.serial, n, want)
			}
			close(open)
			err := <-errc
			if (err == nil) != (tc.min == 3) {
				t.Fatalf("serial=%v min_ready=%d: err %v", tc.serial, tc.min, err)
			}
			time.Sleep(11 * time.Second) // c's health budget, on synctest's clock: every member settles
			synctest.Wait()
			rec := s.instance("pool").status().LastWake
			var got []string
			for _, m := range rec.Members {
				got = append(got, m.Status)
			}
			want := []string{"up", "up", "timeout", "up", "error"}
			if tc.min == 4 {
				want = []string{memberStopped, memberStopped, "timeout", memberStopped, "error"}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("serial=%v min_ready=%d: rollup %v, want %v", tc.serial, tc.min, got, want)
			}
			if rec.Members[2].Phase != "health" || rec.Members[4].Class != "terminal" || rec.Members[2].Class != "retryable" {
				t.Fatalf("rows %+v", rec.Members)
			}
			if tc.min == 4 && (rec.Outcome != OutcomeFailed || rec.Culprit == nil || rec.Culprit.Member == "") {
				t.Fatalf("failed record %+v", rec)
			}
			if tc.min == 3 && rec.Outcome != OutcomeSucceeded {
				t.Fatalf("outcome %q", rec.Outcome)
			}
		})
	}
}

// TestFleetFastFail: all three members needed, and b is misconfigured. The wake fails at once, naming
// b, its phase and class; a and c, still starting, are cancelled because of b, each with the phase
// it had reached. No member is left running, and none is sent a stop: a and c were cancelled in their
// Wake, which leaves nothing running when it fails, and b never started
// (TestFleetFailedWakeStopsOnlyWhatItStarted has one that came up).
func TestFleetFastFail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var active, most atomic.Int32
		open := make(chan struct{}) // never opened: a and c start and wait
		members := map[string]*fakeBackend{"a": {}, "b": {wakeErr: exec.ErrNotFound}, "c": {}}
		p := byName{}
		for n, fb := range members {
			if n == "b" {
				p["pool."+n] = fb
				continue
			}
			p["pool."+n] = countingBackend{fb, &active, &most, open}
		}
		s := newChainServer(t, p, &registry.Config{Routes: []*registry.Route{fleetRoute(0, false, "a", "b", "c")}})
		err := s.Wake(t.Context(), "pool")
		var qe *fleet.QuorumError
		if !asErr(err, &qe) || qe.Culprit.Name != "b" {
			t.Fatalf("err %v", err)
		}
		synctest.Wait()
		rec := s.instance("pool").status().LastWake
		if c := rec.Culprit; c == nil || c.Member != "b" || c.Phase != "spawn" || c.Class != "terminal" {
			t.Fatalf("culprit %+v", rec.Culprit)
		}
		for _, i := range []int{0, 2} {
			if m := rec.Members[i]; m.Status != "cancelled" || m.CancelledBy != "b" || m.Phase != "start" {
				t.Fatalf("survivor %+v", m)
			}
		}
		for n, fb := range members {
			if k := fb.sleeps.Load(); k != 0 {
				t.Errorf("member %s, which the failed wake never started, was sent %d stops", n, k)
			}
		}
	})
}

// TestFleetFailedWakeStopsOnlyWhatItStarted: all three members are needed. a comes up; b's wake fails
// before it starts anything (the BMC rejects the credentials); c, still starting, is cancelled by
// that, and its backing undoes what it began (a failed Wake leaves nothing running). Only a is
// stopped: b and c, which this wake never started and which were not running, are sent no stop (a
// power-off, on bare metal), and a's row says it was stopped. Found by an operator trial: every
// member was stopped, and b's stop was one more rejected login, logged as a failure of the fleet's stop.
func TestFleetFailedWakeStopsOnlyWhatItStarted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testenv.SyncBuffer
		rejected := tenant.Terminal(errors.New("redfish: 401 Unauthorized: credentials rejected"))
		a := &fakeBackend{}
		b := &fakeBackend{wakeGate: make(chan struct{}), wakeErr: rejected, sleepErr: rejected}
		c := &fakeBackend{wakeGate: make(chan struct{})} // never opened: cancelled in its start
		s, _ := fleetServer(t, byName{"pool.a": a, "pool.b": b, "pool.c": c}, &logs, nil, fleetRoute(3, false, "a", "b", "c"))
		errc := make(chan error, 1)
		go func() { errc <- s.Wake(t.Context(), "pool") }()
		synctest.Wait() // a is up; b and c are in their Wake
		close(b.wakeGate)
		if err := <-errc; err == nil {
			t.Fatal("the wake succeeded without b")
		}
		synctest.Wait() // the failed wake's members settled and were stopped
		if n, m, k := a.sleeps.Load(), b.sleeps.Load(), c.sleeps.Load(); n != 1 || m != 0 || k != 0 {
			t.Errorf("stops: a %d, b %d, c %d; want a stopped once, b and c (never started) not at all", n, m, k)
		}
		rows := s.instance("pool").status().LastWake.Members
		if got, want := memberStatuses(rows), []string{memberStopped, "error", "cancelled"}; !slices.Equal(got, want) {
			t.Errorf("rows %v, want %v", got, want)
		}
		if !slices.ContainsFunc(rows[0].Notes, func(n string) bool { return strings.Contains(n, "the wake failed") }) {
			t.Errorf("a's notes %q, want one saying it was stopped as the wake failed", rows[0].Notes)
		}
		if l := logLines(&logs, "stopping the fleet after a failed wake failed"); len(l) != 0 {
			t.Errorf("log lines %q: no stop failed", l)
		}
	})
}

// threeUp is a server with route pool, a fleet of three members a, b and c (min_ready 2) on fake
// backends, woken: the wake has returned at the quorum, the third member may still be joining.
func threeUp(t *testing.T) (*Server, map[string]*fakeBackend) {
	t.Helper()
	members := map[string]*fakeBackend{"a": {}, "b": {}, "c": {}}
	p := byName{}
	for n, fb := range members {
		p["pool."+n] = fb
	}
	s := newChainServer(t, p, &registry.Config{Routes: []*registry.Route{fleetRoute(2, false, "a", "b", "c")}})
	if err := s.Wake(t.Context(), "pool"); err != nil {
		t.Fatal(err)
	}
	return s, members
}

// TestFleetBelowQuorumStops: three members, min_ready 2. One member dying leaves the fleet up and out
// of the pool; a second brings it below the quorum: the survivor is stopped and the route is asleep
// (exited), ready to wake every member again.
func TestFleetBelowQuorumStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, members := threeUp(t)
		synctest.Wait() // the wake returned at the quorum: the third member joins now
		in := s.instance("pool")
		kill := func(n string) {
			fb := members[n]
			fb.mu.Lock()
			life := fb.life
			fb.life = nil
			fb.mu.Unlock()
			life.End(errors.New("killed"))
			synctest.Wait()
		}
		kill("a")
		st := in.status()
		if st.State != "awake" || st.Members[0].Ready || !st.Members[1].Ready {
			t.Fatalf("after one death: %s %+v", st.State, st.Members)
		}
		for range 10 {
			if m := in.fleet.pick(); m == nil || m.name == "a" {
				t.Fatalf("picked %v", m)
			}
		}
		kill("b")
		if st := in.status(); st.State != "asleep" || st.LastSleep != ReasonExited {
			t.Fatalf("below the quorum: %s (last sleep %q)", st.State, st.LastSleep)
		}
		if members["c"].sleeps.Load() == 0 {
			t.Fatal("the survivor was not stopped")
		}
		if err := s.Wake(t.Context(), "pool"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // as above: the member not needed for the quorum may still be waking
		if n := members["a"].wakes.Load(); n != 2 {
			t.Fatalf("a woken %d times, want 2", n)
		}
	})
}

// TestFleetPicksLeastInFlight: requests go to the ready member with the fewest in flight.
func TestFleetPicksLeastInFlight(t *testing.T) {
	fb := &fleetBackend{spec: &registry.Fleet{}}
	for _, n := range []string{"a", "b", "c"} {
		m := &fleetMember{name: n}
		m.ready.Store(true)
		fb.members = append(fb.members, m)
	}
	fb.members[0].inflight.Store(3)
	fb.members[1].inflight.Store(1)
	fb.members[2].inflight.Store(2)
	if m := fb.pick(); m.name != "b" {
		t.Fatalf("picked %s", m.name)
	}
	fb.members[1].ready.Store(false)
	if m := fb.pick(); m.name != "c" {
		t.Fatalf("picked %s with b not ready", m.name)
	}
}

// TestFleetSleepSkipsMembersThatNeverCameUp: a member that never came up (misconfigured: its wake
// fails at once) is not asked to sleep with the fleet. Its sleep failed too (no such system), which
// failed every fleet sleep, and each failure's take-back powered the members that had gone down up
// again, every idle window (found with the real binary and cmd/redfish-sim).
func TestFleetSleepSkipsMembersThatNeverCameUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := &fakeBackend{}, &fakeBackend{}
		x := &fakeBackend{wakeErr: exec.ErrNotFound, sleepErr: errors.New("no system node-x")}
		s := New(Options{Opener: byName{"pool.a": a, "pool.x": x, "pool.b": b}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			NewGate: func(*registry.Route) Gate { return passGate{} }})
		if err := s.Apply(&registry.Config{Routes: []*registry.Route{fleetRoute(2, false, "a", "x", "b")}}); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = s.Shutdown(context.Background()) }()
		if err := s.Wake(t.Context(), "pool"); err != nil {
			t.Fatalf("wake with a quorum of 2: %v", err)
		}
		synctest.Wait()
		xSleeps := x.sleeps.Load() // stopping the failed member, as its wake failed
		if err := s.Sleep(t.Context(), "pool"); err != nil {
			t.Fatalf("the fleet's sleep: %v", err)
		}
		synctest.Wait()
		if n := x.sleeps.Load(); n != xSleeps {
			t.Errorf("the member that never came up was asked to sleep %d more times", n-xSleeps)
		}
		if st := s.instance("pool").status(); st.State != Asleep.String() || st.LastSleepError != "" {
			t.Errorf("after the sleep: %s, %q; want asleep without a failure", st.State, st.LastSleepError)
		}
		if n := a.wakes.Load() + b.wakes.Load(); n != 2 {
			t.Errorf("%d member wakes, want 2: no take-back woke the fleet again", n)
		}
	})
}

// killMember ends the life of fleet member fb's tenant as if it had died on its own, and waits for
// the activator to have handled it.
func killMember(fb *fakeBackend, why string) {
	fb.mu.Lock()
	life := fb.life
	fb.life = nil
	fb.mu.Unlock()
	life.End(errors.New(why))
	synctest.Wait()
}

// memberStatuses is the status column of rows.
func memberStatuses(rows []MemberRecord) []string {
	var out []string
	for _, m := range rows {
		out = append(out, m.Status)
	}
	return out
}

// TestFleetRowsSayWhatMembersAreNow: the wake record's member rows follow the members after the wake.
// A member that dies while the fleet stays up reads "exited" with its cause; when a second death takes
// the fleet below min_ready, it reads "exited" too and the survivor, stopped by the activator, reads
// "stopped", in the route's last wake and in its history alike. The outcome stays succeeded. Found by
// an operator trial: after the quorum was lost every row still said "up".
func TestFleetRowsSayWhatMembersAreNow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, members := threeUp(t)
		synctest.Wait() // the third member joins
		in := s.instance("pool")
		id := in.status().LastWake.ID

		killMember(members["a"], "killed by the OOM killer")
		rows := in.status().LastWake.Members
		if got, want := memberStatuses(rows), []string{"exited", "up", "up"}; !slices.Equal(got, want) {
			t.Fatalf("after a's death, still up on b and c: rows %v, want %v", got, want)
		}
		if !strings.Contains(rows[0].Error, "killed by the OOM killer") {
			t.Errorf("a's row: error %q, want its cause", rows[0].Error)
		}

		killMember(members["b"], "powered off")
		st := in.status()
		if st.State != Asleep.String() {
			t.Fatalf("below the quorum: %s", st.State)
		}
		if got, want := memberStatuses(st.LastWake.Members), []string{"exited", "exited", "stopped"}; !slices.Equal(got, want) {
			t.Errorf("after the quorum was lost: last wake's rows %v, want %v", got, want)
		}
		if st.LastWake.Outcome != OutcomeSucceeded {
			t.Errorf("outcome %q: a wake's outcome never changes", st.LastWake.Outcome)
		}
		var hist *WakeRecord
		for _, ev := range in.hist.last(0) {
			if ev.Wake != nil && ev.Wake.ID == id {
				hist = ev.Wake
			}
		}
		if hist == nil {
			t.Fatal("the wake is not in the history")
		}
		if got, want := memberStatuses(hist.Members), []string{"exited", "exited", "stopped"}; !slices.Equal(got, want) {
			t.Errorf("in the history: rows %v, want %v", got, want)
		}
	})
}

// TestFleetNestedRowsFollowTheFleet: route app requires fleet pool. When pool loses its quorum, the
// summary of pool's wake nested in app's wake record reads as pool's own record does: the dead
// members "exited", the survivor "stopped". Found by an operator trial: the nested rows still said
// "up" while pool was down.
func TestFleetNestedRowsFollowTheFleet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		members := map[string]*fakeBackend{"a": {}, "b": {}, "c": {}}
		p := byName{"app": &fakeBackend{}}
		for n, fb := range members {
			p["pool."+n] = fb
		}
		pool := fleetRoute(2, false, "a", "b", "c")
		pool.Hosts, pool.Instance = nil, true
		app := testRoute("app")
		app.Requires = []string{"pool"}
		s := newChainServer(t, p, &registry.Config{Routes: []*registry.Route{app}, Instances: []*registry.Route{pool}})
		if err := s.Wake(t.Context(), "app"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // pool's third member joins
		nested := func() *WakeRecord {
			t.Helper()
			rec := s.instance("app").status().LastWake
			if rec == nil || len(rec.Requires) != 1 || rec.Requires[0].Wake == nil {
				t.Fatalf("app's record %+v: want pool's wake nested", rec)
			}
			return rec.Requires[0].Wake
		}
		if got, want := memberStatuses(nested().Members), []string{"up", "up", "up"}; !slices.Equal(got, want) {
			t.Fatalf("nested rows once every member settled: %v, want %v", got, want)
		}
		killMember(members["a"], "killed")
		killMember(members["b"], "killed")
		if st := s.instance("pool").status(); st.State != Asleep.String() {
			t.Fatalf("pool below its quorum: %s", st.State)
		}
		if got, want := memberStatuses(nested().Members), []string{"exited", "exited", "stopped"}; !slices.Equal(got, want) {
			t.Errorf("nested rows after pool lost its quorum: %v, want %v", got, want)
		}
		var nestedHist *WakeRecord
		for _, ev := range s.instance("app").hist.last(0) {
			if ev.Wake != nil && len(ev.Wake.Requires) == 1 {
				nestedHist = ev.Wake.Requires[0].Wake
			}
		}
		if nestedHist == nil {
			t.Fatal("app's wake is not in its history")
		}
		if got, want := memberStatuses(nestedHist.Members), []string{"exited", "exited", "stopped"}; !slices.Equal(got, want) {
			t.Errorf("nested rows in app's history: %v, want %v", got, want)
		}
	})
}

// TestFleetSleepOneMemberRefuses: c came up, and its sleep fails (a BMC that refuses the power-off).
// The sleep fails naming c and its error, and a and b, which went down, are not woken again to undo
// it. With min_ready 3, c alone cannot be the fleet: it is asleep, c noted as possibly running. With
// min_ready 1, c alone is a quorum: the fleet is taken back on c, through c's Wake and gate, and a and
// b stay down. Found by an operator trial: each failed sleep's take-back woke every member again.
func TestFleetSleepOneMemberRefuses(t *testing.T) {
	for _, tc := range []struct {
		min       int
		wantState string
		wantReady []bool
	}{
		{min: 3, wantState: Asleep.String(), wantReady: []bool{false, false, false}},
		{min: 1, wantState: Awake.String(), wantReady: []bool{false, false, true}},
	} {
		t.Run("min_ready="+strconv.Itoa(tc.min), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a, b := &fakeBackend{}, &fakeBackend{}
				c := &fakeBackend{sleepErr: errors.New("the BMC refused GracefulShutdown")}
				s := newChainServer(t, byName{"pool.a": a, "pool.b": b, "pool.c": c},
					&registry.Config{Routes: []*registry.Route{fleetRoute(tc.min, false, "a", "b", "c")}})
				if err := s.Wake(t.Context(), "pool"); err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				err := s.Sleep(t.Context(), "pool")
				if err == nil || !strings.Contains(err.Error(), `member "c"`) || !strings.Contains(err.Error(), "the BMC refused GracefulShutdown") {
					t.Fatalf("min_ready %d: the sleep's error %v, want it to name c and its error", tc.min, err)
				}
				synctest.Wait()
				if n, m := a.wakes.Load(), b.wakes.Load(); n != 1 || m != 1 {
					t.Errorf("min_ready %d: a woken %d times, b %d; want once each: what went down stays down", tc.min, n, m)
				}
				st := s.instance("pool").status()
				if st.State != tc.wantState {
					t.Errorf("min_ready %d: state %s, want %s", tc.min, st.State, tc.wantState)
				}
				if !strings.Contains(st.LastSleepError, `member "c"`) {
					t.Errorf("min_ready %d: last sleep error %q, want it to name c", tc.min, st.LastSleepError)
				}
				var ready []bool
				for _, m := range st.Members {
					ready = append(ready, m.Ready)
				}
				if !slices.Equal(ready, tc.wantReady) {
					t.Errorf("min_ready %d: members ready %v, want %v", tc.min, ready, tc.wantReady)
				}
				var slept *SleepRecord
				for _, ev := range s.instance("pool").hist.last(0) {
					if ev.Sleep != nil {
						slept = ev.Sleep
					}
				}
				if slept == nil || slept.Result != ResultFailed || !strings.Contains(slept.Error, `member "c"`) {
					t.Errorf("min_ready %d: the sleep's record %+v, want failed, naming c", tc.min, slept)
				}
				if tc.min == 1 {
					rec := st.LastWake
					if got, want := memberStatuses(rec.Members), []string{"asleep", "asleep", "up"}; rec.Trigger != string(triggerSleepFailed) || !slices.Equal(got, want) {
						t.Errorf("the take-back: trigger %s, rows %v; want sleep_failed, %v", rec.Trigger, got, want)
					}
				}
			})
		})
	}
}

// TestFleetMemberGoneBeforeQuorum: a member that passed its gate and then died while the others were
// still waking no longer counts toward min_ready. Here a (up) dies while b waits for its wake, and b's
// coming up completes the count of two that the fleet's run keeps: the wake fails, naming a, instead
// of bringing the fleet up on b alone, and nothing is left running. Found by session 29's fleet work:
// the quorum counted a member that was gone.
func TestFleetMemberGoneBeforeQuorum(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := &fakeBackend{}, &fakeBackend{wakeGate: make(chan struct{})}
		s := newChainServer(t, byName{"pool.a": a, "pool.b": b}, &registry.Config{Routes: []*registry.Route{fleetRoute(2, true, "a", "b")}})
		errc := make(chan error, 1)
		go func() { errc <- s.Wake(t.Context(), "pool") }()
		synctest.Wait() // a is up, b waits for its wake
		killMember(a, "killed by the OOM killer")
		close(b.wakeGate)
		err := <-errc
		if err == nil || !strings.Contains(err.Error(), `"a"`) {
			t.Fatalf("Wake = %v, want it to fail naming member a", err)
		}
		synctest.Wait()
		in := s.instance("pool")
		if st := in.status(); st.State == Awake.String() {
			t.Errorf("the fleet is up with %d of min_ready 2 members ready", in.fleet.ready())
		}
		b.mu.Lock()
		running := b.life != nil && b.life.Err() == nil
		b.mu.Unlock()
		if running {
			t.Error("b still runs after the failed wake")
		}
	})
}

// lateEndBackend is a fakeBackend whose Sleep leaves the Life it puts to sleep open, held for the test
// to End: a member's Life from before a sleep that ends only once the fleet's next wake has woken the
// member again. tenant.Backend.Sleep does not ask a backend to End the Life within Sleep; and with one
// that does, this is the order in which the scheduler may run the old Life's watcher.
type lateEndBackend struct {
	*fakeBackend
	held []*tenant.Life // guarded by fakeBackend.mu
}

func (b *lateEndBackend) Sleep(context.Context) error {
	b.sleeps.Add(1)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.life != nil {
		b.held, b.life = append(b.held, b.life), nil
	}
	return nil
}

// endHeld Ends the Lives that b's sleeps held open.
func (b *lateEndBackend) endHeld() {
	b.mu.Lock()
	held := b.held
	b.held = nil
	b.mu.Unlock()
	for _, l := range held {
		l.End(tenant.ErrSlept)
	}
}

// TestFleetStaleWatcherLeavesTheNextWakeAlone: the members' Lives of a wake the fleet has been put to
// sleep since end only once its next wake has woken them again. Their watchers are the earlier wake's:
// they must change nothing of the later one. They marked the members they watched not ready, so that a
// wake after a sleep failed with "exited after it had passed its health gate, before the quorum was up"
// (during), or the fleet stayed awake with no member to serve its requests (after). Found as an
// occasional failure of TestReloadHandedFleetUsesTheNewHealth: its Sleep ended the Lives, but the
// watchers ran after the next wake's members had come up.
func TestFleetStaleWatcherLeavesTheNextWakeAlone(t *testing.T) {
	for _, c := range []struct {
		name   string
		during bool // the old Lives end after a is up again and before the quorum is; else after the wake
	}{
		{"during the next wake", true},
		{"after the next wake", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ms := map[string]*lateEndBackend{}
				p := byName{}
				for _, n := range []string{"a", "b", "c"} {
					ms[n] = &lateEndBackend{fakeBackend: &fakeBackend{}}
					p["pool."+n] = ms[n]
				}
				s := newChainServer(t, p, &registry.Config{Routes: []*registry.Route{fleetRoute(2, false, "a", "b", "c")}})
				if err := s.Wake(t.Context(), "pool"); err != nil {
					t.Fatal(err)
				}
				synctest.Wait() // c, which the quorum did not wait for, joins
				if err := s.Sleep(t.Context(), "pool"); err != nil {
					t.Fatal(err)
				}
				endOld := func() {
					for _, m := range ms {
						m.endHeld()
					}
					synctest.Wait() // every old watcher has run
				}
				if c.during {
					gb, gc := make(chan struct{}), make(chan struct{})
					ms["b"].set(func(f *fakeBackend) { f.wakeGate = gb })
					ms["c"].set(func(f *fakeBackend) { f.wakeGate = gc })
					errc := make(chan error, 1)
					go func() { errc <- s.Wake(t.Context(), "pool") }()
					synctest.Wait() // a is up again; b and c wait in their Wake
					endOld()
					close(gb) // b makes the quorum with a
					if err := <-errc; err != nil {
						t.Fatalf("the wake after the sleep: %v", err)
					}
					close(gc)
				} else {
					if err := s.Wake(t.Context(), "pool"); err != nil {
						t.Fatal(err)
					}
					synctest.Wait()
					endOld()
				}
				synctest.Wait()
				st := s.instance("pool").status()
				if st.State != Awake.String() {
					t.Errorf("the fleet is %s, want awake", st.State)
				}
				for _, m := range st.Members {
					if !m.Ready {
						t.Errorf("member %s is not ready: the earlier wake's watcher of its slept Life marked it", m.Name)
					}
				}
				if st.LastWake == nil {
					t.Fatal("no last wake")
				}
				if got, want := memberStatuses(st.LastWake.Members), []string{"up", "up", "up"}; !slices.Equal(got, want) {
					t.Errorf("the wake's rows %q, want %q", got, want)
				}
			})
		})
	}
}

// TestFleetDegradedIsLogged: a fleet that comes up without one of its members says so in the log,
// naming the member and why. Found by an operator trial: the log's "woke" line was all there was.
func TestFleetDegradedIsLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testenv.SyncBuffer
		p := byName{"pool.a": &fakeBackend{}, "pool.b": &fakeBackend{}, "pool.c": &fakeBackend{wakeErr: errors.New("exited with code 3")}}
		s := New(Options{Opener: p, Logger: slog.New(slog.NewJSONHandler(&logs, nil)), NewGate: func(*registry.Route) Gate { return passGate{} }})
		if err := s.Apply(&registry.Config{Routes: []*registry.Route{fleetRoute(2, false, "a", "b", "c")}}); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = s.Shutdown(context.Background()) }()
		if err := s.Wake(t.Context(), "pool"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		// c fails at once, before or after a and b make the quorum: the message says which (see
		// TestFleetMemberFailureLoggedAsItSettles).
		if l := logs.String(); !strings.Contains(l, `"msg":"fleet member did not come up`) ||
			!strings.Contains(l, `"member":"c"`) || !strings.Contains(l, "exited with code 3") {
			t.Errorf("log %s: want a line naming member c and its error", l)
		}
	})
}

// fleetServer is a server with routes on p's backends and real metrics, logging as JSON to logs. The
// members named in block never pass their health gates (blockGate); the others pass at once.
func fleetServer(t *testing.T, p byName, logs io.Writer, block []string, routes ...*registry.Route) (*Server, prometheus.Gatherer) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	s := New(Options{Opener: p, Logger: slog.New(slog.NewJSONHandler(logs, nil)), Metrics: m,
		NewGate: func(r *registry.Route) Gate {
			if slices.Contains(block, r.Name) {
				return blockGate{}
			}
			return passGate{}
		}})
	if err := s.Apply(&registry.Config{Routes: routes}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s, m.Gatherer(reg)
}

// logLines returns the lines of logs with message msg (a prefix).
func logLines(logs *testenv.SyncBuffer, msg string) []string {
	var out []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `"msg":"`+msg) {
			out = append(out, l)
		}
	}
	return out
}

// TestFleetHostCheckStaysForMembersThatFail: the host check at start-up found a's BMC unreachable and
// c's credentials rejected. The fleet comes up on a and b (min_ready 2) while c fails again: a's
// finding goes, c's stays in the status, and no log line says c's no longer holds. Once c comes up
// too, its finding goes. Found by an operator trial: the quorum cleared the whole finding, and the log
// said c's no longer held, while c failed with the same 401 in the same wake.
func TestFleetHostCheckStaysForMembersThatFail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testenv.SyncBuffer
		c := &fakeBackend{wakeErr: tenant.Terminal(errors.New("redfish: 401 Unauthorized: credentials rejected"))}
		s, _ := fleetServer(t, byName{"pool.a": &fakeBackend{}, "pool.b": &fakeBackend{}, "pool.c": c}, &logs, nil, fleetRoute(2, false, "a", "b", "c"))
		s.SetCheckError("pool", errors.Join(
			&MemberCheckError{Member: "a", Err: errors.New(`route "pool.a": redfish: the BMC is unreachable`)},
			&MemberCheckError{Member: "c", Err: errors.New(`route "pool.c": redfish: credentials rejected`)}))
		if err := s.Wake(t.Context(), "pool"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // c has failed
		st := s.instance("pool").status()
		if want := `route "pool.c": redfish: credentials rejected`; st.CheckError != want {
			t.Errorf("check_error %q with a and b up and c failed, want %q", st.CheckError, want)
		}
		for _, l := range logLines(&logs, "") {
			if strings.Contains(l, "no longer holds") && strings.Contains(l, "pool.c") {
				t.Errorf("log line %s: c's finding still holds", l)
			}
		}
		if l := logLines(&logs, "fleet member came up: the host check's finding no longer holds for it"); len(l) != 1 || !strings.Contains(l[0], "pool.a") {
			t.Errorf("log lines %q, want one saying a's finding no longer holds", l)
		}

		c.set(func(f *fakeBackend) { f.wakeErr = nil }) // the password corrected
		if err := s.Sleep(t.Context(), "pool"); err != nil {
			t.Fatal(err)
		}
		if err := s.Wake(t.Context(), "pool"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if st := s.instance("pool").status(); st.CheckError != "" {
			t.Errorf("check_error %q once c came up, want none", st.CheckError)
		}
	})
}

// TestFleetMemberFailureLoggedAsItSettles: c fails once the fleet is up on a (min_ready 1), while d
// still waits for its health gate. c's failure is logged then, saying that the fleet runs without it,
// not once d has settled. Found by an operator trial: the line came 14 s late, when the slowest member
// had settled.
func TestFleetMemberFailureLoggedAsItSettles(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testenv.SyncBuffer
		c := &fakeBackend{wakeGate: make(chan struct{}), wakeErr: tenant.Terminal(errors.New("credentials rejected"))}
		s, _ := fleetServer(t, byName{"pool.a": &fakeBackend{}, "pool.c": c, "pool.d": &fakeBackend{}}, &logs, []string{"pool.d"},
			fleetRoute(1, false, "a", "c", "d"))
		if err := s.Wake(t.Context(), "pool"); err != nil {
			t.Fatal(err)
		}
		close(c.wakeGate)
		synctest.Wait() // c has failed; d waits for its gate
		if got := memberStatuses(s.instance("pool").status().LastWake.Members); !slices.Equal(got, []string{"up", "error", "waking"}) {
			t.Fatalf("rows %v, want up, error, waking", got)
		}
		l := logLines(&logs, "fleet member did not come up")
		if len(l) != 1 || !strings.Contains(l[0], `"msg":"fleet member did not come up: the fleet runs without it"`) ||
			!strings.Contains(l[0], `"member":"c"`) || !strings.Contains(l[0], "credentials rejected") {
			t.Errorf("log lines %q while d still waits, want one for c, which the fleet runs without", l)
		}
	})
}

// TestFleetQuorumLostLogsTheTruth: c fails while the fleet is up on a and b (min_ready 2) and d still
// waits for its gate; then a dies and the fleet falls below min_ready. Nothing logged from then on
// says the fleet runs without a member. Found by an operator trial: the line for c came only once d
// had settled, cancelled as the fleet was being stopped, and said the fleet ran without c.
func TestFleetQuorumLostLogsTheTruth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testenv.SyncBuffer
		a := &fakeBackend{}
		c := &fakeBackend{wakeGate: make(chan struct{}), wakeErr: errors.New("exited with code 3")}
		s, _ := fleetServer(t, byName{"pool.a": a, "pool.b": &fakeBackend{}, "pool.c": c, "pool.d": &fakeBackend{}}, &logs, []string{"pool.d"},
			fleetRoute(2, false, "a", "b", "c", "d"))
		if err := s.Wake(t.Context(), "pool"); err != nil {
			t.Fatal(err)
		}
		close(c.wakeGate)
		synctest.Wait()
		before := len(logs.String())
		killMember(a, "powered off through its BMC")
		if st := s.instance("pool").status(); st.State != Asleep.String() {
			t.Fatalf("below min_ready: %s", st.State)
		}
		if after := logs.String()[before:]; strings.Contains(after, "the fleet runs without it") {
			t.Errorf("logged as the fleet was stopped below min_ready:\n%s", after)
		}
		if l := logLines(&logs, "fleet member did not come up"); len(l) != 1 || !strings.Contains(l[0], `"member":"c"`) {
			t.Errorf("log lines %q, want one for c", l)
		}
	})
}

// TestFleetBelowQuorumAsksOnlyMembersThatCameUp: a, b and e came up, c never did (min_ready 3). When a
// dies, the fleet falls below min_ready and the others are stopped, but not c: it was left with
// nothing running, and asking again a BMC that rejects its credentials logs one more rejected login.
// e refuses its stop: the sleep's error says so on one line. Found by an operator trial: c was asked
// again, and its failure was joined to the error on a line of its own.
func TestFleetBelowQuorumAsksOnlyMembersThatCameUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := &fakeBackend{}
		c := &fakeBackend{wakeErr: tenant.Terminal(errors.New("credentials rejected")), sleepErr: errors.New("credentials rejected, again")}
		e := &fakeBackend{sleepErr: errors.New("the BMC refused ForceOff")}
		s := newChainServer(t, byName{"pool.a": a, "pool.b": &fakeBackend{}, "pool.c": c, "pool.e": e},
			&registry.Config{Routes: []*registry.Route{fleetRoute(3, false, "a", "b", "c", "e")}})
		if err := s.Wake(t.Context(), "pool"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		killMember(a, "PowerState Off")
		in := s.instance("pool")
		if st := in.status(); st.State != Asleep.String() {
			t.Fatalf("below min_ready: %s", st.State)
		}
		if n := c.sleeps.Load(); n != 0 {
			t.Errorf("c, which never came up, was asked to stop %d times", n)
		}
		var slept *SleepRecord
		for _, ev := range in.hist.last(0) {
			if ev.Sleep != nil {
				slept = ev.Sleep
			}
		}
		if slept == nil || slept.Reason != ReasonExited {
			t.Fatalf("the last sleep %+v, want one with reason exited", slept)
		}
		if strings.Contains(slept.Error, "\n") || !strings.Contains(slept.Error, `member "a" stopped: PowerState Off; member "e": the BMC refused ForceOff`) ||
			strings.Contains(slept.Error, `member "c"`) {
			t.Errorf("the sleep's error %q, want one line naming a and e, not c", slept.Error)
		}
	})
}

// TestFleetQuorumLostOnATerminalMember: min_ready 4 of 5, serial. c fails terminally, then d's health
// gate times out and the quorum is lost. The wake is terminal and its culprit c: it fails every wake
// until someone fixes it, whichever failed last; the error names d too. Found by an operator trial:
// the 503 said retryable and the culprit was d, pointing the operator at the wrong fix.
func TestFleetQuorumLostOnATerminalMember(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := byName{"pool.c": &fakeBackend{wakeErr: exec.ErrNotFound}}
		for _, n := range []string{"a", "b", "d", "e"} {
			p["pool."+n] = &fakeBackend{}
		}
		s, _ := fleetServer(t, p, io.Discard, []string{"pool.d"}, fleetRoute(4, true, "a", "b", "c", "d", "e"))
		err := s.Wake(t.Context(), "pool")
		var we *WakeError
		if !errors.As(err, &we) || we.Class != tenant.ClassTerminal {
			t.Fatalf("Wake = %v, want a terminal *WakeError", err)
		}
		rec := s.instance("pool").status().LastWake
		want := Culprit{Instance: "pool", Member: "c", Phase: "spawn", Class: "terminal"}
		if rec.Class != "terminal" || rec.Culprit == nil || *rec.Culprit != want {
			t.Errorf("fault_class %q, culprit %+v; want terminal, %+v", rec.Class, rec.Culprit, want)
		}
		if !strings.Contains(rec.Error, `member "d" failed too, in phase health (retryable)`) {
			t.Errorf("error %q, want it to name d too", rec.Error)
		}
	})
}

// TestFleetSeries: a fleet has activator_fleet_member_ready for each member and
// activator_fleet_min_ready from its first wake; a single tenant has neither. They follow the members
// (c failed, a dies), and go with the route.
func TestFleetSeries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := &fakeBackend{}
		p := byName{"pool.a": a, "pool.b": &fakeBackend{}, "pool.c": &fakeBackend{wakeErr: exec.ErrNotFound}, "app": &fakeBackend{}}
		s, g := fleetServer(t, p, io.Discard, nil, fleetRoute(1, false, "a", "b", "c"), testRoute("app"))
		fleetSeries := func(route string) map[string]float64 {
			out := map[string]float64{}
			for k, v := range routeSeries(t, g, route) {
				if strings.HasPrefix(k, "activator_fleet_") {
					out[k] = v
				}
			}
			return out
		}
		if got := fleetSeries("pool"); len(got) != 0 {
			t.Errorf("fleet series before the first wake: %v", got)
		}
		for _, r := range []string{"pool", "app"} {
			if err := s.Wake(t.Context(), r); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		want := map[string]float64{
			`activator_fleet_member_ready{member="a"}`: 1,
			`activator_fleet_member_ready{member="b"}`: 1,
			`activator_fleet_member_ready{member="c"}`: 0,
			`activator_fleet_min_ready{}`:              1,
		}
		if got := fleetSeries("pool"); !maps.Equal(got, want) {
			t.Errorf("up without c: %v, want %v", got, want)
		}
		if got := fleetSeries("app"); len(got) != 0 {
			t.Errorf("a single tenant's fleet series: %v", got)
		}
		killMember(a, "killed")
		want[`activator_fleet_member_ready{member="a"}`] = 0
		if got := fleetSeries("pool"); !maps.Equal(got, want) {
			t.Errorf("after a died: %v, want %v", got, want)
		}
		if err := s.Apply(&registry.Config{Routes: []*registry.Route{testRoute("app")}}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := fleetSeries("pool"); len(got) != 0 {
			t.Errorf("after the route was removed: %v", got)
		}
	})
}

// poweringBackend is a fakeBackend whose wake begins with a phase power_on, with a budget of its own of
// 30 s, that takes d.
type poweringBackend struct {
	*fakeBackend
	d time.Duration
}

func (b poweringBackend) Wake(ctx context.Context, t tenant.Tracker) (*tenant.Life, error) {
	tenant.PhaseWithin(t, "power_on", 30*time.Second)
	select {
	case <-time.After(b.d):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return b.fakeBackend.Wake(ctx, t)
}

// TestFleetSerialBudgetsAreWhatIsLeft: serial, with a wake budget of 30 s; a's power_on takes 12 s.
// b's power_on and health phases show what was left of the wake budget when each began (18 s and
// 6 s), not their own budgets (30 s, and health.budget's 10 s), which they could not have had. Found
// by an operator trial: power_on (budget 30s) with about 12 s left.
func TestFleetSerialBudgetsAreWhatIsLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := byName{"pool.a": poweringBackend{&fakeBackend{}, 12 * time.Second}, "pool.b": poweringBackend{&fakeBackend{}, 12 * time.Second}}
		s := newChainServer(t, p, &registry.Config{Routes: []*registry.Route{fleetRoute(2, true, "a", "b")}})
		if err := s.Wake(t.Context(), "pool"); err != nil {
			t.Fatal(err)
		}
		budgets := func(m MemberRecord) map[string]time.Duration {
			out := map[string]time.Duration{}
			for _, ph := range m.Phases {
				out[ph.Name] = ph.Budget
			}
			return out
		}
		rows := s.instance("pool").status().LastWake.Members
		if got, want := budgets(rows[0]), map[string]time.Duration{"power_on": 30 * time.Second, "spawn": 0, "health": 10 * time.Second}; !maps.Equal(got, want) {
			t.Errorf("a's budgets %v, want %v", got, want)
		}
		if got, want := budgets(rows[1]), map[string]time.Duration{"power_on": 18 * time.Second, "spawn": 0, "health": 6 * time.Second}; !maps.Equal(got, want) {
			t.Errorf("b's budgets %v, want %v (what was left of the wake budget)", got, want)
		}
	})
}

// TestFleetTakeBackLossAsksOnlyItsMembers: min_ready 1; c refuses the fleet's sleep, a and b go down,
// and the fleet is taken back on c alone. When c then dies, a and b, down since the sleep, are not
// asked to stop again.
func TestFleetTakeBackLossAsksOnlyItsMembers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := &fakeBackend{}, &fakeBackend{}
		c := &fakeBackend{sleepErr: errors.New("the BMC refused GracefulShutdown")}
		s := newChainServer(t, byName{"pool.a": a, "pool.b": b, "pool.c": c}, &registry.Config{Routes: []*registry.Route{fleetRoute(1, false, "a", "b", "c")}})
		if err := s.Wake(t.Context(), "pool"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if err := s.Sleep(t.Context(), "pool"); err == nil {
			t.Fatal("the sleep c refused succeeded")
		}
		synctest.Wait() // the take-back, on c alone
		if st := s.instance("pool").status(); st.State != Awake.String() {
			t.Fatalf("after the take-back: %s", st.State)
		}
		c.set(func(f *fakeBackend) { f.sleepErr = nil })
		killMember(c, "powered off")
		if n, m := a.sleeps.Load(), b.sleeps.Load(); n != 1 || m != 1 {
			t.Errorf("a asked to sleep or stop %d times, b %d; want once each, by the fleet's sleep", n, m)
		}
	})
}

// TestFleetStatusHasNoUpstream: GET /routes/pool shows no upstream for a fleet (the registry's
// Route.Upstream is its first member's); each member's is in members.
func TestFleetStatusHasNoUpstream(t *testing.T) {
	s := newChainServer(t, byName{"pool.a": &fakeBackend{}, "pool.b": &fakeBackend{}}, &registry.Config{Routes: []*registry.Route{fleetRoute(1, false, "a", "b")}})
	st := s.instance("pool").status()
	if st.Upstream != "" || st.Members[0].Upstream == "" {
		t.Errorf("upstream %q, members %+v: want none for the fleet, each member's in its row", st.Upstream, st.Members)
	}
}

// warningBackend is a fakeBackend that warns (tenant.Warner) with what warn holds.
type warningBackend struct {
	*fakeBackend
	warn *atomic.Pointer[string]
}

func (b warningBackend) Warning() string {
	if w := b.warn.Load(); w != nil {
		return *w
	}
	return ""
}

// TestFleetPassesMembersWarningsOn: a member whose backend warns (a BMC that rejected its
// credentials) shows the warning in the fleet route's status, named by member, and in its member row;
// members without one add nothing, and the warning goes once the member's backend drops it. Before,
// the fleet's backend had no Warning, and a fleet of nodes held back by rejected credentials showed
// nothing.
func TestFleetPassesMembersWarningsOn(t *testing.T) {
	var wa, wc atomic.Pointer[string]
	p := byName{
		"pool.a": warningBackend{&fakeBackend{}, &wa},
		"pool.b": &fakeBackend{},
		"pool.c": warningBackend{&fakeBackend{}, &wc},
	}
	s := New(Options{Opener: p, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		NewGate: func(*registry.Route) Gate { return passGate{} }})
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{fleetRoute(2, false, "a", "b", "c")}}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Shutdown(context.Background()) }()
	in := s.instance("pool")
	if w := in.status().Warning; w != "" {
		t.Fatalf("Warning = %q with no member warning, want none", w)
	}
	rejected := "the BMC https://10.0.0.1 rejected the credentials at 12:00:03"
	wa.Store(&rejected)
	other := "the BMC https://10.0.0.3 rejected the credentials at 12:01:00"
	wc.Store(&other)
	st := in.status()
	if want := "member a: " + rejected + "; member c: " + other; st.Warning != want {
		t.Fatalf("Warning = %q, want %q", st.Warning, want)
	}
	var rows []string
	for _, m := range st.Members {
		rows = append(rows, m.Warning)
	}
	if want := []string{rejected, "", other}; !slices.Equal(rows, want) {
		t.Fatalf("member warnings %q, want %q", rows, want)
	}
	wa.Store(nil)
	if w := in.status().Warning; w != "member c: "+other {
		t.Fatalf("Warning = %q after a's went, want c's alone", w)
	}
}
