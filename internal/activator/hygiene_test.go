package activator

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/testenv"
)

// hygienePatience bounds the tests' socket reads; it is never waited out when the edge behaves.
const hygienePatience = 10 * time.Second

// edgeListen serves s as cmd/activator does (Listener, ConnContext) on a loopback port, until cleanup.
// wired false serves it on a plain listener, without the framing record.
func edgeListen(t *testing.T, s *Server, wired bool) string {
	t.Helper()
	return edgeListenProtocols(t, s, wired, nil)
}

// edgeListenProtocols is edgeListen serving protocols (nil: net/http's default, HTTP/1 alone on a
// plain listener).
func edgeListenProtocols(t *testing.T, s *Server, wired bool, protocols *http.Protocols) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: s, ReadHeaderTimeout: hygienePatience, Protocols: protocols}
	if wired {
		hs.ConnContext = ConnContext
		ln = Listener(ln, registry.DefaultSendTimeout)
	}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	t.Cleanup(func() {
		hs.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("edge serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// rawConn is one client connection to the edge that sends bytes exactly as given.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.SetDeadline(time.Now().Add(hygienePatience)); err != nil {
		t.Fatal(err)
	}
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (rc *rawConn) send(raw string) {
	rc.t.Helper()
	if _, err := io.WriteString(rc.c, raw); err != nil {
		rc.t.Fatal(err)
	}
}

// next reads one answer and its body; err is what ended the read when there was none.
func (rc *rawConn) next() (*http.Response, string, error) {
	resp, err := http.ReadResponse(rc.br, nil)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, string(body), err
}

// exchange sends one raw request on a new connection and reads its answer.
func exchange(t *testing.T, addr, raw string) (*http.Response, string) {
	t.Helper()
	rc := dialRaw(t, addr)
	rc.send(raw)
	resp, body, err := rc.next()
	if err != nil {
		t.Fatalf("%q: %v", raw, err)
	}
	return resp, body
}

// echoTenant is an upstream that answers with its name and what it was sent: the request-target as it
// came on the wire, and the Host.
func echoTenant(t *testing.T, name string) string {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "%s %s host=%s", name, r.RequestURI, r.Host)
	}))
	t.Cleanup(up.Close)
	return up.Listener.Addr().String()
}

// serveRoutes is a Server over routes, all backed by b and gated by gate, logging to logs (nil:
// nowhere), shut down at cleanup.
func serveRoutes(t *testing.T, b *fakeBackend, gate Gate, logs io.Writer, routes ...*registry.Route) *Server {
	t.Helper()
	if logs == nil {
		logs = io.Discard
	}
	s := New(Options{
		Opener:  fakeProvider{b},
		Logger:  slog.New(slog.NewTextHandler(logs, nil)),
		NewGate: func(*registry.Route) Gate { return gate },
	})
	if err := s.Apply(&registry.Config{Routes: routes}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s
}

// twoRoutes is a Server with twoRouteList's routes over b.
func twoRoutes(t *testing.T, b *fakeBackend) *Server {
	t.Helper()
	return serveRoutes(t, b, passGate{}, nil, twoRouteList(t)...)
}

// twoRouteList is routes "api" (app.test, prefix /api) and "root" (app.test, no prefix), each to its
// own echoTenant.
func twoRouteList(t *testing.T) []*registry.Route {
	t.Helper()
	api, root := testRoute("api"), testRoute("root")
	api.Hosts, root.Hosts = []string{"app.test"}, []string{"app.test"}
	api.PathPrefix = "/api"
	api.Upstream.Address, root.Upstream.Address = echoTenant(t, "api"), echoTenant(t, "root")
	return []*registry.Route{api, root}
}

// twoRoutesBothPaths is a conformEdge with twoRouteList's routes over b.
func twoRoutesBothPaths(t *testing.T, b *fakeBackend) *conformEdge {
	t.Helper()
	return newConformEdge(t, conformConfig{b: b, routes: twoRouteList(t)})
}

// TestEdgeRefusesWithoutWaking: CONNECT and TRACE get 501, an encoded slash and a target that is no
// path get 400, all before routing: no tenant wakes. CONNECT's connection is closed after the answer.
// On both paths: the loop hands each back to net/http.
func TestEdgeRefusesWithoutWaking(t *testing.T) {
	b := &fakeBackend{}
	e := twoRoutesBothPaths(t, b)
	for _, tc := range []struct {
		raw   string
		code  int
		close bool
	}{
		{"CONNECT app.test:443 HTTP/1.1\r\nHost: app.test:443\r\n\r\n", http.StatusNotImplemented, true},
		{"TRACE / HTTP/1.1\r\nHost: app.test\r\n\r\n", http.StatusNotImplemented, false},
		{"TRACE /api/x HTTP/1.1\r\nHost: app.test\r\nMax-Forwards: 0\r\n\r\n", http.StatusNotImplemented, false},
		{"GET /api%2Fx HTTP/1.1\r\nHost: app.test\r\n\r\n", http.StatusBadRequest, false},
		{"GET /x/..%2f..%2Fapi HTTP/1.1\r\nHost: app.test\r\n\r\n", http.StatusBadRequest, false},
		// A request refused before its body is read closes its connection: net/http would otherwise
		// wait, without a deadline, for a body the client may never send (TestRefusedBeforeItsBody).
		{"POST /api%2fx HTTP/1.1\r\nHost: app.test\r\nContent-Length: 2\r\n\r\nhi", http.StatusBadRequest, true},
		{"GET * HTTP/1.1\r\nHost: app.test\r\n\r\n", http.StatusBadRequest, false},
		{"GET http:x HTTP/1.1\r\nHost: app.test\r\n\r\n", http.StatusBadRequest, false},
	} {
		for _, p := range edgePaths {
			t.Run(p.name+" "+strings.Fields(tc.raw)[0]+" "+strings.Fields(tc.raw)[1], func(t *testing.T) {
				resp, body := e.exchange(t, p, tc.raw)
				if resp.StatusCode != tc.code {
					t.Errorf("status %d, want %d; body %q", resp.StatusCode, tc.code, body)
				}
				if resp.Close != tc.close {
					t.Errorf("connection close = %v, want %v", resp.Close, tc.close)
				}
			})
		}
	}
	if n := b.wakes.Load(); n != 0 {
		t.Fatalf("requests refused at the edge woke the backend %d times, want 0", n)
	}
}

// TestOnePathForRouteAndTenant: the route is chosen on the path after dot-segment removal, and the
// tenant is sent that same path (raw segments byte for byte), on the fast path (GET) and through the
// ReverseProxy (POST) alike, and on the loop's path, which serves a plain path itself and hands the
// others back.
func TestOnePathForRouteAndTenant(t *testing.T) {
	e := twoRoutesBothPaths(t, &fakeBackend{})
	e.wake(t, "api", "root") // the loop serves the GETs of plain paths itself only to awake routes
	for _, tc := range []struct{ target, want string }{
		{"/public/../api/x", "api /api/x"},
		{"/api/../secret", "root /secret"},
		{"/api/%2E%2E/secret", "root /secret"},
		{"/api/.%2e/secret", "root /secret"},
		{"/api/%2e./secret", "root /secret"},
		{"/api/..", "root /"},
		{"/api/./x/.", "api /api/x/"},
		{"/../x", "root /x"},
		{"/../../api/./x", "api /api/x"},
		{"/apix/../api", "api /api"},
		{"/api/a%20b/../c%41", "api /api/c%41"},
		{"/api/x%2e", "api /api/x%2e"},
		{"/api/.well-known/x", "api /api/.well-known/x"},
		{"/api/..x/y", "api /api/..x/y"},
		{"/api//../x", "api /api/x"},
		{"/api/../s?a=/../b", "root /s?a=/../b"},
		{"http://app.test/api/../y", "root /y"},
		{"/api/x", "api /api/x"},
		{"/api/x?q=/../y", "api /api/x?q=/../y"},
	} {
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			for _, p := range edgePaths {
				t.Run(p.name+" "+method+" "+tc.target, func(t *testing.T) {
					raw := method + " " + tc.target + " HTTP/1.1\r\nHost: app.test\r\n"
					if method == http.MethodPost {
						raw += "Content-Length: 2\r\n\r\nhi"
					} else {
						raw += "\r\n"
					}
					resp, body := e.exchange(t, p, raw)
					if want := tc.want + " host=app.test"; resp.StatusCode != http.StatusOK || body != want {
						t.Errorf("got %d %q, want 200 %q", resp.StatusCode, body, want)
					}
				})
			}
		}
	}
}

// TestAbsoluteFormWinsOverHost: a request-target in absolute form routes by its own host, not the
// Host header (RFC 9112 §3.2.2), and the tenant sees that host; on both paths.
func TestAbsoluteFormWinsOverHost(t *testing.T) {
	e := twoRoutesBothPaths(t, &fakeBackend{})
	for _, p := range edgePaths {
		t.Run(p.name, func(t *testing.T) {
			resp, body := e.exchange(t, p, "GET http://app.test/api/x HTTP/1.1\r\nHost: other.test\r\n\r\n")
			if want := "api /api/x host=app.test"; resp.StatusCode != http.StatusOK || body != want {
				t.Errorf("absolute form app.test, Host other.test: %d %q, want 200 %q", resp.StatusCode, body, want)
			}
			resp, body = e.exchange(t, p, "GET http://other.test/api/x HTTP/1.1\r\nHost: app.test\r\n\r\n")
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("absolute form other.test, Host app.test: %d %q, want 404", resp.StatusCode, body)
			}
		})
	}
}

// TestAmbiguousFramingClosesConnection: a request framed by both Content-Length and Transfer-Encoding
// (HTTP/1.1), or by Transfer-Encoding in HTTP/1.0, is answered with "Connection: close" and the
// pipelined request after it is never answered. Requests framed one way keep their connection, when
// the edge is wired as cmd/activator wires it; without the wiring every chunked request closes. The
// wired cases run on both paths (the loop hands each back to net/http, whose framing record has seen
// the bytes the loop read); the loop takes no connection from an edge without the wiring.
func TestAmbiguousFramingClosesConnection(t *testing.T) {
	const next = "GET /api/next HTTP/1.1\r\nHost: app.test\r\n\r\n"
	for _, tc := range []struct {
		name  string
		first string
		wired bool
		close bool
	}{
		{"CL+TE", "POST /api/x HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", true, true},
		{"TE+CL lower case", "POST /api/x HTTP/1.1\r\nHost: app.test\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n5\r\nhello\r\n0\r\n\r\n", true, true},
		{"CL+TE refused at the edge", "POST /api%2Fx HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", true, true},
		{"HTTP/1.0 TE", "POST /api/x HTTP/1.0\r\nHost: app.test\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n", true, true},
		{"TE alone", "POST /api/x HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", true, false},
		{"CL alone", "POST /api/x HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\n\r\nhello", true, false},
		{"HTTP/1.0 CL", "POST /api/x HTTP/1.0\r\nHost: app.test\r\nConnection: keep-alive\r\nContent-Length: 5\r\n\r\nhello", true, false},
		{"TE alone, not wired", "POST /api/x HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", false, true},
	} {
		paths := edgePaths
		if !tc.wired {
			paths = netHTTPOnly
		}
		for _, p := range paths {
			t.Run(p.name+" "+tc.name, func(t *testing.T) {
				var rc *rawConn
				if tc.wired {
					rc = twoRoutesBothPaths(t, &fakeBackend{}).conn(t, p, "")
				} else {
					rc = dialRaw(t, edgeListen(t, twoRoutes(t, &fakeBackend{}), false))
				}
				rc.send(tc.first + next)
				resp, body, err := rc.next()
				if err != nil {
					t.Fatalf("first answer: %v", err)
				}
				if resp.Close != tc.close {
					t.Errorf("first answer %d %q: Connection: close = %v, want %v", resp.StatusCode, body, resp.Close, tc.close)
				}
				resp, body, err = rc.next()
				switch {
				case tc.close && err == nil:
					t.Errorf("the pipelined request was answered (%d %q); the connection should have closed", resp.StatusCode, body)
				case tc.close && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !isReset(err):
					t.Errorf("after the first answer: %v, want the connection closed", err)
				case !tc.close && err != nil:
					t.Errorf("the pipelined request: %v, want its answer", err)
				case !tc.close && body != "api /api/next host=app.test":
					t.Errorf("the pipelined request: %d %q", resp.StatusCode, body)
				}
			})
		}
	}
}

func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }

// TestUpstreamErrorBodyHasNoAddress: a tenant that refuses connections, or resets them, gets the
// client a 502 that names the route and the class of the failure, in every body format, and no
// address or port; the route's log has the whole error.
func TestUpstreamErrorBodyHasNoAddress(t *testing.T) {
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedAddr := refused.Addr().String()
	refused.Close()
	resets, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resets.Close() })
	go func() {
		for {
			c, err := resets.Accept()
			if err != nil {
				return
			}
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // close with a reset
			}
			_, _ = c.Read(make([]byte, 1))
			c.Close()
		}
	}()
	for _, up := range []struct {
		addr   string
		causes []string
	}{
		{refusedAddr, []string{"connection refused"}},
		{resets.Addr().String(), []string{"connection reset", "connection closed before the answer"}},
	} {
		logs := &testenv.SyncBuffer{}
		r := testRoute("app")
		r.Upstream.Address = up.addr
		addr := edgeListen(t, serveRoutes(t, &fakeBackend{}, passGate{}, logs, r), true)
		_, port, _ := net.SplitHostPort(up.addr)
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			for _, accept := range []string{"", "application/json", "text/html"} {
				t.Run(up.addr+" "+method+" "+accept, func(t *testing.T) {
					raw := method + " /x HTTP/1.1\r\nHost: app.test\r\nAccept: " + accept + "\r\n"
					if method == http.MethodPost {
						raw += "Content-Length: 2\r\n\r\nhi"
					} else {
						raw += "\r\n"
					}
					resp, body := exchange(t, addr, raw)
					if resp.StatusCode != http.StatusBadGateway {
						t.Errorf("status %d, want 502; body %q", resp.StatusCode, body)
					}
					if strings.Contains(body, "127.0.0.1") || strings.Contains(body, port) {
						t.Errorf("body %q holds the upstream's address", body)
					}
					if !strings.Contains(body, "app") || !containsAny(body, up.causes) {
						t.Errorf("body %q does not name the route and one of %q", body, up.causes)
					}
				})
			}
		}
		if !strings.Contains(logs.String(), up.addr) {
			t.Errorf("the log does not hold the whole error with %s:\n%s", up.addr, logs)
		}
		if t.Failed() {
			t.Logf("log:\n%s", logs)
		}
	}
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// TestWakeErrorBodyHasNoAddress: a failed wake whose cause quotes an address (a health probe's dial
// error) answers the held request, and the next one in the backoff, without it; the admin API's
// status keeps the whole text.
// A route with detailed_errors quotes a failed wake's cause to clients, still without its addresses.
func TestWakeErrorBodyHasNoAddress(t *testing.T) {
	cause := errors.New(`GET /healthz: Get "http://10.1.2.3:8080/healthz": dial tcp 10.1.2.3:8080: connect: connection refused`)
	s, in := newTestServer(t, &fakeBackend{}, passGate{err: cause}, func(r *registry.Route) { r.DetailedErrors = true })
	addr := edgeListen(t, s, true)
	for _, what := range []string{"held request", "request in the backoff"} {
		resp, body := exchange(t, addr, "GET / HTTP/1.1\r\nHost: app.test\r\n\r\n")
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("%s: status %d, want 503; body %q", what, resp.StatusCode, body)
		}
		if strings.Contains(body, "10.1.2.3") || strings.Contains(body, "8080") {
			t.Errorf("%s: body %q holds the tenant's address", what, body)
		}
		if !strings.Contains(body, "connection refused") {
			t.Errorf("%s: body %q lost the cause", what, body)
		}
	}
	if st := in.status(); !strings.Contains(st.LastError, "10.1.2.3:8080") {
		t.Errorf("status last_error %q, want the whole text", st.LastError)
	}
}

func TestWithoutAddresses(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"dial tcp 127.0.0.1:45084: connect: connection refused", "dial tcp <address>: connect: connection refused"},
		{"write tcp 127.0.0.1:45084->127.0.0.1:8080: write: broken pipe", "write tcp <address>-><address>: write: broken pipe"},
		{`Get "http://10.0.0.5:8080/healthz": EOF`, `Get "http://<address>/healthz": EOF`},
		{"POST https://admin:pw@bmc.lab/redfish/v1: 401", "POST https://<address>/redfish/v1: 401"},
		{"dial tcp [::1]:8080: connect: connection refused", "dial tcp <address>: connect: connection refused"},
		{"dial tcp [fe80::1%eth0]:80: i/o timeout", "dial tcp <address>: i/o timeout"},
		{"listening on fe80::1 and ::1 failed", "listening on <address> and <address> failed"},
		{"dial unix /run/app/http.sock: connect: no such file or directory", "dial unix <address>: connect: no such file or directory"},
		{"dial tcp db.internal:5432: i/o timeout", "dial tcp <address>: i/o timeout"},
		{"dial tcp: lookup app.internal on 127.0.0.53:53: no such host", "dial tcp: lookup <address> on <address>: no such host"},
		{"exited with code 3: boom: cannot open /var/lib/app/db", "exited with code 3: boom: cannot open /var/lib/app/db"},
		{`no route for this host "nobody.test"`, `no route for this host "nobody.test"`},
		{"wake failed in phase health: no answer within 1s (the probe timeout)", "wake failed in phase health: no answer within 1s (the probe timeout)"},
		{"std::io at 12:30:45", "std::io at 12:30:45"},
	} {
		if got := withoutAddresses(tc.in); got != tc.want {
			t.Errorf("withoutAddresses(%q)\n got %q\nwant %q", tc.in, got, tc.want)
		}
	}
}

// refRemoveDotSegments is RFC 3986 §5.2.4 as written, on an input buffer and an output buffer.
func refRemoveDotSegments(in string) string {
	out := ""
	for in != "" {
		switch {
		case strings.HasPrefix(in, "../"):
			in = in[3:]
		case strings.HasPrefix(in, "./"):
			in = in[2:]
		case strings.HasPrefix(in, "/./"):
			in = in[2:]
		case in == "/.":
			in = "/"
		case strings.HasPrefix(in, "/../"):
			in = in[3:]
			out = out[:max(strings.LastIndexByte(out, '/'), 0)]
		case in == "/..":
			in = "/"
			out = out[:max(strings.LastIndexByte(out, '/'), 0)]
		case in == "." || in == "..":
			in = ""
		default:
			i := strings.IndexByte(in[1:], '/')
			if i < 0 {
				out, in = out+in, ""
			} else {
				out, in = out+in[:i+1], in[i+1:]
			}
		}
	}
	return out
}

// TestRemoveDotSegments: every path of up to five segments drawn from a set with every kind of dot
// segment comes out as RFC 3986's own algorithm gives it, decoded and raw (with "%2E" for "."); and
// hasDotSegment finds exactly the paths that change.
func TestRemoveDotSegments(t *testing.T) {
	segs := []string{"a", "b.", ".c", "", ".", "..", "...", "%2E", "%2e%2E", ".%2e", "x%2ey"}
	var paths []string
	var grow func(p string, n int)
	grow = func(p string, n int) {
		paths = append(paths, p)
		if n == 0 {
			return
		}
		for _, s := range segs {
			grow(p+"/"+s, n-1)
		}
	}
	grow("", 5)
	for _, raw := range paths[1:] {
		decoded, err := url.PathUnescape(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := removeDotSegments(raw, true), refEscaped(raw); got != want {
			t.Fatalf("raw %q: got %q, want %q", raw, got, want)
		}
		want := refRemoveDotSegments(decoded)
		if want == "" {
			want = "/"
		}
		if got := removeDotSegments(decoded, false); got != want {
			t.Fatalf("decoded %q: got %q, want %q", decoded, got, want)
		}
		if got := hasDotSegment(decoded); got != (want != decoded) {
			t.Fatalf("hasDotSegment(%q) = %v, but remove_dot_segments gives %q", decoded, got, want)
		}
	}
}

// refEscaped is the reference on a raw path: its dot segments decoded (RFC 3986 §6.2.2.2), the rest
// as they are.
func refEscaped(raw string) string {
	parts := strings.Split(raw, "/")
	for i, p := range parts {
		if d, _ := url.PathUnescape(p); d == "." || d == ".." {
			parts[i] = d
		}
	}
	out := refRemoveDotSegments(strings.Join(parts, "/"))
	if out == "" {
		return "/"
	}
	return out
}

func TestCleanPath(t *testing.T) {
	for _, tc := range []struct{ target, path, raw string }{
		{"/a/b", "/a/b", ""},
		{"/a/./b/../c", "/a/c", ""},
		{"/a%2Cb/../c", "/c", "/c"},
		{"/a/%2E%2E/c%2Cd", "/c,d", "/c%2Cd"},
		{"/x%2E", "/x.", "/x%2E"},
	} {
		u, err := url.ParseRequestURI(tc.target)
		if err != nil {
			t.Fatal(err)
		}
		p, raw, err := cleanPath(u.Path, u.RawPath)
		if err != nil || p != tc.path || raw != tc.raw {
			t.Errorf("cleanPath(%q) = %q, %q, %v; want %q, %q", tc.target, p, raw, err, tc.path, tc.raw)
		}
		if u.Path, u.RawPath = p, raw; u.EscapedPath() != tc.raw && tc.raw != "" {
			t.Errorf("%q forwards as %q, want %q", tc.target, u.EscapedPath(), tc.raw)
		}
	}
	for _, target := range []string{"/api%2Fx", "/a/%2f", "/%2F../x"} {
		u, _ := url.ParseRequestURI(target)
		if _, _, err := cleanPath(u.Path, u.RawPath); !errors.Is(err, ErrTarget) {
			t.Errorf("cleanPath(%q): %v, want ErrTarget", target, err)
		}
	}
}

// TestFramingConnScan: the matcher finds a Content-Length or Transfer-Encoding line however the bytes
// are split across reads and in any case, and nothing else.
func TestFramingConnScan(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint32
	}{
		{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n", sawContentLength},
		{"POST / HTTP/1.1\r\nCONTENT-LENGTH: 5\r\nTransfer-Encoding: chunked\r\n\r\n", sawContentLength | sawTransferEncoding},
		{"POST / HTTP/1.1\ntransfer-encoding: chunked\n\n", sawTransferEncoding},
		{"POST / HTTP/1.1\r\nX-Content-Length: 5\r\nTE: trailers\r\nTransfer-Encodings: x\r\n\r\n", 0},
		{"POST / HTTP/1.1\r\nX-A: b\r\n Content-Length: 5\r\n\r\n", 0}, // a continuation line
		{"GET / HTTP/1.1\r\n\r\n\r\nContent-Length: 1\r\n", sawContentLength},
		{"GET / HTTP/1.1\r\nContent-Lengt: 1\r\nTransfer-Encoding:chunked\r\n", sawTransferEncoding},
	} {
		for split := 0; split <= len(tc.in); split++ {
			for _, step := range []int{1, 3, len(tc.in)} {
				c := &framingConn{}
				var seen uint32
				b := []byte(tc.in)
				seen |= c.scanLocked(b[:split])
				for rest := b[split:]; len(rest) > 0; {
					n := min(step, len(rest))
					seen |= c.scanLocked(rest[:n])
					rest = rest[n:]
				}
				if seen != tc.want {
					t.Fatalf("%q split at %d, step %d: seen %b, want %b", tc.in, split, step, seen, tc.want)
				}
			}
		}
	}
}

// BenchmarkHygiene: what the edge's checks cost a request before routing, for a plain path (nearly
// every request: no allocation) and for one with dot segments.
func BenchmarkHygiene(b *testing.B) {
	s := &Server{}
	for _, target := range []string{"/api/v1/items", "/api/v1/../v2/./items"} {
		r := httptest.NewRequest(http.MethodGet, "http://app.test"+target, nil)
		w := httptest.NewRecorder()
		b.Run(target, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, r2 := s.hygiene(w, r); r2 == nil {
					b.Fatal("refused")
				}
			}
		})
	}
}
