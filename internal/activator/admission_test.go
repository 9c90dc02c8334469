package activator

// Admission over real sockets: an edge (httptest.Server around Server.ServeHTTP) in front of a real
// upstream, with hand-built routes and edge limits. Clients that must misbehave (trickle a body,
// stall, send a header of a chosen size) are raw TCP connections.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/activator/activator/internal/bodybuf"
	"github.com/activator/activator/internal/registry"
)

// patience bounds every wait in these tests. It is an upper bound, never an expectation: each wait
// ends within milliseconds on a healthy machine, and only a test that fails waits it out.
const patience = 20 * time.Second

// edgeRig is one route behind a real edge listener, its upstream a real server running upstream.
type edgeRig struct {
	s    *Server
	in   *instance
	b    *fakeBackend
	addr string // the edge's host:port
	// closed receives once for every client connection the edge has closed (it has let go of it).
	closed chan struct{}
}

func newEdgeRig(t *testing.T, b *fakeBackend, edge registry.EdgeLimits, upstream http.Handler, mut func(*registry.Route)) *edgeRig {
	t.Helper()
	return newRig(t, b, edge, upstream, mut, -1)
}

// newRig is newEdgeRig; with parkAbove ≥ 0, the edge parks the requests it holds (EnableParking), as
// cmd/activator's does, once it holds parkAbove.
func newRig(t testing.TB, b *fakeBackend, edge registry.EdgeLimits, upstream http.Handler, mut func(*registry.Route), parkAbove int64) *edgeRig {
	t.Helper()
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	r := testRoute("app")
	r.Upstream.Address = up.Listener.Addr().String()
	if mut != nil {
		mut(r)
	}
	s := New(Options{
		Opener:  fakeProvider{b},
		Logger:  slog.New(slog.DiscardHandler),
		NewGate: func(*registry.Route) Gate { return passGate{} },
	})
	if err := s.Apply(&registry.Config{Edge: edge, Routes: []*registry.Route{r}}); err != nil {
		t.Fatal(err)
	}
	g := &edgeRig{s: s, in: s.instance("app"), b: b, closed: make(chan struct{}, 4096)}
	front := httptest.NewUnstartedServer(s)
	resume := &http.Server{ConnContext: ConnContext}
	if parkAbove >= 0 {
		s.opts.ParkAbove = int(parkAbove)
		if parkAbove == 0 {
			s.opts.ParkAbove = -1
		}
		s.EnableParking(resume, s)
		front.Config.ConnContext = ConnContext
	}
	front.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			select {
			case g.closed <- struct{}{}:
			default: // more than the tests wait for
			}
		}
	}
	front.Start()
	t.Cleanup(func() {
		front.CloseClientConnections()
		front.Close()
		_ = s.Shutdown(context.Background())
		_ = resume.Close()
	})
	g.addr = front.Listener.Addr().String()
	return g
}

// dial opens a raw connection to the edge, closed at cleanup, whose reads and writes give up after
// patience.
func (g *edgeRig) dial(t *testing.T) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", g.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(patience))
	return c
}

// send writes a request head (lines without the final blank line) and then body.
func send(c net.Conn, head string, body []byte) error {
	var b bytes.Buffer
	b.WriteString(strings.ReplaceAll(head, "\n", "\r\n"))
	b.WriteString("\r\n\r\n")
	b.Write(body)
	_, err := c.Write(b.Bytes())
	return err
}

// reply is one response as a raw client read it.
type reply struct {
	code   int
	h      http.Header
	body   string
	closed bool // the server said it closes the connection (Connection: close)
}

// answer reads one response from c, body included. It allocates nothing before the response's first
// byte arrives, so that a client waiting on a held request costs the test's heap next to nothing.
func answer(c net.Conn) (reply, error) {
	var first [1]byte
	if _, err := io.ReadFull(c, first[:]); err != nil {
		return reply{}, err
	}
	return readReply(bufio.NewReader(io.MultiReader(bytes.NewReader(first[:]), c)), http.MethodGet)
}

// readReply reads one response to a request of method from br, body included; br keeps what follows
// it, for the next response on a kept-alive connection.
func readReply(br *bufio.Reader, method string) (reply, error) {
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b), resp.Close}, err
}

// fetch sends a GET through the edge on a fresh connection and reads the whole answer; it reports
// transport errors as errors, so any goroutine may call it.
func (g *edgeRig) fetch(path string, header http.Header) (int, http.Header, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.addr+path, nil)
	if err != nil {
		return 0, nil, "", err
	}
	req.Host = "app.test"
	for k, v := range header {
		req.Header[k] = v
	}
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return 0, nil, "", fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b), err
}

// get is fetch from the test goroutine: a transport error fails the test.
func (g *edgeRig) get(t *testing.T, path string, header http.Header) (int, http.Header, string) {
	t.Helper()
	code, h, body, err := g.fetch(path, header)
	if err != nil {
		t.Fatal(err)
	}
	return code, h, body
}

// getAsync runs fetch in a goroutine and sends its status (-1 on a transport error) to codes.
func (g *edgeRig) getAsync(codes chan<- int, header http.Header) {
	go func() {
		code, _, _, err := g.fetch("/", header)
		if err != nil {
			code = -1
		}
		codes <- code
	}()
}

// wake brings the route up with one GET.
func (g *edgeRig) wake(t *testing.T) {
	t.Helper()
	if code, _, body := g.get(t, "/", nil); code != http.StatusOK {
		t.Fatalf("waking GET: %d %q", code, body)
	}
}

// waitHeld waits until the server counts n held requests across its routes.
func (g *edgeRig) waitHeld(t *testing.T, n int64) {
	t.Helper()
	until(t, func() (bool, string) {
		got := g.s.held.n.Load()
		return got == n, fmt.Sprintf("held = %d, want %d", got, n)
	})
}

// until polls cond every millisecond until it reports true; after patience the test fails with what
// cond said last.
func until(t *testing.T, cond func() (ok bool, state string)) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(patience)
	defer deadline.Stop()
	for {
		ok, state := cond()
		if ok {
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatal(state)
		}
	}
}

// readAllHandler is a tenant that reads each request's whole body and answers with its length and
// sha256; started, when non-nil, receives the path of every request as it arrives.
func readAllHandler(started chan<- string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if started != nil {
			started <- r.URL.Path
		}
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d %x", n, h.Sum(nil))
	})
}

// trickle starts a POST that declares a body of 1,000,000 bytes and sends 1 of them, then stalls.
func trickle(t *testing.T, g *edgeRig, path string) net.Conn {
	t.Helper()
	c := g.dial(t)
	if err := send(c, "POST "+path+" HTTP/1.1\nHost: app.test\nContent-Length: 1000000", []byte("x")); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSlowUploadsDoNotBlockRoute: eight clients trickling request bodies on a route with four upstream
// slots. Buffered (the default), they hold no slot, and a normal GET is served at once; the trickles
// themselves are served once their bodies are complete. Unbuffered, they take the slots, and the GET
// gets 503 with Retry-After when its hold budget runs out, instead of waiting with no end.
func TestSlowUploadsDoNotBlockRoute(t *testing.T) {
	t.Run("buffered", func(t *testing.T) {
		entered := make(chan struct{}, 8)
		g := newEdgeRig(t, &fakeBackend{}, registry.EdgeLimits{}, readAllHandler(nil), func(r *registry.Route) {
			r.MaxUpstreamConns = 4
			r.RequestBuffering = true
		})
		inner := g.s
		// Know when each trickling request is in the edge's handler (past its header).
		front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				entered <- struct{}{}
			}
			inner.ServeHTTP(w, r)
		}))
		t.Cleanup(func() { front.CloseClientConnections(); front.Close() })
		g.addr = front.Listener.Addr().String()
		g.wake(t)
		var slow []net.Conn
		for range 8 {
			slow = append(slow, trickle(t, g, "/upload"))
		}
		for range 8 {
			<-entered
		}
		if code, _, body := g.get(t, "/", nil); code != http.StatusOK {
			t.Fatalf("GET beside 8 slow uploads: %d %q, want 200", code, body)
		}
		// A trickle that completes its body is served, intact.
		rest := bytes.Repeat([]byte("x"), 1_000_000-1)
		if _, err := slow[0].Write(rest); err != nil {
			t.Fatal(err)
		}
		a, err := answer(slow[0])
		sum := sha256.Sum256(append([]byte("x"), rest...))
		if want := fmt.Sprintf("1000000 %x", sum); err != nil || a.code != http.StatusOK || a.body != want {
			t.Fatalf("completed upload: %d %q %v, want 200 %q", a.code, a.body, err, want)
		}
	})
	t.Run("unbuffered", func(t *testing.T) {
		started := make(chan string, 16)
		g := newEdgeRig(t, &fakeBackend{}, registry.EdgeLimits{}, readAllHandler(started), func(r *registry.Route) {
			r.MaxUpstreamConns = 4
			r.RequestBuffering = false
			r.Hold.MaxTime = 300 * time.Millisecond // the GET's whole budget: it finds the route awake
		})
		g.wake(t)
		<-started // the waking GET
		for range 8 {
			trickle(t, g, "/upload")
		}
		for range 4 { // four trickles hold the four slots; the other four wait for one
			if p := <-started; p != "/upload" {
				t.Fatalf("upstream got %s, want /upload", p)
			}
		}
		code, h, body := g.get(t, "/", nil)
		if code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" {
			t.Fatalf("GET behind 4 slots held by slow uploads: %d (Retry-After %q) %q, want 503 with Retry-After", code, h.Get("Retry-After"), body)
		}
		if !strings.Contains(body, ErrUpstreamBusy.Error()) {
			t.Fatalf("503 body %q does not say %q", body, ErrUpstreamBusy)
		}
	})
}

// TestAdmitBoundedByHoldBudget: a request held for a wake waits for an upstream slot only for what
// is left of its hold.max_time, then gets ErrUpstreamBusy.
func TestAdmitBoundedByHoldBudget(t *testing.T) {
	_, in := newTestServer(t, &fakeBackend{}, passGate{}, func(r *registry.Route) {
		r.MaxUpstreamConns = 1
		r.Hold.MaxTime = time.Second
	})
	done, err := in.admit(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	admit := func(heldFor time.Duration) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), patience) // fails the test instead of hanging it
		defer cancel()
		start := time.Now()
		_, err := in.admit(ctx, &holdCharge{heldFor: heldFor})
		return time.Since(start), err
	}
	if _, err := admit(time.Second); !errors.Is(err, ErrUpstreamBusy) {
		t.Fatalf("admit with the hold budget spent: %v, want ErrUpstreamBusy at once", err)
	}
	if d, err := admit(900 * time.Millisecond); !errors.Is(err, ErrUpstreamBusy) || d > 900*time.Millisecond {
		t.Fatalf("admit with 100ms of budget left: %v after %v, want ErrUpstreamBusy after about 100ms", err, d)
	}
	if code, retry := statusFor(in.busy(0)); code != http.StatusServiceUnavailable || retry <= 0 {
		t.Fatalf("ErrUpstreamBusy maps to %d (Retry-After %v), want 503 with Retry-After", code, retry)
	}
}

// TestBodyIdle: a body that stalls for edge.body_timeout gets 408, buffered (before anything is
// woken) and streamed (while the proxy forwards it).
func TestBodyIdle(t *testing.T) {
	for _, buffered := range []bool{true, false} {
		t.Run(fmt.Sprintf("buffered=%v", buffered), func(t *testing.T) {
			b := &fakeBackend{}
			g := newEdgeRig(t, b, registry.EdgeLimits{BodyTimeout: 200 * time.Millisecond}, readAllHandler(nil), func(r *registry.Route) {
				r.RequestBuffering = buffered
			})
			if !buffered {
				g.wake(t)
			}
			c := trickle(t, g, "/upload")
			a, err := answer(c)
			if err != nil || a.code != http.StatusRequestTimeout {
				t.Fatalf("stalled body: %d %q %v, want 408", a.code, a.body, err)
			}
			if want := "request body timed out"; !strings.Contains(a.body, want) || strings.Contains(a.body, "127.0.0.1") {
				t.Fatalf("408 body %q: want it short, saying %q", a.body, want)
			}
			if !a.closed {
				t.Fatalf("408 without Connection: close: the rest of the body would be read as a request")
			}
			if buffered && b.wakes.Load() != 0 {
				t.Fatalf("a stalled upload woke the tenant (%d wakes)", b.wakes.Load())
			}
		})
	}
}

// TestMaxBody: a body over max_body gets 413: declared (at once) and chunked (at byte max+1),
// buffered and streamed.
func TestMaxBody(t *testing.T) {
	const max = 1000
	chunked := func(n int) []byte {
		var b bytes.Buffer
		fmt.Fprintf(&b, "%x\r\n%s\r\n0\r\n\r\n", n, bytes.Repeat([]byte("y"), n))
		return b.Bytes()
	}
	for _, buffered := range []bool{true, false} {
		for _, tc := range []struct {
			name string
			head string
			body []byte
			want int
		}{
			{"declared", "Content-Length: 2000", nil, http.StatusRequestEntityTooLarge},
			{"chunked", "Transfer-Encoding: chunked", chunked(max + 500), http.StatusRequestEntityTooLarge},
			{"chunked at the limit", "Transfer-Encoding: chunked", chunked(max), http.StatusOK},
			{"declared at the limit", fmt.Sprintf("Content-Length: %d", max), bytes.Repeat([]byte("z"), max), http.StatusOK},
		} {
			t.Run(fmt.Sprintf("%s/buffered=%v", tc.name, buffered), func(t *testing.T) {
				b := &fakeBackend{}
				g := newEdgeRig(t, b, registry.EdgeLimits{}, readAllHandler(nil), func(r *registry.Route) {
					r.RequestBuffering = buffered
					r.MaxBody = max
				})
				g.wake(t)
				c := g.dial(t)
				if err := send(c, "POST /up HTTP/1.1\nHost: app.test\n"+tc.head, tc.body); err != nil {
					t.Fatal(err)
				}
				a, err := answer(c)
				if err != nil || a.code != tc.want {
					t.Fatalf("%d %q %v, want %d", a.code, a.body, err, tc.want)
				}
				if a.code == http.StatusRequestEntityTooLarge && (!strings.Contains(a.body, "request body too large") || len(a.body) > 120) {
					t.Fatalf("413 body %q: want a short one saying the body is too large", a.body)
				}
			})
		}
	}
}

// TestBufferedBodySurvivesHold: a body longer than edge.body_memory is spilled to a file in
// edge.body_buffer_dir (open, already unlinked, while the request is held for a cold wake), and
// reaches the tenant intact; so does a chunked one kept in memory.
func TestBufferedBodySurvivesHold(t *testing.T) {
	dir := t.TempDir()
	b := &fakeBackend{wakeGate: make(chan struct{})}
	g := newEdgeRig(t, b, registry.EdgeLimits{BodyMemory: 64 << 10, BodyBufferDir: dir}, readAllHandler(nil), func(r *registry.Route) {
		r.RequestBuffering = true
	})
	big := make([]byte, 3<<20)
	_, _ = rand.Read(big)
	small := make([]byte, 10<<10)
	_, _ = rand.Read(small)
	type result struct {
		code int
		body string
		err  error
	}
	post := func(body io.Reader, length int64) <-chan result {
		got := make(chan result, 1)
		go func() {
			req, _ := http.NewRequest(http.MethodPost, "http://"+g.addr+"/up", body)
			req.Host, req.ContentLength = "app.test", length
			resp, err := http.DefaultTransport.RoundTrip(req)
			if err != nil {
				got <- result{err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			got <- result{resp.StatusCode, string(b), err}
		}()
		return got
	}
	bigGot := post(bytes.NewReader(big), int64(len(big)))
	smallGot := post(io.MultiReader(bytes.NewReader(small)), -1) // chunked
	// Held by the route, bodies read: the edge's count includes requests whose bodies it is reading.
	until(t, func() (bool, string) {
		st := g.in.status()
		return st.Held == 2, fmt.Sprintf("route holds %d, want 2", st.Held)
	})
	if spills := openSpills(t, dir); spills != 1 {
		t.Fatalf("%d spill files open in %s while held, want 1 (the big body's)", spills, dir)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("spill files visible in %s: %v (want them unlinked at once)", dir, left)
	}
	if charged, want := g.s.held.bytes.Load(), int64(len(small)); charged < want {
		t.Fatalf("held bytes %d, want at least the small body's %d in memory", charged, want)
	}
	close(b.wakeGate)
	for _, tc := range []struct {
		got  <-chan result
		sent []byte
	}{{bigGot, big}, {smallGot, small}} {
		r := <-tc.got
		if want := fmt.Sprintf("%d %x", len(tc.sent), sha256.Sum256(tc.sent)); r.err != nil || r.code != http.StatusOK || r.body != want {
			t.Fatalf("after the wake: %d %q %v, want 200 %q", r.code, r.body, r.err, want)
		}
	}
	if spills := openSpills(t, dir); spills != 0 {
		t.Fatalf("%d spill files still open after the responses", spills)
	}
}

// openSpills counts this process's open files that are bodybuf spill files in dir.
func openSpills(t *testing.T, dir string) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot list open files: %v", err)
	}
	n := 0
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && strings.HasPrefix(target, filepath.Join(dir, "activator-body-")) {
			n++
		}
	}
	return n
}

// TestEdgeCaps: edge.max_held and edge.max_held_bytes bound the requests held across all routes; a
// request past either gets 503 with Retry-After at once, without waking anything; a request to an
// awake route is not held and not counted.
func TestEdgeCaps(t *testing.T) {
	t.Run("max_held", func(t *testing.T) {
		b := &fakeBackend{wakeGate: make(chan struct{})}
		g := newEdgeRig(t, b, registry.EdgeLimits{MaxHeld: 3}, readAllHandler(nil), nil)
		codes := make(chan int, 4)
		for range 4 {
			g.getAsync(codes, nil)
		}
		if code := <-codes; code != http.StatusServiceUnavailable {
			t.Fatalf("first answer among 4 requests held with max_held 3: %d, want 503", code)
		}
		g.waitHeld(t, 3)
		code, h, body := g.get(t, "/", nil)
		if code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" || !strings.Contains(body, "edge.max_held") {
			t.Fatalf("a request past max_held: %d (Retry-After %q) %q, want 503 naming edge.max_held", code, h.Get("Retry-After"), body)
		}
		close(b.wakeGate)
		for range 3 {
			if code := <-codes; code != http.StatusOK {
				t.Fatalf("held request after the wake: %d, want 200", code)
			}
		}
		g.waitHeld(t, 0)
		if got := g.s.held.bytes.Load(); got != 0 {
			t.Fatalf("held bytes %d with nothing held, want 0", got)
		}
	})
	t.Run("awake route not counted", func(t *testing.T) {
		started, release := make(chan string, 8), make(chan struct{})
		up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			started <- r.URL.Path
			<-release
		})
		g := newEdgeRig(t, &fakeBackend{}, registry.EdgeLimits{MaxHeld: 1, MaxHeldBytes: 1}, up, nil)
		if err := g.in.wakeNow(context.Background()); err != nil { // an admin wake: not charged
			t.Fatal(err)
		}
		codes := make(chan int, 5)
		for range 5 {
			g.getAsync(codes, nil)
		}
		for range 5 { // all five in flight at once, none held
			<-started
		}
		close(release)
		for range 5 {
			if code := <-codes; code != http.StatusOK {
				t.Fatalf("request: %d, want 200", code)
			}
		}
	})
	t.Run("max_held_bytes", func(t *testing.T) {
		b := &fakeBackend{wakeGate: make(chan struct{})}
		g := newEdgeRig(t, b, registry.EdgeLimits{MaxHeldBytes: 16 << 10, BodyMemory: 64 << 10}, readAllHandler(nil), func(r *registry.Route) {
			r.RequestBuffering = true
		})
		held := make(chan int, 1)
		g.getAsync(held, nil)
		g.waitHeld(t, 1)
		code, h, body := g.get(t, "/", http.Header{"X-Pad": {strings.Repeat("p", 20<<10)}})
		if code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" || !strings.Contains(body, "edge.max_held_bytes") {
			t.Fatalf("a request with a 20 KiB header past max_held_bytes 16 KiB: %d (Retry-After %q) %q, want 503 naming edge.max_held_bytes", code, h.Get("Retry-After"), body)
		}
		// An in-memory body counts as well.
		c := g.dial(t)
		if err := send(c, "POST / HTTP/1.1\nHost: app.test\nContent-Length: 20480", bytes.Repeat([]byte("b"), 20<<10)); err != nil {
			t.Fatal(err)
		}
		if a, err := answer(c); err != nil || a.code != http.StatusServiceUnavailable || !strings.Contains(a.body, "edge.max_held_bytes") {
			t.Fatalf("a 20 KiB body past max_held_bytes 16 KiB: %d %q %v, want 503", a.code, a.body, err)
		}
		if b.wakes.Load() != 1 {
			t.Fatalf("wakes = %d, want 1 (refused requests wake nothing)", b.wakes.Load())
		}
		close(b.wakeGate)
		if code := <-held; code != http.StatusOK {
			t.Fatalf("held request: %d, want 200", code)
		}
	})
	// A request whose body the edge is reading counts too: its handler waits at the edge for as long as
	// its client takes (up to edge.body_timeout between bytes), and HTTP/2 lets one connection carry
	// 250 such, a few bytes of head each. Before, nothing bounded them but edge.max_conns.
	t.Run("reading a body", func(t *testing.T) {
		g := newEdgeRig(t, &fakeBackend{}, registry.EdgeLimits{MaxHeld: 1, BodyMemory: 64 << 10, BodyTimeout: time.Minute}, readAllHandler(nil), func(r *registry.Route) {
			r.RequestBuffering = true
		})
		g.wake(t)
		slow := g.dial(t)
		if err := send(slow, "POST /slow HTTP/1.1\nHost: app.test\nContent-Length: 10", []byte("abc")); err != nil {
			t.Fatal(err)
		}
		g.waitHeld(t, 1)
		c := g.dial(t)
		if err := send(c, "POST /up HTTP/1.1\nHost: app.test\nContent-Length: 5", []byte("12345")); err != nil {
			t.Fatal(err)
		}
		if a, err := answer(c); err != nil || a.code != http.StatusServiceUnavailable || !strings.Contains(a.body, "edge.max_held") || a.h.Get("Retry-After") == "" {
			t.Fatalf("an upload past max_held 1 while another's body is read: %d %q %v, want 503 naming edge.max_held", a.code, a.body, err)
		}
		if code, _, body := g.get(t, "/", nil); code != http.StatusOK {
			t.Fatalf("a GET to the awake route, with a free slot: %d %q, want 200 (it is not counted)", code, body)
		}
		if _, err := slow.Write([]byte("defghij")); err != nil {
			t.Fatal(err)
		}
		if a, err := answer(slow); err != nil || a.code != http.StatusOK {
			t.Fatalf("the slow upload, complete: %d %q %v, want 200", a.code, a.body, err)
		}
		g.waitHeld(t, 0)
		if got := g.s.held.bytes.Load(); got != 0 {
			t.Fatalf("held bytes %d with nothing held or read, want 0", got)
		}
	})
	// A request waiting for one of its route's upstream slots keeps its body and header as a held one
	// does, and counts as one: a herd's released requests until each has its slot, and a request to an
	// awake route whose slots are all taken. Before, neither counted, and such requests could keep any
	// number of buffered bodies for up to hold.max_time.
	t.Run("waiting for an upstream slot", func(t *testing.T) {
		started, release := make(chan string, 8), make(chan struct{})
		up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			started <- r.URL.Path
			<-release
		})
		var once sync.Once
		open := func() { once.Do(func() { close(release) }) }
		b := &fakeBackend{wakeGate: make(chan struct{})}
		g := newEdgeRig(t, b, registry.EdgeLimits{MaxHeld: 2}, up, func(r *registry.Route) { r.MaxUpstreamConns = 1 })
		t.Cleanup(open) // before the rig's own clean-up, which waits for the upstream's handlers
		codes := make(chan int, 8)
		for range 2 {
			g.getAsync(codes, nil)
		}
		g.waitHeld(t, 2)
		close(b.wakeGate)
		<-started // one has the slot and has left the count; the other waits for the slot, counted
		g.waitHeld(t, 1)
		g.getAsync(codes, nil) // to the awake route: waits for the slot, counted
		g.waitHeld(t, 2)
		if code, _, body := g.get(t, "/", nil); code != http.StatusServiceUnavailable || !strings.Contains(body, "edge.max_held") {
			t.Fatalf("a third request waiting for the slot past max_held 2: %d %q, want 503 naming edge.max_held", code, body)
		}
		open()
		for range 3 {
			if code := <-codes; code != http.StatusOK {
				t.Fatalf("request: %d, want 200", code)
			}
		}
		g.waitHeld(t, 0)
		if got := g.s.held.bytes.Load(); got != 0 {
			t.Fatalf("held bytes %d with nothing held or waiting, want 0", got)
		}
	})
}

// perHeldAllowance is what one held request may cost beyond the bytes edge.max_held_bytes counts
// (headerSizes' held), on the heap and in stacks: its connection's 4 KiB read and 4 KiB write
// buffers and 2 KiB response buffer, the handler goroutine's stack, the request, connection and
// context structs, the size-class rounding of its header's strings, and here its client's goroutine
// in this same process. Measured about 30 KiB at the header limit (go1.26, amd64: 19 KiB of heap, 11
// KiB of stacks, of which the client's end is about 5 KiB); docs/security.md quotes it.
const perHeldAllowance = 40 << 10

// TestHeldMemoryCeiling: requests with headers at the header limit, to a route that does not wake,
// keep the heap and stacks under edge.max_held_bytes plus the per-request allowance, and those past
// the cap are refused at once.
func TestHeldMemoryCeiling(t *testing.T) {
	const (
		maxHeldBytes = 8 << 20
		pad          = 30 << 10 // a header at the default 32 KiB limit, with room for the rest
		clients      = 800
	)
	b := &fakeBackend{wakeGate: make(chan struct{})}
	g := newEdgeRig(t, b, registry.EdgeLimits{MaxHeldBytes: maxHeldBytes}, readAllHandler(nil), nil)
	// Every client sends the same bytes: the test's own side costs a connection each, not a header.
	head := []byte("GET / HTTP/1.1\r\nHost: app.test\r\nX-Pad: " + strings.Repeat("p", pad) + "\r\n\r\n")
	each := int64(len("/") + len("app.test") + len("X-Pad") + pad + 4) // headerSizes' held, for that request
	capacity := maxHeldBytes / each

	settle()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	refused := make(chan int, clients)
	var wg sync.WaitGroup
	for range clients {
		c := g.dial(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Write(head); err != nil {
				refused <- -1
				return
			}
			a, err := answer(c)
			c.Close() // a refused client goes away, as the bound assumes
			switch {
			case err != nil:
				a.code = -1
			case a.code == http.StatusServiceUnavailable && a.h.Get("Retry-After") == "":
				a.code = -2
			}
			refused <- a.code
		}()
	}
	for range clients - int(capacity) {
		if code := <-refused; code != http.StatusServiceUnavailable {
			t.Fatalf("a request past the cap got %d, want 503 with Retry-After at once", code)
		}
	}
	g.waitHeld(t, capacity)
	for range clients - int(capacity) { // the refused clients have gone, and the edge let go of them
		<-g.closed
	}
	if got := g.s.held.bytes.Load(); got > maxHeldBytes {
		t.Fatalf("held bytes %d, over the cap %d", got, maxHeldBytes)
	}
	settle()
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	grown := int64(during.HeapInuse+during.StackInuse) - int64(before.HeapInuse+before.StackInuse)
	allowance := int64(perHeldAllowance)
	if raceEnabled {
		allowance += 16 << 10 // the race detector's instrumentation makes both larger
	}
	bound := int64(maxHeldBytes) + capacity*allowance
	t.Logf("%d held (%d refused): heap and stacks grew %d KiB (stacks %d KiB), %.1f KiB per held request; counted %d KiB; bound %d KiB",
		capacity, clients-int(capacity), grown>>10, (int64(during.StackInuse)-int64(before.StackInuse))>>10,
		float64(grown)/float64(capacity)/1024, g.s.held.bytes.Load()>>10, bound>>10)
	if grown > bound {
		t.Fatalf("heap grew %d bytes with %d requests held, over max_held_bytes %d plus %d per request", grown, capacity, maxHeldBytes, allowance)
	}
	close(b.wakeGate)
	wg.Wait()
}

// settle collects the garbage, twice: what sync.Pools hold (net/http's buffers of connections gone)
// survives one collection.
func settle() {
	runtime.GC()
	runtime.GC()
}

// TestBodyDirChecked: an edge.body_buffer_dir that cannot hold spill files stops Apply.
func TestBodyDirChecked(t *testing.T) {
	s := New(Options{Opener: fakeProvider{&fakeBackend{}}, NewGate: func(*registry.Route) Gate { return passGate{} }})
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	cfg := &registry.Config{Edge: registry.EdgeLimits{BodyBufferDir: filepath.Join(t.TempDir(), "missing")}, Routes: []*registry.Route{testRoute("app")}}
	if err := s.Apply(cfg); err == nil || !strings.Contains(err.Error(), "edge.body_buffer_dir") {
		t.Fatalf("Apply with a missing body_buffer_dir: %v, want an error naming edge.body_buffer_dir", err)
	}
}

// TestStatusForBodyErrors: the body's errors keep their status when the proxy wraps them, and tell
// the client nothing of what lies beneath.
func TestStatusForBodyErrors(t *testing.T) {
	inner := &net.OpError{Op: "read", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 4567}, Err: errors.New("reset")}
	for _, tc := range []struct {
		err  error
		code int
		msg  string
	}{
		{&UpstreamError{Route: "app", Err: fmt.Errorf("%w: more than 10 bytes", bodybuf.ErrTooLarge)}, 413, "request body too large: more than 10 bytes"},
		{&UpstreamError{Route: "app", Err: fmt.Errorf("%w: no byte for 1s", bodybuf.ErrIdle)}, 408, "request body timed out: no byte for 1s"},
		{fmt.Errorf("%w: %w", ErrBodyRead, inner), 400, ErrBodyRead.Error()},
		{fmt.Errorf("%w: %w", ErrBodyBuffer, &os.PathError{Op: "open", Path: "/secret/dir", Err: os.ErrPermission}), 500, ErrBodyBuffer.Error()},
	} {
		if code, _ := statusFor(tc.err); code != tc.code {
			t.Errorf("statusFor(%v) = %d, want %d", tc.err, code, tc.code)
		}
		if got := clientMessage(tc.err); got != tc.msg {
			t.Errorf("clientMessage(%v) = %q, want %q", tc.err, got, tc.msg)
		}
	}
}

// TestExpectNotForwardedOnceBuffered: with request buffering the edge reads the whole body (sending
// the client its 100 Continue as net/http does) before the tenant sees the request, so the tenant is
// not asked to Expect one: it answered a second 100 Continue, which reached the client after it had
// sent its body (found with the real binary).
func TestExpectNotForwardedOnceBuffered(t *testing.T) {
	saw := make(chan string, 1)
	g := newEdgeRig(t, &fakeBackend{}, registry.EdgeLimits{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		saw <- r.Header.Get("Expect")
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "got %d", n)
	}), func(r *registry.Route) { r.RequestBuffering = true })
	c := g.dial(t)
	if err := send(c, "POST /upload HTTP/1.1\nHost: app.test\nExpect: 100-continue\nContent-Length: 5\nConnection: close", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	all, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if got := <-saw; got != "" {
		t.Errorf("the tenant was sent Expect: %q", got)
	}
	if n := strings.Count(string(all), "100 Continue"); n > 1 || !strings.Contains(string(all), "got 5") {
		t.Errorf("the client got %d 100 Continue answers (want at most the edge's one) and:\n%s", n, all)
	}
}

// TestHeldClientGoneGetsNoFakeAnswer: a request held in net/http (not parked) whose client half-closes
// its connection after the request ends its hold, as a client that left (net/http's background read
// takes the FIN for a departure), and gets no answer: the connection is closed. Before, the handler
// returned without one and net/http wrote an empty "200 OK", which the half-closed client read as its
// answer before the wake had finished (found with real sockets). The same for a request to an awake
// route whose tenant has not answered yet.
func TestHeldClientGoneGetsNoFakeAnswer(t *testing.T) {
	for _, awake := range []bool{false, true} {
		t.Run(map[bool]string{false: "held", true: "proxied"}[awake], func(t *testing.T) {
			b := &fakeBackend{}
			slow := make(chan struct{})
			defer close(slow)
			arrived := make(chan struct{}, 1)
			g := newRig(t, b, registry.EdgeLimits{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				arrived <- struct{}{}
				select {
				case <-slow:
				case <-r.Context().Done():
				}
			}), nil, -1) // no parking
			if awake {
				if err := g.s.Wake(t.Context(), "app"); err != nil {
					t.Fatal(err)
				}
			} else {
				b.wakeGate = make(chan struct{})
				defer close(b.wakeGate)
			}
			c := g.dial(t)
			if err := send(c, "GET /x HTTP/1.1\nHost: app.test", nil); err != nil {
				t.Fatal(err)
			}
			if awake {
				<-arrived
			} else {
				until(t, func() (bool, string) {
					st := g.in.status()
					return st.Held == 1, fmt.Sprintf("held %d", st.Held)
				})
			}
			if err := c.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(c)
			if len(got) != 0 {
				t.Errorf("the half-closed client read %q (%v), want no answer: its request was given up", got, err)
			}
			until(t, func() (bool, string) {
				st := g.in.status()
				return st.Held == 0 && st.InFlight == 0, fmt.Sprintf("held %d, in flight %d", st.Held, st.InFlight)
			})
		})
	}
}

// TestRefusedBeforeItsBody: a request refused before its body is read (an unknown host, a path the
// edge refuses, a head too large) is answered at once with Connection: close, though its client
// declared a body and sent none of it. Before, net/http read the unread body's rest before writing
// the answer, with no deadline (edge.body_timeout applies only to bodies the edge takes): no answer
// came, and the connection, busy, was never closed for room, so a few thousand such clients filled
// edge.max_conns.
func TestRefusedBeforeItsBody(t *testing.T) {
	g := newEdgeRig(t, &fakeBackend{}, registry.EdgeLimits{BodyTimeout: 200 * time.Millisecond, MaxHeaderBytes: 4096}, readAllHandler(nil), nil)
	for _, tc := range []struct {
		name, head string
		want       int
	}{
		{"unknown host", "POST / HTTP/1.1\nHost: nosuch.test\nContent-Length: 1000", http.StatusNotFound},
		{"refused path", "POST /a%2Fb HTTP/1.1\nHost: app.test\nContent-Length: 1000", http.StatusBadRequest},
		{"head too large", "POST / HTTP/1.1\nHost: app.test\nX-Big: " + strings.Repeat("b", 5000) + "\nContent-Length: 1000", http.StatusRequestHeaderFieldsTooLarge},
		{"chunked, unknown host", "POST / HTTP/1.1\nHost: nosuch.test\nTransfer-Encoding: chunked", http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := g.dial(t)
			if err := send(c, tc.head, nil); err != nil {
				t.Fatal(err)
			}
			a, err := answer(c)
			if err != nil || a.code != tc.want {
				t.Fatalf("%d %q %v, want %d at once (within %v)", a.code, a.body, err, tc.want, patience)
			}
			if !a.closed {
				t.Fatal("answered without Connection: close: the body the client goes on to send would be read as a request")
			}
		})
	}
}

// TestSpillCap: request bodies' spill files are bounded across the edge (edge.max_spill_files,
// edge.max_spill_bytes): past either, a body that needs a file gets 503 with Retry-After, and one that
// fits in memory is served. Before, each body was bounded alone (max_body): enough slow uploads took
// every descriptor the process had left (one HTTP/2 connection carries 250), or filled the disk.
func TestSpillCap(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edge  registry.EdgeLimits
		other int // the second body's length
	}{
		{"files", registry.EdgeLimits{BodyMemory: 100, BodyTimeout: time.Minute, MaxSpillFiles: 1, MaxSpillBytes: 1 << 30}, 1000},
		{"bytes", registry.EdgeLimits{BodyMemory: 100, BodyTimeout: time.Minute, MaxSpillBytes: 1500}, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newEdgeRig(t, &fakeBackend{}, tc.edge, readAllHandler(nil), func(r *registry.Route) { r.RequestBuffering = true })
			g.wake(t)
			// One upload takes its spill file (and declares 1000 bytes), and stalls.
			slow := g.dial(t)
			if err := send(slow, "POST /slow HTTP/1.1\nHost: app.test\nContent-Length: 1000", bytes.Repeat([]byte("s"), 500)); err != nil {
				t.Fatal(err)
			}
			until(t, func() (bool, string) {
				files, bytes := g.s.spills.InUse()
				return files == 1, fmt.Sprintf("%d spill files, %d bytes in use, want 1", files, bytes)
			})
			post := func(n int) reply {
				c := g.dial(t)
				if err := send(c, fmt.Sprintf("POST /up HTTP/1.1\nHost: app.test\nContent-Length: %d", n), bytes.Repeat([]byte("u"), n)); err != nil {
					t.Fatal(err)
				}
				a, err := answer(c)
				if err != nil {
					t.Fatal(err)
				}
				return a
			}
			if a := post(tc.other); a.code != http.StatusServiceUnavailable || a.h.Get("Retry-After") == "" || !strings.Contains(a.body, "no room to buffer the request body") {
				t.Fatalf("a body past the spill cap: %d %q (Retry-After %q), want 503 with Retry-After saying there is no room", a.code, a.body, a.h.Get("Retry-After"))
			}
			if a := post(50); a.code != http.StatusOK {
				t.Fatalf("a body that fits in memory: %d %q, want 200", a.code, a.body)
			}
			// The stalled upload completes, is served, and gives its file back.
			if _, err := slow.Write(bytes.Repeat([]byte("s"), 500)); err != nil {
				t.Fatal(err)
			}
			if a, err := answer(slow); err != nil || a.code != http.StatusOK {
				t.Fatalf("the slow upload: %d %q %v, want 200", a.code, a.body, err)
			}
			until(t, func() (bool, string) {
				files, bytes := g.s.spills.InUse()
				return files == 0 && bytes == 0, fmt.Sprintf("%d spill files, %d bytes in use after the upload, want none", files, bytes)
			})
			if a := post(tc.other); a.code != http.StatusOK {
				t.Fatalf("with room again: %d %q, want 200", a.code, a.body)
			}
		})
	}
}
