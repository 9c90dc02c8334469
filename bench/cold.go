package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// boundInfo is the demo app's GET /bound answer: wall-clock unix nanoseconds of main() and of the
// moment it was listening.
type boundInfo struct {
	PID     int64 `json:"pid"`
	MainNS  int64 `json:"main_ns"`
	BoundNS int64 `json:"bound_ns"`
}

// coldSample is one cold first request, in milliseconds.
type coldSample struct {
	firstByte, appStart, overhead, spawn, gateProxy float64
	alone                                           float64 // the same round's app-alone exec → listening
}

func (b boundInfo) sample(r fbResult) coldSample {
	ms := func(ns int64) float64 { return float64(ns) / 1e6 }
	fb := ms(r.first.Sub(r.sent).Nanoseconds())
	app := ms(b.BoundNS - b.MainNS)
	return coldSample{
		firstByte: fb,
		appStart:  app,
		overhead:  fb - app,
		spawn:     ms(b.MainNS - r.sent.UnixNano()),
		gateProxy: ms(r.first.UnixNano() - b.BoundNS),
	}
}

// runCold measures the first request to a sleeping exec route (listen: env and listen: listen_fds)
// against the floor: the same app spawned by the harness on a pre-bound socket with the request already
// waiting in the backlog (what systemd socket activation does, without systemd).
func runCold(ctx context.Context, e *env) error {
	dir := filepath.Join(e.tmp, "cold")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ports, err := freePorts(4)
	if err != nil {
		return err
	}
	cfg := renderConfig(ports[0], ports[1], []routeSpec{
		{name: "cold-env", hosts: []string{"cold-env.localhost"}, port: ports[2], argv: []string{e.actBin, "app"}},
		{name: "cold-fds", hosts: []string{"cold-fds.localhost"}, port: ports[3], listen: "listen_fds", argv: []string{e.actBin, "app"}},
	})
	// Unpinned: a wake is latency, not throughput; pinning the activator and its tenant to one CPU
	// would serialise the spawn with the activator's own work, which is not how it is deployed.
	act, _, err := startActivator(ctx, e, dir, "", cfg, ports[0], ports[1])
	if err != nil {
		return err
	}
	defer act.Stop(10 * time.Second)

	var envPhases, fdsPhases phaseLog
	modes := []struct {
		name, note string
		take       func() (coldSample, error)
	}{
		{"exec, listen: env", "the activator spawns the app with PORT; the health gate polls until it listens",
			func() (coldSample, error) { return coldViaActivator(ctx, act, "cold-env", &envPhases) }},
		{"exec, listen: listen_fds", "the activator pre-binds the port and passes it as fd 3 (through its exec shim)",
			func() (coldSample, error) { return coldViaActivator(ctx, act, "cold-fds", &fdsPhases) }},
	}
	if ssa, ok := lookTool("systemd-socket-activate"); ok {
		modes = append(modes, struct {
			name, note string
			take       func() (coldSample, error)
		}{"floor: systemd-socket-activate", "no proxy, no service manager: systemd-socket-activate binds the port and execs the app on it (same pid) at the first connection; the least any wake-on-request proxy can cost",
			func() (coldSample, error) { return coldFloor(ctx, e, ssa) }})
	} else {
		e.report.skip("cold floor", "systemd-socket-activate not found (Debian package systemd)")
	}
	col := func(ss []coldSample) []float64 {
		var v []float64
		for _, s := range ss {
			v = append(v, s.firstByte)
		}
		return v
	}
	samples := make([][]coldSample, len(modes))
	failed := make([]int, len(modes))
	firstErr := make([]string, len(modes))
	// Warm the page cache and the activator's pools once per mode; not counted.
	for _, m := range modes {
		if _, err := m.take(); err != nil {
			return fmt.Errorf("%s: warm-up: %w", m.name, err)
		}
	}
	for i := 0; i < e.opts.coldSamples; i++ {
		// The app alone, exec'd by the harness in every round: its own exec → listening, which the
		// issue subtracts from the first byte. (main()→listening, which the app reports, leaves out
		// its exec and Go start-up, most of a cold start.)
		a, err := coldAppAlone(ctx, e)
		if err != nil {
			return fmt.Errorf("the app alone: %w", err)
		}
		for j, m := range modes {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s, err := m.take()
			if err != nil {
				failed[j]++
				if firstErr[j] == "" {
					firstErr[j] = err.Error()
				}
				continue
			}
			s.alone = a
			samples[j] = append(samples[j], s)
		}
	}
	for j, m := range modes {
		stat := func(f func(coldSample) float64) Stat {
			var v []float64
			for _, s := range samples[j] {
				v = append(v, f(s))
			}
			return summarize(v)
		}
		row := ColdRow{Mode: m.name, Samples: len(samples[j]), Failed: failed[j], Note: m.note,
			FirstByte: stat(func(s coldSample) float64 { return s.firstByte }),
			AppStart:  stat(func(s coldSample) float64 { return s.appStart }),
			Overhead:  stat(func(s coldSample) float64 { return s.overhead }),
			Spawn:     stat(func(s coldSample) float64 { return s.spawn }),
			GateProxy: stat(func(s coldSample) float64 { return s.gateProxy }),
		}
		if strings.HasPrefix(m.name, "exec") {
			row.AppAlone = stat(func(s coldSample) float64 { return s.alone })
			row.OverheadExec = stat(func(s coldSample) float64 { return s.firstByte - s.alone })
		}
		if firstErr[j] != "" {
			row.Note += "; first failure: " + firstErr[j]
		}
		e.report.Cold = append(e.report.Cold, row)
		e.log.Info("cold", "mode", m.name, "first_byte_ms", row.FirstByte.Median, "overhead_ms", row.Overhead.Median)
	}
	rows := e.report.Cold[len(e.report.Cold)-len(modes):]
	for j, pl := range []*phaseLog{&envPhases, &fdsPhases} {
		if ph := pl.String(); ph != "" {
			rows[j].Note += "; wake phases (activator's record, median): " + ph
		}
	}
	for j := 0; j < 2; j++ {
		r := rows[j]
		e.report.check("cold exec wake overhead, "+r.Mode+" (first byte − the app's own exec→listening, alone, same round; ms)", fmtStat(r.OverheadExec, 2), "≤ 2 ms", r.OverheadExec.valid() && r.OverheadExec.Median <= 2)
		if len(modes) > 2 {
			// Per sample pair: the activator's first byte minus the floor's, same round.
			var d []float64
			for k := 0; k < min(len(samples[j]), len(samples[2])); k++ {
				d = append(d, samples[j][k].firstByte-samples[2][k].firstByte)
			}
			v := summarize(d)
			e.report.ColdExtra = append(e.report.ColdExtra, RatioRow{Name: r.Mode + ": first byte − floor's first byte (ms)", Value: v})
			e.report.check("cold exec wake, "+r.Mode+": first byte − floor's first byte (ms, median of pairs)", fmtStat(v, 2), "≤ 2 ms", v.valid() && v.Median <= 2)
			e.report.ColdExtra = append(e.report.ColdExtra, RatioRow{Name: r.Mode + ": first byte ÷ floor's first byte", Value: ratios(col(samples[j]), col(samples[2]))})
		}
	}
	return nil
}

// coldViaActivator puts route to sleep through the admin API, then times one request through the edge.
func coldViaActivator(ctx context.Context, act *activatorProc, route string, phases *phaseLog) (coldSample, error) {
	defer phases.add(ctx, act, route)
	if err := act.adminPost(ctx, "/routes/"+route+"/sleep"); err != nil {
		return coldSample{}, err
	}
	r, err := firstByte(ctx, act.edge, "/bound", route+".localhost", time.Minute)
	if err != nil {
		return coldSample{}, err
	}
	if r.code != 200 {
		return coldSample{}, fmt.Errorf("first request answered %d: %s", r.code, r.body)
	}
	var b boundInfo
	if err := json.Unmarshal(r.body, &b); err != nil {
		return coldSample{}, fmt.Errorf("GET /bound: %w (%q)", err, r.body)
	}
	return b.sample(r), nil
}

// coldFloor starts systemd-socket-activate (which binds the port, waits for the first connection and
// execs the app on the socket in place) and times one request on a fresh connection: the floor any
// wake-on-request proxy is measured against, with no proxy and no service manager in the path.
func coldFloor(ctx context.Context, e *env, ssa string) (coldSample, error) {
	port, err := freePort()
	if err != nil {
		return coldSample{}, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	p, err := startProc(procSpec{name: "systemd-socket-activate", argv: []string{ssa, "-l", addr, e.actBin, "app"}})
	if err != nil {
		return coldSample{}, err
	}
	defer p.Stop(5 * time.Second)
	listening := p.out.expect("Listening on")
	select {
	case <-listening:
	case <-p.done:
		return coldSample{}, fmt.Errorf("systemd-socket-activate exited: %v: %s", p.err, p.out.String())
	case <-time.After(30 * time.Second):
		return coldSample{}, fmt.Errorf("systemd-socket-activate did not listen within 30s: %s", p.out.String())
	case <-ctx.Done():
		return coldSample{}, ctx.Err()
	}
	r, err := firstByte(ctx, addr, "/bound", "127.0.0.1", time.Minute)
	if err != nil {
		return coldSample{}, fmt.Errorf("%w; output: %s", err, p.out.String())
	}
	var b boundInfo
	if err := json.Unmarshal(r.body, &b); err != nil {
		return coldSample{}, fmt.Errorf("GET /bound: %w (%q)", err, r.body)
	}
	return b.sample(r), nil
}

// coldAppAlone execs the app with nothing in front of it and returns its exec → listening in
// milliseconds: from just before the harness starts it to the moment the app says it bound (GET
// /bound, polled every millisecond until it answers; the app's own timestamp, so the polling does not
// count).
func coldAppAlone(ctx context.Context, e *env) (float64, error) {
	port, err := freePort()
	if err != nil {
		return 0, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	t0 := time.Now()
	p, err := startProc(procSpec{name: "app alone", env: []string{fmt.Sprintf("PORT=%d", port), "HOST=127.0.0.1"}, argv: []string{e.actBin, "app"}})
	if err != nil {
		return 0, err
	}
	defer p.Stop(5 * time.Second)
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		if r, err := firstByte(ctx, addr, "/bound", "127.0.0.1", time.Second); err == nil {
			var b boundInfo
			if err := json.Unmarshal(r.body, &b); err != nil {
				return 0, fmt.Errorf("GET /bound: %w (%q)", err, r.body)
			}
			return float64(b.BoundNS-t0.UnixNano()) / 1e6, nil
		}
		select {
		case <-time.After(time.Millisecond):
		case <-p.done:
			return 0, fmt.Errorf("the app exited: %v: %s", p.err, p.out.String())
		case <-deadline.C:
			return 0, fmt.Errorf("the app did not answer GET /bound within 30s: %s", p.out.String())
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}
