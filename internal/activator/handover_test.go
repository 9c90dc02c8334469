package activator

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// edgeChange is the route of newTestServer with only a key of the edge changed: its idle window.
func edgeChange(idle time.Duration) *registry.Config {
	r := testRoute("app")
	r.Idle = idle
	return &registry.Config{Routes: []*registry.Route{r}}
}

// awakeWithARequest is a server whose one route, app, is awake on b with a request in flight on its
// instance (done ends it), as a reload may find it.
func awakeWithARequest(t *testing.T) (s *Server, old *instance, b *closingBackend, done func()) {
	t.Helper()
	b = &closingBackend{}
	s = newShutdownServer(t, map[string]tenant.Backend{"app": b})
	old = s.instance("app")
	if err := s.Wake(t.Context(), "app"); err != nil {
		t.Fatal(err)
	}
	done, err := old.acquire(context.Background(), triggerRequest)
	if err != nil {
		t.Fatal(err)
	}
	return s, old, b, done
}

// TestReloadHandsTheTenantOver: a reload that changes only keys of the edge (here idle) keeps the
// route's tenant running: the old instance hands it to the new one at once instead of putting it to
// sleep, the new one takes it over through its health gate (a wake with trigger reload, not counted as
// a wake of the tenant) and counts the old one's requests in flight as its own until they end, and
// the new idle window applies from then on. The backend is the same, closed once, at shutdown. Found
// by operator trials: a change of idle alone stopped a unit and powered a bare-metal node off and on
// again; then, with the handover waiting for the old instance's requests in flight, one long request
// kept the route shown asleep, and every new request held, for the whole reload grace.
func TestReloadHandsTheTenantOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, old, b, long := awakeWithARequest(t) // long: in flight across the reload
		awakeSince := old.status().Since
		time.Sleep(time.Minute)
		if err := s.Apply(edgeChange(time.Hour)); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		heir := s.instance("app")
		if heir == old {
			t.Fatal("a changed route kept its instance")
		}
		st := heir.status()
		if st.State != Awake.String() || st.InFlight != 1 {
			t.Errorf("the new instance is %s with %d in flight while the old one serves a request, want awake with that one", st.State, st.InFlight)
		}
		if !st.Since.Equal(awakeSince) {
			t.Errorf("the new instance is awake since %v, want the tenant's %v: the same tenant runs on (status FOR)", st.Since, awakeSince)
		}
		if err := <-request(heir); err != nil {
			t.Fatalf("a request to the new instance during the old one's request: %v", err)
		}
		select {
		case <-old.retired:
			t.Fatal("the old instance retired with its request in flight")
		default:
		}
		// The new idle window does not start under the old instance's request.
		time.Sleep(2 * time.Hour)
		synctest.Wait()
		if n := b.sleeps.Load(); n != 0 {
			t.Fatalf("the tenant slept under the old instance's request")
		}
		long()
		synctest.Wait()
		wantRetired(t, old)
		st = heir.status()
		if st.State != Awake.String() || st.InFlight != 0 {
			t.Fatalf("the new instance is %s with %d in flight once the old one's request ended, want awake with none", st.State, st.InFlight)
		}
		if n, m := b.sleeps.Load(), b.wakes.Load(); n != 0 || m != 1 {
			t.Errorf("sleeps %d, wakes %d: want the tenant of the first wake running on (0, 1)", n, m)
		}
		if rec := st.LastWake; rec == nil || rec.Trigger != string(triggerReload) || rec.Result != ResultAdopted {
			t.Errorf("the new instance's last wake %+v, want trigger reload, result adopted", rec)
		}
		if n := b.closes.Load(); n != 0 {
			t.Errorf("the backend was closed %d times by the handover, want 0", n)
		}
		// The new idle window: asleep an hour after the handover, not a minute.
		time.Sleep(59 * time.Minute)
		synctest.Wait()
		if n := b.sleeps.Load(); n != 0 {
			t.Fatalf("slept within the new idle window")
		}
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if st := heir.status(); st.State != Asleep.String() || st.LastSleep != string(ReasonIdle) {
			t.Errorf("after the new idle window: %s, last sleep %+v; want asleep, reason idle", st.State, st.LastSleep)
		}
		if err := s.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := b.closes.Load(); n != 1 {
			t.Errorf("the backend was closed %d times, want once, by the new instance", n)
		}
	})
}

// TestReloadHandoverCases: a route asleep at the reload stays asleep (its new instance wakes for the
// next request, as ever); two reloads in a row, the second before the first handover, end with the
// last instance awake on the same tenant; a change of the tenant's own (here wake_budget) still puts
// it to sleep, as before.
func TestReloadHandoverCases(t *testing.T) {
	t.Run("asleep", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := &closingBackend{}
			s := newShutdownServer(t, map[string]tenant.Backend{"app": b})
			if err := s.Apply(edgeChange(time.Hour)); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			if st := s.instance("app").status().State; st != Asleep.String() || b.wakes.Load() != 0 {
				t.Fatalf("after the reload: %s, %d wakes; want asleep and none", st, b.wakes.Load())
			}
			if err := <-request(s.instance("app")); err != nil {
				t.Fatal(err)
			}
			if n := b.wakes.Load(); n != 1 {
				t.Errorf("wakes = %d, want 1 (the request's)", n)
			}
		})
	})
	t.Run("two reloads", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, old, b, long := awakeWithARequest(t)
			if err := s.Apply(edgeChange(time.Hour)); err != nil {
				t.Fatal(err)
			}
			middle := s.instance("app")
			if err := s.Apply(edgeChange(2 * time.Hour)); err != nil {
				t.Fatal(err)
			}
			long()
			synctest.Wait()
			wantRetired(t, old)
			wantRetired(t, middle)
			if st := s.instance("app").status().State; st != Awake.String() {
				t.Errorf("the last instance is %s, want awake", st)
			}
			if n, m, c := b.sleeps.Load(), b.wakes.Load(), b.closes.Load(); n != 0 || m != 1 || c != 0 {
				t.Errorf("sleeps %d, wakes %d, closes %d; want 0, 1, 0", n, m, c)
			}
		})
	})
	t.Run("removed before the handover", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, old, b, long := awakeWithARequest(t)
			if err := s.Apply(edgeChange(time.Hour)); err != nil {
				t.Fatal(err)
			}
			heir := s.instance("app")
			if err := s.Apply(&registry.Config{}); err != nil {
				t.Fatal(err)
			}
			long()
			synctest.Wait()
			wantRetired(t, old)
			wantRetired(t, heir)
			if n, c := b.sleeps.Load(), b.closes.Load(); n != 1 || c != 1 {
				t.Errorf("sleeps %d, closes %d; want the removed route's tenant put to sleep and its backend closed (1, 1)", n, c)
			}
		})
	})
	t.Run("shutdown before the handover", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _, b, long := awakeWithARequest(t)
			if err := s.Apply(edgeChange(time.Hour)); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- s.Shutdown(ctx) }()
			synctest.Wait()
			long()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if c := b.closes.Load(); c != 1 {
				t.Errorf("closes %d, want 1: the backend closed once, by whichever instance owned it", c)
			}
		})
	})
	t.Run("the tenant's own change", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := &closingBackend{}
			s := newShutdownServer(t, map[string]tenant.Backend{"app": b})
			if err := s.Wake(t.Context(), "app"); err != nil {
				t.Fatal(err)
			}
			r := testRoute("app")
			r.WakeBudget *= 2
			if err := s.Apply(&registry.Config{Routes: []*registry.Route{r}}); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			if n, c := b.sleeps.Load(), b.closes.Load(); n != 1 || c != 1 {
				t.Errorf("sleeps %d, closes %d; want the old instance's reload sleep and close (1, 1)", n, c)
			}
		})
	})
}

// TestReloadHandoverToARequestsWake: a request that reaches the new instance before the old one has
// handed the tenant over (here the old one is still waking it at the reload) waits for the handover
// and takes the tenant over: it does not start the tenant a second time. Found by an operator trial
// with a bare-metal node: the request's wake powered the node "on" again after the handover, its record
// a 9.5 s wake of phases predecessor, start and health, counted as a wake of the tenant.
func TestReloadHandoverToARequestsWake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &closingBackend{}
		gate := make(chan struct{})
		b.wakeGate = gate
		s := newShutdownServer(t, map[string]tenant.Backend{"app": b})
		old := s.instance("app")
		first := request(old) // wakes the tenant, blocked in the backend's Wake
		synctest.Wait()
		if err := s.Apply(edgeChange(time.Hour)); err != nil {
			t.Fatal(err)
		}
		heir := s.instance("app")
		second := request(heir)
		synctest.Wait()
		b.mu.Lock()
		b.wakeGate = nil
		b.mu.Unlock()
		close(gate)
		if err := <-first; err != nil {
			t.Fatalf("the request to the old instance: %v", err)
		}
		if err := <-second; err != nil {
			t.Fatalf("the request to the new instance: %v", err)
		}
		synctest.Wait()
		wantRetired(t, old)
		if n := b.wakes.Load(); n != 1 {
			t.Errorf("the backend woke %d times, want once: the new instance takes the tenant over", n)
		}
		rec := heir.status().LastWake
		if rec == nil || rec.Result != ResultAdopted || !slices.ContainsFunc(rec.Phases, func(p PhaseRecord) bool { return p.Name == phaseHandover }) {
			t.Errorf("the new instance's wake %+v, want result adopted with a handover phase", rec)
		}
	})
}
