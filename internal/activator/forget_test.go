package activator

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
	"github.com/activator/activator/internal/testenv"
)

// forgettingBackend is a closingBackend that counts its Forgets (tenant.Forgetter) and notes, at the
// first, what had happened by then: how many Closes and last sleeps, whether the tenant still ran,
// and whether retired (the instance's, set by the test) had closed.
type forgettingBackend struct {
	closingBackend
	forgets atomic.Int32

	atMu         sync.Mutex // guards the fields below
	retired      <-chan struct{}
	closesAt     int32
	lastSleepsAt int32
	runningAt    bool
	retiredAt    bool
}

var _ tenant.Forgetter = (*forgettingBackend)(nil)

func (b *forgettingBackend) Forget(context.Context) error {
	if b.forgets.Add(1) > 1 {
		return nil
	}
	b.mu.Lock()
	running := b.life != nil && b.life.Err() == nil
	b.mu.Unlock()
	b.atMu.Lock()
	defer b.atMu.Unlock()
	b.closesAt, b.lastSleepsAt, b.runningAt = b.closes.Load(), b.lastSleeps.Load(), running
	if b.retired != nil {
		select {
		case <-b.retired:
			b.retiredAt = true
		default:
		}
	}
	return nil
}

// watch notes in's retired channel, for Forget to tell whether the instance had retired before it.
func (b *forgettingBackend) watch(in *instance) {
	b.atMu.Lock()
	defer b.atMu.Unlock()
	b.retired = in.retired
}

// wantForgotten checks that b was forgotten exactly once, after its last sleep and its Close, with
// its tenant no longer running and before its instance had retired.
func (b *forgettingBackend) wantForgotten(t *testing.T, who string) {
	t.Helper()
	if n := b.forgets.Load(); n != 1 {
		t.Fatalf("%s: forgotten %d times, want once", who, n)
	}
	b.atMu.Lock()
	defer b.atMu.Unlock()
	if b.closesAt != 1 || b.lastSleepsAt != 1 || b.runningAt {
		t.Errorf("%s: forgotten after %d closes and %d last sleeps, tenant running %v: want after the last sleep and the Close, the tenant down",
			who, b.closesAt, b.lastSleepsAt, b.runningAt)
	}
	if b.retiredAt {
		t.Errorf("%s: forgotten after its instance had retired: a route added back would not wait for it", who)
	}
}

// forgetOpener opens a new forgettingBackend at each Open, and keeps them by route name (a fleet
// member's: fleet.member), in order. logs is the log of the server forgetServer makes with it.
type forgetOpener struct {
	logs testenv.SyncBuffer

	mu     sync.Mutex
	opened map[string][]*forgettingBackend
}

func (o *forgetOpener) Open(r *registry.Route) (tenant.Backend, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.opened == nil {
		o.opened = map[string][]*forgettingBackend{}
	}
	b := &forgettingBackend{}
	o.opened[r.Name] = append(o.opened[r.Name], b)
	return b, nil
}

// last is the backend opened last for name.
func (o *forgetOpener) last(t *testing.T, name string) *forgettingBackend {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	bs := o.opened[name]
	if len(bs) == 0 {
		t.Fatalf("no backend opened for %s", name)
	}
	return bs[len(bs)-1]
}

func forgetServer(t *testing.T, o *forgetOpener, routes ...*registry.Route) *Server {
	t.Helper()
	s := New(Options{Opener: o, Logger: slog.New(slog.NewTextHandler(&o.logs, &slog.HandlerOptions{Level: slog.LevelDebug})), NewGate: func(*registry.Route) Gate { return passGate{} }})
	apply(t, s, routes...)
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s
}

// awakeApp is forgetServer over route app alone, woken: its opener, the server, the route's instance
// and its backend.
func awakeApp(t *testing.T) (*forgetOpener, *Server, *instance, *forgettingBackend) {
	t.Helper()
	o := &forgetOpener{}
	s := forgetServer(t, o, testRoute("app"))
	old, b := s.instance("app"), o.last(t, "app")
	if err := s.Wake(t.Context(), "app"); err != nil {
		t.Fatal(err)
	}
	return o, s, old, b
}

func apply(t *testing.T, s *Server, routes ...*registry.Route) {
	t.Helper()
	if err := s.Apply(&registry.Config{Routes: routes}); err != nil {
		t.Fatal(err)
	}
}

// TestRemovedTenantIsForgotten: a reload that removes a route has its backend forget the tenant
// (tenant.Forgetter: the kvm backing removes the guest's snapshot, which otherwise stayed on disk for
// good) once, after the last sleep and the Close, before the instance has retired; later reloads and
// the shutdown do not call it again. Not for a route a reload changes (its new backend takes the
// snapshot over), nor hands over to an heir, nor adds back before its old instance retired, nor after
// a last sleep that failed (the tenant may still run); but for a route whose name now has another
// backing, and for a fleet's member that a reload takes out of the fleet.
func TestRemovedTenantIsForgotten(t *testing.T) {
	t.Run("removed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			o := &forgetOpener{}
			other := testRoute("other")
			s := forgetServer(t, o, testRoute("app"), other)
			old := s.instance("app")
			b := o.last(t, "app")
			b.watch(old)
			if err := s.Wake(t.Context(), "app"); err != nil {
				t.Fatal(err)
			}
			apply(t, s, other)
			synctest.Wait()
			wantRetired(t, old)
			b.wantForgotten(t, "the removed route's backend")
			if !strings.Contains(o.logs.String(), `msg="removed tenant forgotten: its backend let go of what it kept for a next wake" route=app`) {
				t.Errorf("no log line says route app's tenant was forgotten:\n%s", o.logs.String())
			}
			apply(t, s, other, testRoute("third"))
			if err := s.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			if n := b.forgets.Load(); n != 1 {
				t.Errorf("the removed route's backend forgotten %d times after a later reload and the shutdown, want once", n)
			}
			for _, name := range []string{"other", "third"} {
				if n := o.last(t, name).forgets.Load(); n != 0 {
					t.Errorf("route %s, still configured at the shutdown, forgotten %d times", name, n)
				}
			}
		})
	})

	t.Run("handed over to an heir, then removed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			_, s, old, b := awakeApp(t)
			r := testRoute("app")
			r.Idle = time.Hour // an edge key only: the heir takes the backend and its running tenant
			apply(t, s, r)
			synctest.Wait()
			wantRetired(t, old)
			heir := s.instance("app")
			if heir == old || heir.backend != b {
				t.Fatal("the edge-only change did not hand the backend to a new instance")
			}
			if n := b.forgets.Load(); n != 0 {
				t.Fatalf("the backend handed over to the heir was forgotten %d times", n)
			}
			b.watch(heir)
			apply(t, s)
			synctest.Wait()
			wantRetired(t, heir)
			b.wantForgotten(t, "the heir's backend, once its route was removed")
		})
	})

	t.Run("changed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			_, s, old, b := awakeApp(t)
			r := testRoute("app")
			r.WakeBudget = time.Minute // the tenant's own key: a new backend
			apply(t, s, r)
			synctest.Wait()
			wantRetired(t, old)
			if n, c := b.forgets.Load(), b.closes.Load(); n != 0 || c != 1 {
				t.Errorf("the changed route's old backend: closed %d times, forgotten %d times; want closed once, never forgotten", c, n)
			}
		})
	})

	t.Run("added back before it retired", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			_, s, old, b := awakeApp(t)
			release := make(chan struct{})
			b.set(func(f *fakeBackend) { f.sleepGte = release })
			apply(t, s)
			synctest.Wait()
			apply(t, s, testRoute("app")) // while the old instance's last sleep runs
			close(release)
			synctest.Wait()
			wantRetired(t, old)
			if n := b.forgets.Load(); n != 0 {
				t.Errorf("a route added back before its old instance retired was forgotten %d times", n)
			}
		})
	})

	t.Run("last sleep failed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			o, s, old, b := awakeApp(t)
			b.set(func(f *fakeBackend) { f.sleepErr = errors.New("will not stop") })
			apply(t, s)
			synctest.Wait()
			wantRetired(t, old)
			if n, c := b.forgets.Load(), b.closes.Load(); n != 0 || c != 1 {
				t.Errorf("after a failed last sleep: closed %d times, forgotten %d times; want closed once, never forgotten", c, n)
			}
			if !strings.Contains(o.logs.String(), `msg="removed tenant not forgotten: its last sleep failed`) {
				t.Errorf("no log line says why the removed tenant was not forgotten:\n%s", o.logs.String())
			}
		})
	})

	t.Run("another backing now", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			o := &forgetOpener{}
			s := forgetServer(t, o, testRoute("app"))
			old := s.instance("app")
			b := o.last(t, "app")
			b.watch(old)
			if err := s.Wake(t.Context(), "app"); err != nil {
				t.Fatal(err)
			}
			r := testRoute("app")
			r.Backing = "other"
			apply(t, s, r)
			synctest.Wait()
			wantRetired(t, old)
			b.wantForgotten(t, "the backend of the name's earlier backing")
		})
	})

	t.Run("fleet member removed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			o := &forgetOpener{}
			s := forgetServer(t, o, fleetRoute(1, false, "a", "b", "c"))
			old := s.instance("pool")
			members := map[string]*forgettingBackend{}
			for _, m := range []string{"a", "b", "c"} {
				members[m] = o.last(t, "pool."+m)
				members[m].watch(old)
			}
			if err := s.Wake(t.Context(), "pool"); err != nil {
				t.Fatal(err)
			}
			apply(t, s, fleetRoute(1, false, "a", "b"))
			synctest.Wait()
			wantRetired(t, old)
			members["c"].wantForgotten(t, "the member the reload took out of the fleet")
			for _, m := range []string{"a", "b"} {
				if n := members[m].forgets.Load(); n != 0 {
					t.Errorf("member %s, still in the fleet, forgotten %d times", m, n)
				}
			}
		})
	})
}
