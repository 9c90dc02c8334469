package activator

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/activator/activator/internal/registry"
)

// drainServer is a server over one stopperBackend route (it parks on Sleep, as freeze or pause do),
// with shutdown_grace 20s: the admin sleep's grace is 15s, half the route's hold.max_time.
func drainServer(t *testing.T) (*Server, *instance, *stopperBackend) {
	t.Helper()
	b := &stopperBackend{}
	s := New(Options{Opener: stopperProvider{b}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		NewGate: func(*registry.Route) Gate { return passGate{} }})
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{testRoute("app")}, ShutdownGrace: 20 * time.Second}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s, s.instance("app"), b
}

// inFlight acquires in like a request and holds it in flight until answer is closed.
func inFlight(in *instance, answer <-chan struct{}) <-chan error {
	done := make(chan error, 1)
	go func() {
		release, err := in.acquire(context.Background(), triggerRequest)
		if err == nil {
			<-answer
			release()
		}
		done <- err
	}()
	return done
}

// TestAdminSleepLetsRequestsInFlightFinish: an admin sleep that waited for a wake lets the requests
// that wake released finish before the tenant goes down; requests arriving meanwhile wait behind the
// sleep and wake the route again afterwards. Found with the real binary: every request the wake
// released was sent to a tenant being stopped and got 502.
func TestAdminSleepLetsRequestsInFlightFinish(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, in, b := drainServer(t)
		b.set(func(f *fakeBackend) { f.wakeGate = make(chan struct{}) })
		answer := make(chan struct{})
		reqs := []<-chan error{inFlight(in, answer), inFlight(in, answer)}
		synctest.Wait() // held on the wake
		slept := make(chan error, 1)
		go func() { slept <- s.Sleep(context.Background(), "app") }()
		synctest.Wait() // the admin sleep waits for the wake
		b.set(func(f *fakeBackend) { close(f.wakeGate); f.wakeGate = nil })
		synctest.Wait() // released: both in flight; the sleep waits for them
		if n := b.sleeps.Load(); n != 0 {
			t.Fatalf("sleeps = %d with the released requests still in flight, want 0", n)
		}
		late := request(in) // arrives during the sleep: waits behind it
		time.Sleep(5 * time.Second)
		close(answer)
		for _, r := range reqs {
			if err := <-r; err != nil {
				t.Fatalf("a released request: %v", err)
			}
		}
		if err := <-slept; err != nil {
			t.Fatalf("admin sleep: %v", err)
		}
		if n, stops := b.sleeps.Load(), b.stops.Load(); n != 1 || stops != 0 {
			t.Errorf("sleeps = %d, stops = %d; want one sleep (parked: nothing was in flight by then) and no stop", n, stops)
		}
		if err := <-late; err != nil {
			t.Errorf("the request that came during the sleep: %v, want it served after a wake", err)
		}
	})
}

// TestAdminSleepStopsUnderRequestsLeft: requests still in flight when the admin sleep's grace ends
// (a long poll, an event stream) are not parked with the tenant, which would leave them unanswered
// until its next wake (found with `sleep: freeze`): the tenant is stopped instead, so they end with
// it, and the sleep's record says why.
func TestAdminSleepStopsUnderRequestsLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, in, b := drainServer(t)
		answer := make(chan struct{})
		defer close(answer)
		long := inFlight(in, answer)
		synctest.Wait()
		start := time.Now()
		if err := s.Sleep(context.Background(), "app"); err != nil {
			t.Fatalf("admin sleep: %v", err)
		}
		if took := time.Since(start); took != 15*time.Second {
			t.Errorf("the admin sleep took %v, want the grace, 15s (half of hold.max_time 30s, below shutdown_grace 20s)", took)
		}
		if stops := b.stops.Load(); stops != 1 {
			t.Errorf("stops = %d, want 1: the tenant stopped, not parked, under the request left", stops)
		}
		// The stop has the whole sleep_budget (10s), counted from after the grace: counted from the
		// sleep's start, a grace as long as the budget (30s each by default) left the stop none, and
		// an exec tenant was killed with SIGKILL at once (found by an operator trial).
		if left := time.Duration(b.stopLeft.Load()); left != in.route.SleepBudget {
			t.Errorf("the stop had %v of its budget left, want all of sleep_budget, %v", left, in.route.SleepBudget)
		}
		rec := in.hist.last(1)
		if len(rec) != 1 || rec[0].Sleep == nil || !strings.Contains(strings.Join(rec[0].Sleep.Notes, " "), "1 requests still in flight after 15s") {
			t.Errorf("the sleep's record %+v, want a note saying a request was still in flight", rec)
		}
		select {
		case err := <-long:
			t.Fatalf("the long request ended (%v) before its answer", err)
		default:
		}
	})
}
