package warmloop_test

import (
	"bufio"
	"bytes"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/net/http/httpguts"

	"github.com/activator/activator/internal/warmloop"
)

// fuzzMaxHead is the maxHead of the fuzz target: larger than the seeds, small enough that the fuzzer
// reaches it.
const fuzzMaxHead = 1024

// FuzzParseAgreesWithNetHTTP checks what the loop may never get wrong: every head Parse serves is one
// net/http reads alike (and its server would take), with a path the edge's hygiene leaves as it is;
// the head the upstream is sent holds the same request; and Parse's More and HandBack are stable as
// bytes come (a prefix of a served head is More, bytes after a HandBack leave it HandBack).
// AppendUpstreamHead against the fast path's own writeHead is internal/upstream's
// FuzzAppendUpstreamHeadAgreesWithWriteHead.
func FuzzParseAgreesWithNetHTTP(f *testing.F) {
	for _, s := range []string{
		// Realistic: curl, wrk, a browser, pipelined requests.
		"GET / HTTP/1.1\r\nHost: localhost:8080\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n",
		"GET /index.html HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n",
		browser,
		"GET /a?x=%41&y=/? HTTP/1.1\r\nHost: app.test\r\nConnection: keep-alive\r\n\r\nGET /b HTTP/1.1\r\nHost: app.test\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: app.test\r\nPragma: no-cache\r\nCache-Control: no-cache\r\n\r\n",
		// Adversarial.
		"GET / HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: app.test\r\nX: a\r\n b\r\n\r\n",
		"GET / HTTP/1.1\nHost: app.test\n\n",
		"GET /a/../b HTTP/1.1\r\nHost: app.test\r\n\r\n",
		"GET /a/%2e%2e/b HTTP/1.1\r\nHost: app.test\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: app.test\r\nHost: other.test\r\n\r\n",
		"GET /\x00 HTTP/1.1\r\nHost: app.test\r\nX: \x00\r\n\r\n",
		"GET /\xff HTTP/1.1\r\nHost: app.test\r\nX: \xc3\xa9\r\n\r\n",
		"GET http://other.test/ HTTP/1.1\r\nHost: app.test\r\n\r\n",
		"GET * HTTP/1.1\r\nHost: app.test\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: app.test\r\nPragma: no-cache\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: app.test\r\nX_Forwarded_For: 6.6.6.6\r\nUser-Agent:\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: app.test\r\nConnection: keep-alive, Upgrade\r\nUpgrade: h2c\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkParse(t, b) })
}

// checkParse is FuzzParseAgreesWithNetHTTP's check of b. It returns Parse's result.
func checkParse(t *testing.T, b []byte) warmloop.Result {
	t.Helper()
	var req warmloop.Request
	res, n := warmloop.Parse(b, fuzzMaxHead, &req)
	switch res {
	case warmloop.HandBack:
		for _, more := range []string{"\r\n", "\r\n\r\n", "Host: a\r\n\r\n", " HTTP/1.1\r\nHost: a\r\n\r\n"} {
			if res, _ := warmloop.Parse(append(b[:len(b):len(b)], more...), fuzzMaxHead, &req); res != warmloop.HandBack {
				t.Fatalf("Parse(%q) = HandBack, but with %q after it %v", b, more, res)
			}
		}
		return res
	case warmloop.More:
		if n != 0 || len(b) >= fuzzMaxHead {
			t.Fatalf("Parse(%q) = More, %d with maxHead %d", b, n, fuzzMaxHead)
		}
		somePrefixesMore(t, b)
		return res
	}
	if n <= 0 || n > len(b) || n > fuzzMaxHead || !bytes.HasSuffix(b[:n], []byte("\r\n\r\n")) {
		t.Fatalf("Parse(%q) = Parsed, %d", b, n)
	}
	h := b[:n]
	if len(req.Head) != n || &req.Head[0] != &h[0] {
		t.Fatalf("Head is not b[:%d]", n)
	}
	allPrefixesMore(t, h)
	if res, m := warmloop.Parse(h, n, &req); res != warmloop.Parsed || m != n {
		t.Fatalf("Parse(%q) with maxHead = its length: %v, %d", h, res, m)
	}
	if res, _ := warmloop.Parse(b, n-1, &req); res != warmloop.HandBack {
		t.Fatalf("Parse(%q) with maxHead one short of the head: %v", b, res)
	}
	warmloop.Parse(b, fuzzMaxHead, &req)

	r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(h)))
	if err != nil {
		t.Fatalf("Parse(%q) = Parsed; net/http: %v", h, err)
	}
	target, path, host := string(req.Target), string(req.Path), string(req.Host)
	if r.Method != "GET" || r.RequestURI != target || r.Host != host || r.Proto != "HTTP/1.1" {
		t.Errorf("%q: net/http reads %s %s %s, Host %q; Parse %q, Host %q", h, r.Method, r.RequestURI, r.Proto, r.Host, target, host)
	}
	if r.ContentLength != 0 || r.TransferEncoding != nil || r.Close {
		t.Errorf("%q: net/http reads Content-Length %d, Transfer-Encoding %q, Close %v", h, r.ContentLength, r.TransferEncoding, r.Close)
	}
	// RawPath is the path itself when it holds one of "!'()*", which url.URL would escape but
	// keeps as sent (validEncoded); either way the path and the target are the bytes sent.
	if r.URL.Path != path || r.URL.RawPath != "" && r.URL.RawPath != path || r.URL.EscapedPath() != path || r.URL.RequestURI() != target {
		t.Errorf("%q: net/http reads path %q, raw path %q, request URI %q; Parse path %q", h, r.URL.Path, r.URL.RawPath, r.URL.RequestURI(), path)
	}
	// The edge's hygiene leaves the path alone: no escape to decode, no dot segment to remove.
	if strings.IndexByte(path, '%') >= 0 || hasDotSegment(path) {
		t.Errorf("%q: the path %q has an escape or a dot segment", h, path)
	}
	// net/http's server takes it (conn.readRequest's checks; ReadRequest has refused a second
	// Host and taken the field out of the header).
	if r.Host == "" || !httpguts.ValidHostHeader(r.Host) {
		t.Errorf("%q: Host %q", h, r.Host)
	}
	for k, vv := range r.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			t.Errorf("%q: field name %q", h, k)
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				t.Errorf("%q: field value %q", h, v)
			}
		}
	}
	// The fields passed on are net/http's (which are without Host) but "Connection: keep-alive".
	want := r.Header.Clone()
	if c := want["Connection"]; len(c) == 1 && strings.EqualFold(c[0], "keep-alive") {
		delete(want, "Connection")
	}
	if got := fieldMap(&req); !reflect.DeepEqual(got, want) {
		t.Errorf("%q: fields\n got %q\nwant %q", h, got, want)
	}

	// The upstream's head is the same request, with the forwarding fields.
	up := warmloop.AppendUpstreamHead(nil, &req, "192.0.2.7")
	ur, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(up)))
	if err != nil {
		t.Fatalf("upstream head %q: %v", up, err)
	}
	if ur.Method != "GET" || ur.RequestURI != target || ur.Host != host || ur.ContentLength != 0 || ur.Close {
		t.Errorf("upstream head %q: %s %s, Host %q", up, ur.Method, ur.RequestURI, ur.Host)
	}
	want["X-Forwarded-For"] = []string{"192.0.2.7"}
	want["X-Forwarded-Host"] = []string{host}
	want["X-Forwarded-Proto"] = []string{"http"}
	if got := ur.Header["Forwarded"]; len(got) != 1 || !strings.HasPrefix(got[0], "for=192.0.2.7;") {
		t.Errorf("upstream head %q: Forwarded %q", up, got)
	}
	delete(ur.Header, "Forwarded")
	if !reflect.DeepEqual(ur.Header, http.Header(want)) {
		t.Errorf("upstream head %q: fields\n got %q\nwant %q", up, ur.Header, want)
	}
	// ReadRequest makes each name canonical, so the map cannot tell how the names were sent.
	lines := bytes.Split(up, []byte("\r\n"))
	for _, l := range lines[1 : len(lines)-2] { // after the request line, before the empty one
		if name, _, _ := bytes.Cut(l, []byte(":")); string(name) != http.CanonicalHeaderKey(string(name)) {
			t.Errorf("upstream head %q: name %q is not canonical", up, name)
		}
	}
	return res
}

// allPrefixesMore fails t unless Parse says More for every proper prefix of b.
func allPrefixesMore(t *testing.T, b []byte) {
	t.Helper()
	for i := range len(b) {
		prefixMore(t, b, i)
	}
}

// somePrefixesMore is allPrefixesMore for 16 prefixes of b, picked at random but the same for the same
// b (so that a failure reproduces). Every prefix of every More input would make an input of n bytes
// cost n parses, and the fuzzer then spends its time minimising long inputs; over many inputs, the
// samples find what the whole would.
func somePrefixesMore(t *testing.T, b []byte) {
	t.Helper()
	if len(b) <= 16 {
		allPrefixesMore(t, b)
		return
	}
	h := fnv.New64a()
	h.Write(b)
	rnd := rand.New(rand.NewPCG(h.Sum64(), 0))
	for range 16 {
		prefixMore(t, b, rnd.IntN(len(b)))
	}
}

// prefixMore fails t unless Parse says More for b[:i], a proper prefix of a head that is More or
// Parsed.
func prefixMore(t *testing.T, b []byte, i int) {
	t.Helper()
	var req warmloop.Request
	if res, n := warmloop.Parse(b[:i], fuzzMaxHead, &req); res != warmloop.More || n != 0 {
		t.Fatalf("Parse(%q) = %v, %d; of %q it is a prefix", b[:i], res, n, b)
	}
}

// hasDotSegment reports whether one of the path's segments is "." or "..", as the edge's hygiene reads
// it (activator's hasDotSegment), by another way than Parse's.
func hasDotSegment(path string) bool {
	for _, s := range strings.Split(path, "/") {
		if s == "." || s == ".." {
			return true
		}
	}
	return false
}

// fieldMap returns req's passed fields as net/http would put them in a header map.
func fieldMap(req *warmloop.Request) http.Header {
	h := http.Header{}
	for _, f := range req.Fields[:req.N] {
		k := http.CanonicalHeaderKey(string(req.Head[f.Name[0]:f.Name[1]]))
		h[k] = append(h[k], string(req.Head[f.Value[0]:f.Value[1]]))
	}
	return h
}
