package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The slow-client attack: each client declares a body of slowBodyBytes and sends it at 1 byte/s, so
// within a bounded run no body is ever complete.
const (
	slowBodyBytes = 1_000_000
	slowSlots     = 50              // the trickle's writes are spread over this many slots a second
	slowSettle    = 2 * time.Second // trickling before wrk starts: every header read, 2 body bytes sent
)

// slowNginxDirectives is what the nginx peer is told about request bodies in the slow-client
// experiment: read the whole body before proxying (nginx's default, said aloud). client_body_timeout
// stays at its default (60s) and client_max_body_size at its (1m), which the declared body fits.
const slowNginxDirectives = "      proxy_request_buffering on;\n"

// runSlow measures normal GETs on one route while slow clients hold connections to it, each sending a
// request body at 1 byte/s, against the same GETs without them: the activator with its defaults
// (request buffering on) and nginx with proxy_request_buffering on in front of the same app.
func runSlow(ctx context.Context, e *env) error {
	wrk, ok := e.tools["wrk"]
	if !ok {
		e.report.skip("slow clients", "wrk not found (Debian package wrk)")
		return nil
	}
	mode := e.modes()[0]
	dir := filepath.Join(e.tmp, "slow")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.Stop(5 * time.Second)
		}
	}()

	act, err := startWokenActivator(ctx, e, dir, mode.srv, "slow")
	if act != nil {
		procs = append(procs, act.proc)
	}
	if err != nil {
		return err
	}
	targets := []slowTarget{{warmTarget: warmTarget{name: "activator", addr: act.edge, proc: act.proc},
		config: "defaults: request buffering on, edge.body_timeout 30s"}}

	if _, ok := e.tools["nginx"]; !ok {
		e.report.skip("nginx (slow clients)", "nginx not found (Debian package nginx-light (or nginx)): the activator took the attack alone")
	} else if t, p, err := startSlowNginx(ctx, e, dir, mode); err != nil {
		for _, q := range p {
			q.Stop(5 * time.Second)
		}
		e.report.skip("nginx (slow clients)", "cannot start: %v", err)
	} else {
		procs = append(procs, p...)
		targets = append(targets, t)
	}

	for _, t := range targets {
		w := wrkRun{url: "http://" + t.addr + "/", conns: 16, threads: 1, dur: time.Second, cpus: mode.load}
		if _, err := w.run(ctx, wrk); err != nil {
			return fmt.Errorf("warm-up %s: %w", t.name, err)
		}
	}

	// Every run measures each target without and with the slow clients, the cells rotated run by run.
	type cell struct {
		target int
		attack bool
	}
	var cells []cell
	for i := range targets {
		cells = append(cells, cell{i, false}, cell{i, true})
	}
	n := e.opts.slowClients
	for run := 0; run < e.opts.runs; run++ {
		for i := range cells {
			c := cells[(i+run)%len(cells)]
			t := &targets[c.target]
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if t.proc.exited() {
				return fmt.Errorf("%s exited: %v\n%s", t.name, t.proc.err, t.proc.out.String())
			}
			w := wrkRun{url: "http://" + t.addr + "/", conns: 16, threads: min(mode.threads, 16), dur: e.opts.dur, cpus: mode.load}
			clients := 0
			if c.attack {
				clients = n
			}
			r, att, err := slowCell(ctx, e, w, wrk, t.addr, clients)
			if err != nil {
				e.log.Warn("slow-client run failed", "target", t.name, "slow_clients", clients, "err", err)
				r = wrkResult{RPS: math.NaN(), P50: math.NaN(), P99: math.NaN()}
			}
			p99, bound := r.p99Bound(e.opts.dur)
			if c.attack {
				t.with.add(r, p99, bound)
				t.att = append(t.att, att)
			} else {
				t.without.add(r, p99, bound)
			}
			e.log.Info("slow", "mode", mode.name, "run", run+1, "target", t.name, "slow_clients", clients, "open_at_end", att.open,
				"rps", int(r.RPS), "p99_us", p99, "p99_lower_bound", bound)
		}
	}

	var rows []SlowRow
	for _, t := range targets {
		row := SlowRow{Mode: mode.name, Target: t.name, Config: t.config, Clients: n, Nofile: nofileLimit(t.proc.pid()),
			RPS: summarize(t.without.rps), RPSSlow: summarize(t.with.rps),
			P50us: summarize(t.without.p50), P50usSlow: summarize(t.with.p50),
			P99us: summarize(t.without.p99), P99usSlow: summarize(t.with.p99),
			Ratio: ratios(t.with.p99, t.without.p99), RPSRatio: ratios(t.with.rps, t.without.rps),
			Errors: t.without.errors, ErrorsSlow: t.with.errors, Bounded: t.with.bounded, BoundedBase: t.without.bounded,
			Connected: n, Open: n}
		for _, a := range t.att {
			row.Connected = min(row.Connected, a.connected)
			row.Open = min(row.Open, a.open)
			row.Answered = max(row.Answered, a.answered)
			row.Dropped = max(row.Dropped, a.dropped)
			if row.FirstAnswer == "" {
				row.FirstAnswer = a.firstAnswer
			}
			if row.DialError == "" {
				row.DialError = a.dialErr
			}
		}
		rows = append(rows, row)
	}
	e.report.Slow = append(e.report.Slow, rows...)
	a := rows[0] // the activator; the peers' ratios go beside its own
	value := fmtStat(a.Ratio, 2)
	if a.Bounded > 0 {
		value = "≥ " + value
	}
	for _, r := range rows[1:] {
		value += fmt.Sprintf("; %s %s", r.Target, fmtStat(r.Ratio, 2))
	}
	e.report.check(fmt.Sprintf("slow clients: p99 with %d ÷ without (activator, %s, c16)", n, mode.name), value, "≤ 2",
		a.Ratio.valid() && a.Ratio.Median <= 2 && a.Open == n)
	return nil
}

// slowTarget is a server the slow clients attack, and what it measured.
type slowTarget struct {
	warmTarget
	config        string // what it was told about request bodies
	without, with slowSeries
	att           []slowResult // one per run with slow clients
}

// slowSeries is one target's wrk runs of one kind (without or with the slow clients).
type slowSeries struct {
	rps, p50, p99 []float64
	errors        int64
	bounded       int // runs whose p99 is only a lower bound
}

func (s *slowSeries) add(r wrkResult, p99 float64, bound bool) {
	p50 := r.P50
	if r.Requests == 0 { // wrk prints 0 for the percentiles of no answer
		p50 = math.NaN()
	}
	s.rps = append(s.rps, r.RPS)
	s.p50 = append(s.p50, p50)
	s.p99 = append(s.p99, p99)
	s.errors += r.Errors
	if bound {
		s.bounded++
	}
}

// p99Bound is the run's p99 in µs, counting what wrk leaves out of its percentiles: a request
// unanswered within wrkTimeout is a timeout error, and one unanswered when the run ends is not
// counted at all. So when more than 1% of the requests timed out the p99 is at least wrkTimeout, and
// when none was answered it is at least the run's length; bound says the value is such a lower bound.
func (r wrkResult) p99Bound(dur time.Duration) (p99 float64, bound bool) {
	switch {
	case math.IsNaN(r.P99):
		return r.P99, false
	case r.Requests == 0:
		return float64(dur.Microseconds()), true
	case r.Timeouts*100 > r.Requests+r.Timeouts:
		return math.Max(r.P99, float64(wrkTimeout.Microseconds())), true
	}
	return r.P99, false
}

// startSlowNginx starts an app and nginx in front of it with slowNginxDirectives, and waits for both.
// It returns the processes it started, also on error, for the caller to stop.
func startSlowNginx(ctx context.Context, e *env, dir string, mode cpuMode) (slowTarget, []*proc, error) {
	var procs []*proc
	app, appPort, err := startBenchApp(ctx, e, mode.srv)
	if app != nil {
		procs = append(procs, app)
	}
	if err != nil {
		return slowTarget{}, procs, err
	}
	ndir := filepath.Join(dir, "nginx")
	if err := os.MkdirAll(ndir, 0o755); err != nil {
		return slowTarget{}, procs, err
	}
	port, err := freePort()
	if err != nil {
		return slowTarget{}, procs, err
	}
	p, err := startNginxWith(e, ndir, port, appPort, mode.srv, mode.workers, slowNginxDirectives)
	if err != nil {
		return slowTarget{}, procs, err
	}
	procs = append(procs, p)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if err := waitHTTP(ctx, p, addr, "/", 30*time.Second); err != nil {
		return slowTarget{}, procs, err
	}
	return slowTarget{warmTarget: warmTarget{name: "nginx", addr: addr, proc: p},
		config: "proxy_request_buffering on; client_body_timeout default (60s)"}, procs, nil
}

// slowCell is one wrk run on addr with clients slow clients (none when 0) trickling to the same
// address: they connect and start before wrk and are all closed when it ends.
func slowCell(ctx context.Context, e *env, w wrkRun, wrk, addr string, clients int) (wrkResult, slowResult, error) {
	if clients == 0 {
		r, err := w.run(ctx, wrk)
		return r, slowResult{}, err
	}
	a := dialSlow(ctx, addr, "127.0.0.1", clients)
	tctx, cancel := context.WithTimeout(ctx, slowSettle+w.dur+time.Minute)
	trickled := make(chan struct{})
	go func() {
		defer close(trickled)
		a.trickle(tctx)
	}()
	stop := func() slowResult {
		cancel()
		<-trickled
		return a.close()
	}
	if len(a.conns) == 0 {
		res := stop()
		return wrkResult{}, res, fmt.Errorf("no slow client connected: %s", res.dialErr)
	}
	select {
	case <-time.After(slowSettle):
	case <-ctx.Done():
		stop()
		return wrkResult{}, slowResult{}, ctx.Err()
	}
	r, err := w.run(ctx, wrk)
	res := a.tally() // what the server did to them while wrk ran, before they are closed
	stop()
	return r, res, err
}

// slowAttack is a set of connections to one address, each having sent a POST header that declares
// slowBodyBytes and then trickling the body. One goroutine (trickle) writes to all of them; one per
// connection reads whatever the server sends (an early answer such as a 408 or 413) or notices it
// closing. close ends the readers and joins them.
type slowAttack struct {
	conns   []*slowConn
	dialErr string      // the first dial or header write that failed
	closing atomic.Bool // set before close closes the connections: what the readers see next is ours
	readers sync.WaitGroup
}

// slowConn is one slow client.
type slowConn struct {
	c    net.Conn
	sent int  // body bytes written; trickle's alone
	dead bool // a write failed; trickle's alone

	mu     sync.Mutex // guards the fields below, written by the connection's reader
	answer string     // the status line the server sent, if it answered
	closed bool       // the server closed or reset the connection without an answer
}

// slowResult is what became of one attack's slow clients.
type slowResult struct {
	connected   int    // connections that sent their header
	open        int    // still trickling: no answer, not closed by the server, writes succeeding
	answered    int    // the server sent a response
	dropped     int    // the server closed the connection without one
	firstAnswer string // one of the answers' status lines
	dialErr     string
}

// dialSlow connects n clients to addr one after another and sends each one's header. Dials that fail
// are counted, not fatal: the attack goes on with the connections it has.
func dialSlow(ctx context.Context, addr, host string, n int) *slowAttack {
	a := &slowAttack{}
	header := fmt.Sprintf("POST /echo HTTP/1.1\r\nHost: %s\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", host, slowBodyBytes)
	for i := 0; i < n && ctx.Err() == nil; i++ {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := dialCtx(dctx, addr)
		cancel()
		if err == nil {
			_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if _, err = c.Write([]byte(header)); err != nil {
				c.Close()
			}
		}
		if err != nil {
			if a.dialErr == "" {
				a.dialErr = fmt.Sprintf("client %d of %d: %v", i+1, n, err)
			}
			continue
		}
		sc := &slowConn{c: c}
		a.conns = append(a.conns, sc)
		a.readers.Add(1)
		go func() {
			defer a.readers.Done()
			sc.read(&a.closing)
		}()
	}
	return a
}

// read waits for the server's first response line or the end of the connection.
func (sc *slowConn) read(closing *atomic.Bool) {
	line, err := bufio.NewReader(sc.c).ReadString('\n')
	if closing.Load() && line == "" {
		return
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if line != "" {
		sc.answer = strings.TrimSpace(line)
	} else if err != nil {
		sc.closed = true
	}
}

// trickle writes one body byte a second to every connection, spread over the second in slowSlots
// slots, until ctx ends. It stops writing to a connection whose write fails.
func (a *slowAttack) trickle(ctx context.Context) {
	t := time.NewTicker(time.Second / slowSlots)
	defer t.Stop()
	b := []byte{'x'}
	for slot := 0; ; slot = (slot + 1) % slowSlots {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for i := slot; i < len(a.conns); i += slowSlots {
			sc := a.conns[i]
			if sc.dead || sc.sent >= slowBodyBytes {
				continue
			}
			_ = sc.c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			if _, err := sc.c.Write(b); err != nil {
				sc.dead = true
				continue
			}
			sc.sent++
		}
	}
}

// tally counts the clients by what the server did to them so far. Only the readers' fields are read,
// so it may run while trickle does; a failed write shows up as the reader's closed soon after.
func (a *slowAttack) tally() slowResult {
	r := slowResult{connected: len(a.conns), dialErr: a.dialErr}
	for _, sc := range a.conns {
		sc.mu.Lock()
		switch {
		case sc.answer != "":
			r.answered++
			if r.firstAnswer == "" {
				r.firstAnswer = sc.answer
			}
		case sc.closed:
			r.dropped++
		default:
			r.open++
		}
		sc.mu.Unlock()
	}
	return r
}

// close closes every connection and joins the readers. Call it after trickle has returned.
func (a *slowAttack) close() slowResult {
	r := a.tally()
	a.closing.Store(true)
	for _, sc := range a.conns {
		sc.c.Close()
	}
	a.readers.Wait()
	return r
}
