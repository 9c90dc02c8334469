package activator

// Cases of the edge's behaviour that the event loop's path must keep as net/http's does, each run over
// both paths (bothpaths_test.go): what a failing tenant costs, what a tenant sends unasked, streams,
// upgrades, the hold, the send and header limits.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/testenv"
)

// hits counts a tenant's requests by path.
type hits struct {
	mu sync.Mutex // guards n
	n  map[string]int
}

func (h *hits) add(path string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == nil {
		h.n = map[string]int{}
	}
	h.n[path]++
}

func (h *hits) of(path string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[path]
}

// TestFailingTenantAskedOnce: a tenant that takes a GET and closes its connection without an answer,
// or after half a head, or after the head and part of the body, is sent the request once on a new
// upstream connection, on both paths; the client gets the 502 net/http writes (nothing came it could
// pass on), or, once the head had come, a connection closed without an answer, as net/http aborts it;
// and the route counts each request by the status net/http counts. The loop's path handed each of
// these back to net/http, which sent the request again: a tenant got a request that made it fail
// twice, and the client the second attempt's outcome; a request cut off once its head had come was
// not counted at all.
func TestFailingTenantAskedOnce(t *testing.T) {
	var got hits
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.add(r.URL.Path)
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		defer c.Close()
		switch r.URL.Path {
		case "/half":
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\n")
		case "/cut":
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc")
		}
	}))
	t.Cleanup(up.Close)
	for _, tc := range []struct {
		path string
		code int // the client's answer; 0: the connection closed without one
	}{
		{"/closed", http.StatusBadGateway},
		{"/half", http.StatusBadGateway},
		{"/cut", 0},
	} {
		for _, p := range edgePaths {
			t.Run(p.name+" "+tc.path, func(t *testing.T) {
				reg := prometheus.NewPedanticRegistry()
				m := NewMetrics(reg)
				r := testRoute("app")
				r.Upstream.Address = up.Listener.Addr().String()
				e := newConformEdge(t, conformConfig{routes: []*registry.Route{r}, metrics: m})
				e.wake(t, "app") // with no upstream connection yet
				before := got.of(tc.path)
				rc := e.conn(t, p, "")
				rc.send("GET " + tc.path + " HTTP/1.1\r\nHost: app.test\r\n\r\n")
				resp, body, err := rc.next()
				switch {
				case tc.code == 0 && err == nil:
					t.Errorf("answered %d %q, want the connection closed without an answer", resp.StatusCode, body)
				case tc.code == 0 && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !isReset(err):
					t.Errorf("%v, want the connection closed", err)
				case tc.code != 0 && err != nil:
					t.Errorf("%v, want a %d", err, tc.code)
				case tc.code != 0 && (resp.StatusCode != tc.code || !strings.Contains(body, "connection closed before the answer")):
					t.Errorf("answered %d %q, want %d naming the connection closed before the answer", resp.StatusCode, body, tc.code)
				}
				if n := got.of(tc.path) - before; n != 1 {
					t.Errorf("the tenant got the request %d times, want once", n)
				}
				want := tc.code
				if want == 0 {
					want = http.StatusOK // the answer's, whose head had come
				}
				series := fmt.Sprintf(`activator_requests_total{code="%d"}`, want)
				until(t, func() (bool, string) {
					got := routeSeries(t, m.Gatherer(reg), "app")
					return got[series] == 1, fmt.Sprintf("request series %v, want %s 1", got, series)
				})
			})
		}
	}
}

// unaskedTenant is a tenant that answers /first with "first" and, with /first?same, a second answer
// no request asked for in the same write; after its answer to /first (without ?same) it writes that
// unasked answer when told (evil), and says when it has (wrote). Any other path gets "second".
type unaskedTenant struct {
	addr        string
	evil, wrote chan struct{}
}

const unaskedAnswer = "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL"

func newUnaskedTenant(t *testing.T) *unaskedTenant {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &unaskedTenant{addr: ln.Addr().String(), evil: make(chan struct{}, 1), wrote: make(chan struct{}, 1)}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	var conns sync.Map
	t.Cleanup(func() {
		conns.Range(func(c, _ any) bool { c.(net.Conn).Close(); return true })
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Store(c, nil)
			wg.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					r, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					switch {
					case r.URL.Path == "/first" && r.URL.RawQuery == "same":
						_, err = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst"+unaskedAnswer)
					case r.URL.Path == "/first":
						if _, err = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst"); err != nil {
							return
						}
						select {
						case <-u.evil:
						case <-time.After(patience):
							return
						}
						_, err = io.WriteString(c, unaskedAnswer)
						u.wrote <- struct{}{}
					default:
						_, err = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond")
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	return u
}

// TestUnaskedBytesNeverAnswerAnotherClient: bytes a tenant sends on a kept-alive connection with no
// request pending (a body longer than its Content-Length, in the same write or after it) are never
// read as the next request's answer, on either path; the connection is closed unused, and the route's
// log says so. On the loop's path the next request comes while the loop is held up (loopPause), so
// that the bytes wait unseen in the idle upstream connection's socket, as they do under load until
// the loop reads its events: the loop took that connection for the next request without looking, and
// its client got "EVIL". The fast path asks the kernel first (upstream.Conn.idle); so does the loop
// now.
func TestUnaskedBytesNeverAnswerAnotherClient(t *testing.T) {
	for _, same := range []bool{true, false} {
		for _, p := range edgePaths {
			name := p.name + " after the answer"
			if same {
				name = p.name + " in the answer's write"
			}
			t.Run(name, func(t *testing.T) {
				ten := newUnaskedTenant(t)
				r := testRoute("app")
				r.Upstream.Address = ten.addr
				var logs testenv.SyncBuffer
				e := newConformEdge(t, conformConfig{routes: []*registry.Route{r}, logs: &logs})
				e.wake(t, "app")
				first := "GET /first HTTP/1.1\r\nHost: app.test\r\n\r\n"
				if same {
					first = "GET /first?same HTTP/1.1\r\nHost: app.test\r\n\r\n"
				}
				rc := e.conn(t, p, "")
				rc.send(first)
				if resp, body, err := rc.next(); err != nil || resp.StatusCode != http.StatusOK || body != "first" {
					t.Fatalf("the first answer: %v %v %q", err, resp, body)
				}
				second := "GET /second HTTP/1.1\r\nHost: app.test\r\n\r\n"
				if !p.loop {
					rc = e.conn(t, p, "") // another client
				}
				if !same {
					var resume func()
					if p.loop {
						var stopped <-chan struct{}
						stopped, resume = e.pause.arm()
						defer resume()
						rc.send(second)
						select {
						case <-stopped:
						case <-time.After(patience):
							t.Fatal("the loop did not begin the second request")
						}
					}
					ten.evil <- struct{}{}
					select {
					case <-ten.wrote:
					case <-time.After(patience):
						t.Fatal("the tenant did not write its unasked answer")
					}
					if p.loop {
						resume()
					} else {
						rc.send(second)
					}
				} else {
					rc.send(second)
				}
				resp, body, err := rc.next()
				if err != nil || resp.StatusCode != http.StatusOK || body != "second" {
					t.Fatalf("the second answer: %v %v %q, want 200 %q", err, resp, body, "second")
				}
				until(t, func() (bool, string) {
					return strings.Contains(logs.String(), "the tenant sent bytes no request asked for"),
						"the log has no line for the connection closed unused:\n" + logs.String()
				})
			})
		}
	}
}

// TestHeaderLimitFollowsReload: a reload that lowers edge.max_header_bytes holds the next request to
// the new limit on both paths (431), and one within it is served. The edge measures each request
// against the running config (measureHeader); the loop read heads up to the limit it was started with,
// and served a head over the reloaded one. It now hands back a head longer than the running limit,
// for net/http to measure.
func TestHeaderLimitFollowsReload(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	t.Cleanup(up.Close)
	r := testRoute("app")
	r.Upstream.Address = up.Listener.Addr().String()
	e := newConformEdge(t, conformConfig{routes: []*registry.Route{r}, edge: registry.EdgeLimits{MaxHeaderBytes: 8 << 10}})
	e.wake(t, "app")
	e.apply(t, func(c *registry.Config) { c.Edge.MaxHeaderBytes = 1 << 10 })
	head := func(size int) string {
		h := "GET / HTTP/1.1\r\nHost: app.test\r\nX-Pad: "
		return h + strings.Repeat("a", size-len(h)-len("\r\n\r\n")) + "\r\n\r\n"
	}
	for _, tc := range []struct {
		size, code int
	}{{1 << 10, http.StatusOK}, {1<<10 + 1, http.StatusRequestHeaderFieldsTooLarge}, {4 << 10, http.StatusRequestHeaderFieldsTooLarge}} {
		for _, p := range edgePaths {
			t.Run(fmt.Sprintf("%s %d bytes", p.name, tc.size), func(t *testing.T) {
				resp, body := e.exchange(t, p, head(tc.size))
				if resp.StatusCode != tc.code {
					t.Errorf("a head of %d bytes under a limit reloaded to 1024: %d %q, want %d", tc.size, resp.StatusCode, body, tc.code)
				}
			})
		}
	}
}
