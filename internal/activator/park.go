package activator

// Parking: a request held on a plain HTTP/1 connection gives its connection back to the activator
// for the length of the hold.
//
// In net/http a connection whose request is in its handler keeps its goroutine (with a stack as deep as
// the handler's), a second goroutine for the background read that notices the client leaving, and 10
// KiB of buffers: 4 KiB to read, 4 KiB to write and 2 KiB for the response. Measured with a herd of
// 1,000 held requests (BenchmarkHerd, HERD_HEAP_PROFILE): the buffers were 10 of the 14.5 KiB of heap
// each held request kept, and the two stacks 6 more. A held request needs none of it until it is
// answered. So the edge hijacks the connection of a request it is about to hold (its body already
// buffered whole: takeBody), keeps the parsed request, and holds it in a small goroutine of its own
// (hold). The client leaving is noticed as net/http's background read would notice it: by one epoll
// instance for all parked connections (park_linux.go), or where that cannot be had by a goroutine per
// connection reading one byte (watch). When the hold ends (the tenant is awake, or the answer is an
// error) the connection goes back to net/http: a second http.Server (EnableParking's resume server,
// with the edge's limits) serves it as a new connection whose first bytes are a stand-in request
// line made from the held request (method, HTTP version, keep-alive), then whatever the client sent
// after the held request, then the connection itself. The resume server's handler takes the stand-in
// for the held request and answers it exactly as the edge would have (answer): the proxied response,
// or the hold's error with its Retry-After, Server-Timing and wake id; net/http frames it for the
// stand-in, whose method, version and Connection field are the held request's. Later requests on
// the connection go through the whole edge handler, and one of them held again parks the connection
// under the hand-back's wrapper.
//
// The hand-back costs an answer tens of microseconds (BenchmarkHeldRequest: 0.41 against 0.39 ms for a
// request through an instant wake), so only a herd parks: requests held while fewer than parkAbove are
// held across the edge wait in net/http. And only what net/http can carry across the hand-back is
// parked: HTTP/1.x without TLS (a *tls.Conn handed to another server as a plain conn would lose
// r.TLS), a body buffered whole (a streamed body is read from the connection after the hold), no
// Upgrade (h2c and WebSocket upgrades hold as before), no header set for the answer yet, and a route
// that is not awake. Everything else, and every request when parking is not enabled (handlers served
// without EnableParking, as most unit tests do), holds in its net/http goroutine as before.

import (
	"context"
	"errors"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/activator/activator/internal/bodybuf"
)

// EnableParking makes the edge park the requests it holds on plain HTTP/1 connections (see above):
// resume serves their connections again once the hold is over, with next (the edge's handler) for every
// request after the held one. resume must have the edge's limits and ConnContext (activator's) and
// nothing else serving it; EnableParking sets its Handler. Call it before the edge serves, once; the
// caller shuts resume down after Shutdown, which waits for every parked request to be in its handler there.
func (s *Server) EnableParking(resume *http.Server, next http.Handler) {
	resume.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := resumedRequest(r); p != nil {
			s.serveParked(w, r, p)
			return
		}
		if x := loopFinished(r); x != nil {
			s.serveFinished(w, r, x)
			return
		}
		next.ServeHTTP(w, r)
	})
	s.resume, s.parkAbove = resume, parkAbove
	if n := s.opts.ParkAbove; n != 0 {
		s.parkAbove = max(int64(n), 0)
	}
}

// parkAbove is how many requests the edge holds, across routes, before it parks the next ones. Below
// it a held request stays in net/http: parking saves its few KiB but costs its answer the hand-back
// (a syscall to watch the socket, a goroutine, the stand-in parsed, net/http's buffers made again:
// tens of microseconds here), which a wake of one or a few requests should not pay. A herd's
// memory is what parking is for.
const parkAbove = 64

// parkable reports whether r, about to be held on rt, can be parked.
func (s *Server) parkable(r *http.Request, rt *routed) bool {
	return s.resume != nil && s.held.n.Load() >= s.parkAbove && r.ProtoMajor == 1 && !overTLS(r) && r.Method != http.MethodConnect &&
		rt.in.route.RequestBuffering && r.Header.Get("Upgrade") == "" && !rt.in.awake.Load() && !rt.in.ignores(r)
}

// park hijacks r's connection and holds r in a goroutine of its own, which hands the connection to
// the resume server once the hold is over. It reports false, having done nothing, when r cannot be
// parked: the caller holds it as usual.
func (s *Server) park(w http.ResponseWriter, r *http.Request, rt *routed, body *bodybuf.Body, charge holdCharge) bool {
	if !s.parkable(r, rt) || len(w.Header()) > 0 || !s.parking.add() {
		return false // (a header already set for the answer would not survive the hand-back)
	}
	_, closing := w.(*closingWriter)
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		s.parking.done()
		return false
	}
	// What net/http read past the request (a pipelined request, rarely) comes back first.
	var pending []byte
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		pending = append(make([]byte, 0, n+1), b...)
	}
	if rc, ok := conn.(*resumedConn); ok {
		// Parked before, on this keep-alive connection: park the connection under it, or each hold
		// would wrap it once more (every read through all of them). What the wrapper has not yet
		// handed to net/http comes after what net/http has buffered.
		conn, pending = rc.Conn, append(pending, rc.prefix...)
	}
	// The hold's context keeps the request's values, but not its end: net/http cancels that once the
	// handler has returned, which it does now.
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	p := &parkedReq{s: s, conn: conn, req: r.WithContext(ctx), cancel: cancel, rt: rt, body: body,
		charge: charge, closing: closing, pending: pending, watched: make(chan struct{})}
	if !s.hangups().add(p) {
		go p.watch()
	}
	go p.hold()
	return true
}

// hangups is the Server's watcher of parked clients hanging up, made at the first park; nil where
// there is none (park_other.go, or epoll failing): each parked request then watches its own.
func (s *Server) hangups() *hangups {
	s.hangOnce.Do(func() { s.hang = newHangups() })
	return s.hang
}

// parkedReq is one parked request, from park to its answer on the resume server.
type parkedReq struct {
	s       *Server
	conn    net.Conn
	req     *http.Request // with the hold's context
	cancel  context.CancelFunc
	rt      *routed
	body    *bodybuf.Body
	charge  holdCharge
	closing bool // the edge answers it with "Connection: close" (closingWriter)

	// Written by watch before it closes watched, or (gone) by the Server's hangups under its lock.
	pending []byte // bytes the client sent after the request
	gone    bool   // the client closed the connection or it failed

	watched  chan struct{}   // closed when watch returns; unused when hangups watches
	sock     syscall.RawConn // the socket hangups watches, under hangupID; nil: watch does
	hangupID uint64

	// The hold's outcome, for serveParked.
	release func()
	err     error
}

// watch reads the parked connection until the client sends a byte (kept for the resume server, and
// the watch ends, as net/http's background read does), closes it or it fails (the hold is given up),
// or hold stops it with a read deadline in the past.
func (p *parkedReq) watch() {
	defer close(p.watched)
	var b [1]byte
	n, err := p.conn.Read(b[:])
	switch {
	case n > 0:
		p.pending = append(p.pending, b[0])
	case err != nil && !isTimeout(err): // a timeout is hold's deadline, stopping the watch
		p.gone = true
		p.cancel()
	}
}

// hold waits out the hold as the edge's handler would (acquireRequest), then stops the watch and hands
// the connection over, or closes it when the client has gone.
func (p *parkedReq) hold() {
	var (
		release func()
		err     error
	)
	p.rt, release, err = p.s.acquireRouted(p.rt, p.req, &p.charge)
	// A herd's requests all leave the hold before any is handed back (awaitSettled).
	if a := p.charge.handedBy; a != nil {
		a.awaitSettled(p.req.Context())
	} else {
		runtime.Gosched() // an error's answer is cheaper, but not free either
	}
	if p.sock != nil {
		p.gone = p.s.hang.remove(p)
	} else {
		_ = p.conn.SetReadDeadline(time.Unix(1, 0))
		<-p.watched
		_ = p.conn.SetReadDeadline(time.Time{})
	}
	p.release, p.err = release, err
	if p.gone {
		p.abandon(499) // nobody is there to answer (the metrics see 499, as statusWriter.fail counts it)
		return
	}
	rc := &resumedConn{Conn: p.conn, prefix: append(standIn(p.req), p.pending...)}
	rc.p.Store(p)
	l := &oneConn{c: rc}
	_ = p.s.resume.Serve(l)
	if !l.taken {
		// The resume server has shut down, which it does only after Shutdown has returned, and that
		// waits for every parked request to reach its handler: not expected, but answered all the same.
		p.abandon(http.StatusServiceUnavailable)
	}
}

// abandon ends a parked request that no handler answers: the client hung up (code 499), or the resume
// server did not take its connection or dropped it before its handler ran (503, written here, plain,
// with Retry-After). Its hold's outcome is given back, its body released, its connection closed.
func (p *parkedReq) abandon(code int) {
	if p.release != nil {
		p.release() // the wake succeeded just as the client left
	}
	p.charge.give() // no answer follows to give it (answer)
	p.cancel()
	p.body.Close()
	if code == http.StatusServiceUnavailable {
		const msg = "the activator is shutting down\n"
		_, _ = p.conn.Write([]byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
			strconv.Itoa(len(msg)) + "\r\n\r\n" + msg))
	}
	p.conn.Close()
	p.rt.count(code)
	p.s.parking.done()
}

// standIn is the request line and header the resume server parses in place of the held request: its
// method, its HTTP version and whether its connection is kept alive, which are what net/http frames
// an answer by (no body for HEAD, chunked only for HTTP/1.1, Connection: close). The rest of the request
// is the held one, which serveParked answers.
func standIn(r *http.Request) []byte {
	b := make([]byte, 0, 64)
	b = append(b, r.Method...)
	if r.ProtoMinor == 0 {
		b = append(b, " / HTTP/1.0\r\n"...)
		if !r.Close {
			b = append(b, "Connection: keep-alive\r\n"...)
		}
	} else {
		b = append(b, " / HTTP/1.1\r\nHost: parked\r\n"...)
		if r.Close {
			b = append(b, "Connection: close\r\n"...)
		}
	}
	return append(b, "\r\n"...)
}

// serveParked answers parked request p on the resume server, where w belongs to the stand-in
// request r: p's request with its own values and r's end (the client leaving now), written as the edge
// would have written it.
func (s *Server) serveParked(w http.ResponseWriter, r *http.Request, p *parkedReq) {
	// In a handler now, which the resume server's Shutdown waits for like any other.
	s.parking.done()
	ctx, cancel := context.WithCancel(context.WithoutCancel(p.req.Context()))
	stop := context.AfterFunc(r.Context(), cancel)
	defer func() {
		stop()
		cancel()
		p.cancel()
	}()
	if p.closing {
		w = &closingWriter{ResponseWriter: w}
	}
	sw := &statusWriter{ResponseWriter: w}
	defer func() {
		p.rt.count(sw.statusCode())
		sw.abortIfGone()
	}()
	defer p.body.Close()
	s.answer(sw, p.req.WithContext(ctx), p.rt.in, &p.charge, p.release, p.err)
}

// resumedConn is a parked connection as the resume server reads it: the stand-in request and what the
// client sent meanwhile, then the connection.
type resumedConn struct {
	net.Conn
	prefix []byte                    // read by one goroutine at a time (net/http's)
	p      atomic.Pointer[parkedReq] // taken by the connection's first request (resumedRequest)
}

// NetConn returns the parked connection c serves again, as *tls.Conn's does (see framingConn's).
func (c *resumedConn) NetConn() net.Conn { return c.Conn }

// Close closes the connection. net/http closes one without calling its handler when the resume
// server shuts down between reading the stand-in and serving it: the parked request is then abandoned
// here, with its 503.
func (c *resumedConn) Close() error {
	if p := c.p.Swap(nil); p != nil {
		p.abandon(http.StatusServiceUnavailable) // closes c.Conn
		return nil
	}
	return c.Conn.Close()
}

func (c *resumedConn) Read(b []byte) (int, error) {
	if len(c.prefix) == 0 {
		return c.Conn.Read(b)
	}
	n := copy(b, c.prefix)
	c.prefix = c.prefix[n:]
	return n, nil
}

// resumedKey is the request context key of a resumed connection (ConnContext).
type resumedKey struct{}

// resumedRequest returns the parked request r stands in for: r is the first request on a resumed
// connection. Later requests on it get nil.
func resumedRequest(r *http.Request) *parkedReq {
	if rc, ok := r.Context().Value(resumedKey{}).(*resumedConn); ok {
		return rc.p.Swap(nil)
	}
	return nil
}

// oneConn is a listener that accepts one connection, then ends the Serve that accepts from it.
type oneConn struct {
	c     net.Conn
	taken bool
}

var errOneConn = errors.New("parked connection handed over")

func (l *oneConn) Accept() (net.Conn, error) {
	if l.taken {
		return nil, errOneConn
	}
	l.taken = true
	return l.c, nil
}

func (l *oneConn) Close() error   { return nil }
func (l *oneConn) Addr() net.Addr { return l.c.LocalAddr() }

// parkCount counts the parked requests not yet in the resume server's handler (or abandoned), for
// Shutdown.
type parkCount struct {
	mu     sync.Mutex
	n      int
	closed bool          // set by wait: no more parking
	zero   chan struct{} // closed when n falls to 0 while wait waits
}

// add counts one more parked request, unless wait has been called.
func (c *parkCount) add() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.n++
	return true
}

func (c *parkCount) done() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n--; c.n == 0 && c.zero != nil {
		close(c.zero)
		c.zero = nil
	}
}

// wait ends parking and returns once every parked request is in a handler or abandoned, or with ctx's
// error.
func (c *parkCount) wait(ctx context.Context) error {
	c.mu.Lock()
	c.closed = true
	if c.n == 0 {
		c.mu.Unlock()
		return nil
	}
	if c.zero == nil {
		c.zero = make(chan struct{})
	}
	zero := c.zero
	c.mu.Unlock()
	select {
	case <-zero:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
