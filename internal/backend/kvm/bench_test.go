package kvm

import (
	"context"
	"testing"
	"time"

	"github.com/activator/activator/internal/health"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// BenchmarkWake measures, for the same guest, the time from Wake to the first HTTP 200 after a cold
// boot (poweroff mode), a snapshot restore (snapshot mode) and a pause/cont (pause mode), and reports
// each in milliseconds and the two warm paths as ratios of the cold boot. Each iteration wakes all
// three once; sleeping is not timed. Run with -benchtime=Nx (a cold boot takes seconds under TCG).
func BenchmarkWake(b *testing.B) {
	g := needGuest(b)
	modes := []string{SleepPoweroff, SleepSnapshot, SleepPause}
	type subj struct {
		be *Backend
		up registry.Upstream
	}
	subs := map[string]subj{}
	for _, m := range modes {
		r := route(b, g, m, "")
		be := open(b, r)
		// The first wake of every mode is a cold boot: do it before timing, then put it to sleep.
		wake(b, be, r.Upstream, tenant.Discard)
		sleepB(b, be)
		subs[m] = subj{be, r.Upstream}
	}
	total := map[string]time.Duration{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, m := range modes {
			s := subs[m]
			b.StartTimer()
			start := time.Now()
			toFirst200(b, s.be, s.up)
			total[m] += time.Since(start)
			b.StopTimer()
			sleepB(b, s.be)
		}
	}
	ms := func(m string) float64 { return float64(total[m].Microseconds()) / 1000 / float64(b.N) }
	b.ReportMetric(ms(SleepPoweroff), "cold_ms")
	b.ReportMetric(ms(SleepSnapshot), "restore_ms")
	b.ReportMetric(ms(SleepPause), "cont_ms")
	b.ReportMetric(ms(SleepSnapshot)/ms(SleepPoweroff), "restore/cold")
	b.ReportMetric(ms(SleepPause)/ms(SleepPoweroff), "cont/cold")
}

// toFirst200 wakes be and probes its upstream in a tight loop until it answers 200.
func toFirst200(b *testing.B, be *Backend, up registry.Upstream) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	life, err := be.Wake(ctx, tenant.Discard)
	if err != nil {
		b.Fatalf("Wake: %v", err)
	}
	p := health.New(up, registry.Health{Path: "/", MinStatus: 200, MaxStatus: 200, Interval: 5 * time.Millisecond, Timeout: 500 * time.Millisecond, Passes: 1})
	if err := p.Wait(ctx, life.Done()); err != nil {
		b.Fatalf("no 200: %v", err)
	}
}
