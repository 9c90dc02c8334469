package main

// Shutdown end to end: this test binary re-executed as `activator serve` (serveChildEnv), sent a real
// SIGTERM while requests are held or in flight, with real exec tenants. What the clients get, when the
// process exits and how its tenants were stopped is observed from outside, as an operator would.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/demoapp"
)

// serveChildEnv makes this test binary run its main (`activator serve ...`, from its arguments)
// instead of its tests: the shutdown tests signal a real activator process, and the systemd test runs
// one as a unit.
const serveChildEnv = "ACTIVATOR_TEST_MAIN"

// init runs main in a process started with serveChildEnv=1. It unsets the variable first: the tenants
// that activator spawns are this binary too, and must run as demo apps.
func init() {
	if os.Getenv(serveChildEnv) != "1" {
		return
	}
	_ = os.Unsetenv(serveChildEnv)
	main()
}

// served is an activator process started by startServed, with its JSON log records.
type served struct {
	t      testing.TB
	cmd    *exec.Cmd
	edge   string // host:port
	admin  string // host:port
	path   string // the config file
	logs   *jsonLog
	exited chan struct{} // closed once the process has been waited for; exitErr is set before
	// exitErr is cmd.Wait's result.
	exitErr error
}

// startServed writes config (which must not set listen or admin: they are added here) and runs
// `activator serve` on it, returning once it listens. The process is killed at cleanup if it still
// runs; its log is printed when the test failed.
func startServed(t testing.TB, config string) *served {
	t.Helper()
	return startServedAt(t, freeLoopbackAddr(t), freeLoopbackAddr(t), config)
}

// startServedAt is startServed with the edge and admin addresses given (admin may be unix:/path),
// and each tweak applied to the command before it starts.
func startServedAt(t testing.TB, edge, admin, config string, tweaks ...func(*exec.Cmd)) *served {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "activator.yaml")
	config = fmt.Sprintf("listen: %q\nadmin: %q\n", edge, admin) + config
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "serve", "--config", path, "--log-format", "json", "--log-level", "debug")
	// The race detector's one-second pause at exit is not the activator's: leave it out of the timings.
	cmd.Env = append(os.Environ(), serveChildEnv+"=1", "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	for _, tw := range tweaks {
		tw(cmd)
	}
	s := &served{t: t, cmd: cmd, edge: edge, admin: admin, path: path, logs: newJSONLog(), exited: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	read := make(chan struct{})
	go func() { defer close(read); s.logs.read(stderr) }()
	go func() {
		<-read // Wait closes the pipe: read it to its end first
		s.exitErr = cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-s.exited:
		default:
			_ = cmd.Process.Kill()
			<-s.exited
		}
		if t.Failed() {
			s.logs.dump(t)
		}
	})
	s.logs.waitFor(t, s.exited, "activator listening")
	return s
}

// rewrite replaces the config file with config (listen and admin added, as startServedAt adds them)
// by a rename, as config managers do, and returns once the activator has logged "config reloaded"
// for the nth time: the file watch reloads it.
func (s *served) rewrite(config string, n int) {
	s.t.Helper()
	config = fmt.Sprintf("listen: %q\nadmin: %q\n", s.edge, s.admin) + config
	tmp := s.path + ".new"
	if err := os.WriteFile(tmp, []byte(config), 0o644); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Rename(tmp, s.path); err != nil {
		s.t.Fatal(err)
	}
	s.waitLogged("config reloaded", n)
}

// sigterm sends SIGTERM and returns when it was sent.
func (s *served) sigterm() time.Time {
	s.t.Helper()
	now := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		s.t.Fatalf("SIGTERM: %v", err)
	}
	return now
}

// wait waits for the process to exit (failing the test after patience) and returns when it did.
func (s *served) wait() time.Time {
	s.t.Helper()
	select {
	case <-s.exited:
	case <-time.After(2 * patience):
		s.t.Fatalf("the activator did not exit within %v", 2*patience)
	}
	at := time.Now()
	if s.exitErr != nil {
		s.t.Errorf("the activator exited with %v, want 0", s.exitErr)
	}
	return at
}

// status reads one route's status from the admin API.
func (s *served) status(route string) activator.Status {
	s.t.Helper()
	resp, err := http.Get("http://" + s.admin + "/routes/" + route)
	if err != nil {
		s.t.Fatalf("admin status: %v", err)
	}
	defer resp.Body.Close()
	var st activator.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		s.t.Fatalf("admin status: %v", err)
	}
	return st
}

// waitStatus polls the admin status until cond holds, failing the test after patience.
func (s *served) waitStatus(route, what string, cond func(activator.Status) bool) {
	s.t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(patience)
	defer deadline.Stop()
	for {
		st := s.status(route)
		if cond(st) {
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			s.t.Fatalf("route %s: not %s within %v; last status: %+v", route, what, patience, st)
		}
	}
}

// clientAnswer is what one client got.
type clientAnswer struct {
	code       int
	retryAfter string
	body       string
	err        error
}

// getFresh sends GET path for host over a connection of its own (no keep-alive), so an error is this
// request's and no other's, and reads the whole answer.
func getFresh(ctx context.Context, addr, host, path string) clientAnswer {
	return getAs(ctx, addr, host, path, "")
}

// getAs is getFresh with a User-Agent ("" for Go's default).
func getAs(ctx context.Context, addr, host, path, ua string) clientAnswer {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return clientAnswer{err: err}
	}
	req.Host = host
	if ua != "" {
		req.Header.Set("User-Agent", ua)
	}
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return clientAnswer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return clientAnswer{code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(b), err: err}
}

// TestSIGTERMAnswersHeldRequests: requests held for a tenant that cannot start within the shutdown
// grace each get 503 with Retry-After when the grace is nearly over, never a closed connection, and the
// activator exits within the grace.
func TestSIGTERMAnswersHeldRequests(t *testing.T) {
	t.Parallel()
	const (
		n     = 50
		grace = 2 * time.Second
	)
	app := appRoute{Name: "sluggish", WakeBudget: "10m", HoldMaxTime: "10m",
		Env: map[string]string{"DEMOAPP_START_DELAY": "1h"}} // never listens
	s := startServed(t, fmt.Sprintf("shutdown_grace: %v\n", grace)+configYAML(t, app))

	ctx, cancel := context.WithTimeout(context.Background(), 3*patience)
	defer cancel()
	answers := make(chan clientAnswer, n)
	for range n {
		go func() { answers <- getFresh(ctx, s.edge, app.host(), "/") }()
	}
	s.waitStatus(app.Name, fmt.Sprintf("holding %d requests", n), func(st activator.Status) bool { return st.Held == n })
	pids := s.logs.spawns(app.Name)

	sent := s.sigterm()
	for i := range n {
		a := <-answers
		switch {
		case a.err != nil:
			t.Errorf("held request %d: %v, want 503 with Retry-After", i, a.err)
		case a.code != http.StatusServiceUnavailable || a.retryAfter == "":
			t.Errorf("held request %d: %d (Retry-After %q) %q, want 503 with Retry-After", i, a.code, a.retryAfter, a.body)
		}
	}
	answered := time.Since(sent)
	took := s.wait().Sub(sent)
	t.Logf("%d held requests answered %v after SIGTERM; exited after %v (shutdown_grace %v)", n, answered, took, grace)
	if took > grace+time.Second {
		t.Errorf("exited %v after SIGTERM, want within shutdown_grace %v (and a second for the process to go)", took, grace)
	}
	for _, pid := range pids {
		waitGone(t, pid)
	}
}

// TestSIGHUPDuringShutdown: a SIGHUP that comes while the shutdown runs (a `systemctl reload` or a
// logrotate hook racing a restart) changes nothing: the held request still gets its 503 with
// Retry-After and the activator exits 0. Found by an operator trial: closing the reload triggers gave
// SIGHUP back its default action, and the process ended there (exit 129), the request cut off.
func TestSIGHUPDuringShutdown(t *testing.T) {
	t.Parallel()
	app := appRoute{Name: "sluggish", WakeBudget: "10m", HoldMaxTime: "10m",
		Env: map[string]string{"DEMOAPP_START_DELAY": "1h"}} // never listens
	s := startServed(t, "shutdown_grace: 2s\n"+configYAML(t, app))
	ctx, cancel := context.WithTimeout(context.Background(), 3*patience)
	defer cancel()
	answer := make(chan clientAnswer, 1)
	go func() { answer <- getFresh(ctx, s.edge, app.host(), "/") }()
	s.waitStatus(app.Name, "holding a request", func(st activator.Status) bool { return st.Held == 1 })

	s.sigterm()
	s.waitLogged("reloads stopped for the shutdown", 1)
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatalf("SIGHUP: %v", err)
	}
	if a := <-answer; a.err != nil || a.code != http.StatusServiceUnavailable || a.retryAfter == "" {
		t.Errorf("held request: %d (Retry-After %q) %q, %v; want 503 with Retry-After", a.code, a.retryAfter, a.body, a.err)
	}
	s.wait()
}

// TestSIGTERMDrainsInFlight: a request in flight when SIGTERM arrives completes, longer than the 30 s
// the shutdown once had but within shutdown_grace, and only then is the tenant stopped.
func TestSIGTERMDrainsInFlight(t *testing.T) {
	t.Parallel()
	const (
		grace = 40 * time.Second
		slow  = 31 * time.Second
	)
	app := appRoute{Name: "longpoll"}
	s := startServed(t, fmt.Sprintf("shutdown_grace: %v\n", grace)+configYAML(t, app))
	ctx, cancel := context.WithTimeout(context.Background(), grace+patience)
	defer cancel()
	if a := getFresh(ctx, s.edge, app.host(), "/"); a.err != nil || a.code != http.StatusOK {
		t.Fatalf("waking request: %d %v", a.code, a.err)
	}
	done := make(chan clientAnswer, 1)
	go func() { done <- getFresh(ctx, s.edge, app.host(), "/slow?d="+slow.String()) }()
	s.waitStatus(app.Name, "with the slow request in flight", func(st activator.Status) bool { return st.InFlight == 1 })

	sent := s.sigterm()
	a := <-done
	if a.err != nil || a.code != http.StatusOK || a.body != "slow done\n" {
		t.Fatalf("in-flight request: %d %q %v, want 200 \"slow done\"", a.code, a.body, a.err)
	}
	completed := time.Since(sent)
	took := s.wait().Sub(sent)
	t.Logf("in-flight request completed %v after SIGTERM; exited after %v (shutdown_grace %v)", completed, took, grace)
	if took > grace {
		t.Errorf("exited %v after SIGTERM, longer than shutdown_grace %v", took, grace)
	}
	if got := s.logs.matching("shutdown grace over: closing the connections of requests still in flight"); len(got) > 0 {
		t.Errorf("connections were cut: %v", got)
	}
}

// stopScript is an exec tenant that reports how it was stopped: it runs the demo app and, on SIGINT
// (its route's stop_signal), notes the signal, takes a second to shut down (well inside its
// stop_grace) and notes a clean exit. SIGKILL, from the stop grace running out or the parent-death
// signal of an activator that exited under it, leaves the second line out.
const stopScript = `trap 'echo "stop signal INT" >> "$MARKER"; sleep 1; wait "$app"; echo "exited cleanly" >> "$MARKER"; exit 0' INT
"$DEMOAPP_BIN" &
app=$!
wait "$app"
`

// TestSIGTERMStopsTenantsWithTheirSignal: on SIGTERM, an exec tenant is stopped with its own
// stop_signal and given its stop_grace, inside the shutdown grace, even while another route holds
// requests for a tenant that will not start in time; it is not killed by the parent-death signal of an
// activator that exits under it.
func TestSIGTERMStopsTenantsWithTheirSignal(t *testing.T) {
	t.Parallel()
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh to run the tenant script")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	script, marker := filepath.Join(dir, "tenant.sh"), filepath.Join(dir, "stopped")
	if err := os.WriteFile(script, []byte(stopScript), 0o755); err != nil {
		t.Fatal(err)
	}
	const grace = 3 * time.Second
	held := appRoute{Name: "sluggish", WakeBudget: "10m", HoldMaxTime: "10m", Env: map[string]string{"DEMOAPP_START_DELAY": "1h"}}
	trap := fmt.Sprintf(`  - name: trap
    hosts: [trap.test]
    backing: exec
    upstream: %q
    health: {path: /healthz, interval: 50ms}
    exec:
      argv: [%q, %q]
      stop_signal: INT
      stop_grace: 10s
      env: {%s: "1", DEMOAPP_BIN: %q, MARKER: %q}
`, freeLoopbackAddr(t), sh, script, demoapp.ChildEnv, self, marker)
	s := startServed(t, fmt.Sprintf("shutdown_grace: %v\n", grace)+configYAML(t, held)+trap)

	ctx, cancel := context.WithTimeout(context.Background(), 3*patience)
	defer cancel()
	if a := getFresh(ctx, s.edge, "trap.test", "/"); a.err != nil || a.code != http.StatusOK {
		t.Fatalf("waking the trap tenant: %d %q %v", a.code, a.body, a.err)
	}
	pids := s.logs.spawns("trap")
	if len(pids) != 1 {
		t.Fatalf("trap tenant spawns %v, want 1", pids)
	}
	// The script's process group: its demo app too, should the script be killed before it stops it.
	t.Cleanup(func() { _ = syscall.Kill(-pids[0], syscall.SIGKILL) })
	answers := make(chan clientAnswer, 1)
	go func() { answers <- getFresh(ctx, s.edge, held.host(), "/") }()
	s.waitStatus(held.Name, "holding a request", func(st activator.Status) bool { return st.Held == 1 })

	sent := s.sigterm()
	if a := <-answers; a.err != nil || a.code != http.StatusServiceUnavailable {
		t.Errorf("held request: %d %v, want 503", a.code, a.err)
	}
	took := s.wait().Sub(sent)
	waitGone(t, pids[0])
	got, err := os.ReadFile(marker)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if want := "stop signal INT\nexited cleanly\n"; string(got) != want {
		t.Errorf("the tenant noted %q, want %q: its stop signal, then a clean exit within its stop_grace", got, want)
	}
	if k := s.logs.matching("still running after the stop grace, killing"); len(k) > 0 {
		t.Errorf("the tenant was killed: %v", k)
	}
	t.Logf("exited %v after SIGTERM (shutdown_grace %v); the tenant noted %q", took, grace, got)
	if took > grace+time.Second {
		t.Errorf("exited %v after SIGTERM, want within shutdown_grace %v", took, grace)
	}
}

// jsonLog keeps the JSON log records of an activator process, for waiting on events and counting
// spawns.
type jsonLog struct {
	mu      sync.Mutex // guards the fields below
	recs    []map[string]any
	raw     []string
	changed chan struct{} // closed and replaced on every new line
}

func newJSONLog() *jsonLog { return &jsonLog{changed: make(chan struct{})} }

// read reads records from r until it ends.
func (l *jsonLog) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var rec map[string]any
		_ = json.Unmarshal([]byte(line), &rec) // a non-JSON line (a panic, the race detector) is kept raw
		l.mu.Lock()
		l.raw = append(l.raw, line)
		if rec != nil {
			l.recs = append(l.recs, rec)
		}
		close(l.changed)
		l.changed = make(chan struct{})
		l.mu.Unlock()
	}
}

// matching returns the records whose msg is msg.
func (l *jsonLog) matching(msg string) []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, r := range l.recs {
		if r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
}

// spawns lists the pids the exec backing spawned for route, in order.
func (l *jsonLog) spawns(route string) []int {
	var pids []int
	for _, r := range l.matching("spawned") {
		if r["route"] == route {
			if pid, ok := r["pid"].(float64); ok {
				pids = append(pids, int(pid))
			}
		}
	}
	return pids
}

// waitFor waits for a record with msg, failing t when exited closes first or after patience.
func (l *jsonLog) waitFor(t testing.TB, exited <-chan struct{}, msg string) {
	t.Helper()
	deadline := time.NewTimer(patience)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		changed := l.changed
		l.mu.Unlock()
		if len(l.matching(msg)) > 0 {
			return
		}
		select {
		case <-changed:
		case <-exited:
			if len(l.matching(msg)) == 0 {
				t.Fatalf("the activator exited before logging %q", msg)
			}
			return
		case <-deadline.C:
			t.Fatalf("no %q in the activator's log within %v", msg, patience)
		}
	}
}

func (l *jsonLog) dump(t testing.TB) {
	l.mu.Lock()
	defer l.mu.Unlock()
	raw := l.raw
	if len(raw) > 300 {
		raw = raw[len(raw)-300:]
	}
	for _, line := range raw {
		t.Logf("activator: %s", strings.TrimSpace(line))
	}
}
