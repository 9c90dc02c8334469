package warmloop_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/activator/activator/internal/warmloop"
)

// head is a request head the loop serves, with fields after Host: a base for the cases that change
// one thing in it.
func head(fields ...string) string {
	var b strings.Builder
	b.WriteString("GET /p HTTP/1.1\r\nHost: app.test\r\n")
	for _, f := range fields {
		b.WriteString(f + "\r\n")
	}
	b.WriteString("\r\n")
	return b.String()
}

// passed returns req's passed fields as "Name: value" lines, names as sent.
func passed(req *warmloop.Request) []string {
	var out []string
	for _, f := range req.Fields[:req.N] {
		out = append(out, string(req.Head[f.Name[0]:f.Name[1]])+": "+string(req.Head[f.Value[0]:f.Value[1]]))
	}
	return out
}

func TestParseAccepts(t *testing.T) {
	for _, tc := range []struct {
		name, in           string
		target, path, host string
		fields             []string
	}{
		{
			name:   "curl",
			in:     "GET / HTTP/1.1\r\nHost: localhost:8080\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n",
			target: "/", path: "/", host: "localhost:8080",
			fields: []string{"User-Agent: curl/8.5.0", "Accept: */*"},
		},
		{
			name:   "wrk, no field but Host",
			in:     "GET /index.html HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n",
			target: "/index.html", path: "/index.html", host: "127.0.0.1:8080",
		},
		{
			name: "keep-alive in any case is taken off, other fields keep their order and spelling",
			in: "GET /a/b?x=1&y=%2F HTTP/1.1\r\naccept-encoding: gzip, br\r\nConnection: Keep-Alive\r\n" +
				"host: [2001:db8::1]:8080\r\nCookie: a=1\r\ncookie: b=2\r\n\r\n",
			target: "/a/b?x=1&y=%2F", path: "/a/b", host: "[2001:db8::1]:8080",
			fields: []string{"accept-encoding: gzip, br", "Cookie: a=1", "cookie: b=2"},
		},
		{
			name:   "OWS around values is trimmed, single SP and HTAB inside are kept",
			in:     "GET / HTTP/1.1\r\nHost:\tapp.test \r\nX-A:  a b\tc \t\r\nX-Empty:\r\n\r\n",
			target: "/", path: "/", host: "app.test",
			fields: []string{"X-A: a b\tc", "X-Empty: "},
		},
		{
			name:   "sub-delims, ':' and '@' in the path; '?', '/' and escapes in the query",
			in:     "GET /!$&'()*+,;=:@-._~/a//b?q=/?%41%2e HTTP/1.1\r\nHost: app.test\r\n\r\n",
			target: "/!$&'()*+,;=:@-._~/a//b?q=/?%41%2e", path: "/!$&'()*+,;=:@-._~/a//b", host: "app.test",
		},
		{
			name:   "dots that are no dot segment",
			in:     "GET /.a/..b/.../a.?/../. HTTP/1.1\r\nHost: app.test\r\n\r\n",
			target: "/.a/..b/.../a.?/../.", path: "/.a/..b/.../a.", host: "app.test",
		},
		{
			name:   "empty query",
			in:     "GET /a? HTTP/1.1\r\nHost: app.test\r\n\r\n",
			target: "/a?", path: "/a", host: "app.test",
		},
		{
			name:   "Pragma: no-cache with Cache-Control",
			in:     head("Pragma: no-cache", "Cache-Control: no-cache"),
			target: "/p", path: "/p", host: "app.test",
			fields: []string{"Pragma: no-cache", "Cache-Control: no-cache"},
		},
		{
			name:   "a Pragma other than no-cache",
			in:     head("Pragma: No-Cache"),
			target: "/p", path: "/p", host: "app.test",
			fields: []string{"Pragma: No-Cache"},
		},
		{
			name:   "an underscore in a name that is no refused one",
			in:     head("X_Request_Id: 7"),
			target: "/p", path: "/p", host: "app.test",
			fields: []string{"X_Request_Id: 7"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := []byte(tc.in + "GET /next")
			var req warmloop.Request
			res, n := warmloop.Parse(in, 4096, &req)
			if res != warmloop.Parsed || n != len(tc.in) {
				t.Fatalf("Parse = %v, %d; want Parsed, %d", res, n, len(tc.in))
			}
			if got := string(req.Head); got != tc.in {
				t.Errorf("Head = %q, want %q", got, tc.in)
			}
			if string(req.Target) != tc.target || string(req.Path) != tc.path || string(req.Host) != tc.host {
				t.Errorf("target, path, host = %q, %q, %q; want %q, %q, %q", req.Target, req.Path, req.Host, tc.target, tc.path, tc.host)
			}
			if got := passed(&req); !slices.Equal(got, tc.fields) {
				t.Errorf("fields = %q, want %q", got, tc.fields)
			}
		})
	}
}

func TestParseHandsBack(t *testing.T) {
	type tc struct{ name, in string }
	cases := []tc{
		{"HEAD", "HEAD / HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"OPTIONS", "OPTIONS / HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"POST", "POST / HTTP/1.1\r\nHost: app.test\r\nContent-Length: 0\r\n\r\n"},
		{"method in lower case", "get / HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"empty line before the request line", "\r\nGET / HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"two spaces after the method", "GET  / HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"HTTP/1.0", "GET / HTTP/1.0\r\nHost: app.test\r\n\r\n"},
		{"HTTP/2.0", "GET / HTTP/2.0\r\nHost: app.test\r\n\r\n"},
		{"space after the version", "GET / HTTP/1.1 \r\nHost: app.test\r\n\r\n"},
		{"absolute form", "GET http://app.test/ HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"asterisk form", "GET * HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"authority form", "GET app.test:80 HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"escape in the path", "GET /a%41 HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"escaped dot segment", "GET /a/%2e%2e/b HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"dot segment .", "GET /a/./b HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"dot segment ..", "GET /a/../b HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"dot segment at the end", "GET /a/.. HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"dot segment . before the query", "GET /.?x HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"dot segment .. before the query", "GET /..?x HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"fragment", "GET /a#f HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"fragment in the query", "GET /a?b#f HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"backslash in the path", "GET /a\\b HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"bracket in the path", "GET /[a] HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"high byte in the path", "GET /\xc3\xa9 HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"NUL in the path", "GET /\x00 HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"quote in the query", "GET /?a=\" HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"bad escape in the query", "GET /?a=%zz HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"cut escape in the query", "GET /?a=%4 HTTP/1.1\r\nHost: app.test\r\n\r\n"},
		{"bare LF after the request line", "GET / HTTP/1.1\nHost: app.test\r\n\r\n"},
		{"bare LF after a field", "GET / HTTP/1.1\r\nHost: app.test\nX: y\r\n\r\n"},
		{"bare LF for the empty line", "GET / HTTP/1.1\r\nHost: app.test\r\n\n"},
		{"CR without LF in a value", head("X: a\rb")},
		{"obs-fold", head("X: a", " b")},
		{"obs-fold with HTAB", head("X: a", "\tb")},
		{"space before the colon", head("X : a")},
		{"no colon", head("X a")},
		{"empty name", head(": a")},
		{"name of no token", head("X(y): a")},
		{"NUL in a value", head("X: a\x00b")},
		{"DEL in a value", head("X: a\x7fb")},
		{"high byte in a value", head("X: caf\xc3\xa9")},
		{"two spaces inside a value", head("X: a  b")},
		{"SP and HTAB inside a value", head("X: a \tb")},
		{"no Host", "GET / HTTP/1.1\r\nX: a\r\n\r\n"},
		{"two Hosts", head("Host: app.test")},
		{"two Hosts, the second in lower case", head("host: other.test")},
		{"empty Host", "GET / HTTP/1.1\r\nHost: \r\n\r\n"},
		{"Host with a slash", "GET / HTTP/1.1\r\nHost: a/b\r\n\r\n"},
		{"Host with userinfo", "GET / HTTP/1.1\r\nHost: u@app.test\r\n\r\n"},
		{"Host with a space", "GET / HTTP/1.1\r\nHost: app test\r\n\r\n"},
		{"Host with a zone", "GET / HTTP/1.1\r\nHost: [fe80::1%25eth0]\r\n\r\n"},
		{"Connection: close", head("Connection: close")},
		{"Connection: keep-alive, Upgrade", head("Connection: keep-alive, Upgrade")},
		{"Connection: keep-alive twice", head("Connection: keep-alive", "Connection: keep-alive")},
		{"Connection: keep-alive with two spaces", head("Connection: keep  alive")},
		{"Content-Length and Transfer-Encoding", head("Content-Length: 5", "Transfer-Encoding: chunked")},
		{"User-Agent empty", head("User-Agent: ")},
		{"User-Agent twice", head("User-Agent: a", "user-agent: b")},
		{"Pragma: no-cache without Cache-Control", head("Pragma: no-cache")},
		{"Pragma: no-cache first, without Cache-Control", head("Pragma: no-cache", "Pragma: x")},
	}
	for _, name := range []string{
		// hop-by-hop, as upstream's hopByHop
		"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade",
		"Content-Length", "Expect", "HTTP2-Settings",
		"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto",
		// upstream's clientField
		"X-Real-Ip", "True-Client-Ip", "X-Client-Ip", "Cf-Connecting-Ip", "Fastly-Client-Ip",
		"X-Cluster-Client-Ip", "X-Forwarded", "Forwarded-For", "X-Original-Forwarded-For",
		"X-Forwarded-Ssl", "X-Forwarded-Scheme", "Front-End-Https", "X-Url-Scheme",
		"X-Forwarded-Port", "X-Forwarded-Server", "X-Forwarded-Prefix",
		// aliases with underscores (upstream's forwardedAlias)
		"X_Forwarded_For", "x_real_ip",
	} {
		value := "1"
		if name == "Connection" {
			value = "upgrade"
		}
		cases = append(cases, tc{"field " + name, head(name + ": " + value)})
		if strings.ToLower(name) != name {
			cases = append(cases, tc{"field " + name + " in lower case", head(strings.ToLower(name) + ": " + value)})
		}
	}
	fields := make([]string, warmloop.MaxFields) // with Host, one too many
	for i := range fields {
		fields[i] = "X: 1"
	}
	cases = append(cases, tc{"more than MaxFields fields", head(fields...)})

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var req warmloop.Request
			if res, n := warmloop.Parse([]byte(c.in), 4096, &req); res != warmloop.HandBack || n != 0 {
				t.Errorf("Parse(%q) = %v, %d; want HandBack, 0", c.in, res, n)
			}
		})
	}
}

// TestParseMaxFields: MaxFields fields, Host among them, are served.
func TestParseMaxFields(t *testing.T) {
	fields := make([]string, warmloop.MaxFields-1)
	for i := range fields {
		fields[i] = "X: 1"
	}
	var req warmloop.Request
	in := head(fields...)
	if res, n := warmloop.Parse([]byte(in), 4096, &req); res != warmloop.Parsed || n != len(in) || req.N != len(fields) {
		t.Errorf("Parse = %v, %d with %d fields; want Parsed, %d with %d", res, n, req.N, len(in), len(fields))
	}
}

func TestParseMore(t *testing.T) {
	for _, in := range []string{
		"",
		"G",
		"GET /a/.", // "/a/.b" may follow
		"GET /a/..",
		"GET /?a=%4",
		"GET / HTTP/1.1\r",
		"GET / HTTP/1.1\r\nHost: app.test",
		"GET / HTTP/1.1\r\nHost: \r", // the Host's value may not be empty, but this one is not whole
		"GET / HTTP/1.1\r\nHost: app.test\r\nConnection: Keep",
		"GET / HTTP/1.1\r\nHost: app.test\r\nUser-Agent:",
		"GET / HTTP/1.1\r\nHost: app.test\r\nX: a  ", // trailing OWS may be a run
		"GET / HTTP/1.1\r\nHost: app.test\r\n\r",
	} {
		var req warmloop.Request
		if res, n := warmloop.Parse([]byte(in), 4096, &req); res != warmloop.More || n != 0 {
			t.Errorf("Parse(%q) = %v, %d; want More, 0", in, res, n)
		}
	}
	// Every proper prefix of a head the loop serves.
	in := "GET /a/b?c=%41 HTTP/1.1\r\nHost: app.test\r\nConnection: keep-alive\r\nUser-Agent: x y\r\n\r\n"
	for i := range len(in) {
		var req warmloop.Request
		if res, _ := warmloop.Parse([]byte(in[:i]), 4096, &req); res != warmloop.More {
			t.Errorf("Parse(%q) = %v, want More", in[:i], res)
		}
	}
}

// TestParseMaxHead: a head is served when it is whole within maxHead bytes, else handed back, however
// many bytes are buffered.
func TestParseMaxHead(t *testing.T) {
	in := head("Accept: */*")
	buffered := []byte(in + "GET / HTTP/1.1\r\n")
	for _, tc := range []struct {
		name    string
		b       []byte
		maxHead int
		want    warmloop.Result
	}{
		{"head of exactly maxHead", buffered, len(in), warmloop.Parsed},
		{"head one byte over maxHead", buffered, len(in) - 1, warmloop.HandBack},
		{"maxHead bytes buffered, no whole head", buffered[:len(in)-1], len(in) - 1, warmloop.HandBack},
		{"fewer than maxHead bytes buffered", buffered[:len(in)-1], len(in), warmloop.More},
		{"maxHead 0", buffered, 0, warmloop.HandBack},
		{"maxHead over the offsets' range", buffered, 1 << 20, warmloop.Parsed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var req warmloop.Request
			if res, _ := warmloop.Parse(tc.b, tc.maxHead, &req); res != tc.want {
				t.Errorf("Parse = %v, want %v", res, tc.want)
			}
		})
	}
	// A head longer than 65535 bytes cannot be served (Field's offsets), whatever maxHead says.
	long := head("X: " + strings.Repeat("a", 1<<16))
	var req warmloop.Request
	if res, _ := warmloop.Parse([]byte(long), 1<<20, &req); res != warmloop.HandBack {
		t.Errorf("Parse(head of %d bytes) = %v, want HandBack", len(long), res)
	}
}

// browser is a request as a browser sends it: many fields, quotes and commas in values.
const browser = "GET /assets/app.js?v=3 HTTP/1.1\r\n" +
	"Host: app.example.com\r\n" +
	"Connection: keep-alive\r\n" +
	"sec-ch-ua: \"Chromium\";v=\"124\", \"Google Chrome\";v=\"124\", \"Not-A.Brand\";v=\"99\"\r\n" +
	"sec-ch-ua-mobile: ?0\r\n" +
	"User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36\r\n" +
	"sec-ch-ua-platform: \"Linux\"\r\n" +
	"Accept: */*\r\n" +
	"Sec-Fetch-Site: same-origin\r\n" +
	"Sec-Fetch-Mode: no-cors\r\n" +
	"Sec-Fetch-Dest: script\r\n" +
	"Referer: https://app.example.com/\r\n" +
	"Accept-Encoding: gzip, deflate, br, zstd\r\n" +
	"Accept-Language: en-US,en;q=0.9\r\n" +
	"Cookie: session=abc123; theme=dark\r\n" +
	"\r\n"

func TestParseDoesNotAllocate(t *testing.T) {
	b := []byte(browser)
	var req warmloop.Request
	if allocs := testing.AllocsPerRun(100, func() { warmloop.Parse(b, 4096, &req) }); allocs != 0 {
		t.Errorf("Parse allocates %v times a call", allocs)
	}
}

// TestAppendUpstreamHeadAllocations: with room in dst and a Request reused for one host, nothing is
// allocated; the host's string is made once.
func TestAppendUpstreamHeadAllocations(t *testing.T) {
	b := []byte(browser)
	var req warmloop.Request
	if res, _ := warmloop.Parse(b, 4096, &req); res != warmloop.Parsed {
		t.Fatalf("Parse = %v", res)
	}
	dst := make([]byte, 0, 4096)
	if allocs := testing.AllocsPerRun(100, func() {
		warmloop.Parse(b, 4096, &req)
		dst = warmloop.AppendUpstreamHead(dst[:0], &req, "192.0.2.7")
	}); allocs != 0 {
		t.Errorf("Parse and AppendUpstreamHead allocate %v times a request", allocs)
	}
}

func TestAppendUpstreamHead(t *testing.T) {
	in := "GET /a?b=1 HTTP/1.1\r\nx-REQUEST-id: 7\r\nConnection: keep-alive\r\nHost: app.test\r\n" +
		"accept: */*\r\nsec-ch-ua-mobile: ?0\r\nX_Trace: t\r\nAccept: text/html\r\n\r\n"
	var req warmloop.Request
	if res, _ := warmloop.Parse([]byte(in), 4096, &req); res != warmloop.Parsed {
		t.Fatalf("Parse = %v", res)
	}
	got := string(warmloop.AppendUpstreamHead([]byte("prefix"), &req, "192.0.2.7"))
	want := "prefixGET /a?b=1 HTTP/1.1\r\nHost: app.test\r\n" +
		"X-Request-Id: 7\r\nAccept: */*\r\nSec-Ch-Ua-Mobile: ?0\r\nX_trace: t\r\nAccept: text/html\r\n" +
		"X-Forwarded-For: 192.0.2.7\r\nX-Forwarded-Host: app.test\r\nX-Forwarded-Proto: http\r\n" +
		"Forwarded: for=192.0.2.7;host=app.test;proto=http\r\n\r\n"
	if got != want {
		t.Errorf("AppendUpstreamHead:\n got %q\nwant %q", got, want)
	}
	// The names are the ones net/http gives them.
	r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(strings.TrimPrefix(got, "prefix"))))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"X-Request-Id", "Accept", "Sec-Ch-Ua-Mobile", "X_trace"} {
		if r.Header[k] == nil {
			t.Errorf("net/http reads no %s from %q", k, got)
		}
	}
	// A Request reused for another host sends that one.
	in2 := bytes.Replace([]byte(in), []byte("app.test"), []byte("other.test"), 1)
	if res, _ := warmloop.Parse(in2, 4096, &req); res != warmloop.Parsed {
		t.Fatalf("Parse = %v", res)
	}
	if got := string(warmloop.AppendUpstreamHead(nil, &req, "")); !strings.Contains(got, "X-Forwarded-Host: other.test\r\n") {
		t.Errorf("after a change of host, AppendUpstreamHead = %q", got)
	}
}

// fieldLines are field lines the loop passes on, takes off or refuses, in spellings it must treat
// alike or apart (internal/warmloop/testdata/fieldlines.json, which the parser's and the upstream
// head's pair tests share).
var fieldLines = func() []string {
	b, err := os.ReadFile("testdata/fieldlines.json")
	if err != nil {
		panic(err)
	}
	var lines []string
	if err := json.Unmarshal(b, &lines); err != nil {
		panic(err)
	}
	return lines
}()

// TestParseFieldPairs runs the fuzz target's checks on every head with one or two of fieldLines after
// Host: the combinations that the rules about names (a second User-Agent, a Pragma without
// Cache-Control, a second Connection) are about, which random bytes seldom make.
func TestParseFieldPairs(t *testing.T) {
	var parsed, handedBack int
	count := func(res warmloop.Result) {
		switch res {
		case warmloop.Parsed:
			parsed++
		case warmloop.HandBack:
			handedBack++
		default:
			t.Errorf("Parse of a whole head = %v", res)
		}
	}
	for _, a := range fieldLines {
		count(checkParse(t, []byte(head(a))))
		for _, b := range fieldLines {
			count(checkParse(t, []byte(head(a, b))))
		}
	}
	if parsed == 0 || handedBack == 0 {
		t.Errorf("%d heads parsed, %d handed back: the list tests nothing", parsed, handedBack)
	}
}

// TestParseEachByte puts each byte value in turn into each part of a head and checks which ones Parse
// serves (running the fuzz target's checks on each): exactly the bytes its rules name.
func TestParseEachByte(t *testing.T) {
	const (
		alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
		pchar = alnum + "-._~!$&'()*+,;=:@"
	)
	var visible strings.Builder
	for c := 0x21; c <= 0x7e; c++ {
		visible.WriteByte(byte(c))
	}
	for _, tc := range []struct {
		part, before, after string
		served              string // the bytes served there
	}{
		{"path", "GET /a", "b HTTP/1.1\r\nHost: app.test\r\n\r\n", pchar + "/?"}, // '?' starts the query
		{"query", "GET /?a", "b HTTP/1.1\r\nHost: app.test\r\n\r\n", pchar + "/?"},
		{"field name", "GET / HTTP/1.1\r\nHost: app.test\r\nX", "Y: v\r\n\r\n", alnum + "!#$%&'*+-.^_`|~:"}, // "X:Y: v" is X's
		{"field value", "GET / HTTP/1.1\r\nHost: app.test\r\nX: v", "w\r\n\r\n", visible.String() + " \t"},
		{"Host", "GET / HTTP/1.1\r\nHost: a", "b\r\n\r\n", alnum + "-._:[]"},
	} {
		t.Run(tc.part, func(t *testing.T) {
			for c := range 256 {
				in := tc.before + string(rune(0)) + tc.after
				b := []byte(in)
				b[len(tc.before)] = byte(c)
				got := checkParse(t, b) == warmloop.Parsed
				if want := strings.IndexByte(tc.served, byte(c)) >= 0; got != want {
					t.Errorf("%q: served %v, want %v", b, got, want)
				}
			}
		})
	}
}
