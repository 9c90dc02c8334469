package upstream_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/activator/activator/internal/upstream"
	"github.com/activator/activator/internal/warmloop"
)

// The edge's loop (internal/warmloop) writes the upstream's head of a request it serves itself
// (AppendUpstreamHead); here it is checked against the fast path's writeHead for the same request, as
// net/http's server would have handed it over. The loop writes the fields in the order they came and
// writeHead in its header map's, so the two heads are compared as net/http reads them, not as bytes.

// loopRequests are heads the loop serves: from curl, wrk and browsers, and odd but served ones.
var loopRequests = []string{
	"GET / HTTP/1.1\r\nHost: localhost:8080\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n",
	"GET /index.html HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n",
	"GET /assets/app.js?v=3 HTTP/1.1\r\nHost: app.example.com\r\nConnection: keep-alive\r\n" +
		"sec-ch-ua: \"Chromium\";v=\"124\", \"Not-A.Brand\";v=\"99\"\r\nsec-ch-ua-mobile: ?0\r\n" +
		"User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36\r\n" +
		"Accept: */*\r\nSec-Fetch-Site: same-origin\r\nReferer: https://app.example.com/\r\n" +
		"Accept-Encoding: gzip, deflate, br, zstd\r\nAccept-Language: en-US,en;q=0.9\r\nCookie: a=1\r\n\r\n",
	"GET /page HTTP/1.1\r\nHost: app.example.com\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0\r\n" +
		"Accept: text/html,application/xhtml+xml\r\nConnection: keep-alive\r\nUpgrade-Insecure-Requests: 1\r\n" +
		"Pragma: no-cache\r\nCache-Control: no-cache\r\n\r\n",
	"GET /a/b?x=%41&y=/?z HTTP/1.1\r\nhost: [2001:db8::1]:8080\r\nx-REQUEST-id: 7\r\nCookie: a=1\r\ncookie: b=2\r\nX_Trace: t\r\n\r\n",
	"GET /!$&'()*+,;=:@-._~//x HTTP/1.1\r\nHost: app.test\r\nX-Empty:\r\nX-A: \ta b\tc \r\n\r\n",
	"GET /a? HTTP/1.1\r\nHost: App.Test\r\nPragma: x\r\nAccept: a\r\nACCEPT: b\r\n\r\n",
}

func TestAppendUpstreamHeadMatchesWriteHead(t *testing.T) {
	for _, remote := range []string{"192.0.2.7:4711", "[2001:db8::1]:80", ""} {
		for _, in := range loopRequests {
			var req warmloop.Request
			res, n := warmloop.Parse([]byte(in), 4096, &req)
			if res != warmloop.Parsed {
				t.Errorf("Parse(%q) = %v, want Parsed", in, res)
				continue
			}
			compareHeads(t, &req, []byte(in)[:n], remote)
		}
	}
}

// fieldLines are field lines the loop passes on, takes off or refuses, in spellings it must treat
// alike or apart (internal/warmloop/testdata/fieldlines.json, which the parser's and the upstream
// head's pair tests share).
var fieldLines = func() []string {
	b, err := os.ReadFile("../warmloop/testdata/fieldlines.json")
	if err != nil {
		panic(err)
	}
	var lines []string
	if err := json.Unmarshal(b, &lines); err != nil {
		panic(err)
	}
	return lines
}()

// TestAppendUpstreamHeadFieldPairs compares the two heads for every request with one or two of
// fieldLines that the loop serves: the combinations that the rules about names (a second User-Agent,
// a Pragma without Cache-Control) are about, which the fuzzer's random bytes seldom make.
func TestAppendUpstreamHeadFieldPairs(t *testing.T) {
	served := 0
	try := func(lines ...string) {
		in := "GET /p HTTP/1.1\r\nHost: app.test\r\n" + strings.Join(lines, "\r\n") + "\r\n\r\n"
		var req warmloop.Request
		if res, n := warmloop.Parse([]byte(in), 4096, &req); res == warmloop.Parsed {
			served++
			compareHeads(t, &req, []byte(in)[:n], "192.0.2.7:4711")
		}
	}
	for _, a := range fieldLines {
		try(a)
		for _, b := range fieldLines {
			try(a, b)
		}
	}
	if served == 0 {
		t.Error("the loop serves none of the requests: the test compares nothing")
	}
}

// FuzzAppendUpstreamHeadAgreesWithWriteHead: for every head the loop serves, its upstream head is the
// fast path's.
func FuzzAppendUpstreamHeadAgreesWithWriteHead(f *testing.F) {
	for _, in := range loopRequests {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req warmloop.Request
		if res, n := warmloop.Parse(b, 1024, &req); res == warmloop.Parsed {
			compareHeads(t, &req, b[:n], "192.0.2.7:4711")
		}
	})
}

// compareHeads checks that the loop's upstream head for req (parsed from head) and writeHead's for the
// request net/http reads from head, from remote (r.RemoteAddr), carry the same request.
func compareHeads(t *testing.T, req *warmloop.Request, head []byte, remote string) {
	t.Helper()
	r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
	if err != nil {
		t.Fatalf("%q: %v", head, err)
	}
	r.RemoteAddr = remote // as net/http's server sets it; ReadRequest has taken Host out of r.Header, as the server does
	var fast bytes.Buffer
	bw := bufio.NewWriter(&fast)
	upstream.WriteHead(bw, r)
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	peer, _, err := net.SplitHostPort(remote)
	if err != nil {
		peer = ""
	}
	loop := warmloop.AppendUpstreamHead(nil, req, peer)

	want, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(fast.Bytes())))
	if err != nil {
		t.Fatalf("writeHead's %q: %v", fast.Bytes(), err)
	}
	got, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(loop)))
	if err != nil {
		t.Fatalf("the loop's %q: %v", loop, err)
	}
	if got.Method != want.Method || got.RequestURI != want.RequestURI || got.Host != want.Host || !reflect.DeepEqual(got.Header, want.Header) {
		t.Errorf("from %q, peer %q:\nthe loop sends %q\n writeHead sends %q", head, remote, loop, fast.Bytes())
	}
	// ReadRequest makes each name canonical, so the maps cannot tell how the names were sent:
	// writeHead sends its map's keys, canonical ones.
	lines := bytes.Split(loop, []byte("\r\n"))
	for _, l := range lines[1 : len(lines)-2] { // after the request line, before the empty one
		if name, _, _ := bytes.Cut(l, []byte(":")); string(name) != http.CanonicalHeaderKey(string(name)) {
			t.Errorf("the loop sends the name %q, writeHead %q", name, http.CanonicalHeaderKey(string(name)))
		}
	}
}
