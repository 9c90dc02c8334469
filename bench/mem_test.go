package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/backend/exec"
	"github.com/activator/activator/internal/backend/split"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// BenchmarkRouteMemory reports the heap the activator keeps per configured idle route, for 10,000
// and 100,000 routes, with the real exec provider and with a do-nothing one (the difference is the
// exec backing's share), and how long the config's load (registry.Load), its first Apply and the
// Apply of a reload of the same file (which keeps every instance) take: load-ms, apply-ms,
// reapply-ms. Set BENCH_HEAP_PROFILE=file to write a heap profile after the routes are applied.
func BenchmarkRouteMemory(b *testing.B) {
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{10000, 100000} {
		var sb strings.Builder
		sb.WriteString("routes:\n")
		for i := 0; i < n; i++ {
			fmt.Fprintf(&sb, "  - name: r%d\n    hosts: [r%d.localhost]\n    backing: exec\n    upstream: 127.0.0.1:%d\n    health: {path: /healthz}\n    exec: {argv: [%q, app]}\n", i, i, 20000+i%12000, self)
		}
		config := []byte(sb.String())
		for _, tc := range []struct {
			name     string
			provider func() tenant.Opener
			decode   registry.SettingsDecoder
		}{
			{"exec", func() tenant.Opener {
				return split.New(map[string]tenant.Opener{"exec": exec.NewProvider(exec.Options{})})
			}, exec.Decode},
			{"noop", func() tenant.Opener { return alwaysUpProvider{} }, func(*registry.Route, *yaml.Node) (any, error) { return nil, nil }},
		} {
			b.Run(fmt.Sprintf("%s/routes=%d", tc.name, n), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					runtime.GC()
					var before, after runtime.MemStats
					runtime.ReadMemStats(&before)
					t0 := time.Now()
					cfg, err := registry.Load(config, map[string]registry.SettingsDecoder{"exec": tc.decode})
					if err != nil {
						b.Fatal(err)
					}
					t1 := time.Now()
					srv := activator.New(activator.Options{Opener: tc.provider(), Metrics: activator.NewMetrics(prometheus.NewRegistry())})
					if err := srv.Apply(cfg); err != nil {
						b.Fatal(err)
					}
					t2 := time.Now()
					runtime.GC()
					runtime.ReadMemStats(&after)
					again, err := registry.Load(config, map[string]registry.SettingsDecoder{"exec": tc.decode})
					if err != nil {
						b.Fatal(err)
					}
					t3 := time.Now()
					if err := srv.Apply(again); err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(float64(time.Since(t3).Microseconds())/1000, "reapply-ms")
					b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "heap-B/route")
					b.ReportMetric(float64(t1.Sub(t0).Microseconds())/1000, "load-ms")
					b.ReportMetric(float64(t2.Sub(t1).Microseconds())/1000, "apply-ms")
					if p := os.Getenv("BENCH_HEAP_PROFILE"); p != "" {
						f, err := os.Create(fmt.Sprintf("%s.%s.%d", p, tc.name, n))
						if err == nil {
							_ = pprof.WriteHeapProfile(f)
							f.Close()
						}
					}
					runtime.KeepAlive(srv)
				}
			})
		}
	}
}
