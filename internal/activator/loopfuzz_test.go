package activator

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/activator/activator/internal/registry"
)

// dumpTenant answers with what it received, as net/http's server parsed it: the method, the
// request-target, the Host, every header field (the map, names sorted, each name's values in their
// order) and the body's length; so two answers are alike when the tenant received alike. Some paths
// shape the answer another way, to take the loop's other ways of passing one on: /chunked (no length:
// net/http finishes it), /big (past the 2048 bytes net/http holds back), /sse (an event stream with a
// length: the loop flushes its head at once), /hints (a 103 first), /hop (a field its Connection
// names, which is dropped), /ct (a Content-Type and a field twice), /204 and /304.
func dumpTenant(w http.ResponseWriter, r *http.Request) {
	n, _ := io.Copy(io.Discard, r.Body)
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s host=%q body=%d\n", r.Method, r.RequestURI, r.Host, n)
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range r.Header {
			if !yield(k) {
				return
			}
		}
	}) {
		fmt.Fprintf(&b, "%s: %q\n", k, r.Header[k])
	}
	dump := b.String()
	h := w.Header()
	switch {
	case strings.HasPrefix(r.URL.Path, "/chunked"):
		io.WriteString(w, dump)
		w.(http.Flusher).Flush()
		io.WriteString(w, "end\n")
	case strings.HasPrefix(r.URL.Path, "/big"):
		big := dump + strings.Repeat("x", 3000)
		h.Set("Content-Length", fmt.Sprint(len(big))) // else net/http chunks what passes its buffer
		io.WriteString(w, big)
	case strings.HasPrefix(r.URL.Path, "/sse"):
		h.Set("Content-Type", "text/event-stream")
		h.Set("Content-Length", fmt.Sprint(len(dump)))
		io.WriteString(w, dump)
	case strings.HasPrefix(r.URL.Path, "/hints"):
		h.Set("Link", "</a.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		io.WriteString(w, dump)
	case strings.HasPrefix(r.URL.Path, "/hop"):
		h.Set("Connection", "X-Hop")
		h.Set("X-Hop", "1")
		io.WriteString(w, dump)
	case strings.HasPrefix(r.URL.Path, "/ct"):
		h.Set("Content-Type", "text/x-dump")
		h["X-Twice"] = []string{"b", "a"}
		io.WriteString(w, dump)
	case strings.HasPrefix(r.URL.Path, "/204"):
		w.WriteHeader(http.StatusNoContent)
	case strings.HasPrefix(r.URL.Path, "/304"):
		w.WriteHeader(http.StatusNotModified)
	default:
		io.WriteString(w, dump)
	}
}

// FuzzLoopMatchesNetHTTP: a request sent on a connection the loop owns gets the client what it gets
// as the first request of a new connection, which net/http reads (status, header fields but Date,
// body, whether the connection closes), and the tenant receives the same request (its dump, which the
// answer carries). Both connections are to one edge, whose route app (app.test, awake) answers with
// dumpTenant; another host gets the edge's 404. The request is a head (line and fields), with body
// after it when body is not empty, framed by a Content-Length the harness adds; with twice, the same
// request is sent again right behind it (pipelined), in one write, and both answers compared: so the
// bytes the loop or net/http read past one request must reach the next, through every hand-over
// between them.
//
// What is left out, and why. A head with framing fields of its own (Content-Length,
// Transfer-Encoding): the fuzzer would have to make a body to match them, and a body that does not
// match leaves one side waiting for bytes that never come. A head with a blank line inside (a second
// request) or a request line of its own lines: each input is one head, so that each side answers once
// per head and no read waits. A head shorter than "PRI * HTTP/2.0", or one that starts with "PRI": on
// a new connection net/http waits for that many bytes to tell HTTP/2's preface, and for the rest of
// the preface after it (on both paths: the loop's hands-back are new connections to the resume
// server). The field order the tenant sees: net/http's path writes the header from a map, in no order,
// the loop writes fields in the client's order; both are one header (RFC 9110 §5.3), and the dump
// compares the map.
func FuzzLoopMatchesNetHTTP(f *testing.F) {
	for _, s := range [][2]string{
		// Realistic: curl, a browser, wrk, a keep-alive client.
		{"GET / HTTP/1.1", "Host: app.test\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n"},
		{"GET /index.html?q=1&r=%41 HTTP/1.1", "Host: app.test\r\nConnection: keep-alive\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64)\r\n" +
			"Accept: text/html,application/xhtml+xml\r\nAccept-Encoding: gzip, deflate, br\r\nAccept-Language: en-GB,en;q=0.9\r\n" +
			"Cookie: a=1; b=2\r\nSec-Fetch-Mode: navigate\r\n"},
		{"GET /big HTTP/1.1", "Host: app.test\r\n"},
		{"GET /chunked HTTP/1.1", "Host: app.test\r\n"},
		{"GET /sse HTTP/1.1", "Host: app.test\r\nAccept: text/event-stream\r\n"},
		{"GET /hints HTTP/1.1", "Host: app.test\r\n"},
		{"GET /hop HTTP/1.1", "Host: app.test\r\n"},
		{"GET /ct HTTP/1.1", "Host: APP.test:80\r\n"},
		{"GET /204 HTTP/1.1", "Host: app.test\r\n"},
		{"GET /304 HTTP/1.1", "Host: app.test\r\nIf-None-Match: \"x\"\r\n"},
		{"HEAD / HTTP/1.1", "Host: app.test\r\n"},
		{"GET / HTTP/1.1", "Host: app.test\r\nPragma: no-cache\r\n"},
		{"GET / HTTP/1.1", "Host: app.test\r\nPragma: no-cache\r\nCache-Control: max-age=0\r\n"},
		{"GET / HTTP/1.1", "Host: app.test\r\nUser-Agent: a\r\nuser-agent: b\r\n"},
		{"GET / HTTP/1.1", "Host: app.test\r\nUser-Agent:\r\n"},
		{"GET / HTTP/1.1", "Host: app.test\r\nx-a: 1\r\nX-B: 2\r\nX-A: 3\r\n"},
		{"GET / HTTP/1.1", "Host: app.test\r\nConnection: close\r\n"},
		{"GET / HTTP/1.0", "Host: app.test\r\n"},
		{"GET / HTTP/1.0", "Host: app.test\r\nConnection: keep-alive\r\n"},
		{"OPTIONS * HTTP/1.1", "Host: app.test\r\n"},
		// Adversarial: what hygiene rewrites or refuses, what parsers read two ways, what speaks for
		// the client.
		{"GET /a/../b/./c HTTP/1.1", "Host: app.test\r\n"},
		{"GET /a%2Fb HTTP/1.1", "Host: app.test\r\n"},
		{"GET /a/%2e%2e/b HTTP/1.1", "Host: app.test\r\n"},
		{"GET http://app.test/x HTTP/1.1", "Host: other.test\r\n"},
		{"GET /x HTTP/1.1", "Host: other.test\r\n"},
		{"GET /x HTTP/1.1", ""},
		{"GET /x HTTP/1.1", "Host: \r\n"},
		{"GET /x HTTP/1.1", "Host: app.test\r\nHost: other.test\r\n"},
		{"GET /x HTTP/1.1", "Host: app.test\r\nX-Forwarded-For: 6.6.6.6\r\nForwarded: for=6.6.6.6\r\n"},
		{"GET /x HTTP/1.1", "Host: app.test\r\nX_Forwarded_For: 6.6.6.6\r\nX-Real-IP: 6.6.6.6\r\nTrue-Client-IP: 6.6.6.6\r\n"},
		{"GET /x HTTP/1.1", "Host: app.test\r\nX-A: b\r\n c\r\n"},
		{"GET /x HTTP/1.1", "Host: app.test\nX-A: b\n"},
		{"GET /x HTTP/1.1", "Host: app.test\r\nX-A : b\r\n"},
		{"GET /x HTTP/1.1", "Host: app.test\r\nX-A: b  c\r\n"},
		{"GET /x HTTP/1.1", "Host: app.test\r\nX-A: \xc3\xa9\r\n"},
		{"GET /x HTTP/1.1", "Host: app.test\r\nConnection: keep-alive, Upgrade\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"},
		{"GET /x HTTP/1.1", "Host: app.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"},
		{"GET /x HTTP/1.1", "Host: app.test\r\nTE: trailers\r\nKeep-Alive: 5\r\nProxy-Connection: keep-alive\r\n"},
		{"GET /x HTTP/1.1", "Host: app.test\r\nExpect: 100-continue\r\n"},
		{"GET /x?a=b c HTTP/1.1", "Host: app.test\r\n"},
		{"GET /x?a=%zz;b=\"c\" HTTP/1.1", "Host: app.test\r\n"},
		{"GET /x#frag HTTP/1.1", "Host: app.test\r\n"},
		{"GET /.activator/wake-events?path=/ HTTP/1.1", "Host: app.test\r\n"},
		{"CONNECT app.test:443 HTTP/1.1", "Host: app.test:443\r\n"},
		{"TRACE / HTTP/1.1", "Host: app.test\r\n"},
		{"GET / HTTP/2.0", "Host: app.test\r\n"},
		{"get / HTTP/1.1", "Host: app.test\r\n"},
	} {
		f.Add(s[0], s[1], []byte(nil), false)
	}
	// A body, and requests behind one another: the loop hands a head with a body back to net/http,
	// and reads the next head a connection has, wherever the last one was served.
	f.Add("POST /form HTTP/1.1", "Host: app.test\r\nContent-Type: application/x-www-form-urlencoded\r\n", []byte("a=1&b=2"), false)
	f.Add("GET / HTTP/1.1", "Host: app.test\r\n", []byte(nil), true)
	f.Add("GET /x HTTP/1.1", "Host: app.test\r\n", []byte("xyz"), true)
	f.Add("GET /x HTTP/1.1", "Host: app.test\r\nConnection: close\r\n", []byte(nil), true)
	f.Add("GET /x HTTP/1.1", "Host: other.test\r\n", []byte(nil), true)
	f.Add("GET /chunked HTTP/1.1", "Host: app.test\r\n", []byte(nil), true)
	up := httptest.NewServer(http.HandlerFunc(dumpTenant))
	f.Cleanup(up.Close)
	r := testRoute("app")
	r.Upstream.Address = up.Listener.Addr().String()
	e := newConformEdge(f, conformConfig{routes: []*registry.Route{r}})
	f.Fuzz(func(t *testing.T, line, fields string, body []byte, twice bool) {
		if strings.ContainsAny(line, "\n") || strings.HasPrefix(line, "PRI") ||
			fields != "" && !strings.HasSuffix(fields, "\n") ||
			strings.Contains("\n"+fields, "\n\n") || strings.Contains("\n"+fields, "\n\r\n") {
			return // not one head (see above)
		}
		if lower := strings.ToLower(fields); strings.Contains(lower, "content-length") || strings.Contains(lower, "transfer-encoding") {
			return // a body (see above)
		}
		if len(line+"\r\n"+fields+"\r\n") < len("PRI * HTTP/2.0") {
			return // net/http waits for more (see above)
		}
		if len(body) > 0 {
			fields += fmt.Sprintf("Content-Length: %d\r\n", len(body))
		}
		raw := line + "\r\n" + fields + "\r\n" + string(body)
		answers := 1
		if twice {
			raw, answers = raw+raw, 2
		}
		e.wake(t, "app") // the loop serves only an awake route's requests itself
		method, _, _ := strings.Cut(line, " ")
		var got [2]string
		for i, p := range edgePaths {
			rc := e.conn(t, p, "")
			rc.send(raw)
			for range answers {
				got[i] += answerSeen(rc, method) + "\n--\n"
			}
			rc.c.Close()
		}
		if got[0] != got[1] {
			t.Fatalf("%q\nnet/http's path:\n%s\nthe loop's path:\n%s", raw, got[0], got[1])
		}
	})
}

// answerSeen is the answer the client reads next on rc, as text to compare: status, header fields
// but Date (names sorted, each name's values in their order), whether the connection closes, body;
// or that there was none.
func answerSeen(rc *rawConn, method string) string {
	resp, err := http.ReadResponse(rc.br, &http.Request{Method: method})
	if err != nil {
		return "no answer" // the error's text names the connection, different on each
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	var b strings.Builder
	fmt.Fprintf(&b, "%s close=%v\n", resp.Status, resp.Close)
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range resp.Header {
			if k != "Date" && !yield(k) {
				return
			}
		}
	}) {
		fmt.Fprintf(&b, "%s: %q\n", k, resp.Header[k])
	}
	fmt.Fprintf(&b, "\n%s", body)
	// A body without a length ends with the connection. net/http closes one on which bytes of the
	// client's remain unread (after its own 400 to a malformed head) with a reset, which may end the
	// client's read before its EOF: the loop read them all, and the resume server leaves none. The
	// body is whole either way; the kernel delivers what came before the reset.
	if err != nil && !(resp.ContentLength < 0 && resp.Close && isReset(err)) {
		b.WriteString("\n(cut short)")
	}
	return b.String()
}
