package activator

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tlsedge/tlstest"
)

// handshaking is a TLS listener that returns its connections with the handshake done, as
// tlsedge.Listener does (tls.NewListener's Accept leaves it for the first read).
type handshaking struct{ net.Listener }

func (l handshaking) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := c.(*tls.Conn)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return l.Accept()
	}
	return tc, nil
}

// tlsEdge serves h on a loopback TLS listener inside Listener, with ConnContext, as cmd/activator
// serves listen_tls; it returns the address and a client config trusting its certificate for app.test.
func tlsEdge(t *testing.T, h http.Handler) (string, *tls.Config) {
	t.Helper()
	ca := tlstest.NewCA(t)
	certPEM, keyPEM := ca.Issue(t, tlstest.Leaf{Label: "edge", Names: []string{"app.test"}})
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := Listener(handshaking{tls.NewListener(raw, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}})}, registry.DefaultSendTimeout)
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetHTTP2(true)
	p.SetUnencryptedHTTP2(true) // as the edge's: h2c on its plain listener
	srv := &http.Server{Handler: h, ConnContext: ConnContext, Protocols: &p}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return raw.Addr().String(), &tls.Config{RootCAs: ca.Pool(), ServerName: "app.test"}
}

// TestListenerOverTLS: behind Listener, an HTTP/1.1 connection over TLS is recorded (its requests'
// framing judged as plain HTTP/1's) and WithTLS gives its requests r.TLS, which net/http no longer
// sets; an HTTP/2 connection is left as net/http needs it, and its requests have r.TLS from net/http.
// Without WithTLS, overTLS still knows an HTTP/1.1 request came over TLS.
func TestListenerOverTLS(t *testing.T) {
	type seen struct {
		proto             string
		tls, over, record bool
	}
	var last atomic.Pointer[seen]
	record := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, rec := r.Context().Value(framingKey{}).(*framingConn)
		last.Store(&seen{proto: r.Proto, tls: r.TLS != nil, over: overTLS(r), record: rec})
		io.WriteString(w, "ok")
	})
	for _, tc := range []struct {
		name string
		with bool // the handler is behind WithTLS
		h2   bool
		want seen
	}{
		{"HTTP/1.1 with WithTLS", true, false, seen{proto: "HTTP/1.1", tls: true, over: true, record: true}},
		{"HTTP/1.1 without", false, false, seen{proto: "HTTP/1.1", tls: false, over: true, record: true}},
		{"HTTP/2", true, true, seen{proto: "HTTP/2.0", tls: true, over: true, record: false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h http.Handler = record
			if tc.with {
				h = WithTLS(h)
			}
			addr, cfg := tlsEdge(t, h)
			var p http.Protocols
			p.SetHTTP1(!tc.h2)
			p.SetHTTP2(tc.h2)
			c := &http.Client{Timeout: patience, Transport: &http.Transport{TLSClientConfig: cfg, Protocols: &p}}
			defer c.CloseIdleConnections()
			resp, err := c.Get("https://" + addr + "/")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != "ok" {
				t.Fatalf("answer %d %q", resp.StatusCode, b)
			}
			if got := *last.Load(); got != tc.want {
				t.Errorf("the handler saw %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestNotParkedOverTLS: a request held on an HTTP/1.1 connection over TLS holds in net/http, where
// every request would park on plain HTTP/1 (parkRig), with and without WithTLS in front: a *tls.Conn
// handed to the resume server as a plain one would lose r.TLS. It is answered once the wake is done.
func TestNotParkedOverTLS(t *testing.T) {
	for _, with := range []bool{true, false} {
		t.Run(map[bool]string{true: "WithTLS", false: "without"}[with], func(t *testing.T) {
			var got atomic.Int64
			b := &fakeBackend{wakeGate: make(chan struct{})}
			g := parkRig(t, b, &got, false, nil)
			var h http.Handler = g.s
			if with {
				h = WithTLS(h)
			}
			addr, cfg := tlsEdge(t, h)
			cfg.NextProtos = []string{"http/1.1"}
			c, err := tls.Dial("tcp", addr, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(patience))
			if err := send(c, "GET /p HTTP/1.1\nHost: app.test", nil); err != nil {
				t.Fatal(err)
			}
			g.waitHeld(t, 1)
			g.waitParked(t, 0)
			close(b.wakeGate)
			rep, err := answer(c)
			if err != nil || rep.code != http.StatusOK || rep.body != echoed("GET", "/p", nil) {
				t.Fatalf("answer: %v %d %q", err, rep.code, rep.body)
			}
			if got.Load() != 1 {
				t.Errorf("the tenant got %d requests, want 1", got.Load())
			}
		})
	}
}

// TestPrefaceOverTLS: a TLS connection behind Listener that did not negotiate h2 and starts with
// HTTP/2's preface gets net/http's 400 for a request it cannot read, and is closed, as on a *tls.Conn;
// it is not served as HTTP/2 (net/http would serve it as prior-knowledge h2c). An HTTP/1 request that
// starts like it, byte by byte, is served.
func TestPrefaceOverTLS(t *testing.T) {
	addr, cfg := tlsEdge(t, WithTLS(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Method)
	})))
	cfg.NextProtos = []string{"http/1.1"}
	talk := func(t *testing.T, chunks ...string) string {
		c, err := tls.Dial("tcp", addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(patience))
		for _, s := range chunks {
			if _, err := io.WriteString(c, s); err != nil {
				t.Fatal(err)
			}
		}
		got, _ := io.ReadAll(c)
		return string(got)
	}
	if got := talk(t, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "\x00\x00\x00\x04\x00\x00\x00\x00\x00"); !strings.HasPrefix(got, "HTTP/1.1 400 ") {
		t.Errorf("HTTP/2's preface over TLS with ALPN http/1.1: got %q, want HTTP/1.1 400", got)
	}
	if got := talk(t, "P", "RI * HT", "TP/2.0\r\n\r\nSM\r\n\r\n"); !strings.HasPrefix(got, "HTTP/1.1 400 ") {
		t.Errorf("the preface in pieces: got %q, want HTTP/1.1 400", got)
	}
	got := talk(t, "P", "R", "OPFIND / HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
	if !strings.HasPrefix(got, "HTTP/1.1 200 ") || !strings.HasSuffix(got, "PROPFIND") {
		t.Errorf("PROPFIND in pieces: got %q, want 200 PROPFIND", got)
	}
}

func TestFramingConnHead(t *testing.T) {
	for _, tc := range []struct {
		chunks []string
		want   []bool
	}{
		{[]string{"PRI * HTTP/2.0\r\n"}, []bool{false}},
		{[]string{"PRI * HTTP/2.", "0", "\r\n"}, []bool{true, false, false}},
		{[]string{"PRI * HTTP/2.0"}, []bool{false}},
		{[]string{"PRI * HTTP/1.1\r\n", "PRI * HTTP/2.0"}, []bool{true, true}},
		{[]string{"GET / HTTP/1.1\r\n"}, []bool{true}},
		{[]string{"P", "R", "I", " * HTTP/2.0"}, []bool{true, true, true, false}},
	} {
		c := &framingConn{tls: &tls.ConnectionState{}}
		for i, chunk := range tc.chunks {
			if got := c.prefaced < 0 || c.headLocked([]byte(chunk)); got != tc.want[i] {
				t.Errorf("%q: after chunk %d, %v, want %v", tc.chunks, i, got, tc.want[i])
			}
		}
	}
}
