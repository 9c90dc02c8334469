package activator

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/activator/activator/internal/health"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// fakeBackend is a hand-written Backend for state-machine tests. Its Wake and Sleep can be made to
// block until released, fail, or succeed.
type fakeBackend struct {
	wakes      atomic.Int32
	sleeps     atomic.Int32
	lastSleeps atomic.Int32 // the sleeps marked tenant.LastSleep
	byOperator atomic.Int32 // the wakes and sleeps marked tenant.ByOperator

	mu       sync.Mutex // guards the fields below
	life     *tenant.Life
	wakeErr  error
	wakeGate chan struct{} // when non-nil, Wake blocks until it is closed
	sleepGte chan struct{} // when non-nil, Sleep blocks until it is closed
	sleepErr error         // when non-nil, Sleep fails with it and the tenant keeps running
	sleepSay []string      // notes each Sleep makes (tenant.NoteSleep)
	forceSay bool          // sleepSay's notes are forced ones (tenant.NoteForcedSleep)
}

func (f *fakeBackend) Wake(ctx context.Context, t tenant.Tracker) (*tenant.Life, error) {
	f.wakes.Add(1)
	if tenant.IsByOperator(ctx) {
		f.byOperator.Add(1)
	}
	t.Phase("spawn")
	f.mu.Lock()
	gate, err := f.wakeGate, f.wakeErr
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.life == nil || f.life.Err() != nil {
		f.life = tenant.NewLife()
	}
	return f.life, nil
}

func (f *fakeBackend) Sleep(ctx context.Context) error {
	f.sleeps.Add(1)
	if tenant.IsLastSleep(ctx) {
		f.lastSleeps.Add(1)
	}
	if tenant.IsByOperator(ctx) {
		f.byOperator.Add(1)
	}
	f.mu.Lock()
	gate := f.sleepGte
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, n := range f.sleepSay {
		if f.forceSay {
			tenant.NoteForcedSleep(ctx, n)
		} else {
			tenant.NoteSleep(ctx, n)
		}
	}
	if f.sleepErr != nil {
		return f.sleepErr
	}
	if f.life != nil {
		f.life.End(tenant.ErrSlept)
		f.life = nil
	}
	return nil
}

func (f *fakeBackend) set(fn func(f *fakeBackend)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// passGate is a health gate that passes at once unless the tenant is gone.
type passGate struct{ err error }

func (g passGate) Wait(ctx context.Context, gone <-chan struct{}) error {
	select {
	case <-gone:
		return health.ErrGone
	default:
	}
	return g.err
}

type fakeProvider struct{ b *fakeBackend }

func (p fakeProvider) Open(*registry.Route) (tenant.Backend, error) { return p.b, nil }

func testRoute(name string) *registry.Route {
	return &registry.Route{
		Name: name, Hosts: []string{name + ".test"}, Backing: "fake",
		Upstream: registry.Upstream{Network: "tcp", Address: "127.0.0.1:1"},
		Idle:     time.Minute, ResponseTimeout: registry.DefaultResponseTimeout,
		WakeBudget: 30 * time.Second, SleepBudget: 10 * time.Second,
		Hold:    registry.Hold{MaxRequests: 1000, MaxTime: 30 * time.Second},
		Backoff: registry.Backoff{Initial: 5 * time.Second, Max: time.Minute},
		Health:  registry.Health{Path: "/", MinStatus: 200, MaxStatus: 399, Interval: time.Second, Timeout: time.Second, Passes: 1},
	}
}

// newTestServer builds a Server over one fake route and registers shutdown.
func newTestServer(t *testing.T, b *fakeBackend, gate Gate, mut ...func(*registry.Route)) (*Server, *instance) {
	t.Helper()
	r := testRoute("app")
	for _, m := range mut {
		m(r)
	}
	s := New(Options{
		Opener:  fakeProvider{b},
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		NewGate: func(*registry.Route) Gate { return gate },
	})
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{r}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s, s.instance("app")
}

func TestHerdWakesOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{wakeGate: make(chan struct{})}
		_, in := newTestServer(t, b, passGate{})
		const n = 200
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rel, err := in.acquire(context.Background(), triggerRequest)
				if err != nil {
					errs <- err
					return
				}
				rel()
			}()
		}
		synctest.Wait()
		if got := in.status().Held; got != n {
			t.Fatalf("held = %d, want %d", got, n)
		}
		close(b.wakeGate)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("acquire: %v", err)
		}
		if got := b.wakes.Load(); got != 1 {
			t.Fatalf("backend woken %d times, want 1", got)
		}
		st := in.status()
		if st.State != "awake" || st.LastWake == nil || st.LastWake.Joined != n-1 {
			t.Fatalf("status = %+v, want awake with %d joined", st, n-1)
		}
		// Every held request was let go by this wake; in the bubble no time passes doing it.
		if st.LastWake.Released != n || st.LastWake.ReleaseSpread != 0 {
			t.Fatalf("last wake released %d in %v, want %d in 0s", st.LastWake.Released, st.LastWake.ReleaseSpread, n)
		}
	})
}

func TestFailedWakeAnswersAllThenBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{wakeGate: make(chan struct{}), wakeErr: errors.New("exited with code 3: boom")}
		_, in := newTestServer(t, b, passGate{})
		errs := make(chan error, 10)
		for i := 0; i < 10; i++ {
			go func() {
				_, err := in.acquire(context.Background(), triggerRequest)
				errs <- err
			}()
		}
		synctest.Wait()
		close(b.wakeGate)
		for i := 0; i < 10; i++ {
			err := <-errs
			var we *WakeError
			if !errors.As(err, &we) || we.Phase != "spawn" || !strings.Contains(err.Error(), "code 3") {
				t.Fatalf("err = %v, want a WakeError in phase spawn naming code 3", err)
			}
		}
		// During the backoff: refused at once with the time left, and no new wake.
		time.Sleep(2 * time.Second)
		_, err := in.acquire(context.Background(), triggerRequest)
		var be *BackoffError
		if !errors.As(err, &be) || be.RetryAfter != 3*time.Second {
			t.Fatalf("err = %v, want BackoffError with 3s left", err)
		}
		if code, retry := statusFor(err); code != 503 || retry != 3*time.Second {
			t.Fatalf("status = %d retry %v, want 503 and 3s", code, retry)
		}
		// After the backoff the next request wakes again.
		time.Sleep(3 * time.Second)
		b.set(func(f *fakeBackend) { f.wakeErr = nil; f.wakeGate = nil })
		rel, err := in.acquire(context.Background(), triggerRequest)
		if err != nil {
			t.Fatalf("acquire after backoff: %v", err)
		}
		rel()
		if got := b.wakes.Load(); got != 2 {
			t.Fatalf("wakes = %d, want 2", got)
		}
	})
}

func TestUnhealthyTenantIsStopped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{}
		_, in := newTestServer(t, b, passGate{err: errors.New("health gate did not pass")})
		_, err := in.acquire(context.Background(), triggerRequest)
		var we *WakeError
		if !errors.As(err, &we) || we.Phase != tenant.PhaseHealth {
			t.Fatalf("err = %v, want WakeError in phase health", err)
		}
		if b.sleeps.Load() != 1 {
			t.Fatalf("sleeps = %d, want 1: an unhealthy tenant must be stopped", b.sleeps.Load())
		}
		// The stop is its own phase after the failed one, so the health phase shows the gate's time.
		in.mu.Lock()
		rec := *in.lastRec
		in.mu.Unlock()
		var names []string
		for _, p := range rec.Phases {
			names = append(names, p.Name)
		}
		if got := strings.Join(names, " "); got != "spawn health stop" || rec.FailedPhase != tenant.PhaseHealth {
			t.Errorf("record phases %q, failed phase %q; want \"spawn health stop\", failed in health", got, rec.FailedPhase)
		}
	})
}

func TestIdleSleepAndRequestDuringStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{}
		_, in := newTestServer(t, b, passGate{})
		rel, err := in.acquire(context.Background(), triggerRequest)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Minute) // in flight: the idle clock has not started
		if b.sleeps.Load() != 0 {
			t.Fatal("slept with a request in flight")
		}
		b.set(func(f *fakeBackend) { f.sleepGte = make(chan struct{}) })
		rel()
		time.Sleep(time.Minute + time.Millisecond)
		synctest.Wait()
		if st := in.status().State; st != "stopping" {
			t.Fatalf("state = %s, want stopping", st)
		}
		got := request(in)
		synctest.Wait()
		select {
		case err := <-got:
			t.Fatalf("request during stop answered before the stop finished: %v", err)
		default:
		}
		close(b.sleepGte)
		if err := <-got; err != nil {
			t.Fatalf("request during stop: %v", err)
		}
		if b.wakes.Load() != 2 {
			t.Fatalf("wakes = %d, want 2 (re-wake after the stop)", b.wakes.Load())
		}
	})
}

func TestClientHangUpDoesNotCancelWake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{wakeGate: make(chan struct{})}
		_, in := newTestServer(t, b, passGate{})
		ctx, cancel := context.WithCancel(context.Background())
		first := make(chan error, 1)
		go func() { _, err := in.acquire(ctx, triggerRequest); first <- err }()
		second := request(in)
		synctest.Wait()
		cancel()
		if err := <-first; !errors.Is(err, context.Canceled) {
			t.Fatalf("first = %v, want canceled", err)
		}
		close(b.wakeGate)
		if err := <-second; err != nil {
			t.Fatalf("second waiter failed after the first hung up: %v", err)
		}
	})
}

func TestTenantExitNoticed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{}
		_, in := newTestServer(t, b, passGate{})
		rel, err := in.acquire(context.Background(), triggerRequest)
		if err != nil {
			t.Fatal(err)
		}
		rel()
		b.mu.Lock()
		b.life.End(errors.New("exited with code 1"))
		b.mu.Unlock()
		synctest.Wait()
		if st := in.status(); st.State != "asleep" || st.LastSleep != ReasonExited {
			t.Fatalf("status = %s/%s, want asleep/exited", st.State, st.LastSleep)
		}
		rel, err = in.acquire(context.Background(), triggerRequest)
		if err != nil {
			t.Fatal(err)
		}
		rel()
		if b.wakes.Load() != 2 {
			t.Fatalf("wakes = %d, want 2", b.wakes.Load())
		}
	})
}

func TestHoldLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{wakeGate: make(chan struct{})}
		_, in := newTestServer(t, b, passGate{}, func(r *registry.Route) {
			r.Hold = registry.Hold{MaxRequests: 2, MaxTime: 10 * time.Second}
		})
		errs := make(chan error, 2)
		for i := 0; i < 2; i++ {
			go func() { _, err := in.acquire(context.Background(), triggerRequest); errs <- err }()
		}
		synctest.Wait()
		if _, err := in.acquire(context.Background(), triggerRequest); !errors.Is(err, ErrHoldFull) {
			t.Fatalf("third request: %v, want ErrHoldFull", err)
		}
		time.Sleep(10 * time.Second)
		for i := 0; i < 2; i++ {
			if err := <-errs; !errors.Is(err, ErrHoldTimeout) {
				t.Fatalf("held request: %v, want ErrHoldTimeout", err)
			}
		}
		if code, _ := statusFor(ErrHoldTimeout); code != http.StatusGatewayTimeout {
			t.Fatalf("hold timeout maps to %d, want 504", code)
		}
		close(b.wakeGate)
	})
}

func TestReloadKeepsHeldRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{wakeGate: make(chan struct{})}
		s, old := newTestServer(t, b, passGate{})
		got := request(old)
		synctest.Wait()
		// Change the route: the held request stays with the old instance, which serves it and retires.
		r := testRoute("app")
		r.WakeBudget += time.Second // a change of the tenant's own (an edge-only one hands the tenant over: TestReloadHandsTheTenantOver)
		if err := s.Apply(&registry.Config{Routes: []*registry.Route{r}}); err != nil {
			t.Fatal(err)
		}
		close(b.wakeGate)
		if err := <-got; err != nil {
			t.Fatalf("held request across reload: %v", err)
		}
		synctest.Wait()
		select {
		case <-old.retired:
		default:
			t.Fatal("old instance did not retire after its last request")
		}
		if b.sleeps.Load() != 1 {
			t.Fatalf("sleeps = %d, want 1 (old instance put its tenant to sleep)", b.sleeps.Load())
		}
		// The new instance wakes the tenant for the next request.
		rel, err := s.instance("app").acquire(context.Background(), triggerRequest)
		if err != nil {
			t.Fatal(err)
		}
		rel()
	})
}

// TestRetiringInstanceStartsNoWake: a request held behind a stop when a reload replaces its route
// leaves the old instance once the stop is over (errRetired, which the edge answers through the
// route's new instance: Server.acquireRouted) instead of making the retiring instance wake the tenant
// again. Measured on c83ea00 with the real binary: a reload of 100,000 changed routes woke and slept
// a warm route's tenant six times over through its retiring instances, and two requests got 503.
func TestRetiringInstanceStartsNoWake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, old, b, finish := stopping(t)
		held := request(old)
		synctest.Wait() // held behind the stop
		applyChanged(t, s)
		finish()
		if err := <-held; !errors.Is(err, errRetired) {
			t.Errorf("the request held behind the replaced instance's stop: %v, want errRetired", err)
		}
		synctest.Wait()
		if n := b.wakes.Load(); n != 1 {
			t.Errorf("wakes = %d, want 1: the retiring instance woke the tenant again", n)
		}
		select {
		case <-old.retired:
		default:
			t.Error("the old instance did not retire once its held request left")
		}
		// A request that reaches the old instance now, having looked the route up before the reload,
		// gets errRetired at once.
		if err := <-request(old); !errors.Is(err, errRetired) {
			t.Errorf("a request to the retired instance: %v, want errRetired", err)
		}
	})
}

func TestEdgeErrors(t *testing.T) {
	b := &fakeBackend{wakeErr: errors.New("exited with code 3: no config")}
	s, _ := newTestServer(t, b, passGate{})
	for _, tc := range []struct {
		host, accept string
		code         int
		want         string
	}{
		{"unknown.test", "", 404, "no route"},
		{"app.test", "application/json", 503, `"phase": "spawn"`},
		{"app.test", "text/html", 503, "wake failed in phase spawn"},
		{"APP.test:8080", "", 503, "backoff"},
	} {
		req := httptest.NewRequest("GET", "http://"+tc.host+"/", nil)
		req.Header.Set("Accept", tc.accept)
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		if w.Code != tc.code {
			t.Errorf("%s: code %d, want %d (body %q)", tc.host, w.Code, tc.code, w.Body)
		}
		if tc.code == 503 && w.Header().Get("Retry-After") == "" {
			t.Errorf("%s: 503 without Retry-After", tc.host)
		}
		body := strings.ReplaceAll(w.Body.String(), `":"`, `": "`)
		if tc.want == "backoff" {
			tc.want = "next attempt in"
		}
		if !strings.Contains(body, tc.want) {
			t.Errorf("%s: body %q does not contain %q", tc.host, body, tc.want)
		}
	}
	if b.wakes.Load() != 1 {
		t.Fatalf("wakes = %d, want 1 (unknown host wakes nothing; backoff refuses)", b.wakes.Load())
	}
}

func TestLookup(t *testing.T) {
	cfg := &registry.Config{}
	ins := map[string]*instance{}
	for _, r := range []struct{ name, host, prefix string }{
		{"exact", "a.example.com", ""},
		{"api", "a.example.com", "/api"},
		{"wild", "*.example.com", ""},
		{"deep", "*.b.example.com", ""},
	} {
		rt := testRoute(r.name)
		rt.Hosts, rt.PathPrefix = []string{r.host}, r.prefix
		cfg.Routes = append(cfg.Routes, rt)
		ins[r.name] = &instance{route: rt}
	}
	tb := buildTable(cfg, ins)
	for _, tc := range []struct{ host, path, want string }{
		{"a.example.com", "/", "exact"},
		{"A.Example.com:80", "/api/x", "api"},
		{"a.example.com", "/apix", "exact"},
		{"z.example.com", "/", "wild"},
		{"x.b.example.com", "/", "deep"},
		{"example.com", "/", ""},
		{"other.org", "/", ""},
	} {
		got := ""
		if rt := tb.lookup(tc.host, tc.path); rt != nil {
			got = rt.in.route.Name
		}
		if got != tc.want {
			t.Errorf("lookup(%q, %q) = %q, want %q", tc.host, tc.path, got, tc.want)
		}
	}
}

// stopperBackend parks on Sleep (like freeze or pause) and really stops on Stop.
type stopperBackend struct {
	fakeBackend
	stops    atomic.Int32
	stopLeft atomic.Int64 // the time the last Stop's ctx had left, as a time.Duration
}

func (s *stopperBackend) Stop(ctx context.Context) error {
	s.stops.Add(1)
	if d, ok := ctx.Deadline(); ok {
		s.stopLeft.Store(int64(time.Until(d)))
	}
	return s.fakeBackend.Sleep(ctx)
}

func TestUnhealthyTenantIsStoppedNotParked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &stopperBackend{}
		r := testRoute("app")
		s := New(Options{
			Opener:  stopperProvider{b},
			Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
			NewGate: func(*registry.Route) Gate { return passGate{err: errors.New("status 500")} },
		})
		if err := s.Apply(&registry.Config{Routes: []*registry.Route{r}}); err != nil {
			t.Fatal(err)
		}
		defer s.Shutdown(context.Background())
		if _, err := s.instance("app").acquire(context.Background(), triggerRequest); err == nil {
			t.Fatal("acquire succeeded through a failing gate")
		}
		if got, slept := b.stops.Load(), b.sleeps.Load(); got != 1 || slept != 1 {
			t.Fatalf("Stop called %d times (Sleep %d, via Stop), want exactly one Stop", got, slept)
		}
	})
}

type stopperProvider struct{ b *stopperBackend }

func (p stopperProvider) Open(*registry.Route) (tenant.Backend, error) { return p.b, nil }

// request runs one request's acquire and release in its own goroutine; the channel gets its error.
func request(in *instance) <-chan error {
	got := make(chan error, 1)
	go func() {
		rel, err := in.acquire(context.Background(), triggerRequest)
		if err == nil {
			rel()
		}
		got <- err
	}()
	return got
}

// TestAdmitQueuesInOrder: at most max_upstream_conns requests are admitted to the proxy; the others wait
// in arrival order, and a waiter whose client leaves gives up without taking a slot.
func TestAdmitQueuesInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, in := newTestServer(t, &fakeBackend{}, passGate{}, func(r *registry.Route) { r.MaxUpstreamConns = 2 })
		ctx := context.Background()
		d1, err := in.admit(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		d2, err := in.admit(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		order := make(chan int, 3)
		for i := 1; i <= 3; i++ {
			go func() {
				done, err := in.admit(ctx, nil)
				if err != nil {
					t.Errorf("waiter %d: %v", i, err)
					return
				}
				order <- i
				done()
			}()
			synctest.Wait() // queue them in a known order
		}
		gone, cancel := context.WithCancel(ctx)
		left := make(chan error, 1)
		go func() {
			_, err := in.admit(gone, nil)
			left <- err
		}()
		synctest.Wait()
		if len(order) != 0 {
			t.Fatalf("%d waiters admitted while both slots were taken", len(order))
		}
		cancel()
		if err := <-left; !errors.Is(err, context.Canceled) {
			t.Fatalf("a waiter whose client left got %v, want context.Canceled", err)
		}
		// One slot freed: the waiters pass it on one by one, so the order they report is the order
		// they were admitted in.
		d1()
		for want := 1; want <= 3; want++ {
			if got := <-order; got != want {
				t.Fatalf("admitted waiter %d, want %d (arrival order)", got, want)
			}
		}
		d2()
	})
}

// TestLateGateNoted: a gate that passes on the answer to a probe its timeout had cut says so in the
// wake's record, naming health.timeout, so that the operator sees the timeout is shorter than the
// tenant's first answer. The tenant answers its first probe once a second one has come, and no other.
func TestLateGateNoted(t *testing.T) {
	var hits atomic.Int64
	second, hang := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch hits.Add(1) {
		case 1:
			<-second
		case 2:
			close(second)
			<-hang
		default:
			<-hang
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(hang) }) // before the server's Close, which waits for its handlers
	r := testRoute("app")
	r.Upstream.Address = srv.Listener.Addr().String()
	r.Health.Timeout = 20 * time.Millisecond
	r.Health.Interval = 5 * time.Millisecond
	_, in := newTestServer(t, &fakeBackend{}, health.New(r.Upstream, r.Health), func(rt *registry.Route) { *rt = *r })
	rel, err := in.acquire(context.Background(), triggerRequest)
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	rel()
	st := in.status()
	if st.LastWake == nil || !slices.ContainsFunc(st.LastWake.Notes, func(n string) bool { return strings.Contains(n, "health.timeout (20ms) had cut") }) {
		t.Fatalf("the wake's record %+v does not say the gate passed on a late answer", st.LastWake)
	}
}

// TestHoldLimitBehindAStop: requests that arrive while the tenant stops count against
// hold.max_requests as those held for a wake do. Before, a request behind a stop was held before the
// cap was looked at, so a herd arriving during a stop was held past it.
func TestHoldLimitBehindAStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{}
		_, in := newTestServer(t, b, passGate{}, func(r *registry.Route) {
			r.Hold = registry.Hold{MaxRequests: 2, MaxTime: 10 * time.Minute}
		})
		rel, err := in.acquire(context.Background(), triggerRequest)
		if err != nil {
			t.Fatal(err)
		}
		b.set(func(f *fakeBackend) { f.sleepGte = make(chan struct{}) })
		rel()
		time.Sleep(time.Minute + time.Millisecond)
		synctest.Wait()
		if st := in.status().State; st != "stopping" {
			t.Fatalf("state = %s, want stopping", st)
		}
		first, second := request(in), request(in)
		synctest.Wait()
		if _, err := in.acquire(context.Background(), triggerRequest); !errors.Is(err, ErrHoldFull) {
			t.Fatalf("a third request behind the stop: %v, want ErrHoldFull", err)
		}
		close(b.sleepGte)
		for _, got := range []<-chan error{first, second} {
			if err := <-got; err != nil {
				t.Fatalf("a request held behind the stop: %v", err)
			}
		}
	})
}
