package activator

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/testenv"
)

// TestResponseTimeout: a tenant that takes a request and never begins its answer gets its client a
// 504 naming response_timeout, on the fast path (GET) and the ReverseProxy's (POST); the connection to
// it is closed, and the request stops counting in flight, so the route can go to sleep. Found with the
// real binary: such a request held its client for as long as the client waited, and the route never
// slept under it.
func TestResponseTimeout(t *testing.T) {
	gone := make(chan struct{}, 2)
	hang := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // then net/http watches the connection
		<-r.Context().Done()               // the edge closed it
		gone <- struct{}{}
	})
	g := newEdgeRig(t, &fakeBackend{}, registry.EdgeLimits{}, hang, func(r *registry.Route) {
		r.ResponseTimeout = 50 * time.Millisecond
	})
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		c := g.dial(t)
		head := method + " / HTTP/1.1\nHost: app.test\nAccept: application/json"
		var body []byte
		if method == http.MethodPost {
			body = []byte("a=1")
			head += "\nContent-Length: 3"
		}
		if err := send(c, head, body); err != nil {
			t.Fatal(err)
		}
		rep, err := answer(c)
		if err != nil {
			t.Fatalf("%s: no answer: %v", method, err)
		}
		if rep.code != http.StatusGatewayTimeout || !strings.Contains(rep.body, "no answer within the route's response_timeout") {
			t.Errorf("%s: %d %q, want 504 naming response_timeout", method, rep.code, rep.body)
		}
		select {
		case <-gone:
		case <-time.After(patience):
			t.Fatalf("%s: the tenant's connection stayed open after the 504", method)
		}
	}
	g.in.mu.Lock()
	inflight := g.in.inflight
	g.in.mu.Unlock()
	if inflight != 0 {
		t.Errorf("%d requests still counted in flight after their 504s", inflight)
	}
}

// TestUpstreamFailuresLogThrottled: a tenant that fails every request (here its port refuses) gets the
// first failure logged at once, then at most one line per failedEvery, saying how many failures it
// stands for, and a long path is cut in the line. Found by an operator trial: 300 requests for an 8 KB
// path to a tenant that closed the connection wrote 300 lines, 2.4 MB of log.
func TestUpstreamFailuresLogThrottled(t *testing.T) {
	var logs testenv.SyncBuffer
	now := time.Unix(1e9, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	s := New(Options{Opener: fakeProvider{&fakeBackend{}}, Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
		NewGate: func(*registry.Route) Gate { return passGate{} }, Now: clock})
	r := testRoute("app")
	r.Upstream.Address = "127.0.0.1:1" // refused
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{r}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	in := s.instance("app")
	get := func() {
		w := httptest.NewRecorder()
		in.client().Serve(w, httptest.NewRequest(http.MethodGet, "http://app.test/"+strings.Repeat("A", 8000), nil))
		if w.Code != http.StatusBadGateway {
			t.Fatalf("answer %d, want 502", w.Code)
		}
	}
	lines := func() []string {
		var out []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, `"msg":"upstream failed"`) {
				out = append(out, l)
			}
		}
		return out
	}
	for range 50 {
		get()
	}
	if got := lines(); len(got) != 1 || !strings.Contains(got[0], `"failures":1`) || len(got[0]) > 1000 {
		t.Fatalf("after 50 failures within %v: %d lines %q, want one, short, for the first", failedEvery, len(got), got)
	}
	mu.Lock()
	now = now.Add(failedEvery)
	mu.Unlock()
	get()
	if got := lines(); len(got) != 2 || !strings.Contains(got[1], `"failures":50`) {
		t.Errorf("after the window: lines %q, want a second saying 50 failures", got)
	}
}

// TestHoldTimeoutNamesRouteAndWake: a request held past hold.max_time gets a 504 whose body names the
// route, the bound and that the wake goes on, and whose Activator-Wake-Id, in the body too, is the
// wake it waited for. Found by an operator trial: the body named neither route nor wake.
func TestHoldTimeoutNamesRouteAndWake(t *testing.T) {
	b := &fakeBackend{wakeGate: make(chan struct{})}
	defer close(b.wakeGate)
	g := newEdgeRig(t, b, registry.EdgeLimits{}, http.NotFoundHandler(), func(r *registry.Route) {
		r.Hold.MaxTime = 50 * time.Millisecond
		r.WakeBudget = time.Hour
	})
	code, h, body := g.get(t, "/", http.Header{"Accept": {"application/json"}})
	if code != http.StatusGatewayTimeout {
		t.Fatalf("answer %d %q, want 504", code, body)
	}
	g.in.mu.Lock()
	wake := ""
	if g.in.wake != nil {
		wake = g.in.wake.rec.rec.ID // the wake still running
	}
	g.in.mu.Unlock()
	if wake == "" || h.Get("Activator-Wake-Id") != wake || !strings.Contains(body, `"wake_id":"`+wake+`"`) ||
		!strings.Contains(body, `route \"app\": timed out waiting for the route to wake (hold.max_time 50ms); the wake goes on`) {
		t.Errorf("504 %q (Activator-Wake-Id %q), want the route, the bound and wake %q", body, h.Get("Activator-Wake-Id"), wake)
	}
}

// TestUpstreamBusyIsLogged: requests refused for want of an upstream slot (max_upstream_conns) at the
// end of their hold budget are logged, the first at once and then at most one line per failedEvery
// with how many. Found by an operator trial: thousands of such 503s showed nowhere but in
// activator_requests_total{code="503"}, mixed with every other 503.
func TestUpstreamBusyIsLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testenv.SyncBuffer
		s := New(Options{Opener: fakeProvider{&fakeBackend{}}, Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
			NewGate: func(*registry.Route) Gate { return passGate{} }})
		r := testRoute("app")
		r.MaxUpstreamConns, r.Hold.MaxTime = 1, time.Second
		if err := s.Apply(&registry.Config{Routes: []*registry.Route{r}}); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = s.Shutdown(context.Background()) }()
		in := s.instance("app")
		done, err := in.admit(context.Background(), 0) // the one slot, kept
		if err != nil {
			t.Fatal(err)
		}
		defer done()
		for range 3 {
			if _, err := in.admit(context.Background(), 0); !errors.Is(err, ErrUpstreamBusy) {
				t.Fatalf("admit with the slot taken: %v, want ErrUpstreamBusy", err)
			}
		}
		if n := strings.Count(logs.String(), `"msg":"requests waited for a connection to the upstream past hold.max_time: answered 503"`); n != 1 {
			t.Errorf("%d lines for three refusals within %v, want 1:\n%s", n, failedEvery, logs.String())
		}
		time.Sleep(failedEvery)
		if _, err := in.admit(context.Background(), 0); !errors.Is(err, ErrUpstreamBusy) {
			t.Fatal(err)
		}
		if !strings.Contains(logs.String(), `"requests":3,"max_upstream_conns":1`) {
			t.Errorf("no line counting the three refusals since the first:\n%s", logs.String())
		}
	})
}
