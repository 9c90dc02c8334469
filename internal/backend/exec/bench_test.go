package exec

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/activator/activator/internal/demoapp"
	"github.com/activator/activator/internal/health"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
	"github.com/activator/activator/internal/testenv"
)

// BenchmarkColdFirstByte times a cold request's path through this backing as the activator runs it:
// Wake, the health gate (GET /healthz, paced by a health.Pacer, its passing connection kept) and
// one GET / on that connection, for each listen mode, with the tenant in a cgroup of its own and by
// process group only. The tenant is this test binary as the demo app. Sleeping between iterations
// is outside the timer. Reported besides ns/op: spawn-ns/op (Wake), gate-ns/op (Wake returned →
// gate passed), get-ns/op (gate passed → the GET's status line) and cpu-ns/op (this process's CPU time:
// the backing, the gate and the GET).
func BenchmarkColdFirstByte(b *testing.B) {
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	pacer := health.NewPacer()
	b.Cleanup(func() { _ = pacer.Close() })
	for _, contain := range []string{"cgroup", "pgroup"} {
		for _, mode := range []ListenMode{ListenEnv, ListenFDs} {
			b.Run(contain+"/"+string(mode), func(b *testing.B) {
				var c *Containment
				if contain == "cgroup" {
					c = contained(b)
				}
				up := testenv.FreeTCP(b)
				s := &Settings{Argv: []string{self}, Path: self, Listen: mode, StopGrace: time.Second,
					StopSignal: syscall.SIGTERM,
					Env:        map[string]string{demoapp.ChildEnv: "1", "GORACE": "atexit_sleep_ms=0"}}
				be, err := New(&registry.Route{Name: "bench", Upstream: up, Settings: s}, Options{Containment: c})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = be.Close(context.Background()) })
				gate := health.New(up, registry.Health{Path: "/healthz", Interval: time.Second, Timeout: budget}, health.WithPacer(pacer))
				ctx := context.Background()
				var spawn, gated, got, cpu time.Duration
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					wctx, cancel := context.WithTimeout(ctx, budget)
					cpu0 := selfCPU(b)
					t0 := time.Now()
					life, err := be.Wake(wctx, tenant.Discard)
					t1 := time.Now()
					var conn net.Conn
					if err == nil {
						conn, err = gate.WaitConn(wctx, life.Done())
					}
					t2 := time.Now()
					if err == nil {
						err = getOn(wctx, conn, up)
					}
					t3 := time.Now()
					cancel()
					if err != nil {
						b.Fatalf("iteration %d: %v", i, err)
					}
					spawn, gated, got, cpu = spawn+t1.Sub(t0), gated+t2.Sub(t1), got+t3.Sub(t2), cpu+selfCPU(b)-cpu0
					b.StopTimer()
					if err := be.Sleep(ctx); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				n := float64(b.N)
				b.ReportMetric(float64(spawn.Nanoseconds())/n, "spawn-ns/op")
				b.ReportMetric(float64(gated.Nanoseconds())/n, "gate-ns/op")
				b.ReportMetric(float64(got.Nanoseconds())/n, "get-ns/op")
				b.ReportMetric(float64(cpu.Nanoseconds())/n, "cpu-ns/op")
			})
		}
	}
}

// selfCPU is the CPU time this process has used so far (its children's not included).
func selfCPU(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// getOn sends GET / on c (or, when c is nil, on a fresh connection to up), closes it and returns once
// the status line reads 200.
func getOn(ctx context.Context, c net.Conn, up registry.Upstream) error {
	if c == nil {
		var err error
		if c, err = up.Dial(ctx); err != nil {
			return err
		}
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "HTTP/1.1 200") {
		return fmt.Errorf("status line %q", line)
	}
	return nil
}

// BenchmarkCheckBeforeContain is Check as `activator check` calls it, once for each route, with no
// Containment made: the cgroup probe behind the verdict (/proc/self/mountinfo, /proc/self/cgroup)
// is made by the first call only. Made for every call it was about 120 µs a route here, 9 of the 16 s
// check took over 100,000 routes.
func BenchmarkCheckBeforeContain(b *testing.B) {
	p := NewProvider(Options{})
	p.CheckRoot("")
	r := &registry.Route{Name: "app", Upstream: registry.Upstream{Network: "tcp", Address: "127.0.0.1:8080"},
		Settings: &Settings{Argv: []string{"/bin/true"}, Path: "/bin/true"}}
	first := p.Check(context.Background(), r)
	for b.Loop() {
		if err := p.Check(context.Background(), r); fmt.Sprint(err) != fmt.Sprint(first) {
			b.Fatalf("Check = %v, then %v: the verdict changed", first, err)
		}
	}
}
