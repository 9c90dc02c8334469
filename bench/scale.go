package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// runScale starts the activator with N configured idle exec routes and with 10, and compares memory,
// start-up (config load) time, SIGHUP reload time and the warm cost of a request to one route: the
// middle one of each config (route #50,000 of 100,000), so the lookup is not helped by being first.
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
			s.act.Stop(time.Minute)
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
		woken := count / 2
		routes := make([]routeSpec, count)
		for i := range routes {
			// Only the woken route's upstream is ever dialed, so the others' need not be free; they stay
			// below the kernel's ephemeral range (32768 up), where freePorts finds the activator's own
			// listen and admin ports, which no upstream may name.
			port := 20000 + i%12000
			if i == woken {
				port = ports[2]
			}
			routes[i] = routeSpec{name: fmt.Sprintf("r%d", i), hosts: []string{fmt.Sprintf("r%d.localhost", i)}, port: port, argv: []string{e.actBin, "app"}}
		}
		act, load, err := startActivatorLevel(ctx, e, dir, mode.srv, renderConfig(ports[0], ports[1], routes), ports[0], ports[1], "info")
		if err != nil {
			return fmt.Errorf("%d routes: %w", count, err)
		}
		s := &side{routes: count, act: act, load: load, host: fmt.Sprintf("r%d.localhost", woken)}
		sides = append(sides, s)
		if s.rss, err = rssKiB(act.pid()); err != nil {
			return err
		}
	}
	big, small := sides[0], sides[1]
	row := &ScaleRow{Routes: n, RSSKiB: big.rss, RSSSmallKiB: small.rss, Host: big.host,
		LoadMs: float64(big.load.Microseconds()) / 1000, LoadSmallMs: float64(small.load.Microseconds()) / 1000}
	e.report.Scale = row
	// The RSS once the start-up's host checks (liveCheck, after the admin API answers) are done too.
	settled := func() (int64, error) {
		if !settle(ctx, big.act.pid(), time.Minute) {
			e.log.Warn("the activator did not go quiet within a minute", "routes", n)
		}
		return rssKiB(big.act.pid())
	}
	var err error
	if row.RSSSettledKiB, err = settled(); err != nil {
		return err
	}
	// Three /metrics scrapes as Prometheus makes them (its default Accept header, gzip): an operator
	// scrapes every 15 s, so a scrape's time and the memory it leaves behind belong to the RSS figures.
	for i := 0; i < 3; i++ {
		d, size, err := promScrape(ctx, big.act.admin)
		if err != nil {
			return fmt.Errorf("%d routes: /metrics: %w", n, err)
		}
		row.ScrapeMs = append(row.ScrapeMs, float64(d.Microseconds())/1000)
		row.ScrapeKiB = float64(size) / 1024
	}
	if row.RSSScrapedKiB, err = settled(); err != nil {
		return err
	}

	// Three reloads, each after an edit of one route (its idle window), as an operator's reload is:
	// SIGHUP, timed to the "config reloaded" log line, and the RSS at that line and once the reload's
	// host checks are done. Then one reload after an edit of every route (its wake budget), which makes
	// the activator decode every route again: what any reload cost before it kept unchanged ones. The
	// activator's CPU time over each reload is reported too: on a shared machine it moves less than
	// the wall time.
	config, err := os.ReadFile(big.act.config)
	if err != nil {
		return err
	}
	reload := func(edit func([]byte) []byte) (wall, cpu float64, err error) {
		config = edit(config)
		if err := os.WriteFile(big.act.config, config, 0o644); err != nil {
			return 0, 0, err
		}
		seen := big.act.out.expect("config reloaded")
		cpu0 := cpuTime(big.act.pid())
		t0 := time.Now()
		if err := syscall.Kill(big.act.pid(), syscall.SIGHUP); err != nil {
			return 0, 0, err
		}
		select {
		case t1 := <-seen:
			return float64(t1.Sub(t0).Microseconds()) / 1000, float64((cpuTime(big.act.pid()) - cpu0).Microseconds()) / 1000, nil
		case <-time.After(2 * time.Minute):
			return 0, 0, fmt.Errorf("no \"config reloaded\" within 2m of SIGHUP:\n%s", big.act.out.String())
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		}
	}
	var reloads, reloadCPU []float64
	for i := 0; i < 3; i++ {
		// r1, r2, r3 get an idle window of their own (the file writes "idle: 1h" for every route).
		name := fmt.Sprintf("  - name: r%d\n", i+1)
		wall, cpu, err := reload(func(c []byte) []byte {
			at := bytes.Index(c, []byte(name))
			idle := at + bytes.Index(c[at:], []byte("    idle: 1h\n"))
			return slices.Concat(c[:idle], []byte(fmt.Sprintf("    idle: %dm\n", 61+i)), c[idle+len("    idle: 1h\n"):])
		})
		if err != nil {
			return err
		}
		reloads, reloadCPU = append(reloads, wall), append(reloadCPU, cpu)
		v, err := rssKiB(big.act.pid())
		if err != nil {
			return err
		}
		row.RSSReloadKiB = append(row.RSSReloadKiB, v)
		if v, err = settled(); err != nil {
			return err
		}
		row.RSSReloadSettledKiB = append(row.RSSReloadSettledKiB, v)
	}
	row.ReloadDecoded = strings.Count(big.act.out.String(), "decoded=1\n")
	if row.ReloadAllMs, row.ReloadAllCPUMs, err = reload(func(c []byte) []byte {
		return bytes.ReplaceAll(c, []byte("    wake_budget: 60s\n"), []byte("    wake_budget: 61s\n"))
	}); err != nil {
		return err
	}
	if _, err := settled(); err != nil {
		return err
	}
	row.ReloadMs, row.ReloadCPUMs = summarize(reloads), summarize(reloadCPU)
	rssGoal := scaleRSSGoal(n)
	mib := func(kib int64) float64 { return float64(kib) / 1024 }
	rl := row.RSSReloadSettledKiB
	e.report.check(fmt.Sprintf("%d idle routes: activator RSS after load, settled (at the admin API's first answer)", n), fmt.Sprintf("%.1f MiB (%.1f MiB)", mib(row.RSSSettledKiB), mib(big.rss)),
		fmt.Sprintf("≤ %d MiB", rssGoal), mib(max(big.rss, row.RSSSettledKiB)) <= float64(rssGoal))
	e.report.check(fmt.Sprintf("%d idle routes: activator RSS after three /metrics scrapes as Prometheus makes them, settled (each scrape took %s ms)", n, fmtStat(summarize(row.ScrapeMs), 0)), fmt.Sprintf("%.1f MiB", mib(row.RSSScrapedKiB)),
		fmt.Sprintf("≤ %d MiB", rssGoal), mib(row.RSSScrapedKiB) <= float64(rssGoal))
	e.report.check(fmt.Sprintf("%d idle routes: activator RSS after three reloads, settled (each reload)", n), fmt.Sprintf("%.1f MiB (%.1f, %.1f, %.1f)", mib(rl[2]), mib(rl[0]), mib(rl[1]), mib(rl[2])),
		fmt.Sprintf("≤ %d MiB", rssGoal), mib(slices.Max(rl)) <= float64(rssGoal))
	e.report.check(fmt.Sprintf("%d idle routes: config reload after one route's edit (SIGHUP → \"config reloaded\"; %d of 3 logged decoded=1)", n, row.ReloadDecoded), fmtStat(row.ReloadMs, 0)+" ms (the activator's CPU time: "+fmtStat(row.ReloadCPUMs, 0)+" ms)", "≤ 2000 ms, every reload", row.ReloadMs.Max <= 2000)

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
	e.report.check(fmt.Sprintf("warm req/s to route %s of %d ÷ to one of 10 (%s, c16)", big.host, n, mode.name), fmtStat(row.Ratio, 2)+" over "+strconv.Itoa(e.opts.runs)+" rounds",
		"≥ 0.9 (the same speed, within this box's noise)", row.Ratio.valid() && row.Ratio.Median >= 0.9)
	// RSS again now that the route is awake and warm.
	if v, err := rssKiB(big.act.pid()); err == nil {
		row.RSSWarmKiB = v
	}
	if v, err := rssKiB(small.act.pid()); err == nil {
		row.RSSSmallKiB = max(row.RSSSmallKiB, v)
	}
	row.HeapKiB = int64(scrapeMetric(ctx, big.act.admin, "go_memstats_heap_inuse_bytes") / 1024)
	row.HeapSmallKiB = int64(scrapeMetric(ctx, small.act.admin, "go_memstats_heap_inuse_bytes") / 1024)
	return nil
}

// promScrape GETs /metrics from admin as Prometheus 2 does by default (its Accept header, gzip) and
// returns how long the whole answer took and its size on the wire.
func promScrape(ctx context.Context, admin string) (time.Duration, int, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Accept", "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
	req.Header.Set("Accept-Encoding", "gzip") // set by hand, so the client leaves the body compressed
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	d := time.Since(t0)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %d", resp.StatusCode)
	}
	return d, int(n), err
}

// cpuTime is the user and system CPU time pid has used (/proc/PID/stat), 0 when it cannot be read.
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name, which is in parentheses and may hold spaces: utime and stime
	// are the 12th and 13th, in clock ticks (100 a second on Linux).
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// settle waits until pid has used next to no CPU time for a second, at most max, and reports whether
// it did: the activator has finished what a start or a reload set off (its host checks).
func settle(ctx context.Context, pid int, max time.Duration) bool {
	deadline := time.Now().Add(max)
	last, quiet := cpuTime(pid), 0
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(250 * time.Millisecond):
		}
		c := cpuTime(pid)
		if c-last <= 20*time.Millisecond {
			quiet++
		} else {
			quiet = 0
		}
		last = c
		if quiet >= 4 {
			return true
		}
	}
	return false
}

// scaleRSSGoal is the RSS target in MiB for n idle routes: 64 MiB up to 10,000 routes (the first
// benchmark issue), 400 MiB for more (100,000: the second).
func scaleRSSGoal(n int) int {
	if n <= 10000 {
		return 64
	}
	return 400
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
