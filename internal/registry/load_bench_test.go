package registry_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

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
	for b.Loop() {
		cfg, err := registry.Load(data, backings)
		if err != nil {
			b.Fatal(err)
		}
		if len(cfg.Routes) != 100000 {
			b.Fatalf("%d routes", len(cfg.Routes))
		}
	}
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
			for b.Loop() {
				b.StopTimer()
				rl := registry.NewReloader(reusing)
				if _, err := rl.Load(data); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if _, err := rl.Load(tc.next); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
