package upstream

// The fast path for the requests that make up nearly all proxied traffic, without
// httputil.ReverseProxy.

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"net/textproto"
	"strings"
)

// forwardable: requests forward can carry. GET, HEAD and OPTIONS without a body, an Upgrade (protocol
// switch) or Expect (100-continue handshake), to a plain Host.
func forwardable(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
	default:
		return false
	}
	return (r.Body == nil || r.Body == http.NoBody) && r.ContentLength == 0 && len(r.TransferEncoding) == 0 &&
		r.Header.Get("Upgrade") == "" && r.Header.Get("Expect") == "" && plainHost(r.Host)
}

// plainHost reports whether h is a host[:port] that net/http's Request.Write sends unchanged: ASCII
// letters, digits and "-._:[]". Any other (an IPv6 zone, a name to punycode, a byte Request.Write
// would blank the field for, as the host of an absolute-form URI may hold) goes to the ReverseProxy,
// whose Request.Write decides.
func plainHost(h string) bool {
	for i := 0; i < len(h); i++ {
		switch c := h[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '-', c == '.', c == '_', c == ':', c == '[', c == ']':
		default:
			return false
		}
	}
	return true
}

// forward proxies r (forwardable) over the pool's connections. It does what the ReverseProxy does
// (see the package doc), minus its per-request work: the outgoing request is written straight from
// the incoming one, with no clone of it or of its header map, no header sorting and no Rewrite
// closure; the answer's header is moved, not copied; the Content-Type is only parsed when it could be
// an event stream.
func (c *Client) forward(w http.ResponseWriter, r *http.Request) {
	fw := newForwarding(r, c.trusted)
	resp, err := c.pool.do(r, &fw, c.got1xx(w), w.Header())
	if err != nil {
		c.onError(w, r, err)
		return
	}
	c.writeAnswer(w, r, resp)
}

// got1xx returns the exchange's callback for informational answers, which passes them on to w.
func (c *Client) got1xx(w http.ResponseWriter) func(int, http.Header) error {
	return func(code int, h http.Header) error {
		wh := w.Header()
		removeHopByHop(h)
		for k, vv := range h {
			wh[k] = vv
		}
		w.WriteHeader(code)
		clear(wh)
		return nil
	}
}

// writeAnswer passes resp on to the client: the header without hop-by-hop fields, the body (for an
// event stream or a body of unknown length, the head at once and each chunk as it comes) and the
// trailers, announced ones as trailers, others with http.TrailerPrefix. A failed body copy aborts the
// client's connection, as the ReverseProxy does: the client must not take a cut body for a whole one.
// An answer with a nil Header had its fields put into w's header by the pool already (plainHead); it
// has no trailers, and it is the connection's own, not to be read once its body is closed. A body that
// the tenant broke off (not one the client stopped reading) is logged to c.log.
func (c *Client) writeAnswer(w http.ResponseWriter, r *http.Request, resp *http.Response) {
	wh := w.Header()
	plain := resp.Header == nil
	if !plain {
		removeHopByHop(resp.Header)
		for k, vv := range resp.Header {
			wh[k] = vv
		}
	}
	announced := len(resp.Trailer)
	if announced > 0 {
		keys := make([]string, 0, announced)
		for k := range resp.Trailer {
			keys = append(keys, k)
		}
		wh.Add("Trailer", strings.Join(keys, ", "))
	}
	w.WriteHeader(resp.StatusCode)
	var fl http.Flusher
	if flushEach(resp.ContentLength, wh) {
		// As the ReverseProxy: a stream's head goes out at once, not with its first event.
		if fl, _ = w.(http.Flusher); fl != nil {
			fl.Flush()
		}
	}
	if err := copyBody(w, resp, fl); err != nil {
		resp.Body.Close()
		if re, ok := err.(readError); ok && c.log != nil && r.Context().Err() == nil {
			c.log.Warn("the tenant's answer broke off before its end: the client's connection is closed", "method", r.Method, "status", resp.StatusCode, "err", re.err)
		}
		panic(http.ErrAbortHandler)
	}
	resp.Body.Close() // fills resp.Trailer
	if plain || len(resp.Trailer) == 0 {
		return
	}
	// Trailers force a chunked answer (net/http would otherwise add a Content-Length).
	_ = http.NewResponseController(w).Flush()
	if len(resp.Trailer) == announced {
		for k, vv := range resp.Trailer {
			wh[k] = append(wh[k], vv...) // after a header field of the same name, as the ReverseProxy
		}
		return
	}
	for k, vv := range resp.Trailer {
		for _, v := range vv {
			wh.Add(http.TrailerPrefix+k, v)
		}
	}
}

// writeHead writes r's request line and header for the upstream (see the package doc), with fw's
// forwarding fields; host stands in for a missing Host. Write errors stick in bw and surface when it
// is flushed.
func writeHead(bw *bufio.Writer, r *http.Request, fw *forwarding, host string) {
	if r.Host != "" {
		host = r.Host
	}
	bw.WriteString(r.Method)
	bw.WriteByte(' ')
	bw.WriteString(r.URL.RequestURI())
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(host)
	bw.WriteString("\r\n")
	connection := r.Header["Connection"]
	for k, vv := range r.Header {
		// Content-Length: the request has no body (forwardable), so there is nothing to declare;
		// net/http's Request.Write drops a GET's "Content-Length: 0" too.
		if hopByHop(k) || forwardedField(k) || k == "Content-Length" || (len(connection) > 0 && hasToken(connection, k)) ||
			clientField(k) && !fw.believed() {
			continue
		}
		if k == "User-Agent" {
			// As Request.Write: the first value alone, and none when it is empty.
			if vv = vv[:1]; vv[0] == "" {
				continue
			}
		}
		for _, v := range vv {
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	if hasToken(r.Header["Te"], "trailers") {
		bw.WriteString("Te: trailers\r\n")
	}
	fw.xForwarded(func(name, value string) {
		bw.WriteString(name)
		bw.WriteString(": ")
		bw.WriteString(value)
		bw.WriteString("\r\n")
	})
	// Forwarded is appended into bw's free space, with no string made of it.
	b := append(bw.AvailableBuffer(), "Forwarded: "...)
	b = append(fw.appendForwarded(b), "\r\n\r\n"...)
	bw.Write(b)
}

// hopByHop reports the header fields that describe one connection, not the message (canonical keys).
func hopByHop(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// forwardedField reports the fields the edge sets itself (forwarding): a client's own are not copied,
// as the ReverseProxy's Rewrite mode drops them; a trusted proxy's are passed on through forwarding.
// Their aliases with underscores go too (forwardedAlias).
func forwardedField(k string) bool {
	switch k {
	case "Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto":
		return true
	}
	return strings.IndexByte(k, '_') >= 0 && forwardedAlias(k)
}

// forwardedAlias reports whether k, a field name with an underscore, reads as one of the X-Forwarded-*
// fields or a clientField once its underscores are read as hyphens, in any case ("X_Forwarded_For",
// "x_real_ip"). Such a field is never passed on, from anyone: no proxy spells its fields so. A tenant behind a CGI-style gateway sees field names with hyphens
// turned into underscores (HTTP_X_FORWARDED_FOR), and Python's wsgiref then merged a client's
// "X_Forwarded_For: 6.6.6.6" with the edge's X-Forwarded-For: the tenant read "6.6.6.6,127.0.0.1"
// (measured on 990f9bc). nginx drops every field with an underscore by default; the edge drops
// only those that would speak for it.
func forwardedAlias(k string) bool {
	k = textproto.CanonicalMIMEHeaderKey(strings.ReplaceAll(k, "_", "-")) // allocates, for the rare name with an underscore only
	return k == "X-Forwarded-For" || k == "X-Forwarded-Host" || k == "X-Forwarded-Proto" || clientField(k)
}

// dropUnbelieved deletes from h, the ReverseProxy's outgoing header (whose four forwarding fields
// Rewrite mode has already dropped), the fields forwardedAlias names, and the clientFields unless fw's
// peer is a trusted proxy: the fields the fast path's writeHead leaves out.
func dropUnbelieved(h http.Header, fw *forwarding) {
	for k := range h {
		if strings.IndexByte(k, '_') >= 0 && forwardedAlias(k) || clientField(k) && !fw.believed() {
			delete(h, k)
		}
	}
}

// hasToken reports whether the comma-separated field values hold token, in any ASCII case. Tokens
// are trimmed and compared as the ReverseProxy does (textproto.TrimString, no Unicode folding): a
// field it keeps is kept here too.
func hasToken(values []string, token string) bool {
	for _, v := range values {
		for t := range strings.SplitSeq(v, ",") {
			if asciiEqualFold(textproto.TrimString(t), token) {
				return true
			}
		}
	}
	return false
}

// asciiEqualFold is strings.EqualFold for ASCII letters only.
func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		ca, cb := a[i], b[i]
		if 'A' <= ca && ca <= 'Z' {
			ca += 'a' - 'A'
		}
		if 'A' <= cb && cb <= 'Z' {
			cb += 'a' - 'A'
		}
		if ca != cb {
			return false
		}
	}
	return true
}

// removeHopByHop deletes an answer's hop-by-hop fields and those its Connection field lists, as the
// ReverseProxy does.
func removeHopByHop(h http.Header) {
	for _, f := range h["Connection"] {
		for sf := range strings.SplitSeq(f, ",") {
			if sf = textproto.TrimString(sf); sf != "" {
				delete(h, http.CanonicalHeaderKey(sf))
			}
		}
	}
	for k := range h {
		if hopByHop(k) {
			delete(h, k)
		}
	}
}

// flushEach reports whether each chunk of the answer's body is flushed to the client as it comes: an
// event stream, or a body of unknown length (as the ReverseProxy decides). h is the answer's header
// as the client gets it.
func flushEach(length int64, h http.Header) bool {
	if length == -1 {
		return true
	}
	ct := h.Get("Content-Type")
	if len(ct) < len("text/event-stream") {
		return false
	}
	base, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(base), "text/event-stream")
}

// copyBody copies the answer's body to the client with a pooled buffer, flushing after each write
// when fl is not nil. It returns the first error of either side.
// readError is copyBody's failure to read the answer (the tenant's side), as against a failure to
// write it (the client's).
type readError struct{ err error }

func (e readError) Error() string { return e.err.Error() }
func (e readError) Unwrap() error { return e.err }

func copyBody(w http.ResponseWriter, resp *http.Response, fl http.Flusher) error {
	if resp.Body == http.NoBody {
		return nil
	}
	bp := buffers.get()
	defer buffers.put(bp)
	buf := *bp
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			if fl != nil {
				fl.Flush()
			}
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				return nil
			}
			return readError{rerr}
		}
	}
}
