package main

// Behind another proxy, end to end (docs/tls.md, "Behind a load balancer"): a real HAProxy (Debian's
// haproxy) in front of a real `activator serve`, reached by clients on addresses of their own. Every
// address is on 127.0.0.0/8, each party's its own: the client dials from one, HAProxy connects to the
// activator from another (`source`), which trusted_proxies names exactly. The tenant is this test
// binary re-executed as a recorder that answers each request with the forwarding fields it got.

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/testenv"
	"github.com/activator/activator/internal/tlsedge/tlstest"
)

// headersTenantEnv makes this test binary the recorder tenant (forwardedTenant) instead of running
// its tests. It is checked in init, before TestMain makes a child with demoapp.ChildEnv the demo app:
// a recorder route is an appRoute, which sets that too.
const headersTenantEnv = "ACTIVATOR_TEST_HEADERS_TENANT"

func init() {
	if os.Getenv(headersTenantEnv) == "1" {
		os.Exit(forwardedTenant())
	}
}

// forwarded is what the recorder tenant answers: the forwarding fields of the request, line by line.
type forwarded struct {
	For   []string `json:"x_forwarded_for"`
	Proto []string `json:"x_forwarded_proto"`
	Host  []string `json:"x_forwarded_host"`
	Fwd   []string `json:"forwarded"`
}

// forwardedTenant serves the recorder on $HOST:$PORT (exec's listen: env) until it is killed:
// /healthz answers ok, every other path the request's forwarding fields as JSON.
func forwardedTenant() int {
	ln, err := net.Listen("tcp", net.JoinHostPort(os.Getenv("HOST"), os.Getenv("PORT")))
	if err != nil {
		fmt.Fprintln(os.Stderr, "recorder:", err)
		return 1
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h := r.Header
		_ = json.NewEncoder(w).Encode(forwarded{
			For: h.Values("X-Forwarded-For"), Proto: h.Values("X-Forwarded-Proto"),
			Host: h.Values("X-Forwarded-Host"), Fwd: h.Values("Forwarded"),
		})
	})
	fmt.Fprintln(os.Stderr, "recorder:", http.Serve(ln, mux))
	return 1
}

// recorderRoute is the route of the recorder tenant, for the host proxied.test.
var recorderRoute = appRoute{Name: "proxied", Env: map[string]string{headersTenantEnv: "1"}}

// loopbackIP is an address of 127.0.0.0/8 of the test's own (see freeLoopbackAddr).
func loopbackIP(t *testing.T) string {
	t.Helper()
	ip, _, _ := net.SplitHostPort(freeLoopbackAddr(t))
	return ip
}

// listenLoopback binds a free port on a loopback address of the test's own, for HAProxy to inherit.
func listenLoopback(t *testing.T) *net.TCPListener {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(loopbackIP(t), "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.(*net.TCPListener)
}

// haproxyBin is the path of haproxy; the test is skipped (or failed, under
// ACTIVATOR_INTEGRATION=required) without it.
func haproxyBin(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		testenv.Missing(t, "haproxy is not installed (apt-get install haproxy): %v", err)
	}
	return bin
}

// startHAProxy runs haproxy (bin) in the foreground on config, in which the frontends bind fd@3, fd@4, … :
// lns, inherited in that order. Bound before HAProxy starts, they take connections at once (queued
// until HAProxy accepts), so nothing waits for it to be ready. HAProxy is killed at cleanup; its
// output is logged when the test failed.
func startHAProxy(t *testing.T, bin, config string, lns ...*net.TCPListener) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	config = "defaults\n    timeout connect 30s\n    timeout client 30s\n    timeout server 30s\n" + config
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-db", "-f", path)
	out := &testenv.SyncBuffer{} // dashboard_test.go
	cmd.Stdout, cmd.Stderr = out, out
	for _, ln := range lns {
		f, err := ln.File() // a duplicate: the child's from here on
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		cmd.ExtraFiles = append(cmd.ExtraFiles, f)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("haproxy: %v", err)
	}
	for _, ln := range lns {
		ln.Close() // HAProxy's now: a connection to it fails if HAProxy does
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("haproxy config:\n%s\nhaproxy output:\n%s", config, out.String())
		}
	})
}

// clientFrom is an HTTP client on its own loopback address, ip, that dials addr whatever the URL says (a
// frontend of HAProxy's, or the activator itself), trusting ca over HTTPS (nil: plain HTTP only),
// where it speaks HTTP/2 when the server offers it.
func clientFrom(t *testing.T, ip, addr string, ca *tlstest.CA) *http.Client {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetHTTP2(true)
	tr := &http.Transport{
		Protocols: &p,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
			return d.DialContext(ctx, network, addr)
		},
	}
	if ca != nil {
		tr.TLSClientConfig = &tls.Config{RootCAs: ca.Pool()}
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: patience}
}

// askRecorder sends a request for url with the header forged (nil for none) and returns what the
// recorder tenant was told. A GET takes the upstream client's fast path, a POST with a body its
// ReverseProxy: both must tell the tenant the same.
func askRecorder(t *testing.T, c *http.Client, method, url string, forged http.Header) forwarded {
	t.Helper()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader("a body")
	}
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range forged {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var f forwarded
	if err := json.Unmarshal(b, &f); resp.StatusCode != http.StatusOK || err != nil {
		t.Fatalf("%s %s: %d %q, want the recorder's 200", method, url, resp.StatusCode, b)
	}
	return f
}

// wantFields checks what the tenant was told against want, field by field.
func wantFields(t *testing.T, what string, got, want forwarded) {
	t.Helper()
	for _, f := range []struct {
		name      string
		got, want []string
	}{
		{"X-Forwarded-For", got.For, want.For}, {"X-Forwarded-Proto", got.Proto, want.Proto},
		{"X-Forwarded-Host", got.Host, want.Host}, {"Forwarded", got.Fwd, want.Fwd},
	} {
		if !slices.Equal(f.got, f.want) {
			t.Errorf("%s: the tenant got %s %q, want %q", what, f.name, f.got, f.want)
		}
	}
}

// edgeOwn is what the tenant is told of a request the edge trusts no field of: the peer (the client,
// directly or as a PROXY header names it), the Host and the scheme of the edge's listener.
func edgeOwn(peer, scheme string) forwarded {
	return forwarded{
		For: []string{peer}, Proto: []string{scheme}, Host: []string{recorderRoute.host()},
		Fwd: []string{fmt.Sprintf("for=%s;host=%s;proto=%s", peer, recorderRoute.host(), scheme)},
	}
}

// forgedFields are what a client claims in the hope of being believed.
var forgedFields = http.Header{
	"X-Forwarded-For":   {"127.66.66.66"},
	"X-Forwarded-Proto": {"https"},
	"X-Forwarded-Host":  {"forged.test"},
	"Forwarded":         {"for=127.66.66.66;proto=https"},
}

// dialOpening dials addr from ip and sends opening.
func dialOpening(t *testing.T, what, ip, addr string, opening []byte) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: patience}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(patience))
	if _, err := c.Write(opening); err != nil {
		t.Fatalf("%s: write: %v", what, err)
	}
	return c
}

// refused checks that the listener at addr, dialed from ip, closes the connection that opens with
// opening unanswered: not a byte comes back. What opening holds after a PROXY header (a request)
// would have been answered had the header been taken.
func refused(t *testing.T, what, ip, addr string, opening []byte) {
	t.Helper()
	b := make([]byte, 512)
	n, err := dialOpening(t, what, ip, addr, opening).Read(b)
	var ne net.Error
	if n > 0 || errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("%s: the edge answered %q (%v), want the connection closed unanswered", what, b[:n], err)
	}
}

// refusedTLS checks that the TLS listener at addr, dialed from ip, closes the connection that opens
// with opening: the TLS handshake that follows fails, for a name it has a certificate for.
func refusedTLS(t *testing.T, what, ip, addr string, opening []byte) {
	t.Helper()
	c := tls.Client(dialOpening(t, what, ip, addr, opening), &tls.Config{ServerName: recorderRoute.host(), InsecureSkipVerify: true})
	if err := c.Handshake(); err == nil {
		t.Errorf("%s: the TLS handshake after it succeeded, want the connection closed", what)
	}
}

func tcpAddr(addr string) *net.TCPAddr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(addr)) }

// proxyV2 is a PROXY protocol v2 header for TCP over IPv4 from src to dst.
func proxyV2(src, dst *net.TCPAddr) []byte {
	b := []byte("\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c")
	b = append(b, src.IP.To4()...)
	b = append(b, dst.IP.To4()...)
	return append(b, byte(src.Port>>8), byte(src.Port), byte(dst.Port>>8), byte(dst.Port))
}

// TestHAProxyPROXYProtocol: HAProxy in mode tcp passes TLS through to listen_tls with a v2 PROXY
// header, and plain HTTP to listen with a v1 one, from its own address, which alone is trusted:
//   - a client's requests through either (HTTP/2 over TLS, HTTP/1.1 in plain; a GET and a POST, the
//     upstream client's two paths) arrive at the tenant from the client's own address, with the
//     scheme of the activator's listener (https through TLS); what the client forged in them is
//     replaced, since the PROXY header makes it a direct client;
//   - a client connecting directly from an untrusted address with a forged PROXY header, v1 on the
//     plain listener or v2 on the TLS one, is closed unanswered, and wakes nothing; so is HAProxy's
//     address without a header;
//   - a direct plain client (no header) is served, its forged X-Forwarded-For replaced.
func TestHAProxyPROXYProtocol(t *testing.T) {
	t.Parallel()
	bin := haproxyBin(t)
	ca := tlstest.NewCA(t)
	files := ca.Write(t, t.TempDir(), "proxied", tlstest.Leaf{Label: "P", Names: []string{recorderRoute.host()}})
	plain, tlsAddr := freeLoopbackAddr(t), freeLoopbackAddr(t)
	proxyIP, clientIP := loopbackIP(t), loopbackIP(t)
	extra := fmt.Sprintf("trusted_proxies: [%s]\nproxy_protocol: {listen: true, listen_tls: true}\n", proxyIP)
	s := startServedAt(t, plain, freeLoopbackAddr(t), tlsTop(tlsAddr, []registry.CertFile{files}, extra)+configYAML(t, recorderRoute))

	tlsIn, plainIn := listenLoopback(t), listenLoopback(t)
	startHAProxy(t, bin, fmt.Sprintf(`
frontend tls_in
    mode tcp
    bind fd@3
    default_backend activator_tls
backend activator_tls
    mode tcp
    server edge %s send-proxy-v2 source %s
frontend plain_in
    mode tcp
    bind fd@4
    default_backend activator_plain
backend activator_plain
    mode tcp
    server edge %s send-proxy source %s
`, tlsAddr, proxyIP, plain, proxyIP), tlsIn, plainIn)

	t.Run("forged PROXY headers", func(t *testing.T) {
		req := "GET / HTTP/1.1\r\nHost: " + recorderRoute.host() + "\r\n\r\n"
		claimed := &net.TCPAddr{IP: net.ParseIP("127.66.66.66"), Port: 40000}
		v1 := fmt.Appendf(nil, "PROXY TCP4 %s %s %d %d\r\n%s", claimed.IP, tcpAddr(plain).IP, claimed.Port, tcpAddr(plain).Port, req)
		refused(t, "a v1 header from an untrusted client", clientIP, plain, v1)
		refusedTLS(t, "a v2 header from an untrusted client", clientIP, tlsAddr, proxyV2(claimed, tcpAddr(tlsAddr)))
		refused(t, "the trusted proxy's address without a header", proxyIP, plain, []byte(req))
		if st := s.status(recorderRoute.Name); st.State != "asleep" || len(s.events(recorderRoute.Name)) != 0 {
			t.Errorf("after the refused connections: %s with %d events, want asleep and untouched", st.State, len(s.events(recorderRoute.Name)))
		}
	})

	t.Run("through HAProxy", func(t *testing.T) {
		overTLS := clientFrom(t, clientIP, tlsIn.Addr().String(), ca) // HTTP/2, end to end
		plainHTTP := clientFrom(t, clientIP, plainIn.Addr().String(), ca)
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			got := askRecorder(t, overTLS, method, "https://"+recorderRoute.host()+"/", forgedFields)
			wantFields(t, method+" over TLS passed through with send-proxy-v2", got, edgeOwn(clientIP, "https"))
			got = askRecorder(t, plainHTTP, method, "http://"+recorderRoute.host()+"/", forgedFields)
			wantFields(t, method+" over plain HTTP with send-proxy", got, edgeOwn(clientIP, "http"))
		}
	})

	t.Run("a direct client", func(t *testing.T) {
		got := askRecorder(t, clientFrom(t, clientIP, plain, ca), http.MethodGet, "http://"+recorderRoute.host()+"/", forgedFields)
		wantFields(t, "a direct plain client forging fields", got, edgeOwn(clientIP, "http"))
	})
}

// TestHAProxyForwardFor: HAProxy in mode http terminates TLS and forwards plain HTTP to listen with
// `option forwardfor` and X-Forwarded-Proto: https, from its own address, which alone is trusted. The
// tenant gets the client's address with HAProxy's appended, the scheme HAProxy set, and a Forwarded
// that says the same. A client reaching the listener directly, forging every field, has each
// replaced by the edge's own.
func TestHAProxyForwardFor(t *testing.T) {
	t.Parallel()
	bin := haproxyBin(t)
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	certPEM, keyPEM := ca.Issue(t, tlstest.Leaf{Label: "H", Names: []string{recorderRoute.host()}})
	pem := filepath.Join(dir, "haproxy.pem") // HAProxy's crt: the certificate and its key in one file
	tlstest.WriteFile(t, pem, append(certPEM, keyPEM...))
	plain := freeLoopbackAddr(t)
	proxyIP, clientIP := loopbackIP(t), loopbackIP(t)
	s := startServedAt(t, plain, freeLoopbackAddr(t), fmt.Sprintf("trusted_proxies: [%s]\n", proxyIP)+configYAML(t, recorderRoute))

	in := listenLoopback(t)
	startHAProxy(t, bin, fmt.Sprintf(`
frontend https_in
    mode http
    bind fd@3 ssl crt %s
    option forwardfor
    http-request set-header X-Forwarded-Proto https
    default_backend activator
backend activator
    mode http
    server edge %s source %s
`, pem, plain, proxyIP), in)

	viaProxy := clientFrom(t, clientIP, in.Addr().String(), ca)
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		got := askRecorder(t, viaProxy, method, "https://"+recorderRoute.host()+"/", nil)
		wantFields(t, method+" through HAProxy", got, forwarded{
			For:   []string{clientIP + ", " + proxyIP},
			Proto: []string{"https"},
			Host:  []string{recorderRoute.host()},
			Fwd:   []string{fmt.Sprintf("for=%s;host=%s;proto=https, for=%s", clientIP, recorderRoute.host(), proxyIP)},
		})
	}

	for _, method := range []string{http.MethodGet, http.MethodPost} {
		got := askRecorder(t, clientFrom(t, clientIP, plain, ca), method, "http://"+recorderRoute.host()+"/", forgedFields)
		wantFields(t, method+" from a direct client forging fields", got, edgeOwn(clientIP, "http"))
	}
	s.wantOneRequestWake(t, recorderRoute.Name)
}

// TestReloadTurnsProxyProtocolOn: proxy_protocol follows reloads, for the connections accepted after
// each. Off, the trusted proxy's connection without a header is served with the proxy's address;
// turned on by a reload, the next one without a header is closed unanswered and one with a header is
// served as the client it names, while a kept-alive connection accepted before goes on being served
// as it was; turned off again, the proxy is served without a header once more.
func TestReloadTurnsProxyProtocolOn(t *testing.T) {
	t.Parallel()
	proxyIP, clientIP := loopbackIP(t), loopbackIP(t)
	trusted := fmt.Sprintf("trusted_proxies: [%s]\n", proxyIP)
	routes := configYAML(t, recorderRoute)
	s := startServed(t, trusted+routes)
	req := "GET / HTTP/1.1\r\nHost: " + recorderRoute.host() + "\r\n\r\n"

	direct := func(what string) {
		t.Helper()
		c := clientFrom(t, proxyIP, s.edge, nil)
		wantFields(t, what, askRecorder(t, c, http.MethodGet, "http://"+recorderRoute.host()+"/", nil), edgeOwn(proxyIP, "http"))
	}
	direct("off: the trusted proxy without a header")
	kept := dialOpening(t, "a kept-alive connection", proxyIP, s.edge, []byte(req))
	keptR := bufio.NewReader(kept)
	answered := func(what string) {
		t.Helper()
		resp, err := http.ReadResponse(keptR, nil)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d, want 200", what, resp.StatusCode)
		}
	}
	answered("off: the kept-alive connection's first request")

	s.rewrite(trusted+"proxy_protocol: {listen: true}\n"+routes, 1)
	refused(t, "on: the trusted proxy without a header", proxyIP, s.edge, []byte(req))
	viaHeader := &http.Client{Timeout: patience, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(proxyIP)}}
			c, err := d.DialContext(ctx, network, s.edge)
			if err != nil {
				return nil, err
			}
			local, edge := c.LocalAddr().(*net.TCPAddr), c.RemoteAddr().(*net.TCPAddr)
			_, err = fmt.Fprintf(c, "PROXY TCP4 %s %s %d %d\r\n", clientIP, edge.IP, local.Port, edge.Port)
			return c, err
		},
	}}
	t.Cleanup(viaHeader.CloseIdleConnections)
	wantFields(t, "on: a request behind a v1 header", askRecorder(t, viaHeader, http.MethodGet, "http://"+recorderRoute.host()+"/", nil), edgeOwn(clientIP, "http"))
	if _, err := io.WriteString(kept, req); err != nil {
		t.Fatal(err)
	}
	answered("on: the connection accepted while off, its next request")

	s.rewrite(trusted+routes, 2)
	direct("off again: the trusted proxy without a header")
}
