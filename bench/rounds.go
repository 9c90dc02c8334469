package main

import (
	"context"
	"fmt"
	"math"
	"time"
)

// roundKey names one cell of the alternating rounds: a target at a connection count.
type roundKey struct {
	target string
	conns  int
}

// roundSamples are the figures of every round, per cell, in round order. A failed measurement is a
// NaN there, which summarize and ratios leave out.
type roundSamples struct {
	rps, p50, p99 map[roundKey][]float64
	errs          map[roundKey]int64
}

// measure is one load run against t at conns connections for dur.
type measure func(ctx context.Context, t warmTarget, conns int, dur time.Duration) (wrkResult, error)

// measureRounds is the warm path's method, shared by the HTTP/1.1, h2c and HTTPS rows: each target
// warmed up for a second at warmConns (connection pools, caches; not counted), then e.opts.runs
// rounds, each running every connection count against every target, the targets' order rotated by one
// each round so that none always runs right after the same neighbour. A target that has exited ends
// the measurement with its output; a run that fails is logged and counts as NaN, so one bad round does
// not lose the others. what labels the log lines.
func measureRounds(ctx context.Context, e *env, what string, mode cpuMode, targets []warmTarget, conns []int, warmConns int, run measure) (roundSamples, error) {
	s := roundSamples{rps: map[roundKey][]float64{}, p50: map[roundKey][]float64{}, p99: map[roundKey][]float64{}, errs: map[roundKey]int64{}}
	for _, t := range targets {
		if _, err := run(ctx, t, warmConns, time.Second); err != nil {
			return s, fmt.Errorf("%s warm-up %s: %w", what, t.name, err)
		}
	}
	for round := 0; round < e.opts.runs; round++ {
		for _, c := range conns {
			for i := range targets {
				t := targets[(i+round)%len(targets)]
				if ctx.Err() != nil {
					return s, ctx.Err()
				}
				if t.proc.exited() {
					return s, fmt.Errorf("%s exited: %v\n%s", t.name, t.proc.err, t.proc.out.String())
				}
				r, err := run(ctx, t, c, e.opts.dur)
				if err != nil {
					e.log.Warn(what+" run failed", "target", t.name, "conns", c, "err", err)
					r = wrkResult{RPS: math.NaN(), P50: math.NaN(), P99: math.NaN()}
				}
				k := roundKey{t.name, c}
				s.rps[k] = append(s.rps[k], r.RPS)
				s.p50[k] = append(s.p50[k], r.P50)
				s.p99[k] = append(s.p99[k], r.P99)
				s.errs[k] += r.Errors
				e.log.Info(what, "mode", mode.name, "run", round+1, "conns", c, "target", t.name, "rps", int(r.RPS), "p99_us", r.P99)
			}
		}
	}
	return s, nil
}

// rows are the report's rows of s: per connection count, per target, in the targets' order.
func (s roundSamples) rows(mode string, conns []int, targets []warmTarget) []WarmRow {
	var out []WarmRow
	for _, c := range conns {
		for _, t := range targets {
			k := roundKey{t.name, c}
			out = append(out, WarmRow{Mode: mode, Conns: c, Target: t.name,
				RPS: summarize(s.rps[k]), P50us: summarize(s.p50[k]), P99us: summarize(s.p99[k]), Errors: s.errs[k]})
		}
	}
	return out
}

// wrkMeasure runs wrk (at path) on mode's load CPUs against t's URL.
func wrkMeasure(path string, mode cpuMode) measure {
	return func(ctx context.Context, t warmTarget, conns int, dur time.Duration) (wrkResult, error) {
		w := wrkRun{url: t.url(), conns: conns, threads: min(mode.threads, conns), dur: dur, cpus: mode.load}
		return w.run(ctx, path)
	}
}
