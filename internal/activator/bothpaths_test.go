package activator

// The edge's two HTTP/1.1 paths under one set of tests. With edge.event_loops on, a keep-alive
// connection's later requests are read by the event loop (loop.go, internal/warmloop), which serves a
// strict subset itself and hands everything else back to net/http. Issue 17: any HTTP/1.1 server path
// of our own must pass the same conformance and fuzz tests as the rest of the edge. So the conformance
// tests take each case over both paths: net/http's, the reference (the request under test is the first
// on a new connection, which net/http reads), and the loop's (the request under test follows, on the
// same connection, requests the loop has served). conformEdge is an edge built for both.

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/activator/activator/internal/connlimit"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
	"github.com/activator/activator/internal/warmloop"
)

// edgePath is one way a request under test reaches the edge.
type edgePath struct {
	name string
	loop bool // on a connection the loop owns; else the first request of a new connection, net/http's
}

// edgePaths are both paths; netHTTPOnly is for the cases that cannot reach the loop (a listener it
// never takes connections from: PROXY protocol, TLS, no framing record).
var (
	edgePaths   = []edgePath{{"net/http", false}, {"loop", true}}
	netHTTPOnly = []edgePath{{"net/http", false}}
)

// conformEdge is an edge with its event loop on, served as cmd/activator serves its plain listener with
// edge.event_loops set (serveWithLoop). Its
// config has, beside the routes under test, a route "warm" (Host warm.test) with a tenant and a
// backing of its own: the requests that give a connection to the loop go there, so that they wake
// nothing a test counts, reach no tenant a test watches, and leave every route under test free to do
// what it likes (a route whose answer went back to net/http is left to net/http for a minute: loopOff).
type conformEdge struct {
	s     *Server
	addr  string
	cfg   registry.Config
	pause loopPause
}

// conformConfig is what a conformEdge is built of.
type conformConfig struct {
	routes  []*registry.Route
	b       *fakeBackend // the routes' backing, whose health gates pass; nil: a new one
	logs    io.Writer    // nil: nowhere
	edge    registry.EdgeLimits
	metrics *Metrics         // nil: none
	now     func() time.Time // the Server's clock; nil: time.Now
	// sendBuffer, when above 0, is each client connection's send buffer (SO_SNDBUF): with a small
	// one the edge's writes wait for the client's reads, a few KiB at a time, rather than filling
	// megabytes.
	sendBuffer int
	// upstreamIdle, when above 0, is how long the loop keeps an idle upstream connection.
	upstreamIdle time.Duration
}

// warmOpener opens the warm route on its own backing and the others on theirs.
type warmOpener struct {
	warm, rest tenant.Backend
}

func (o warmOpener) Open(r *registry.Route) (tenant.Backend, error) {
	if r.Name == "warm" {
		return o.warm, nil
	}
	return o.rest, nil
}

// newConformEdge serves c on a loopback port until cleanup.
func newConformEdge(t testing.TB, c conformConfig) *conformEdge {
	t.Helper()
	if c.b == nil {
		c.b = &fakeBackend{}
	}
	if c.logs == nil {
		c.logs = io.Discard
	}
	warmUp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "warm") // net/http frames it by its length, as the loop needs
	}))
	t.Cleanup(warmUp.Close)
	warm := testRoute("warm")
	warm.Upstream.Address = warmUp.Listener.Addr().String()

	e := &conformEdge{}
	e.s = New(Options{
		Opener:  warmOpener{warm: &fakeBackend{}, rest: c.b},
		Logger:  slog.New(slog.NewTextHandler(c.logs, nil)),
		NewGate: func(*registry.Route) Gate { return passGate{} },
		Metrics: c.metrics,
		Now:     c.now,
	})
	e.cfg = registry.Config{Edge: c.edge, Routes: append(c.routes, warm)}
	if err := e.s.Apply(&e.cfg); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if c.sendBuffer > 0 {
		ln = sendBufferListener{ln, c.sendBuffer}
	}
	e.addr = serveWithLoop(t, e.s, ln, loopWiring{edge: c.edge, hook: e.pause.hook, upstreamIdle: c.upstreamIdle})
	return e
}

// loopWiring is how serveWithLoop serves an edge: with edge's limits, behind a connection cap (nil:
// none), and with hook (nil: none) hearing, beside the cap, the states of the connections the loop has.
type loopWiring struct {
	edge registry.EdgeLimits
	cap  *connlimit.Limit
	hook func(net.Conn, http.ConnState)
	// upstreamIdle: the loop's Limits.UpstreamIdleTimeout (0: its default).
	upstreamIdle time.Duration
}

// serveWithLoop serves s on ln, with one event loop, as cmd/activator serves its plain listener with
// edge.event_loops set (serve.go: newEdgeServers, edgeParts, loopLimits): the framing record,
// ConnContext, HTTP/1 and h2c, max_header_bytes as edgeMaxHeaderBytes sets it, the resume server of
// parking (which serves what the loop gives back) and EnableLoop; the header timeout is edge's, or
// hygienePatience when edge has none, and the keep-alive timeout edge's, or a minute. It serves until cleanup,
// which shuts s down and fails the test if that fails, and returns ln's address.
func serveWithLoop(t testing.TB, s *Server, ln net.Listener, w loopWiring) string {
	t.Helper()
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	headerTimeout, idleTimeout := hygienePatience, time.Minute
	if w.edge.HeaderTimeout > 0 {
		headerTimeout = w.edge.HeaderTimeout
	}
	if w.edge.KeepAliveTimeout > 0 {
		idleTimeout = w.edge.KeepAliveTimeout
	}
	server := func(h http.Handler) *http.Server {
		hs := &http.Server{Handler: h, ReadHeaderTimeout: headerTimeout, IdleTimeout: idleTimeout, Protocols: &protocols,
			ConnContext: ConnContext}
		if w.edge.MaxHeaderBytes > 0 {
			hs.MaxHeaderBytes = int(max(w.edge.MaxHeaderBytes-4096-14, 1)) // cmd/activator's edgeMaxHeaderBytes
		}
		return hs
	}
	front, resume := server(s), server(nil)
	s.EnableParking(resume, s)
	state := w.hook
	if w.cap != nil {
		ln = w.cap.Listener(ln)
		front.ConnState, resume.ConnState = w.cap.ConnState, w.cap.ResumedConnState
		state = func(c net.Conn, st http.ConnState) {
			if w.hook != nil {
				w.hook(c, st)
			}
			w.cap.ResumedConnState(c, st)
		}
	}
	maxHead := int64(8 << 10)
	if w.edge.MaxHeaderBytes > 0 {
		maxHead = min(w.edge.MaxHeaderBytes, maxHead)
	}
	lim := warmloop.Limits{MaxHead: int(maxHead), HeaderTimeout: headerTimeout, IdleTimeout: idleTimeout, SendTimeout: w.edge.SendTimeout, UpstreamIdleTimeout: w.upstreamIdle}
	if err := s.EnableLoop(1, lim, state); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- front.Serve(Listener(ln, w.edge.SendTimeout)) }()
	t.Cleanup(func() {
		front.Close()
		<-served
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		_ = resume.Close()
	})
	return ln.Addr().String()
}

// conn opens a connection from source ("": the loopback's default address) whose next request takes
// path p. On the loop's path the connection has carried two GETs of the warm route, the second served
// by the loop: the loop owns it.
func (e *conformEdge) conn(t *testing.T, p edgePath, source string) *rawConn {
	t.Helper()
	d := &net.Dialer{}
	if source != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(source)}
	}
	return e.dialConn(t, p, d)
}

// dialConn is conn with a dialer of the caller's; one with a LocalAddr that cannot be had skips the
// test.
func (e *conformEdge) dialConn(t *testing.T, p edgePath, d *net.Dialer) *rawConn {
	t.Helper()
	c, err := d.Dial("tcp", e.addr)
	if err != nil {
		if d.LocalAddr != nil {
			t.Skipf("cannot connect from %s: %v", d.LocalAddr, err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.SetDeadline(time.Now().Add(hygienePatience)); err != nil {
		t.Fatal(err)
	}
	rc := &rawConn{t: t, c: c, br: bufio.NewReader(c)}
	if p.loop {
		e.giveToLoop(t, rc)
	}
	return rc
}

// giveToLoop sends two GETs of the warm route on rc: net/http serves the first and hands the
// connection to the loop, which serves the second. It fails the test when the loop did not serve it.
func (e *conformEdge) giveToLoop(t *testing.T, rc *rawConn) {
	t.Helper()
	before := e.s.loops.Served()
	for range 2 {
		rc.send("GET /warm HTTP/1.1\r\nHost: warm.test\r\n\r\n")
		resp, body, err := rc.next()
		if err != nil {
			t.Fatalf("a warm GET: %v", err)
		}
		if resp.StatusCode != http.StatusOK || body != "warm" || resp.Close {
			t.Fatalf("a warm GET: %d %q, close %v", resp.StatusCode, body, resp.Close)
		}
	}
	// The loop counts an answer before the client can read it.
	if e.s.loops.Served() == before {
		t.Fatal("the loop did not serve the second warm GET: it does not own the connection")
	}
}

// exchange sends raw on a connection of path p and reads one answer.
func (e *conformEdge) exchange(t *testing.T, p edgePath, raw string) (*http.Response, string) {
	t.Helper()
	rc := e.conn(t, p, "")
	rc.send(raw)
	resp, body, err := rc.next()
	if err != nil {
		t.Fatalf("%q: %v", raw, err)
	}
	return resp, body
}

// wake wakes the named routes by the admin API's way, without a request: so that the loop serves
// theirs itself (it hands back a request to a route that is not awake, for net/http to hold), and
// without an upstream connection made for it.
func (e *conformEdge) wake(t *testing.T, routes ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for _, r := range routes {
		if err := e.s.Wake(ctx, r); err != nil {
			t.Fatalf("waking %s: %v", r, err)
		}
	}
}

// apply applies the config again with mut's changes (the warm route stays).
func (e *conformEdge) apply(t *testing.T, mut func(*registry.Config)) {
	t.Helper()
	cfg := e.cfg
	cfg.Routes = append([]*registry.Route(nil), e.cfg.Routes...)
	mut(&cfg)
	if err := e.s.Apply(&cfg); err != nil {
		t.Fatal(err)
	}
}

// sendBufferListener gives each TCP connection it accepts a send buffer of size bytes.
type sendBufferListener struct {
	net.Listener
	size int
}

func (l sendBufferListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(l.size)
	}
	return c, err
}

// loopPause stops the loop's thread, once armed, at its next report of a connection's state (the
// Owner's Idle, which the loop calls on its thread as a request begins and ends), until resumed: what
// arrives meanwhile waits in the sockets, as it does under load while the loop serves others. Its hook
// is a conformEdge's connection-state hook.
type loopPause struct {
	mu      sync.Mutex // guards the fields below
	stopped chan struct{}
	resume  chan struct{}
}

// arm stops the loop at its next report; stopped is closed once it is stopped, and resume lets it go
// on (by patience at the latest).
func (p *loopPause) arm() (stopped <-chan struct{}, resume func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped, p.resume = make(chan struct{}), make(chan struct{})
	r := p.resume
	var once sync.Once
	return p.stopped, func() { once.Do(func() { close(r) }) }
}

func (p *loopPause) hook(net.Conn, http.ConnState) {
	p.mu.Lock()
	stopped, resume := p.stopped, p.resume
	p.stopped, p.resume = nil, nil
	p.mu.Unlock()
	if stopped == nil {
		return
	}
	close(stopped)
	select {
	case <-resume:
	case <-time.After(patience):
	}
}
