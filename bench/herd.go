package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// routeStatus is the part of the admin API's route status the harness reads.
type routeStatus struct {
	State       string      `json:"state"`
	Held        int         `json:"held"`
	InFlight    int         `json:"in_flight"`
	LastWake    *wakeRecord `json:"last_wake"`
	CurrentWake *wakeRecord `json:"current_wake"`
}

type wakeRecord struct {
	Route    string        `json:"route"`
	Started  time.Time     `json:"started"`
	Duration time.Duration `json:"duration_ns"`
	Result   string        `json:"result"`
	Outcome  string        `json:"outcome"`
	Joined   int           `json:"joined_requests"`
	Notes    []string      `json:"notes"`
	// The hold's release of the requests it held: how many, and gate passed → the last left the hold.
	Released      int           `json:"released_requests"`
	ReleaseSpread time.Duration `json:"release_spread_ns"`
	Phases        []wakePhase   `json:"phases"`
	// Requires holds each requirement's part in the wake, with its own record when it was woken for it;
	// Members is a fleet's rollup, in member order.
	Requires []requiredWake `json:"requires"`
	Members  []memberRecord `json:"members"`
}

type wakePhase struct {
	Name     string        `json:"name"`
	Duration time.Duration `json:"duration_ns"`
}

type requiredWake struct {
	Instance string      `json:"instance"`
	State    string      `json:"state"` // awake, woken (Wake is its record) or failed
	Wake     *wakeRecord `json:"wake"`
}

type memberRecord struct {
	Name   string      `json:"name"`
	Status string      `json:"status"` // up, timeout, error, cancelled, waking
	Error  string      `json:"error"`
	Phases []wakePhase `json:"phases"`
}

// phaseLog collects the phases of a route's wakes (from the admin API) across samples.
type phaseLog struct {
	order []string
	ms    map[string][]float64
}

// add reads route's last wake record and records its phases; errors leave the log unchanged.
func (l *phaseLog) add(ctx context.Context, act *activatorProc, route string) {
	var st routeStatus
	if err := getJSON(ctx, act.admin, "/routes/"+route, &st); err != nil || st.LastWake == nil {
		return
	}
	l.record(st.LastWake)
}

// record adds the phases of one wake record.
func (l *phaseLog) record(w *wakeRecord) { l.recordPhases(w.Phases) }

// recordPhases adds one wake's phases (a record's own, or a fleet member's).
func (l *phaseLog) recordPhases(ps []wakePhase) {
	if l.ms == nil {
		l.ms = map[string][]float64{}
	}
	for _, p := range ps {
		if _, ok := l.ms[p.Name]; !ok {
			l.order = append(l.order, p.Name)
		}
		l.ms[p.Name] = append(l.ms[p.Name], float64(p.Duration.Microseconds())/1000)
	}
}

// String renders "spawn 1.23 ms, health 0.80 ms" (medians), or "".
func (l *phaseLog) String() string {
	var parts []string
	for _, n := range l.order {
		parts = append(parts, fmt.Sprintf("%s %.2f ms", n, summarize(l.ms[n]).Median))
	}
	return strings.Join(parts, ", ")
}

// runHerd sends N concurrent requests to a cold route whose tenant is held back until all N are
// held, then lets it start: -herd-runs times for each N, the sizes alternating. Each size's row holds
// the medians, and the checks the medians with their spread, since one herd's release moves by a
// quarter between runs on a shared 2-CPU box.
func runHerd(ctx context.Context, e *env) error {
	runs := map[int][]HerdRow{}
	for i := 0; i < e.opts.herdRuns; i++ {
		for _, n := range e.opts.herd {
			row, err := herdOnce(ctx, e, herdSpec{n: n, run: i + 1})
			if err != nil {
				return fmt.Errorf("%d requests, run %d: %w", n, i+1, err)
			}
			runs[n] = append(runs[n], row)
			e.log.Info("herd", "n", n, "run", i+1, "answered", row.Answered, "spawns", row.Spawns, "release_ms", row.ReleaseMs, "kib_per_held", row.PerHeldKiB)
		}
	}
	for _, n := range e.opts.herd {
		row := medianHerd(runs[n])
		e.report.Herd = append(e.report.Herd, row)
		if n >= 10000 || n == e.opts.herd[len(e.opts.herd)-1] {
			e.report.check(fmt.Sprintf("herd N=%d: spawns, all answered (every run)", n), fmt.Sprintf("%d spawn(s), %d/%d answered (worst of %d)", row.Spawns, row.Answered, n, row.Runs), "1 spawn, all answered", row.Spawns == 1 && row.Answered == n)
			if n >= 10000 { // the release target is for a herd of 10,000
				e.report.check(fmt.Sprintf("herd N=%d: release spread, gate passed → last held request left the hold (ms)", n),
					fmt.Sprintf("%s over %d runs (%d released); last response %.1f ms after the gate", row.Release, row.Runs, row.Released, row.GateLastMs), "≤ 20 ms", row.Released == n && row.ReleaseMs <= 20)
			}
			e.report.check(fmt.Sprintf("herd N=%d: activator RSS per held request", n), fmt.Sprintf("%s KiB", row.PerHeld), "≤ 16 KiB", row.PerHeldKiB <= 16)
		}
	}
	return nil
}

// medianHerd folds the runs of one size into one row: medians of the timings and memory, the worst
// run's spawns, answers and failures, and the spread of the release and the memory as text.
func medianHerd(rows []HerdRow) HerdRow {
	out := rows[0]
	out.Runs = len(rows)
	col := func(f func(HerdRow) float64) Stat {
		vs := make([]float64, len(rows))
		for i, r := range rows {
			vs[i] = f(r)
		}
		return summarize(vs)
	}
	rel := col(func(r HerdRow) float64 { return r.ReleaseMs })
	per := col(func(r HerdRow) float64 { return r.PerHeldKiB })
	out.ReleaseMs, out.Release = rel.Median, fmt.Sprintf("%.1f (%.1f–%.1f)", rel.Median, rel.Min, rel.Max)
	out.PerHeldKiB, out.PerHeld = per.Median, fmt.Sprintf("%.1f (%.1f–%.1f)", per.Median, per.Min, per.Max)
	out.SpreadMs = col(func(r HerdRow) float64 { return r.SpreadMs }).Median
	out.P50Ms = col(func(r HerdRow) float64 { return r.P50Ms }).Median
	out.GateLastMs = col(func(r HerdRow) float64 { return r.GateLastMs }).Median
	out.WakeMs = col(func(r HerdRow) float64 { return r.WakeMs }).Median
	out.RSSIdleKiB = int64(col(func(r HerdRow) float64 { return float64(r.RSSIdleKiB) }).Median)
	out.RSSHeldKiB = int64(col(func(r HerdRow) float64 { return float64(r.RSSHeldKiB) }).Median)
	for _, r := range rows {
		out.Spawns = max(out.Spawns, r.Spawns)
		out.Answered = min(out.Answered, r.Answered)
		out.Released = min(out.Released, r.Released)
		out.Failed = max(out.Failed, r.Failed)
		out.Refused = max(out.Refused, r.Refused)
		out.HeldMax = min(out.HeldMax, r.HeldMax)
		if out.FirstFailure == "" {
			out.FirstFailure = r.FirstFailure
		}
	}
	return out
}

// herdSpec is one herd: n concurrent GET /pid, run-th of its kind, each request with an X-Pad header
// of pad bytes (none when 0).
type herdSpec struct {
	n, run, pad int
}

// header is the request header lines the herd adds to each GET /pid.
func (h herdSpec) header() string {
	if h.pad == 0 {
		return ""
	}
	return "X-Pad: " + strings.Repeat("p", h.pad) + "\r\n"
}

// requestBytes is the size of one herd request (all of it header: GET has no body).
func (h herdSpec) requestBytes() int {
	return len("GET /pid HTTP/1.1\r\nHost: herd.localhost\r\n" + h.header() + "Connection: close\r\n\r\n")
}

func herdOnce(ctx context.Context, e *env, h herdSpec) (HerdRow, error) {
	n := h.n
	row := HerdRow{N: n}
	dir := filepath.Join(e.tmp, fmt.Sprintf("herd-%d-pad%d-run%d", n, h.pad, h.run))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return row, err
	}
	// The tenant waits on a FIFO before it execs the app, so the harness decides when the wake can
	// finish: only once every request is held.
	fifo := filepath.Join(dir, "go")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		return row, fmt.Errorf("mkfifo: %w", err)
	}
	ports, err := freePorts(3)
	if err != nil {
		return row, err
	}
	script := fmt.Sprintf("read _ < %s; exec %s app", strconv.Quote(fifo), strconv.Quote(e.actBin))
	cfg := renderConfig(ports[0], ports[1], []routeSpec{{name: "herd", hosts: []string{"herd.localhost"}, port: ports[2],
		argv: []string{"/bin/sh", "-c", script}, maxHeld: n + 1000, budget: "10m"}})
	act, _, err := startActivator(ctx, e, dir, "", cfg, ports[0], ports[1])
	if err != nil {
		return row, err
	}
	defer act.Stop(10 * time.Second)
	row.Nofile = nofileLimit(act.pid())
	if row.RSSIdleKiB, err = rssKiB(act.pid()); err != nil {
		return row, err
	}

	type result struct {
		first time.Time
		code  int
		pid   string
		body  string
		err   error
	}
	results := make([]result, n)
	var finished atomic.Int64 // requests answered or failed before the release: refused at a cap
	header := h.header()
	var wg sync.WaitGroup
	dialSem := make(chan struct{}, 256) // bounds connection setup, not the number held
	rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case dialSem <- struct{}{}:
			case <-rctx.Done():
				results[i].err = rctx.Err()
				return
			}
			r, err := herdRequest(rctx, act.edge, header, func() { <-dialSem })
			results[i] = result{first: r.first, code: r.code, pid: strings.TrimSpace(string(r.body)), body: string(r.body), err: err}
			finished.Add(1)
		}()
	}

	// Wait until every request is held or has been refused (bounded), then note the memory and release
	// the tenant.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var st routeStatus
		if err := getJSON(ctx, act.admin, "/routes/herd", &st); err != nil {
			return row, err
		}
		row.HeldMax = max(row.HeldMax, st.Held)
		if st.Held+int(finished.Load()) >= n || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
		}
	}
	if row.RSSHeldKiB, err = rssKiB(act.pid()); err != nil {
		return row, err
	}
	row.PerHeldKiB = float64(row.RSSHeldKiB-row.RSSIdleKiB) / float64(max(1, row.HeldMax))
	f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		return row, fmt.Errorf("open fifo: %w", err)
	}
	_, _ = f.WriteString("go\n")
	f.Close()
	wg.Wait()

	var st routeStatus
	if err := getJSON(ctx, act.admin, "/routes/herd", &st); err != nil {
		return row, err
	}
	pids := map[string]bool{}
	var firsts []float64
	var lo, hi time.Time
	for _, r := range results {
		if r.code == 503 {
			row.Refused++
		}
		if r.err != nil || r.code != 200 {
			row.Failed++
			if row.FirstFailure == "" {
				if r.err != nil {
					row.FirstFailure = r.err.Error()
				} else {
					row.FirstFailure = fmt.Sprintf("status %d: %.200s", r.code, strings.TrimSpace(r.body))
				}
			}
			continue
		}
		row.Answered++
		pids[r.pid] = true
		if lo.IsZero() || r.first.Before(lo) {
			lo = r.first
		}
		if r.first.After(hi) {
			hi = r.first
		}
	}
	row.Spawns = len(pids)
	row.SpreadMs = float64(hi.Sub(lo).Microseconds()) / 1000
	if w := st.LastWake; w != nil {
		gate := w.Started.Add(w.Duration)
		row.WakeMs = float64(w.Duration.Microseconds()) / 1000
		row.Released = w.Released
		row.ReleaseMs = float64(w.ReleaseSpread.Microseconds()) / 1000
		row.GateLastMs = float64(hi.Sub(gate).Microseconds()) / 1000
		for _, r := range results {
			if r.err == nil && r.code == 200 {
				firsts = append(firsts, float64(r.first.Sub(gate).Microseconds())/1000)
			}
		}
		row.P50Ms = percentile(firsts, 50)
	}
	return row, nil
}

// herdRequest dials, writes GET /pid with header and calls written; then waits for the whole response.
func herdRequest(ctx context.Context, addr, header string, written func()) (fbResult, error) {
	var once sync.Once
	done := func() { once.Do(written) }
	defer done()
	c, err := dialCtx(ctx, addr)
	if err != nil {
		return fbResult{}, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	return exchangeHeader(c, "/pid", "herd.localhost", header, done)
}
