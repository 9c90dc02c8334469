package upstream

// The pool of kept-alive connections the fast path writes and reads in the calling goroutine.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// pool holds the upstream connections of the fast path (see forward). http.Transport runs two
// goroutines per connection and hands every request and response between them; on a CPU shared with
// the tenant that was about a sixth of the edge's cost. Here the calling goroutine writes the request
// and reads the answer itself.
//
// At most maxConns connections are open (idle or busy), and at most maxDials being dialed; a request
// that finds none idle dials one, or waits (bounded by its context) for one to be returned, closed or
// dialed. The dial limit is for a herd: requests released at once onto a tenant that has just started
// would otherwise dial (and make it accept) one connection each, most of them unneeded, since the
// first connections are handed on as soon as their answers are read. Idle connections are reused last
// in, first out and closed after idleTimeout. A request that fails on a reused connection before any
// byte of the answer arrived (the tenant closed it, or restarted) is retried once on a new connection,
// and the other idle connections, as old or older, are closed.
//
// No goroutine reads an idle connection, as http.Transport's does, to notice an upstream that speaks
// with no request pending. Instead, before a kept-alive connection carries a request, the kernel is
// asked whether anything arrived on it since its last answer (Conn.idle): such a connection is closed
// unused (discardUnasked tells Options.OnUnasked of bytes; a close goes untold) and the request takes
// another. Bytes that arrive after that check and before the answer are taken for the answer, as with
// http.Transport, nginx and HAProxy, which likewise close a connection that speaks while idle.
type pool struct {
	network, address string
	host             string // the Host of a request that has none: the address, or localhost
	dialer           net.Dialer
	slots            chan struct{} // one token per open connection; capacity maxConns
	dials            chan struct{} // one token per dial in progress; capacity maxDials
	idleTimeout      time.Duration
	headTimeout      time.Duration // Options.ResponseTimeout; 0: none
	unasked          func()        // Options.OnUnasked; nil: none

	mu      sync.Mutex // guards the fields below
	idle    []*Conn
	waiters []chan *Conn // requests waiting for a connection, oldest first; each buffered 1
	reaper  *time.Timer  // armed while idle is not empty: closes connections idle too long
	reapGen uint64       // counts the reapers armed; a stopped one that runs anyway sees a newer one
}

// errRetry marks a failure on a reused connection before any answer byte: safe to retry.
var errRetry = errors.New("reused connection failed before the answer")

// maxDials bounds the upstream dials in flight (see pool).
const maxDials = 32

func newPool(network, address string, maxConns int) *pool {
	host := address
	if network == "unix" {
		host = "localhost"
	}
	return &pool{
		network: network, address: address, host: host,
		dialer:      net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second},
		slots:       make(chan struct{}, maxConns),
		dials:       make(chan struct{}, maxDials),
		idleTimeout: IdleTimeout,
	}
}

// IdleTimeout is how long a kept-alive upstream connection may stay idle before it is closed: the
// pool's, net/http's Transport's and the event loops' (warmloop).
const IdleTimeout = 90 * time.Second

// do sends r (forwardable), with fw's forwarding fields, on a pooled connection and reads the
// answer's head; got1xx is handed the informational answers. A failure on a reused connection before any answer byte is retried once on
// a new connection.
func (p *pool) do(r *http.Request, fw *forwarding, got1xx func(int, http.Header) error, dst http.Header) (*http.Response, error) {
	if err := r.Context().Err(); err != nil {
		return nil, err // the client is gone: nothing to send (the watch would notice only after its grace)
	}
	fresh := false
	for {
		c, err := p.conn(r.Context(), fresh)
		if err != nil {
			return nil, err
		}
		if c.reused {
			switch c.idle() {
			case idleSpoke: // what it sent while idle answers nothing this request asked
				p.discardUnasked(c)
				continue
			case idleClosed:
				p.discard(c)
				continue
			}
		}
		resp, err := p.exchange(r, fw, c, got1xx, dst)
		if err == nil {
			return resp, nil
		}
		p.discard(c)
		if fresh || !errors.Is(err, errRetry) || r.Context().Err() != nil {
			return nil, err
		}
		p.closeIdle() // after one turned out dead, the older ones likely are too
		fresh = true
	}
}

// conn returns an idle connection (unless fresh), a new one, or one handed back by another request.
func (p *pool) conn(ctx context.Context, fresh bool) (*Conn, error) {
	p.mu.Lock()
	if !fresh {
		now := time.Now()
		for len(p.idle) > 0 {
			c := p.idle[len(p.idle)-1]
			p.idle = p.idle[:len(p.idle)-1]
			if now.Sub(c.idleAt) < p.idleTimeout {
				p.mu.Unlock()
				return c, nil
			}
			p.closeLocked(c)
		}
	}
	// Below the cap and below the dial limit: dial at once.
	select {
	case p.slots <- struct{}{}:
		select {
		case p.dials <- struct{}{}:
			p.mu.Unlock()
			return p.dial(ctx)
		default:
			<-p.slots
		}
	default:
	}
	// Otherwise wait for a connection another request hands back, or for a slot (the cap) and then a
	// dial token, in that order, so no two waiters can each hold what the other needs.
	wait := make(chan *Conn, 1)
	p.waiters = append(p.waiters, wait)
	p.mu.Unlock()

	select {
	case c := <-wait:
		return c, nil
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		p.forgetWaiter(wait)
		return nil, ctx.Err()
	}
	select {
	case c := <-wait:
		<-p.slots
		return c, nil
	case p.dials <- struct{}{}:
		p.forgetWaiter(wait)
		return p.dial(ctx)
	case <-ctx.Done():
		<-p.slots
		p.forgetWaiter(wait)
		return nil, ctx.Err()
	}
}

// forgetWaiter removes wait from the queue; a connection already handed to it goes back to the pool.
func (p *pool) forgetWaiter(wait chan *Conn) {
	p.mu.Lock()
	for i, w := range p.waiters {
		if w == wait {
			p.waiters = append(p.waiters[:i], p.waiters[i+1:]...)
			p.mu.Unlock()
			return
		}
	}
	p.mu.Unlock()
	// put already handed it a connection: pass it on.
	p.put(<-wait)
}

// dial opens a connection; the caller holds a slot and a dial token. It gives the token back, and the
// slot too when the dial fails.
func (p *pool) dial(ctx context.Context) (*Conn, error) {
	c, err := p.dialer.DialContext(ctx, p.network, p.address)
	<-p.dials
	if err != nil {
		<-p.slots
		return nil, err
	}
	return NewConn(c), nil
}

// adopt takes an open connection to the upstream on which nothing is pending into the idle list, when
// the cap leaves room for it; else it closes it.
func (p *pool) adopt(c *Conn) {
	if !c.Clean() { // the probe's answer was followed by bytes it did not ask for
		_ = c.Close()
		p.tellUnasked()
		return
	}
	select {
	case p.slots <- struct{}{}:
	default:
		_ = c.Close()
		return
	}
	p.put(c)
}

// discardUnasked closes c, on which the upstream sent bytes no request asked for, and tells
// Options.OnUnasked.
func (p *pool) discardUnasked(c *Conn) {
	p.discard(c)
	p.tellUnasked()
}

// tellUnasked calls Options.OnUnasked, if set, for a connection closed for bytes no request asked for.
func (p *pool) tellUnasked() {
	if p.unasked != nil {
		p.unasked()
	}
}

// put returns a connection after a complete exchange: to the oldest waiter, or to the idle list.
func (p *pool) put(c *Conn) {
	c.reused = true
	c.idleAt = time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.waiters) > 0 {
		w := p.waiters[0]
		p.waiters = p.waiters[1:]
		w <- c
		return
	}
	p.idle = append(p.idle, c)
	if p.reaper == nil {
		p.reapGen++
		gen := p.reapGen
		p.reaper = time.AfterFunc(p.idleTimeout, func() { p.reap(gen) })
	}
}

// reap closes the connections idle longer than idleTimeout (oldest first in the list) and re-arms
// the reaper while any remain. A reaper that closeIdle stopped too late to keep it from running
// (gen is not the armed one's) does nothing.
func (p *pool) reap(gen uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reaper == nil || gen != p.reapGen {
		return
	}
	now := time.Now()
	n := 0
	for n < len(p.idle) && now.Sub(p.idle[n].idleAt) >= p.idleTimeout {
		p.closeLocked(p.idle[n])
		n++
	}
	p.idle = append(p.idle[:0], p.idle[n:]...)
	if len(p.idle) == 0 {
		p.reaper = nil
		return
	}
	p.reaper.Reset(p.idle[0].idleAt.Add(p.idleTimeout).Sub(now))
}

// closeIdle closes every idle connection and stops the reaper. Busy connections are not touched: they
// come back (and re-arm the reaper) or are closed when their requests end.
func (p *pool) closeIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.idle {
		p.closeLocked(c)
	}
	p.idle = nil
	if p.reaper != nil {
		p.reaper.Stop()
		p.reaper = nil
	}
}

// discard closes a connection that cannot be reused and frees its slot.
func (p *pool) discard(c *Conn) {
	p.mu.Lock()
	p.closeLocked(c)
	p.mu.Unlock()
}

func (p *pool) closeLocked(c *Conn) {
	_ = c.Close()
	<-p.slots
}

// expired returns a deadline in the past: setting it makes blocked reads and writes return at once.
func expired() time.Time { return time.Unix(1, 0) }

// exchange sends r on c and reads the answer's head. The answer's body reads from c; closing it
// returns c to the pool when the body was read to the end and both sides allow keep-alive, and closes
// c otherwise. r's context aborts the exchange, body included, by expiring c's deadline (Conn.watch).
func (p *pool) exchange(r *http.Request, fw *forwarding, c *Conn, got1xx func(int, http.Header) error, dst http.Header) (*http.Response, error) {
	return p.read(r, c, func(bw *bufio.Writer) { writeHead(bw, r, fw, p.host) }, got1xx, dst)
}

// read is exchange with the request's head written by write: nothing, for a request already sent
// (Client.Finish).
func (p *pool) read(r *http.Request, c *Conn, write func(*bufio.Writer), got1xx func(int, http.Header) error, dst http.Header) (*http.Response, error) {
	c.watch(r.Context(), p.headTimeout)
	resp, beforeAnswer, err := c.exchange(r, write, got1xx, dst)
	if err != nil {
		c.unwatch()
		if ctxErr := r.Context().Err(); ctxErr != nil {
			return nil, ctxErr
		}
		if !c.headBy.IsZero() && errors.Is(err, os.ErrDeadlineExceeded) {
			// Not retried: the tenant has the request, and is slow, not gone.
			return nil, responseTimeout(p.headTimeout, err)
		}
		if beforeAnswer && c.reused {
			return nil, fmt.Errorf("%w: %w", errRetry, err)
		}
		return nil, err
	}
	if c.headCut {
		c.rearm(time.Time{}) // the head is in: the body has no bound but the request's context
		c.headCut = false
	}
	c.body = body{body: resp.Body, p: p, c: c, keep: !resp.Close}
	resp.Body = &c.body
	return resp, nil
}

// body is an answer's body on a pooled connection; see exchange. Each exchange resets its
// connection's own: the answer it belongs to is done with it before the connection carries another.
type body struct {
	body io.ReadCloser
	p    *pool
	c    *Conn
	keep bool // the upstream did not ask to close the connection

	mu     sync.Mutex // guards the fields below (Close may race with a Read)
	eof    bool
	closed bool
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	if err == io.EOF {
		b.mu.Lock()
		b.eof = true
		b.mu.Unlock()
	}
	return n, err
}

func (b *body) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	done := b.eof || b.body == http.NoBody
	b.mu.Unlock()
	// unwatch reports false when the context's callback already ran (or runs): the deadline is
	// spoiled. It comes first, so that the expired deadline below is not taken for the watch's grace.
	intact := b.c.unwatch()
	if !done {
		// Closing an unfinished body would read it to the end; the connection is dropped instead.
		_ = b.c.SetDeadline(expired())
	}
	err := b.body.Close()
	switch {
	case !intact || !done || !b.keep:
		b.p.discard(b.c)
	case !b.c.Clean(): // the answer was read to its end, and more came with it
		b.p.discardUnasked(b.c)
	default:
		b.p.put(b.c)
	}
	return err
}
