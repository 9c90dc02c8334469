package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// warmTarget is one server the warm-path comparisons measure.
type warmTarget struct {
	name string
	addr string
	tls  bool  // served over HTTPS (the TLS rows; false there is the activator's plain listener)
	proc *proc // nil for targets owned elsewhere
}

// url is the URL the load generators ask t for.
func (t warmTarget) url() string {
	if t.tls {
		return "https://" + t.addr + "/"
	}
	return "http://" + t.addr + "/"
}

// runWarm measures the same tiny app behind nothing, the activator and each peer proxy, with wrk at
// each connection count, in alternating order, for each CPU placement.
func runWarm(ctx context.Context, e *env) error {
	wrk, ok := e.tools["wrk"]
	if !ok {
		e.report.skip("warm path", "wrk not found (Debian package wrk)")
		return nil
	}
	for _, p := range peerDefs {
		if _, ok := e.tools[p.binary]; !ok {
			e.report.skip(p.name, "%s not found (Debian package %s): left out of the warm-path comparison", p.binary, p.pkg)
		}
	}
	for _, mode := range e.modes() {
		if err := warmMode(ctx, e, wrk, mode); err != nil {
			return fmt.Errorf("%s: %w", mode.name, err)
		}
	}
	return nil
}

func warmMode(ctx context.Context, e *env, wrk string, mode cpuMode) error {
	dir := filepath.Join(e.tmp, "warm-"+mode.name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.Stop(5 * time.Second)
		}
	}()

	// The app the peers (and "direct") use.
	app, appPort, err := startBenchApp(ctx, e, mode.srv)
	if app != nil {
		procs = append(procs, app)
	}
	if err != nil {
		return err
	}
	appAddr := fmt.Sprintf("127.0.0.1:%d", appPort)
	targets := []warmTarget{{name: "direct", addr: appAddr, proc: app}}

	// The activator, with its own copy of the app as an exec tenant (started by the first request).
	act, err := startWokenActivator(ctx, e, dir, mode.srv, "warm")
	if act != nil {
		procs = append(procs, act.proc)
	}
	if err != nil {
		return err
	}
	targets = append(targets, warmTarget{name: "activator", addr: act.edge, proc: act.proc})

	// The activator with its event loops off (edge.event_loops: 0): net/http's path alone, the
	// default before the loops were on by default (one per CPU the process may use, which in the
	// pinned mode is one, as HAProxy's threads), read against the default's.
	if nact, err := startWokenActivatorWith(ctx, e, filepath.Join(dir, "noloop"), mode.srv, "warm",
		"edge:\n  event_loops: 0\n"); nact != nil {
		procs = append(procs, nact.proc)
		if err != nil {
			e.report.skip("activator-noloop ("+mode.name+")", "%v", err)
		} else {
			targets = append(targets, warmTarget{name: "activator-noloop", addr: nact.edge, proc: nact.proc})
		}
	} else if err != nil {
		e.report.skip("activator-noloop ("+mode.name+")", "%v", err)
	}

	for _, pd := range peerDefs {
		if _, ok := e.tools[pd.binary]; !ok {
			continue
		}
		port, err := freePort()
		if err != nil {
			return err
		}
		pdir := filepath.Join(dir, pd.name)
		if err := os.MkdirAll(pdir, 0o755); err != nil {
			return err
		}
		p, err := pd.start(e, pdir, port, appPort, mode.srv, mode.workers)
		if err != nil {
			e.report.skip(pd.name+" ("+mode.name+")", "cannot start: %v", err)
			continue
		}
		procs = append(procs, p)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if err := waitHTTP(ctx, p, addr, pd.healthy, 30*time.Second); err != nil {
			e.report.skip(pd.name+" ("+mode.name+")", "did not come up: %v", err)
			continue
		}
		targets = append(targets, warmTarget{name: pd.name, addr: addr, proc: p})
	}

	// The yardstick (bench/loopedge): a Go edge of HAProxy's shape doing the fast path's work. A row
	// without a target, read against the activator's: what the same language reaches in that shape.
	if port, err := freePort(); err != nil {
		return err
	} else if p, err := startLoopEdge(ctx, e, port, appPort, mode.srv, mode.workers); err != nil {
		e.report.skip("loopedge ("+mode.name+")", "cannot start: %v", err)
	} else {
		procs = append(procs, p)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if err := waitHTTP(ctx, p, addr, "/", 30*time.Second); err != nil {
			e.report.skip("loopedge ("+mode.name+")", "did not come up: %v", err)
		} else {
			targets = append(targets, warmTarget{name: "loopedge", addr: addr, proc: p})
		}
	}

	smp, err := measureRounds(ctx, e, "wrk", mode, targets, e.opts.conns, 64, wrkMeasure(wrk, mode))
	if err != nil {
		return err
	}
	rps, p99 := smp.rps, smp.p99
	e.report.Warm = append(e.report.Warm, smp.rows(mode.name, e.opts.conns, targets)...)

	have := map[string]bool{}
	for _, t := range targets {
		have[t.name] = true
	}
	for _, c := range e.opts.conns {
		a := roundKey{"activator", c}
		add := func(name string, v Stat) {
			e.report.WarmRatios = append(e.report.WarmRatios, RatioRow{Mode: mode.name, Conns: c, Name: name, Value: v})
		}
		add("activator ÷ direct, req/s", ratios(rps[a], rps[roundKey{"direct", c}]))
		for _, pd := range peerDefs {
			if have[pd.name] {
				add("activator ÷ "+pd.name+", req/s", ratios(rps[a], rps[roundKey{pd.name, c}]))
			}
		}
		add("activator p99 ÷ direct p99", ratios(p99[a], p99[roundKey{"direct", c}]))
		// The peers' own p99 ÷ direct, as a reference for the activator's target: what a proxy in
		// front of this app costs in latency on this machine.
		for _, pd := range peerDefs {
			if have[pd.name] {
				add(pd.name+" p99 ÷ direct p99 (reference)", ratios(p99[roundKey{pd.name, c}], p99[roundKey{"direct", c}]))
			}
		}
		if nl := (roundKey{"activator-noloop", c}); have["activator-noloop"] {
			add("activator ÷ activator-noloop (edge.event_loops: 0), req/s", ratios(rps[a], rps[nl]))
			if have["haproxy"] {
				add("activator-noloop ÷ haproxy, req/s", ratios(rps[nl], rps[roundKey{"haproxy", c}]))
			}
			add("activator-noloop p99 ÷ direct p99", ratios(p99[nl], p99[roundKey{"direct", c}]))
		}
		if have["loopedge"] {
			add("activator ÷ loopedge (Go event loop), req/s", ratios(rps[a], rps[roundKey{"loopedge", c}]))
			if have["haproxy"] {
				add("loopedge ÷ haproxy, req/s (reference)", ratios(rps[roundKey{"loopedge", c}], rps[roundKey{"haproxy", c}]))
			}
			add("loopedge p99 ÷ direct p99 (reference)", ratios(p99[roundKey{"loopedge", c}], p99[roundKey{"direct", c}]))
		}
		// The pinned targets' row: unpinned stands in when this machine cannot pin.
		standIn := mode.name == "pinned" || !e.opts.pinned
		if have["caddy"] && c == 16 && standIn {
			v := ratios(rps[a], rps[roundKey{"caddy", c}])
			e.report.check(fmt.Sprintf("warm req/s, activator ÷ Caddy (%s, c16)", mode.name), fmtStat(v, 2), "≥ 1.5", v.Median >= 1.5)
		}
		if have["haproxy"] {
			v := ratios(rps[a], rps[roundKey{"haproxy", c}])
			name := fmt.Sprintf("warm req/s, activator ÷ HAProxy (%s, c%d)", mode.name, c)
			if standIn && (c == 16 || c == 64) {
				e.report.check(name, fmtStat(v, 2), "≥ 1.0", v.Median >= 1.0)
			}
			if mode.name == "unpinned" && c == 64 {
				e.report.check(name, fmtStat(v, 2), "≥ 0.9", v.Median >= 0.9)
			}
		}
		if goal, ok := map[int]float64{16: 1.3, 64: 1.5}[c]; ok && standIn {
			v := ratios(p99[a], p99[roundKey{"direct", c}])
			e.report.check(fmt.Sprintf("warm p99, activator ÷ direct (%s, c%d)", mode.name, c), fmtStat(v, 2), fmt.Sprintf("≤ %.1f", goal), v.Median <= goal)
		}
	}
	return warmH2(ctx, e, mode, dir, act, appPort)
}

// h2Streams is h2load's -m in the warm path's h2c rows: requests in flight on each connection.
const h2Streams = 10

// warmH2 measures the activator (h2c on its plain listener, as cmd/activator serves it) and nginx with
// h2c (`listen … http2`) in front of the same app as the HTTP/1.1 rows, with h2load at each connection
// count in alternating order, and reports activator ÷ nginx req/s run by run. It is skipped without
// h2load or nginx.
func warmH2(ctx context.Context, e *env, mode cpuMode, dir string, act *activatorProc, appPort int) error {
	h2load, ok := lookTool("h2load")
	if !ok {
		e.report.skip("warm path, h2c ("+mode.name+")", "h2load not found (Debian package nghttp2-client)")
		return nil
	}
	if _, ok := e.tools["nginx"]; !ok {
		e.report.skip("warm path, h2c ("+mode.name+")", "nginx not found: no peer to compare with")
		return nil
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	ndir := filepath.Join(dir, "nginx-h2c")
	if err := os.MkdirAll(ndir, 0o755); err != nil {
		return err
	}
	ngx, err := startNginxH2c(e, ndir, port, appPort, mode.srv, mode.workers)
	if err != nil {
		e.report.skip("nginx h2c ("+mode.name+")", "cannot start: %v", err)
		return nil
	}
	defer ngx.Stop(5 * time.Second)
	ngxAddr := fmt.Sprintf("127.0.0.1:%d", port)
	if err := waitH2c(ctx, h2load, ngx, ngxAddr, 30*time.Second); err != nil {
		e.report.skip("nginx h2c ("+mode.name+")", "did not come up: %v", err)
		return nil
	}
	targets := []warmTarget{{name: "activator", addr: act.edge, proc: act.proc}, {name: "nginx", addr: ngxAddr, proc: ngx}}
	h2 := func(ctx context.Context, t warmTarget, conns int, dur time.Duration) (wrkResult, error) {
		w := h2loadRun{url: t.url(), conns: conns, streams: h2Streams, threads: min(mode.threads, conns), dur: dur, cpus: mode.load}
		return w.run(ctx, h2load)
	}
	smp, err := measureRounds(ctx, e, "h2load", mode, targets, e.opts.conns, 16, h2)
	if err != nil {
		return err
	}
	nan := summarize(nil) // h2load's latency figures are not comparable with wrk's: left out
	for _, r := range smp.rows(mode.name, e.opts.conns, targets) {
		r.Target += " (h2c)"
		r.P50us, r.P99us = nan, nan
		e.report.WarmH2 = append(e.report.WarmH2, r)
	}
	for _, c := range e.opts.conns {
		e.report.WarmRatios = append(e.report.WarmRatios, RatioRow{Mode: mode.name, Conns: c,
			Name: fmt.Sprintf("h2c (h2load -m %d): activator ÷ nginx, req/s", h2Streams), Value: ratios(smp.rps[roundKey{"activator", c}], smp.rps[roundKey{"nginx", c}])})
	}
	return nil
}

// freePorts returns n distinct free loopback ports.
func freePorts(n int) ([]int, error) {
	seen := map[int]bool{}
	var out []int
	for i := 0; len(out) < n && i < 100*n; i++ {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	if len(out) < n {
		return nil, fmt.Errorf("could not find %d free ports", n)
	}
	return out, nil
}

// startWokenActivator starts an activator whose one route, name, runs the app as an exec tenant on
// loopback, and wakes it with a first request. On an error after the start, the activator is returned
// too, so the caller can stop it.
func startWokenActivator(ctx context.Context, e *env, dir, cpus, name string) (*activatorProc, error) {
	return startWokenActivatorWith(ctx, e, dir, cpus, name, "")
}

// startWokenActivatorWith is startWokenActivator with extra top-level config keys (YAML lines).
func startWokenActivatorWith(ctx context.Context, e *env, dir, cpus, name, extra string) (*activatorProc, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cfg := extra + renderConfig(ports[0], ports[1], []routeSpec{{name: name, hosts: []string{"127.0.0.1", "localhost"}, port: ports[2], argv: []string{e.actBin, "app"}}})
	act, _, err := startActivator(ctx, e, dir, cpus, cfg, ports[0], ports[1])
	if err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, act.proc, act.edge, "/", time.Minute); err != nil {
		return act, fmt.Errorf("activator: first request: %w", err)
	}
	return act, nil
}

// waitH2c waits until addr answers one h2c request (h2load -n 1): an h2c-only listener does not
// answer waitHTTP's HTTP/1.1.
func waitH2c(ctx context.Context, h2load string, p *proc, addr string, budget time.Duration) error {
	deadline := time.Now().Add(budget)
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		out, err := exec.CommandContext(cctx, h2load, "-n", "1", "-c", "1", "http://"+addr+"/").CombinedOutput()
		cancel()
		if err == nil {
			if _, err = parseH2load(string(out)); err == nil {
				return nil
			}
		}
		switch {
		case p.exited():
			return fmt.Errorf("%s exited: %v\n%s", p.name, p.err, p.out.String())
		case time.Now().After(deadline):
			return fmt.Errorf("no h2c answer within %v: %v", budget, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
