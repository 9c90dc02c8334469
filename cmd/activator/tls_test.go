package main

// The TLS edge end to end (docs/tls.md): a real `activator serve` with listen_tls and certificates from
// files made by a test CA, reached by real HTTPS clients.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tlsedge"
	"github.com/activator/activator/internal/tlsedge/tlstest"
	"github.com/coder/websocket"
	"github.com/fsnotify/fsnotify"
)

// tlsTop is the top of a config with listen_tls at addr serving files, and the extra top-level YAML.
func tlsTop(addr string, files []registry.CertFile, extra string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "listen_tls: %q\n", addr)
	b.WriteString("tls:\n  certificates:\n")
	for _, f := range files {
		fmt.Fprintf(&b, "    - {cert_file: %q, key_file: %q}\n", f.CertFile, f.KeyFile)
	}
	return b.String() + extra
}

// httpsClient is a client trusting ca that dials addr whatever the URL's host, which is the SNI; h2
// offers HTTP/2 as well as HTTP/1.1. dials, when set, receives once for each connection made. Its idle
// connections are closed at cleanup.
func httpsClient(t *testing.T, ca *tlstest.CA, addr string, h2 bool, dials chan<- struct{}) *http.Client {
	return ca.Client(t, addr, h2, dials, patience)
}

// httpsAnswer is one HTTPS answer, read to its end.
type httpsAnswer struct {
	code  int
	proto string
	body  string
	label string // the common name of the certificate the server presented
	err   error
}

func httpsDo(c *http.Client, method, url string, body []byte) httpsAnswer {
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		return httpsAnswer{err: err}
	}
	resp, err := c.Do(req)
	if err != nil {
		return httpsAnswer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return httpsAnswer{code: resp.StatusCode, proto: resp.Proto, body: string(b), label: resp.TLS.PeerCertificates[0].Subject.CommonName, err: err}
}

// presented is the label of the certificate the TLS listener at addr presents to a hello for sni ("" for
// none), the chain not verified: which one it is, is the question.
func presented(t testing.TB, addr, sni string) string {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
	if err != nil {
		t.Fatalf("handshake for %q: %v", sni, err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName
}

// waitLogged waits until the activator has logged msg at least n times, and returns those records.
func (s *served) waitLogged(msg string, n int) []map[string]any {
	s.t.Helper()
	var recs []map[string]any
	s.until(func() bool { recs = s.logs.matching(msg); return len(recs) >= n },
		func() string { return fmt.Sprintf("logging %q %d times", msg, n) },
		func() string {
			return fmt.Sprintf("%q logged %d times within %v, want %d", msg, len(s.logs.matching(msg)), patience, n)
		})
	return recs
}

// until waits until done reports true, asking again each time the activator logs a record; it fails
// the test, with what (the awaited event) or late (how it stands), when the activator exits first or
// patience runs out.
func (s *served) until(done func() bool, what, late func() string) {
	s.t.Helper()
	deadline := time.NewTimer(patience)
	defer deadline.Stop()
	for {
		s.logs.mu.Lock()
		changed := s.logs.changed
		s.logs.mu.Unlock()
		if done() {
			return
		}
		select {
		case <-changed:
		case <-s.exited:
			s.t.Fatalf("the activator exited before %s", what())
		case <-deadline.C:
			s.t.Fatal(late())
		}
	}
}

// TestTLSEdge: over HTTPS, SNI chooses between two certificate files (exact before wildcard, the first
// for a hello without a name either carries); HTTP/2 is negotiated by ALPN, and HTTP/1.1 serves too; a
// request held for a sleeping tenant is woken and answered, its body intact; the plain listener
// redirects the hosts served over TLS with 308, path and query kept, and serves the others as before.
func TestTLSEdge(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	a := ca.Write(t, dir, "a", tlstest.Leaf{Label: "A", Names: []string{"tlsapp.test", "*.wild.test"}})
	b := ca.Write(t, dir, "b", tlstest.Leaf{Label: "B", Names: []string{"b.test", "exact.wild.test"}})
	tlsAddr := freeLoopbackAddr(t)
	app := appRoute{Name: "tlsapp"}
	s := startServed(t, tlsTop(tlsAddr, []registry.CertFile{a, b}, "redirect_http: true\n")+configYAML(t, app))

	t.Run("SNI", func(t *testing.T) {
		for sni, want := range map[string]string{
			"tlsapp.test": "A", "b.test": "B", "x.wild.test": "A", "exact.wild.test": "B",
			"nobody.test": "A", "": "A",
		} {
			if got := presented(t, tlsAddr, sni); got != want {
				t.Errorf("hello for %q: certificate %s, want %s", sni, got, want)
			}
		}
	})

	t.Run("a held request, over HTTP/2", func(t *testing.T) {
		sent := make([]byte, 256<<10)
		_, _ = rand.Read(sent)
		got := httpsDo(httpsClient(t, ca, tlsAddr, true, nil), http.MethodPost, "https://tlsapp.test/echo", sent)
		if got.err != nil || got.code != http.StatusOK || got.proto != "HTTP/2.0" || got.label != "A" {
			t.Fatalf("POST /echo: %d %s from %s, %v; want 200 over HTTP/2.0 from A", got.code, got.proto, got.label, got.err)
		}
		if got.body != string(sent) {
			t.Errorf("the echo returned %d bytes that differ from the %d sent", len(got.body), len(sent))
		}
		if n := len(s.logs.spawns(app.Name)); n != 1 {
			t.Errorf("%d spawns, want the one wake", n)
		}
	})

	t.Run("HTTP/1.1", func(t *testing.T) {
		got := httpsDo(httpsClient(t, ca, tlsAddr, false, nil), http.MethodGet, "https://tlsapp.test/", nil)
		if got.err != nil || got.code != http.StatusOK || got.proto != "HTTP/1.1" || got.body != "hello from demoapp\n" {
			t.Errorf("GET /: %d %s %q, %v; want 200 over HTTP/1.1", got.code, got.proto, got.body, got.err)
		}
	})

	t.Run("redirect_http", func(t *testing.T) { checkRedirects(t, s.edge, tlsAddr) })
}

// checkRedirects checks TestTLSEdge's redirects on the plain listener at edge.
func checkRedirects(t *testing.T, edge, tlsAddr string) {
	_, port, _ := net.SplitHostPort(tlsAddr)
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tt := range []struct {
		host, target string
		code         int
		location     string
	}{
		{"tlsapp.test", "/p/a%20b?q=1&r=x", http.StatusPermanentRedirect, "https://tlsapp.test:" + port + "/p/a%20b?q=1&r=x"},
		{"x.wild.test", "/", http.StatusPermanentRedirect, "https://x.wild.test:" + port + "/"},
		{"nobody.test", "/p", http.StatusNotFound, ""}, // no certificate carries it: routed, as before
	} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+edge+tt.target, nil)
		req.Host = tt.host
		resp, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.code || resp.Header.Get("Location") != tt.location {
			t.Errorf("http://%s%s: %d to %q, want %d to %q", tt.host, tt.target, resp.StatusCode, resp.Header.Get("Location"), tt.code, tt.location)
		}
	}
}

// TestTLSRenewal: a certificate file replaced on disk is put in force by the file watch alone, and
// again by SIGHUP; new handshakes get the new certificate, while a connection made before keeps its own
// and goes on being served.
func TestTLSRenewal(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	leaf := func(label string) tlstest.Leaf { return tlstest.Leaf{Label: label, Names: []string{"renew.test"}} }
	files := ca.Write(t, dir, "renew", leaf("v1"))
	tlsAddr := freeLoopbackAddr(t)
	app := appRoute{Name: "renew"}
	s := startServed(t, tlsTop(tlsAddr, []registry.CertFile{files}, "")+configYAML(t, app))

	dials := make(chan struct{}, 10)
	old := httpsClient(t, ca, tlsAddr, true, dials)
	if got := httpsDo(old, http.MethodGet, "https://renew.test/", nil); got.err != nil || got.code != http.StatusOK || got.label != "v1" {
		t.Fatalf("before the renewal: %d from %s, %v", got.code, got.label, got.err)
	}
	for i, step := range []struct {
		label string
		hup   bool
	}{{"v2", false}, {"v3", true}} {
		ca.Write(t, dir, "renew", leaf(step.label)) // a new key too: written first, then the certificate
		if step.hup {
			if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
		}
		recs := s.waitLogged("config reloaded", i+1)
		if !step.hup && recs[i]["trigger"] != "file change" {
			t.Errorf("reload %d was triggered by %v, want the file watch", i+1, recs[i]["trigger"])
		}
		if got := presented(t, tlsAddr, "renew.test"); got != step.label {
			t.Errorf("after renewal %d, a new handshake got %s, want %s", i+1, got, step.label)
		}
		if got := httpsDo(old, http.MethodGet, "https://renew.test/", nil); got.err != nil || got.code != http.StatusOK || got.label != "v1" {
			t.Errorf("after renewal %d, the old connection: %d from %s, %v; want 200 from v1", i+1, got.code, got.label, got.err)
		}
	}
	if n := len(dials); n != 1 {
		t.Errorf("the old client dialed %d times, want 1: its connection must have survived the reloads", n)
	}
	if n := len(s.logs.matching("config reload failed; the old config stays in force")); n > 0 {
		t.Logf("%d reloads read a half-written pair and were refused (the old certificate stayed in force)", n)
	}
}

// TestTLSHandshakeFlood: connections that never send a hello, many more than edge.max_tls_handshakes,
// starve neither the plain listener nor requests held on established HTTPS connections; each is closed
// at edge.tls_handshake_timeout, and new HTTPS clients are served afterwards.
func TestTLSHandshakeFlood(t *testing.T) {
	t.Parallel()
	const max = 4
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	files := ca.Write(t, dir, "flood", tlstest.Leaf{Label: "F", Names: []string{"flood.test"}})
	hold := filepath.Join(dir, "hold") // the tenant starts once this is gone
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tlsAddr := freeLoopbackAddr(t)
	app := appRoute{Name: "flood", Env: map[string]string{"DEMOAPP_HOLD_FILE": hold}}
	edge := fmt.Sprintf("edge: {max_tls_handshakes: %d, tls_handshake_timeout: 500ms}\n", max)
	s := startServed(t, tlsTop(tlsAddr, []registry.CertFile{files}, edge)+configYAML(t, app))

	// Two requests held on one HTTP/2 connection, made before the flood (the second once the first is
	// held: the connection is up, and the client shares it).
	dials := make(chan struct{}, 10)
	c := httpsClient(t, ca, tlsAddr, true, dials)
	sent := []byte("the held body")
	answers := make([]httpsAnswer, 2)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = httpsDo(c, http.MethodPost, "https://flood.test/echo", sent)
		}()
		s.waitStatus(app.Name, fmt.Sprintf("holding %d requests", i+1), func(st activator.Status) bool { return st.Held == i+1 })
	}

	flood := dialStalled(t, tlsAddr, 4*max)
	// The plain listener is served meanwhile (an unknown host: the activator's own 404).
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if got := getFresh(ctx, s.edge, "nobody.test", "/"); got.err != nil || got.code != http.StatusNotFound {
		t.Errorf("the plain listener during the flood: %d, %v; want the 404 of an unknown host", got.code, got.err)
	}
	if err := os.Remove(hold); err != nil { // the tenant starts; the held requests are answered
		t.Fatal(err)
	}
	wg.Wait()
	for i, got := range answers {
		if got.err != nil || got.code != http.StatusOK || got.body != string(sent) || got.proto != "HTTP/2.0" {
			t.Errorf("held request %d: %d %s %q, %v; want 200 over HTTP/2.0 with the body sent", i, got.code, got.proto, got.body, got.err)
		}
	}
	if n := len(dials); n != 1 {
		t.Errorf("the held requests used %d connections, want the one made before the flood", n)
	}
	for _, conn := range flood {
		waitServerClosed(t, conn) // at the handshake timeout
	}
	// A new client is served. Its handshake has the same short timeout, which a very slow machine may
	// cut: it retries.
	var got httpsAnswer
	for range 3 {
		if got = httpsDo(httpsClient(t, ca, tlsAddr, false, nil), http.MethodGet, "https://flood.test/", nil); got.err == nil {
			break
		}
		t.Logf("a new client after the flood: %v", got.err)
	}
	if got.err != nil || got.code != http.StatusOK {
		t.Errorf("a new client after the flood: %d, %v", got.code, got.err)
	}
}

// dialStalled opens n TCP connections to addr that never send a byte: hellos that never come. They
// are closed at cleanup.
func dialStalled(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns[i] = c
	}
	return conns
}

// waitServerClosed waits until the server has closed c: a read returns EOF or a reset, never data.
func waitServerClosed(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(patience))
	var ne net.Error
	if n, err := c.Read(make([]byte, 1)); n > 0 || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a stalled connection: read %d bytes, %v; want it closed by the server", n, err)
	}
}

// TestTLSCheck: check and serve agree on the certificate files: what serve cannot load is a problem
// for both, each naming its key and file; a wildcard route host no file carries is warned about.
func TestTLSCheck(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	good := ca.Write(t, dir, "good", tlstest.Leaf{Label: "G", Names: []string{"chk.test"}})
	missing := registry.CertFile{CertFile: filepath.Join(dir, "missing.crt"), KeyFile: good.KeyFile}
	wild := strings.Replace(appRoute{Name: "wild"}.yaml(t), "hosts: [wild.test]", `hosts: ["*.wild.test"]`, 1)
	routes := configYAML(t, appRoute{Name: "chk"}) + wild
	const wildWarning = "route wild: *.wild.test needs a certificate from files or a DNS challenge: ACME here uses HTTP-01/TLS-ALPN-01, which cannot prove a wildcard"
	write := func(config string) string {
		path := filepath.Join(t.TempDir(), "activator.yaml")
		config = fmt.Sprintf("listen: %q\nadmin: %q\n", freeLoopbackAddr(t), freeLoopbackAddr(t)) + config
		if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}

	ok := write(tlsTop(freeLoopbackAddr(t), []registry.CertFile{good}, "") + routes)
	code, out := runMain(t, "check", "--config", ok)
	if code != 0 || !strings.Contains(out, "warning: "+wildWarning) {
		t.Errorf("check with good files: exit %d, output:\n%s\nwant 0 and the wildcard warning", code, out)
	}

	bad := write(tlsTop(freeLoopbackAddr(t), []registry.CertFile{good, missing}, "") + routes)
	wantProblem := "tls.certificates[1].cert_file: " + missing.CertFile + ": no such file"
	for _, cmd := range []string{"check", "serve"} {
		code, out := runMain(t, cmd, "--config", bad)
		if code != 1 || !strings.Contains(out, wantProblem) {
			t.Errorf("%s with a missing file: exit %d, output:\n%s\nwant 1 and %q", cmd, code, out, wantProblem)
		}
	}
}

// TestTLSHTTP1Framing: HTTP/1 over TLS is framed and told it is TLS as plain HTTP/1 is, by ALPN
// http/1.1 and by a hello without ALPN: a chunked request keeps its connection for the request
// pipelined after it, and so does an HTTP/1.0 request asking for keep-alive; a request with both
// Content-Length and Transfer-Encoding is answered with "Connection: close" and its connection closed
// (RFC 9112 §6.1); edge.max_header_bytes is exact, as on the plain listener; HTTP/2's preface without
// ALPN h2 gets 400, not HTTP/2. A WebSocket upgrades and echoes over it. The tenant is told https
// (X-Forwarded-Proto, Forwarded), and redirect_http does not send a request that came over TLS to
// https again.
func TestTLSHTTP1Framing(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	app := appRoute{Name: "tlsframing"}
	files := ca.Write(t, t.TempDir(), "f", tlstest.Leaf{Label: "F", Names: []string{app.host(), recorderRoute.host()}})
	tlsAddr := freeLoopbackAddr(t)
	startServed(t, tlsTop(tlsAddr, []registry.CertFile{files}, "redirect_http: true\n")+configYAML(t, app, recorderRoute))

	host := app.host()
	const (
		clte    = "POST /echo HTTP/1.1\r\nHost: %s\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
		chunked = "POST /echo HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
		http10  = "GET / HTTP/1.0\r\nHost: %s\r\nConnection: keep-alive\r\n\r\n"
		next    = "GET / HTTP/1.1\r\nHost: %s\r\n\r\n"
	)
	req := func(format string) string { return fmt.Sprintf(format, host) }
	for _, alpn := range [][]string{{"http/1.1"}, nil} {
		dial := func(t *testing.T) net.Conn {
			c, err := tls.Dial("tcp", tlsAddr, &tls.Config{RootCAs: ca.Pool(), ServerName: host, NextProtos: alpn})
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		t.Run(fmt.Sprintf("ALPN %q", alpn), func(t *testing.T) {
			answers, closed := pipelineOn(t, dial(t), req(chunked)+req(next), 2)
			if len(answers) != 2 || closed {
				t.Fatalf("chunked then a pipelined GET: %d answers (%+v), closed %v; want both answered on one connection", len(answers), answers, closed)
			}
			if answers[0].body != "hello" || answers[0].close || answers[1].code != http.StatusOK {
				t.Errorf("chunked, then GET: %+v", answers)
			}

			answers, closed = pipelineOn(t, dial(t), req(http10)+req(next), 2)
			if len(answers) != 2 || closed || answers[0].code != http.StatusOK || answers[1].code != http.StatusOK {
				t.Errorf("HTTP/1.0 with keep-alive, then a GET: %d answers (%+v), closed %v; want both answered 200 on one connection", len(answers), answers, closed)
			}

			answers, closed = pipelineOn(t, dial(t), req(clte)+req(next), 2)
			if len(answers) != 1 || !closed {
				t.Fatalf("CL+TE then a pipelined GET: %d answers (%+v), closed %v; want the first answered, then the connection closed", len(answers), answers, closed)
			}
			if a := answers[0]; a.code != http.StatusOK || a.body != "hello" || !a.close {
				t.Errorf("CL+TE answer: %d %q, Connection: close %v; want 200 %q with Connection: close", a.code, a.body, a.close, "hello")
			}
		})
	}

	t.Run("edge.max_header_bytes is exact", func(t *testing.T) {
		const limit = 32 << 10 // the default
		for _, size := range []int{limit, limit + 1} {
			c, err := tls.Dial("tcp", tlsAddr, &tls.Config{RootCAs: ca.Pool(), ServerName: host})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			_ = c.SetDeadline(time.Now().Add(patience))
			want := http.StatusNotFound
			if size > limit {
				want = http.StatusRequestHeaderFieldsTooLarge
			}
			if code := exchange(t, &bufConn{Conn: c, r: bufio.NewReader(c)}, headerOfSize(t, size)); code != want {
				t.Errorf("a %d-byte header over TLS, the default limit %d: %d, want %d", size, limit, code, want)
			}
		}
	})

	t.Run("HTTP/2 without ALPN h2", func(t *testing.T) {
		c, err := tls.Dial("tcp", tlsAddr, &tls.Config{RootCAs: ca.Pool(), ServerName: host, NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(patience))
		if _, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"); err != nil {
			t.Fatal(err)
		}
		if got, _ := io.ReadAll(c); !strings.HasPrefix(string(got), "HTTP/1.1 400 ") {
			t.Errorf("HTTP/2's preface after ALPN http/1.1: got %q, want HTTP/1.1 400 and the connection closed (only ALPN chooses HTTP/2 over TLS)", got)
		}
	})

	t.Run("WebSocket over HTTP/1.1", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		defer cancel()
		c, _, err := websocket.Dial(ctx, "wss://"+host+"/ws", &websocket.DialOptions{HTTPClient: httpsClient(t, ca, tlsAddr, false, nil)})
		if err != nil {
			t.Fatalf("wss dial through the edge: %v", err)
		}
		defer c.CloseNow()
		for _, msg := range []string{"hello", "again"} {
			if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
				t.Fatalf("write: %v", err)
			}
			if _, got, err := c.Read(ctx); err != nil || string(got) != msg {
				t.Fatalf("echo %q, %v; want %q", got, err, msg)
			}
		}
		if err := c.Close(websocket.StatusNormalClosure, "bye"); err != nil {
			t.Errorf("close: %v", err)
		}
	})

	t.Run("the tenant is told https", func(t *testing.T) {
		c := httpsClient(t, ca, tlsAddr, false, nil)
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			got := askRecorder(t, c, method, "https://"+recorderRoute.host()+"/", forgedFields)
			wantFields(t, method+" over HTTP/1.1 over TLS", got, edgeOwn("127.0.0.1", "https"))
		}
	})
}

// TestACMEHosts: ACME orders certificates for the config's exact hosts, less IP addresses (a hello to
// one names no server, so its certificate is never chosen, and the redirect sent plain clients to a
// handshake that failed) and less those a certificate file carries, exactly or by wildcard (the file
// wins every hello for them). Found with the real binary and pebble: both were ordered, for nothing.
func TestACMEHosts(t *testing.T) {
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	files := []registry.CertFile{
		ca.Write(t, dir, "other", tlstest.Leaf{Label: "O", Names: []string{"other.test", "*.wild.test"}}),
	}
	certs, _, err := tlsedge.LoadCerts(files, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cfg := &registry.Config{Routes: []*registry.Route{
		{Name: "a", Hosts: []string{"app.test", "127.0.0.1", "[::1]", "other.test", "x.wild.test"}},
		{Name: "b", Hosts: []string{"shop.test", "*.any.test"}},
	}}
	got := acmeHosts(cfg, certs)
	slices.Sort(got)
	if want := []string{"app.test", "shop.test"}; !slices.Equal(got, want) {
		t.Errorf("acmeHosts = %q, want %q", got, want)
	}
}

// TestTLSRenewalThroughSymlinks: certificate files served through a symlinked directory, swapped as a
// Kubernetes secret volume does (a "..data" symlink renamed over the old one), reload on the swap.
// Found with the real binary: only events on the files' own names reloaded, and the swap changes none.
func TestTLSRenewalThroughSymlinks(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	leaf := func(label string) tlstest.Leaf { return tlstest.Leaf{Label: label, Names: []string{"k8s.test"}} }
	for _, v := range []string{"v1", "v2"} {
		if err := os.Mkdir(filepath.Join(dir, v), 0o700); err != nil {
			t.Fatal(err)
		}
		ca.Write(t, filepath.Join(dir, v), "tls", leaf(v))
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink("v1", filepath.Join(dir, "..data")))
	for _, f := range []string{"tls.crt", "tls.key"} {
		must(os.Symlink(filepath.Join("..data", f), filepath.Join(dir, f)))
	}
	files := registry.CertFile{CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")}
	tlsAddr := freeLoopbackAddr(t)
	s := startServed(t, tlsTop(tlsAddr, []registry.CertFile{files}, "")+configYAML(t, appRoute{Name: "k8s"}))
	if got := presented(t, tlsAddr, "k8s.test"); got != "v1" {
		t.Fatalf("before the swap: %s", got)
	}
	must(os.Symlink("v2", filepath.Join(dir, "..data_tmp")))
	must(os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	if recs := s.waitLogged("config reloaded", 1); recs[0]["trigger"] != "file change" {
		t.Errorf("the reload was triggered by %v, want the file watch", recs[0]["trigger"])
	}
	if got := presented(t, tlsAddr, "k8s.test"); got != "v2" {
		t.Errorf("after the swap, a new handshake got %s, want v2", got)
	}
}

// TestTLSCertDirRemade: a certificate directory removed (which reloads, and fails: the certificates in
// force stay) and then made anew is watched again, with no SIGHUP: made empty and then written, moved
// in whole, and made again with its parent. Found with the real binary: once the reload of its removal
// had run, a directory made after it went unwatched until the next SIGHUP.
func TestTLSCertDirRemade(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	root := t.TempDir()
	parent := filepath.Join(root, "tls")
	dir := filepath.Join(parent, "live")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(dir, 0o700))
	leaf := func(label string) tlstest.Leaf { return tlstest.Leaf{Label: label, Names: []string{"remade.test"}} }
	files := ca.Write(t, dir, "remade", leaf("v1"))
	tlsAddr := freeLoopbackAddr(t)
	s := startServed(t, tlsTop(tlsAddr, []registry.CertFile{files}, "")+configYAML(t, appRoute{Name: "remade"}))
	if got := presented(t, tlsAddr, "remade.test"); got != "v1" {
		t.Fatalf("at start: %s", got)
	}

	failed := 0
	for _, step := range []struct {
		name, label string
		remove      string // what is removed
		remake      func(label string)
	}{
		{"made, then written", "v2", dir, func(label string) {
			must(os.Mkdir(dir, 0o700))
			ca.Write(t, dir, "remade", leaf(label))
		}},
		{"moved in whole", "v3", dir, func(label string) {
			staged := filepath.Join(root, "staged")
			must(os.Mkdir(staged, 0o700))
			ca.Write(t, staged, "remade", leaf(label))
			must(os.Rename(staged, dir))
		}},
		{"made with its parent", "v4", parent, func(label string) {
			must(os.MkdirAll(dir, 0o700))
			ca.Write(t, dir, "remade", leaf(label))
		}},
	} {
		must(os.RemoveAll(step.remove))
		// The removal's reload fails, and the certificate in force stays.
		failed = len(s.waitLogged("config reload failed; the old config stays in force", failed+1))
		if got := presented(t, tlsAddr, "remade.test"); got == step.label {
			t.Fatalf("%s: %s served before it was written", step.name, got)
		}
		step.remake(step.label)
		s.waitPresented(tlsAddr, "remade.test", step.label)
	}
	for _, r := range s.logs.matching("config reloaded") {
		if r["trigger"] != "file change" {
			t.Errorf("a reload was triggered by %v, want the file watch", r["trigger"])
		}
	}
}

// waitPresented waits until a new handshake for sni at addr gets the certificate labelled want, trying
// again each time the activator logs a record (a reload logs one).
func (s *served) waitPresented(addr, sni, want string) {
	s.t.Helper()
	var got string
	s.until(func() bool { got = presented(s.t, addr, sni); return got == want },
		func() string { return fmt.Sprintf("serving %s for %s", want, sni) },
		func() string {
			return fmt.Sprintf("a handshake for %s still got %s after %v, want %s: the change was not seen", sni, got, patience, want)
		})
}

// TestReloadLoopWatchErrors: the watcher's errors are drained (fsnotify stops delivering events while
// one waits to be read) and each reloads, since an overflow loses events that may have changed a
// certificate. Nobody read them: after an overflow, no change was ever seen again.
func TestReloadLoopWatchErrors(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error) // unbuffered, as fsnotify's: a send returns once the loop has it
	windows := make(chan chan time.Time, 4)
	reloads := make(chan string, 4)
	l := &reloadLoop{
		hup:    make(chan os.Signal),
		events: make(chan fsnotify.Event),
		errs:   errs,
		file:   "activator.yaml",
		settle: func() <-chan time.Time {
			w := make(chan time.Time, 1)
			windows <- w
			return w
		},
		reload: func(trigger string) { reloads <- trigger },
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	for i := range 2 {
		select {
		case errs <- fsnotify.ErrEventOverflow:
		case <-time.After(patience):
			t.Fatalf("error %d: not read within %v: the watch would stall", i+1, patience)
		}
		(<-windows) <- time.Time{}
		if got := <-reloads; got != "file change" {
			t.Errorf("error %d: reload triggered by %q, want file change", i+1, got)
		}
	}
}

// scrapedValue is the value of the series of name in a /metrics text body that has every one of labels
// (`key="value"`), and whether there is one.
func scrapedValue(body []byte, name string, labels ...string) (float64, bool) {
	for _, line := range strings.Split(string(body), "\n") {
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			continue
		}
		set, value, ok := strings.Cut(rest, "} ")
		if !ok || slices.ContainsFunc(labels, func(l string) bool { return !slices.Contains(strings.Split(set, ","), l) }) {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(value, &v); err != nil {
			return 0, false
		}
		return v, true
	}
	return 0, false
}

// TestTLSCertificateMetrics: the admin API's /metrics has the NotAfter of each certificate file served,
// labelled by its cert_file, and follows a renewal; hellos for other names add no series.
func TestTLSCertificateMetrics(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	notAfter := time.Now().Truncate(time.Second).Add(20 * time.Hour)
	leaf := func(label string, notAfter time.Time) tlstest.Leaf {
		return tlstest.Leaf{Label: label, Names: []string{"metrics.test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter}
	}
	files := ca.Write(t, dir, "metrics", leaf("v1", notAfter))
	tlsAddr := freeLoopbackAddr(t)
	s := startServed(t, tlsTop(tlsAddr, []registry.CertFile{files}, "")+configYAML(t, appRoute{Name: "metrics"}))
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	const expiry = "activator_tls_certificate_expiry_timestamp_seconds"
	file := fmt.Sprintf("certificate=%q", files.CertFile)

	for i := range 3 {
		presented(t, tlsAddr, fmt.Sprintf("stranger%d.test", i))
	}
	body := adminGet(t, hc, s.admin, "/metrics")
	if v, ok := scrapedValue(body, expiry, file, `source="file"`); !ok || int64(v) != notAfter.Unix() {
		t.Errorf("%s{%s}: %v (present %v), want %d", expiry, file, v, ok, notAfter.Unix())
	}
	if bytes.Contains(body, []byte("stranger")) {
		t.Errorf("a hello's server name is in /metrics:\n%s", body)
	}

	renewed := notAfter.Add(19 * time.Hour)
	ca.Write(t, dir, "metrics", leaf("v2", renewed))
	s.waitPresented(tlsAddr, "metrics.test", "v2")
	body = adminGet(t, hc, s.admin, "/metrics")
	if v, ok := scrapedValue(body, expiry, file, `source="file"`); !ok || int64(v) != renewed.Unix() {
		t.Errorf("after the renewal, %s{%s}: %v (present %v), want %d", expiry, file, v, ok, renewed.Unix())
	}
}
