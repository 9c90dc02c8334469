package activator

// The proxy's fast path for the requests that make up nearly all proxied traffic, without
// httputil.ReverseProxy.

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
)

// forwardable: requests forward can carry — GET, HEAD and OPTIONS without a body, an Upgrade (protocol
// switch) or Expect (100-continue handshake). fastEligible is the same test for an outgoing request.
func forwardable(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
	default:
		return false
	}
	return (r.Body == nil || r.Body == http.NoBody) && r.ContentLength == 0 && len(r.TransferEncoding) == 0 &&
		r.Header.Get("Upgrade") == "" && r.Header.Get("Expect") == ""
}

// forward proxies r to the route's upstream over the fast transport's connections and reports true,
// or reports false, having done nothing, when r is not forwardable (the caller then uses the
// ReverseProxy). It is what the ReverseProxy with the route's Rewrite does (newProxy), minus its
// per-request work: the outgoing request is written straight from the incoming one, with no clone
// of it or of its header map, no header sorting and no Rewrite closure; the answer's header is moved,
// not copied; the Content-Type is only parsed when it could be an event stream. Behind wrk, pinned
// with the app on one CPU, the ReverseProxy path was ~19 % slower (BenchmarkEdgeWrk, in-process).
//
// What the upstream sees is the same: the original Host, method and request-URI; the client's
// header without hop-by-hop fields (RFC 9110 7.6.1: Connection and those it lists, Keep-Alive,
// Proxy-Connection, Proxy-Authenticate, Proxy-Authorization, TE except "trailers", Trailer,
// Transfer-Encoding, Upgrade) and without any Forwarded or X-Forwarded-* the client sent; then
// X-Forwarded-For (the client's address), X-Forwarded-Host and X-Forwarded-Proto. What the client
// sees is the same too: 1xx answers passed on, hop-by-hop fields dropped from the answer, trailers
// announced and passed on, event streams and bodies of unknown length flushed as they come, a failed
// body copy aborting the client connection, and an upstream failure answered by writeError.
func (in *instance) forward(w http.ResponseWriter, r *http.Request) bool {
	if !forwardable(r) {
		return false
	}
	ft := in.fast()
	if ft == nil {
		return false
	}
	got1xx := func(code int, h http.Header) error {
		wh := w.Header()
		removeHopByHop(h)
		for k, vv := range h {
			wh[k] = vv
		}
		w.WriteHeader(code)
		clear(wh)
		return nil
	}
	resp, err := ft.do(r, func(bw *bufio.Writer) error { return writeHead(bw, r, ft) }, false, got1xx)
	if err != nil {
		if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
			return true // the client went away; there is nobody to answer
		}
		writeError(w, r, &UpstreamError{Route: in.route.Name, Err: err})
		return true
	}
	removeHopByHop(resp.Header)
	wh := w.Header()
	for k, vv := range resp.Header {
		wh[k] = vv
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
	err = copyBody(w, resp, flushEach(resp))
	if err != nil {
		resp.Body.Close()
		// As ReverseProxy: the client must not take a cut body for a whole one.
		panic(http.ErrAbortHandler)
	}
	resp.Body.Close() // fills resp.Trailer
	if len(resp.Trailer) > 0 {
		// Trailers force a chunked answer (net/http would otherwise add a Content-Length).
		_ = http.NewResponseController(w).Flush()
		if len(resp.Trailer) == announced {
			for k, vv := range resp.Trailer {
				wh[k] = vv
			}
		} else {
			for k, vv := range resp.Trailer {
				for _, v := range vv {
					wh.Add(http.TrailerPrefix+k, v)
				}
			}
		}
	}
	return true
}

// writeHead writes r's request line and header for the upstream (see forward).
func writeHead(bw *bufio.Writer, r *http.Request, ft *fastTransport) error {
	host := r.Host
	if host == "" {
		host = ft.address
		if ft.network == "unix" {
			host = "localhost"
		}
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
		if hopByHop(k) || forwardedField(k) || k == "Content-Length" || (len(connection) > 0 && hasToken(connection, k)) {
			continue
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
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		bw.WriteString("X-Forwarded-For: ")
		bw.WriteString(ip)
		bw.WriteString("\r\n")
	}
	bw.WriteString("X-Forwarded-Host: ")
	bw.WriteString(r.Host)
	if r.TLS == nil {
		bw.WriteString("\r\nX-Forwarded-Proto: http\r\n\r\n")
	} else {
		bw.WriteString("\r\nX-Forwarded-Proto: https\r\n\r\n")
	}
	return nil
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

// forwardedField reports the fields the edge sets itself; a client's own are dropped, as the
// ReverseProxy's Rewrite mode does.
func forwardedField(k string) bool {
	switch k {
	case "Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto":
		return true
	}
	return false
}

// hasToken reports whether the comma-separated field values hold token (case-insensitive).
func hasToken(values []string, token string) bool {
	for _, v := range values {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// removeHopByHop deletes an answer's hop-by-hop fields and those its Connection field lists.
func removeHopByHop(h http.Header) {
	for _, f := range h["Connection"] {
		for _, sf := range strings.Split(f, ",") {
			if sf = strings.TrimSpace(sf); sf != "" {
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
// event stream, or a body of unknown length (as the ReverseProxy decides).
func flushEach(resp *http.Response) bool {
	if resp.ContentLength == -1 {
		return true
	}
	ct := resp.Header.Get("Content-Type")
	if len(ct) < len("text/event-stream") {
		return false
	}
	base, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(base), "text/event-stream")
}

// copyBody copies the answer's body to the client with a pooled buffer, flushing after each write
// when flush is set. It returns the first error of either side.
func copyBody(w http.ResponseWriter, resp *http.Response, flush bool) error {
	if resp.Body == http.NoBody {
		return nil
	}
	buf := sharedBuffers.Get()
	defer sharedBuffers.Put(buf)
	var fl http.Flusher
	if flush {
		fl, _ = w.(http.Flusher)
	}
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
			return rerr
		}
	}
}
