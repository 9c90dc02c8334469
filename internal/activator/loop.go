package activator

// The edge's side of its event loop (internal/warmloop, edge.event_loop): which connections go to the
// loop, what the loop may serve, and how connections come back.
//
// A connection goes to the loop after net/http has served a request on it that the loop could have
// served (loopable): a GET over plain HTTP/1.1, kept alive, answered by an awake route's tenant with a
// Content-Length. The handler hijacks it, takes a duplicate of its socket and closes the *net.TCPConn
// under its layers, which takes the socket out of Go's netpoller: left in it, every request the loop
// serves would wake the runtime's poller too. The layers stay: the edge's connection cap counts the
// connection until the loop closes it, and closing it for room reaches the loop (loopSock). The
// loop serves the requests it can (warmloop.Parse's subset, to routes awake and not fleets or
// filtered: Begin) and gives anything else back, with the bytes it has read, to the resume server
// (park.go's), which serves the connection as net/http would have: the request first (HandBack).
// An exchange whose answer the loop does not relay (not plain, or no whole head within
// response_timeout) goes back with its upstream connection, and net/http passes that answer on
// (Finish); one that failed before a whole head goes back with its error, which net/http answers as
// its own exchange's, without sending the request again. A connection
// the loop gave back is not taken again: a client whose requests fall outside the loop's subset would
// otherwise go back and forth.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/activator/activator/internal/connlimit"
	"github.com/activator/activator/internal/upstream"
	"github.com/activator/activator/internal/waitpage"
	"github.com/activator/activator/internal/warmloop"
)

// LoopServed is how many requests the event loops have answered themselves (0 without loops): the
// rest of the edge's requests were net/http's.
func (s *Server) LoopServed() uint64 {
	if s.loops == nil {
		return 0
	}
	return s.loops.Served()
}

// EnableLoop makes the edge hand warm keep-alive connections to loops (see above). connState is the
// connection cap's hook for connections handed over mid-request (connlimit's ResumedConnState), nil
// for none. Call it after EnableParking, whose resume server serves what the loop gives back, and
// before the edge serves; Shutdown drains the loops.
func (s *Server) EnableLoop(loops int, lim warmloop.Limits, connState func(net.Conn, http.ConnState)) error {
	if s.resume == nil {
		return fmt.Errorf("event loop: parking must be enabled first (its resume server serves what the loop gives back)")
	}
	g, err := warmloop.New(loops, (*loopEdge)(s), lim)
	if err != nil {
		return fmt.Errorf("event loop: %w", err)
	}
	s.loops, s.loopConnState = g, connState
	return nil
}

// loopOff is how long a route's connections stay with net/http after an answer the loop could not
// relay: a tenant whose answers are chunked would otherwise have each of them go to the loop and back.
const loopOff = time.Minute

// loopable reports whether r's connection may go to the loop once r is answered (see above): r was
// served by in's tenant with an answer framed by its Content-Length, on a connection the loop has not
// given back before, whose socket is a TCP connection under the edge's own layers alone.
func (s *Server) loopable(sw *statusWriter, r *http.Request, in *instance) bool {
	if s.loops == nil || r.Method != http.MethodGet || r.ProtoMajor != 1 || r.ProtoMinor != 1 || r.Close ||
		r.ContentLength != 0 || len(r.TransferEncoding) > 0 || r.TLS != nil || sw.gone {
		return false
	}
	lt := s.loopTarget(in)
	if lt == nil || in.fleet != nil || in.filter != nil || !in.awake.Load() || time.Now().UnixNano() < lt.offUntil.Load() {
		return false
	}
	if c := sw.code; c < 200 || c == http.StatusNoContent || c == http.StatusNotModified {
		return false
	}
	h := sw.Header()
	if cl, err := strconv.ParseInt(h.Get("Content-Length"), 10, 64); err != nil || cl != sw.n || h.Get("Connection") != "" {
		return false
	}
	ctx := r.Context()
	if ctx.Value(loopBackKey{}) != nil || ctx.Value(resumedKey{}) != nil {
		return false
	}
	fc, ok := ctx.Value(framingKey{}).(*framingConn)
	return ok && socketUnder(fc) != nil
}

// socketUnder returns the TCP connection right under fc, or under the connection cap's layer under
// it; nil for any other (a PROXY-protocol reader, whose own buffer may hold bytes, or TLS).
func socketUnder(fc *framingConn) *net.TCPConn {
	c := fc.Conn
	if under, ok := connlimit.Under(c); ok {
		c = under
	}
	tc, _ := c.(*net.TCPConn)
	return tc
}

// toLoop hands r's connection to the loop, when loopable says it may go: after r's answer is out.
func (s *Server) toLoop(w http.ResponseWriter, sw *statusWriter, r *http.Request, in *instance) {
	if !s.loopable(sw, r, in) {
		return
	}
	fc := r.Context().Value(framingKey{}).(*framingConn)
	tc := socketUnder(fc)
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return
	}
	conn, brw, err := rc.Hijack()
	if err != nil {
		return
	}
	var pending []byte
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		pending = append([]byte(nil), b...)
	}
	fd := -1
	raw, err := tc.SyscallConn()
	if err == nil {
		err = raw.Control(func(f uintptr) { fd, err = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0) })
	}
	if err != nil || fd < 0 {
		conn.Close() // hijacked: nothing else will serve it; the client reconnects
		return
	}
	o := &loopOwner{s: s, top: conn, fc: fc}
	o.sock = &loopSock{o: o, local: tc.LocalAddr(), remote: tc.RemoteAddr()}
	o.rewire(o.sock)
	tc.Close() // the duplicate keeps the socket open; this takes it out of Go's netpoller
	peer, _, _ := net.SplitHostPort(r.RemoteAddr)
	if !s.loops.Take(fd, peer, o, pending) {
		unix.Close(fd)
		o.Closed()
	}
}

// loopOwner is the edge's side of a connection the loop serves.
type loopOwner struct {
	s    *Server
	top  net.Conn     // the connection as net/http served it
	fc   *framingConn // the edge's layer, under top or top itself
	sock *loopSock    // what stands in for the socket under the layers while the loop has it
	// The loop goroutine's own: whether the connection is in the cap's books (Idle has been called).
	listed bool
	closed atomic.Bool // the loop closed the connection (Closed)
}

// rewire puts inner right above the socket, under the edge's layers: in the cap's layer, or, with
// no cap, in the framing layer.
func (o *loopOwner) rewire(inner net.Conn) {
	if !connlimit.Rewire(o.fc.Conn, inner) {
		o.fc.Conn = inner
	}
}

func (o *loopOwner) Idle(idle bool) {
	if o.s.loopConnState == nil {
		return
	}
	lc := o.fc.Conn
	if !o.listed {
		o.listed = true
		o.s.loopConnState(lc, http.StateNew)
	}
	if idle {
		o.s.loopConnState(lc, http.StateIdle)
	} else {
		o.s.loopConnState(lc, http.StateActive)
	}
}

// unlist takes the connection out of the cap's books (it still counts), before it goes back to
// net/http, whose server lists it again.
func (o *loopOwner) unlist() {
	if o.listed && o.s.loopConnState != nil {
		o.listed = false
		o.s.loopConnState(o.fc.Conn, http.StateHijacked)
	}
}

func (o *loopOwner) Closed() {
	o.closed.Store(true)
	if o.listed && o.s.loopConnState != nil {
		o.s.loopConnState(o.fc.Conn, http.StateClosed)
	}
	o.top.Close() // gives the cap its place back; the stand-in's Close does nothing now
}

// loopSock stands in for a socket the loop has, under the edge's layers: closing it (the cap making
// room) closes the connection in the loop. Nothing else of it is used while the loop has it.
type loopSock struct {
	o             *loopOwner
	local, remote net.Addr
}

func (c *loopSock) Close() error {
	if !c.o.closed.Load() {
		c.o.s.loops.CloseConn(c.o)
	}
	return nil
}

func (c *loopSock) Read([]byte) (int, error)         { return 0, net.ErrClosed }
func (c *loopSock) Write([]byte) (int, error)        { return 0, net.ErrClosed }
func (c *loopSock) LocalAddr() net.Addr              { return c.local }
func (c *loopSock) RemoteAddr() net.Addr             { return c.remote }
func (c *loopSock) SetDeadline(time.Time) error      { return nil }
func (c *loopSock) SetReadDeadline(time.Time) error  { return nil }
func (c *loopSock) SetWriteDeadline(time.Time) error { return nil }

// loopBack is a connection the loop gave back, as the resume server serves it.
type loopBack struct {
	net.Conn
	fin atomic.Pointer[warmloop.Handover] // the exchange its first request finishes (Finish); nil for a plain hand-back
}

func (c *loopBack) NetConn() net.Conn { return c.Conn }

// loopBackKey is the request context key of a connection the loop gave back (ConnContext).
type loopBackKey struct{}

// loopFinished returns the exchange r finishes: r is the first request on a connection the loop gave
// back with one.
func loopFinished(r *http.Request) *warmloop.Handover {
	if lb, ok := r.Context().Value(loopBackKey{}).(*loopBack); ok {
		return lb.fin.Swap(nil)
	}
	return nil
}

// prefixConn reads prefix first, then the connection.
type prefixConn struct {
	net.Conn
	prefix []byte
	mu     sync.Mutex
}

func (c *prefixConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	if len(c.prefix) > 0 {
		n := copy(b, c.prefix)
		c.prefix = c.prefix[n:]
		c.mu.Unlock()
		return n, nil
	}
	c.mu.Unlock()
	return c.Conn.Read(b)
}

// NetConn lets the cap find the socket (its unread-bytes check).
func (c *prefixConn) NetConn() net.Conn { return c.Conn }

// loopEdge is the Server as the loop's warmloop.Edge.
type loopEdge Server

// Begin admits req to its route's tenant when the loop can serve it: its head within the running
// edge.max_header_bytes, the route awake, not a fleet, not filtered, its upstream an address the loop
// dials; counted in flight and holding an upstream slot, as acquireRequest and admit would. Otherwise
// nil: net/http serves it (and holds it, wakes, or answers 404 or 431).
func (e *loopEdge) Begin(req *warmloop.Request) warmloop.Target {
	s := (*Server)(e)
	// The strings are read for the lookup alone, while req's bytes stand still.
	host := unsafe.String(unsafe.SliceData(req.Host), len(req.Host))
	path := unsafe.String(unsafe.SliceData(req.Path), len(req.Path))
	if path == waitpage.EventsPath {
		return nil
	}
	t := s.table.Load()
	// edge.max_header_bytes follows reloads (measureHeader), the loop's MaxHead does not: a longer head
	// goes to net/http to be measured. Its measure never exceeds the head's bytes, so a head within
	// the limit here is within it there.
	if m := t.edge.MaxHeaderBytes; m > 0 && int64(len(req.Head)) > m {
		return nil
	}
	rt := t.lookup(host, path)
	if rt == nil {
		return nil
	}
	in := rt.in
	lt := s.loopTarget(in)
	if lt == nil || in.fleet != nil || in.filter != nil || !in.awake.Load() {
		return nil
	}
	in.mu.Lock()
	if in.state != Awake || in.closed || in.retiring {
		in.mu.Unlock()
		return nil
	}
	in.inflight++
	in.disarmIdleLocked()
	in.mu.Unlock()
	select {
	case in.slots <- struct{}{}:
	default:
		in.release() // every slot taken: net/http's path waits for one
		return nil
	}
	return lt
}

// HandBack has the resume server serve a connection the loop gives back, pending first.
func (e *loopEdge) HandBack(fd int, owner warmloop.Owner, pending []byte) {
	(*Server)(e).giveBack(fd, owner.(*loopOwner), pending, nil)
}

// Finish has the resume server finish an exchange the loop began (serveFinished), then serve the
// connection on.
func (e *loopEdge) Finish(x *warmloop.Handover) {
	prefix := append(x.Head, x.Pending...)
	(*Server)(e).giveBack(x.FD, x.Owner.(*loopOwner), prefix, x)
}

func (s *Server) giveBack(fd int, o *loopOwner, prefix []byte, x *warmloop.Handover) {
	o.unlist()
	f := os.NewFile(uintptr(fd), "edge connection")
	nc, err := net.FileConn(f) // a duplicate, in Go's netpoller again
	f.Close()
	if err != nil {
		if x != nil {
			if x.UpFD >= 0 {
				unix.Close(x.UpFD)
			}
			x.Target.End(0)
		}
		o.Closed()
		return
	}
	o.rewire(&prefixConn{Conn: nc, prefix: prefix})
	lb := &loopBack{Conn: o.top}
	if x != nil {
		lb.fin.Store(x)
	}
	go func() { _ = s.resume.Serve(&oneConn{c: lb}) }()
}

// serveFinished answers the first request of a connection the loop gave back with an exchange: from
// the exchange's upstream connection, which has the request already, or with the exchange's failure
// (its timeout, its error) through the route's upstream client, as the fast path answers its own.
func (s *Server) serveFinished(w http.ResponseWriter, r *http.Request, x *warmloop.Handover) {
	lt := x.Target.(*loopTarget)
	in := lt.in
	lt.offUntil.Store(time.Now().Add(loopOff).UnixNano())
	sw := &statusWriter{ResponseWriter: w}
	defer func() { x.Target.End(sw.statusCode()) }()
	if x.Err != nil {
		in.client().Fail(sw, r, x.Err)
		return
	}
	f := os.NewFile(uintptr(x.UpFD), "upstream connection")
	up, err := net.FileConn(f)
	f.Close()
	switch {
	case err != nil:
		in.client().Fail(sw, r, err)
	case x.TimedOut:
		up.Close()
		in.client().Fail(sw, r, fmt.Errorf("%w (%v)", upstream.ErrResponseTimeout, in.route.ResponseTimeout))
	default:
		in.client().Finish(sw, r, up, x.Answer)
	}
}

// loopTarget is an instance as the loop's warmloop.Target: made once per instance whose upstream the
// loop can dial.
type loopTarget struct {
	in       *instance
	g        *warmloop.Group
	sa       unix.Sockaddr
	offUntil atomic.Int64 // until when (Unix ns) the route's connections stay with net/http: loopOff
}

// loopTarget returns in's Target, made at its first use (most routes of a large config never wake);
// nil when the loop cannot dial in's upstream (a host name, which its thread would block resolving).
func (s *Server) loopTarget(in *instance) *loopTarget {
	if lt := in.loopT.Load(); lt != nil {
		return lt
	}
	if in.noLoop.Load() {
		return nil
	}
	sa := warmloop.Sockaddr(in.route.Upstream.Network, in.route.Upstream.Address)
	if sa == nil {
		in.noLoop.Store(true)
		return nil
	}
	in.loopT.CompareAndSwap(nil, &loopTarget{in: in, sa: sa, g: s.loops})
	return in.loopT.Load()
}

func (t *loopTarget) Sockaddr() unix.Sockaddr        { return t.sa }
func (t *loopTarget) ResponseTimeout() time.Duration { return t.in.route.ResponseTimeout }

func (t *loopTarget) End(status int) {
	t.in.unadmit()
	t.in.release()
	if status != 0 {
		t.in.count(status)
	}
}

// Unasked tells the route's upstream client, built for it if the loop's requests were the route's
// first: the client's OnUnasked logs it, as for the fast path's own connections.
func (t *loopTarget) Unasked() { t.in.client().TellUnasked() }

// drainLoops closes the loops' idle connections and waits, within ctx, for their requests in
// progress; then closes the loops.
func (s *Server) drainLoops(ctx context.Context) error {
	if s.loops == nil {
		return nil
	}
	defer s.loops.Close()
	select {
	case <-s.loops.Drain():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("event loop: connections still busy: %w", ctx.Err())
	}
}
