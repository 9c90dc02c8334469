package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"slices"
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
// quarter between runs on a shared 2-CPU box. The process-wide hold caps are raised in the herd's
// config to fit it (edge.max_held, edge.max_held_bytes), as an operator expecting such a herd would.
//
// A herd over HTTP/1.1 is one connection per request, so one descriptor in the harness and one in the
// activator each. A size that the open-file limit cannot hold is measured twice: over HTTP/1.1 at the
// largest size the limit allows, and at its full size over h2c, whose requests are streams sharing
// h2cStreams per connection.
func runHerd(ctx context.Context, e *env) error {
	budget := h1Budget()
	sizes := herdSizes(e.opts.herd, budget)
	for _, n := range e.opts.herd {
		if n > budget {
			e.report.skip(fmt.Sprintf("herd of %d over HTTP/1.1", n), "the open-file limit is %d (this process and the activator it starts; the harness could raise it no further): measured over HTTP/1.1 at %d, and at %d over h2c (%d streams a connection)",
				budget+fdReserve, budget, n, h2cStreams)
		}
	}
	runs := map[herdSize][]HerdRow{}
	for i := 0; i < e.opts.herdRuns; i++ {
		for _, sz := range sizes {
			row, err := herdOnce(ctx, e, herdSpec{n: sz.n, run: i + 1, h2c: sz.h2c, caps: true})
			if err != nil {
				return fmt.Errorf("%d requests over %s, run %d: %w", sz.n, sz.proto(), i+1, err)
			}
			runs[sz] = append(runs[sz], row)
			e.log.Info("herd", "n", sz.n, "proto", sz.proto(), "run", i+1, "answered", row.Answered, "spawns", row.Spawns, "release_ms", row.ReleaseMs, "kib_per_held", row.PerHeldKiB, "first_failure", row.FirstFailure)
		}
	}
	for _, sz := range sizes {
		row := medianHerd(runs[sz])
		e.report.Herd = append(e.report.Herd, row)
		n := sz.n
		if n < 10000 && sz != sizes[len(sizes)-1] {
			continue
		}
		name := fmt.Sprintf("herd N=%d over %s", n, sz.proto())
		e.report.check(name+": spawns, all answered (every run)", fmt.Sprintf("%d spawn(s), %d/%d answered (worst of %d)", row.Spawns, row.Answered, n, row.Runs), "1 spawn, all answered", row.Spawns == 1 && row.Answered == n)
		if n == 10000 && !sz.h2c { // the first benchmark issue's release target is for a herd of 10,000
			e.report.check(name+": release spread, gate passed → last held request left the hold (ms)",
				fmt.Sprintf("%s over %d runs (%d released); last response %.1f ms after the gate", row.Release, row.Runs, row.Released, row.GateLastMs), "≤ 20 ms", row.Released == n && row.ReleaseMs <= 20)
		}
		e.report.check(name+": activator RSS per held request", fmt.Sprintf("%s KiB (heap %.1f, stacks %.1f)", row.PerHeld, row.HeapPerHeldKiB, row.StackPerHeldKiB), "≤ 12 KiB", row.PerHeldKiB <= 12)
	}
	return nil
}

// fdReserve is what the harness and the activator keep of their open-file limit beyond a herd's
// client connections: the activator's upstream connections, listeners and pipes, the harness's polls.
const fdReserve = 1024

// h2cStreams is how many of an h2c herd's requests share one connection: below the edge's
// SETTINGS_MAX_CONCURRENT_STREAMS (net/http's default, 250).
const h2cStreams = 200

// raiseNofileForHerds raises the open-file limit of the harness, and so of the activators it starts,
// to what its largest herd over HTTP/1.1 needs, or as far as the hard limit allows. It sets the limit
// even when it is high enough already: the Go runtime raises its own soft limit at start-up but
// gives a child the original one unless the program set the limit itself.
func raiseNofileForHerds(sizes []int) (uint64, error) {
	lim, err := raiseNofile(uint64(max(1<<16, slices.Max(sizes)+fdReserve)))
	var rl syscall.Rlimit
	if err2 := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err2 == nil {
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
	}
	return lim, err
}

// h1Budget is the largest herd over HTTP/1.1 this process's open-file limit allows (the activator
// inherits the limit).
func h1Budget() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	return max(0, int(min(rl.Cur, 1<<30))-fdReserve)
}

// herdSize is one kind of herd runHerd measures.
type herdSize struct {
	n   int
	h2c bool
}

func (s herdSize) proto() string { return protoName(s.h2c) }

func protoName(h2c bool) string {
	if h2c {
		return "h2c"
	}
	return "HTTP/1.1"
}

// herdSizes lists the herds for the sizes asked for: each over HTTP/1.1 when the limit allows it,
// otherwise over HTTP/1.1 at budget and over h2c at its size.
func herdSizes(asked []int, budget int) []herdSize {
	var out []herdSize
	for _, n := range asked {
		if os.Getenv("BENCH_HERD_H2C") != "" { // profiling the h2c hold at any size
			out = append(out, herdSize{n: n, h2c: true})
			continue
		}
		if n <= budget {
			out = append(out, herdSize{n: n})
			continue
		}
		if budget > 0 {
			out = append(out, herdSize{n: budget})
		}
		out = append(out, herdSize{n: n, h2c: true})
	}
	return slices.Compact(out)
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
	out.HeapPerHeldKiB = col(func(r HerdRow) float64 { return r.HeapPerHeldKiB }).Median
	out.StackPerHeldKiB = col(func(r HerdRow) float64 { return r.StackPerHeldKiB }).Median
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
// of pad bytes (none when 0), over HTTP/1.1 (one connection each) or h2c. caps raises the config's
// process-wide hold caps (edge.max_held, edge.max_held_bytes) to fit the herd; without it they are the
// defaults.
type herdSpec struct {
	n, run, pad int
	h2c, caps   bool
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
	row := HerdRow{N: n, Proto: protoName(h.h2c)}
	// A directory of its own: the herd and heldmem experiments both run, say, 1000 unpadded requests
	// as their run 1, and a shared directory's FIFO would already exist for the second.
	dir, err := os.MkdirTemp(e.tmp, fmt.Sprintf("herd-%d-%s-pad%d-run%d-", n, strings.ReplaceAll(protoName(h.h2c), "/", ""), h.pad, h.run))
	if err != nil {
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
	cfg += h.edgeCaps()
	profile := os.Getenv("BENCH_HERD_PROFILE") // file prefix: a heap profile of the activator with every request held
	act, err := startHerdActivator(ctx, e, dir, cfg, ports[0], ports[1], profile != "")
	if err != nil {
		return row, err
	}
	defer act.Stop(30 * time.Second)
	row.Nofile = nofileLimit(act.pid())
	if row.RSSIdleKiB, err = rssKiB(act.pid()); err != nil {
		return row, err
	}
	heap0 := scrapeMetric(ctx, act.admin, "go_memstats_heap_inuse_bytes")
	stack0 := scrapeMetric(ctx, act.admin, "go_memstats_stack_inuse_bytes")
	send, conns, closeClients := herdClients(h, act.edge)
	defer closeClients()

	type result struct {
		first time.Time
		code  int
		pid   string
		body  string
		err   error
	}
	results := make([]result, n)
	var finished atomic.Int64 // requests answered or failed before the release: refused at a cap
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
			r, err := send(rctx, i, func() { <-dialSem })
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
	held := float64(max(1, row.HeldMax))
	row.PerHeldKiB = float64(row.RSSHeldKiB-row.RSSIdleKiB) / held
	row.HeapPerHeldKiB = (scrapeMetric(ctx, act.admin, "go_memstats_heap_inuse_bytes") - heap0) / 1024 / held
	row.StackPerHeldKiB = (scrapeMetric(ctx, act.admin, "go_memstats_stack_inuse_bytes") - stack0) / 1024 / held
	row.Conns = int(conns.Load())
	if profile != "" {
		saveHeapProfile(ctx, act.admin, fmt.Sprintf("%s-%d-%s-pad%d-run%d.pb.gz", profile, n, strings.ReplaceAll(protoName(h.h2c), "/", ""), h.pad, h.run))
	}
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
		if len(firsts) > 0 {
			row.P50Ms = percentile(firsts, 50)
		}
	}
	return row, nil
}

// edgeCaps is the config's edge block for the herd. Its connection cap always fits the herd, a
// thousand connections beyond it: past the cap the herd's requests would wait unheld, accepted and
// unserved, which is what the cap is for, not what a herd measures (and the default edge.max_conns
// leaves an eighth of the open-file limit for the rest, which an HTTP/1.1 herd at the limit needs).
// With h.caps the process-wide hold caps are raised to fit it too: a thousand requests and, for
// each, its size and 1 KiB more, beyond the herd (never below their defaults).
func (h herdSpec) edgeCaps() string {
	b := fmt.Sprintf("edge:\n  max_conns: %d\n", h.n+1000)
	if h.caps {
		b += fmt.Sprintf("  max_held: %d\n  max_held_bytes: %d\n",
			max(20000, h.n+1000), max(256<<20, int64(h.n+1000)*int64(h.requestBytes()+1<<10)))
	}
	return b
}

// herdClients returns how a herd's i-th request is sent (dial, write, call written, read the whole
// response), the connections dialed so far, and what closes the clients once the herd is over.
// HTTP/1.1 dials one connection a request, from loopbackSources; h2c spreads the requests over
// ⌈n / h2cStreams⌉ connections, one client each.
func herdClients(h herdSpec, edge string) (send func(ctx context.Context, i int, written func()) (fbResult, error), conns *atomic.Int64, closeAll func()) {
	conns = &atomic.Int64{}
	header := h.header()
	src := loopbackSources(h.n)
	if !h.h2c {
		return func(ctx context.Context, i int, written func()) (fbResult, error) {
			conns.Add(1)
			return herdRequest(ctx, src[i%len(src)], edge, header, written)
		}, conns, func() {}
	}
	clients := make([]*http.Client, (h.n+h2cStreams-1)/h2cStreams)
	for j := range clients {
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		d := net.Dialer{LocalAddr: src[j%len(src)]}
		clients[j] = &http.Client{Transport: &http.Transport{
			Protocols:          &p,
			DisableCompression: true,
			MaxConnsPerHost:    1,
			// Strict: a connection's requests wait for its streams instead of dialing another.
			HTTP2: &http.HTTP2Config{StrictMaxConcurrentRequests: true},
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				conns.Add(1)
				return d.DialContext(ctx, network, addr)
			},
		}}
	}
	send = func(ctx context.Context, i int, written func()) (fbResult, error) {
		return h2cRequest(ctx, clients[i%len(clients)], edge, h.pad, written)
	}
	return send, conns, func() {
		for _, c := range clients {
			c.CloseIdleConnections()
		}
	}
}

// loopbackSources are the source addresses a herd of n dials from: as many of 127.0.0.2, 127.0.0.3, …
// as keep each under half the ephemeral port range, so a herd larger than one address's ports can
// connect. Every one is in 127.0.0.0/8: the load never leaves loopback. None is 127.0.0.1, where the
// activator, its tenant and its health probes listen and dial: a port the herd binds there could be
// the one the tenant is about to listen on, and the activator's own dials would find fewer ports.
func loopbackSources(n int) []*net.TCPAddr {
	per := ephemeralPorts() / 2
	k := min(250, max(1, (n+per-1)/per))
	out := make([]*net.TCPAddr, k)
	for i := range out {
		out[i] = &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i))}
	}
	return out
}

// ephemeralPorts is the size of the kernel's ephemeral port range (28,232 by default).
func ephemeralPorts() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 28232
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil || hi <= lo {
		return 28232
	}
	return hi - lo + 1
}

// herdRequest dials addr from src, writes GET /pid with header and calls written; then waits for the
// whole response.
func herdRequest(ctx context.Context, src *net.TCPAddr, addr, header string, written func()) (fbResult, error) {
	var once sync.Once
	done := func() { once.Do(written) }
	defer done()
	d := net.Dialer{LocalAddr: src}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fbResult{}, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	return exchangeHeader(c, "/pid", "herd.localhost", header, done)
}

// h2cRequest sends GET /pid to addr on c (h2c), with an X-Pad header of pad bytes when pad > 0, calls
// written once the request is on the wire, and reads the whole response. first is when the response
// header arrived.
func h2cRequest(ctx context.Context, c *http.Client, addr string, pad int, written func()) (fbResult, error) {
	var once sync.Once
	done := func() { once.Do(written) }
	defer done()
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { done() }})
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/pid", nil)
	if err != nil {
		return fbResult{}, err
	}
	req.Host = "herd.localhost"
	if pad > 0 {
		req.Header.Set("X-Pad", strings.Repeat("p", pad))
	}
	r := fbResult{sent: time.Now()}
	resp, err := c.Do(req)
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	r.first = time.Now()
	r.code = resp.StatusCode
	r.body, err = io.ReadAll(resp.Body)
	return r, err
}

// startHerdActivator is startActivator, with net/http/pprof on the admin listener when pprof is set.
func startHerdActivator(ctx context.Context, e *env, dir, config string, edge, admin int, pprof bool) (*activatorProc, error) {
	path := filepath.Join(dir, "activator.yaml")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		return nil, err
	}
	argv := []string{e.actBin, "serve", "--config", path, "--log-level", "warn"}
	if pprof {
		argv = append(argv, "--pprof")
	}
	p, err := startProc(procSpec{name: "activator", argv: argv})
	if err != nil {
		return nil, err
	}
	a := &activatorProc{proc: p, edge: fmt.Sprintf("127.0.0.1:%d", edge), admin: fmt.Sprintf("127.0.0.1:%d", admin), config: path}
	if err := waitHTTP(ctx, p, a.admin, "/healthz", 5*time.Minute); err != nil {
		p.Stop(5 * time.Second)
		return nil, err
	}
	return a, nil
}

// saveHeapProfile writes the activator's heap profile (after a GC) to path; a failure is only
// logged, since the profile is a diagnosis, not a figure.
func saveHeapProfile(ctx context.Context, admin, path string) {
	b, err := getText(ctx, admin, "/debug/pprof/heap?gc=1")
	if err == nil {
		err = os.WriteFile(path, b, 0o644)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: heap profile %s: %v\n", path, err)
	}
}
