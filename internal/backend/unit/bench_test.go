package unit

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/activator/activator/internal/health"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/systemdtest"
	"github.com/activator/activator/internal/tenant"
	"github.com/activator/activator/internal/testenv"
)

// firstByte sends GET / on a fresh connection to addr and returns once the status line has arrived
// and reads 200.
func firstByte(ctx context.Context, addr string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// gate is the activator's health gate as the activator would run it for a route.
func gate(ctx context.Context, r *registry.Route, life *tenant.Life) error {
	return health.New(r.Upstream, r.Health).Wait(ctx, life.Done())
}

// BenchmarkColdFirstByte compares a cold request's time to the first byte:
//
//   - unit: Wake (start job) + health gate + GET, the activator's path through this backend;
//   - sigstop: Wake of a SIGSTOPped unit (SIGCONT) + health gate + GET;
//   - socket-proxyd: the first request to a stopped .socket + systemd-socket-proxyd pair (systemd
//     starts the proxy and the app; the proxy connects once, without waiting for health). Requests it
//     fails are counted (failed/op) and retried at once, so its time includes the retries.
//
// Sleeping between iterations is outside the timer.
func BenchmarkColdFirstByte(b *testing.B) {
	m := systemdtest.Start(b)
	p := newProvider(b)
	ctx := context.Background()

	run := func(b *testing.B, sleep SleepMode) {
		unit := uniq("bench") + ".service"
		port := testenv.FreePort(b)
		m.WriteDemo(b, unit, systemdtest.Demo{Port: port})
		r := route(m, unit, port, sleep)
		r.Health.Interval = 50 * time.Millisecond
		be, err := p.Open(r)
		if err != nil {
			b.Fatal(err)
		}
		bk := be.(*Backend)
		b.Cleanup(func() { _ = bk.Stop(context.Background()) })
		if sleep == SleepSIGSTOP { // start it once, then park it
			life, err := bk.Wake(ctx, tenant.Discard)
			if err != nil {
				b.Fatal(err)
			}
			if err := gate(ctx, r, life); err != nil {
				b.Fatal(err)
			}
			if err := bk.Sleep(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			wctx, cancel := context.WithTimeout(ctx, budget)
			life, err := bk.Wake(wctx, tenant.Discard)
			if err == nil {
				err = gate(wctx, r, life)
			}
			if err == nil {
				err = firstByte(wctx, r.Upstream.Address)
			}
			cancel()
			if err != nil {
				b.Fatalf("iteration %d: %v", i, err)
			}
			b.StopTimer()
			if err := bk.Sleep(ctx); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	b.Run("unit", func(b *testing.B) { run(b, SleepStop) })
	b.Run("sigstop", func(b *testing.B) { run(b, SleepSIGSTOP) })
	b.Run("socket-proxyd", func(b *testing.B) {
		pair := m.WriteProxyPair(b, uniq("pair"), systemdtest.Demo{})
		failed := 0
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			wctx, cancel := context.WithTimeout(ctx, budget)
			var err error
			for try := 0; try < 1000; try++ {
				if err = firstByte(wctx, pair.Listen); err == nil {
					break
				}
				failed++
			}
			cancel()
			if err != nil {
				b.Fatalf("iteration %d: %v", i, err)
			}
			b.StopTimer()
			m.StopProxyPair(b, pair)
			b.StartTimer()
		}
		b.ReportMetric(float64(failed)/float64(b.N), "failed/op")
	})
}
