package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"
)

// warmTarget is one server wrk measures in the warm-path comparison.
type warmTarget struct {
	name string
	addr string
	proc *proc // nil for targets owned elsewhere
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
	appPort, err := freePort()
	if err != nil {
		return err
	}
	app, err := startProc(procSpec{name: "app", cpus: mode.srv, env: []string{fmt.Sprintf("PORT=%d", appPort)}, argv: []string{e.actBin, "app"}})
	if err != nil {
		return err
	}
	procs = append(procs, app)
	appAddr := fmt.Sprintf("127.0.0.1:%d", appPort)
	if err := waitHTTP(ctx, app, appAddr, "/healthz", 30*time.Second); err != nil {
		return err
	}
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

	// Warm every target up (connection pools, JIT-free but cache-warm), then the alternating runs.
	for _, t := range targets {
		w := wrkRun{url: "http://" + t.addr + "/", conns: 64, threads: mode.threads, dur: time.Second, cpus: mode.load}
		if _, err := w.run(ctx, wrk); err != nil {
			return fmt.Errorf("warm-up %s: %w", t.name, err)
		}
	}
	type key struct {
		target string
		conns  int
	}
	rps, p50, p99 := map[key][]float64{}, map[key][]float64{}, map[key][]float64{}
	errs := map[key]int64{}
	for run := 0; run < e.opts.runs; run++ {
		for _, c := range e.opts.conns {
			for i := range targets {
				t := targets[(i+run)%len(targets)] // rotate the order run by run
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if t.proc.exited() {
					return fmt.Errorf("%s exited: %v\n%s", t.name, t.proc.err, t.proc.out.String())
				}
				w := wrkRun{url: "http://" + t.addr + "/", conns: c, threads: min(mode.threads, c), dur: e.opts.dur, cpus: mode.load}
				r, err := w.run(ctx, wrk)
				k := key{t.name, c}
				if err != nil {
					e.log.Warn("wrk run failed", "target", t.name, "conns", c, "err", err)
					r = wrkResult{RPS: math.NaN(), P50: math.NaN(), P99: math.NaN()}
				}
				rps[k] = append(rps[k], r.RPS)
				p50[k] = append(p50[k], r.P50)
				p99[k] = append(p99[k], r.P99)
				errs[k] += r.Errors
				e.log.Info("wrk", "mode", mode.name, "run", run+1, "conns", c, "target", t.name, "rps", int(r.RPS), "p99_us", r.P99)
			}
		}
	}

	have := map[string]bool{}
	for _, t := range targets {
		have[t.name] = true
	}
	for _, c := range e.opts.conns {
		for _, t := range targets {
			k := key{t.name, c}
			e.report.Warm = append(e.report.Warm, WarmRow{Mode: mode.name, Conns: c, Target: t.name,
				RPS: summarize(rps[k]), P50us: summarize(p50[k]), P99us: summarize(p99[k]), Errors: errs[k]})
		}
		a := key{"activator", c}
		add := func(name string, v Stat) {
			e.report.WarmRatios = append(e.report.WarmRatios, RatioRow{Mode: mode.name, Conns: c, Name: name, Value: v})
		}
		add("activator ÷ direct, req/s", ratios(rps[a], rps[key{"direct", c}]))
		for _, pd := range peerDefs {
			if have[pd.name] {
				add("activator ÷ "+pd.name+", req/s", ratios(rps[a], rps[key{pd.name, c}]))
			}
		}
		add("activator p99 ÷ direct p99", ratios(p99[a], p99[key{"direct", c}]))
		if have["caddy"] && c == 16 && (mode.name == "pinned" || !e.opts.pinned) {
			v := ratios(rps[a], rps[key{"caddy", c}])
			e.report.check(fmt.Sprintf("warm req/s, activator ÷ Caddy (%s, c16)", mode.name), fmtStat(v, 2), "≥ 1.5", v.Median >= 1.5)
		}
		if c == 16 && (mode.name == "pinned" || !e.opts.pinned) {
			v := ratios(p99[a], p99[key{"direct", c}])
			e.report.check(fmt.Sprintf("warm p99, activator ÷ direct (%s, c16)", mode.name), fmtStat(v, 2), "≤ 2", v.Median <= 2)
		}
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
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	cfg := renderConfig(ports[0], ports[1], []routeSpec{{name: name, hosts: []string{"127.0.0.1", "localhost"}, port: ports[2], argv: []string{e.actBin, "app"}}})
	act, _, err := startActivator(ctx, e, dir, cpus, cfg, ports[0], ports[1])
	if err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, act.proc, act.edge, "/", time.Minute); err != nil {
		return act, fmt.Errorf("activator: first request: %w", err)
	}
	return act, nil
}
