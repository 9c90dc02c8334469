package activator

// Micro-benchmarks of the hot path, with allocation counts so a regression shows in review:
//
//	go test -run '^$' -bench . -benchmem ./internal/activator
//
// The end-to-end figures (wrk against real processes, side by side with nginx, Caddy and HAProxy) come
// from go run ./bench; these isolate the parts: route lookup, the hold (acquire/release), and one
// request through Server.ServeHTTP and the proxy to a loopback upstream.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/activator/activator/internal/registry"
)

// benchServer is a Server over n fake routes ("r0".."r{n-1}", host rN.test, the first with
// upstream up), with a real Metrics registry, as the activator runs.
func benchServer(b *testing.B, n int, up registry.Upstream, be *fakeBackend) *Server {
	b.Helper()
	s := New(Options{
		Opener:  fakeProvider{be},
		Logger:  slog.New(slog.DiscardHandler),
		Metrics: NewMetrics(prometheus.NewRegistry()),
		NewGate: func(*registry.Route) Gate { return passGate{} },
	})
	cfg := &registry.Config{}
	for i := range n {
		r := testRoute(fmt.Sprintf("r%d", i))
		r.Hold.MaxRequests = 1 << 20
		if i == 0 {
			r.Upstream = up
		}
		cfg.Routes = append(cfg.Routes, r)
	}
	if err := s.Apply(cfg); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s
}

// BenchmarkLookup: routing one request among 10, 10,000 and 100,000 routes, by exact host, by a
// wildcard, and an unknown host. Lookup allocates nothing.
func BenchmarkLookup(b *testing.B) {
	for _, n := range []int{10, 10000, 100000} {
		cfg := &registry.Config{}
		for i := range n {
			r := testRoute(fmt.Sprintf("r%d", i))
			if i == n/2 {
				r.Hosts = append(r.Hosts, "*.wild.example.com")
				r.PathPrefix = "/api"
			}
			cfg.Routes = append(cfg.Routes, r)
		}
		instances := map[string]*instance{}
		for _, r := range cfg.Routes {
			instances[r.Name] = &instance{route: r}
		}
		t := buildTable(cfg, instances)
		for _, c := range []struct{ name, host, path string }{
			{"exact", fmt.Sprintf("r%d.test", n/3), "/"},
			{"exact-port", fmt.Sprintf("R%d.test:8080", n/3), "/x"},
			{"wildcard", "a.b.wild.example.com", "/api/v1"},
			{"unknown", "nope.example.com", "/"},
		} {
			b.Run(fmt.Sprintf("routes=%d/%s", n, c.name), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					_ = t.lookup(c.host, c.path)
				}
			})
		}
	}
}

// BenchmarkAcquireRelease: the in-flight accounting of a request to an awake route (what every warm
// request pays), from 1 and from 16 goroutines at once.
func BenchmarkAcquireRelease(b *testing.B) {
	s := benchServer(b, 1, registry.Upstream{Network: "tcp", Address: "127.0.0.1:1"}, &fakeBackend{})
	in := s.instance("r0")
	if err := in.wakeNow(context.Background()); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			rel, err := in.acquire(ctx, triggerRequest)
			if err != nil {
				b.Fatal(err)
			}
			rel()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8) // 16 goroutines on 2 CPUs
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				rel, err := in.acquire(ctx, triggerRequest)
				if err != nil {
					b.Error(err)
					return
				}
				rel()
			}
		})
	})
}

// BenchmarkHoldRelease: b.N requests held on a sleeping route, then one wake releases them all; per op
// is one held request's hold and release (the wake's own cost is spread over them).
func BenchmarkHoldRelease(b *testing.B) {
	be := &fakeBackend{wakeGate: make(chan struct{})}
	s := benchServer(b, 1, registry.Upstream{Network: "tcp", Address: "127.0.0.1:1"}, be)
	in := s.instance("r0")
	ctx := context.Background()
	b.ReportAllocs()
	var wg sync.WaitGroup
	for range b.N {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rel, err := in.acquire(ctx, triggerRequest)
			if err != nil {
				b.Error(err)
				return
			}
			rel()
		}()
	}
	for in.status().Held < b.N {
		runtime.Gosched() // until every goroutine is parked in the hold
	}
	close(be.wakeGate)
	wg.Wait()
}

// BenchmarkServeHTTP: one GET through Server.ServeHTTP (lookup, in-flight accounting, upstream slot,
// reverse proxy over a kept-alive connection, metrics) to a loopback upstream answering 200 "ok".
func BenchmarkServeHTTP(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	upstream := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok")
	})}
	go upstream.Serve(ln)
	b.Cleanup(func() { upstream.Close() })
	s := benchServer(b, 1, registry.Upstream{Network: "tcp", Address: ln.Addr().String()}, &fakeBackend{})
	req := httptest.NewRequest(http.MethodGet, "http://r0.test/", nil)
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
}
