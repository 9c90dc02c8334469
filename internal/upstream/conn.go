package upstream

// One HTTP/1.1 connection to the upstream and the exchange on it, shared by the pool and the health
// probe.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"
)

// Conn is a connection to the upstream together with the buffers the pool writes and reads it with.
// The health probe makes its requests on one (Get), so the connection its passing probe hands to
// Client.Adopt is already the pool's: the answer was read by the pool's reader, and the pool can see
// that nothing is left in it.
type Conn struct {
	net.Conn
	br *bufio.Reader
	bw *bufio.Writer

	idleAt time.Time // when it was last returned to the pool
	reused bool      // carried a request before

	// The watch of a pool exchange on its request's context (see watch), used by the goroutine
	// making the exchange; the callback of stop only sets the deadline.
	ctx    context.Context // the request's, while the grace runs; nil otherwise
	reqCtx context.Context // the request's, for the whole exchange (rearm registers on it again)
	stop   func() bool     // the registration on the request's context once the grace has passed; nil before
	body   body            // the answer's body, one per exchange, kept with the connection

	// The bound on the wait for the answer's head (Options.ResponseTimeout): headBy is when it ends
	// (zero: no bound), headCut whether the connection's deadline is set to it (past the grace).
	headBy  time.Time
	headCut bool

	// The answer of an exchange whose head plainHead parsed, kept with the connection like body.
	head  plainHead
	resp  http.Response
	fixed fixedBody

	// headLeft is, while an exchange reads an answer's head, how many bytes more it may read from the
	// connection (maxAnswerHead at the start); -1 otherwise.
	headLeft int64

	// What idle asks the kernel with, made once per connection so that the check allocates nothing
	// per request (SyscallConn makes a new value each call, and a closure passed to Control escapes).
	raw    syscall.RawConn  // the socket; nil when the connection is not one
	peekFn func(fd uintptr) // c.peekFD, bound once
	peeked idleState        // peekFD's finding
	peek   [1]byte          // peekFD's buffer

	// The send of a request's last bytes that also waits for the answer (sendAwaiting), bound once like
	// peekFn.
	sendFn   func(fd uintptr) bool
	deferred bool   // the buffer's next flush is kept in pending, not written
	pending  []byte // what sendFD has still to write: the flushed buffer, bufio's own
	sendErr  error  // sendFD's failure to write
}

// NewConn wraps c with 4 KiB buffers: they carry request and response heads; bodies larger than the
// buffer bypass it (bufio reads straight into the caller's 32 KiB copy buffer). 32 KiB each cost
// 64 KiB per connection, allocated and zeroed on every dial of a herd.
func NewConn(c net.Conn) *Conn {
	uc := &Conn{Conn: c, headLeft: -1}
	uc.br, uc.bw = bufio.NewReaderSize(connIO{uc}, 4<<10), bufio.NewWriterSize(connIO{uc}, 4<<10)
	if sc, ok := c.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			uc.raw, uc.peekFn, uc.sendFn = rc, uc.peekFD, uc.sendFD
		}
	}
	return uc
}

// watchGrace is how long a pool exchange runs before it registers on its request's context. Nearly
// every exchange on the warm path ends sooner, and so skips the registration (context.AfterFunc
// allocates, and locks the context, on every call); one whose client goes away is aborted at most
// this much later than it would otherwise be.
const watchGrace = 100 * time.Millisecond

// watch makes ctx bound the exchange about to start on c, and headTimeout (0: nothing) the wait for
// the answer's head once the request is sent: the connection's deadline is set watchGrace ahead (or
// to the head's bound, if sooner), and the read or write that meets it registers on ctx (graceOver)
// and goes on. unwatch ends the watch.
func (c *Conn) watch(ctx context.Context, headTimeout time.Duration) {
	now := time.Now()
	c.ctx, c.reqCtx, c.stop, c.headBy, c.headCut = ctx, ctx, nil, time.Time{}, false
	grace := now.Add(watchGrace)
	if headTimeout > 0 {
		c.headBy = now.Add(headTimeout)
		if c.headBy.Before(grace) {
			grace = c.headBy
		}
	}
	_ = c.Conn.SetDeadline(grace)
}

// graceOver reports whether err is the watch's deadline passing. Then the exchange goes on,
// registered on the request's context: once that ends, the deadline expires, and the read or write
// in progress fails. It goes on without a deadline, or, while it waits for the answer's head, with the
// head's bound (headBy): a head that has not come by then fails the exchange (ErrResponseTimeout).
func (c *Conn) graceOver(err error) bool {
	ctx := c.ctx
	if ctx == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	c.ctx = nil
	deadline := time.Time{}
	if c.headLeft >= 0 && !c.headBy.IsZero() {
		if !time.Now().Before(c.headBy) {
			return false // the head's bound, not the grace, has passed
		}
		deadline, c.headCut = c.headBy, true
	}
	// Set before the registration, whose callback may run at once.
	_ = c.Conn.SetDeadline(deadline)
	c.stop = context.AfterFunc(ctx, func() { _ = c.Conn.SetDeadline(expired()) })
	return true
}

// rearm sets the connection's deadline to d past the grace (once graceOver has registered on the
// request's context) without undoing an expiry the context's end has set: the registration is
// stopped first, and made again after. If the context has ended, its expiry stands. In the grace it
// does nothing: the grace's deadline stands, and graceOver sets what follows it.
func (c *Conn) rearm(d time.Time) {
	if c.stop == nil || !c.stop() {
		return
	}
	_ = c.Conn.SetDeadline(d)
	c.stop = context.AfterFunc(c.reqCtx, func() { _ = c.Conn.SetDeadline(expired()) })
}

// unwatch ends the watch and reports whether the connection's deadline is as the pool left it:
// false when the request's context ended and its callback expired the deadline (or is about to).
// A deadline the grace or the head's bound left pending does no harm: the next exchange sets its own
// first.
func (c *Conn) unwatch() bool {
	c.ctx, c.reqCtx = nil, nil
	if c.stop == nil {
		return true
	}
	ok := c.stop()
	c.stop = nil
	return ok
}

// connIO is what a Conn's buffers read and write: the connection, going on past the grace of a watch.
type connIO struct{ c *Conn }

func (x connIO) Read(b []byte) (int, error) {
	if left := x.c.headLeft; left >= 0 {
		if left == 0 {
			return 0, errHeadTooLarge
		}
		if int64(len(b)) > left {
			b = b[:left]
		}
	}
	for {
		n, err := x.c.Conn.Read(b)
		if x.c.headLeft > 0 {
			x.c.headLeft -= int64(n)
		}
		if err == nil || !x.c.graceOver(err) {
			return n, err
		}
		if n > 0 {
			return n, nil
		}
	}
}

func (x connIO) Write(b []byte) (int, error) {
	if x.c.deferred && x.c.pending == nil {
		x.c.pending = b // sendAwaiting writes it
		return len(b), nil
	}
	written := 0
	for {
		n, err := x.c.Conn.Write(b[written:])
		written += n
		if err == nil || !x.c.graceOver(err) {
			return written, err
		}
	}
}

// Get writes head, the complete head of a request without a body (request line, fields and the empty
// line), and reads the answer's head, passing over informational answers. The answer's body reads from
// c. Get sets no deadline: the caller bounds it (SetDeadline). On failure, waiting reports that head
// went out whole and no byte of the answer had come: the request is still the upstream's to answer,
// and Answer may wait on for it (after a new deadline).
func (c *Conn) Get(head []byte) (resp *http.Response, waiting bool, err error) {
	_, _ = c.bw.Write(head)
	if sent, err := c.sendAwaiting(); err != nil {
		return nil, sent, err
	}
	return c.Answer()
}

// Answer reads the answer to the request Get sent, as Get does; after a Get that failed waiting, it
// goes on waiting. waiting is as Get's.
func (c *Conn) Answer() (resp *http.Response, waiting bool, err error) {
	return c.exchange(nil, func(*bufio.Writer) {}, nil, nil)
}

// Clean reports whether nothing the upstream sent is buffered unread: after an answer read to its end,
// the connection can carry another request.
func (c *Conn) Clean() bool { return c.br.Buffered() == 0 }

// idleState is what an idle connection's upstream did since its last answer was read (Conn.idle).
type idleState int

const (
	idleQuiet  idleState = iota // nothing: the connection can carry a request
	idleClosed                  // it closed the connection (an idle timeout of its own, a restart)
	idleSpoke                   // it sent bytes no request asked for
)

// idle reports what the upstream did on c since its last answer was read: nothing, closed it, or sent
// bytes (buffered, or waiting in the socket). The kernel is asked without waiting (recv with
// MSG_PEEK|MSG_DONTWAIT). Bytes that arrive with no request pending, a body longer than its
// Content-Length or an answer written after the request was answered, would otherwise be read as the
// answer to the next request, another client's. A connection the kernel cannot be asked about (not a
// socket) counts as quiet; one whose socket fails the check, as closed.
func (c *Conn) idle() idleState {
	if !c.Clean() {
		return idleSpoke
	}
	if c.raw == nil {
		return idleQuiet
	}
	c.peeked = idleClosed
	if err := c.raw.Control(c.peekFn); err != nil {
		return idleClosed
	}
	return c.peeked
}

// peekFD is idle's look at the socket fd: one byte peeked, without waiting.
func (c *Conn) peekFD(fd uintptr) {
	n, _, errno := syscall.Recvfrom(int(fd), c.peek[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	switch {
	case errno == syscall.EAGAIN:
		c.peeked = idleQuiet
	case errno == nil && n > 0:
		c.peeked = idleSpoke
	}
}

// sendAwaiting flushes the request buffered in c.bw and starts the wait for the answer in one pass
// through the netpoller. A plain Flush and then a read makes a read that finds nothing: the tenant has
// not answered yet (on a CPU shared with it, it has not even run), and Go's netpoller waits for a socket
// to be readable only after a read returned EAGAIN, since it forgets readiness noted before the read
// began. Here the request's last bytes are written from inside the socket's RawConn.Read, after that
// forgetting: readiness can come only from the answer, and the wait that follows does not miss it. One
// system call less per request, about a tenth of those the edge makes for one. What does not go out
// whole at once (a socket buffer full) is written by the blocking path, and so is everything on a
// connection that is not a socket. sent reports that the request went out whole, also when the wait
// for the answer then failed (its deadline).
func (c *Conn) sendAwaiting() (sent bool, err error) {
	if c.raw == nil {
		err := c.bw.Flush()
		return err == nil, err
	}
	c.deferred, c.pending, c.sendErr = true, nil, nil
	err = c.bw.Flush()
	c.deferred = false
	if err != nil || c.pending == nil {
		return err == nil, err
	}
	err = c.raw.Read(c.sendFn)
	rest := c.pending
	c.pending = nil
	switch {
	case c.sendErr != nil:
		return false, c.sendErr
	case err != nil && !c.graceOver(err):
		return len(rest) == 0, err
	case len(rest) > 0:
		_, err = connIO{c}.Write(rest)
		return err == nil, err
	}
	return true, nil
}

// sendFD is sendAwaiting's turn on the socket fd: it writes what is pending and asks for the wait
// (false) once all of it is out, and ends the wait (true) once the socket is readable, on a failure, or
// when the socket buffer takes only part.
func (c *Conn) sendFD(fd uintptr) bool {
	for len(c.pending) > 0 {
		n, err := syscall.Write(int(fd), c.pending)
		if n > 0 {
			c.pending = c.pending[n:]
		}
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return true
		case err != nil:
			c.sendErr = err
			return true
		case n <= 0:
			c.sendErr = io.ErrShortWrite
			return true
		}
		return len(c.pending) > 0 // sent whole: wait for the answer (false)
	}
	return true
}

// maxInformational is how many informational answers may precede the answer to one request.
const maxInformational = 10

// exchange writes a request head (write) and reads the answer's head to req (nil reads it as the answer
// to a GET). Informational answers go to got1xx, or are passed over when it is nil; a 101 is an error
// (nothing forwarded here asked to switch protocols). beforeAnswer reports a failure before any byte
// of the answer arrived, which a request on a reused connection may retry elsewhere.
//
// With dst, a plain head (plainHead) already buffered is read without http.ReadResponse, its fields
// put into dst as writeAnswer would put them: the answer then has a nil Header. The answer and its
// body are the connection's own, valid until it carries another request.
func (c *Conn) exchange(req *http.Request, write func(*bufio.Writer), got1xx func(int, http.Header) error, dst http.Header) (resp *http.Response, beforeAnswer bool, err error) {
	write(c.bw)
	if _, err := c.sendAwaiting(); err != nil {
		return nil, true, err
	}
	// Bytes the reader already holds are not counted: a connection carries a request only with none
	// (idle, Clean), so the count is the whole head.
	c.headLeft = maxAnswerHead
	defer func() { c.headLeft = -1 }()
	if !c.headBy.IsZero() && c.stop != nil {
		// The grace passed while the request was written, and graceOver cleared the deadline: the
		// head's bound starts now.
		c.rearm(c.headBy)
		c.headCut = true
	}
	if _, err := c.br.Peek(1); err != nil {
		return nil, true, err
	}
	for informational := 0; ; informational++ {
		if dst != nil && req != nil {
			if b, _ := c.br.Peek(c.br.Buffered()); c.head.parse(b, req.Method) {
				c.head.take(c.br, dst)
				return c.plainAnswer(req), false, nil
			}
		}
		resp, err := http.ReadResponse(c.br, req)
		if err != nil {
			return nil, false, err
		}
		if resp.StatusCode < 100 || resp.StatusCode >= 200 {
			return resp, false, nil
		}
		if resp.StatusCode == http.StatusSwitchingProtocols || informational >= maxInformational {
			return nil, false, fmt.Errorf("unexpected %s from upstream", resp.Status)
		}
		if got1xx != nil {
			if err := got1xx(resp.StatusCode, resp.Header); err != nil {
				return nil, false, err
			}
		}
	}
}

// plainAnswer is the answer to req whose head c.head has taken.
func (c *Conn) plainAnswer(req *http.Request) *http.Response {
	c.resp = http.Response{StatusCode: c.head.status, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		ContentLength: c.head.length, Body: http.NoBody, Request: req}
	if c.head.length > 0 {
		c.fixed = fixedBody{br: c.br, left: c.head.length}
		c.resp.Body = &c.fixed
	}
	return &c.resp
}

// maxAnswerHead bounds what an exchange reads of an answer's head, its informational answers included:
// past it the exchange fails (errHeadTooLarge). Without a bound, http.ReadResponse reads a head of any
// size into memory, and one tenant writing header fields without end takes the activator's memory,
// every route's. 1 MiB is far past any real head, and a misbehaving route then takes about a MiB per
// head being read, at most max_upstream_conns at once. The ReverseProxy's Transport has the same
// bound (MaxResponseHeaderBytes), so both paths answer alike; the edge's own requests have
// edge.max_header_bytes.
const maxAnswerHead = 1 << 20

// errHeadTooLarge fails an exchange whose answer head runs past maxAnswerHead.
var errHeadTooLarge = fmt.Errorf("the tenant's answer head is over %d bytes", maxAnswerHead)
