package redfish

import (
	"context"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/activator/activator/internal/backend/redfish/redfishtest"
	"github.com/activator/activator/internal/tenant"
)

// BenchmarkFleetWake wakes a fleet of n simulated nodes (each taking 50ms to power on) one after the
// other and all at once. Since each wake mostly waits on its BMC, the parallel time per op should be
// about 1/n of the serial one: wakes of different routes share nothing in the backend.
func BenchmarkFleetWake(b *testing.B) {
	const n = 8
	const delay = 50 * time.Millisecond
	systems := make([]redfishtest.System, n)
	for i := range systems {
		systems[i] = redfishtest.System{ID: fmt.Sprintf("node-%d", i), TransitionDelay: delay}
	}
	sim, err := redfishtest.New(redfishtest.Options{Systems: systems})
	if err != nil {
		b.Fatal(err)
	}
	defer sim.Close()
	fleet := make([]*Backend, n)
	for i := range fleet {
		r := testRoute()
		r.Settings = decode(b, r, fmt.Sprintf("endpoint: %s\nsystem: node-%d\npoll_interval: 5ms\n", sim.URL, i))
		be, err := NewProvider(Options{}).Open(r)
		if err != nil {
			b.Fatal(err)
		}
		fleet[i] = be.(*Backend)
		defer fleet[i].Close(context.Background())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	all := func(f func(*Backend) error) error {
		var g errgroup.Group
		for _, nb := range fleet {
			g.Go(func() error { return f(nb) })
		}
		return g.Wait()
	}
	wake := func(nb *Backend) error { _, err := nb.Wake(ctx, tenant.Discard); return err }
	sleep := func(nb *Backend) error { return nb.Sleep(ctx) }

	for _, mode := range []string{"serial", "parallel"} {
		b.Run(fmt.Sprintf("%s/nodes=%d", mode, n), func(b *testing.B) {
			for b.Loop() {
				if mode == "serial" {
					for _, nb := range fleet {
						if err := wake(nb); err != nil {
							b.Fatal(err)
						}
					}
				} else if err := all(wake); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := all(sleep); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
