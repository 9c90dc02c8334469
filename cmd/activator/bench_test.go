package main

// Benchmarks of the core wake path through the real composition (see main_test.go's harness). Run:
//
//	go test -bench . -run '^$' ./cmd/activator
//
// The figures each benchmark reports, and how they are measured, are documented in
// docs/benchmarks.md ("Core wake path (go test -bench)").

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	osexec "os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/demoapp"
	"github.com/activator/activator/internal/health"
	"github.com/activator/activator/internal/registry"
)

// BenchmarkWarmPath compares an awake route through the activator with the same demo app called
// directly: keep-alive clients (16 at once: throughput; 1: the latency one request pays), GET /, a
// fixed batch of requests per path and per iteration (interleaved, so drift hits both alike).
func BenchmarkWarmPath(b *testing.B) {
	b.Run("conc=16", func(b *testing.B) { benchWarmPath(b, 16, 4000) })
	b.Run("conc=1", func(b *testing.B) { benchWarmPath(b, 1, 1000) })
}

func benchWarmPath(b *testing.B, conc, batch int) {
	app := appRoute{Name: "warm"}
	h := newHarness(b, configYAML(b, app))
	if r := h.get(app.host(), "/"); r.code != http.StatusOK {
		b.Fatalf("wake: %d %q", r.code, r.body)
	}
	upstream := h.status(app.Name).Upstream

	newClient := func() *http.Client {
		return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc, DisableCompression: true}}
	}
	edgeC, directC := newClient(), newClient()
	defer edgeC.CloseIdleConnections()
	defer directC.CloseIdleConnections()
	edgeURL, directURL := "http://"+h.edgeAddr+"/", "http://"+upstream+"/"

	var edge, direct loadResult
	for b.Loop() {
		d, err := runLoad(directC, directURL, "", batch, conc)
		if err != nil {
			b.Fatal(err)
		}
		direct.add(b, d)
		e, err := runLoad(edgeC, edgeURL, app.host(), batch, conc)
		if err != nil {
			b.Fatal(err)
		}
		edge.add(b, e)
	}
	dRPS, eRPS := direct.rps(), edge.rps()
	dP50, dP99 := direct.pct(50), direct.pct(99)
	eP50, eP99 := edge.pct(50), edge.pct(99)
	b.ReportMetric(dRPS, "direct-req/s")
	b.ReportMetric(eRPS, "edge-req/s")
	b.ReportMetric(eRPS/dRPS, "throughput-ratio")
	b.ReportMetric(us(dP50), "direct-p50-µs")
	b.ReportMetric(us(eP50), "edge-p50-µs")
	b.ReportMetric(us(dP99), "direct-p99-µs")
	b.ReportMetric(us(eP99), "edge-p99-µs")
	b.ReportMetric(float64(eP50)/float64(dP50), "p50-ratio")
	b.ReportMetric(float64(eP99)/float64(dP99), "p99-ratio")
}

// loadResult accumulates the latencies and wall time of several load runs.
type loadResult struct {
	lat     []time.Duration
	elapsed time.Duration
}

func (l *loadResult) add(b *testing.B, r loadResult) {
	b.Helper()
	l.lat = append(l.lat, r.lat...)
	l.elapsed += r.elapsed
}

func (l *loadResult) rps() float64 { return float64(len(l.lat)) / l.elapsed.Seconds() }

// pct is the p-th percentile latency (nearest rank).
func (l *loadResult) pct(p int) time.Duration {
	s := slices.Clone(l.lat)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	i := (len(s)*p+99)/100 - 1
	return s[max(i, 0)]
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// runLoad sends n GETs to url from conc goroutines and returns every latency and the wall time.
func runLoad(c *http.Client, url, host string, n, conc int) (loadResult, error) {
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		mu      sync.Mutex
		lat     = make([]time.Duration, 0, n)
		firstEr error
	)
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([]time.Duration, 0, n/conc+1)
			defer func() {
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			}()
			for next.Add(1) <= int64(n) {
				req, err := http.NewRequest(http.MethodGet, url, nil)
				if err != nil {
					setErr(&mu, &firstEr, err)
					return
				}
				if host != "" {
					req.Host = host
				}
				t0 := time.Now()
				resp, err := c.Do(req)
				if err != nil {
					setErr(&mu, &firstEr, err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mine = append(mine, time.Since(t0))
				if resp.StatusCode != http.StatusOK {
					setErr(&mu, &firstEr, fmt.Errorf("GET %s: status %d", url, resp.StatusCode))
					return
				}
			}
		}()
	}
	wg.Wait()
	return loadResult{lat: lat, elapsed: time.Since(start)}, firstEr
}

func setErr(mu *sync.Mutex, dst *error, err error) {
	mu.Lock()
	defer mu.Unlock()
	if *dst == nil {
		*dst = err
	}
}

// BenchmarkColdWake measures what the activator adds to a cold start: each iteration puts the route to
// sleep (untimed), then sends GET /bound and takes the time to the first response byte (TTFB). The
// demo app reports, in wall-clock unix nanoseconds, when its main() began (main_ns) and when it was
// listening (bound_ns). With t0 the wall-clock time the request was sent:
//
//	app      = bound_ns - main_ns                the app's own start-up, main() to listening
//	pre      = main_ns - t0                      request → route → wake → fork/exec → runtime init → main()
//	post     = first byte - bound_ns             listening → health gate passes → release → proxy → first byte
//	overhead = TTFB - app = pre + post
//
// post is split at the moment the wake is logged as done ("woke": the gate passed, the waiters just
// released, the first of them on its way upstream): bound-to-gate (health probing notices the app) and gate-to-first-byte (release, proxy
// dial, the app's answer). spawn is the wake record's spawn phase (fork and exec).
//
// pre includes the cost of exec'ing the app and of its runtime initialising before main(), which is the
// app's, not the activator's: exec-to-main measures it by starting the same binary the same way with
// os/exec (no activator), once per iteration, and overhead-net is the median of the per-iteration
// overhead - exec-to-main.
//
// The sub-benchmark gate=timer-100µs is an experiment, not the product: the same wake with the health
// gate replaced by one that pauses 100 µs between probes on a time.Timer. In an otherwise idle process
// such a timer fires after about 1 ms (the runtime parks in epoll_wait, whose timeout is in whole
// milliseconds), which is why the product gate paces its fast phase on timerfd ticks instead
// (internal/health/tick.go); compare its bound-to-gate-ms with listen=env's.
func BenchmarkColdWake(b *testing.B) {
	for _, mode := range []string{"env", "listen_fds"} {
		b.Run("listen="+mode, func(b *testing.B) { benchColdWake(b, mode) })
	}
	b.Run("listen=env/gate=timer-100µs", func(b *testing.B) {
		benchColdWake(b, "env", func(o *activator.Options) {
			o.NewGate = func(r *registry.Route) activator.Gate {
				return &pacedGate{probe: health.New(r.Upstream, r.Health), pause: 100 * time.Microsecond}
			}
		})
	})
}

// pacedGate passes on the first good probe, probing at a fixed pause (the experiment above).
type pacedGate struct {
	probe *health.Prober
	pause time.Duration
}

func (g *pacedGate) Wait(ctx context.Context, gone <-chan struct{}) error {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-gone:
			return health.ErrGone
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		if g.probe.Probe(ctx) == nil {
			return nil
		}
		t.Reset(g.pause)
	}
}

func benchColdWake(b *testing.B, mode string, tweaks ...func(*activator.Options)) {
	app := appRoute{Name: "cold", Listen: mode, StopGrace: "5s"}
	h := newHarness(b, configYAML(b, app), tweaks...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

	var ttfb, appT, pre, post, over, spawn, gate, proxy, base, net []time.Duration
	for b.Loop() {
		b.StopTimer()
		if err := h.srv.Sleep(ctx, app.Name); err != nil {
			b.Fatalf("sleep: %v", err)
		}
		// One baseline sample per iteration, so background load affects both alike.
		base = append(base, execToMain(b))
		b.StartTimer()
		var first time.Time
		trace := &httptrace.ClientTrace{GotFirstResponseByte: func() { first = time.Now() }}
		req := h.request(httptrace.WithClientTrace(ctx, trace), http.MethodGet, app.host(), "/bound", nil)
		t0 := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		var bound struct {
			MainNS  int64 `json:"main_ns"`
			BoundNS int64 `json:"bound_ns"`
		}
		err = json.NewDecoder(resp.Body).Decode(&bound)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || err != nil {
			b.Fatalf("GET /bound: %d %v", resp.StatusCode, err)
		}
		b.StopTimer()
		woke := h.rec.waitFor(b, len(ttfb)+1, "woke", "route", app.Name)
		gateAt := woke[len(woke)-1].time
		if rec := h.status(app.Name).LastWake; rec != nil && len(rec.Phases) > 0 {
			spawn = append(spawn, rec.Phases[0].Duration)
		}
		gate = append(gate, time.Duration(gateAt.UnixNano()-bound.BoundNS))
		proxy = append(proxy, first.Sub(gateAt))
		b.StartTimer()
		t := first.Sub(t0)
		a := time.Duration(bound.BoundNS - bound.MainNS)
		ttfb = append(ttfb, t)
		appT = append(appT, a)
		pre = append(pre, time.Duration(bound.MainNS-t0.UnixNano()))
		post = append(post, time.Duration(first.UnixNano()-bound.BoundNS))
		over = append(over, t-a)
		net = append(net, t-a-base[len(base)-1])
	}
	b.StopTimer()
	if n := len(h.spawns(app.Name)); n != len(ttfb) {
		b.Fatalf("%d spawns for %d cold requests", n, len(ttfb))
	}
	b.ReportMetric(ms(median(ttfb)), "ttfb-ms")
	b.ReportMetric(ms(median(appT)), "app-ms")
	b.ReportMetric(ms(median(pre)), "pre-ms")
	b.ReportMetric(ms(median(post)), "post-ms")
	b.ReportMetric(ms(median(spawn)), "spawn-ms")
	b.ReportMetric(ms(median(gate)), "bound-to-gate-ms")
	b.ReportMetric(ms(median(proxy)), "gate-to-first-byte-ms")
	b.ReportMetric(ms(median(over)), "overhead-ms")
	b.ReportMetric(ms(median(base)), "exec-to-main-ms")
	b.ReportMetric(ms(median(net)), "overhead-net-ms")
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// execToMain is the time from starting this binary as the demo app with os/exec (as the exec backing
// does: own process group, parent-death signal) to its main() beginning, as the app reports it.
func execToMain(b *testing.B) time.Duration {
	b.Helper()
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	port, err := freePort()
	if err != nil {
		b.Fatal(err)
	}
	cmd := osexec.Command(self)
	cmd.Env = append(os.Environ(), demoapp.ChildEnv+"=1", "PORT="+strconv.Itoa(port))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	mainNS, err := pollBound(c, "127.0.0.1:"+strconv.Itoa(port))
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait()
	if err != nil {
		b.Fatal(err)
	}
	return time.Duration(mainNS - t0.UnixNano())
}

// pollBound asks addr for /bound until it answers (bounded by patience) and returns main_ns.
func pollBound(c *http.Client, addr string) (int64, error) {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(patience)
	defer deadline.Stop()
	for {
		resp, err := c.Get("http://" + addr + "/bound")
		if err == nil {
			var v struct {
				MainNS int64 `json:"main_ns"`
			}
			err = json.NewDecoder(resp.Body).Decode(&v)
			resp.Body.Close()
			return v.MainNS, err
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return 0, fmt.Errorf("the app on %s did not answer within %v: %w", addr, patience, err)
		}
	}
}

// BenchmarkHerd sends 1,000 concurrent requests to a cold route and reports the spawns (must be 1), the
// release spread (gate passed → the last held request left the hold, from the wake record), the
// responses' spread (first to last response, gate to first and to last), and the memory each held request
// costs. The requests are written on raw keep-alive TCP connections and not read until all are held,
// so the client side adds no goroutines while memory is measured: after a forced GC, before the herd
// and once the admin API reports all 1,000 held, the deltas of HeapInuse, HeapInuse+StackInuse and Sys
// divided by 1,000. The client's own connections (a few hundred bytes each) are included.
func BenchmarkHerd(b *testing.B) {
	const n = 1000
	// The start delay holds the wake open while the herd is opened and measured; the benchmark fails if
	// the wake ends before all n are held.
	app := appRoute{Name: "herd", Env: map[string]string{"DEMOAPP_START_DELAY": "3s"}}
	h := newHarness(b, configYAML(b, app))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	raw := []byte("GET / HTTP/1.1\r\nHost: " + app.host() + "\r\n\r\n")
	// HERD_HEAP_PROFILE=file writes a heap profile (every allocation sampled) while the herd is held,
	// to see what a held request is made of: go tool pprof -sample_index=inuse_space file.
	profile := os.Getenv("HERD_HEAP_PROFILE")
	if profile != "" {
		defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
		runtime.MemProfileRate = 1
	}

	var heap, heapStack, sys, spreads, gateToFirst, gateToLast, releases []float64
	for b.Loop() {
		b.StopTimer()
		if err := h.srv.Sleep(ctx, app.Name); err != nil {
			b.Fatalf("sleep: %v", err)
		}
		spawned := len(h.spawns(app.Name))
		woke := len(h.rec.matching("woke", "route", app.Name))
		var before, during runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		b.StartTimer()

		conns := make([]net.Conn, 0, n)
		for range n {
			c, err := net.Dial("tcp", h.edgeAddr)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := c.Write(raw); err != nil {
				b.Fatal(err)
			}
			conns = append(conns, c)
		}
		h.waitStatus(app.Name, fmt.Sprintf("holding %d requests", n), func(s activator.Status) bool {
			if s.State != "waking" {
				b.Fatalf("the wake ended with %d of %d requests held: raise DEMOAPP_START_DELAY", s.Held, n)
			}
			return s.Held == n
		})
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&during)
		heap = append(heap, float64(int64(during.HeapInuse)-int64(before.HeapInuse))/n)
		heapStack = append(heapStack, float64(int64(during.HeapInuse+during.StackInuse)-int64(before.HeapInuse+before.StackInuse))/n)
		sys = append(sys, float64(int64(during.Sys)-int64(before.Sys))/n)
		if profile != "" {
			f, err := os.Create(profile)
			if err != nil {
				b.Fatal(err)
			}
			if err := pprof.WriteHeapProfile(f); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
		b.StartTimer()

		arrived := make([]time.Time, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i, c := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					errs[i] = err
					return
				}
				arrived[i] = time.Now()
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs[i] = fmt.Errorf("status %d", resp.StatusCode)
				}
			}()
		}
		wg.Wait()
		b.StopTimer()
		for i, err := range errs {
			if err != nil {
				b.Fatalf("request %d: %v", i, err)
			}
		}
		if got := len(h.spawns(app.Name)) - spawned; got != 1 {
			b.Fatalf("%d spawns for one herd, want 1", got)
		}
		wokeRecs := h.rec.waitFor(b, woke+1, "woke", "route", app.Name)
		gate := wokeRecs[len(wokeRecs)-1].time
		first, last := slices.MinFunc(arrived, time.Time.Compare), slices.MaxFunc(arrived, time.Time.Compare)
		spreads = append(spreads, ms(last.Sub(first)))
		gateToFirst = append(gateToFirst, ms(first.Sub(gate)))
		gateToLast = append(gateToLast, ms(last.Sub(gate)))
		if lw := h.status(app.Name).LastWake; lw != nil && lw.Released == n {
			releases = append(releases, ms(lw.ReleaseSpread))
		} else {
			b.Fatalf("last wake %+v: want %d requests released", lw, n)
		}
		b.StartTimer()
	}
	b.ReportMetric(1, "spawns/herd")
	b.ReportMetric(medianF(releases), "release-spread-ms")
	b.ReportMetric(medianF(spreads), "first-to-last-response-ms")
	b.ReportMetric(medianF(gateToFirst), "gate-to-first-ms")
	b.ReportMetric(medianF(gateToLast), "gate-to-last-ms")
	b.ReportMetric(medianF(heap)/1024, "heap-KiB/held")
	b.ReportMetric(medianF(heapStack)/1024, "heap+stack-KiB/held")
	b.ReportMetric(medianF(sys)/1024, "sys-KiB/held")
}

func medianF(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
