package activator

// Request hygiene: what the edge settles before a request is routed, so that nothing it refuses can
// wake a tenant, and so that the edge and the tenant read one request alike. See docs/security.md,
// "Request hygiene".

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/activator/activator/internal/upstream"
)

// Sentinels of the requests the edge refuses before routing them (statusFor: 501 and 400).
var (
	// ErrMethod: CONNECT or TRACE, which the edge implements for no resource.
	ErrMethod = errors.New("method not implemented by the edge")
	// ErrTarget: a request-target the edge does not route: an encoded slash in the path, or a target
	// in no form a tenant is given (an opaque one, or "*" other than for OPTIONS).
	ErrTarget = errors.New("request-target refused")
	// ErrMalformed: an HTTP/2 request that no HTTP/1.1 request line and Host field can say (see
	// h2Malformed). net/http's HTTP/1 server refuses each of these itself.
	ErrMalformed = errors.New("malformed request")
)

// hygiene readies r for routing, or answers it. It returns the writer and request the edge goes on
// with, or a nil request when it has answered (then nothing was routed, so nothing woke).
//
//   - CONNECT and TRACE get 501 (ErrMethod); CONNECT's connection is closed, as tunnel bytes may follow.
//   - A request whose framing was ambiguous on the wire (see framingSuspect) is served, then its
//     connection is closed: its writer puts "Connection: close" on the final answer.
//   - An HTTP/2 request whose method, :path or :authority could not be written to a tenant as an
//     HTTP/1.1 request line and Host gets 400 (ErrMalformed, h2Malformed).
//   - The path loses its dot segments (cleanPath), on r.URL.Path and r.URL.RawPath alike, so the route
//     lookup and the tenant see one path; an encoded slash gets 400 (ErrTarget).
//   - An Upgrade to HTTP itself (h2c) is taken off the request (withoutHTTPUpgrade), which then goes on
//     as a plain one.
//
// A request with a plain path, no Transfer-Encoding and HTTP/1.1 or later (nearly all) passes through
// unchanged and without allocating. A changed path goes into a shallow copy of r, as http.StripPrefix
// makes one: a handler does not modify the request it was given.
func (s *Server) hygiene(w http.ResponseWriter, r *http.Request) (http.ResponseWriter, *http.Request) {
	if framingSuspect(r) {
		w = &closingWriter{ResponseWriter: w}
	}
	var err error
	var malformed string
	if r.ProtoMajor == 2 {
		malformed = h2Malformed(r)
	}
	switch {
	case r.Method == http.MethodConnect || r.Method == http.MethodTrace:
		if r.Method == http.MethodConnect && r.ProtoMajor == 1 {
			w.Header().Set("Connection", "close")
		}
		err = fmt.Errorf("%w: %s", ErrMethod, r.Method)
	case malformed != "":
		err = fmt.Errorf("%w: %s", ErrMalformed, malformed)
	case !routableTarget(r):
		err = fmt.Errorf("%w: not a path (origin or absolute form)", ErrTarget)
	default:
		var p, raw string
		p, raw, err = cleanPath(r.URL.Path, r.URL.RawPath)
		if err == nil && (p != r.URL.Path || raw != r.URL.RawPath) {
			r2 := new(http.Request)
			*r2 = *r
			u := *r.URL
			u.Path, u.RawPath = p, raw
			r2.URL = &u
			r = r2
		}
	}
	if err != nil {
		s.opts.Metrics.requestCounter(unknownRoute)(writeError(w, r, err))
		return w, nil
	}
	if r.Header["Upgrade"] != nil {
		r = withoutHTTPUpgrade(r)
	}
	return w, r
}

// withoutHTTPUpgrade returns r without the Upgrade tokens that ask the tenant to speak HTTP itself on
// the connection (httpUpgrade), in a shallow copy with its own header; r itself when it has none.
// The HTTP2-Settings field goes with them, and when no token is left, Upgrade and Connection's
// "upgrade" and "http2-settings" options too, so that the request goes on as a plain one. WebSocket
// and every other upgrade pass as they came.
//
// Why: a tenant that takes "Upgrade: h2c" answers 101 and then speaks HTTP/2 on the connection,
// which the edge only relays. Every request the client sends after it reaches the tenant unseen: any
// path, not only the route's prefix, and forwarding fields the edge would have replaced. Measured on
// 59746f8 with hypercorn behind a route for /public: a request for /private/admin with
// "x-forwarded-for: 6.6.6.6" reached it as such (h2c smuggling). Go's h2c handler asks for
// "Connection: HTTP2-Settings", which ReverseProxy drops, but hypercorn and others do not. The edge
// implements no h2c upgrade of its own (its h2c is prior knowledge, RFC 9113 deprecates the upgrade),
// so none is asked of a tenant on a client's behalf, as Envoy and Traefik do.
func withoutHTTPUpgrade(r *http.Request) *http.Request {
	all := headerTokens(r.Header["Upgrade"])
	kept := slices.DeleteFunc(slices.Clone(all), httpUpgrade)
	if len(kept) == len(all) {
		return r
	}
	r2 := new(http.Request)
	*r2 = *r
	h := r.Header.Clone()
	h.Del("Http2-Settings")
	if len(kept) > 0 {
		h["Upgrade"] = []string{strings.Join(kept, ", ")}
	} else {
		h.Del("Upgrade")
		options := slices.DeleteFunc(headerTokens(h["Connection"]), func(t string) bool {
			return strings.EqualFold(t, "upgrade") || strings.EqualFold(t, "http2-settings")
		})
		if h.Del("Connection"); len(options) > 0 {
			h["Connection"] = []string{strings.Join(options, ", ")}
		}
	}
	r2.Header = h
	return r2
}

// headerTokens returns the comma-separated tokens of a field's values (or of a query parameter's, for
// the admin API's lists), trimmed as the ReverseProxy trims them (textproto.TrimString), empty ones
// left out.
func headerTokens(values []string) []string {
	var out []string
	for _, v := range values {
		for t := range strings.SplitSeq(v, ",") {
			if t = textproto.TrimString(t); t != "" {
				out = append(out, t)
			}
		}
	}
	return out
}

// httpUpgrade reports whether the Upgrade token t (protocol-name ["/" protocol-version]) names HTTP
// itself: h2c, h2 or HTTP/x.
func httpUpgrade(t string) bool {
	name, _, _ := strings.Cut(t, "/")
	return strings.EqualFold(name, "h2c") || strings.EqualFold(name, "h2") || strings.EqualFold(name, "http")
}

// h2Malformed says what in an HTTP/2 request cannot go to a tenant as HTTP/1.1, or "" when nothing.
// Each tenant hears HTTP/1.1, and HPACK carries bytes that an HTTP/1.1 request line or Host field
// cannot: net/http's HTTP/2 server refuses control bytes but lets these through, where its HTTP/1
// server, like nginx's and HAProxy's, refuses them.
//   - A space in :path. A space in the path is re-escaped on the way out, but the query is written
//     as it came (url.URL.RequestURI, on both of our paths), so ":path: /x?a HTTP/1.0" reached the
//     tenant as "GET /x?a HTTP/1.0 HTTP/1.1", a request line each parser splits its own way.
//   - A :method that is not a token ("GET /y"): it would put a second target in the request line.
//   - An :authority (or host) that is not a valid Host ("a b.example.com", "a/b.example.com"): a
//     wildcard route matched it, and Request.Write then cut it down, so the tenant got a Host other
//     than the one routed on (an empty one).
//   - A :path in absolute form, or with a fragment (RFC 9113 §8.3.1: origin form or "*"). Go's server
//     took "http://other.test/x" and routed it by :authority, while a filter in front may have judged
//     the URI's host; "/x#frag" reached the tenant as "/x%23frag".
func h2Malformed(r *http.Request) string {
	switch {
	case strings.IndexByte(r.RequestURI, ' ') >= 0:
		return "a space in :path"
	case r.RequestURI != "*" && !strings.HasPrefix(r.RequestURI, "/"):
		// RFC 9113 §8.3.1: origin form, or "*". Go's server takes an absolute URI and routes by
		// :authority, while a proxy or filter in front may have judged the URI's host.
		return ":path is not a path (absolute form has no place in HTTP/2)"
	case strings.IndexByte(r.RequestURI, '#') >= 0:
		return "a fragment in :path"
	case !httpguts.ValidHeaderFieldName(r.Method): // a method is a token, as a field name is
		return "the method is not a token"
	case !httpguts.ValidHostHeader(r.Host):
		return "the authority is not a valid host"
	}
	return ""
}

// routableTarget reports whether r's request-target gives the route lookup a path: origin form or
// absolute form (a path starting with "/", or none: "http://a.test" is "/"), or "*" for OPTIONS. Not
// an opaque URI ("http:x"), or "*" for another method.
func routableTarget(r *http.Request) bool {
	p := r.URL.Path
	switch {
	case r.URL.Opaque != "":
		return false
	case p == "" || p[0] == '/':
		return true
	}
	return p == "*" && r.Method == http.MethodOptions
}

// cleanPath returns a request's path and raw path (url.URL's Path and RawPath) after RFC 3986 §5.2.4
// remove_dot_segments, or ErrTarget for an encoded slash ("%2F" or "%2f"), which would make the raw
// and the decoded path differ in their segments. A raw segment that decodes to "." or ".." ("%2E",
// ".%2e", …) is a dot segment too (RFC 3986 §6.2.2.2); every other segment is kept byte for byte.
// Dot segments that climb above the root are dropped: "/../x" is "/x".
//
// It does no work for a path with no dot segment whose raw form is the default encoding (raw ""): the
// decoded path shows every dot segment the raw one has, since without an encoded slash their
// segments are one to one.
func cleanPath(p, raw string) (string, string, error) {
	if raw != "" && (strings.Contains(raw, "%2F") || strings.Contains(raw, "%2f")) {
		return p, raw, fmt.Errorf("%w: encoded slash in the path", ErrTarget)
	}
	if !hasDotSegment(p) {
		return p, raw, nil
	}
	if raw == "" {
		return removeDotSegments(p, false), "", nil
	}
	raw = removeDotSegments(raw, true)
	p, err := url.PathUnescape(raw)
	if err != nil { // raw came through url.ParseRequestURI, so it unescapes
		return p, raw, fmt.Errorf("%w: %w", ErrTarget, err)
	}
	return p, raw, nil
}

// hasDotSegment reports whether the decoded path p (starting with "/") has a "." or ".." segment.
func hasDotSegment(p string) bool {
	for i := strings.Index(p, "/."); i >= 0; {
		rest := p[i+2:]
		if rest == "" || rest[0] == '/' || rest[0] == '.' && (len(rest) == 1 || rest[1] == '/') {
			return true
		}
		j := strings.Index(rest, "/.")
		if j < 0 {
			break
		}
		i += 2 + j
	}
	return false
}

// removeDotSegments is RFC 3986 §5.2.4 for a path that starts with "/" (any other is returned as it
// is), segment by segment; escaped says p is a raw path, whose "%2E" is a ".".
func removeDotSegments(p string, escaped bool) string {
	if p == "" || p[0] != '/' {
		return p
	}
	out := make([]byte, 0, len(p))
	for rest := p[1:]; ; {
		seg, tail, more := strings.Cut(rest, "/")
		dots := dotSegment(seg, escaped)
		switch dots {
		case 1:
		case 2:
			if i := bytes.LastIndexByte(out, '/'); i >= 0 {
				out = out[:i]
			}
		default:
			out = append(out, '/')
			out = append(out, seg...)
		}
		if !more {
			if dots > 0 { // a final dot segment names a directory: "/a/b/.." is "/a/"
				out = append(out, '/')
			}
			break
		}
		rest = tail
	}
	return string(out)
}

// dotSegment returns 1 for a "." segment, 2 for "..", else 0; escaped counts "%2E" and "%2e" as ".".
func dotSegment(seg string, escaped bool) int {
	n := 0
	for i := 0; i < len(seg); n++ {
		switch {
		case n == 2:
			return 0
		case seg[i] == '.':
			i++
		case escaped && i+3 <= len(seg) && seg[i] == '%' && seg[i+1] == '2' && (seg[i+2] == 'E' || seg[i+2] == 'e'):
			i += 3
		default:
			return 0
		}
	}
	return n
}

// framingSuspect reports whether r's connection must be closed once it is answered, because its
// header framed the body in two ways: Content-Length and Transfer-Encoding in HTTP/1.1 (RFC 9112
// §6.1: "the server MUST close the connection after responding"), or any Transfer-Encoding in
// HTTP/1.0 (§6.1: the framing "is faulty").
//
// net/http hides both from a handler. It deletes the Transfer-Encoding field and, for a chunked body,
// the Content-Length field, leaving a chunked request that had a Content-Length exactly like one that
// had none; it ignores Transfer-Encoding in HTTP/1.0 and frames by Content-Length. So the edge looks
// at the wire: Listener records which of the two fields a connection has carried, and ConnContext
// hands that record to the connection's requests. Without a record (the handler served on another
// listener) every chunked and every HTTP/1.0 request counts as suspect.
func framingSuspect(r *http.Request) bool {
	http11 := r.ProtoAtLeast(1, 1)
	if http11 && len(r.TransferEncoding) == 0 || r.ProtoMajor > 1 {
		return false
	}
	fc, ok := r.Context().Value(framingKey{}).(*framingConn)
	if !ok {
		return true
	}
	if http11 {
		return fc.seen.Load()&sawContentLength != 0
	}
	return fc.seen.Load()&sawTransferEncoding != 0
}

// closingWriter puts "Connection: close" on the final answer (not on 1xx ones), which makes net/http
// close the connection once it is sent. It is set on the answer itself, not on the header map up
// front: the proxy clears that map after passing an informational answer on.
type closingWriter struct {
	http.ResponseWriter
	done bool // the final answer's header has been written
}

func (w *closingWriter) final() {
	if !w.done {
		w.done = true
		w.ResponseWriter.Header().Set("Connection", "close")
	}
}

func (w *closingWriter) WriteHeader(code int) {
	if code >= 200 {
		w.final()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *closingWriter) Write(b []byte) (int, error) {
	w.final()
	return w.ResponseWriter.Write(b)
}

func (w *closingWriter) Flush() {
	w.final()
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *closingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Listener wraps one of the edge's listeners: each connection it accepts records whether its bytes
// have carried a header field named Content-Length or Transfer-Encoding, for framingSuspect. Serve it
// with ConnContext as the http.Server's ConnContext. The record must see the bytes net/http parses, so
// a TLS listener goes inside it (one that returns *tls.Conn with the handshake done, as
// tlsedge.Listener does): a connection that negotiated HTTP/2 is returned as it is, as net/http needs
// it (HTTP/2 frames its own bodies), and any other is recorded like a plain one. net/http then serves
// such a connection as plain HTTP/1, and its requests lack r.TLS until WithTLS, in front of every
// handler of the server, puts it back.
//
// sendTimeout (edge.send_timeout; 0 for none) bounds how long a client may leave the next piece of an
// answer, sendChunk bytes, untaken before its write fails and net/http closes the connection: see
// framingConn.Write. A connection that negotiated HTTP/2 over TLS is not wrapped, so the http.Server's
// HTTP2Config.WriteByteTimeout must bound its writes.
func Listener(ln net.Listener, sendTimeout time.Duration) net.Listener {
	return framingListener{ln, sendTimeout}
}

// WithTLS gives a request that came over TLS through Listener its r.TLS, which net/http sets only for
// a connection it sees as a *tls.Conn: the same state, which net/http would have shared by every
// request of the connection too. Put it in front of everything that reads r.TLS (the redirects of
// redirect_http, X-Forwarded-Proto, parking); other requests pass through untouched.
func WithTLS(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil {
			// Set where net/http would have set it, before any handler saw r: not a change to a
			// request a handler was given.
			r.TLS = connTLS(r)
		}
		next.ServeHTTP(w, r)
	})
}

// overTLS reports whether r came over TLS, whether or not WithTLS has run.
func overTLS(r *http.Request) bool { return r.TLS != nil || connTLS(r) != nil }

// connTLS is the TLS state of the connection Listener recorded r on; nil for a plain one, or none.
func connTLS(r *http.Request) *tls.ConnectionState {
	if fc, ok := r.Context().Value(framingKey{}).(*framingConn); ok {
		return fc.tls
	}
	return nil
}

// ConnContext is the edge http.Server's ConnContext, and the resume server's (EnableParking): it gives
// the requests of a connection accepted by Listener that connection's record, and those of a resumed
// connection the parked request they stand in for.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if rc, ok := c.(*resumedConn); ok { // a parked connection back from its hold (park.go)
		ctx = context.WithValue(ctx, resumedKey{}, rc)
		c = rc.Conn
	}
	if lb, ok := c.(*loopBack); ok { // a connection the event loop gave back (loop.go)
		ctx = context.WithValue(ctx, loopBackKey{}, lb)
		c = lb.Conn
	}
	if fc, ok := c.(*framingConn); ok {
		return context.WithValue(ctx, framingKey{}, fc)
	}
	return ctx
}

type framingKey struct{}

type framingListener struct {
	net.Listener
	sendTimeout time.Duration
}

func (l framingListener) Accept() (net.Conn, error) {
	// net/http's Serve calls Accept right after it started the previous connection's goroutine, which
	// waits on this P: yielding runs it here at once. Left waiting, it is stolen by an idle CPU woken
	// for it, tens of microseconds later on a virtual machine, before its first request is read: a
	// cold request's wake starts that much later.
	runtime.Gosched()
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*tls.Conn); ok {
		st := tc.ConnectionState()
		if st.NegotiatedProtocol == "h2" {
			return c, nil
		}
		return &framingConn{Conn: c, tls: &st, sendTimeout: l.sendTimeout, born: time.Now()}, nil
	}
	return &framingConn{Conn: c, sendTimeout: l.sendTimeout, born: time.Now()}, nil
}

// What a framingConn has seen, as bits of seen.
const (
	sawContentLength = 1 << iota
	sawTransferEncoding
)

// framingConn watches the bytes read from a connection for lines that start with "Content-Length:"
// or "Transfer-Encoding:" in any case: the only spelling of those fields net/http accepts (no space
// before the colon, none before the name, which would make the line a continuation). A match in a
// body counts too: the cost of that is a closed connection after a later chunked request, never a
// missed one. The record is sticky, for the same reason: net/http reads ahead, so bytes of the next
// request may arrive during this one.
type framingConn struct {
	net.Conn
	tls  *tls.ConnectionState // the TLS connection's state when Conn is a *tls.Conn (see WithTLS); nil for plain
	seen atomic.Uint32        // sawContentLength | sawTransferEncoding; read by the connection's requests
	// sendTimeout bounds each sendChunk of a Write (0: no bound); ownDeadline is set while someone else
	// (a handler, through http.ResponseController) has a write deadline on the connection, which Write
	// then leaves alone.
	sendTimeout time.Duration
	ownDeadline atomic.Bool
	born        time.Time    // when the connection was accepted: armedUntil counts from it
	armedUntil  atomic.Int64 // the write deadline Write last set, as time since born; 0 for none

	mu    sync.Mutex // guards the matcher below; net/http reads from one goroutine at a time anyway
	field string     // the field name being matched, when matched > 0
	// matched is how many bytes of field the current line has matched; 0 at the start of a line, -1
	// past a line's start that matches no field.
	matched int
	// prefaced is, on a TLS connection, how many of its first bytes have matched http2Preface so far;
	// -1 once one did not (the connection is HTTP/1's).
	prefaced int
}

// http2Preface is how HTTP/2's connection preface begins, which net/http looks for on any connection
// it takes for a plain one and then serves as HTTP/2 (prior knowledge, for h2c). Over TLS only ALPN
// may choose HTTP/2 (RFC 9113 §3.3), and a *tls.Conn that net/http sees as one is never served so: a
// TLS connection behind Listener that starts with it is refused (errPrefaceOverTLS), not served as
// HTTP/2 that was never negotiated.
const http2Preface = "PRI * HTTP/2.0"

var errPrefaceOverTLS = errors.New("HTTP/2 connection preface over TLS without ALPN h2")

// The field names framingConn looks for, lower case, with their colon.
const (
	contentLengthField    = "content-length:"
	transferEncodingField = "transfer-encoding:"
)

// NetConn returns the connection c watches, as *tls.Conn's does: for code that looks for the socket
// underneath (socketOf, and package connlimit, which closes a connection for room at the bottom).
func (c *framingConn) NetConn() net.Conn { return c.Conn }

func (c *framingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.mu.Lock()
		if c.tls != nil && c.prefaced >= 0 && !c.headLocked(b[:n]) {
			c.mu.Unlock()
			return 0, errPrefaceOverTLS
		}
		if seen := c.scanLocked(b[:n]); seen != 0 {
			c.seen.Or(seen)
		}
		c.mu.Unlock()
	}
	return n, err
}

// headLocked feeds b, read next from a TLS connection, to the preface check, and reports false once
// the connection's first bytes are http2Preface (sticky: every read after fails too).
func (c *framingConn) headLocked(b []byte) bool {
	for _, ch := range b {
		if c.prefaced == len(http2Preface) {
			return false
		}
		if ch != http2Preface[c.prefaced] {
			c.prefaced = -1
			return true
		}
		c.prefaced++
	}
	return c.prefaced < len(http2Preface)
}

// scanLocked feeds b to the matcher and returns the fields it completed. It skips from line to line
// with IndexByte, so a body costs about as much as a search for its newlines.
func (c *framingConn) scanLocked(b []byte) uint32 {
	var seen uint32
	for i := 0; i < len(b); {
		if c.matched < 0 {
			j := bytes.IndexByte(b[i:], '\n')
			if j < 0 {
				return seen
			}
			i += j + 1
			c.matched = 0
			continue
		}
		ch := b[i]
		if 'A' <= ch && ch <= 'Z' {
			ch += 'a' - 'A'
		}
		if c.matched == 0 {
			switch ch {
			case 'c':
				c.field = contentLengthField
			case 't':
				c.field = transferEncodingField
			default:
				c.matched = -1 // b[i] is looked at again: it may be the '\n' of an empty line
				continue
			}
		}
		if ch != c.field[c.matched] {
			c.matched = -1
			continue
		}
		i++
		if c.matched++; c.matched == len(c.field) {
			if c.field == contentLengthField {
				seen |= sawContentLength
			} else {
				seen |= sawTransferEncoding
			}
			c.matched = -1
		}
	}
	return seen
}

// sendChunk is the most of an answer framingConn.Write hands the kernel at once. A client must take
// this much within edge.send_timeout, so the bound is on progress, as nginx's send_timeout is, not on
// a whole answer: at the default 60s, a client that takes at least about 550 bytes a second always
// keeps its connection (each piece gets between 30 and 60 s: see Write).
const sendChunk = 16 << 10

// Write writes b a sendChunk at a time under a write deadline of sendTimeout, unless a write deadline
// of someone else's is in force. Without it a client that stopped reading held its connection, the
// request's goroutine and its route's upstream connection slot for ever: the edge has no WriteTimeout
// (an answer may rightly take longer than any fixed bound), and max_upstream_conns of such clients
// left the route answering everyone else 503 (measured on 64fda5b: a route's 4 slots stayed taken past
// 60s by 4 clients that never read an 8 MiB answer).
//
// The deadline is moved only when less than half of sendTimeout is left of it, not at every write:
// setting one costs a runtime timer update, and a deadline on every write cost the warm path 2% of its
// requests a second. So each piece gets between half of sendTimeout and all of it.
func (c *framingConn) Write(b []byte) (int, error) {
	if c.sendTimeout <= 0 || c.ownDeadline.Load() {
		return c.Conn.Write(b)
	}
	n := 0
	for len(b) > 0 {
		p := b[:min(len(b), sendChunk)]
		c.armWrite()
		m, err := c.Conn.Write(p)
		n += m
		if err != nil {
			return n, err
		}
		b = b[m:]
	}
	return n, nil
}

// armWrite moves the connection's write deadline to sendTimeout from now when less than half of it
// is left. Times are monotonic, from the connection's accept (born): a step of the wall clock cannot
// leave a deadline that looks far off but has passed.
func (c *framingConn) armWrite() {
	now := time.Since(c.born)
	if until := time.Duration(c.armedUntil.Load()); until-now >= c.sendTimeout/2 {
		return
	}
	_ = c.Conn.SetWriteDeadline(c.born.Add(now + c.sendTimeout))
	c.armedUntil.Store(int64(now + c.sendTimeout))
}

// SetWriteDeadline sets a write deadline of the caller's, which Write then keeps to until it is
// cleared. Clearing one that is not set is dropped: net/http clears the write deadline after every
// answer, and the deadline Write keeps (which only bounds writes, as it should) then stays armed for
// the next answer instead of being set again for each.
func (c *framingConn) SetWriteDeadline(t time.Time) error {
	if t.IsZero() && c.sendTimeout > 0 && !c.ownDeadline.Load() {
		return nil
	}
	c.ownDeadline.Store(!t.IsZero())
	c.armedUntil.Store(0) // Write arms its own afresh once the caller's is cleared
	return c.Conn.SetWriteDeadline(t)
}

// SetDeadline is SetWriteDeadline's for both directions.
func (c *framingConn) SetDeadline(t time.Time) error {
	c.ownDeadline.Store(!t.IsZero())
	c.armedUntil.Store(0)
	return c.Conn.SetDeadline(t)
}

// CloseWrite half-closes the connection when the one wrapped can: net/http does that before it
// closes a connection after an answer, so that the client reads the answer before a reset.
func (c *framingConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// upstreamCause is the class of an upstream failure, as a client may read it: what happened to the
// connection, never where it went.
func upstreamCause(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ENOENT): // ENOENT: no Unix socket
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "connection reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		// net.ErrClosed: the transport closed its end once the exchange broke, while still writing.
		return "connection closed before the answer"
	case errors.Is(err, upstream.ErrResponseTimeout):
		return "no answer within the route's response_timeout"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "unreachable"
	case outOfFiles(err):
		return outOfFilesMsg
	}
	return "bad exchange"
}

// outOfFiles reports whether err is the process's (EMFILE) or the system's (ENFILE) open-file limit.
func outOfFiles(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// withoutAddresses replaces the network addresses in an error's text with "<address>": IP literals
// with or without a port, host:port, a URL's authority, a Unix socket's path after "unix", and a name
// after "lookup". An edge error body quotes backends (a dial error, a tenant's stderr) and must not
// tell a client where the tenants live; the log and the admin API keep the whole text. It errs on the
// side of replacing (a "main.go:12" goes too).
func withoutAddresses(msg string) string {
	return addressPattern.ReplaceAllStringFunc(msg, func(m string) string {
		if i := strings.Index(m, "://"); i >= 0 {
			return m[:i+3] + "<address>"
		}
		if i := strings.IndexByte(m, ' '); i >= 0 { // "unix …", "lookup …"
			return m[:i+1] + "<address>"
		}
		return "<address>"
	})
}

// addressPattern matches what withoutAddresses replaces. Read only: a Regexp is safe for concurrent
// use.
var addressPattern = regexp.MustCompile(`(?i)` +
	`\b[a-z][a-z0-9+.-]*://[^/\s"'<>]+` + // a URL's scheme and authority
	`|\[[0-9a-f:.]+(?:%[^\]\s]*)?\](?::\d+)?` + // [IPv6], with a zone and a port
	`|\b(?:[0-9a-f]{1,4}:){7}[0-9a-f]{1,4}\b` + // IPv6 in full
	`|\b[0-9a-f]{1,4}(?::[0-9a-f]{1,4})*::(?:[0-9a-f]{1,4}(?::[0-9a-f]{1,4})*\b)?` + // IPv6 with "::"
	`|::[0-9a-f]{1,4}(?::[0-9a-f]{1,4})*\b` + // IPv6 starting with "::" ("::1")
	`|\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b` + // IPv4, with a port
	`|\bunix(?:gram|packet)? [^\s:]+` + // a Unix socket's path, as net errors name it
	`|\blookup [^\s:]+` + // the name a DNS lookup failed for
	`|\b[a-z0-9.-]*[a-z][a-z0-9.-]*:\d{1,5}\b`) // host:port, the host with a letter (not a time)
