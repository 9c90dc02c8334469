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
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/activator/activator/internal/registry"
)

// adminServer is the admin API of a Server with one route, "app", on a real listener.
func adminServer(t *testing.T, ln net.Listener, access *AdminAccess) (*Server, *httptest.Server) {
	t.Helper()
	s := New(Options{
		Opener:  fakeProvider{&fakeBackend{}},
		Logger:  slog.New(slog.DiscardHandler),
		NewGate: func(*registry.Route) Gate { return passGate{} },
	})
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{testRoute("app")}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "m 1\n") })
	hs := httptest.NewUnstartedServer(s.AdminHandler(metrics, access))
	if ln != nil {
		hs.Listener.Close()
		hs.Listener = ln
	}
	hs.Start()
	t.Cleanup(hs.Close)
	return s, hs
}

type adminReq struct {
	method, path string
	header       map[string]string
}

func (r adminReq) send(t *testing.T, c *http.Client, base string) int {
	t.Helper()
	req, err := http.NewRequest(r.method, base+r.path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range r.header {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusUnauthorized && !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
		t.Errorf("%s %s: 401 without WWW-Authenticate: Bearer", r.method, r.path)
	}
	return resp.StatusCode
}

type h = map[string]string

// TestAdminGuardTCP: over TCP without a token, the Host must be a local name and a POST must be one no
// browser sends cross-site; with a token, every request but an open /metrics needs it.
func TestAdminGuardTCP(t *testing.T) {
	const tok = "s3cret-token"
	bearer := "Bearer " + tok
	tests := []struct {
		name   string
		policy AdminPolicy
		req    adminReq
		want   int
	}{
		{"get, no token configured", AdminPolicy{}, adminReq{"GET", "/routes", nil}, 200},
		{"localhost with a port", AdminPolicy{}, adminReq{"GET", "/routes", h{"Host": "localhost:9090"}}, 200},
		{"[::1]", AdminPolicy{}, adminReq{"GET", "/routes", h{"Host": "[::1]:9090"}}, 200},
		{"rebinding Host", AdminPolicy{}, adminReq{"GET", "/routes", h{"Host": "attacker.example"}}, 421},
		{"rebinding Host on a POST", AdminPolicy{}, adminReq{"POST", "/routes/app/wake", h{"Host": "attacker.example:9090", CSRFHeader: "1"}}, 421},
		{"a configured host", AdminPolicy{Hosts: []string{"Admin.Example"}}, adminReq{"GET", "/routes", h{"Host": "admin.example:9090"}}, 200},
		{"post with the header", AdminPolicy{}, adminReq{"POST", "/routes/app/wake", h{CSRFHeader: "1"}}, 200},
		{"post as JSON", AdminPolicy{}, adminReq{"POST", "/routes/app/sleep", h{"Content-Type": "application/json"}}, 200},
		{"form post", AdminPolicy{}, adminReq{"POST", "/routes/app/wake", h{"Content-Type": "application/x-www-form-urlencoded"}}, 403},
		{"text/plain post", AdminPolicy{}, adminReq{"POST", "/routes/app/sleep", h{"Content-Type": "text/plain"}}, 403},
		{"foreign Origin", AdminPolicy{}, adminReq{"POST", "/routes/app/wake", h{CSRFHeader: "1", "Origin": "http://evil.example"}}, 403},
		{"null Origin", AdminPolicy{}, adminReq{"POST", "/routes/app/wake", h{CSRFHeader: "1", "Origin": "null"}}, 403},
		{"cross-site fetch", AdminPolicy{}, adminReq{"POST", "/routes/app/wake", h{CSRFHeader: "1", "Sec-Fetch-Site": "cross-site"}}, 403},
		{"same-site fetch (another port)", AdminPolicy{}, adminReq{"POST", "/routes/app/wake", h{CSRFHeader: "1", "Sec-Fetch-Site": "same-site"}}, 403},
		// Reads too: a page could have a visitor's browser ask for a CPU profile or a huge listing.
		{"cross-site read", AdminPolicy{}, adminReq{"GET", "/routes", h{"Sec-Fetch-Site": "cross-site"}}, 403},
		{"same-site read (another port)", AdminPolicy{}, adminReq{"GET", "/routes", h{"Sec-Fetch-Site": "same-site"}}, 403},
		{"a browser opening the URL", AdminPolicy{}, adminReq{"GET", "/routes", h{"Sec-Fetch-Site": "none"}}, 200},
		{"token: missing", AdminPolicy{Token: []byte(tok)}, adminReq{"GET", "/routes", nil}, 401},
		{"token: wrong", AdminPolicy{Token: []byte(tok)}, adminReq{"GET", "/routes", h{"Authorization": "Bearer nope"}}, 401},
		{"token: basic auth", AdminPolicy{Token: []byte(tok)}, adminReq{"GET", "/routes", h{"Authorization": "Basic " + tok}}, 401},
		{"token: right", AdminPolicy{Token: []byte(tok)}, adminReq{"GET", "/routes", h{"Authorization": bearer}}, 200},
		{"token: healthz too", AdminPolicy{Token: []byte(tok)}, adminReq{"GET", "/healthz", nil}, 401},
		{"token: metrics closed", AdminPolicy{Token: []byte(tok)}, adminReq{"GET", "/metrics", nil}, 401},
		{"token: metrics open", AdminPolicy{Token: []byte(tok), MetricsOpen: true}, adminReq{"GET", "/metrics", nil}, 200},
		{"token: metrics open, routes not", AdminPolicy{Token: []byte(tok), MetricsOpen: true}, adminReq{"GET", "/routes", nil}, 401},
		{"token: post without it", AdminPolicy{Token: []byte(tok)}, adminReq{"POST", "/routes/app/wake", h{CSRFHeader: "1"}}, 401},
		{"token: post with it is non-simple", AdminPolicy{Token: []byte(tok)}, adminReq{"POST", "/routes/app/wake", h{"Authorization": bearer}}, 200},
		{"token: foreign Origin even so", AdminPolicy{Token: []byte(tok)}, adminReq{"POST", "/routes/app/wake", h{"Authorization": bearer, "Origin": "http://evil.example"}}, 403},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, hs := adminServer(t, nil, NewAdminAccess(tt.policy))
			if got := tt.req.send(t, hs.Client(), hs.URL); got != tt.want {
				t.Errorf("%s %s %v: %d, want %d", tt.req.method, tt.req.path, tt.req.header, got, tt.want)
			}
		})
	}
}

// TestAdminGuardOwnOrigin: a POST whose Origin is the admin API's own passes.
func TestAdminGuardOwnOrigin(t *testing.T) {
	_, hs := adminServer(t, nil, nil)
	r := adminReq{"POST", "/routes/app/wake", h{CSRFHeader: "1", "Origin": hs.URL, "Sec-Fetch-Site": "same-origin"}}
	if got := r.send(t, hs.Client(), hs.URL); got != 200 {
		t.Errorf("POST with its own Origin %s: %d, want 200", hs.URL, got)
	}
}

// TestAdminGuardUnix: over a unix socket any Host passes and no token is needed, but a POST still needs
// the header and a wrong token is refused.
func TestAdminGuardUnix(t *testing.T) {
	path := filepath.Join(t.TempDir(), "admin.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	_, hs := adminServer(t, ln, NewAdminAccess(AdminPolicy{Token: []byte("tok")}))
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}}}
	tests := []struct {
		req  adminReq
		want int
	}{
		{adminReq{"GET", "/routes", h{"Host": "anything.example"}}, 200},
		{adminReq{"POST", "/routes/app/wake", h{CSRFHeader: "1"}}, 200},
		{adminReq{"POST", "/routes/app/wake", h{"Authorization": "Bearer tok"}}, 200},
		{adminReq{"POST", "/routes/app/wake", nil}, 403},
		{adminReq{"POST", "/routes/app/wake", h{CSRFHeader: "1", "Origin": "http://evil.example"}}, 403},
		{adminReq{"GET", "/routes", h{"Authorization": "Bearer wrong"}}, 401},
	}
	_ = hs
	for _, tt := range tests {
		if got := tt.req.send(t, c, "http://localhost"); got != tt.want {
			t.Errorf("unix %s %s %v: %d, want %d", tt.req.method, tt.req.path, tt.req.header, got, tt.want)
		}
	}
}

// TestAdminAccessSet: a new policy (a reload) applies to the next request.
func TestAdminAccessSet(t *testing.T) {
	access := NewAdminAccess(AdminPolicy{Token: []byte("old")})
	_, hs := adminServer(t, nil, access)
	r := adminReq{"GET", "/routes", h{"Authorization": "Bearer new"}}
	if got := r.send(t, hs.Client(), hs.URL); got != 401 {
		t.Fatalf("new token before Set: %d, want 401", got)
	}
	access.Set(AdminPolicy{Token: []byte("new")})
	if got := r.send(t, hs.Client(), hs.URL); got != 200 {
		t.Errorf("new token after Set: %d, want 200", got)
	}
}

// TestAdminGuardDropsBodies: Guard reads a request body, which no admin route takes, within
// adminBodyTimeout and adminBodyLimit. A body that stalls gets 408 and its connection closed, where
// net/http, left to drain it before answering, held the request and its connection for as long as
// the client trickled (measured on the commit before: an admin POST whose 6-byte body came a byte a
// second was answered only after the sixth). A request the guard refuses is answered without waiting
// for its body, a malformed body gets 400, one over the limit 413; a small one passes, and
// the request's context then lives on past the body's deadline (a wake over the admin API may take
// minutes; net/http's background read would end the context at a deadline left set).
func TestAdminGuardDropsBodies(t *testing.T) {
	defer func(d time.Duration) { adminBodyTimeout = d }(adminBodyTimeout)
	adminBodyTimeout = 200 * time.Millisecond
	outlived := make(chan error, 1)
	h := NewAdminAccess(AdminPolicy{}).Guard(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/long" {
			// Wait well past the body's deadline: the context must not end with it.
			select {
			case <-req.Context().Done():
				outlived <- fmt.Errorf("the request's context ended: %w", context.Cause(req.Context()))
			case <-time.After(5 * adminBodyTimeout):
				outlived <- nil
			}
		}
		_, _ = io.WriteString(w, "ok\n")
	}))
	hs := httptest.NewServer(h)
	defer hs.Close()
	addr := hs.Listener.Addr().String()

	// raw sends head and body on a new connection and returns the answer and, with closing, whether
	// the server then closed the connection (without, the connection is left as it is).
	raw := func(head, body string, closing bool) (*http.Response, string, bool) {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(patience)) // only so that a failing test ends
		if _, err := io.WriteString(c, head+body); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%q: no answer: %v", head, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !closing {
			return resp, string(b), false
		}
		_, err = br.ReadByte()
		return resp, string(b), errors.Is(err, io.EOF)
	}
	post := func(path string, length int) string {
		return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nX-Activator: 1\r\nContent-Length: %d\r\n\r\n", path, addr, length)
	}

	resp, body, closed := raw(post("/routes/app/sleep", 6), "abc", true) // three bytes of six, then nothing
	if resp.StatusCode != http.StatusRequestTimeout || !closed || !strings.Contains(body, "POST /routes/app/sleep: the request body did not arrive whole within 200ms") {
		t.Errorf("a stalled body: %d %q, closed %v; want 408 naming the route, and the connection closed", resp.StatusCode, body, closed)
	}
	// Refused requests are answered without waiting for their body, and their connection closed.
	noCSRF := fmt.Sprintf("POST /routes/app/sleep HTTP/1.1\r\nHost: %s\r\nContent-Length: 6\r\n\r\n", addr)
	if resp, body, closed = raw(noCSRF, "abc", true); resp.StatusCode != http.StatusForbidden || !closed {
		t.Errorf("a refused POST with a stalled body: %d %q, closed %v; want 403 and the connection closed", resp.StatusCode, body, closed)
	}
	foreign := "GET /routes HTTP/1.1\r\nHost: attacker.example\r\nContent-Length: 6\r\n\r\n"
	if resp, body, closed = raw(foreign, "abc", true); resp.StatusCode != http.StatusMisdirectedRequest || !closed {
		t.Errorf("a foreign Host with a stalled body: %d %q, closed %v; want 421 and the connection closed", resp.StatusCode, body, closed)
	}
	badChunks := fmt.Sprintf("POST /routes/app/sleep HTTP/1.1\r\nHost: %s\r\nX-Activator: 1\r\nTransfer-Encoding: chunked\r\n\r\n", addr)
	if resp, body, closed = raw(badChunks, "zz\r\n{}\r\n0\r\n\r\n", true); resp.StatusCode != http.StatusBadRequest || !closed ||
		!strings.Contains(body, "POST /routes/app/sleep: the request body broke off or is malformed") {
		t.Errorf("a malformed chunked body: %d %q, closed %v; want 400 naming the route, and the connection closed", resp.StatusCode, body, closed)
	}
	big := strings.Repeat("x", adminBodyLimit+1)
	resp, body, closed = raw(post("/routes/app/wake", len(big)), big, true)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !closed || !strings.Contains(body, "POST /routes/app/wake: a request body over 65536 bytes") {
		t.Errorf("a body over the limit: %d %q, closed %v; want 413 naming the route, and the connection closed", resp.StatusCode, body, closed)
	}
	// A small body, as `curl -d '{}'` sends, passes; so does a chunked one.
	resp, body, _ = raw(post("/long", 2), "{}", false)
	if resp.StatusCode != http.StatusOK || body != "ok\n" {
		t.Errorf("a small body: %d %q, want 200", resp.StatusCode, body)
	}
	if err := <-outlived; err != nil {
		t.Errorf("after a small body: %v", err)
	}
	chunked := fmt.Sprintf("POST /routes/app/sleep HTTP/1.1\r\nHost: %s\r\nX-Activator: 1\r\nTransfer-Encoding: chunked\r\n\r\n", addr)
	if resp, body, _ = raw(chunked, "2\r\n{}\r\n0\r\n\r\n", false); resp.StatusCode != http.StatusOK {
		t.Errorf("a chunked small body: %d %q, want 200", resp.StatusCode, body)
	}
}

// deadlineConn records the write deadlines set on it.
type deadlineConn struct {
	net.Conn
	mu   sync.Mutex
	last time.Time
}

func (c *deadlineConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	c.last = t
	c.mu.Unlock()
	return c.Conn.SetWriteDeadline(t)
}

func (c *deadlineConn) lastDeadline() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

type deadlineListener struct{ net.Listener }

func (l deadlineListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &deadlineConn{Conn: c}, nil
}

// TestAdminGuardBoundsStalledWrites: an admin answer whose client stops reading fails its write once
// adminWriteStall passes, where it blocked for ever before (the admin server has no WriteTimeout: a
// wake over the admin API may take minutes before its first byte). The client here reads nothing of a
// 64 MiB answer through a 4 KiB receive buffer; the handler must see its write fail. And a connection
// that answered and went idle carries no write deadline, which would fail net/http's own answer to its
// next request: net/http clears it after each answer, which stallWriter relies on.
func TestAdminGuardBoundsStalledWrites(t *testing.T) {
	defer func(d time.Duration) { adminWriteStall = d }(adminWriteStall)
	adminWriteStall = 200 * time.Millisecond
	writeErr := make(chan error, 1)
	h := NewAdminAccess(AdminPolicy{}).Guard(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/big" {
			_, _ = io.WriteString(w, "ok\n")
			return
		}
		chunk := make([]byte, 64<<10)
		for range 1024 { // 64 MiB: far more than the socket buffers hold
			if _, err := w.Write(chunk); err != nil {
				writeErr <- err
				return
			}
		}
		writeErr <- nil
	}))
	idle := make(chan time.Time, 4)
	hs := httptest.NewUnstartedServer(h)
	hs.Listener = deadlineListener{hs.Listener}
	hs.Config.ConnState = func(c net.Conn, st http.ConnState) {
		if st == http.StateIdle {
			idle <- c.(*deadlineConn).lastDeadline()
		}
	}
	hs.Start()
	defer hs.Close()
	addr := hs.Listener.Addr().String()

	c := dialSmall(t, addr)
	if _, err := fmt.Fprintf(c, "GET /big HTTP/1.1\r\nHost: %s\r\n\r\n", addr); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-writeErr:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("writing to a client that reads nothing: %v, want the write deadline exceeded", err)
		}
	case <-time.After(patience):
		t.Fatalf("a write to a client that reads nothing still blocked after %v", patience)
	}

	// An answer read whole: once idle, the connection has no write deadline left.
	c2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := fmt.Fprintf(c2, "GET /small HTTP/1.1\r\nHost: %s\r\n\r\n", addr); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c2), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	select {
	case last := <-idle:
		if !last.IsZero() {
			t.Errorf("an idle admin connection keeps the write deadline %v, want none", last)
		}
	case <-time.After(patience):
		t.Fatal("the connection did not go idle after its answer")
	}
}
