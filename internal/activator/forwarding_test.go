package activator

import (
	"bufio"
	"crypto/tls"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	proxyproto "github.com/pires/go-proxyproto"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/trust"
)

// The trusted proxy of the forwarding test is 127.0.0.1, the loopback's default source; its
// untrusted client connects from 127.0.0.2.
const untrustedSource = "127.0.0.2"

// forwardingEdge is a Server whose config trusts 127.0.0.1, in front of a tenant that records each
// request's forwarding fields, served on three edge listeners as cmd/activator would serve them: plain
// HTTP with the event loop on (serveWithLoop), plain HTTP with the PROXY protocol, and TLS with the
// PROXY protocol. The loop takes connections from the plain listener alone: the others are not a
// socket under the framing record (socketUnder).
type forwardingEdge struct {
	s                *Server
	route, warm      *registry.Route
	plain, pp, ppTLS string
	both             *conformEdge  // the plain listener, for its two paths
	got              chan []string // forwarding fields of each request the tenant got
}

func newForwardingEdge(t *testing.T) *forwardingEdge {
	t.Helper()
	e := &forwardingEdge{got: make(chan []string, 16)}
	tenant := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.got <- forwardingFields(r.Header)
	}))
	t.Cleanup(tenant.Close)
	warmUp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "warm") }))
	t.Cleanup(warmUp.Close)
	e.route, e.warm = testRoute("app"), testRoute("warm")
	e.route.Upstream.Address, e.warm.Upstream.Address = tenant.Listener.Addr().String(), warmUp.Listener.Addr().String()
	e.s = New(Options{
		Opener:  fakeProvider{&fakeBackend{}},
		Logger:  slog.New(slog.DiscardHandler),
		NewGate: func(*registry.Route) Gate { return passGate{} },
	})
	e.apply(t, "127.0.0.1/32")
	t.Cleanup(func() { _ = e.s.Shutdown(t.Context()) })
	e.both = &conformEdge{s: e.s}
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.plain = serveWithLoop(t, e.s, plain, loopWiring{edge: registry.EdgeLimits{SendTimeout: registry.DefaultSendTimeout}, hook: e.both.pause.hook})
	e.both.addr = e.plain
	for _, l := range []struct {
		addr *string
		tls  bool
	}{{&e.pp, false}, {&e.ppTLS, true}} {
		srv := httptest.NewUnstartedServer(e.s)
		srv.Config.ErrorLog = log.New(io.Discard, "", 0)
		srv.Listener = trust.Wrap(srv.Listener, func() bool { return true }, e.s.TrustedProxy)
		if l.tls {
			srv.StartTLS()
		} else {
			srv.Listener, srv.Config.ConnContext = Listener(srv.Listener, registry.DefaultSendTimeout), ConnContext
			srv.Start()
		}
		t.Cleanup(srv.Close)
		*l.addr = srv.Listener.Addr().String()
	}
	return e
}

// apply makes the config's trusted_proxies prefixes (none for "").
func (e *forwardingEdge) apply(t *testing.T, prefixes ...string) {
	t.Helper()
	cfg := &registry.Config{Routes: []*registry.Route{e.route, e.warm}}
	for _, p := range prefixes {
		cfg.TrustedProxies = append(cfg.TrustedProxies, netip.MustParsePrefix(p))
	}
	if err := e.s.Apply(cfg); err != nil {
		t.Fatal(err)
	}
}

// forwardingFields returns h's forwarding fields as "Name: value" lines.
func forwardingFields(h http.Header) []string {
	var out []string
	for _, k := range []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded"} {
		for _, v := range h[k] {
			out = append(out, k+": "+v)
		}
	}
	return out
}

// want is what the tenant must get: X-Forwarded-For, X-Forwarded-Host, X-Forwarded-Proto and
// Forwarded, one line each.
func want(xff, host, proto, fwd string) []string {
	return []string{"X-Forwarded-For: " + xff, "X-Forwarded-Host: " + host, "X-Forwarded-Proto: " + proto, "Forwarded: " + fwd}
}

// sendVia connects to addr from source ("" for the trusted proxy), writes preface (a PROXY header), then
// over TLS when tlsOn a GET for app.test with the header lines; it returns the answer's status, or 0
// when the edge closed the connection without one. On the loop's path (e.plain only) the GET goes on a
// connection the loop owns.
func (e *forwardingEdge) sendVia(t *testing.T, p edgePath, addr, source, preface string, tlsOn bool, header string) int {
	t.Helper()
	var c net.Conn
	var br *bufio.Reader
	if p.loop {
		if addr != e.plain || preface != "" || tlsOn {
			t.Fatal("the loop takes connections from the plain listener alone")
		}
		rc := e.both.conn(t, p, source)
		c, br = rc.c, rc.br
	} else {
		var d net.Dialer
		if source != "" {
			d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(source)}
		}
		raw, err := d.Dial("tcp", addr)
		if err != nil {
			if source != "" {
				t.Skipf("cannot connect from %s: %v", source, err)
			}
			t.Fatal(err)
		}
		defer raw.Close()
		_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(raw, preface); err != nil {
			t.Fatal(err)
		}
		c = raw
		if tlsOn {
			c = tls.Client(raw, &tls.Config{InsecureSkipVerify: true, ServerName: "app.test"}) // httptest's certificate
		}
		br = bufio.NewReader(c)
	}
	// Kept alive: a request the loop serves itself asks to be, and the edge's answer must not depend on
	// it.
	req := "GET / HTTP/1.1\r\nHost: app.test\r\n"
	for line := range strings.Lines(header) {
		req += strings.TrimSpace(line) + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		return 0 // refused during the TLS handshake
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func proxyHeader(t *testing.T, version byte, src, dst string) string {
	t.Helper()
	b, err := proxyproto.HeaderProxyFromAddrs(version, net.TCPAddrFromAddrPort(netip.MustParseAddrPort(src)),
		net.TCPAddrFromAddrPort(netip.MustParseAddrPort(dst))).Format()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestTenantLearnsClient: whichever way a request reaches the edge, the tenant is told the real
// client's address and scheme: a direct client's own, a trusted proxy's X-Forwarded-* appended to,
// never an untrusted client's forged fields, the PROXY header's source from a trusted proxy (v1 and
// v2, plain and TLS); a PROXY header from an untrusted peer, and a trusted proxy's connection without
// one, are refused unanswered. A reload that drops the proxy from trusted_proxies applies at once.
// The cases on the plain listener run on both paths: the loop serves a request without forwarding
// fields itself, and hands back every other.
func TestTenantLearnsClient(t *testing.T) {
	e := newForwardingEdge(t)
	forged := "X-Forwarded-For: 203.0.113.66\nX-Forwarded-Proto: https\nX-Forwarded-Host: evil.example\nForwarded: for=203.0.113.66;proto=https"
	untrusted := want("127.0.0.2", "app.test", "http", "for=127.0.0.2;host=app.test;proto=http")
	for _, tc := range []struct {
		name           string
		addr           *string
		source         string
		preface        string
		tls            bool
		header         string
		want           []string // nil: refused unanswered, the tenant gets nothing
		reloadUntrusts bool     // apply a config without trusted_proxies first
	}{
		{name: "direct client", addr: &e.plain, source: untrustedSource, want: untrusted},
		{name: "trusted proxy without fields", addr: &e.plain,
			want: want("127.0.0.1", "app.test", "http", "for=127.0.0.1;host=app.test;proto=http")},
		{name: "trusted proxy with X-Forwarded-*", addr: &e.plain, header: "X-Forwarded-For: 203.0.113.9\nX-Forwarded-Proto: https",
			want: want("203.0.113.9, 127.0.0.1", "app.test", "https", "for=203.0.113.9;host=app.test;proto=https, for=127.0.0.1")},
		{name: "trusted proxy with Forwarded", addr: &e.plain, header: "Forwarded: for=\"[2001:db8::9]\";proto=https\nX-Forwarded-For: 2001:db8::9",
			want: want("2001:db8::9, 127.0.0.1", "app.test", "http", `for="[2001:db8::9]";proto=https, for=127.0.0.1`)},
		{name: "untrusted client forging every field", addr: &e.plain, source: untrustedSource, header: forged, want: untrusted},
		{name: "PROXY v1 from the trusted proxy", addr: &e.pp, preface: proxyHeader(t, 1, "203.0.113.9:4711", "192.0.2.1:80"),
			want: want("203.0.113.9", "app.test", "http", "for=203.0.113.9;host=app.test;proto=http")},
		{name: "PROXY v2 from the trusted proxy, its client forging", addr: &e.pp, preface: proxyHeader(t, 2, "[2001:db8::9]:4711", "[2001:db8::1]:80"),
			header: forged, want: want("2001:db8::9", "app.test", "http", `for="[2001:db8::9]";host=app.test;proto=http`)},
		{name: "PROXY v2 over TLS", addr: &e.ppTLS, preface: proxyHeader(t, 2, "203.0.113.9:4711", "192.0.2.1:443"), tls: true,
			want: want("203.0.113.9", "app.test", "https", "for=203.0.113.9;host=app.test;proto=https")},
		{name: "direct client on the PROXY listener", addr: &e.pp, source: untrustedSource, want: untrusted},
		{name: "PROXY v1 from an untrusted peer", addr: &e.pp, source: untrustedSource, preface: proxyHeader(t, 1, "203.0.113.9:4711", "192.0.2.1:80")},
		{name: "PROXY v2 from an untrusted peer over TLS", addr: &e.ppTLS, source: untrustedSource, preface: proxyHeader(t, 2, "203.0.113.9:4711", "192.0.2.1:443"), tls: true},
		{name: "trusted proxy without a PROXY header", addr: &e.pp},
		{name: "proxy untrusted by a reload", addr: &e.plain, header: forged, reloadUntrusts: true,
			want: want("127.0.0.1", "app.test", "http", "for=127.0.0.1;host=app.test;proto=http")},
	} {
		paths := netHTTPOnly
		if tc.addr == &e.plain {
			paths = edgePaths
		}
		for _, p := range paths {
			t.Run(p.name+" "+tc.name, func(t *testing.T) {
				if tc.reloadUntrusts {
					e.apply(t)
					t.Cleanup(func() { e.apply(t, "127.0.0.1/32") })
				}
				code := e.sendVia(t, p, *tc.addr, tc.source, tc.preface, tc.tls, tc.header)
				if tc.want == nil {
					if code != 0 {
						t.Fatalf("answered %d, want the connection closed unanswered", code)
					}
					select {
					case got := <-e.got:
						t.Fatalf("the tenant got a request %q", got)
					default:
					}
					return
				}
				if code != http.StatusOK {
					t.Fatalf("answered %d, want 200", code)
				}
				if got := <-e.got; !slices.Equal(got, tc.want) {
					t.Errorf("the tenant got\n  %q\nwant\n  %q", got, tc.want)
				}
			})
		}
	}
}
