package activator

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/activator/activator/internal/health"
	"github.com/activator/activator/internal/registry"
)

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

// TestUpstreamClosedWhenTenantGoes: once the tenant sleeps, dies on its own, or its route is
// removed, the route's idle upstream connection is closed at once (dropUpstream), not left to its
// idle timeout: a socket to a dead tenant would sit in CLOSE-WAIT until then.
func TestUpstreamClosedWhenTenantGoes(t *testing.T) {
	for _, tc := range []struct {
		name string
		gone func(t *testing.T, s *Server, in *instance, b *fakeBackend)
	}{
		{"sleep", func(t *testing.T, _ *Server, in *instance, _ *fakeBackend) {
			if err := in.sleepNow(context.Background(), ReasonAdmin); err != nil {
				t.Fatal(err)
			}
		}},
		{"exit", func(_ *testing.T, _ *Server, _ *instance, b *fakeBackend) {
			b.mu.Lock()
			b.life.End(errors.New("exited with code 1"))
			b.mu.Unlock()
		}},
		{"route removed", func(t *testing.T, s *Server, _ *instance, _ *fakeBackend) {
			if err := s.Apply(&registry.Config{}); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			closed := make(chan struct{}, 1)
			upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, "ok")
			}))
			upstream.Config.ConnState = func(_ net.Conn, st http.ConnState) {
				if st == http.StateClosed {
					closed <- struct{}{}
				}
			}
			upstream.Start()
			t.Cleanup(upstream.Close)
			b := &fakeBackend{}
			s, in := newTestServer(t, b, passGate{}, func(r *registry.Route) {
				r.Upstream.Address = upstream.Listener.Addr().String()
			})
			w := httptest.NewRecorder()
			s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://app.test/", nil))
			if w.Code != http.StatusOK {
				t.Fatalf("request: %d %q", w.Code, w.Body)
			}
			tc.gone(t, s, in, b)
			select {
			case <-closed:
			case <-time.After(10 * time.Second): // far beyond the wait it takes; the idle timeout is 90 s
				t.Fatal("the upstream connection was still open 10 s after the tenant went")
			}
		})
	}
}
