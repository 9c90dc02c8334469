package unit

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"syscall"
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

// selfCPU is the CPU time this process has used so far: the backend, its D-Bus connection, the gate.
func selfCPU(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// managerCPU is the CPU time m's manager process has used so far (its threads' schedstat).
func managerCPU(b *testing.B, m *systemdtest.Manager) time.Duration {
	b.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", m.PID))
	if err != nil {
		b.Fatal(err)
	}
	var sum time.Duration
	for _, t := range tasks {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", m.PID, t.Name()))
		if err != nil {
			continue // the thread ended
		}
		var ns int64
		if _, err := fmt.Sscan(string(data), &ns); err == nil {
			sum += time.Duration(ns)
		}
	}
	return sum
}

// BenchmarkColdFirstByte compares a cold request's time to the first byte:
//
//   - unit: Wake (start job) + health gate + GET, the activator's path through this backend;
//   - sigstop: Wake of a SIGSTOPped unit (SIGCONT) + health gate + GET;
//   - socket-proxyd: the first request to a stopped .socket + systemd-socket-proxyd pair (systemd
//     starts the proxy and the app; the proxy connects once, without waiting for health). Requests it
//     fails are counted (failed/op) and retried at once, so its time includes the retries.
//
// Sleeping between iterations is outside the timer. The unit and sigstop runs also report the CPU time
// the manager (manager-cpu-ns/op) and this process (self-cpu-ns/op) spent on each wake.
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
		var cpu, self time.Duration
		cpu0, self0 := managerCPU(b, m), selfCPU(b)
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
			cpu, self = cpu+managerCPU(b, m)-cpu0, self+selfCPU(b)-self0
			if err := bk.Sleep(ctx); err != nil {
				b.Fatal(err)
			}
			cpu0, self0 = managerCPU(b, m), selfCPU(b)
			b.StartTimer()
		}
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "manager-cpu-ns/op")
		b.ReportMetric(float64(self.Nanoseconds())/float64(b.N), "self-cpu-ns/op")
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
