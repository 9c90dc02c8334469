package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/registry"
)

// BenchmarkApplyRoutes loads and applies 10,000 idle exec routes and reports the heap they keep
// (heap-MiB) and per route (heap-B/route). SCALE_PROF=file also writes a heap profile.
func BenchmarkApplyRoutes(b *testing.B) {
	for i := 0; i < b.N; i++ {
		applyRoutes(b)
	}
}

func applyRoutes(t testing.TB) {
	var b strings.Builder
	b.WriteString("routes:\n")
	for i := 0; i < 10000; i++ {
		fmt.Fprintf(&b, "  - name: r%d\n    hosts: [r%d.test]\n    backing: exec\n    upstream: 127.0.0.1:%d\n    exec:\n      argv: [/bin/true]\n", i, i, 10000+i%50000)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	bk := newBackings(context.Background(), log, false)
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	cfg, err := registry.Load([]byte(b.String()), bk.decoders)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	srv := activator.New(activator.Options{Opener: bk.provider, Logger: log, Metrics: activator.NewMetrics(reg)})
	if err := srv.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&m1)
	if bm, ok := t.(*testing.B); ok {
		kept := float64(m1.HeapAlloc - m0.HeapAlloc)
		bm.ReportMetric(kept/(1<<20), "heap-MiB")
		bm.ReportMetric(kept/10000, "heap-B/route")
	}
	if path := os.Getenv("SCALE_PROF"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		_ = pprof.WriteHeapProfile(f)
		f.Close()
	}
	_ = srv.Shutdown(context.Background())
}
