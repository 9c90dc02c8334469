package upstream

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// exchange is one request a client sends the edge, byte for byte, and the answer the upstream gives.
type exchange struct {
	// The request: "<Method> <Target> HTTP/1.1", Host, Header ("Name: value" lines), then Body with a
	// Content-Length when it is not empty.
	Method, Target, Host, Header, Body string
	// Peer is the request's RemoteAddr as the edge sees it; "" keeps the real one (127.0.0.1, not a
	// trusted proxy). Peers in testTrusted are trusted proxies.
	Peer string
	// The answer: one informational answer per byte of Info (100, 102 or 103, with InfoHeader), then
	// Code (see status) with AnswerHeader and AnswerBody, flushed first when Flush is set, then Trailer
	// ("Name: value" lines; a name starting with "!" is sent unannounced, with http.TrailerPrefix).
	Info, InfoHeader string
	Code             int
	AnswerHeader     string
	AnswerBody       string
	Trailer          string
	Flush            bool
}

// status is the final answer's status: Code, taken into 200-599 (0 is 200).
func (ex exchange) status() int {
	if ex.Code >= 200 && ex.Code <= 599 {
		return ex.Code
	}
	return 200 + (ex.Code%400+400)%400
}

// received is what the upstream saw.
type received struct {
	Method, URI, Host string
	Header            http.Header
	Body              string
	ContentLength     int64
	TransferEncoding  []string
}

// answered is what the client got.
type answered struct {
	Informational    []string // "103 Link=[…]" per informational answer
	Status           int
	Header           http.Header
	Body             string
	Trailer          http.Header
	TransferEncoding []string
	Err              string // the answer was cut (the edge aborted it) or malformed
}

// paths is a real upstream and the two edges in front of it: fast serves as the Client does
// (Serve), slow always through the Client's ReverseProxy.
type paths struct {
	fast, slow string // the edges' addresses

	mu        sync.Mutex // guards the fields below
	script    exchange
	got       []received
	forwarded bool // the fast edge's last request was forwardable
}

func newPaths(t testing.TB) *paths {
	t.Helper()
	p := &paths{}
	up := httptest.NewServer(http.HandlerFunc(p.answer))
	t.Cleanup(up.Close)
	serve, proxy := newEdges(t, up.Listener.Addr().String())
	fast := func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.forwarded = forwardable(r)
		p.mu.Unlock()
		serve(w, p.fromPeer(r))
	}
	slow := func(w http.ResponseWriter, r *http.Request) { proxy(w, p.fromPeer(r)) }
	for _, e := range []struct {
		addr *string
		h    http.HandlerFunc
	}{{&p.fast, fast}, {&p.slow, slow}} {
		srv := httptest.NewServer(e.h)
		srv.Config.ErrorLog = quietLog()
		t.Cleanup(srv.Close)
		*e.addr = srv.Listener.Addr().String()
	}
	return p
}

// fromPeer returns r as if it came from the script's peer.
func (p *paths) fromPeer(r *http.Request) *http.Request {
	p.mu.Lock()
	peer := p.script.Peer
	p.mu.Unlock()
	if peer != "" {
		r.RemoteAddr = peer
	}
	return r
}

// answer is the upstream: it records the request and answers as the current script says.
func (p *paths) answer(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	p.mu.Lock()
	p.got = append(p.got, received{r.Method, r.RequestURI, r.Host, r.Header.Clone(), string(b), r.ContentLength, r.TransferEncoding})
	s := p.script
	p.mu.Unlock()
	h := w.Header()
	for _, c := range []byte(s.Info) {
		addLines(h, s.InfoHeader)
		w.WriteHeader([]int{100, 102, 103}[int(c)%3])
		clear(h)
	}
	addLines(h, s.AnswerHeader)
	var announced, unannounced []string
	for line := range strings.Lines(s.Trailer) {
		k, _, _ := strings.Cut(strings.TrimSpace(line), ":")
		if name, ok := strings.CutPrefix(k, "!"); ok {
			unannounced = append(unannounced, name)
		} else if k != "" {
			announced = append(announced, k)
		}
	}
	if len(announced) > 0 {
		h.Set("Trailer", strings.Join(announced, ", "))
	}
	if s.Flush {
		if _, ok := h["Content-Type"]; !ok {
			// Else the edge's net/http sniffs one from the first write, or not, depending on
			// whether the ReverseProxy's timer flushed the head first: a race, not the proxy's logic.
			h.Set("Content-Type", "text/plain")
		}
	}
	w.WriteHeader(s.status())
	if s.Flush {
		http.NewResponseController(w).Flush()
	}
	io.WriteString(w, s.AnswerBody)
	for line := range strings.Lines(s.Trailer) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if name, ok := strings.CutPrefix(k, "!"); ok {
			h.Add(http.TrailerPrefix+name, strings.TrimSpace(v))
		} else if k != "" {
			h.Add(k, strings.TrimSpace(v))
		}
	}
}

// addLines adds "Name: value" lines to h.
func addLines(h http.Header, lines string) {
	for line := range strings.Lines(lines) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k != "" {
			h.Add(k, strings.TrimSpace(v))
		}
	}
}

// run sends ex through the edge at addr and returns what the upstream received (nil: nothing) and
// what the client got.
func (p *paths) run(t testing.TB, addr string, ex exchange) (*received, answered) {
	t.Helper()
	p.mu.Lock()
	p.script, p.got, p.forwarded = ex, nil, false
	p.mu.Unlock()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	// Closed with a reset once the answer is read: a fuzzing run makes tens of thousands of
	// connections, and as many in TIME-WAIT would exhaust the loopback's ports.
	_ = c.(*net.TCPConn).SetLinger(0)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var req strings.Builder
	fmt.Fprintf(&req, "%s %s HTTP/1.1\r\nHost: %s\r\n", ex.Method, ex.Target, ex.Host)
	for line := range strings.Lines(ex.Header) {
		line = strings.TrimRight(line, "\r\n")
		if k, v, _ := strings.Cut(line, ":"); framing(k) && strings.TrimSpace(v) != "0" {
			continue // a body the client does not send would stall the edge
		}
		req.WriteString(line + "\r\n")
	}
	if ex.Body != "" {
		fmt.Fprintf(&req, "Content-Length: %d\r\n", len(ex.Body))
	}
	req.WriteString("\r\n" + ex.Body)
	if _, err := io.WriteString(c, req.String()); err != nil {
		t.Fatal(err)
	}
	a := readAnswer(bufio.NewReader(c), ex.Method)
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.got) == 0 {
		return nil, a
	}
	return &p.got[len(p.got)-1], a
}

// framing reports whether a request field names the body's framing.
func framing(k string) bool {
	k = strings.TrimSpace(k)
	return strings.EqualFold(k, "Content-Length") || strings.EqualFold(k, "Transfer-Encoding")
}

// readAnswer reads the informational answers and the answer to a request with method, body and
// trailers included.
func readAnswer(br *bufio.Reader, method string) answered {
	var a answered
	for {
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			a.Err = err.Error()
			return a
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			// The ReverseProxy passes a 1xx answer's hop-by-hop fields on (golang/go#81319); the
			// fast path drops them, as RFC 9110 7.6.1 asks (TestInformationalHopByHop). The rest is
			// compared.
			removeHopByHop(resp.Header)
			info := fmt.Sprintf("%d %v", resp.StatusCode, resp.Header)
			if n := len(a.Informational); resp.StatusCode == http.StatusContinue && n > 0 && a.Informational[n-1] == info {
				// net/http's server sends its own 100 Continue when the handler first reads the body,
				// before or after the upstream's own 100 arrives to be passed on: how many the client
				// sees in a row is timing, and they all say the same.
				continue
			}
			a.Informational = append(a.Informational, info)
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			a.Err = "body: " + err.Error()
		}
		resp.Header.Del("Date")
		if tr := resp.Header["Trailer"]; tr != nil { // not chunked: kept as a header, in map order
			names := strings.Split(strings.Join(tr, ","), ",")
			for i := range names {
				names[i] = strings.TrimSpace(names[i])
			}
			slices.Sort(names)
			resp.Header["Trailer"] = []string{strings.Join(names, ", ")}
		}
		a.Status, a.Header, a.Body, a.Trailer, a.TransferEncoding = resp.StatusCode, resp.Header, string(b), resp.Trailer, resp.TransferEncoding
		if len(a.Trailer) == 0 {
			a.Trailer = nil
		}
		if a.Body == "" && a.Trailer == nil && slices.Equal(a.TransferEncoding, []string{"chunked"}) {
			// The ReverseProxy flushes a streamed answer's head from a timer that races the end of
			// the body: an empty one reaches the client chunked or with "Content-Length: 0", by
			// chance. Both are the same empty answer.
			a.TransferEncoding = nil
			a.Header["Content-Length"] = []string{"0"}
		}
		return a
	}
}

// same sends ex through both edges and reports every difference in what the upstream received and
// what the client got. With forwardedOnly, a request the fast edge found not forwardable is not
// compared: both edges served it with the same ReverseProxy, and what differs is only the
// ReverseProxy's own timing (an upstream that closes while the request body is still being sent).
func (p *paths) same(t *testing.T, ex exchange, forwardedOnly bool) (*received, answered) {
	t.Helper()
	gotFast, ansFast := p.run(t, p.fast, ex)
	p.mu.Lock()
	forwarded := p.forwarded
	p.mu.Unlock()
	if forwardedOnly && !forwarded {
		t.Skip("not forwardable: both edges use the ReverseProxy")
	}
	gotSlow, ansSlow := p.run(t, p.slow, ex)
	if !reflect.DeepEqual(gotFast, gotSlow) {
		t.Errorf("%+v\nupstream received\n  fast path:    %+v\n  ReverseProxy: %+v", ex, gotFast, gotSlow)
	}
	if !reflect.DeepEqual(ansFast, ansSlow) && !cutAlike(ansFast, ansSlow) {
		t.Errorf("%+v\nclient got\n  fast path:    %+v\n  ReverseProxy: %+v", ex, ansFast, ansSlow)
	}
	return gotFast, ansFast
}

// cutAlike reports the one accepted difference: an upstream answer that breaks after its header and
// before any body byte (a malformed trailer after an empty chunked body). The ReverseProxy sends
// nothing before the first body byte, so its client sees the connection close without an answer; the
// fast path has already sent the header, so its client sees the body cut short (no last chunk). Both
// clients get an error, neither a complete answer.
func cutAlike(fast, slow answered) bool {
	return fast.Err != "" && slow.Err != "" && slow.Status == 0 && fast.Status != 0 && fast.Body == ""
}

// equivalenceCases are the requests and answers both paths must treat alike; wantURI, when set, is
// the request-URI the upstream must see, and wantFwd, when set, the forwarding fields it must see
// (every line of X-Forwarded-For, X-Forwarded-Host, X-Forwarded-Proto and Forwarded, in that order),
// wantKept, when set, the fields with underscores the upstream must see: no other field with an
// underscore may reach it; and wantClient, when set, whether each clientField named must reach it.
var equivalenceCases = []struct {
	name       string
	ex         exchange
	wantURI    string
	wantFwd    []string
	wantKept   []string
	wantClient map[string]bool
}{
	{name: "plain GET", ex: exchange{Method: "GET", Target: "/p", Host: "app.test", AnswerBody: "hello"}, wantURI: "/p"},
	{name: "semicolon query", ex: exchange{Method: "GET", Target: "/p?a=1;b=2", Host: "app.test"}, wantURI: "/p?a=1;b=2"},
	{name: "bad escape in query", ex: exchange{Method: "GET", Target: "/p?q=%zz&x=1", Host: "app.test"}, wantURI: "/p?q=%zz&x=1"},
	{name: "empty query", ex: exchange{Method: "GET", Target: "/p?", Host: "app.test"}, wantURI: "/p?"},
	{name: "query of odd bytes", ex: exchange{Method: "GET", Target: "/p?a=%&&b==;;c=%2", Host: "app.test"}, wantURI: "/p?a=%&&b==;;c=%2"},
	{name: "escaped slash in path", ex: exchange{Method: "GET", Target: "/p/a%2Fb?q=1&r=2", Host: "app.test"}, wantURI: "/p/a%2Fb?q=1&r=2"},
	{name: "absolute-form", ex: exchange{Method: "GET", Target: "http://app.test/p?a=1;b=2", Host: "other.test"}, wantURI: "/p?a=1;b=2"},
	{name: "absolute-form, a Host Request.Write blanks", ex: exchange{Method: "GET", Target: "a://\"/p", Host: "app.test"}},
	{name: "IPv6 Host with a zone", ex: exchange{Method: "GET", Target: "/p", Host: "[fe80::1%25eth0]:80"}},
	{name: "absolute-form without a path", ex: exchange{Method: "GET", Target: "http://app.test?x=1", Host: "app.test"}, wantURI: "/?x=1"},
	{name: "HEAD", ex: exchange{Method: "HEAD", Target: "/p", Host: "app.test", AnswerHeader: "Content-Length: 5", AnswerBody: "hello"}},
	{name: "OPTIONS", ex: exchange{Method: "OPTIONS", Target: "/p", Host: "app.test", AnswerHeader: "Allow: GET, HEAD"}},
	{name: "OPTIONS *", ex: exchange{Method: "OPTIONS", Target: "*", Host: "app.test"}},
	{name: "204", ex: exchange{Method: "GET", Target: "/p", Host: "app.test", Code: 204, AnswerBody: "dropped"}},
	{name: "304", ex: exchange{Method: "GET", Target: "/p", Host: "app.test", Header: "If-None-Match: \"x\"", Code: 304, AnswerHeader: "Etag: \"x\""}},
	{name: "hop-by-hop fields", ex: exchange{
		Method: "GET", Target: "/p", Host: "app.test",
		Header: "User-Agent: test/1\nConnection: X-Hop, keep-alive\nX-Hop: 1\nKeep-Alive: 300\nTe: trailers, deflate\n" +
			"Proxy-Authorization: Basic c2VjcmV0\nProxy-Connection: keep-alive\nUpgrade-Insecure-Requests: 1\nX-Multi: a\nX-Multi: b",
		AnswerHeader: "Connection: X-Drop\nX-Drop: 1\nKeep-Alive: timeout=5\nX-Keep: 1\nProxy-Authenticate: Basic",
	}},
	{name: "empty User-Agent", ex: exchange{Method: "GET", Target: "/p", Host: "app.test", Header: "User-Agent:"}},
	{name: "two User-Agents", ex: exchange{Method: "GET", Target: "/p", Host: "app.test", Header: "User-Agent: a\nUser-Agent: b"}},
	{name: "Connection naming a field in another case", ex: exchange{Method: "GET", Target: "/p", Host: "app.test", Header: "Connection: x-HOP ,, \tx-other\nX-Hop: 1\nX-Other: 2\nX-Kept: 3"}},
	{name: "Connection with Unicode look-alikes", ex: exchange{Method: "GET", Target: "/p", Host: "app.test", Header: "Connection: X-\u212aey, X-Hop\u00a0\nX-Key: 1\nX-Hop: 2"}},
	{name: "Connection naming User-Agent", ex: exchange{Method: "GET", Target: "/p", Host: "app.test", Header: "Connection: user-agent\nUser-Agent: a"}},
	{name: "client's forwarding fields", ex: exchange{
		Method: "GET", Target: "/p", Host: "app.test",
		Header: "X-Forwarded-For: 203.0.113.9\nX-Forwarded-Host: spoofed.example\nX-Forwarded-Proto: https\nForwarded: for=203.0.113.9\nContent-Length: 0",
	}, wantFwd: []string{"X-Forwarded-For: 127.0.0.1", "X-Forwarded-Host: app.test", "X-Forwarded-Proto: http", "Forwarded: for=127.0.0.1;host=app.test;proto=http"}},
	{name: "untrusted IPv6 peer forging every field", ex: exchange{
		Method: "GET", Target: "/p", Host: "app.test:8080", Peer: "[2001:db9::5]:4711",
		Header: "X-Forwarded-For: 203.0.113.9\nX-Forwarded-Host: spoofed.example\nX-Forwarded-Proto: https\nForwarded: for=203.0.113.9;proto=https",
	}, wantFwd: []string{"X-Forwarded-For: 2001:db9::5", "X-Forwarded-Host: app.test:8080", "X-Forwarded-Proto: http", `Forwarded: for="[2001:db9::5]";host="app.test:8080";proto=http`}},
	{name: "trusted proxy, X-Forwarded-* only", ex: exchange{
		Method: "GET", Target: "/p", Host: "app.test", Peer: "192.0.2.10:4711",
		Header: "X-Forwarded-For: 203.0.113.9\nX-Forwarded-Proto: https\nX-Forwarded-Host: www.example",
	}, wantFwd: []string{"X-Forwarded-For: 203.0.113.9, 192.0.2.10", "X-Forwarded-Host: www.example", "X-Forwarded-Proto: https",
		"Forwarded: for=203.0.113.9;host=www.example;proto=https, for=192.0.2.10"}},
	{name: "trusted proxy, XFF lines, one blank, an IPv6 entry and a port", ex: exchange{
		Method: "GET", Target: "/p", Host: "app.test", Peer: "192.0.2.10:4711",
		Header: "X-Forwarded-For: 203.0.113.9, 2001:db8::9\nX-Forwarded-For:\nX-Forwarded-For: 198.51.100.1:80,,unknown",
	}, wantFwd: []string{"X-Forwarded-For: 203.0.113.9, 2001:db8::9, 198.51.100.1:80,,unknown, 192.0.2.10", "X-Forwarded-Host: app.test", "X-Forwarded-Proto: http",
		`Forwarded: for=203.0.113.9;host=app.test;proto=http, for="[2001:db8::9]", for="198.51.100.1:80", for=unknown, for=192.0.2.10`}},
	{name: "trusted IPv6 proxy with Forwarded", ex: exchange{
		Method: "GET", Target: "/p", Host: "app.test", Peer: "[2001:db8::10]:4711",
		Header: "Forwarded: for=203.0.113.9;proto=https\nForwarded: for=\"[2001:db8:cafe::17]:4711\"\nX-Forwarded-For: 203.0.113.9",
	}, wantFwd: []string{"X-Forwarded-For: 203.0.113.9, 2001:db8::10", "X-Forwarded-Host: app.test", "X-Forwarded-Proto: http",
		`Forwarded: for=203.0.113.9;proto=https, for="[2001:db8:cafe::17]:4711", for="[2001:db8::10]"`}},
	{name: "trusted proxy sending no forwarding field", ex: exchange{Method: "GET", Target: "/p", Host: "app.test", Peer: "192.0.2.10:4711"},
		wantFwd: []string{"X-Forwarded-For: 192.0.2.10", "X-Forwarded-Host: app.test", "X-Forwarded-Proto: http", "Forwarded: for=192.0.2.10;host=app.test;proto=http"}},
	{name: "trusted IPv4-mapped peer, odd values quoted", ex: exchange{
		Method: "GET", Target: "/p", Host: "app.test", Peer: "[::ffff:192.0.2.11]:4711",
		Header: "X-Forwarded-Proto: ht\"tp\\s, http\nX-Forwarded-Host: a b.example",
	}, wantFwd: []string{"X-Forwarded-For: ::ffff:192.0.2.11", "X-Forwarded-Host: a b.example", `X-Forwarded-Proto: ht"tp\s, http`,
		`Forwarded: for="[::ffff:192.0.2.11]";host="a b.example";proto="ht\"tp\\s"`}},
	{name: "peer without an address", ex: exchange{Method: "GET", Target: "/p", Host: "app.test", Peer: "@", Header: "X-Forwarded-For: 203.0.113.9"},
		wantFwd: []string{"X-Forwarded-Host: app.test", "X-Forwarded-Proto: http", "Forwarded: host=app.test;proto=http"}},
	{name: "trusted proxy, POST through the ReverseProxy", ex: exchange{
		Method: "POST", Target: "/p", Host: "app.test", Peer: "192.0.2.10:4711", Body: "ping",
		Header: "X-Forwarded-For: 203.0.113.9\nX-Forwarded-Proto: https",
	}, wantFwd: []string{"X-Forwarded-For: 203.0.113.9, 192.0.2.10", "X-Forwarded-Host: app.test", "X-Forwarded-Proto: https",
		"Forwarded: for=203.0.113.9;host=app.test;proto=https, for=192.0.2.10"}},
	{name: "forwarding fields with underscores, untrusted", ex: exchange{
		Method: "GET", Target: "/p", Host: "app.test",
		Header: "X_Forwarded_For: 6.6.6.6\nX-Forwarded_Host: spoofed.example\nx_forwarded_proto: https\nX_Other: 1",
	}, wantFwd: []string{"X-Forwarded-For: 127.0.0.1", "X-Forwarded-Host: app.test", "X-Forwarded-Proto: http", "Forwarded: for=127.0.0.1;host=app.test;proto=http"},
		wantKept: []string{"X_other"}},
	{name: "forwarding fields with underscores, POST", ex: exchange{
		Method: "POST", Target: "/p", Host: "app.test", Body: "ping",
		Header: "X_Forwarded_For: 6.6.6.6\nX_FORWARDED_HOST: spoofed.example\nX_Other: 1",
	}, wantFwd: []string{"X-Forwarded-For: 127.0.0.1", "X-Forwarded-Host: app.test", "X-Forwarded-Proto: http", "Forwarded: for=127.0.0.1;host=app.test;proto=http"},
		wantKept: []string{"X_other"}},
	{name: "forwarding fields with underscores, trusted proxy", ex: exchange{
		Method: "GET", Target: "/p", Host: "app.test", Peer: "192.0.2.10:4711",
		Header: "X-Forwarded-For: 203.0.113.9\nX_Forwarded_For: 6.6.6.6",
	}, wantFwd: []string{"X-Forwarded-For: 203.0.113.9, 192.0.2.10", "X-Forwarded-Host: app.test", "X-Forwarded-Proto: http",
		"Forwarded: for=203.0.113.9;host=app.test;proto=http, for=192.0.2.10"}, wantKept: []string{}},
	{name: "client fields from a client", ex: exchange{
		Method: "GET", Target: "/p", Host: "app.test",
		Header: "True-Client-IP: 6.6.6.6\nX-Real-IP: 6.6.6.7\nX-Forwarded-Ssl: on\nx_real_ip: 6.6.6.8\nX-Other: 1",
	}, wantClient: map[string]bool{"True-Client-Ip": false, "X-Real-Ip": false, "X-Forwarded-Ssl": false, "X-Other": true}, wantKept: []string{}},
	{name: "client fields from a client, POST", ex: exchange{
		Method: "POST", Target: "/p", Host: "app.test", Body: "ping",
		Header: "Cf-Connecting-IP: 6.6.6.6\nX-Forwarded-Port: 443\nFront-End-Https: on",
	}, wantClient: map[string]bool{"Cf-Connecting-Ip": false, "X-Forwarded-Port": false, "Front-End-Https": false}},
	{name: "client fields from a trusted proxy", ex: exchange{
		Method: "GET", Target: "/p", Host: "app.test", Peer: "192.0.2.10:4711",
		Header: "True-Client-IP: 203.0.113.9\nX-Forwarded-Ssl: on\nX_Real_IP: 6.6.6.8",
	}, wantClient: map[string]bool{"True-Client-Ip": true, "X-Forwarded-Ssl": true}, wantKept: []string{}},
	{name: "client fields from a trusted proxy, POST", ex: exchange{
		Method: "POST", Target: "/p", Host: "app.test", Peer: "192.0.2.10:4711", Body: "ping",
		Header: "X-Real-IP: 203.0.113.9\nX-Forwarded-For: 203.0.113.9",
	}, wantClient: map[string]bool{"X-Real-Ip": true}},
	{name: "trailers", ex: exchange{Method: "GET", Target: "/p", Host: "app.test", Header: "Te: trailers", AnswerBody: "hello", Trailer: "X-Sum: 42\nX-Other: 1\n!X-Late: 2"}},
	{name: "unannounced trailer only", ex: exchange{Method: "GET", Target: "/p", Host: "app.test", AnswerBody: "hello", Trailer: "!X-Late: 2"}},
	{name: "1xx answers", ex: exchange{
		Method: "GET", Target: "/p", Host: "app.test", Info: "\x02\x01\x02", InfoHeader: "Link: </a.css>; rel=preload",
		Code: 418, AnswerHeader: "Content-Type: text/plain", AnswerBody: "hello",
	}},
	{name: "hop-by-hop fields in a 1xx answer", ex: exchange{
		Method: "GET", Target: "/p", Host: "app.test", Info: "\x02", InfoHeader: "Link: </a.css>\nConnection: X-A\nX-A: 1\nKeep-Alive: 5",
	}},
	{name: "streamed body", ex: exchange{Method: "GET", Target: "/p", Host: "app.test", AnswerHeader: "Content-Type: text/event-stream", AnswerBody: "data: 1\n\n", Flush: true}},
	{name: "Expect: 100-continue with a body", ex: exchange{Method: "POST", Target: "/p?a=1;b=2", Host: "app.test", Header: "Expect: 100-continue", Body: "ping"}, wantURI: "/p?a=1;b=2"},
	{name: "Expect: 100-continue, no body", ex: exchange{Method: "GET", Target: "/p", Host: "app.test", Header: "Expect: 100-continue"}},
	{name: "Expect: 100-continue, upstream sends 100", ex: exchange{Method: "PUT", Target: "/p", Host: "app.test", Header: "Expect: 100-continue", Body: "ping", Info: "\x00"}},
	{name: "POST with a body", ex: exchange{Method: "POST", Target: "/p?q=%zz&x=1", Host: "app.test", Body: "ping"}, wantURI: "/p?q=%zz&x=1"},
}

// TestEquivalence: the fast path and the ReverseProxy send the upstream the same request and the
// client the same answer, over odd queries (passed byte for byte), absolute-form URIs, HEAD, OPTIONS,
// 204 and 304, hop-by-hop and forwarding fields, trailers, 1xx answers and Expect: 100-continue.
func TestEquivalence(t *testing.T) {
	p := newPaths(t)
	for _, tc := range equivalenceCases {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := p.same(t, tc.ex, false)
			if tc.wantURI != "" && (got == nil || got.URI != tc.wantURI) {
				t.Errorf("upstream received %+v, want request-URI %q", got, tc.wantURI)
			}
			if tc.wantFwd != nil && (got == nil || !slices.Equal(forwardingLines(got.Header), tc.wantFwd)) {
				t.Errorf("upstream received %+v\ngot forwarding fields  %q\nwant %q", got, forwardingLines(got.Header), tc.wantFwd)
			}
			for k, want := range tc.wantClient {
				if got != nil && (got.Header[k] != nil) != want {
					t.Errorf("upstream received %s: %v, want %v", k, got.Header[k] != nil, want)
				}
			}
			if tc.wantKept != nil && got != nil {
				var kept []string
				for k := range got.Header {
					if strings.Contains(k, "_") {
						kept = append(kept, k)
					}
				}
				if slices.Sort(kept); !slices.Equal(kept, tc.wantKept) {
					t.Errorf("upstream received fields with underscores %q, want %q", kept, tc.wantKept)
				}
			}
		})
	}
}

// forwardingLines returns h's forwarding fields as "Name: value" lines, in the order wantFwd has them.
func forwardingLines(h http.Header) []string {
	var out []string
	for _, k := range []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded"} {
		for _, v := range h[k] {
			out = append(out, k+": "+v)
		}
	}
	return out
}

// FuzzForwardMatchesReverseProxy is TestEquivalence over any request and answer, each sent twice:
// from an untrusted peer and from a trusted proxy.
func FuzzForwardMatchesReverseProxy(f *testing.F) {
	for _, tc := range equivalenceCases {
		e := tc.ex
		f.Add(e.Method, e.Target, e.Host, e.Header, e.Body, e.Info, e.InfoHeader, e.Code, e.AnswerHeader, e.AnswerBody, e.Trailer, e.Flush)
	}
	p := newPaths(f)
	f.Fuzz(func(t *testing.T, method, target, host, header, body, info, infoHeader string, code int, answerHeader, answerBody, trailer string, flush bool) {
		if strings.ContainsAny(method+target+host, "\r\n") || strings.Contains(header, "\r") {
			t.Skip("a line break outside the header lines")
		}
		if len(info) > 5 {
			info = info[:5]
		}
		ex := exchange{Method: method, Target: target, Host: host, Header: header, Body: body, Info: info, InfoHeader: infoHeader,
			Code: code, AnswerHeader: answerHeader, AnswerBody: answerBody, Trailer: trailer, Flush: flush}
		for _, peer := range []string{"", "[2001:db8::10]:4711"} {
			ex.Peer = peer
			p.same(t, ex, true)
		}
	})
}
