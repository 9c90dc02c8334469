package registry_test

import (
	"bytes"
	"fmt"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/activator/activator/internal/registry"
)

// scaleConfig is n idle exec routes shaped as the scale benchmark (bench/scale.go) writes them.
func scaleConfig(n int) []byte {
	var b strings.Builder
	b.WriteString("listen: 127.0.0.1:40001\nadmin: 127.0.0.1:40002\nroutes:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - name: r%d\n    hosts: [r%d.localhost]\n    backing: exec\n    upstream: 127.0.0.1:%d\n"+
			"    idle: 1h\n    wake_budget: 60s\n    health:\n      path: /healthz\n    exec:\n      argv: [\"/bin/true\", \"app\"]\n      dir: /tmp\n",
			i, i, 20000+i%12000)
	}
	return []byte(b.String())
}

// BenchmarkLoad100k loads the scale benchmark's 100,000 routes. Profile it with -cpuprofile and
// -memprofile: it is most of the CPU of a reload at that scale.
func BenchmarkLoad100k(b *testing.B) {
	data := scaleConfig(100000)
	b.ReportAllocs()
	var peak heapPeak
	for b.Loop() {
		b.StopTimer()
		runtime.GC()
		stop := peak.watch()
		b.StartTimer()
		cfg, err := registry.Load(data, backings)
		stop()
		if err != nil {
			b.Fatal(err)
		}
		if len(cfg.Routes) != 100000 {
			b.Fatalf("%d routes", len(cfg.Routes))
		}
	}
	peak.report(b)
}

// BenchmarkSame100k compares 100,000 routes with those of a second load of the same file, as a reload
// that changes nothing does.
func BenchmarkSame100k(b *testing.B) {
	data := scaleConfig(100000)
	c1, err := registry.Load(data, backings)
	if err != nil {
		b.Fatal(err)
	}
	c2, err := registry.Load(data, backings)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		for i, r := range c1.Routes {
			if !r.Same(c2.Routes[i]) {
				b.Fatalf("route %s differs", r.Name)
			}
		}
	}
}

// BenchmarkReload100k reloads the scale benchmark's 100,000 routes with a Reloader after an edit of
// one route, and after an edit of every route (which must cost no more than a whole load: entries
// parsed one by one were once quadratic in the file's length).
func BenchmarkReload100k(b *testing.B) {
	data := scaleConfig(100000)
	for _, tc := range []struct {
		name string
		next []byte
	}{
		{"one", bytes.Replace(data, []byte("upstream: 127.0.0.1:20007\n"), []byte("upstream: 127.0.0.1:20107\n"), 1)},
		{"every", bytes.ReplaceAll(data, []byte("wake_budget: 60s"), []byte("wake_budget: 61s"))},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			var peak heapPeak
			for b.Loop() {
				b.StopTimer()
				rl := registry.NewReloader(reusing)
				old, err := rl.Load(data)
				if err != nil {
					b.Fatal(err)
				}
				runtime.GC()
				stop := peak.watch()
				b.StartTimer()
				if _, err := rl.Load(tc.next); err != nil {
					b.Fatal(err)
				}
				stop()
				runtime.KeepAlive(old) // the server holds the old config until the new one replaces it
			}
			peak.report(b)
		})
	}
}

// heapPeak is the largest heap seen across the loads of a benchmark, sampled every millisecond from a
// goroutine of its own (runtime/metrics stops nothing, where ReadMemStats stops the world): heap is
// the heap's objects, garbage not yet swept included (what RSS follows), and live what the latest
// collection marked, with what was allocated while it ran. A peak between two samples is missed.
type heapPeak struct {
	heap, live uint64
}

// watch samples the heap until the returned func is called, which waits for the sampler to end.
func (p *heapPeak) watch() (stop func()) {
	samples := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/heap/live:bytes"}}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			metrics.Read(samples)
			p.heap = max(p.heap, samples[0].Value.Uint64())
			p.live = max(p.live, samples[1].Value.Uint64())
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// report adds the peaks to the benchmark's results, in MB (10^6 bytes).
func (p *heapPeak) report(b *testing.B) {
	b.ReportMetric(float64(p.heap)/1e6, "peak-heap-MB")
	b.ReportMetric(float64(p.live)/1e6, "peak-live-MB")
}
