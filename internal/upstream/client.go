// Package upstream owns the HTTP/1.1 client from the edge to one tenant: a pool of kept-alive
// connections with a fast path that writes requests and reads answers in the calling goroutine, the
// httputil.ReverseProxy (on a plain http.Transport) that carries every other request, and the
// exchange the health probe makes on a connection the pool can adopt (Conn).
//
// Both paths send the upstream the same request and the client the same answer; TestEquivalence
// and FuzzForwardMatchesReverseProxy hold them to it. The fast path reads the plain answer heads
// that make up nearly all its traffic itself, straight into the client's header (head.go), and leaves
// every other to http.ReadResponse; FuzzPlainHeadMatchesReadResponse holds the two alike.
//
// The upstream sees the original Host, the method, and the request-target as the client sent it (in
// origin-form, also for one that came in absolute-form); the client's header without hop-by-hop
// fields (RFC 9110 7.6.1: Connection and those it lists, Keep-Alive, Proxy-Connection,
// Proxy-Authenticate, Proxy-Authorization, TE except "trailers", Trailer, Transfer-Encoding,
// Upgrade); then the forwarding fields (forwarded.go).
//
// The forwarding fields depend on the peer, the address the request came from (r.RemoteAddr). From a
// peer that Options.TrustedProxy trusts, a proxy in front of the edge, the X-Forwarded-For,
// X-Forwarded-Host, X-Forwarded-Proto and Forwarded it sent are taken as the client's and passed on:
// X-Forwarded-For appended ("<theirs>, <peer>"), X-Forwarded-Host and X-Forwarded-Proto as it sent
// them (the edge's own when it sent none), Forwarded with an element "for=<peer>" appended (IPv6
// quoted and bracketed, RFC 7239). From any other peer they are dropped and the edge's own set:
// X-Forwarded-For (the peer), X-Forwarded-Host (the Host), X-Forwarded-Proto ("https" over TLS, else
// "http") and Forwarded ("for=<peer>;host=<Host>;proto=<scheme>"). A trusted proxy that sends
// X-Forwarded-* but no Forwarded gets a Forwarded that says what they say, one element per address
// of its X-Forwarded-For, then for=<peer>. Either way a tenant reading either form learns one client.
// The other fields proxies describe the client in (X-Real-IP, True-Client-IP, X-Forwarded-Ssl, …:
// clientField) are passed on from a trusted proxy and dropped from any other peer; these and the four
// spelled with underscores (forwardedAlias) are dropped from everyone.
// The client sees 1xx answers passed on, hop-by-hop fields dropped from the answer, trailers announced
// and passed on, the head of an event stream or a body of unknown length at once and each chunk as it
// comes, and a failed body copy aborting its connection.
//
// The query is passed byte for byte, on both paths: the edge never interprets it, so it does not
// rewrite it either (nginx and HAProxy pass it raw too), and a tenant that accepts "a=1;b=2" or a
// stray "%zz" gets what its client sent. The ReverseProxy on its own drops such parameters; the
// Rewrite here puts the raw query back.
//
// Two differences remain, both in informational answers: the fast path drops their hop-by-hop fields
// too, where the ReverseProxy passes them on (golang/go#81319), and it takes at most 10 before the
// answer, where the ReverseProxy takes any number.
//
// A request that asks to switch protocols (Upgrade: a WebSocket) takes the ReverseProxy; on a 101 it
// copies bytes both ways until either side closes, and Options.TunnelTimeout closes both sides of one
// that passes no byte for that long (tunnel.go); Options.OnTunnelOpen and OnTunnelEnd hear of each, and
// of why it ended. A 101 to another protocol than the one asked for fails, and its connection is
// closed. The fast path takes no such request, and a 101 there is an error.
//
// The package writes no error answers: every failure, on either path, goes to Options.ErrorHandler.
package upstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"sync"
	"time"
)

// Options configure a Client.
type Options struct {
	Network string // "tcp" or "unix"
	Address string // host:port, or the socket's path
	// MaxConns caps the connections open to the upstream at once, idle or busy, on each path.
	MaxConns int
	// TrustedProxy reports whether peer, the IP of a request's RemoteAddr (no zone, IPv4 unmapped),
	// is a proxy whose forwarding fields are taken as the client's (see the package doc). It is asked
	// per request, only for one that carries such a field, so it may follow reloads; it must be fast
	// and safe for concurrent use. Nil trusts no peer.
	TrustedProxy func(peer netip.Addr) bool
	// ErrorHandler answers a request whose upstream exchange failed before the answer's head was
	// passed on (dial refused, connection reset, no answer); r's context may have ended. Nil answers
	// 502 with no body.
	ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)
	// OnUnasked, which may be nil, is called each time a kept-alive connection is closed because the
	// upstream sent bytes no request asked for: found buffered when an answer has been read to its
	// end, or waiting in the socket before a request would have been written on it. The upstream sent
	// a body longer than its Content-Length, or wrote after its answer. Adopt calls it too, for a
	// probe's connection with bytes after the probe's answer. (One the upstream closed while idle is
	// dropped without a call: that is an idle timeout of its own.) It runs in the request's (or
	// Adopt's caller's) goroutine and must not block.
	OnUnasked func()
	// ResponseTimeout, when above 0, bounds how long the upstream may take to begin its answer (its
	// head) once the request has been sent, on either path: past it the request fails with
	// ErrResponseTimeout and the connection is closed. An answer whose head came in time is not bound
	// by it: a stream or a long body goes on as long as it moves.
	ResponseTimeout time.Duration
	// TunnelTimeout, which may be nil, is asked at each 101 answer (a WebSocket, or another protocol the
	// client asked to switch to) how long the connection may then pass no byte, either way, before it
	// is closed on both sides and the request ends; 0 is no bound. Asked once per switch, it may follow
	// reloads (a tunnel keeps the bound it began with); it must be fast and safe for concurrent use. Nil
	// bounds no tunnel.
	TunnelTimeout func() time.Duration
	// OnTunnelOpen and OnTunnelEnd, which may be nil, hear of every tunnel (a connection switched by a
	// 101), bound or not: OnTunnelOpen as its 101 is passed on, in the request's goroutine, and
	// OnTunnelEnd once when it ends, with why (TunnelReason), how long it was open and its bound, in
	// the goroutine that ended it (the ReverseProxy's, or the bound's timer), before its connection to
	// the tenant is closed. A tunnel OnTunnelOpen heard of is always told to OnTunnelEnd. Neither may
	// block.
	OnTunnelOpen func()
	OnTunnelEnd  func(TunnelEnd)
	// Logger, which may be nil, is told of an answer that broke off after its head was passed on (the
	// tenant closed the connection or died mid-body): the client's connection is then closed, which
	// is all the client learns. The ReverseProxy's own lines go to it too, at WARN.
	Logger *slog.Logger
}

// Client is the edge's client to one upstream. It is safe for concurrent use. Its connections live
// until CloseIdle (the idle ones) or until they have been idle for 90 s.
type Client struct {
	pool      *pool
	transport *http.Transport
	proxy     *httputil.ReverseProxy
	onError   func(http.ResponseWriter, *http.Request, error)
	trusted   func(netip.Addr) bool
	log       *slog.Logger // nil: none
	// tunnelTimeout, onTunnelOpen and onTunnelEnd are Options.TunnelTimeout, OnTunnelOpen and
	// OnTunnelEnd (boundTunnel).
	tunnelTimeout func() time.Duration
	onTunnelOpen  func()
	onTunnelEnd   func(TunnelEnd)
}

// New returns a Client for the upstream; it dials nothing until the first request.
func New(opts Options) *Client {
	onError := opts.ErrorHandler
	if onError == nil {
		onError = func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusBadGateway) }
	}
	p := newPool(opts.Network, opts.Address, opts.MaxConns)
	p.unasked = opts.OnUnasked
	p.headTimeout = opts.ResponseTimeout
	if opts.ResponseTimeout > 0 {
		// The Transport's own timeout error names no type to match: it becomes ErrResponseTimeout here.
		inner := onError
		onError = func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() == nil && headTimedOut(err) {
				err = responseTimeout(opts.ResponseTimeout, err)
			}
			inner(w, r, err)
		}
	}
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, opts.Network, opts.Address)
		},
		MaxIdleConns:           opts.MaxConns,
		MaxIdleConnsPerHost:    opts.MaxConns,
		MaxConnsPerHost:        opts.MaxConns,
		IdleConnTimeout:        p.idleTimeout,
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: maxAnswerHead,
		ResponseHeaderTimeout:  opts.ResponseTimeout,
		DisableCompression:     true,
		WriteBufferSize:        32 << 10,
		ReadBufferSize:         32 << 10,
	}
	c := &Client{pool: p, transport: tr, proxy: newReverseProxy(p.host, tr, opts.TrustedProxy, onError), onError: onError,
		trusted: opts.TrustedProxy, log: opts.Logger,
		tunnelTimeout: opts.TunnelTimeout, onTunnelOpen: opts.OnTunnelOpen, onTunnelEnd: opts.OnTunnelEnd}
	c.proxy.ModifyResponse = c.boundTunnel
	if opts.Logger != nil {
		c.proxy.ErrorLog = slog.NewLogLogger(opts.Logger.Handler(), slog.LevelWarn)
	}
	return c
}

// newReverseProxy builds the proxy for the requests the fast path does not carry, with Rewrite (not
// the deprecated Director): the upstream's address, the client's path and query as it sent them (see
// the package doc), the forwarding fields (not SetXForwarded, which trusts no proxy) and the original
// Host.
func newReverseProxy(host string, tr http.RoundTripper, trusted func(netip.Addr) bool, onError func(http.ResponseWriter, *http.Request, error)) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			// Not SetURL: joining the target's empty path to the client's turns "*" into "/*".
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", host
			pr.Out.URL.RawQuery = pr.In.URL.RawQuery // ReverseProxy dropped what it could not parse
			fw := newForwarding(pr.In, trusted)
			dropUnbelieved(pr.Out.Header, &fw)
			fw.setFields(pr.Out.Header)
			pr.Out.Host = pr.In.Host
		},
		Transport:    tr,
		BufferPool:   buffers,
		ErrorHandler: onError,
	}
}

// Serve proxies r to the upstream: on the fast path when r is a GET, HEAD or OPTIONS without a body,
// an Upgrade or an Expect (nearly all traffic), else through the ReverseProxy.
func (c *Client) Serve(w http.ResponseWriter, r *http.Request) {
	if forwardable(r) {
		c.forward(w, r)
		return
	}
	c.proxy.ServeHTTP(w, r)
}

// Adopt takes conn, an open connection to the upstream on which nothing is pending (the health
// gate's last probe), into the fast path's idle connections, or closes it when the pool is full or
// conn holds unread bytes (then telling Options.OnUnasked). A *Conn keeps its buffers. It counts as
// reused: should the tenant have closed it meanwhile, the request that takes it is retried on a new
// connection.
func (c *Client) Adopt(conn net.Conn) {
	uc, ok := conn.(*Conn)
	if !ok {
		uc = NewConn(conn)
	}
	c.pool.adopt(uc)
}

// CloseIdle closes every idle connection to the upstream, on both paths, and stops the pool's
// reaper: for a tenant that has gone to sleep or died, whose connections would otherwise linger until
// their idle timeout. Requests in flight are not touched; the Client stays usable, and a later request
// dials anew.
func (c *Client) CloseIdle() {
	c.pool.closeIdle()
	c.transport.CloseIdleConnections()
}

// bufferPool lends both paths their 32 KiB copy buffers. It keeps *[]byte, so that the fast path,
// which takes and returns the pointer (get, put), allocates nothing per request; the ReverseProxy's
// BufferPool interface (Get, Put) hands over the slice itself.
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) get() *[]byte {
	if v := b.p.Get(); v != nil {
		return v.(*[]byte)
	}
	buf := make([]byte, 32<<10)
	return &buf
}

func (b *bufferPool) put(buf *[]byte) { b.p.Put(buf) }

func (b *bufferPool) Get() []byte { return *b.get() }

func (b *bufferPool) Put(buf []byte) { b.put(&buf) }

// buffers is shared by every Client: a sync.Pool is safe for concurrent use, and a buffer one route
// returns serves the next request of any other.
var buffers = &bufferPool{}

// ErrResponseTimeout fails a request whose upstream did not begin its answer within
// Options.ResponseTimeout.
var ErrResponseTimeout = errors.New("no answer from the tenant within response_timeout")

// responseTimeout is ErrResponseTimeout for a bound of d, with what the connection said.
func responseTimeout(d time.Duration, err error) error {
	return fmt.Errorf("%w (%v): %w", ErrResponseTimeout, d, err)
}

// headTimedOut reports whether err, from the ReverseProxy's Transport, is its ResponseHeaderTimeout
// passing: a timeout that is not a dial's (whose bound is the dialer's own).
func headTimedOut(err error) bool {
	var ne net.Error
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	return errors.As(err, &ne) && ne.Timeout()
}
