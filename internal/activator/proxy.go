package activator

// The proxy to a route's upstream: httputil.ReverseProxy with a transport tuned for one upstream.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"sync"
	"time"

	"github.com/activator/activator/internal/registry"
)

// bufferPool lends the proxy its copy buffers.
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v := b.p.Get(); v != nil {
		return *(v.(*[]byte))
	}
	return make([]byte, 32<<10)
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }

var sharedBuffers = &bufferPool{}

// lazyTransport builds the route's transports on the first request, so a configured route that never
// wakes does not carry them (with 10,000 idle routes the transports were a tenth of the heap).
type lazyTransport struct {
	once  sync.Once
	build func() http.RoundTripper
	tr    http.RoundTripper // set once by build, read only after once.Do
}

// RoundTrip implements http.RoundTripper.
func (l *lazyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return l.transport().RoundTrip(r)
}

// transport returns the transport, building it on first use.
func (l *lazyTransport) transport() http.RoundTripper {
	l.once.Do(func() { l.tr = l.build() })
	return l.tr
}

// fastTransport carries the requests that make up nearly all proxied traffic — GET, HEAD and OPTIONS
// without a body and without an Upgrade — over HTTP/1.1 keep-alive connections that the calling
// goroutine writes and reads itself. http.Transport runs two goroutines per connection and hands every
// request and response between them; on a CPU shared with the tenant that was about a sixth of the
// edge's cost (BenchmarkEdgeWrk in bench/). Every other request goes to fallback, an http.Transport.
//
// Connections: at most maxConns are open (idle or busy), and at most maxDials being dialed; a request
// that finds none idle dials one, or waits (bounded by its context) for one to be returned, closed, or
// dialed. The dial limit is for a herd: 256 requests released at once onto a tenant that has just
// started made 256 simultaneous dials (and accepts), most of them unneeded, since the first
// connections are handed on as soon as their answers are read; with 32 dials in flight a 10,000-
// request release took about half as long (harness, medians of 5). Idle connections are reused last in,
// first out and closed after idleTimeout. A request that fails on a reused connection before any byte
// of the answer arrived (the tenant closed it, or restarted) is retried once on a new connection, and
// the other idle connections, as old or older, are dropped.
type fastTransport struct {
	network, address string
	fallback         http.RoundTripper
	dialer           net.Dialer
	slots            chan struct{} // one token per open connection; capacity maxConns
	dials            chan struct{} // one token per dial in progress; capacity maxDials
	idleTimeout      time.Duration

	mu      sync.Mutex // guards the fields below
	idle    []*fastConn
	waiters []chan *fastConn // requests waiting for a connection, oldest first; each buffered 1
	reaper  *time.Timer      // armed while idle is not empty: closes connections idle too long
}

// fastConn is one upstream connection; it belongs to one request at a time.
type fastConn struct {
	c      net.Conn
	br     *bufio.Reader
	bw     *bufio.Writer
	idleAt time.Time // when it was last returned
	reused bool      // served a request before
}

// errFastRetry marks a failure on a reused connection before any answer byte: safe to retry.
var errFastRetry = errors.New("reused connection failed before the answer")

// maxDials bounds a route's upstream dials in flight (see fastTransport).
const maxDials = 32

func newFastTransport(network, address string, maxConns int, fallback http.RoundTripper) *fastTransport {
	return &fastTransport{
		network: network, address: address, fallback: fallback,
		dialer:      net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second},
		slots:       make(chan struct{}, maxConns),
		dials:       make(chan struct{}, maxDials),
		idleTimeout: 90 * time.Second,
	}
}

// fastEligible: an outgoing request forward could have carried (bodyless, safe, no protocol switch,
// no 100-continue handshake), to a plain-HTTP upstream.
func fastEligible(r *http.Request) bool {
	return forwardable(r) && r.URL.Scheme == "http"
}

// RoundTrip implements http.RoundTripper.
func (t *fastTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !fastEligible(req) {
		return t.fallback.RoundTrip(req)
	}
	var got1xx func(int, http.Header) error
	if trace := httptrace.ContextClientTrace(req.Context()); trace != nil && trace.Got1xxResponse != nil {
		got1xx = func(code int, h http.Header) error { return trace.Got1xxResponse(code, textproto.MIMEHeader(h)) }
	}
	return t.do(req, func(bw *bufio.Writer) error { return req.Write(bw) }, req.Close, got1xx)
}

// do sends one request on a pooled connection and reads the response head: head writes the request
// (req gives the context, and the method for reading the answer); closeAfter says the request asked
// to close the connection; got1xx, when not nil, is handed informational answers. A failure on a
// reused connection before any answer byte is retried once on a new connection.
func (t *fastTransport) do(req *http.Request, head func(*bufio.Writer) error, closeAfter bool, got1xx func(int, http.Header) error) (*http.Response, error) {
	fresh := false
	for attempt := 0; attempt < 2; attempt++ {
		fc, err := t.conn(req.Context(), fresh)
		if err != nil {
			return nil, err
		}
		resp, err := t.exchange(req, fc, head, closeAfter, got1xx)
		if err == nil {
			return resp, nil
		}
		t.discard(fc)
		if !errors.Is(err, errFastRetry) || req.Context().Err() != nil {
			return nil, err
		}
		t.dropIdle()
		fresh = true
	}
	return nil, errors.New("unreachable")
}

// conn returns an idle connection (unless fresh), a new one, or one handed back by another request.
func (t *fastTransport) conn(ctx context.Context, fresh bool) (*fastConn, error) {
	var wait chan *fastConn
	t.mu.Lock()
	if !fresh {
		now := time.Now()
		for len(t.idle) > 0 {
			fc := t.idle[len(t.idle)-1]
			t.idle = t.idle[:len(t.idle)-1]
			if now.Sub(fc.idleAt) < t.idleTimeout {
				t.mu.Unlock()
				return fc, nil
			}
			t.closeLocked(fc)
		}
	}
	// Below the cap and below the dial limit: dial at once.
	select {
	case t.slots <- struct{}{}:
		select {
		case t.dials <- struct{}{}:
			t.mu.Unlock()
			return t.dial(ctx)
		default:
			<-t.slots
		}
	default:
	}
	// Otherwise wait for a connection another request hands back, or for a slot (the cap) and then a
	// dial token, in that order, so no two waiters can each hold what the other needs.
	wait = make(chan *fastConn, 1)
	t.waiters = append(t.waiters, wait)
	t.mu.Unlock()

	select {
	case fc := <-wait:
		return fc, nil
	case t.slots <- struct{}{}:
	case <-ctx.Done():
		t.forgetWaiter(wait)
		return nil, ctx.Err()
	}
	select {
	case fc := <-wait:
		<-t.slots
		return fc, nil
	case t.dials <- struct{}{}:
		t.forgetWaiter(wait)
		return t.dial(ctx)
	case <-ctx.Done():
		<-t.slots
		t.forgetWaiter(wait)
		return nil, ctx.Err()
	}
}

// forgetWaiter removes wait from the queue; a connection already handed to it goes back to the pool.
func (t *fastTransport) forgetWaiter(wait chan *fastConn) {
	t.mu.Lock()
	for i, w := range t.waiters {
		if w == wait {
			t.waiters = append(t.waiters[:i], t.waiters[i+1:]...)
			t.mu.Unlock()
			return
		}
	}
	t.mu.Unlock()
	// put already handed it a connection: pass it on.
	t.put(<-wait)
}

// dial opens a connection; the caller holds a slot and a dial token. It gives the token back, and the
// slot too when the dial fails.
func (t *fastTransport) dial(ctx context.Context) (*fastConn, error) {
	c, err := t.dialer.DialContext(ctx, t.network, t.address)
	<-t.dials
	if err != nil {
		<-t.slots
		return nil, err
	}
	return newFastConn(c), nil
}

// newFastConn wraps c with 4 KiB buffers: they carry request and response headers; bodies larger than
// the buffer bypass it (bufio reads straight into the caller's 32 KiB pooled copy buffer). 32 KiB each
// cost 64 KiB per connection, allocated and zeroed on every dial of a herd.
func newFastConn(c net.Conn) *fastConn {
	return &fastConn{c: c, br: bufio.NewReaderSize(c, 4<<10), bw: bufio.NewWriterSize(c, 4<<10)}
}

// adopt takes an open connection to the upstream on which nothing is pending (the health gate's last
// probe, see ConnGate) into the idle list, when the cap leaves room for it; else it closes it. It
// counts as reused: should the tenant have closed it meanwhile, the request that takes it is retried
// on a new connection.
func (t *fastTransport) adopt(c net.Conn) {
	select {
	case t.slots <- struct{}{}:
	default:
		c.Close()
		return
	}
	t.put(newFastConn(c))
}

// put returns a connection after a complete exchange: to the oldest waiter, or to the idle list.
func (t *fastTransport) put(fc *fastConn) {
	fc.reused = true
	fc.idleAt = time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.waiters) > 0 {
		w := t.waiters[0]
		t.waiters = t.waiters[1:]
		w <- fc
		return
	}
	t.idle = append(t.idle, fc)
	if t.reaper == nil {
		t.reaper = time.AfterFunc(t.idleTimeout, t.reap)
	}
}

// reap closes the connections idle longer than idleTimeout (oldest first in the list) and re-arms
// itself while any remain.
func (t *fastTransport) reap() {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	n := 0
	for n < len(t.idle) && now.Sub(t.idle[n].idleAt) >= t.idleTimeout {
		t.closeLocked(t.idle[n])
		n++
	}
	t.idle = append(t.idle[:0], t.idle[n:]...)
	if len(t.idle) == 0 {
		t.reaper = nil
		return
	}
	t.reaper.Reset(t.idle[0].idleAt.Add(t.idleTimeout).Sub(now))
}

// discard closes a connection that cannot be reused and frees its slot.
func (t *fastTransport) discard(fc *fastConn) {
	t.mu.Lock()
	t.closeLocked(fc)
	t.mu.Unlock()
}

func (t *fastTransport) closeLocked(fc *fastConn) {
	_ = fc.c.Close()
	<-t.slots
}

// dropIdle closes every idle connection (after one turned out dead, the older ones likely are too).
func (t *fastTransport) dropIdle() {
	t.mu.Lock()
	for _, fc := range t.idle {
		t.closeLocked(fc)
	}
	t.idle = nil
	t.mu.Unlock()
}

// aLongTimeAgo is a deadline in the past: setting it makes blocked reads and writes return at once.
var aLongTimeAgo = time.Unix(1, 0)

// exchange writes a request on fc (head) and reads the response head. The response body reads from
// fc; closing it returns fc to the pool when the body was read to the end and both sides allow
// keep-alive, and closes fc otherwise. The request's context aborts the exchange, body included, by
// expiring fc's deadline.
func (t *fastTransport) exchange(req *http.Request, fc *fastConn, head func(*bufio.Writer) error, closeAfter bool, got1xx func(int, http.Header) error) (*http.Response, error) {
	stop := context.AfterFunc(req.Context(), func() { _ = fc.c.SetDeadline(aLongTimeAgo) })
	fail := func(err error, beforeAnswer bool) (*http.Response, error) {
		stop()
		if ctxErr := req.Context().Err(); ctxErr != nil {
			return nil, ctxErr
		}
		if beforeAnswer && fc.reused {
			return nil, fmt.Errorf("%w: %w", errFastRetry, err)
		}
		return nil, err
	}
	if err := head(fc.bw); err != nil {
		return fail(err, true)
	}
	if err := fc.bw.Flush(); err != nil {
		return fail(err, true)
	}
	if _, err := fc.br.Peek(1); err != nil {
		return fail(err, true)
	}
	for informational := 0; ; informational++ {
		resp, err := http.ReadResponse(fc.br, req)
		if err != nil {
			return fail(err, false)
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 {
			if resp.StatusCode == http.StatusSwitchingProtocols || informational >= 10 {
				return fail(fmt.Errorf("unexpected %s from upstream", resp.Status), false)
			}
			if got1xx != nil {
				if err := got1xx(resp.StatusCode, resp.Header); err != nil {
					return fail(err, false)
				}
			}
			continue
		}
		resp.Body = &fastBody{body: resp.Body, t: t, fc: fc, stop: stop, keep: !resp.Close && !closeAfter}
		return resp, nil
	}
}

// fastBody is a response body on a fastConn; see exchange.
type fastBody struct {
	body io.ReadCloser
	t    *fastTransport
	fc   *fastConn
	stop func() bool
	keep bool // neither side asked to close the connection

	mu     sync.Mutex // guards the fields below (Close may race with a Read)
	eof    bool
	closed bool
}

func (b *fastBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	if err == io.EOF {
		b.mu.Lock()
		b.eof = true
		b.mu.Unlock()
	}
	return n, err
}

func (b *fastBody) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	done := b.eof || b.body == http.NoBody
	b.mu.Unlock()
	if !done {
		// Closing an unfinished body would read it to the end; the connection is dropped instead.
		_ = b.fc.c.SetDeadline(aLongTimeAgo)
	}
	err := b.body.Close()
	// stop reports false when the context's AfterFunc already ran (or runs): the deadline is spoiled.
	if b.stop() && done && b.keep && b.fc.br.Buffered() == 0 {
		b.t.put(b.fc)
	} else {
		b.t.discard(b.fc)
	}
	return err
}

// upstreamConns is the route's max_upstream_conns: the requests it proxies at once. The instance
// admits requests to the proxy up to it (see instance.admit); the transports are capped at it too, as
// a backstop.
//
// Why a cap at all: a herd released at once would otherwise open one upstream connection per held
// request: 10,000 held requests became 10,000 dials to a tenant that had just started, and the
// activator ran out of file descriptors (10k client + 10k upstream sockets). The cost: more
// concurrent long-lived requests (SSE streams, WebSockets) than the cap queue until one ends.
func upstreamConns(r *registry.Route) int {
	if r.MaxUpstreamConns > 0 {
		return r.MaxUpstreamConns
	}
	return registry.DefaultMaxUpstreamConns
}

// newProxy builds the route's reverse proxy: Rewrite (not the deprecated Director), X-Forwarded-*
// headers, the original Host passed through, transports dialing the route's upstream (TCP or unix
// socket) with a keep-alive pool sized for a busy tenant — fastTransport for bodyless GET/HEAD/OPTIONS,
// http.Transport for the rest — built on first use, and errors mapped in one place.
func newProxy(r *registry.Route) *httputil.ReverseProxy {
	up := r.Upstream
	target := &url.URL{Scheme: "http", Host: up.Address}
	if up.Network == "unix" {
		target.Host = "unix"
	}
	tr := &lazyTransport{build: func() http.RoundTripper {
		dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
		conns := upstreamConns(r)
		return newFastTransport(up.Network, up.Address, conns, &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return dialer.DialContext(ctx, up.Network, up.Address)
			},
			MaxIdleConns:          conns,
			MaxIdleConnsPerHost:   conns,
			MaxConnsPerHost:       conns,
			IdleConnTimeout:       90 * time.Second,
			ExpectContinueTimeout: time.Second,
			DisableCompression:    true,
			WriteBufferSize:       32 << 10,
			ReadBufferSize:        32 << 10,
		})
	}}
	name := r.Name
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.SetXForwarded()
			pr.Out.Host = pr.In.Host
		},
		Transport:  tr,
		BufferPool: sharedBuffers,
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			if errors.Is(err, context.Canceled) && req.Context().Err() != nil {
				return // the client went away; there is nobody to answer
			}
			writeError(w, req, &UpstreamError{Route: name, Err: err})
		},
	}
}
