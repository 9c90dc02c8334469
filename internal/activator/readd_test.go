package activator

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/activator/activator/internal/registry"
)

// TestReaddedRouteWaitsForRetiring: a route removed by one reload and added back by the next, while
// its old instance is still putting the tenant to sleep, must not wake the tenant until that sleep
// has finished; two instances never run one tenant.
func TestReaddedRouteWaitsForRetiring(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{}
		s, in := newTestServer(t, b, passGate{})
		if err := in.wakeNow(context.Background()); err != nil {
			t.Fatal(err)
		}
		release := make(chan struct{})
		b.set(func(f *fakeBackend) { f.sleepGte = release })
		route := in.route
		if err := s.Apply(&registry.Config{}); err != nil { // removed: the old instance starts sleeping
			t.Fatal(err)
		}
		synctest.Wait()
		if got := b.sleeps.Load(); got != 1 {
			t.Fatalf("sleeps after removal = %d, want 1 (in progress)", got)
		}
		if err := s.Apply(&registry.Config{Routes: []*registry.Route{route}}); err != nil { // added back
			t.Fatal(err)
		}
		woke := make(chan error, 1)
		go func() { woke <- s.Wake(context.Background(), "app") }()
		synctest.Wait()
		if got := b.wakes.Load(); got != 1 {
			t.Fatalf("the re-added route woke its tenant while the old instance was still stopping it (wakes = %d, want 1)", got)
		}
		close(release)
		if err := <-woke; err != nil {
			t.Fatal(err)
		}
		if got := b.wakes.Load(); got != 2 {
			t.Fatalf("wakes after the old instance retired = %d, want 2", got)
		}
	})
}
