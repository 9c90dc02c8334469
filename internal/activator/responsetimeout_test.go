package activator

import (
	"context"
	"errors"
	"fmt"
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

// TestResponseTimeout: a tenant that takes a request and never begins its answer, or begins its head
// and never ends it, gets its client a 504 naming response_timeout, on the fast path (GET), the
// ReverseProxy's (POST) and the loop's (a GET on a connection the loop owns, which it gives back to
// net/http for the 504); the connection to the tenant is closed, the request stops counting in flight,
// so the route can go to sleep, and the failures are logged as one line (throttled, failedEvery).
// Found with the real binary: such a request held its client for as long as the client waited, and
// the route never slept under it. The loop's path took the first bytes of a head for the answer's
// start: a tenant that sent "HTTP/1.1 200 OK\r\n" and stopped held its client for ever, where net/http
// bounds the wait for the whole head; and it logged each 504, where net/http throttles them.
func TestResponseTimeout(t *testing.T) {
	gone := make(chan struct{}, 2)
	hang := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // then net/http watches the connection
		if r.URL.Path == "/part" {
			// Half a head, flushed, then nothing until the edge closes the connection.
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				panic(err)
			}
			defer c.Close()
			_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n"))
			_, _ = io.Copy(io.Discard, brw)
		} else {
			<-r.Context().Done() // the edge closed it
		}
		gone <- struct{}{}
	})
	up := httptest.NewServer(hang)
	t.Cleanup(up.Close)
	r := testRoute("app")
	r.Upstream.Address = up.Listener.Addr().String()
	r.ResponseTimeout = 50 * time.Millisecond
	var logs testenv.SyncBuffer
	frozen := time.Now() // the log's throttle sees no time pass, however slow the machine
	e := newConformEdge(t, conformConfig{routes: []*registry.Route{r}, logs: &logs, now: func() time.Time { return frozen }})
	in := e.s.instance("app")
	for _, target := range []string{"/", "/part"} {
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			for _, p := range edgePaths {
				t.Run(p.name+" "+method+" "+target, func(t *testing.T) {
					rc := e.conn(t, p, "")
					raw := method + " " + target + " HTTP/1.1\r\nHost: app.test\r\nAccept: application/json\r\n"
					if method == http.MethodPost {
						raw += "Content-Length: 3\r\n\r\na=1"
					} else {
						raw += "\r\n"
					}
					rc.send(raw)
					resp, body, err := rc.next()
					if err != nil {
						t.Fatalf("no answer: %v", err)
					}
					if resp.StatusCode != http.StatusGatewayTimeout || !strings.Contains(body, "no answer within the route's response_timeout") {
						t.Errorf("%d %q, want 504 naming response_timeout", resp.StatusCode, body)
					}
					select {
					case <-gone:
					case <-time.After(patience):
						t.Fatal("the tenant's connection stayed open after the 504")
					}
					until(t, func() (bool, string) {
						in.mu.Lock()
						defer in.mu.Unlock()
						return in.inflight == 0, fmt.Sprintf("%d requests still counted in flight after the 504", in.inflight)
					})
				})
			}
		}
	}
	if n := strings.Count(logs.String(), "the tenant did not begin its answer in time"); n != 1 {
		t.Errorf("%d log lines for the 504s within %v, want 1:\n%s", n, failedEvery, logs.String())
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
		done, err := in.admit(context.Background(), nil) // the one slot, kept
		if err != nil {
			t.Fatal(err)
		}
		defer done()
		for range 3 {
			if _, err := in.admit(context.Background(), nil); !errors.Is(err, ErrUpstreamBusy) {
				t.Fatalf("admit with the slot taken: %v, want ErrUpstreamBusy", err)
			}
		}
		if n := strings.Count(logs.String(), `"msg":"requests waited for a connection to the upstream past hold.max_time: answered 503"`); n != 1 {
			t.Errorf("%d lines for three refusals within %v, want 1:\n%s", n, failedEvery, logs.String())
		}
		time.Sleep(failedEvery)
		if _, err := in.admit(context.Background(), nil); !errors.Is(err, ErrUpstreamBusy) {
			t.Fatal(err)
		}
		if !strings.Contains(logs.String(), `"requests":3,"max_upstream_conns":1`) {
			t.Errorf("no line counting the three refusals since the first:\n%s", logs.String())
		}
	})
}
