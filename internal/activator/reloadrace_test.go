package activator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/activator/activator/internal/registry"
)

// TestReloadUnderLoadServesEveryRequest: a warm route's requests go on being answered 200 through
// reloads that change every route, and its tenant is woken once per instance, never again by an
// instance being retired. Measured on c83ea00 with the real binary and 100,000 routes: during one such
// reload the retiring instance woke and slept the tenant six times over and two requests got 503,
// because Apply retired the old instances before it published the new table (building it takes
// hundreds of milliseconds at that size) and a retiring instance started wakes of its own.
//
// 20,000 routes make Apply long enough for the requests of one client in a loop to land in what was
// that window. No timing is asserted: only the answers and the count of wakes.
func TestReloadUnderLoadServesEveryRequest(t *testing.T) {
	if testing.Short() {
		t.Skip("20,000 routes reloaded six times")
	}
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	t.Cleanup(app.Close)
	config := func(idle time.Duration) *registry.Config {
		routes := make([]*registry.Route, 0, 20000)
		for i := range cap(routes) - 1 {
			r := testRoute(fmt.Sprintf("f%d", i))
			r.Idle = idle
			routes = append(routes, r)
		}
		r := testRoute("app")
		r.Upstream.Address, r.Idle = app.Listener.Addr().String(), idle
		return &registry.Config{Routes: append(routes, r)}
	}
	b := &fakeBackend{}
	s := New(Options{
		Opener:  fakeProvider{b},
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		NewGate: func(*registry.Route) Gate { return passGate{} },
	})
	if err := s.Apply(config(time.Hour)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })

	get := func() int {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://app.test/", nil))
		return w.Code
	}
	if code := get(); code != http.StatusOK {
		t.Fatalf("first request: %d", code)
	}
	stop := make(chan struct{})
	var (
		wg    sync.WaitGroup
		codes = map[int]int{}
		n     int
	)
	wg.Go(func() {
		for n = 0; n < 1_000_000; n++ { // bounded; ends when the reloads are done
			select {
			case <-stop:
				return
			default:
			}
			codes[get()]++
		}
	})
	const reloads = 6
	for i := range reloads {
		if err := s.Apply(config(time.Hour + time.Duration(i+1)*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if codes[http.StatusOK] != n {
		t.Errorf("answers during %d reloads: %v, want %d × 200", reloads, codes, n)
	}
	// One wake for the first instance, and at most one for each instance a reload made.
	if w := b.wakes.Load(); w > 1+reloads {
		t.Errorf("wakes = %d over %d instances: retiring instances woke the tenant again", w, 1+reloads)
	}
}

// stopping wakes a test server's route "app", then starts an admin sleep whose backend Sleep blocks:
// the route's instance (old) is Stopping when it returns. finish lets the sleep end, and checks it
// succeeded. For synctest bubbles.
func stopping(t *testing.T) (s *Server, old *instance, b *fakeBackend, finish func()) {
	t.Helper()
	b = &fakeBackend{}
	s, old = newTestServer(t, b, passGate{})
	if err := <-request(old); err != nil {
		t.Fatal(err)
	}
	b.set(func(f *fakeBackend) { f.sleepGte = make(chan struct{}) })
	slept := make(chan error, 1)
	go func() { slept <- s.Sleep(context.Background(), "app") }()
	synctest.Wait() // Stopping, its Sleep blocked
	return s, old, b, func() {
		t.Helper()
		b.set(func(f *fakeBackend) { close(f.sleepGte); f.sleepGte = nil })
		if err := <-slept; err != nil {
			t.Fatal(err)
		}
	}
}

// applyChanged reloads s with route "app" changed (its idle window): a new instance replaces the old.
func applyChanged(t *testing.T, s *Server, mut ...func(*registry.Route)) {
	t.Helper()
	r := testRoute("app")
	r.Idle = 2 * time.Minute
	for _, m := range mut {
		m(r)
	}
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{r}}); err != nil {
		t.Fatal(err)
	}
}

// TestRemovedRouteAnswersItsWaitingRequest: a request waiting for its route's tenant to finish
// stopping when a reload removes the route is answered 404, as the route's next request is, without
// a wake of the removed route's tenant (the edge's acquireRouted finds no route on its second look).
func TestRemovedRouteAnswersItsWaitingRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _, b, finish := stopping(t)
		answered := make(chan *httptest.ResponseRecorder, 1)
		go func() {
			w := httptest.NewRecorder()
			s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://app.test/", nil))
			answered <- w
		}()
		synctest.Wait() // held behind the stop
		if err := s.Apply(&registry.Config{Routes: []*registry.Route{testRoute("other")}}); err != nil {
			t.Fatal(err)
		}
		finish()
		if w := <-answered; w.Code != http.StatusNotFound {
			t.Errorf("the waiting request of a removed route: %d %q, want 404", w.Code, w.Body)
		}
		if n := b.wakes.Load(); n != 1 {
			t.Errorf("wakes = %d, want 1: the removed route's tenant was woken again", n)
		}
	})
}

// TestAdminWakeFollowsAReload: an admin wake that waits behind the route's stop when a reload replaces
// the route wakes the route's new instance, not the old one, and succeeds.
func TestAdminWakeFollowsAReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _, b, finish := stopping(t)
		woke := make(chan error, 1)
		go func() { woke <- s.Wake(context.Background(), "app") }()
		synctest.Wait() // the admin wake waits behind the stop
		applyChanged(t, s)
		finish()
		if err := <-woke; err != nil {
			t.Fatalf("admin wake across the reload: %v", err)
		}
		if st := s.instance("app").status(); st.State != "awake" {
			t.Errorf("the new instance is %s after the admin wake, want awake", st.State)
		}
		if n := b.wakes.Load(); n != 2 {
			t.Errorf("wakes = %d, want 2 (the first instance's, then the new one's)", n)
		}
	})
}

// TestReloadCutsRequestsThatOutlastTheGrace: a changed route's old instance finishes its in-flight
// requests for at most the reload's grace (the smaller of shutdown_grace and half the new route's
// hold.max_time), then sleeps under the ones still open (a WebSocket, an event stream), so that the
// new instance can wake. Measured on a53f3ac with the real binary: one WebSocket open across a reload
// that changed its route had every new request to the route held until hold.max_time and answered
// 504, for as long as the WebSocket stayed open.
func TestReloadCutsRequestsThatOutlastTheGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{}
		s, old := newTestServer(t, b, passGate{})
		long, err := old.acquire(context.Background(), triggerRequest) // a WebSocket, never closed by its client
		if err != nil {
			t.Fatal(err)
		}
		r := testRoute("app")       // hold.max_time 30s: the grace is 15s, half of it
		r.WakeBudget += time.Second // a change of the tenant's own (an edge-only one hands the tenant over: TestReloadHandsTheTenantOver)
		if err := s.Apply(&registry.Config{Routes: []*registry.Route{r}, ShutdownGrace: time.Minute}); err != nil {
			t.Fatal(err)
		}
		reloaded := time.Now() // synctest's clock
		held := request(s.instance("app"))
		time.Sleep(15*time.Second - time.Millisecond)
		synctest.Wait()
		if n := b.sleeps.Load(); n != 0 {
			t.Fatalf("sleeps = %d within the grace, want 0: the old instance cut its request early", n)
		}
		select {
		case err := <-held:
			t.Fatalf("the new instance's request ended within the grace: %v", err)
		default:
		}
		time.Sleep(time.Millisecond)
		if err := <-held; err != nil {
			t.Fatalf("the request held for the new instance: %v, want it served once the grace ended", err)
		}
		if took := time.Since(reloaded); took > 15*time.Second {
			t.Errorf("the request held for the new instance was served %v after the reload, want at the grace's end (15s)", took)
		}
		if n := b.sleeps.Load(); n != 1 {
			t.Errorf("sleeps = %d, want 1 (the old instance's, under its open request)", n)
		}
		// The new instance's wake says where its 15 s went.
		if rec := s.instance("app").status().LastWake; rec == nil || len(rec.Phases) == 0 || rec.Phases[0].Name != phasePredecessor ||
			rec.Phases[0].Duration < 15*time.Second-time.Millisecond {
			t.Errorf("the new instance's wake record %+v, want a first phase %q of 15s", rec, phasePredecessor)
		}
		long() // the cut request's handler returns at last
		synctest.Wait()
		select {
		case <-old.retired:
		default:
			t.Error("the old instance did not retire")
		}
	})
}

// TestIgnoredRequestFollowsAReload: a monitor's request (ignore:) that reaches an instance a reload
// has replaced is answered by the route's current instance: served when its tenant is awake.
func TestIgnoredRequestFollowsAReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{}
		s, old := newTestServer(t, b, passGate{}, withMonitorsIgnored)
		applyChanged(t, s, withMonitorsIgnored)
		synctest.Wait() // the old instance, asleep, has retired
		if err := <-request(s.instance("app")); err != nil {
			t.Fatal(err)
		}
		monitor := requestAs(http.MethodGet, "/", uptimeRobot)
		if _, err := old.acquireRequest(monitor, nil); !errors.Is(err, errRetired) {
			t.Fatalf("an ignored request to the replaced instance: %v, want errRetired", err)
		}
		rt, release, err := s.acquireRouted(s.table.Load().lookup("app.test", "/"), monitor, nil)
		if err != nil || rt.in != s.instance("app") {
			t.Fatalf("acquireRouted: %v, want the awake new instance to serve it", err)
		}
		release()
		// And from the old instance's routing entry, as a request that looked the route up before the
		// reload has it.
		stale := &routed{in: old, count: func(int) {}}
		if rt, release, err := s.acquireRouted(stale, monitor, nil); err != nil || rt.in != s.instance("app") {
			t.Fatalf("acquireRouted from the replaced instance: %v, want the new instance to serve it", err)
		} else {
			release()
		}
	})
}

// TestRenamedRouteWaitsForItsPredecessor: a reload that renames a route (same upstream) gives the new
// route's first wake the old one's tenant to wait for, as for a route that keeps its name: the two
// tenants must not run side by side on one address. Found with the real binary: the renamed route's
// wake found the old tenant still listening and failed, calling it a stranger.
func TestRenamedRouteWaitsForItsPredecessor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _, b, finish := stopping(t) // "app" awake, then its sleep blocked
		r := testRoute("renamed")      // the same upstream as "app"
		if err := s.Apply(&registry.Config{Routes: []*registry.Route{r}}); err != nil {
			t.Fatal(err)
		}
		held := request(s.instance("renamed"))
		synctest.Wait()
		if n := b.wakes.Load(); n != 1 {
			t.Fatalf("wakes = %d while the old route's tenant still stops, want 1 (the old one's only)", n)
		}
		finish()
		if err := <-held; err != nil {
			t.Fatalf("the renamed route's request: %v", err)
		}
		if n := b.wakes.Load(); n != 2 {
			t.Errorf("wakes = %d, want 2", n)
		}
		if rec := s.instance("renamed").status().LastWake; rec == nil || len(rec.Phases) == 0 || rec.Phases[0].Name != phasePredecessor {
			t.Errorf("the renamed route's wake record %+v, want a first phase %q", rec, phasePredecessor)
		}
	})
}
