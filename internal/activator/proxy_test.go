package activator

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/activator/activator/internal/health"
	"github.com/activator/activator/internal/registry"
)

// TestFastTransportDialLimit: a burst of requests on a transport with no connections yet dials at most
// maxDials at once and never opens more than its cap; requests that find no token take connections
// handed back by the others. The dialer's Control hook holds every dial until maxDials are in flight,
// so a 33rd concurrent dial would be seen.
func TestFastTransportDialLimit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted sync.Map
	upstream := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		ConnState: func(c net.Conn, s http.ConnState) {
			if s == http.StateNew {
				accepted.Store(c.RemoteAddr().String(), true)
			}
		},
	}
	go upstream.Serve(ln)
	t.Cleanup(func() { upstream.Close() })

	const conns, requests = 64, 300
	tr := newFastTransport("tcp", ln.Addr().String(), conns, http.DefaultTransport)
	var (
		mu       sync.Mutex
		inFlight int
		maxSeen  int
		full     = make(chan struct{})
		fullOnce sync.Once
		release  = make(chan struct{})
	)
	tr.dialer.Control = func(string, string, syscall.RawConn) error {
		mu.Lock()
		inFlight++
		maxSeen = max(maxSeen, inFlight)
		if inFlight == maxDials {
			fullOnce.Do(func() { close(full) }) // later dials, after the release, may reach it again
		}
		mu.Unlock()
		<-release
		mu.Lock()
		inFlight--
		mu.Unlock()
		return nil
	}
	var wg sync.WaitGroup
	errs := make(chan error, requests)
	for range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodGet, "http://"+ln.Addr().String()+"/", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				errs <- err
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	<-full
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("request: %v", err)
	}
	if maxSeen > maxDials {
		t.Errorf("%d dials in flight at once, want at most %d", maxSeen, maxDials)
	}
	n := 0
	accepted.Range(func(any, any) bool { n++; return true })
	if n > conns {
		t.Errorf("%d upstream connections opened, want at most %d", n, conns)
	}
	t.Logf("%d requests over %d connections", requests, n)
}

// TestFirstRequestUsesGateConnection: with the real health gate, the first request after a wake goes
// out on the connection the gate's passing probe used (ConnGate): the tenant accepts one connection
// and serves the probe and the request on it.
func TestFirstRequestUsesGateConnection(t *testing.T) {
	var (
		mu      sync.Mutex
		remotes []string
	)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		remotes = append(remotes, r.URL.Path+" "+r.RemoteAddr)
		mu.Unlock()
		io.WriteString(w, "ok")
	}))
	t.Cleanup(upstream.Close)
	var gate Gate
	s, _ := newTestServer(t, &fakeBackend{}, nil, func(r *registry.Route) {
		r.Upstream.Address = upstream.Listener.Addr().String()
		r.Health.Path = "/healthz"
		gate = health.New(r.Upstream, r.Health)
	})
	s.opts.NewGate = func(*registry.Route) Gate { return gate }

	w := httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://app.test/first", nil))
	if w.Code != http.StatusOK || w.Body.String() != "ok" {
		t.Fatalf("first request: %d %q", w.Code, w.Body)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(remotes) != 2 {
		t.Fatalf("upstream saw %v, want the probe and the request", remotes)
	}
	probe, req := strings.Fields(remotes[0]), strings.Fields(remotes[1])
	if probe[0] != "/healthz" || req[0] != "/first" || probe[1] != req[1] {
		t.Fatalf("upstream saw %v, want /healthz then /first on one connection", remotes)
	}
}
