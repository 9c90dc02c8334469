package activator

// Cases of the edge's behaviour that the event loop's path must keep as net/http's does, each run over
// both paths (bothpaths_test.go): what a failing tenant costs, what a tenant sends unasked, streams,
// upgrades, the hold, the send and header limits.

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/activator/activator/internal/registry"
)

// hits counts a tenant's requests by path.
type hits struct {
	mu sync.Mutex // guards n
	n  map[string]int
}

func (h *hits) add(path string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == nil {
		h.n = map[string]int{}
	}
	h.n[path]++
}

func (h *hits) of(path string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[path]
}

// TestFailingTenantAskedOnce: a tenant that takes a GET and closes its connection without an answer,
// or after half a head, or after the head and part of the body, is sent the request once on a new
// upstream connection, on both paths; the client gets the 502 net/http writes (nothing came it could
// pass on), or, once the head had come, a connection closed without an answer, as net/http aborts it;
// and the route counts each request by the status net/http counts. The loop's path handed each of
// these back to net/http, which sent the request again: a tenant got a request that made it fail
// twice, and the client the second attempt's outcome; a request cut off once its head had come was
// not counted at all.
func TestFailingTenantAskedOnce(t *testing.T) {
	var got hits
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.add(r.URL.Path)
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		defer c.Close()
		switch r.URL.Path {
		case "/half":
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\n")
		case "/cut":
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc")
		}
	}))
	t.Cleanup(up.Close)
	for _, tc := range []struct {
		path string
		code int // the client's answer; 0: the connection closed without one
	}{
		{"/closed", http.StatusBadGateway},
		{"/half", http.StatusBadGateway},
		{"/cut", 0},
	} {
		for _, p := range edgePaths {
			t.Run(p.name+" "+tc.path, func(t *testing.T) {
				reg := prometheus.NewPedanticRegistry()
				m := NewMetrics(reg)
				r := testRoute("app")
				r.Upstream.Address = up.Listener.Addr().String()
				e := newConformEdge(t, conformConfig{routes: []*registry.Route{r}, metrics: m})
				e.wake(t, "app") // with no upstream connection yet
				before := got.of(tc.path)
				rc := e.conn(t, p, "")
				rc.send("GET " + tc.path + " HTTP/1.1\r\nHost: app.test\r\n\r\n")
				resp, body, err := rc.next()
				switch {
				case tc.code == 0 && err == nil:
					t.Errorf("answered %d %q, want the connection closed without an answer", resp.StatusCode, body)
				case tc.code == 0 && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !isReset(err):
					t.Errorf("%v, want the connection closed", err)
				case tc.code != 0 && err != nil:
					t.Errorf("%v, want a %d", err, tc.code)
				case tc.code != 0 && (resp.StatusCode != tc.code || !strings.Contains(body, "connection closed before the answer")):
					t.Errorf("answered %d %q, want %d naming the connection closed before the answer", resp.StatusCode, body, tc.code)
				}
				if n := got.of(tc.path) - before; n != 1 {
					t.Errorf("the tenant got the request %d times, want once", n)
				}
				want := tc.code
				if want == 0 {
					want = http.StatusOK // the answer's, whose head had come
				}
				series := fmt.Sprintf(`activator_requests_total{code="%d"}`, want)
				until(t, func() (bool, string) {
					got := routeSeries(t, m.Gatherer(reg), "app")
					return got[series] == 1, fmt.Sprintf("request series %v, want %s 1", got, series)
				})
			})
		}
	}
}
