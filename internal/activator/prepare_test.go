package activator

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// preparingBackend is a closingBackend with the Preparer ability, like the exec backing with standby:
// true. Prepare counts itself, notes how many Closes of before had run when it began, and returns once
// release is closed or its ctx ends. With idle set it has nothing to prepare, like a route without
// standby.
type preparingBackend struct {
	closingBackend
	idle     bool
	prepares atomic.Int32
	running  *atomic.Int32 // Prepares running now, across the test's backends
	most     *atomic.Int32 // the most that ran at once
	release  <-chan struct{}
	before   *closingBackend // the route's backend before a reload; nil for none
	closedAt atomic.Int32    // before.closes when Prepare began
}

func (b *preparingBackend) NeedsPrepare() bool { return !b.idle }

func (b *preparingBackend) Prepare(ctx context.Context) {
	b.prepares.Add(1)
	if b.before != nil {
		b.closedAt.Store(b.before.closes.Load())
	}
	n := b.running.Add(1)
	defer b.running.Add(-1)
	for m := b.most.Load(); n > m && !b.most.CompareAndSwap(m, n); m = b.most.Load() {
	}
	select {
	case <-b.release:
	case <-ctx.Done():
	}
}

var _ tenant.Preparer = (*preparingBackend)(nil)

func newPrepareServer(p routeProvider) *Server {
	return New(Options{
		Opener:  p,
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		NewGate: func(*registry.Route) Gate { return passGate{} },
	})
}

// startPreparing applies n routes r0… on a new Server, each with a preparingBackend whose Prepare
// returns once release is closed, but those numbered in idle, which have nothing to prepare. running
// and most count their Prepares.
func startPreparing(t *testing.T, n int, release <-chan struct{}, idle ...int) (s *Server, bs []*preparingBackend, running, most *atomic.Int32) {
	t.Helper()
	running, most = new(atomic.Int32), new(atomic.Int32)
	p := routeProvider{}
	cfg := &registry.Config{}
	for i := range n {
		b := &preparingBackend{running: running, most: most, release: release, idle: slices.Contains(idle, i)}
		name := fmt.Sprintf("r%d", i)
		p[name] = b
		bs = append(bs, b)
		cfg.Routes = append(cfg.Routes, testRoute(name))
	}
	s = newPrepareServer(p)
	if err := s.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	return s, bs, running, most
}

// At start-up every route's backend prepares once, prepareAtOnce at a time, without waking anything;
// one with nothing to prepare gets no goroutine, so no turn either.
func TestPrepareAtStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		s, bs, running, most := startPreparing(t, 6, release, 3)
		synctest.Wait()
		if got := running.Load(); got != prepareAtOnce {
			t.Errorf("%d Prepares running while they block, want %d at once", got, prepareAtOnce)
		}
		close(release)
		synctest.Wait()
		for i, b := range bs {
			want := int32(1)
			if b.idle {
				want = 0
			}
			if got := b.prepares.Load(); got != want {
				t.Errorf("route r%d prepared %d times, want %d", i, got, want)
			}
			if got := b.wakes.Load(); got != 0 {
				t.Errorf("route r%d woken %d times by its preparation", i, got)
			}
		}
		if got := most.Load(); got != prepareAtOnce {
			t.Errorf("at most %d Prepares ran at once, want %d", got, prepareAtOnce)
		}
		if err := s.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// A reload that changes a route prepares its new backend only once the old one is closed: the old
// tenant (in flight when the reload came) may hold what the preparation needs, such as the port.
// An unchanged route is not prepared again.
func TestPrepareAfterReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var running, most atomic.Int32
		release := make(chan struct{})
		close(release)
		old := &preparingBackend{running: &running, most: &most, release: release}
		keep := &preparingBackend{running: &running, most: &most, release: release}
		p := routeProvider{"app": old, "keep": keep}
		s := newPrepareServer(p)
		if err := s.Apply(&registry.Config{Routes: []*registry.Route{testRoute("app"), testRoute("keep")}}); err != nil {
			t.Fatal(err)
		}
		done, err := s.instance("app").acquire(context.Background(), triggerRequest)
		if err != nil {
			t.Fatal(err)
		}
		next := &preparingBackend{running: &running, most: &most, release: release, before: &old.closingBackend}
		p["app"] = next
		changed := testRoute("app")
		changed.WakeBudget += time.Second // a change of the tenant's own (an edge-only one hands the tenant over: TestReloadHandsTheTenantOver)
		if err := s.Apply(&registry.Config{Routes: []*registry.Route{changed, testRoute("keep")}}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := next.prepares.Load(); got != 0 {
			t.Fatalf("the new backend prepared %d times while the old one serves a request, want 0", got)
		}
		done() // the old instance's last request: it sleeps, closes and retires
		synctest.Wait()
		if got := next.prepares.Load(); got != 1 {
			t.Fatalf("the new backend prepared %d times after the old one retired, want 1", got)
		}
		if got := next.closedAt.Load(); got != 1 {
			t.Errorf("the new backend prepared after %d Closes of the old one, want 1", got)
		}
		if got := keep.prepares.Load(); got != 1 {
			t.Errorf("the unchanged route prepared %d times, want once, at the first Apply", got)
		}
		if err := s.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// Shutdown ends a Prepare in progress (its ctx) and those still waiting for their turn never begin.
func TestPrepareAtShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, bs, running, _ := startPreparing(t, 4, make(chan struct{}))
		synctest.Wait()
		if err := s.Shutdown(context.Background()); err != nil {
			t.Fatalf("Shutdown with Prepares blocked: %v", err)
		}
		total := int32(0)
		for _, b := range bs {
			total += b.prepares.Load()
		}
		if total != prepareAtOnce || running.Load() != 0 {
			t.Errorf("%d Prepares began and %d still run after Shutdown, want %d and 0", total, running.Load(), prepareAtOnce)
		}
	})
}

// adoptingPreparer is a preparingBackend with the Adopter ability whose Adopt finds nothing running,
// once unblock is closed; it notes a Prepare that began before an Adopt had returned.
type adoptingPreparer struct {
	preparingBackend
	unblock <-chan struct{}
	adopted atomic.Bool
	early   atomic.Bool
}

func (b *adoptingPreparer) Adopt(ctx context.Context) (*tenant.Life, bool, error) {
	select {
	case <-b.unblock:
	case <-ctx.Done():
	}
	b.adopted.Store(true)
	return nil, false, nil
}

func (b *adoptingPreparer) Prepare(ctx context.Context) {
	if !b.adopted.Load() {
		b.early.Store(true)
	}
	b.preparingBackend.Prepare(ctx)
}

// A backend prepares only once the Adopt begun as it opened has ended: the adopt may find the tenant
// running, or clear away what an earlier activator left (the kvm backing kills a standby QEMU it finds),
// which a preparation begun alongside would race.
func TestPrepareAfterAdopt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var running, most atomic.Int32
		release, unblock := make(chan struct{}), make(chan struct{})
		close(release)
		b := &adoptingPreparer{preparingBackend: preparingBackend{running: &running, most: &most, release: release}, unblock: unblock}
		s := newPrepareServer(routeProvider{"app": b})
		if err := s.Apply(&registry.Config{Routes: []*registry.Route{testRoute("app")}}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := b.prepares.Load(); got != 0 {
			t.Fatalf("prepared %d times while the Adopt runs, want 0", got)
		}
		close(unblock)
		synctest.Wait()
		if got := b.prepares.Load(); got != 1 || b.early.Load() {
			t.Fatalf("prepared %d times after the Adopt (one before it ended: %v), want once, after", got, b.early.Load())
		}
		if err := s.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}
