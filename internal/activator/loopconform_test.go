package activator

// Cases of the edge's behaviour that the event loop's path must keep as net/http's does, each run over
// both paths (bothpaths_test.go): what a failing tenant costs, what a tenant sends unasked, streams,
// upgrades, the hold, the send and header limits.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
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
// twice, and the client the second attempt's outcome. And a request whose connection the loop closed
// once the answer's head had come went uncounted (so did a stalled client's:
// TestStalledClientFreesSlotOnBothPaths).
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

// TestWebSocketOnBothPaths: a WebSocket upgrade on a connection the loop owns is handed back and
// tunnels as on net/http's path: messages pass both ways.
func TestWebSocketOnBothPaths(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		for {
			typ, msg, err := ws.Read(r.Context())
			if err != nil {
				return
			}
			if err := ws.Write(r.Context(), typ, append([]byte("echo "), msg...)); err != nil {
				return
			}
		}
	}))
	t.Cleanup(up.Close)
	r := testRoute("app")
	r.Upstream.Address = up.Listener.Addr().String()
	e := newConformEdge(t, conformConfig{routes: []*registry.Route{r}})
	e.wake(t, "app")
	for _, p := range edgePaths {
		t.Run(p.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			defer cancel()
			rc := e.conn(t, p, "")
			once := make(chan net.Conn, 1)
			once <- rc.c
			// The client's transport dials this one connection, and no other.
			dial := func(context.Context, string, string) (net.Conn, error) {
				select {
				case c := <-once:
					return c, nil
				default:
					return nil, errors.New("one connection only")
				}
			}
			ws, resp, err := websocket.Dial(ctx, "ws://"+e.addr+"/ws", &websocket.DialOptions{Host: "app.test",
				HTTPClient: &http.Client{Transport: &http.Transport{DialContext: dial}}})
			if err != nil {
				t.Fatalf("websocket through the edge: %v", err)
			}
			defer ws.CloseNow()
			if resp.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("answered %d, want 101", resp.StatusCode)
			}
			for _, m := range []string{"one", "two"} {
				if err := ws.Write(ctx, websocket.MessageText, []byte(m)); err != nil {
					t.Fatal(err)
				}
				if _, got, err := ws.Read(ctx); err != nil || string(got) != "echo "+m {
					t.Fatalf("echo of %q: %q, %v", m, got, err)
				}
			}
			if err := ws.Close(websocket.StatusNormalClosure, ""); err != nil {
				t.Errorf("closing: %v", err)
			}
		})
	}
}

// TestEventStreamOnBothPaths: an event stream's head and first event reach the client before the
// tenant writes the rest, whether it declares a length (which the loop relays itself, as it comes) or
// not (which it hands to net/http with the exchange); the rest follows, and the stream ends whole.
func TestEventStreamOnBothPaths(t *testing.T) {
	const first, rest = "data: one\n\n", "data: two\n\n"
	more := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		if r.URL.Query().Has("length") {
			w.Header().Set("Content-Length", fmt.Sprint(len(first+rest)))
		}
		io.WriteString(w, first)
		w.(http.Flusher).Flush()
		select {
		case <-more:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, rest)
	}))
	t.Cleanup(up.Close)
	r := testRoute("app")
	r.Upstream.Address = up.Listener.Addr().String()
	e := newConformEdge(t, conformConfig{routes: []*registry.Route{r}})
	e.wake(t, "app")
	for _, target := range []string{"/events?length", "/events"} {
		for _, p := range edgePaths {
			t.Run(p.name+" "+target, func(t *testing.T) {
				rc := e.conn(t, p, "")
				served := e.s.loops.Served()
				rc.send("GET " + target + " HTTP/1.1\r\nHost: app.test\r\nAccept: text/event-stream\r\n\r\n")
				resp, err := http.ReadResponse(rc.br, nil)
				if err != nil {
					t.Fatalf("no head before the stream's end: %v", err)
				}
				defer resp.Body.Close()
				body := bufio.NewReader(resp.Body)
				var got string
				for !strings.HasSuffix(got, "\n\n") {
					line, err := body.ReadString('\n')
					got += line
					if err != nil {
						t.Fatalf("the first event before the stream's end: %q, %v", got, err)
					}
				}
				if got != first {
					t.Fatalf("first event %q, want %q", got, first)
				}
				more <- struct{}{}
				tail, err := io.ReadAll(body)
				if err != nil || string(tail) != rest {
					t.Fatalf("the rest: %q, %v; want %q", tail, err, rest)
				}
				if relayed := e.s.loops.Served() > served; relayed != (p.loop && strings.Contains(target, "length")) {
					t.Errorf("relayed by the loop itself: %v; want it for a stream with a length on the loop's path alone", relayed)
				}
			})
		}
	}
}

// TestHoldOnBothPaths: a request to a route asleep is held until its wake and then answered, on a
// connection the loop owns as on a new one, for a GET and a POST with its body. On the loop's path the
// connection has just carried a GET of the same route, which the loop served before the route was put
// to sleep: the loop hands the next request back, and net/http holds it.
func TestHoldOnBothPaths(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.Path, b)
	}))
	t.Cleanup(up.Close)
	r := testRoute("app")
	r.Upstream.Address = up.Listener.Addr().String()
	b := &fakeBackend{}
	e := newConformEdge(t, conformConfig{routes: []*registry.Route{r}, b: b})
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		for _, p := range edgePaths {
			t.Run(p.name+" "+method, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), patience)
				defer cancel()
				e.wake(t, "app")
				rc := e.conn(t, p, "")
				if p.loop {
					served := e.s.loops.Served()
					rc.send("GET /before HTTP/1.1\r\nHost: app.test\r\n\r\n")
					if resp, body, err := rc.next(); err != nil || resp.StatusCode != http.StatusOK || body != "GET /before " {
						t.Fatalf("GET /before: %v %v %q", err, resp, body)
					}
					if e.s.loops.Served() == served {
						t.Fatal("the loop did not serve GET /before")
					}
				}
				if err := e.s.Sleep(ctx, "app"); err != nil {
					t.Fatal(err)
				}
				gate := make(chan struct{})
				b.set(func(f *fakeBackend) { f.wakeGate = gate })
				defer b.set(func(f *fakeBackend) { f.wakeGate = nil })
				raw := method + " /held HTTP/1.1\r\nHost: app.test\r\n"
				if method == http.MethodPost {
					raw += "Content-Length: 4\r\n\r\nbody"
				} else {
					raw += "\r\n"
				}
				rc.send(raw)
				until(t, func() (bool, string) {
					n := e.s.held.n.Load()
					return n == 1, fmt.Sprintf("%d requests held, want 1", n)
				})
				close(gate)
				resp, body, err := rc.next()
				want := method + " /held "
				if method == http.MethodPost {
					want += "body"
				}
				if err != nil || resp.StatusCode != http.StatusOK || body != want {
					t.Fatalf("the held request: %v %v %q, want 200 %q", err, resp, body, want)
				}
			})
		}
	}
}

// TestStalledClientFreesSlotOnBothPaths: a client that asks for a large answer and stops reading it
// has its connection closed once edge.send_timeout passes with no progress, on both paths, and the
// route's only upstream slot (max_upstream_conns 1) comes free for the next request; the request is
// counted by its answer's status. Without the bound the stalled client kept the slot for ever and
// every other request got 503.
func TestStalledClientFreesSlotOnBothPaths(t *testing.T) {
	const size = 64 << 20
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/big" {
			io.WriteString(w, "small")
			return
		}
		writeSized(w, size)
	}))
	t.Cleanup(up.Close)
	for _, p := range edgePaths {
		t.Run(p.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			m := NewMetrics(reg)
			r := testRoute("app")
			r.Upstream.Address = up.Listener.Addr().String()
			r.MaxUpstreamConns = 1
			e := newConformEdge(t, conformConfig{routes: []*registry.Route{r}, metrics: m,
				edge: registry.EdgeLimits{SendTimeout: 200 * time.Millisecond}})
			e.wake(t, "app")
			in := e.s.instance("app")
			rc := e.conn(t, p, "")
			_ = rc.c.(*net.TCPConn).SetReadBuffer(4096)
			rc.send("GET /big HTTP/1.1\r\nHost: app.test\r\n\r\n")
			// Not read: the client has stalled. Its connection is closed, and the slot freed.
			until(t, func() (bool, string) {
				in.mu.Lock()
				defer in.mu.Unlock()
				return in.inflight == 0 && len(in.slots) == 0,
					fmt.Sprintf("%d requests in flight, %d upstream slots taken, with the client stalled", in.inflight, len(in.slots))
			})
			if resp, body := e.exchange(t, edgePaths[0], "GET /small HTTP/1.1\r\nHost: app.test\r\n\r\n"); resp.StatusCode != http.StatusOK {
				t.Errorf("the next request: %d %q, want 200", resp.StatusCode, body)
			}
			until(t, func() (bool, string) {
				got := routeSeries(t, m.Gatherer(reg), "app")
				return got[`activator_requests_total{code="200"}`] == 2, fmt.Sprintf("request series %v, want 2 of code 200", got)
			})
		})
	}
}

// TestPipelinedOnBothPaths: requests a client sends in one write are answered in order, each once:
// on the loop's path two GETs the loop serves, then a POST it hands back with the GET after it.
func TestPipelinedOnBothPaths(t *testing.T) {
	var got hits
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.add(r.URL.Path)
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.Path, b)
	}))
	t.Cleanup(up.Close)
	r := testRoute("app")
	r.Upstream.Address = up.Listener.Addr().String()
	e := newConformEdge(t, conformConfig{routes: []*registry.Route{r}})
	e.wake(t, "app")
	for _, p := range edgePaths {
		t.Run(p.name, func(t *testing.T) {
			rc := e.conn(t, p, "")
			prefix := "/" + strings.ReplaceAll(p.name, "/", "")
			rc.send("GET " + prefix + "/a HTTP/1.1\r\nHost: app.test\r\n\r\n" +
				"GET " + prefix + "/b HTTP/1.1\r\nHost: app.test\r\n\r\n" +
				"POST " + prefix + "/c HTTP/1.1\r\nHost: app.test\r\nContent-Length: 2\r\n\r\nhi" +
				"GET " + prefix + "/d HTTP/1.1\r\nHost: app.test\r\n\r\n")
			for _, want := range []string{"GET /a ", "GET /b ", "POST /c hi", "GET /d "} {
				want = strings.Replace(want, "/", prefix+"/", 1)
				resp, body, err := rc.next()
				if err != nil || resp.StatusCode != http.StatusOK || body != want {
					t.Fatalf("%v %v %q, want 200 %q", err, resp, body, want)
				}
			}
			for _, path := range []string{"/a", "/b", "/c", "/d"} {
				if n := got.of(prefix + path); n != 1 {
					t.Errorf("the tenant got %s %d times, want once", prefix+path, n)
				}
			}
		})
	}
}

// TestSlowReaderClosedOnBothPaths: edge.send_timeout bounds progress by the piece, not by the byte:
// a client that keeps taking its answer, but slower than 16 KiB a send_timeout (here 8 KiB a second,
// against 16 KiB in 1.6 s), has its connection closed on both paths, freeing the route's only upstream
// slot; one that takes it faster (80 KiB a second) gets all of an answer that takes it longer than the
// timeout. The loop's path restarted its clock at every write the client's socket took, so a slow
// client kept its connection, and the slot, for as long as it trickled: the attack send_timeout is
// there to stop. (The edge's send buffer and the client's receive buffer are small, so that the
// edge's socket takes a write at the pace of the client's reads, a few KiB at a time.)
func TestSlowReaderClosedOnBothPaths(t *testing.T) {
	const timeout = 1600 * time.Millisecond
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		size := 64 << 20
		if r.URL.Path == "/steady" {
			size = 160 << 10 // 2 s at the steady pace: longer than the timeout
		}
		writeSized(w, size)
	}))
	t.Cleanup(up.Close)
	for _, tc := range []struct {
		path        string
		read, every int // the client takes read bytes every every ms
	}{
		{"/slow", 2 << 10, 250},
		{"/steady", 8 << 10, 100},
	} {
		for _, p := range edgePaths {
			t.Run(p.name+" "+tc.path, func(t *testing.T) {
				r := testRoute("app")
				r.Upstream.Address = up.Listener.Addr().String()
				r.MaxUpstreamConns = 1
				e := newConformEdge(t, conformConfig{routes: []*registry.Route{r}, sendBuffer: 4096,
					edge: registry.EdgeLimits{SendTimeout: timeout}})
				e.wake(t, "app")
				in := e.s.instance("app")
				// A receive buffer of 4 KiB from the handshake on: a small window, which the edge's
				// kernel fills with small segments.
				rc := e.dialConn(t, p, &net.Dialer{Control: func(_, _ string, raw syscall.RawConn) error {
					return raw.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
				}})
				_ = rc.c.SetDeadline(time.Now().Add(2 * patience)) // it reads past the waits below
				rc.send("GET " + tc.path + " HTTP/1.1\r\nHost: app.test\r\n\r\n")
				// The client reads at its pace until the answer ends or the test does. What the edge
				// wrote before it closed the connection still reaches the client, so the edge's side
				// tells the close.
				stop := make(chan struct{})
				done := make(chan error, 1)
				start := time.Now()
				go func() {
					tick := time.NewTicker(time.Duration(tc.every) * time.Millisecond)
					defer tick.Stop()
					resp, err := http.ReadResponse(rc.br, nil)
					if err != nil {
						done <- err
						return
					}
					buf := make([]byte, tc.read)
					for got := int64(0); ; {
						n, err := io.ReadFull(resp.Body, buf)
						if got += int64(n); err != nil {
							if errors.Is(err, io.EOF) && got == resp.ContentLength {
								err = nil
							}
							done <- err
							return
						}
						select {
						case <-tick.C:
						case <-stop:
							done <- nil
							return
						}
					}
				}()
				defer func() { close(stop); <-done }()
				if tc.path == "/steady" {
					select {
					case err := <-done:
						done <- err // for the deferred wait
						if err != nil {
							t.Fatalf("a client taking 80 KiB a second did not get all of its answer: %v", err)
						}
					case <-time.After(patience):
						t.Fatal("a client taking 80 KiB a second did not get its answer of 160 KiB")
					}
					if took := time.Since(start); took < timeout {
						t.Logf("the answer took only %v: this run did not outlast send_timeout", took)
					}
					return
				}
				slot := func(taken bool) func() (bool, string) {
					return func() (bool, string) {
						in.mu.Lock()
						defer in.mu.Unlock()
						return (in.inflight == 1 && len(in.slots) == 1) == taken,
							fmt.Sprintf("%d requests in flight, %d upstream slots taken, with a client taking 8 KiB a second (send_timeout %v)", in.inflight, len(in.slots), timeout)
					}
				}
				until(t, slot(true))  // the request is begun
				until(t, slot(false)) // and ended
			})
		}
	}
}

// writeSized answers with size zero bytes framed by their Content-Length, 32 KiB a write, until the
// client stops taking them.
func writeSized(w http.ResponseWriter, size int) {
	w.Header().Set("Content-Length", fmt.Sprint(size))
	chunk := make([]byte, 32<<10)
	for left := size; left > 0; left -= len(chunk) {
		if _, err := w.Write(chunk[:min(left, len(chunk))]); err != nil {
			return
		}
	}
}

// TestClientLeavingMidRequest: a client that leaves while its request is upstream, by closing its
// connection or only its writing side (a FIN: net/http's background read takes it for a departure),
// gets no answer on either path, and the exchange is given up at once: the tenant sees its request's
// connection close, the route counts the request as one whose client left (499), and nothing stays in
// flight. The loop's path noticed the FIN only once the tenant answered, and so held the route's
// upstream slot, and the tenant's connection, for as long as the tenant took.
func TestClientLeavingMidRequest(t *testing.T) {
	arrived := make(chan struct{}, 1)
	left := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-r.Context().Done() // answers nothing until the edge gives the request up
		left <- struct{}{}
	}))
	t.Cleanup(up.Close)
	for _, how := range []string{"half-close", "close"} {
		for _, p := range edgePaths {
			t.Run(p.name+" "+how, func(t *testing.T) {
				reg := prometheus.NewPedanticRegistry()
				m := NewMetrics(reg)
				r := testRoute("app")
				r.Upstream.Address = up.Listener.Addr().String()
				e := newConformEdge(t, conformConfig{routes: []*registry.Route{r}, metrics: m})
				e.wake(t, "app")
				rc := e.conn(t, p, "")
				served := e.s.loops.Served()
				rc.send("GET /slow HTTP/1.1\r\nHost: app.test\r\n\r\n")
				<-arrived
				if how == "close" {
					rc.c.(*net.TCPConn).SetLinger(0) // an RST, so the edge's next read fails outright
					rc.c.Close()
				} else {
					if err := rc.c.(*net.TCPConn).CloseWrite(); err != nil {
						t.Fatal(err)
					}
					got, err := io.ReadAll(rc.c)
					if len(got) != 0 {
						t.Errorf("the half-closed client read %q (%v), want no answer: it left", got, err)
					}
				}
				select {
				case <-left:
				case <-time.After(hygienePatience):
					t.Fatal("the tenant's request was not given up after its client left")
				}
				const series = `activator_requests_total{code="499"}`
				until(t, func() (bool, string) {
					got := routeSeries(t, m.Gatherer(reg), "app")
					return got[series] == 1, fmt.Sprintf("request series %v, want %s 1", got, series)
				})
				until(t, func() (bool, string) {
					st := e.s.instance("app").status()
					return st.InFlight == 0, fmt.Sprintf("in flight %d", st.InFlight)
				})
				if p.loop && e.s.loops.Served() != served {
					t.Errorf("the loop counted the request as served")
				}
			})
		}
	}
}

// TestClientTimeoutsOnBothPaths: edge.header_timeout and edge.keep_alive_timeout close a connection
// alike on both paths: a head begun and not finished, and a connection idle after an answer, are
// closed without a byte written (net/http writes no 408 for a head that timed out), and not before
// their timeout (counted from before the connection opened: a lower bound whatever the machine's
// speed). On net/http's path the idle connection's answer is one net/http keeps (a 404 for a
// Host no route serves: the loop takes connections only after a tenant's answer). The loop checks its
// deadlines every 250 ms, so it may close a connection up to that much later than net/http.
func TestClientTimeoutsOnBothPaths(t *testing.T) {
	const timeout = 300 * time.Millisecond
	for _, c := range []struct {
		name string
		send string // after which the connection is left alone
		edge registry.EdgeLimits
	}{
		{"header", "GET /x HTTP/1.1\r\nHost: app", registry.EdgeLimits{HeaderTimeout: timeout}},
		{"keep-alive", "", registry.EdgeLimits{KeepAliveTimeout: timeout}},
	} {
		for _, p := range edgePaths {
			t.Run(c.name+" "+p.name, func(t *testing.T) {
				e := newConformEdge(t, conformConfig{routes: []*registry.Route{testRoute("app")}, edge: c.edge})
				// Before anything the edge's clocks start from: the connection (net/http's header
				// timeout runs from its first read), the last answer before the idle wait (the
				// keep-alive timeout runs from its end, which the client sees a moment later).
				start := time.Now()
				rc := e.conn(t, p, "")
				if !p.loop && c.send == "" {
					rc.send("GET / HTTP/1.1\r\nHost: nosuch.test\r\n\r\n")
					if resp, _, err := rc.next(); err != nil || resp.StatusCode != http.StatusNotFound {
						t.Fatalf("%v %v, want the edge's 404", resp, err)
					}
				}
				if c.send != "" {
					rc.send(c.send)
				}
				got, err := io.ReadAll(rc.br)
				if took := time.Since(start); took < timeout {
					t.Errorf("closed after %v, before the %v timeout", took, timeout)
				}
				if len(got) != 0 || err != nil {
					t.Errorf("read %q (%v) before the close, want nothing", got, err)
				}
			})
		}
	}
}

// TestClientGoneAsTheAnswerEnds: a client that sent its request with a FIN behind it, and closed its
// socket, is gone when its answer comes; the write of the answer's last piece then fails, and the
// exchange is ended once. On the loop, that failed write closed the client (ending its request) and
// then the answer's end ended it again, through the request's cleared target: a nil-interface panic
// in the loop's goroutine, which took the whole activator down (found by a read of the loop as an
// attacker: a tenant on the same host can make the answer's size fit). The answer here is one write
// of 100 KiB, so that the loop reads it in two reads: the first piece's write draws the RST, and the
// last piece's write, with the answer done, fails. net/http's path takes the FIN for the client's
// departure before the request goes upstream (TestClientLeavingMidRequest), so only the loop's path
// meets this.
func TestClientGoneAsTheAnswerEnds(t *testing.T) {
	arrived := make(chan struct{}, 1)
	answer := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/big" {
			return
		}
		arrived <- struct{}{}
		<-answer
		conn, bw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		body := make([]byte, 100<<10)
		fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", len(body))
		bw.Write(body)
		bw.Flush()
	}))
	t.Cleanup(up.Close)
	for _, p := range edgePaths {
		if !p.loop {
			continue
		}
		t.Run(p.name, func(t *testing.T) {
			e, rc := requestWithFIN(t, p, up.Listener.Addr().String(), "/big")
			<-arrived
			rc.c.Close()
			answer <- struct{}{}
			until(t, func() (bool, string) {
				st := e.s.instance("app").status()
				return st.InFlight == 0, fmt.Sprintf("in flight %d", st.InFlight)
			})
			// The edge still serves: a new client gets its answer.
			if got := e.conn(t, p, ""); got == nil {
				t.Fatal("no connection after the gone client")
			}
		})
	}
}

// TestRequestWithItsFIN: a client that sends its request and its FIN at once (a shell's printf | nc,
// some health checkers) has its connection ended on both paths: net/http's background read takes the
// FIN for the client's departure, and so does the loop now. The loop read both in one read, which did
// not fill its room, and took that to mean the socket was empty: the FIN raised no other edge, and the
// connection stayed open until its keep-alive timeout, a client reading to the end hanging with it.
func TestRequestWithItsFIN(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	}))
	t.Cleanup(up.Close)
	for _, p := range edgePaths {
		t.Run(p.name, func(t *testing.T) {
			e, rc := requestWithFIN(t, p, up.Listener.Addr().String(), "/ok")
			// An answer may or may not come first (net/http's path can have it before it sees the
			// FIN); the end of the stream must.
			rc.c.SetReadDeadline(time.Now().Add(hygienePatience))
			if _, err := io.ReadAll(rc.br); err != nil {
				t.Fatalf("reading to the end after the FIN: %v, want the edge to close the connection", err)
			}
			until(t, func() (bool, string) {
				st := e.s.instance("app").status()
				return st.InFlight == 0, fmt.Sprintf("in flight %d", st.InFlight)
			})
		})
	}
}

// TestLoopClosesIdleUpstream: the loop closes an upstream connection that has stayed idle for its
// idle timeout, as the upstream pool does. It kept them until the route retired: taken last in, first
// out, the oldest of a burst's connections stayed open for good, an fd and a tenant's worker each.
func TestLoopClosesIdleUpstream(t *testing.T) {
	closed := make(chan struct{}, 1)
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	}))
	up.Config.ConnState = func(c net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			select {
			case closed <- struct{}{}:
			default:
			}
		}
	}
	up.Start()
	t.Cleanup(up.Close)
	r := testRoute("app")
	r.Upstream.Address = up.Listener.Addr().String()
	e := newConformEdge(t, conformConfig{routes: []*registry.Route{r}, upstreamIdle: 300 * time.Millisecond})
	e.wake(t, "app")
	var loop edgePath
	for _, p := range edgePaths {
		if p.loop {
			loop = p
		}
	}
	served := e.s.loops.Served()
	resp, _ := e.exchange(t, loop, "GET /ok HTTP/1.1\r\nHost: app.test\r\n\r\n")
	if resp.StatusCode != http.StatusOK || e.s.loops.Served() == served {
		t.Fatalf("GET /ok: %d, loop served %d → %d: want the loop's answer", resp.StatusCode, served, e.s.loops.Served())
	}
	select {
	case <-closed:
	case <-time.After(hygienePatience):
		t.Fatal("the loop's idle upstream connection was not closed after its idle timeout")
	}
}

// requestWithFIN serves a route "app" whose upstream is addr on a new edge, and sends GET path on a
// connection of p's with its FIN behind it at once: on the loop's path, the loop reads both in one
// read.
func requestWithFIN(t *testing.T, p edgePath, addr, path string) (*conformEdge, *rawConn) {
	t.Helper()
	r := testRoute("app")
	r.Upstream.Address = addr
	e := newConformEdge(t, conformConfig{routes: []*registry.Route{r}})
	e.wake(t, "app")
	rc := e.conn(t, p, "")
	rc.send("GET " + path + " HTTP/1.1\r\nHost: app.test\r\n\r\n")
	if err := rc.c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	return e, rc
}
