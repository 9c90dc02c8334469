package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/testenv"
)

// hog is a connection left open and idle after one answered request, as a keep-alive client leaves
// it.
type hog struct {
	c  net.Conn
	br *bufio.Reader
}

// openHogs opens n hogs to addr one after another, each sending request and reading its answer
// before the next connects, and fails t, naming what, when one gets no answer.
func openHogs(t *testing.T, addr, request, what string, n int) []*hog {
	t.Helper()
	hs := make([]*hog, n)
	for i := range hs {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("%s %d: %v", what, i, err)
		}
		t.Cleanup(func() { c.Close() })
		hs[i] = &hog{c: c, br: bufio.NewReader(c)}
		if err := hs[i].ask(request); err != nil {
			t.Fatalf("%s %d of %d got no answer (%v): the listener no longer takes connections", what, i, n, err)
		}
	}
	return hs
}

// ask sends request on h and reads its answer within patience.
func (h *hog) ask(request string) error {
	_ = h.c.SetDeadline(time.Now().Add(patience))
	if _, err := io.WriteString(h.c, request); err != nil {
		return err
	}
	resp, err := http.ReadResponse(h.br, nil)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// closedByActivator reports whether the activator closed h: a read ends in EOF or a reset, not in the
// deadline (which only stops a failing test from hanging).
func (h *hog) closedByActivator() bool {
	_ = h.c.SetReadDeadline(time.Now().Add(patience))
	_, err := h.br.ReadByte()
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// underFileLimit is a startServedAt tweak that runs the activator with an open-file limit of n, soft
// and hard, from its first instruction (through util-linux's prlimit, which execs it), so that the
// limit the activator reads at start is n.
func underFileLimit(t *testing.T, n int) func(*exec.Cmd) {
	t.Helper()
	path, err := exec.LookPath("prlimit")
	if err != nil {
		testenv.Missing(t, "prlimit not installed (apt-get install -y util-linux)")
	}
	return func(c *exec.Cmd) {
		c.Args = append([]string{"prlimit", fmt.Sprintf("--nofile=%d:%d", n, n), "--", c.Path}, c.Args[1:]...)
		c.Path = path
	}
}

// scrape returns the value of each series of the admin API's /metrics whose line starts with one of
// names (a metric name with its labels, as the text format writes them); a series missing fails t.
func scrape(t *testing.T, admin string, names ...string) map[string]float64 {
	t.Helper()
	body := metricsText(t, admin)
	got := map[string]float64{}
	for line := range strings.Lines(body) {
		for _, n := range names {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), n+" "); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatalf("scrape: %q: %v", line, err)
				}
				got[n] = f
			}
		}
	}
	for _, n := range names {
		if _, ok := got[n]; !ok {
			t.Fatalf("scrape: no series %s in /metrics", n)
		}
	}
	return got
}

// TestEdgeConnectionCapKeepsWaking: idle edge connections cannot take the file descriptors a wake
// needs. The activator runs under an open-file limit of 200 and leaves edge.max_conns to its default,
// which that limit makes 128 (the limit, less admin_max_conns and a reserve of 64); 200 keep-alive
// connections are opened, each left idle after one answered request, as any client can. Measured on
// the commit before the cap, with the real binary and 19,990 such connections under a limit of 20,000:
// accept4 failed with EMFILE on both listeners, and neither the edge nor the admin API answered
// anything until the connections went (up to keepalive_timeout). Now each connection past the cap
// closes the one idle longest, a cold route still wakes, and the metrics say so.
func TestEdgeConnectionCapKeepsWaking(t *testing.T) {
	const limit, wantCap, hogs = 200, 128, 200
	app := appRoute{Name: "capped"}
	s := startServedAt(t, freeLoopbackAddr(t), freeLoopbackAddr(t), "admin_max_conns: 8\n"+configYAML(t, app), underFileLimit(t, limit))
	if got := scrape(t, s.admin, `activator_connections_max{listener="edge"}`)[`activator_connections_max{listener="edge"}`]; got != wantCap {
		t.Fatalf("edge cap under an open-file limit of %d: %v, want %d", limit, got, wantCap)
	}
	hs := openHogs(t, s.edge, "GET / HTTP/1.1\r\nHost: nosuch.test\r\n\r\n", "edge connection", hogs)
	getOK(t, s.edge, app.host(), "a cold wake with the edge at its cap") // the spawn needs descriptors too
	s.waitLogged(edgeCapMsg, 1)

	m := scrape(t, s.admin, `activator_connections{listener="edge"}`, `activator_connections_closed_for_room_total{listener="edge"}`)
	if open := m[`activator_connections{listener="edge"}`]; open > wantCap {
		t.Errorf("%v edge connections open, over the cap of %d", open, wantCap)
	}
	if closed := m[`activator_connections_closed_for_room_total{listener="edge"}`]; closed < hogs+1-wantCap {
		t.Errorf("%v edge connections closed for room, want at least %d", closed, hogs+1-wantCap)
	}
	// The oldest hogs were closed; the newest are open, and answer a second request without closing
	// another (no connection is new).
	if !hs[0].closedByActivator() {
		t.Error("the connection idle longest was not closed")
	}
	for i := hogs - wantCap/2; i < hogs; i++ {
		if err := hs[i].ask("GET / HTTP/1.1\r\nHost: nosuch.test\r\n\r\n"); err != nil {
			t.Fatalf("edge connection %d, among the newest: %v", i, err)
		}
	}
	if fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", s.cmd.Process.Pid)); err == nil && len(fds) >= limit {
		t.Errorf("the activator has %d files open, at its limit of %d", len(fds), limit)
	}
}

// TestEdgeConnCap: the default edge cap is what the open-file limit leaves after admin_max_conns and
// an eighth of the limit (at least 64); a cap set that leaves the rest less than 64 is kept, with a
// warning naming the key.
func TestEdgeConnCap(t *testing.T) {
	for _, tc := range []struct {
		name            string
		maxConns, admin int
		nofile          uint64
		want            int
		warn            string // a part of the warning; "" for none
	}{
		{"default, a limit of 20000", 0, 128, 20000, 17372, ""},
		{"default, the shipped unit's 65536", 0, 128, 65536, 57216, ""},
		{"default, a low limit: the reserve's floor", 0, 8, 200, 128, ""},
		{"default, a limit below what the rest needs", 0, 128, 100, minEdgeConns, ""},
		{"set, with room", 1000, 128, 20000, 1000, ""},
		{"set, leaving too little", 19900, 128, 20000, 19900, "edge.max_conns 19900 with admin_max_conns 128 leaves fewer than 64 of the open-file limit 20000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &registry.Config{Edge: registry.EdgeLimits{MaxConns: tc.maxConns}, AdminAccess: registry.AdminAccess{MaxConns: tc.admin}}
			got, warn := edgeConnCap(cfg, tc.nofile)
			if got != tc.want {
				t.Errorf("cap %d, want %d", got, tc.want)
			}
			if (tc.warn == "") != (warn == "") || !strings.Contains(warn, tc.warn) {
				t.Errorf("warning %q, want one containing %q", warn, tc.warn)
			}
		})
	}
}

// TestEdgeCapKeepsAHerd: a herd larger than edge.max_conns loses no request: the requests past the
// cap wait, accepted and unserved, and are answered as the herd's first answers free connections.
// Measured with the harness's held-memory herd on f411858 (go run ./bench, 18,976 connections a
// request each, the default cap of 17,372 under a limit of 20,000): 17,372 held, and 13,866 of the
// 18,976 failed with a reset. Here, on that build, 40 of 368 failed, every one closed for room: at the
// cap, each new connection closed one accepted before it whose request net/http had not read yet, which
// the cap took for a silent client. (A parked request's connection, handed back through the resume
// server, looked as new as that too.) The activator runs under an open-file limit of 400 (a default cap
// of 328) and a route whose start waits for the test gets 40 requests more than the cap, each on its
// own connection; once the cap's connections are all held the start goes on, and every request must
// be answered 200 by the one spawn.
func TestEdgeCapKeepsAHerd(t *testing.T) {
	const limit, wantCap, extra = 400, 328, 40
	hold := t.TempDir() + "/hold"
	app := appRoute{Name: "herd", Env: map[string]string{"DEMOAPP_HOLD_FILE": hold}}
	// 16 upstream connections at once, so that the release's dials fit in the reserve the cap leaves.
	cfg := strings.Replace(configYAML(t, app), "    idle:", "    max_upstream_conns: 16\n    idle:", 1)
	s := startServedAt(t, freeLoopbackAddr(t), freeLoopbackAddr(t), "admin_max_conns: 8\n"+cfg, underFileLimit(t, limit))
	wantEdgeCap(t, s, limit, wantCap)
	pids := map[string]int{}
	var failed []string
	for _, a := range heldHerd(t, s, app, hold, "/pid", wantCap+extra, wantCap) {
		switch {
		case a.err != nil:
			failed = append(failed, a.err.Error())
		case a.code != http.StatusOK:
			failed = append(failed, fmt.Sprintf("status %d", a.code))
		default:
			pids[a.body]++
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d requests failed; the first: %s", len(failed), wantCap+extra, failed[0])
	}
	if len(pids) != 1 {
		t.Errorf("answered by %d processes (%v), want one spawn", len(pids), pids)
	}
}

// TestUpstreamOutOfFiles: a request whose upstream connection cannot be opened because the activator
// is out of file descriptors is answered 503 with Retry-After, as the edge answers when it is full:
// the tenant did nothing wrong, and the request may succeed in a second. Measured on 09fcd3f with a herd
// at the edge's cap under a 400-file limit: upstream dials failed with "socket: too many open files"
// and their requests got 502, as if the tenant had broken the exchange. Here the cap's 328 requests are
// held, then released on a route allowed 256 upstream connections, each answer taking 300ms, so that
// 328 edge and 256 upstream connections need more than the limit.
func TestUpstreamOutOfFiles(t *testing.T) {
	const limit, wantCap = 400, 328
	hold := t.TempDir() + "/hold"
	app := appRoute{Name: "herd", Env: map[string]string{"DEMOAPP_HOLD_FILE": hold}}
	s := startServedAt(t, freeLoopbackAddr(t), freeLoopbackAddr(t), "admin_max_conns: 8\n"+configYAML(t, app), underFileLimit(t, limit))
	wantEdgeCap(t, s, limit, wantCap)
	codes := map[int]int{}
	for _, a := range heldHerd(t, s, app, hold, "/slow?d=300ms", wantCap, wantCap) {
		if a.err != nil {
			t.Fatalf("a request got no answer: %v", a.err)
		}
		codes[a.code]++
		if a.code == http.StatusServiceUnavailable && a.retryAfter == "" {
			t.Errorf("503 without Retry-After: %s", a.body)
		}
	}
	if codes[http.StatusServiceUnavailable] == 0 || codes[http.StatusOK]+codes[http.StatusServiceUnavailable] != wantCap {
		t.Errorf("answers by status: %v; want 200s and, for the upstream connections past the limit, 503s, and nothing else", codes)
	}
	s.waitLogged("the activator is out of file descriptors", 1)
}

// wantEdgeCap fails t unless s's edge cap is want, under an open-file limit of limit.
func wantEdgeCap(t *testing.T, s *served, limit, want int) {
	t.Helper()
	const series = `activator_connections_max{listener="edge"}`
	if got := scrape(t, s.admin, series)[series]; got != float64(want) {
		t.Fatalf("edge cap under an open-file limit of %d: %v, want %d", limit, got, want)
	}
}

// herdAnswer is one answer heldHerd got.
type herdAnswer struct {
	code       int
	retryAfter string
	body       string // trimmed
	err        error
}

// heldHerd sends n GETs of path to app, each on a connection of its own, while app's start waits for
// hold (DEMOAPP_HOLD_FILE, made here): once the route holds held of them, it lets the start go on,
// and returns every answer.
func heldHerd(t *testing.T, s *served, app appRoute, hold, path string, n, held int) []herdAnswer {
	t.Helper()
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	answers := make(chan herdAnswer, n)
	for range n {
		go func() {
			c, err := net.Dial("tcp", s.edge)
			if err != nil {
				answers <- herdAnswer{err: err}
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(patience))
			if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: "+app.host()+"\r\n\r\n"); err != nil {
				answers <- herdAnswer{err: err}
				return
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				answers <- herdAnswer{err: err}
				return
			}
			body, err := io.ReadAll(resp.Body)
			answers <- herdAnswer{code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: strings.TrimSpace(string(body)), err: err}
		}()
	}
	s.waitStatus(app.Name, fmt.Sprintf("holding %d requests", held), func(st activator.Status) bool { return st.Held >= held })
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	out := make([]herdAnswer, n)
	for i := range out {
		out[i] = <-answers
	}
	return out
}
