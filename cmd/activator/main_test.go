package main

// The end-to-end harness: the real registry, the real backings from newBackings, an activator.Server
// behind a real loopback edge listener speaking edgeProtocols(), the admin API on another, and tenants
// that are this test binary re-executed as the demo app. Nothing is faked.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/backend/exec/shim"
	"github.com/activator/activator/internal/demoapp"
	"github.com/activator/activator/internal/health"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/testenv"
)

func TestMain(m *testing.M) {
	// Re-executed as the demo tenant: never returns then. (As the listen_fds shim, package shim's init
	// has exec'd the tenant before this runs.)
	demoapp.RunIfChild()
	// Every test shuts its harness down: nothing may outlive the tests (TestNoGoroutineLeaks checks one
	// harness precisely; this checks the whole run).
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction(testenv.ForkingThreads))
}

// patience bounds every wait in these tests. It is a generous upper bound, never an expectation: on a
// healthy machine each wait ends within milliseconds.
const patience = 30 * time.Second

// appRoute is one exec route whose tenant is this test binary running as the demo app. Empty fields
// take the defaults noted.
type appRoute struct {
	Name     string            // also the host: Name + ".test"
	Upstream string            // default: 127.0.0.1 and a free port
	Listen   string            // exec listen mode (default env)
	Env      map[string]string // DEMOAPP_* knobs
	// Route keys, as YAML scalars.
	Idle, WakeBudget, HoldMaxTime, BackoffInitial, BackoffMax, StopGrace string
	// DetailedErrors sets detailed_errors: error bodies quote a failed wake's cause.
	DetailedErrors bool
	// Standby sets the exec block's standby: true.
	Standby bool
	// HealthPath is health.path (default /healthz).
	HealthPath string
}

func (a appRoute) host() string { return a.Name + ".test" }

// yaml renders the route as an item of the config's routes list.
func (a appRoute) yaml(t testing.TB) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatalf("os.Executable: %v", err)
	}
	up := a.Upstream
	if up == "" {
		up = freeLoopbackAddr(t)
	}
	or := func(v, def string) string {
		if v == "" {
			return def
		}
		return v
	}
	var b strings.Builder
	fmt.Fprintf(&b, "  - name: %s\n", a.Name)
	fmt.Fprintf(&b, "    hosts: [%s]\n", a.host())
	fmt.Fprintf(&b, "    backing: exec\n")
	fmt.Fprintf(&b, "    upstream: %q\n", up)
	fmt.Fprintf(&b, "    idle: %s\n", or(a.Idle, "10m"))
	fmt.Fprintf(&b, "    wake_budget: %s\n", or(a.WakeBudget, "30s"))
	fmt.Fprintf(&b, "    hold: {max_time: %s}\n", or(a.HoldMaxTime, "60s"))
	fmt.Fprintf(&b, "    backoff: {initial: %s, max: %s}\n", or(a.BackoffInitial, "1s"), or(a.BackoffMax, "1m"))
	fmt.Fprintf(&b, "    health: {path: %s, interval: 50ms}\n", or(a.HealthPath, "/healthz"))
	if a.DetailedErrors {
		fmt.Fprintf(&b, "    detailed_errors: true\n")
	}
	fmt.Fprintf(&b, "    exec:\n")
	fmt.Fprintf(&b, "      argv: [%q]\n", self)
	fmt.Fprintf(&b, "      listen: %s\n", or(a.Listen, "env"))
	fmt.Fprintf(&b, "      stop_grace: %s\n", or(a.StopGrace, "10s"))
	if a.Standby {
		fmt.Fprintf(&b, "      standby: true\n")
	}
	fmt.Fprintf(&b, "      env:\n")
	fmt.Fprintf(&b, "        %s: \"1\"\n", demoapp.ChildEnv)
	keys := make([]string, 0, len(a.Env))
	for k := range a.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "        %s: %q\n", k, a.Env[k])
	}
	return b.String()
}

// configYAML is a whole config file holding routes.
func configYAML(t testing.TB, routes ...appRoute) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("routes:\n")
	for _, r := range routes {
		b.WriteString(r.yaml(t))
	}
	return b.String()
}

// harness is one activator wired as serve() wires it, on loopback listeners.
type harness struct {
	t        testing.TB
	rec      *recorder
	log      *slog.Logger
	bk       *backings
	pacer    *health.Pacer
	srv      *activator.Server
	edge     *http.Server
	resume   *http.Server // serves the connections of parked requests again (newEdgeServers)
	edgeAddr string
	admin    *httptest.Server
	client   *http.Client // keep-alive client for the edge
	served   chan error   // the edge's Serve result
	cancel   context.CancelFunc
	stopOnce sync.Once
}

// newHarness loads config (with the real decoders), applies it and starts the edge and admin
// listeners. Everything is shut down at cleanup; the recorded logs are printed when the test failed.
// tweaks adjust the activator's options before it is built (benchmarks' experiments).
func newHarness(t testing.TB, config string, tweaks ...func(*activator.Options)) *harness {
	t.Helper()
	rec := newRecorder()
	log := slog.New(rec.handler())
	ctx, cancel := context.WithCancel(context.Background())
	bk := newBackings(ctx, log, false)
	cfg, err := registry.Load([]byte(config), bk.decoders)
	if err != nil {
		cancel()
		t.Fatalf("config rejected: %v\n%s", err, config)
	}
	pacer := health.NewPacer()
	opts := activator.Options{
		Opener:  bk.provider,
		Logger:  log,
		Metrics: activator.NewMetrics(prometheus.NewRegistry()),
		Pacer:   pacer,
		// Every request held over plain HTTP/1 parks (the activator parks only herds), so that the
		// tests of the hold run through the hand-back too; the net/http hold keeps its own tests in
		// internal/activator, and over h2c and TLS here.
		ParkAbove: -1,
	}
	for _, tw := range tweaks {
		tw(&opts)
	}
	srv := activator.New(opts)
	if err := srv.Apply(cfg); err != nil {
		_ = pacer.Close()
		cancel()
		t.Fatalf("Apply: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = srv.Shutdown(context.Background())
		_ = pacer.Close()
		cancel()
		t.Fatal(err)
	}
	h := &harness{
		t:        t,
		rec:      rec,
		log:      log,
		bk:       bk,
		pacer:    pacer,
		srv:      srv,
		edgeAddr: ln.Addr().String(),
		admin:    httptest.NewServer(srv.AdminHandler(nil, nil)),
		client: &http.Client{Transport: &http.Transport{
			MaxIdleConns:        2048,
			MaxIdleConnsPerHost: 2048,
			DisableCompression:  true,
		}},
		served: make(chan error, 1),
		cancel: cancel,
	}
	h.edge, h.resume = newEdgeServers(srv, srv, cfg.Edge, log)
	go func() { h.served <- serveHTTP(h.edge, activator.Listener(ln, cfg.Edge.SendTimeout)) }()
	t.Cleanup(func() {
		h.shutdown()
		if t.Failed() {
			rec.dump(t)
		}
	})
	return h
}

// shutdown stops everything in serve()'s order and joins the edge; it is idempotent.
func (h *harness) shutdown() {
	h.stopOnce.Do(func() {
		h.t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		defer cancel()
		if err := h.edge.Shutdown(ctx); err != nil {
			h.t.Errorf("edge shutdown: %v", err)
		}
		if err := h.srv.Shutdown(ctx); err != nil {
			h.t.Errorf("activator shutdown: %v", err)
		}
		if err := h.resume.Shutdown(ctx); err != nil {
			h.t.Errorf("resume server shutdown: %v", err)
		}
		if err := h.bk.provider.Close(); err != nil {
			h.t.Errorf("backings close: %v", err)
		}
		h.admin.Close()
		h.client.CloseIdleConnections()
		if err := <-h.served; err != nil {
			h.t.Errorf("edge serve: %v", err)
		}
		if err := h.pacer.Close(); err != nil {
			h.t.Errorf("pacer close: %v", err)
		}
		h.cancel()
	})
}

// request builds a request to the edge for host. method and path are the tests' constants, so it
// cannot fail; it panics if they are malformed (it is called from request goroutines, where t.Fatal is
// not allowed).
func (h *harness) request(ctx context.Context, method, host, path string, body io.Reader) *http.Request {
	req, err := http.NewRequestWithContext(ctx, method, "http://"+h.edgeAddr+path, body)
	if err != nil {
		panic(fmt.Sprintf("malformed test request %s %s: %v", method, path, err))
	}
	req.Host = host
	return req
}

// reply is a response read to its end.
type reply struct {
	code   int
	header http.Header
	body   string
}

// do sends req and reads the whole answer; it reports transport errors (not statuses) as errors, so it
// is safe to call from any goroutine.
func (h *harness) do(req *http.Request) (reply, error) {
	resp, err := h.client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: reading the body: %w", req.Method, req.URL.Path, err)
	}
	return reply{code: resp.StatusCode, header: resp.Header, body: string(b)}, nil
}

// get is do for a GET; it fails the test on a transport error (call it from the test goroutine only).
func (h *harness) get(host, path string) reply {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	r, err := h.do(h.request(ctx, http.MethodGet, host, path, nil))
	if err != nil {
		h.t.Fatalf("GET %s%s: %v", host, path, err)
	}
	return r
}

// status reads one route's status from the admin API.
func (h *harness) status(route string) activator.Status {
	h.t.Helper()
	resp, err := http.Get(h.admin.URL + "/routes/" + route)
	if err != nil {
		h.t.Fatalf("admin status: %v", err)
	}
	defer resp.Body.Close()
	var st activator.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		h.t.Fatalf("admin status: %v", err)
	}
	return st
}

// waitStatus polls the admin status until cond holds, failing the test after patience.
func (h *harness) waitStatus(route, what string, cond func(activator.Status) bool) activator.Status {
	h.t.Helper()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(patience)
	defer deadline.Stop()
	for {
		st := h.status(route)
		if cond(st) {
			return st
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			h.t.Fatalf("route %s: not %s within %v; last status: %+v", route, what, patience, st)
		}
	}
}

// spawns lists the pids the exec backing spawned for route, in order.
func (h *harness) spawns(route string) []int {
	var pids []int
	for _, r := range h.rec.matching("spawned", "route", route) {
		pid, _ := strconv.Atoi(r.attrs["pid"])
		pids = append(pids, pid)
	}
	return pids
}

// waitGone polls until no process has pid (reaped, not a zombie), failing the test after patience.
func waitGone(t testing.TB, pid int) {
	t.Helper()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(patience)
	defer deadline.Stop()
	for {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); errors.Is(err, os.ErrNotExist) {
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("pid %d still exists %v after it should have been stopped", pid, patience)
		}
	}
}

// recorder keeps every log record the activator and the backings emit, so tests can count spawns and
// wait for events ("slept", "config reload rejected") instead of sleeping.
type recorder struct {
	mu      sync.Mutex // guards the fields below
	recs    []logRec
	changed chan struct{} // closed and replaced on every new record
}

type logRec struct {
	time  time.Time
	level slog.Level
	msg   string
	attrs map[string]string
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{})} }

func (r *recorder) handler() slog.Handler { return &recHandler{r: r} }

func (r *recorder) add(rec logRec) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec)
	close(r.changed)
	r.changed = make(chan struct{})
}

// snapshot is a copy of every record so far, in order.
func (r *recorder) snapshot() []logRec {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.recs)
}

// matching returns the records with msg whose attribute key equals val (key "" matches all).
func (r *recorder) matching(msg, key, val string) []logRec {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.matchingLocked(msg, key, val)
}

func (r *recorder) matchingLocked(msg, key, val string) []logRec {
	var out []logRec
	for _, rec := range r.recs {
		if rec.msg == msg && (key == "" || rec.attrs[key] == val) {
			out = append(out, rec)
		}
	}
	return out
}

// waitFor waits until at least n records match, failing t after patience.
func (r *recorder) waitFor(t testing.TB, n int, msg, key, val string) []logRec {
	t.Helper()
	deadline := time.NewTimer(patience)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		got := r.matchingLocked(msg, key, val)
		changed := r.changed
		r.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("log %q (%s=%s) seen %d times within %v, want %d", msg, key, val, len(got), patience, n)
		}
	}
}

func (r *recorder) dump(t testing.TB) {
	r.mu.Lock()
	defer r.mu.Unlock()
	recs := r.recs
	if len(recs) > 300 {
		recs = recs[len(recs)-300:]
	}
	for _, rec := range recs {
		keys := make([]string, 0, len(rec.attrs))
		for k := range rec.attrs {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		var b strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&b, " %s=%q", k, rec.attrs[k])
		}
		t.Logf("log %s %s %q%s", rec.time.Format("15:04:05.000000"), rec.level, rec.msg, b.String())
	}
}

// recHandler is a slog.Handler feeding a recorder. Groups are flattened into dotted keys.
type recHandler struct {
	r      *recorder
	attrs  []slog.Attr
	prefix string
}

func (h *recHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *recHandler) Handle(_ context.Context, r slog.Record) error {
	attrs := map[string]string{}
	for _, a := range h.attrs {
		addAttr(attrs, "", a)
	}
	r.Attrs(func(a slog.Attr) bool {
		addAttr(attrs, h.prefix, a)
		return true
	})
	h.r.add(logRec{time: r.Time, level: r.Level, msg: r.Message, attrs: attrs})
	return nil
}

func addAttr(m map[string]string, prefix string, a slog.Attr) {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		for _, g := range v.Group() {
			addAttr(m, prefix+a.Key+".", g)
		}
		return
	}
	m[prefix+a.Key] = v.String()
}

func (h *recHandler) WithAttrs(as []slog.Attr) slog.Handler {
	n := &recHandler{r: h.r, prefix: h.prefix, attrs: slices.Clone(h.attrs)}
	for _, a := range as {
		n.attrs = append(n.attrs, slog.Attr{Key: h.prefix + a.Key, Value: a.Value})
	}
	return n
}

func (h *recHandler) WithGroup(name string) slog.Handler {
	return &recHandler{r: h.r, attrs: h.attrs, prefix: h.prefix + name + "."}
}

// freeLoopbackAddr is testenv.FreeLoopbackAddr: a free port on a random address of 127.0.0.0/8.
func freeLoopbackAddr(t testing.TB) string { return testenv.FreeLoopbackAddr(t) }

// TestShimSkipsHeavyInit: started as the listen_fds shim, this binary (which links every package the
// activator does) must exec the tenant from package shim's init, before the initialisers of net/http,
// Prometheus and the backends' clients run: running them all cost about 2.8 ms per listen_fds wake.
// Go orders package initialisation by import path as imports allow, so this guards against a shim
// package that gains an import, or a rename, that pushes it after them.
func TestShimSkipsHeavyInit(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	truePath, err := exec.LookPath("true")
	if err != nil {
		t.Skip("no true(1) to exec")
	}
	cmd := exec.Command(self)
	cmd.Args = []string{shim.Arg0, truePath, "true"}
	cmd.Env = append(os.Environ(), shim.Env+"=1", "GODEBUG=inittrace=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("shim: %v: %s", err, out)
	}
	var inited []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "init" {
			inited = append(inited, f[1])
		}
	}
	if len(inited) == 0 {
		t.Fatalf("no inittrace output from the shim: %q", out)
	}
	for _, heavy := range []string{"net/http", "github.com/prometheus/client_golang/prometheus", "go.yaml.in/yaml/v3"} {
		if slices.Contains(inited, heavy) {
			t.Errorf("the shim ran %s's init before exec'ing the tenant (inits: %v)", heavy, inited)
		}
	}
}
