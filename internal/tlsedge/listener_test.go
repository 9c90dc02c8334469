package tlsedge

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/activator/activator/internal/tlsedge/tlstest"
)

// stalled opens n TCP connections to addr that never send a byte: a flood of hellos that never come.
func stalled(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns[i] = c
		t.Cleanup(func() { c.Close() })
	}
	return conns
}

// waitClosed waits until the server has closed c: a read returns EOF or a reset, never data.
func waitClosed(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(patience))
	n, err := c.Read(make([]byte, 1))
	var ne net.Error
	if n > 0 || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection %s: read %d bytes, %v; want it closed by the server", c.LocalAddr(), n, err)
	}
}

// waitInFlight waits until ln runs n handshakes, failing the test after patience. It checks that ln
// never runs more than max meanwhile.
func waitInFlight(t *testing.T, ln *Listener, n, max int) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(patience)
	defer deadline.Stop()
	for {
		got := ln.InFlight()
		if got > max {
			t.Fatalf("%d handshakes in flight, beyond the limit of %d", got, max)
		}
		if got == n {
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("%d handshakes in flight after %v, want %d", got, patience, n)
		}
	}
}

// TestHandshakeSlots: with every slot taken by a connection that sends no hello, a real client waits in
// the accept queue, and is served as soon as one of them goes.
func TestHandshakeSlots(t *testing.T) {
	ca := tlstest.NewCA(t)
	e := New(Settings{Certs: loadCerts(t, ca, tlstest.Leaf{Label: "A", Names: []string{"a.test"}})}, Options{})
	var mu sync.Mutex
	var events []string // in order: what the test did, and what the server served
	note := func(ev string) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev)
	}
	s := startTLS(t, e, Limits{Timeout: patience, Max: 2}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		note("served")
	}))
	flood := stalled(t, s.addr(), 2)
	waitInFlight(t, s.ln, 2, 2)

	dialed := make(chan struct{}, 1)
	done := make(chan error, 1)
	real := client(t, ca, s.addr(), true, dialed)
	go func() {
		_, _, err := get(real, "https://a.test/")
		done <- err
	}()
	<-dialed // its TCP connection is in the accept queue, ahead of more stalled ones
	more := stalled(t, s.addr(), 3)
	if got := s.ln.InFlight(); got > 2 {
		t.Fatalf("%d handshakes in flight, beyond the limit of 2", got)
	}
	note("freeing a slot")
	flood[0].Close()
	if err := <-done; err != nil {
		t.Fatalf("the real client, once a slot was free: %v", err)
	}
	mu.Lock()
	got := strings.Join(events, ", ")
	mu.Unlock()
	if got != "freeing a slot, served" {
		t.Errorf("events %q, want the client served only once a slot was free", got)
	}
	for _, c := range append(flood[1:], more...) {
		c.Close()
	}
	waitInFlight(t, s.ln, 0, 2)
}

// TestHandshakeFlood: many connections that never send a hello are each closed at the handshake
// timeout, at most Max of them held at once, and real clients are served all along.
func TestHandshakeFlood(t *testing.T) {
	ca := tlstest.NewCA(t)
	e := New(Settings{Certs: loadCerts(t, ca, tlstest.Leaf{Label: "A", Names: []string{"a.test"}})}, Options{})
	const max = 4
	s := startTLS(t, e, Limits{Timeout: 100 * time.Millisecond, Max: max}, labelHandler())
	// A real client connected before the flood keeps its connection, and is served during it.
	c := client(t, ca, s.addr(), true, nil)
	if _, _, err := get(c, "https://a.test/"); err != nil {
		t.Fatal(err)
	}
	flood := stalled(t, s.addr(), 8*max)
	if body, _, err := get(c, "https://a.test/"); err != nil || body != "HTTP/2.0 a.test" {
		t.Fatalf("on the connection made before the flood: %q, %v", body, err)
	}
	for _, f := range flood {
		if got := s.ln.InFlight(); got > max {
			t.Fatalf("%d handshakes in flight, beyond the limit of %d", got, max)
		}
		waitClosed(t, f) // by the timeout: they never send anything
	}
	// A new client is served once the flood has been cleared. Its own handshake has the same short
	// timeout, so a very slow machine may cut it: it retries.
	var err error
	for range 5 {
		fresh := client(t, ca, s.addr(), false, nil)
		if _, _, err = get(fresh, "https://a.test/"); err == nil {
			break
		}
		t.Logf("a fresh client: %v", err)
	}
	if err != nil {
		t.Fatalf("a fresh client after the flood: %v", err)
	}
}

// TestListenerClose: Close aborts the handshakes under way, closing their connections, and returns once
// every one has ended.
func TestListenerClose(t *testing.T) {
	ca := tlstest.NewCA(t)
	e := New(Settings{Certs: loadCerts(t, ca, tlstest.Leaf{Label: "A", Names: []string{"a.test"}})}, Options{})
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := NewListener(raw, e.TLSConfig(), Limits{Timeout: patience, Max: 8}, testLogger())
	flood := stalled(t, ln.Addr().String(), 3)
	waitInFlight(t, ln, 3, 8)
	accepted := make(chan error, 1)
	go func() {
		_, err := ln.Accept()
		accepted <- err
	}()
	if err := ln.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := ln.InFlight(); got != 0 {
		t.Errorf("%d handshakes in flight after Close returned", got)
	}
	if err := <-accepted; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
	}
	for _, f := range flood {
		waitClosed(t, f)
	}
	if err := ln.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
}

// TestALPN: HTTP/2 is negotiated with a client that offers it, HTTP/1.1 with one that does not; both
// see the certificate for their name.
func TestALPN(t *testing.T) {
	ca := tlstest.NewCA(t)
	e := New(Settings{Certs: loadCerts(t, ca,
		tlstest.Leaf{Label: "A", Names: []string{"a.test"}},
		tlstest.Leaf{Label: "B", Names: []string{"b.test"}})}, Options{})
	s := startTLS(t, e, Limits{Timeout: patience, Max: 8}, labelHandler())
	for _, tt := range []struct {
		h2    bool
		host  string
		body  string
		label string
	}{
		{true, "a.test", "HTTP/2.0 a.test", "A"},
		{false, "a.test", "HTTP/1.1 a.test", "A"},
		{true, "b.test", "HTTP/2.0 b.test", "B"},
		{false, "b.test", "HTTP/1.1 b.test", "B"},
	} {
		body, label, err := get(client(t, ca, s.addr(), tt.h2, nil), "https://"+tt.host+"/")
		if err != nil || body != tt.body || label != tt.label {
			t.Errorf("h2 %v, %s: %q from %s (%v), want %q from %s", tt.h2, tt.host, body, label, err, tt.body, tt.label)
		}
	}
}

// TestReloadKeepsConnections: after a Reload, new handshakes get the new certificate, and a connection
// made before keeps the one it was given and goes on working.
func TestReloadKeepsConnections(t *testing.T) {
	ca := tlstest.NewCA(t)
	e := New(Settings{Certs: loadCerts(t, ca, tlstest.Leaf{Label: "v1", Names: []string{"a.test"}})}, Options{})
	s := startTLS(t, e, Limits{Timeout: patience, Max: 8}, labelHandler())
	dials := make(chan struct{}, 10)
	old := client(t, ca, s.addr(), true, dials)
	if _, label, err := get(old, "https://a.test/"); err != nil || label != "v1" {
		t.Fatalf("before the reload: %s, %v", label, err)
	}
	e.Reload(Settings{Certs: loadCerts(t, ca, tlstest.Leaf{Label: "v2", Names: []string{"a.test"}})})
	if _, label, err := get(client(t, ca, s.addr(), true, nil), "https://a.test/"); err != nil || label != "v2" {
		t.Errorf("a new connection after the reload: %s, %v; want v2", label, err)
	}
	if _, label, err := get(old, "https://a.test/"); err != nil || label != "v1" {
		t.Errorf("the old connection after the reload: %s, %v; want v1, still working", label, err)
	}
	if n := len(dials); n != 1 {
		t.Errorf("the old client dialed %d times, want 1: its connection must have survived", n)
	}
}

// TestChallengeHandshake: a TLS-ALPN-01 hello gets the source's certificate and its connection is
// closed once the handshake is done: it never reaches Accept.
func TestChallengeHandshake(t *testing.T) {
	ca := tlstest.NewCA(t)
	srcCert := loadCerts(t, ca, tlstest.Leaf{Label: "challenge", Names: []string{"acme.test"}}).Default()
	src := &fakeSource{cert: srcCert, asked: make(chan string, 1)}
	e := New(Settings{Certs: loadCerts(t, ca, tlstest.Leaf{Label: "A", Names: []string{"a.test"}})}, Options{Source: src})
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := NewListener(raw, e.TLSConfig(), Limits{Timeout: patience, Max: 8}, testLogger())
	defer ln.Close()
	accepted := make(chan net.Conn, 2)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()

	c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{ServerName: "acme.test", NextProtos: []string{ACMETLS1}, RootCAs: ca.Pool()})
	if err != nil {
		t.Fatalf("challenge handshake: %v", err)
	}
	st := c.ConnectionState()
	if st.NegotiatedProtocol != ACMETLS1 || st.PeerCertificates[0].Subject.CommonName != "challenge" {
		t.Errorf("challenge: protocol %q, certificate %s; want acme-tls/1 and the source's", st.NegotiatedProtocol, st.PeerCertificates[0].Subject.CommonName)
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("read after the challenge handshake: %v, want EOF (closed by the server)", err)
	}
	c.Close()

	normal, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{ServerName: "a.test", RootCAs: ca.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	defer normal.Close()
	got := <-accepted
	defer got.Close()
	if got.RemoteAddr().String() != normal.LocalAddr().String() {
		t.Errorf("Accept returned %s first, want the normal client %s: the challenge connection must not reach it", got.RemoteAddr(), normal.LocalAddr())
	}
	if _, ok := got.(*tls.Conn); !ok {
		t.Errorf("Accept returned a %T, want *tls.Conn (net/http needs it for HTTP/2)", got)
	}
}

// TestPlainHTTPToTLS: a plain-HTTP request on the TLS listener gets 400, as net/http's own TLS server
// answers it.
func TestPlainHTTPToTLS(t *testing.T) {
	ca := tlstest.NewCA(t)
	e := New(Settings{Certs: loadCerts(t, ca, tlstest.Leaf{Label: "A", Names: []string{"a.test"}})}, Options{})
	s := startTLS(t, e, Limits{Timeout: patience, Max: 8}, labelHandler())
	c, err := net.Dial("tcp", s.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(patience))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "HTTP/1.0 400 Bad Request\r\n" {
		t.Errorf("answer %q, %v; want 400", line, err)
	}
}

// waitingSource is a Source whose every hello waits, as one for a host whose ACME order is in
// progress does (certmagic's lock, held through the order's retries), until the hello's context ends.
type waitingSource struct{ ended chan error }

func (s *waitingSource) GetCertificate(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
	<-h.Context().Done()
	s.ended <- h.Context().Err()
	return nil, h.Context().Err()
}

// TestWaitingCertificateIsBoundedByTheTimeout: a hello that waits for its certificate ends at the
// handshake timeout, and gives back its slot, like one that sends nothing. Found with the real binary
// and pebble: handshakes for a host whose order was in progress waited for minutes, held every slot,
// refused hosts served from files, and with TLS-ALPN-01 kept the order's own challenge out.
func TestWaitingCertificateIsBoundedByTheTimeout(t *testing.T) {
	ca := tlstest.NewCA(t)
	src := &waitingSource{ended: make(chan error, 1)}
	e := New(Settings{Certs: loadCerts(t, ca, tlstest.Leaf{Label: "A", Names: []string{"a.test"}}), SourceHosts: []string{"slow.test"}},
		Options{Source: src})
	s := startTLS(t, e, Limits{Timeout: 300 * time.Millisecond, Max: 1}, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	go func() {
		c, err := tls.Dial("tcp", s.addr(), &tls.Config{ServerName: "slow.test", RootCAs: ca.Pool()})
		if err == nil {
			c.Close()
		}
	}()
	select {
	case err := <-src.ended:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("the waiting hello ended with %v, want its deadline", err)
		}
	case <-time.After(patience):
		t.Fatal("a hello waiting for its certificate was not ended by the handshake timeout")
	}
	if _, label, err := get(client(t, ca, s.addr(), true, nil), "https://a.test/"); err != nil || label != "A" {
		t.Fatalf("a host served from a file, after: %q, %v", label, err)
	}
}
