package activator

// The activator's shutdown (Server.Drain and Server.Shutdown), in a synctest bubble: what a request
// gets while the activator drains, when held requests are answered, and when each route's backend is
// closed.

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/activator/activator/internal/health"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
	"github.com/activator/activator/internal/testenv"
)

// closingBackend is a fakeBackend with the Closer ability, like the exec backing: Close ends a running
// tenant's Life. It records when Close ran and the deadline it was given.
type closingBackend struct {
	fakeBackend
	closes atomic.Int32

	closeMu       sync.Mutex // guards the fields below
	closedAt      time.Time
	closeDeadline time.Time
}

func (b *closingBackend) Close(ctx context.Context) error {
	b.closes.Add(1)
	d, _ := ctx.Deadline()
	b.closeMu.Lock()
	b.closedAt, b.closeDeadline = time.Now(), d
	b.closeMu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.life != nil {
		b.life.End(errors.New("closed"))
		b.life = nil
	}
	return nil
}

func (b *closingBackend) closed() (at, deadline time.Time) {
	b.closeMu.Lock()
	defer b.closeMu.Unlock()
	return b.closedAt, b.closeDeadline
}

var _ tenant.Closer = (*closingBackend)(nil)

// routeProvider opens each route's own backend.
type routeProvider map[string]tenant.Backend

func (p routeProvider) Open(r *registry.Route) (tenant.Backend, error) { return p[r.Name], nil }

// newShutdownServer builds a Server over one route per backend (named by the map's keys). Shutdown is
// the test's to call; cleanup calls it again (a no-op by then).
func newShutdownServer(t *testing.T, backends map[string]tenant.Backend) *Server {
	t.Helper()
	s := New(Options{
		Opener:  routeProvider(backends),
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		NewGate: func(*registry.Route) Gate { return passGate{} },
	})
	cfg := &registry.Config{}
	for name := range backends {
		cfg.Routes = append(cfg.Routes, testRoute(name))
	}
	if err := s.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s
}

// wakeUp wakes in with one request and lets it go, leaving the instance awake with nothing in flight.
func wakeUp(t *testing.T, in *instance) {
	t.Helper()
	rel, err := in.acquire(context.Background(), triggerRequest)
	if err != nil {
		t.Fatalf("waking %s: %v", in.route.Name, err)
	}
	rel()
}

// TestDrainRefusesWakesAndServesAwake: once the activator drains, a request to an awake route still goes
// through, and one to a sleeping route gets 503 with Retry-After at once and wakes nothing.
func TestDrainRefusesWakesAndServesAwake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up, down := &closingBackend{}, &closingBackend{}
		s := newShutdownServer(t, map[string]tenant.Backend{"up": up, "down": down})
		wakeUp(t, s.instance("up"))
		rel, err := s.instance("up").acquire(context.Background(), triggerRequest) // in flight across the drain
		if err != nil {
			t.Fatal(err)
		}

		s.Drain()
		again, err := s.instance("up").acquire(context.Background(), triggerRequest)
		if err != nil {
			t.Fatalf("request to the awake route while draining: %v, want it served", err)
		}
		again()
		_, err = s.instance("down").acquire(context.Background(), triggerRequest)
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("request to the sleeping route while draining: %v, want ErrClosed", err)
		}
		if code, retry := statusFor(err); code != 503 || retry <= 0 {
			t.Errorf("while draining a wake is answered %d with Retry-After %v, want 503 with a Retry-After", code, retry)
		}
		s.instance("down").kick() // an admin wake without waiting: refused as well
		if got := down.wakes.Load(); got != 0 {
			t.Errorf("the sleeping route was woken %d times while draining, want 0", got)
		}
		if err := s.Apply(&registry.Config{Routes: []*registry.Route{testRoute("up")}}); !errors.Is(err, ErrClosed) {
			t.Errorf("Apply while draining: %v, want ErrClosed", err)
		}
		rel()
	})
}

// TestShutdownAnswersHeldAtTheReserve: requests held on a wake that does not end keep waiting while
// there is time for it, and get ErrClosed (503, Retry-After) when only the reserve of the shutdown's
// time is left; the wake is canceled, the backend closed, and Shutdown returns within its deadline.
func TestShutdownAnswersHeldAtTheReserve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &closingBackend{fakeBackend: fakeBackend{wakeGate: make(chan struct{})}} // the wake never ends
		s := newShutdownServer(t, map[string]tenant.Backend{"slow": b})
		in := s.instance("slow")
		const n = 20
		type answer struct {
			err error
			at  time.Time
		}
		answers := make(chan answer, n)
		for range n {
			go func() {
				_, err := in.acquire(context.Background(), triggerRequest)
				answers <- answer{err, time.Now()}
			}()
		}
		synctest.Wait()
		if got := in.status().Held; got != n {
			t.Fatalf("held = %d, want %d", got, n)
		}

		const grace = 5 * time.Second
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		shut := make(chan error, 1)
		go func() { shut <- s.Shutdown(ctx) }()
		time.Sleep(grace - answerReserve(grace) - time.Millisecond)
		synctest.Wait()
		if got := in.status().Held; got != n || len(answers) != 0 {
			t.Fatalf("just before the reserve: held %d, answered %d; want all %d still waiting for the wake", got, len(answers), n)
		}
		for range n {
			a := <-answers
			if !errors.Is(a.err, ErrClosed) {
				t.Errorf("held request answered %v, want ErrClosed", a.err)
			}
			if at := a.at.Sub(start); at != grace-answerReserve(grace) {
				t.Errorf("held request answered after %v, want %v (the grace less its reserve)", at, grace-answerReserve(grace))
			}
		}
		if err := <-shut; err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if took := time.Since(start); took > grace {
			t.Errorf("Shutdown took %v, longer than its %v", took, grace)
		}
		if b.closes.Load() != 1 {
			t.Errorf("backend closed %d times, want once", b.closes.Load())
		}
	})
}

// TestShutdownLetsAWakeFinish: a wake that ends inside the grace releases its held requests to the
// tenant; the route is closed once they are done, without waiting for the reserve.
func TestShutdownLetsAWakeFinish(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &closingBackend{fakeBackend: fakeBackend{wakeGate: make(chan struct{})}}
		s := newShutdownServer(t, map[string]tenant.Backend{"app": b})
		in := s.instance("app")
		errs := make(chan error, 5)
		for range 5 {
			go func() {
				rel, err := in.acquire(context.Background(), triggerRequest)
				if err == nil {
					time.Sleep(time.Second) // the proxied exchange
					rel()
				}
				errs <- err
			}()
		}
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start := time.Now()
		shut := make(chan error, 1)
		go func() { shut <- s.Shutdown(ctx) }()
		time.Sleep(2 * time.Second)
		close(b.wakeGate) // the wake ends 2s into the shutdown
		for range 5 {
			if err := <-errs; err != nil {
				t.Errorf("held request: %v, want it served by the wake that finished in time", err)
			}
		}
		if err := <-shut; err != nil {
			t.Fatal(err)
		}
		closedAt, _ := b.closed()
		if got := closedAt.Sub(start); got != 3*time.Second {
			t.Errorf("backend closed %v into the shutdown, want 3s: when the released requests were done", got)
		}
	})
}

// TestShutdownDrainsInFlightThenCloses: a route's backend is closed only when its last request in flight
// is done, with the shutdown's deadline; a route with nothing to do is closed at once; and nothing is
// put to sleep: what shutdown means for a tenant is its backend's Close.
func TestShutdownDrainsInFlightThenCloses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		busy, idle := &closingBackend{}, &closingBackend{}
		s := newShutdownServer(t, map[string]tenant.Backend{"busy": busy, "idle": idle})
		wakeUp(t, s.instance("busy"))
		wakeUp(t, s.instance("idle"))
		rel, err := s.instance("busy").acquire(context.Background(), triggerRequest)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		deadline, _ := ctx.Deadline()
		shut := make(chan error, 1)
		go func() { shut <- s.Shutdown(ctx) }()
		synctest.Wait()
		if idle.closes.Load() != 1 {
			t.Errorf("the idle route's backend was not closed at once")
		}
		if busy.closes.Load() != 0 {
			t.Fatalf("the busy route's backend was closed with a request in flight")
		}
		time.Sleep(10 * time.Second)
		rel()
		if err := <-shut; err != nil {
			t.Fatal(err)
		}
		closedAt, closeDeadline := busy.closed()
		if got := closedAt.Sub(start); got != 10*time.Second {
			t.Errorf("busy backend closed %v into the shutdown, want 10s: when its request was done", got)
		}
		if closeDeadline.IsZero() || closeDeadline.After(deadline) {
			t.Errorf("Close got deadline %v, want one no later than the shutdown's %v", closeDeadline, deadline)
		}
		if n := busy.sleeps.Load() + idle.sleeps.Load(); n != 0 {
			t.Errorf("shutdown called Sleep %d times, want none (Close decides)", n)
		}
	})
}

// TestShutdownCutsInFlightAtTheReserve: a request still in flight when only the reserve is left does not
// keep its route open: the backend is closed then, and Shutdown returns although the request goes on.
func TestShutdownCutsInFlightAtTheReserve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &closingBackend{}
		s := newShutdownServer(t, map[string]tenant.Backend{"app": b})
		in := s.instance("app")
		wakeUp(t, in)
		rel, err := in.acquire(context.Background(), triggerRequest)
		if err != nil {
			t.Fatal(err)
		}
		defer rel()
		const grace = 20 * time.Second
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		closedAt, _ := b.closed()
		if got, want := closedAt.Sub(start), grace-answerReserve(grace); got != want {
			t.Errorf("backend closed %v into the shutdown, want %v", got, want)
		}
		if st := in.status(); st.InFlight != 1 {
			t.Errorf("in flight after Shutdown: %d, want the 1 request still going", st.InFlight)
		}
	})
}

// TestDrainAnswersRequestsHeldBehindAStop: a request held while the tenant is being stopped would need a
// new wake after the stop; once the activator drains none will start, so it is answered at once.
func TestDrainAnswersRequestsHeldBehindAStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &closingBackend{fakeBackend: fakeBackend{sleepGte: make(chan struct{})}}
		s := newShutdownServer(t, map[string]tenant.Backend{"app": b})
		in := s.instance("app")
		wakeUp(t, in)
		slept := make(chan error, 1)
		go func() { slept <- in.sleepNow(context.Background(), ReasonAdmin) }()
		synctest.Wait()
		held := make(chan error, 1)
		go func() {
			_, err := in.acquire(context.Background(), triggerRequest)
			held <- err
		}()
		synctest.Wait()
		if st := in.status(); st.State != "stopping" || st.Held != 1 {
			t.Fatalf("status %s held %d, want stopping with 1 held", st.State, st.Held)
		}
		s.Drain()
		synctest.Wait()
		select {
		case err := <-held:
			if !errors.Is(err, ErrClosed) {
				t.Errorf("request held behind the stop: %v, want ErrClosed", err)
			}
		default:
			t.Fatal("the request held behind a stop was not answered when the drain began")
		}
		close(b.sleepGte)
		if err := <-slept; err != nil {
			t.Fatal(err)
		}
		if got := b.wakes.Load(); got != 1 {
			t.Errorf("wakes = %d, want 1 (none after the stop)", got)
		}
	})
}

// goneGate passes never: it waits, as the real prober does, until the tenant is gone or ctx ends.
type goneGate struct{}

func (goneGate) Wait(ctx context.Context, gone <-chan struct{}) error {
	select {
	case <-gone:
		return health.ErrGone
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestShutdownCancelsTheWakeItCutsOff: a wake the shutdown cuts off (at its grace's reserve) is
// recorded as cancelled by the shutdown, and logged so, not as a failed wake: found with the real
// binary, where every restart that met a slow wake logged "wake failed" at WARN with the gate's last
// "connection refused" and counted a failure to alert on.
func TestShutdownCancelsTheWakeItCutsOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &closingBackend{}
		var logs testenv.SyncBuffer
		s := New(Options{Opener: routeProvider(map[string]tenant.Backend{"slow": b}), Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			NewGate: func(*registry.Route) Gate { return goneGate{} }})
		if err := s.Apply(&registry.Config{Routes: []*registry.Route{testRoute("slow")}}); err != nil {
			t.Fatal(err)
		}
		in := s.instance("slow")
		held := request(in)
		synctest.Wait() // in its gate, which never passes
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if err := <-held; !errors.Is(err, ErrClosed) {
			t.Errorf("the held request: %v, want ErrClosed", err)
		}
		rec := in.hist.last(1)
		if len(rec) != 1 || rec[0].Wake == nil || rec[0].Wake.Outcome != OutcomeCancelled || rec[0].Wake.CancelledBy != CancelShutdown {
			t.Errorf("the cut-off wake's record %+v, want outcome cancelled by the shutdown", rec)
		}
		if out := logs.String(); strings.Contains(out, `msg="wake failed"`) || !strings.Contains(out, `msg="wake cancelled by the shutdown"`) {
			t.Errorf("the log says:\n%s\nwant the wake cancelled by the shutdown, not failed", out)
		}
	})
}
