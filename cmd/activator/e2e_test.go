package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/tenant"
	"github.com/activator/activator/internal/testenv"
)

// TestHerdWakesOnce: 200 concurrent requests to a sleeping route cause exactly one spawn, and every one
// of them is answered by that one child, request bodies intact.
func TestHerdWakesOnce(t *testing.T) {
	const n = 200
	// The start delay keeps the wake open long enough for the herd to pile up behind it; the test's
	// assertions hold however many of them actually joined.
	app := appRoute{Name: "herd", Env: map[string]string{
		"DEMOAPP_START_DELAY": "300ms", "DEMOAPP_BODY": "hello herd",
	}}
	h := newHarness(t, configYAML(t, app))

	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	type result struct {
		kind int
		sent []byte
		r    reply
		err  error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := &results[i]
			res.kind = i % 3
			var req *http.Request
			switch res.kind {
			case 0:
				req = h.request(ctx, http.MethodGet, app.host(), "/", nil)
			case 1:
				res.sent = make([]byte, 64<<10)
				_, _ = rand.Read(res.sent)
				req = h.request(ctx, http.MethodPost, app.host(), "/echo", bytes.NewReader(res.sent))
				req.Header.Set("Content-Type", "application/octet-stream")
			case 2:
				req = h.request(ctx, http.MethodGet, app.host(), "/pid", nil)
			}
			res.r, res.err = h.do(req)
		}()
	}
	wg.Wait()

	spawns := h.spawns(app.Name)
	if len(spawns) != 1 {
		t.Fatalf("spawns = %v, want exactly one", spawns)
	}
	wantPID := strconv.Itoa(spawns[0])
	for i, res := range results {
		if res.err != nil {
			t.Errorf("request %d: %v", i, res.err)
			continue
		}
		if res.r.code != http.StatusOK {
			t.Errorf("request %d: status %d, want 200; body %q", i, res.r.code, res.r.body)
			continue
		}
		switch res.kind {
		case 0:
			if res.r.body != "hello herd\n" {
				t.Errorf("request %d: GET / body %q, want %q", i, res.r.body, "hello herd\n")
			}
		case 1:
			if res.r.body != string(res.sent) {
				t.Errorf("request %d: POST /echo returned %d bytes that differ from the %d sent", i, len(res.r.body), len(res.sent))
			}
		case 2:
			if got := strings.TrimSpace(res.r.body); got != wantPID {
				t.Errorf("request %d: served by pid %s, want the one spawned child %s", i, got, wantPID)
			}
		}
	}
	st := h.status(app.Name)
	if st.State != "awake" || st.LastWake == nil || st.LastWake.Result != activator.ResultOK {
		t.Fatalf("after the herd: %+v, want awake after an ok wake", st)
	}
	t.Logf("one wake of %v served %d requests; %d joined the wake in progress", st.LastWake.Duration, n, st.LastWake.Joined)
}

// TestChildExitsBeforeHealthy: a child that dies before it listens fails every held request with 503
// naming the exit code and quoting its stderr (the route has detailed_errors); during the backoff a request gets 503 at once with
// Retry-After set to the time left; after the backoff the next request wakes the app again.
func TestChildExitsBeforeHealthy(t *testing.T) {
	const msg = "boom: cannot open /var/lib/app/db"
	app := appRoute{
		Name:           "crashy",
		BackoffInitial: "3s", BackoffMax: "3s",
		DetailedErrors: true,
		// The start delay lets the held requests pile up behind the wake; a request that arrives after
		// the failure gets the backoff's answer, which must carry the same cause.
		Env: map[string]string{"DEMOAPP_EXIT_CODE": "3", "DEMOAPP_EXIT_MESSAGE": msg, "DEMOAPP_START_DELAY": "200ms"},
	}
	h := newHarness(t, configYAML(t, app))

	checkFailure := func(what string, r reply) {
		t.Helper()
		if r.code != http.StatusServiceUnavailable {
			t.Errorf("%s: status %d, want 503; body %q", what, r.code, r.body)
		}
		for _, want := range []string{"exited with code 3", msg} {
			if !strings.Contains(r.body, want) {
				t.Errorf("%s: body %q does not contain %q", what, r.body, want)
			}
		}
		if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 {
			t.Errorf("%s: Retry-After %q, want a positive number of seconds", what, r.header.Get("Retry-After"))
		}
	}

	// Held requests share the failed wake.
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	const held = 8
	replies := make([]reply, held)
	errs := make([]error, held)
	var wg sync.WaitGroup
	for i := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i], errs[i] = h.do(h.request(ctx, http.MethodGet, app.host(), "/", nil))
		}()
	}
	wg.Wait()
	sharedWake := 0
	for i := range held {
		if errs[i] != nil {
			t.Fatalf("held request %d: %v", i, errs[i])
		}
		checkFailure(fmt.Sprintf("held request %d", i), replies[i])
		switch body := replies[i].body; {
		case strings.Contains(body, "wake failed in phase health"):
			sharedWake++
		case !strings.Contains(body, "next attempt in"):
			t.Errorf("held request %d: body %q names neither the failed phase nor the backoff", i, body)
		}
	}
	if sharedWake == 0 {
		t.Errorf("no request saw the wake fail (all %d came after it): want the phase named", held)
	}
	if got := len(h.spawns(app.Name)); got != 1 {
		t.Fatalf("spawns after the first failure = %d, want 1", got)
	}

	// During the backoff: refused at once, Retry-After is the time left, nothing spawned.
	st := h.status(app.Name)
	if st.State != "failed" || st.RetryAt == nil {
		t.Fatalf("after the failed wake: state %q retry_at %v, want failed with a retry time", st.State, st.RetryAt)
	}
	left := time.Until(*st.RetryAt)
	r := h.get(app.host(), "/")
	checkFailure("request during the backoff", r)
	if got := len(h.spawns(app.Name)); got != 1 {
		t.Fatalf("a request during the backoff spawned a child (spawns = %d)", got)
	}
	if left > 0 {
		ra, _ := strconv.Atoi(r.header.Get("Retry-After"))
		if most := int(math.Ceil(left.Seconds())); ra > most {
			t.Errorf("Retry-After %d s, but only %v of the backoff was left", ra, left)
		}
		if !strings.Contains(r.body, "next attempt in") {
			t.Errorf("body %q does not say when the next attempt is", r.body)
		}
	}

	// After the backoff: the next request wakes the app again (and fails again, the same way).
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(patience)
	defer deadline.Stop()
	for time.Now().Before(*st.RetryAt) {
		select {
		case <-tick.C:
			st = h.status(app.Name)
			if st.RetryAt == nil {
				t.Fatalf("retry_at vanished while failed: %+v", st)
			}
		case <-deadline.C:
			t.Fatalf("backoff did not pass within %v (retry_at %v)", patience, st.RetryAt)
		}
	}
	// retry_at is the activator's wall clock; its backoff runs on the monotonic one, and the two can
	// disagree by a little (seen in CI: a request just past retry_at refused by the backoff). A refusal
	// within clockSlack of retry_at is taken as that and the request sent again at the next tick.
	const clockSlack = time.Second
	for {
		r = h.get(app.host(), "/")
		if !strings.Contains(r.body, "next attempt in") {
			break
		}
		if late := time.Since(*st.RetryAt); late > clockSlack {
			t.Fatalf("a request %v after retry_at was refused by the backoff instead of waking: %q", late, r.body)
		}
		<-tick.C
	}
	checkFailure("first request after the backoff", r)
	if got := len(h.spawns(app.Name)); got != 2 {
		t.Fatalf("spawns after the backoff = %d, want 2 (the request must wake the app again)", got)
	}
}

// TestNeverHealthy: a child that runs but never passes the health gate fails the wake after the wake
// budget with 503 (quoting the gate's last probe: the route has detailed_errors), and is killed: no
// process is left. The budget leaves a loaded CI machine (race
// detector, packages testing in parallel) ample time to start the child, whose 503 the error must
// quote: a child still not listening when the budget ends would leave "connection refused" instead.
func TestNeverHealthy(t *testing.T) {
	app := appRoute{
		Name: "sick", WakeBudget: "3s",
		Env:            map[string]string{"DEMOAPP_UNHEALTHY": "1"},
		DetailedErrors: true,
	}
	h := newHarness(t, configYAML(t, app))
	r := h.get(app.host(), "/")
	if r.code != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503; body %q", r.code, r.body)
	}
	for _, want := range []string{"phase health", "health gate did not pass", "status 503"} {
		if !strings.Contains(r.body, want) {
			t.Errorf("body %q does not contain %q", r.body, want)
		}
	}
	spawns := h.spawns(app.Name)
	if len(spawns) != 1 {
		t.Fatalf("spawns = %v, want 1", spawns)
	}
	waitGone(t, spawns[0])
	st := h.status(app.Name)
	if st.State != "failed" || st.LastWake == nil || st.LastWake.FailedPhase != tenant.PhaseHealth {
		t.Fatalf("status after the failure: %+v, want failed in phase health", st)
	}
	if ph := st.LastWake.Phases; len(ph) == 0 || ph[len(ph)-1].Name != tenant.PhaseStop {
		t.Errorf("phases %+v, want the unhealthy child's stop as the last phase", ph)
	}
}

// TestIdleSleep: after the idle window with nothing in flight the child is stopped; the next request
// wakes a new one.
func TestIdleSleep(t *testing.T) {
	app := appRoute{Name: "dozy", Idle: "200ms"}
	h := newHarness(t, configYAML(t, app))
	first := h.get(app.host(), "/pid")
	if first.code != http.StatusOK {
		t.Fatalf("first request: %d %q", first.code, first.body)
	}
	st := h.waitStatus(app.Name, "asleep after the idle window", func(s activator.Status) bool { return s.State == "asleep" })
	if st.LastSleep != activator.ReasonIdle {
		t.Errorf("last sleep reason %q, want %q", st.LastSleep, activator.ReasonIdle)
	}
	pid1, _ := strconv.Atoi(strings.TrimSpace(first.body))
	waitGone(t, pid1)

	second := h.get(app.host(), "/pid")
	if second.code != http.StatusOK {
		t.Fatalf("request after the sleep: %d %q", second.code, second.body)
	}
	if second.body == first.body {
		t.Errorf("the request after the sleep was served by the old pid %s", strings.TrimSpace(first.body))
	}
	if got := len(h.spawns(app.Name)); got != 2 {
		t.Errorf("spawns = %d, want 2", got)
	}
}

// TestRequestDuringStop: a request that arrives while the idle stop is in progress is held until the
// child is gone, then answered by a fresh child. The child ignores SIGTERM and the stop grace is long,
// so the stop lasts until the test ends it with SIGINT, after seeing the request held.
func TestRequestDuringStop(t *testing.T) {
	app := appRoute{Name: "stubborn", Idle: "100ms", StopGrace: "1m", Env: map[string]string{"DEMOAPP_IGNORE_TERM": "1"}}
	h := newHarness(t, configYAML(t, app))
	first := h.get(app.host(), "/pid")
	if first.code != http.StatusOK {
		t.Fatalf("first request: %d %q", first.code, first.body)
	}
	pid1, _ := strconv.Atoi(strings.TrimSpace(first.body))
	h.waitStatus(app.Name, "stopping", func(s activator.Status) bool { return s.State == "stopping" })

	type result struct {
		r   reply
		err error
	}
	done := make(chan result, 1)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	go func() {
		r, err := h.do(h.request(ctx, http.MethodGet, app.host(), "/pid", nil))
		done <- result{r, err}
	}()
	h.waitStatus(app.Name, "holding the request during the stop", func(s activator.Status) bool {
		if s.State != "stopping" {
			t.Fatalf("the stop ended before the test ended it: %+v", s)
		}
		return s.Held == 1
	})
	// End the stop the way an operator would (the child still honours SIGINT).
	if err := syscall.Kill(pid1, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.r.code != http.StatusOK {
		t.Fatalf("request held during the stop: %d %q, want 200", res.r.code, res.r.body)
	}
	if res.r.body == first.body {
		t.Errorf("answered by the stopping child %d, want a fresh one", pid1)
	}
	if spawns := h.spawns(app.Name); len(spawns) != 2 {
		t.Errorf("spawns = %v, want 2", spawns)
	}
	waitGone(t, pid1)
	// The fresh child ignores SIGTERM too: end it now rather than make shutdown wait out its grace.
	if pid2, err := strconv.Atoi(strings.TrimSpace(res.r.body)); err == nil {
		_ = syscall.Kill(pid2, syscall.SIGINT)
		waitGone(t, pid2)
	}
}

// dialEcho opens a WebSocket through the edge to app's /ws (the demo app's echo), closed when t ends,
// and returns it with echo, which sends msg and fails t unless msg comes back.
func dialEcho(ctx context.Context, t *testing.T, h *harness, app appRoute) (*websocket.Conn, func(msg string)) {
	t.Helper()
	c, _, err := websocket.Dial(ctx, "ws://"+h.edgeAddr+"/ws", &websocket.DialOptions{Host: app.host()})
	if err != nil {
		t.Fatalf("websocket dial through the edge: %v", err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c, func(msg string) {
		t.Helper()
		if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatalf("write: %v", err)
		}
		_, got, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if string(got) != msg {
			t.Fatalf("echo %q, want %q", got, msg)
		}
	}
}

// TestWebSocketKeepsAwake: an open WebSocket is a request in flight: the route stays awake past the
// idle window until the socket closes, then sleeps.
func TestWebSocketKeepsAwake(t *testing.T) {
	const idle = 150 * time.Millisecond
	app := appRoute{Name: "chatty", Idle: idle.String()}
	h := newHarness(t, configYAML(t, app))
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	c, echo := dialEcho(ctx, t, h, app)
	echo("hello")

	// Watch the route across several idle windows: it must stay awake with the socket in flight.
	window := time.NewTimer(4 * idle)
	defer window.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for watching := true; watching; {
		st := h.status(app.Name)
		if st.State != "awake" || st.InFlight != 1 {
			t.Fatalf("with a WebSocket open: state %s, in flight %d; want awake with 1", st.State, st.InFlight)
		}
		select {
		case <-tick.C:
		case <-window.C:
			watching = false
		}
	}
	echo("still there")
	if err := c.Close(websocket.StatusNormalClosure, "bye"); err != nil {
		t.Fatalf("close: %v", err)
	}
	st := h.waitStatus(app.Name, "asleep after the socket closed", func(s activator.Status) bool { return s.State == "asleep" })
	if st.LastSleep != activator.ReasonIdle {
		t.Errorf("last sleep reason %q, want idle", st.LastSleep)
	}
	if got := len(h.spawns(app.Name)); got != 1 {
		t.Errorf("spawns = %d, want 1", got)
	}
}

// TestWebSocketAcrossAReload: a WebSocket open when a reload changes its route keeps the route's old
// instance for at most the reload's grace (here half the route's hold.max_time of 4s), then is closed
// as the old tenant stops, and the request waiting for the new instance is served, not answered 504
// at its hold.max_time as it was while the socket could keep the old instance for ever.
func TestWebSocketAcrossAReload(t *testing.T) {
	app := appRoute{Name: "chat", HoldMaxTime: "4s"}
	h := newHarness(t, configYAML(t, app))
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	c, echo := dialEcho(ctx, t, h, app)
	echo("hello")
	closed := make(chan error, 1)
	go func() { _, _, err := c.Read(ctx); closed <- err }()

	changed := app
	changed.Idle = "2h"
	if err := h.srv.Apply(loadConfig(t, h.bk, configYAML(t, changed))); err != nil {
		t.Fatal(err)
	}
	if r := h.get(app.host(), "/"); r.code != http.StatusOK {
		t.Fatalf("GET after the reload: %d %q, want 200 once the grace ended", r.code, r.body)
	}
	if err := <-closed; err == nil {
		t.Error("the WebSocket read a message after the reload's grace, want it closed")
	}
	if got := len(h.spawns(app.Name)); got != 2 {
		t.Errorf("spawns = %d, want 2 (the old tenant, then the new one)", got)
	}
	st := h.status(app.Name)
	if st.LastWake == nil || len(st.LastWake.Phases) == 0 || st.LastWake.Phases[0].Name != "predecessor" {
		t.Errorf("the new instance's wake %+v, want its first phase predecessor", st.LastWake)
	}
	if len(h.rec.matching("requests still in flight when the reload's grace ended: the replaced instance sleeps under them", "", "")) != 1 {
		t.Error("no warning that the grace ended with a request in flight")
	}
}

// TestSSEStreams: server-sent events pass through the edge one by one, not buffered to the end.
func TestSSEStreams(t *testing.T) {
	app := appRoute{Name: "stream"}
	h := newHarness(t, configYAML(t, app))
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()

	// A stream whose second event is an hour away: reading the first proves it was flushed through.
	sctx, scancel := context.WithCancel(ctx)
	resp, err := h.client.Do(h.request(sctx, http.MethodGet, app.host(), "/sse?n=3&every=1h", nil))
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
		t.Fatalf("status %d content type %q, want 200 text/event-stream", resp.StatusCode, ct)
	}
	br := bufio.NewReader(resp.Body)
	if ev := readEvent(t, br); ev != "data: event 0" {
		t.Fatalf("first event %q", ev)
	}
	scancel()
	resp.Body.Close()

	// The whole short stream, in order.
	resp, err = h.client.Do(h.request(ctx, http.MethodGet, app.host(), "/sse?n=3&every=50ms", nil))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br = bufio.NewReader(resp.Body)
	for i := range 3 {
		if ev, want := readEvent(t, br), fmt.Sprintf("data: event %d", i); ev != want {
			t.Fatalf("event %d: %q, want %q", i, ev, want)
		}
	}
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Fatalf("after the last event: %q, %v; want the end of the stream", rest, err)
	}
}

// readEvent reads one server-sent event (its lines up to the blank line), joined by "\n".
func readEvent(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	var lines []string
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading an event: %v (so far %q)", err, lines)
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			return strings.Join(lines, "\n")
		}
		lines = append(lines, line)
	}
}

// TestUnknownHost: a Host no route claims gets 404 and wakes nothing.
func TestUnknownHost(t *testing.T) {
	app := appRoute{Name: "known"}
	h := newHarness(t, configYAML(t, app))
	r := h.get("nobody.test", "/")
	if r.code != http.StatusNotFound {
		t.Fatalf("status %d, want 404; body %q", r.code, r.body)
	}
	if !strings.Contains(r.body, "nobody.test") {
		t.Errorf("body %q does not name the host", r.body)
	}
	if spawns := h.rec.matching("spawned", "", ""); len(spawns) != 0 {
		t.Errorf("an unknown host spawned %d children", len(spawns))
	}
	if st := h.status(app.Name); st.State != "asleep" {
		t.Errorf("route %s is %s, want asleep", app.Name, st.State)
	}
}

// TestReloadRejectsBadConfig drives serve.go's reloader with file changes: a bad config is rejected
// with its problems logged and the old routes keep serving (the awake child untouched); a good one is
// applied.
func TestReloadRejectsBadConfig(t *testing.T) {
	old := appRoute{Name: "steady"}
	good := configYAML(t, old)
	h := newHarness(t, good)
	dir := t.TempDir()
	path := filepath.Join(dir, "activator.yaml")
	writeAtomic := func(content string) {
		t.Helper()
		tmp := filepath.Join(dir, ".activator.yaml.tmp")
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	writeAtomic(good)
	running := loadConfig(t, h.bk, good)

	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	o := serveOptions{configPath: path}
	triggers := watchReloads(h.log, o)
	run := reloader(ctx, h.log, o, h.bk, h.srv, running, triggers)
	go func() { stopped <- run() }()
	t.Cleanup(func() {
		cancel()
		if err := <-stopped; err != nil {
			t.Errorf("reloader: %v", err)
		}
	})

	before := h.get(old.host(), "/pid")
	if before.code != http.StatusOK {
		t.Fatalf("before the reload: %d %q", before.code, before.body)
	}

	// The watch is in place before the reloader runs (watchReloads): one write is seen.
	writeAtomic(strings.Replace(good, "    idle: 10m\n", "    idle: 10m\n    idel: 5m\n", 1) + "  - name: Bad Name\n")
	rejected := h.rec.waitFor(t, 1, "config reload rejected; the old config stays in force", "", "")
	// Each problem is logged after the rejection's own record: wait for as many as it counts.
	n, err := strconv.Atoi(rejected[0].attrs["problems"])
	if err != nil {
		t.Fatalf("the rejection's problems attribute: %v", err)
	}
	problems := h.rec.waitFor(t, n, "config problem", "", "")
	var all []string
	for _, p := range problems {
		all = append(all, p.attrs["err"])
	}
	joined := strings.Join(all, "\n")
	for _, want := range []string{"idel", "Bad Name"} {
		if !strings.Contains(joined, want) {
			t.Errorf("logged problems %q do not mention %q", joined, want)
		}
	}
	after := h.get(old.host(), "/pid")
	if after.code != http.StatusOK || after.body != before.body {
		t.Fatalf("after the rejected reload: %d %q, want 200 from the same child %q", after.code, after.body, before.body)
	}

	// A good config with one more route is applied; the unchanged route keeps its child.
	added := appRoute{Name: "added"}
	writeAtomic(good + added.yaml(t))
	h.rec.waitFor(t, 1, "config reloaded", "", "")
	if r := h.get(added.host(), "/"); r.code != http.StatusOK {
		t.Fatalf("new route after the reload: %d %q", r.code, r.body)
	}
	if r := h.get(old.host(), "/pid"); r.code != http.StatusOK || r.body != before.body {
		t.Fatalf("unchanged route after the reload: %d %q, want its child %q still serving", r.code, r.body, before.body)
	}
	if got := len(h.spawns(old.Name)); got != 1 {
		t.Errorf("unchanged route spawned %d times, want 1", got)
	}
}

// TestNoGoroutineLeaks: after Shutdown nothing the activator, the backings or the edge started is left.
func TestNoGoroutineLeaks(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	app := appRoute{Name: "tidy", Idle: "50ms"}
	h := newHarness(t, configYAML(t, app))
	if r := h.get(app.host(), "/"); r.code != http.StatusOK {
		t.Fatalf("%d %q", r.code, r.body)
	}
	h.waitStatus(app.Name, "asleep", func(s activator.Status) bool { return s.State == "asleep" })
	// Awake again at shutdown, with a WebSocket open: Shutdown must end all of it.
	if r := h.get(app.host(), "/"); r.code != http.StatusOK {
		t.Fatalf("%d %q", r.code, r.body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+h.edgeAddr+"/ws", &websocket.DialOptions{Host: app.host()})
	if err != nil {
		t.Fatal(err)
	}
	c.CloseNow()
	h.shutdown()
	goleak.VerifyNone(t, ignore, goleak.IgnoreTopFunction(testenv.ForkingThreads))
}

// TestUnixSocketUpstream: a tenant listening on a unix socket is woken, gated and proxied.
func TestUnixSocketUpstream(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "app.sock")
	app := appRoute{Name: "unixy", Upstream: "unix:" + sock, Env: map[string]string{"DEMOAPP_BODY": "over a unix socket"}}
	h := newHarness(t, configYAML(t, app))
	r := h.get(app.host(), "/")
	if r.code != http.StatusOK || r.body != "over a unix socket\n" {
		t.Fatalf("got %d %q, want 200 %q", r.code, r.body, "over a unix socket\n")
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("upstream %s is not a socket: %v", sock, err)
	}
}

// TestH2C: the edge serves HTTP/2 cleartext with prior knowledge (edgeProtocols).
func TestH2C(t *testing.T) {
	app := appRoute{Name: "h2"}
	h := newHarness(t, configYAML(t, app))
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	resp, err := (&http.Client{Transport: tr}).Do(h.request(ctx, http.MethodGet, app.host(), "/", nil))
	if err != nil {
		t.Fatalf("h2c request: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.ProtoMajor != 2 {
		t.Errorf("protocol %s, want HTTP/2", resp.Proto)
	}
	if resp.StatusCode != http.StatusOK || string(body) != "hello from demoapp\n" {
		t.Errorf("got %d %q", resp.StatusCode, body)
	}
}
