package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/demoapp"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// alwaysUp is a Backend whose tenant is always running: Wake returns at once. It isolates the edge's
// own cost (routing, hold bookkeeping, proxying) from any backing.
type alwaysUp struct{}

func (alwaysUp) Wake(context.Context, tenant.Tracker) (*tenant.Life, error) {
	return tenant.NewLife(), nil
}
func (alwaysUp) Sleep(context.Context) error { return nil }

type alwaysUpProvider struct{}

func (alwaysUpProvider) Open(*registry.Route) (tenant.Backend, error) { return alwaysUp{}, nil }

// startEdge serves the demo app and, in front of it, the activator's edge wired as cmd/activator
// wires it (the Server itself is the edge handler), both in this process. It returns the edge's address.
func startEdge(tb testing.TB) string {
	tb.Helper()
	appLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	return startEdgeFor(tb, appLn, demoapp.Handler(0, 0))
}

// startEdgeFor serves h on appLn and the edge in front of it; it returns the edge's address.
func startEdgeFor(tb testing.TB, appLn net.Listener, h http.Handler) string {
	tb.Helper()
	serveFor(tb, &http.Server{Handler: h}, appLn)

	cfg, err := registry.Load([]byte(`
routes:
  - name: edge
    hosts: [127.0.0.1]
    backing: exec
    upstream: `+appLn.Addr().String()+`
    health: {path: /healthz}
    exec: {}
`), map[string]registry.SettingsDecoder{"exec": func(*registry.Route, *yaml.Node) (any, error) { return nil, nil }})
	if err != nil {
		tb.Fatal(err)
	}
	if os.Getenv("BENCH_EDGE") == "bare" {
		// The floor for a Go proxy: httputil.ReverseProxy alone, no router, no activator.
		u, _ := url.Parse("http://" + appLn.Addr().String())
		rp := httputil.NewSingleHostReverseProxy(u)
		rp.Transport = &http.Transport{MaxIdleConnsPerHost: 1024, DisableCompression: true}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		serveFor(tb, &http.Server{Handler: rp}, ln)
		return ln.Addr().String()
	}
	srv := activator.New(activator.Options{Opener: alwaysUpProvider{}})
	if err := srv.Apply(cfg); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	edgeLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	serveFor(tb, &http.Server{Handler: srv}, edgeLn)
	return edgeLn.Addr().String()
}

// serveFor serves srv on ln until the test ends, then closes it and waits for Serve to return.
func serveFor(tb testing.TB, srv *http.Server, ln net.Listener) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	tb.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
}

// BenchmarkEdgeWrk profiles the edge under wrk: run it pinned, with a CPU profile, e.g.
//
//	taskset -c 1 go test ./bench -run '^$' -bench EdgeWrk -benchtime 1x -cpuprofile /tmp/edge.prof
//
// wrk runs on CPU 0 for BENCH_WRK_SECONDS (default 5). b.N is ignored beyond the first iteration.
func BenchmarkEdgeWrk(b *testing.B) {
	wrk, ok := lookTool("wrk")
	if !ok {
		b.Skip("wrk not installed (Debian package wrk)")
	}
	addr := startEdge(b)
	if _, _, err := rawGet(context.Background(), addr, "/", "127.0.0.1", 10*time.Second); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		args := []string{"-c", "0", wrk, "-t1", "-c16", "-d5s", "--latency", "http://" + addr + "/"}
		out, err := exec.Command("taskset", args...).CombinedOutput()
		if err != nil {
			b.Fatalf("wrk: %v\n%s", err, out)
		}
		r, err := parseWrk(string(out))
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(r.RPS, "req/s")
		b.ReportMetric(r.P99, "p99-µs")
	}
}

// BenchmarkEdge measures the edge with an in-process keep-alive client (no external tools).
func BenchmarkEdge(b *testing.B) {
	addr := startEdge(b)
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := c.Get("http://" + addr + "/")
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}
