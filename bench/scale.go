package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// runScale starts the activator with N configured idle exec routes and with 10, and compares memory,
// start-up (config load) time, SIGHUP reload time and the warm cost of a request to one route.
func runScale(ctx context.Context, e *env) error {
	n := e.opts.scaleRoutes
	type side struct {
		routes int
		act    *activatorProc
		load   time.Duration
		rss    int64
		host   string
	}
	mode := e.modes()[0]
	var sides []*side
	defer func() {
		for _, s := range sides {
			s.act.Stop(30 * time.Second)
		}
	}()
	for _, count := range []int{n, 10} {
		dir := filepath.Join(e.tmp, fmt.Sprintf("scale-%d", count))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		ports, err := freePorts(3)
		if err != nil {
			return err
		}
		routes := make([]routeSpec, count)
		for i := range routes {
			// Nothing but route 0 is ever woken, so the others' upstream ports need not be free.
			port := 20000 + i%40000
			if i == 0 {
				port = ports[2]
			}
			routes[i] = routeSpec{name: fmt.Sprintf("r%d", i), hosts: []string{fmt.Sprintf("r%d.localhost", i)}, port: port, argv: []string{e.actBin, "app"}}
		}
		act, load, err := startActivatorLevel(ctx, e, dir, mode.srv, renderConfig(ports[0], ports[1], routes), ports[0], ports[1], "info")
		if err != nil {
			return fmt.Errorf("%d routes: %w", count, err)
		}
		s := &side{routes: count, act: act, load: load, host: "r0.localhost"}
		sides = append(sides, s)
		if s.rss, err = rssKiB(act.pid()); err != nil {
			return err
		}
	}
	big, small := sides[0], sides[1]
	row := &ScaleRow{Routes: n, RSSKiB: big.rss, RSSSmallKiB: small.rss,
		LoadMs: float64(big.load.Microseconds()) / 1000, LoadSmallMs: float64(small.load.Microseconds()) / 1000}
	e.report.Scale = row

	// Reload: SIGHUP with the same file, timed to the "config reloaded" log line.
	var reloads []float64
	for i := 0; i < max(1, min(3, e.opts.runs)); i++ {
		seen := big.act.out.expect("config reloaded")
		t0 := time.Now()
		if err := syscall.Kill(big.act.pid(), syscall.SIGHUP); err != nil {
			return err
		}
		select {
		case t1 := <-seen:
			reloads = append(reloads, float64(t1.Sub(t0).Microseconds())/1000)
		case <-time.After(2 * time.Minute):
			return fmt.Errorf("no \"config reloaded\" within 2m of SIGHUP:\n%s", big.act.out.String())
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	row.ReloadMs = summarize(reloads)
	e.report.check(fmt.Sprintf("%d idle routes: activator RSS", n), fmt.Sprintf("%.1f MiB", float64(big.rss)/1024), "≤ 64 MiB", float64(big.rss)/1024 <= 64)

	// Warm requests to one route, alternating between the two activators.
	wrk, ok := e.tools["wrk"]
	if !ok {
		e.report.skip("route scale, warm requests", "wrk not found (Debian package wrk)")
		return nil
	}
	for _, s := range sides {
		if err := waitHTTPHost(ctx, s.act.proc, s.act.edge, "/", s.host, time.Minute); err != nil {
			return fmt.Errorf("%d routes: first request: %w", s.routes, err)
		}
		w := wrkRun{url: "http://" + s.act.edge + "/", host: s.host, conns: 16, threads: 1, dur: time.Second, cpus: mode.load}
		if _, err := w.run(ctx, wrk); err != nil {
			return err
		}
	}
	rps := map[int][]float64{}
	p50 := map[int][]float64{}
	for run := 0; run < e.opts.runs; run++ {
		for i := range sides {
			s := sides[(i+run)%2]
			w := wrkRun{url: "http://" + s.act.edge + "/", host: s.host, conns: 16, threads: 1, dur: e.opts.dur, cpus: mode.load}
			r, err := w.run(ctx, wrk)
			if err != nil {
				e.log.Warn("wrk run failed", "routes", s.routes, "err", err)
				r = wrkResult{RPS: math.NaN(), P50: math.NaN()}
			}
			rps[s.routes] = append(rps[s.routes], r.RPS)
			p50[s.routes] = append(p50[s.routes], r.P50)
		}
	}
	row.RPS, row.RPSSmall = summarize(rps[n]), summarize(rps[10])
	row.P50us, row.P50usSmall = summarize(p50[n]), summarize(p50[10])
	row.Ratio = ratios(rps[n], rps[10])
	// RSS again now that route 0 is awake and warm.
	if v, err := rssKiB(big.act.pid()); err == nil {
		row.RSSKiB = max(row.RSSKiB, v)
	}
	if v, err := rssKiB(small.act.pid()); err == nil {
		row.RSSSmallKiB = max(row.RSSSmallKiB, v)
	}
	row.HeapKiB = int64(scrapeMetric(ctx, big.act.admin, "go_memstats_heap_inuse_bytes") / 1024)
	row.HeapSmallKiB = int64(scrapeMetric(ctx, small.act.admin, "go_memstats_heap_inuse_bytes") / 1024)
	return nil
}

// scrapeMetric reads one unlabelled sample from the admin API's /metrics; NaN when absent.
func scrapeMetric(ctx context.Context, admin, name string) float64 {
	body, err := getText(ctx, admin, "/metrics")
	if err != nil {
		return math.NaN()
	}
	return metricValue(string(body), name)
}

// metricValue finds "name value" in Prometheus text exposition.
func metricValue(text, name string) float64 {
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return math.NaN()
}

// waitHTTPHost is waitHTTP with a Host header.
func waitHTTPHost(ctx context.Context, p *proc, addr, path, host string, budget time.Duration) error {
	deadline := time.Now().Add(budget)
	for i := 0; i < 100000; i++ {
		code, body, err := rawGet(ctx, addr, path, host, budget)
		if err == nil && code == 200 {
			return nil
		}
		if p.exited() || time.Now().After(deadline) {
			return fmt.Errorf("GET %s (Host %s): %d %s %v", path, host, code, body, err)
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return fmt.Errorf("GET %s (Host %s): gave up", path, host)
}
