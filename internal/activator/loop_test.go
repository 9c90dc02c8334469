package activator

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/activator/activator/internal/connlimit"
	"github.com/activator/activator/internal/registry"
)

// loopRig is one route behind an edge with its event loop (EnableLoop), as cmd/activator builds it
// (serveWithLoop): the framing listener, a connection cap of capN (0: none) and the resume server.
func loopRig(t *testing.T, upstream http.Handler, capN int) (*edgeRig, *connlimit.Limit) {
	t.Helper()
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	r := testRoute("app")
	r.Upstream.Address = up.Listener.Addr().String()
	b := &fakeBackend{}
	s := New(Options{Opener: fakeProvider{b}, Logger: slog.New(slog.DiscardHandler),
		NewGate: func(*registry.Route) Gate { return passGate{} }})
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{r}}); err != nil {
		t.Fatal(err)
	}
	g := &edgeRig{s: s, in: s.instance("app"), b: b, closed: make(chan struct{}, 4096)}
	var lim *connlimit.Limit
	if capN > 0 {
		lim = connlimit.New(capN, nil)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g.addr = serveWithLoop(t, s, ln, loopWiring{edge: registry.EdgeLimits{SendTimeout: time.Minute}, cap: lim})
	return g, lim
}

// countingApp answers every request with its path and the client address the edge passed on, and
// counts them; /chunked answers without a Content-Length.
func countingApp(n *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		body := r.Method + " " + r.URL.RequestURI() + " xff=" + r.Header.Get("X-Forwarded-For") + " ua=" + r.Header.Get("User-Agent")
		if r.URL.Path == "/chunked" {
			w.Write([]byte(body))
			w.(http.Flusher).Flush()
			w.Write([]byte(" more"))
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		io.WriteString(w, body)
	})
}

// keepAlive sends each request on one connection and returns the answers.
func keepAlive(t *testing.T, g *edgeRig, reqs ...string) []reply {
	t.Helper()
	c := g.dial(t)
	br := bufio.NewReader(c)
	var out []reply
	for _, head := range reqs {
		if err := send(c, head, nil); err != nil {
			t.Fatal(err)
		}
		method, _, _ := strings.Cut(head, " ")
		rep, err := readReply(br, method)
		if err != nil {
			t.Fatalf("%q: %v", head, err)
		}
		out = append(out, rep)
	}
	return out
}

// TestLoopServesWarmKeepAlive: after the first request, net/http's, the loop serves a keep-alive
// connection's GETs, each answered as net/http answers it and sent upstream once.
func TestLoopServesWarmKeepAlive(t *testing.T) {
	var n atomic.Int64
	g, _ := loopRig(t, countingApp(&n), 0)
	g.wake(t)
	woke := n.Load()
	var reqs []string
	for i := range 20 {
		reqs = append(reqs, fmt.Sprintf("GET /p%d?q=%d HTTP/1.1\nHost: app.test\nUser-Agent: t", i, i))
	}
	for i, rep := range keepAlive(t, g, reqs...) {
		want := fmt.Sprintf("GET /p%d?q=%d xff=127.0.0.1 ua=t", i, i)
		if rep.code != 200 || rep.body != want || rep.closed {
			t.Fatalf("request %d: %d %q closed=%v, want 200 %q", i, rep.code, rep.body, rep.closed, want)
		}
		if rep.h.Get("Date") == "" || rep.h.Get("Content-Type") == "" {
			t.Errorf("request %d: no Date or Content-Type: %v", i, rep.h)
		}
	}
	if got := n.Load() - woke; got != 20 {
		t.Errorf("the tenant got %d requests, want 20 (each sent once)", got)
	}
	if s := g.s.loops.Served(); s != 19 {
		t.Errorf("the loop served %d requests, want 19 (all but the first, net/http's)", s)
	}
}

// TestLoopGivesBack: a request outside the loop's subset goes back to net/http with the connection,
// is answered by it, and the connection stays with net/http; a chunked answer is passed on by
// net/http from the loop's upstream connection, the request sent once.
func TestLoopGivesBack(t *testing.T) {
	var n atomic.Int64
	g, _ := loopRig(t, countingApp(&n), 0)
	g.wake(t)
	base := n.Load()
	reps := keepAlive(t, g,
		"GET /a HTTP/1.1\nHost: app.test",
		"GET /b HTTP/1.1\nHost: app.test",
		"HEAD /c HTTP/1.1\nHost: app.test",
		"GET /d HTTP/1.1\nHost: app.test",
		"GET /nowhere HTTP/1.1\nHost: other.test")
	for i, want := range []int{200, 200, 200, 200, 404} {
		if reps[i].code != want {
			t.Errorf("answer %d: %d, want %d", i, reps[i].code, want)
		}
	}
	if reps[1].body != "GET /b xff=127.0.0.1 ua=" || reps[3].body != "GET /d xff=127.0.0.1 ua=" {
		t.Errorf("bodies %q, %q", reps[1].body, reps[3].body)
	}
	if got := n.Load() - base; got != 4 {
		t.Errorf("the tenant got %d requests, want 4", got)
	}
	if s := g.s.loops.Served(); s != 1 {
		t.Errorf("the loop served %d, want 1 (/b; the HEAD went back, and the connection stayed with net/http)", s)
	}

	base = n.Load()
	reps = keepAlive(t, g,
		"GET /a HTTP/1.1\nHost: app.test",
		"GET /chunked HTTP/1.1\nHost: app.test",
		"GET /e HTTP/1.1\nHost: app.test")
	if reps[1].code != 200 || reps[1].body != "GET /chunked xff=127.0.0.1 ua= more" {
		t.Errorf("chunked answer: %d %q", reps[1].code, reps[1].body)
	}
	if reps[2].code != 200 || reps[2].body != "GET /e xff=127.0.0.1 ua=" {
		t.Errorf("after it: %d %q", reps[2].code, reps[2].body)
	}
	if got := n.Load() - base; got != 3 {
		t.Errorf("the tenant got %d requests, want 3 (the chunked one sent once)", got)
	}
}

// TestLoopConnectionCap: an idle connection the loop has is closed for room at the cap, as net/http's
// idle connections are, and its place is given back.
func TestLoopConnectionCap(t *testing.T) {
	var n atomic.Int64
	g, lim := loopRig(t, countingApp(&n), 1)
	g.wake(t)
	c := g.dial(t)
	br := bufio.NewReader(c)
	for _, p := range []string{"/a", "/b"} {
		if err := send(c, "GET "+p+" HTTP/1.1\nHost: app.test", nil); err != nil {
			t.Fatal(err)
		}
		if rep, err := readReply(br, "GET"); err != nil || rep.code != 200 {
			t.Fatalf("%s: %v %v", p, rep.code, err)
		}
	}
	if g.s.loops.Served() != 1 {
		t.Fatalf("the loop served %d, want 1", g.s.loops.Served())
	}
	if code, _, _ := g.get(t, "/new", nil); code != 200 {
		t.Fatalf("a new connection at the cap: %d", code)
	}
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("the loop's idle connection was not closed for room")
	}
	if st := lim.Stats(); st.Open > 1 {
		t.Errorf("%d connections counted open, cap 1", st.Open)
	}
}

// TestLoopSlowClientKeepsItsAnswer: a client whose socket does not take its answer at once gets the
// rest whole, although the loop answers another client meanwhile. The loop makes each answer in one
// buffer of its own (warmloop's ob), and a client it could not write all of to keeps a copy; without
// the copy the other client's answers were written over the first one's rest.
func TestLoopSlowClientKeepsItsAnswer(t *testing.T) {
	// Larger than the socket buffers of a loopback connection: the loop's writes to the client that
	// does not read stall part way through one of its reads from the tenant.
	const size, others = 16 << 20, 40
	big := make([]byte, size)
	for i := range big {
		big[i] = byte('a' + (i*7+i/4099)%26)
	}
	other := []byte(strings.Repeat("Z", 64<<10))
	var n atomic.Int64
	count := countingApp(&n)
	g, _ := loopRig(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			w.Header().Set("Content-Length", fmt.Sprint(size))
			w.Write(big)
		case "/other":
			// As long as one read of the loop's, so that it is made over all of the loop's buffer.
			w.Header().Set("Content-Length", fmt.Sprint(len(other)))
			w.Write(other)
		default:
			count.ServeHTTP(w, r)
		}
	}), 0)
	g.wake(t)
	served := g.s.loops.Served()
	slow := g.dial(t)
	sbr := bufio.NewReader(slow)
	// A connection's first request is net/http's; the loop takes the next.
	if err := send(slow, "GET /first HTTP/1.1\nHost: app.test", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := readReply(sbr, "GET"); err != nil {
		t.Fatal(err)
	}
	if err := send(slow, "GET /big HTTP/1.1\nHost: app.test", nil); err != nil {
		t.Fatal(err)
	}
	// Not read yet: the loop's writes to it stall. Another client's answers, meanwhile.
	var reqs []string
	for range others {
		reqs = append(reqs, "GET /other HTTP/1.1\nHost: app.test")
	}
	for i, rep := range keepAlive(t, g, reqs...) {
		if rep.code != 200 || rep.body != string(other) {
			t.Fatalf("the other client's request %d: %d, %d bytes, want 200 and %d", i, rep.code, len(rep.body), len(other))
		}
	}
	rep, err := readReply(sbr, "GET")
	if err != nil {
		t.Fatal(err)
	}
	if rep.code != 200 || rep.body != string(big) {
		at := 0
		for at < min(len(rep.body), size) && rep.body[at] == big[at] {
			at++
		}
		t.Fatalf("the slow client's answer: %d, %d bytes, differing from the tenant's from byte %d, want 200 and its %d bytes", rep.code, len(rep.body), at, size)
	}
	if got := g.s.loops.Served() - served; got != 40 {
		t.Errorf("the loop served %d requests, want 40 (the big one and the other client's after its first)", got)
	}
}
