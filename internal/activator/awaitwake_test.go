package activator

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/activator/activator/internal/registry"
)

// TestAdminWakeIsNotAHeldRequest: an admin wake waits for the wake itself, not as a request held at
// the edge. Found with the real binary on a route whose hold.max_time (1s) was below its start time:
// `activator wake` answered "timed out waiting for the route to wake" while the wake went on to
// succeed; with hold.max_requests 1 an admin wake took the only place in the hold (a visitor got 503)
// or was refused it; and the wake's record and the hold figures counted it as a held request.
func TestAdminWakeIsNotAHeldRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{wakeGate: make(chan struct{})}
		s, in := newTestServer(t, b, passGate{}, func(r *registry.Route) {
			r.WakeBudget = time.Minute
			r.Hold = registry.Hold{MaxRequests: 1, MaxTime: time.Second}
		})
		admin := make(chan error, 2)
		go func() { admin <- s.Wake(context.Background(), "app") }()
		synctest.Wait()
		if held := in.status().Held; held != 0 {
			t.Errorf("an admin wake in progress counts %d held requests, want 0", held)
		}
		request := make(chan error, 1)
		go func() {
			_, err := in.acquire(context.Background(), triggerRequest)
			request <- err
		}()
		synctest.Wait()
		if held := in.status().Held; held != 1 {
			t.Fatalf("a visitor during the admin wake: %d held, want 1 (the hold's one place is the visitor's)", held)
		}
		go func() { admin <- s.Wake(context.Background(), "app") }() // a second operator, with the hold full
		time.Sleep(2 * time.Second)                                  // past hold.max_time
		if err := <-request; !errors.Is(err, ErrHoldTimeout) {
			t.Fatalf("the visitor held past hold.max_time: %v, want ErrHoldTimeout", err)
		}
		select {
		case err := <-admin:
			t.Fatalf("an admin wake ended before its wake did: %v", err)
		default:
		}
		close(b.wakeGate)
		for range 2 {
			if err := <-admin; err != nil {
				t.Fatalf("admin wake: %v, want nil (the wake succeeded)", err)
			}
		}
		st := in.status()
		if st.State != Awake.String() || st.InFlight != 0 || st.Held != 0 {
			t.Errorf("after the admin wakes: %s, %d in flight, %d held; want awake, 0, 0", st.State, st.InFlight, st.Held)
		}
		if st.LastWake == nil || st.LastWake.Released != 0 || st.LastWake.Trigger != string(triggerAdmin) {
			t.Errorf("the wake's record: %+v, want trigger admin and no released requests", st.LastWake)
		}
		if n := b.wakes.Load(); n != 1 {
			t.Errorf("%d wakes, want 1", n)
		}
	})
}

// TestRequirementIsNotAHeldRequest: a dependent waiting for its requirement is bounded by its own
// wake, not by the requirement's hold.max_time: a requirement slower to start than its hold.max_time
// failed every dependent's wake with "timed out waiting for the route to wake" (504) while it went on
// to wake.
func TestRequirementIsNotAHeldRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := &fakeBackend{wakeGate: make(chan struct{})}
		web := testRoute("web")
		web.Requires, web.WakeBudget = []string{"db"}, time.Minute
		dbr := testInstance("db")
		dbr.WakeBudget, dbr.Hold = time.Minute, registry.Hold{MaxRequests: 10, MaxTime: time.Second}
		s := newChainServer(t, byName{"db": db, "web": &fakeBackend{}}, &registry.Config{Routes: []*registry.Route{web}, Instances: []*registry.Route{dbr}})
		done := make(chan error, 1)
		go func() { done <- s.Wake(context.Background(), "web") }()
		time.Sleep(3 * time.Second) // the requirement takes three times its hold.max_time
		close(db.wakeGate)
		if err := <-done; err != nil {
			t.Fatalf("the dependent's wake: %v, want nil", err)
		}
		if st := s.instance("db").status(); st.Held != 0 || st.LastWake == nil || st.LastWake.Released != 0 {
			t.Errorf("the requirement after the wake: %d held, record %+v; want none held or released", st.Held, st.LastWake)
		}
	})
}
