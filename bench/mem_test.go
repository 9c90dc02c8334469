package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/backend/exec"
	"github.com/activator/activator/internal/backend/split"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// BenchmarkRouteMemory reports the heap the activator keeps per configured idle route, with the real
// exec provider and with a do-nothing one (the difference is the exec backing's share). Set
// BENCH_HEAP_PROFILE=file to write a heap profile after the routes are applied.
func BenchmarkRouteMemory(b *testing.B) {
	const n = 10000
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	var sb strings.Builder
	sb.WriteString("routes:\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&sb, "  - name: r%d\n    hosts: [r%d.localhost]\n    backing: exec\n    upstream: 127.0.0.1:%d\n    health: {path: /healthz}\n    exec: {argv: [%q, app]}\n", i, i, 20000+i%40000, self)
	}
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
		b.Run(tc.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				cfg, err := registry.Load([]byte(sb.String()), map[string]registry.SettingsDecoder{"exec": tc.decode})
				if err != nil {
					b.Fatal(err)
				}
				srv := activator.New(activator.Options{Opener: tc.provider(), Metrics: activator.NewMetrics(prometheus.NewRegistry())})
				if err := srv.Apply(cfg); err != nil {
					b.Fatal(err)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "heap-B/route")
				b.ReportMetric(float64(after.NumGC), "gcs")
				if p := os.Getenv("BENCH_HEAP_PROFILE"); p != "" {
					f, err := os.Create(p + "." + tc.name)
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
