package activator

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/activator/activator/internal/registry"
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
