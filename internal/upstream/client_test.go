package upstream

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/activator/activator/internal/demoapp"
)

// These tests drive a Client end to end: an edge (an http.Server serving Client.Serve) in front of a
// real upstream server on loopback. They cover the fast keep-alive path for bodyless GET/HEAD/OPTIONS
// and the ReverseProxy for everything else.

// countingListener counts accepted connections and can close them all (a tenant dropping its
// keep-alive connections).
type countingListener struct {
	net.Listener
	n atomic.Int64

	mu    sync.Mutex // guards conns
	conns []net.Conn
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *countingListener) closeConns() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		_ = c.Close()
	}
	l.conns = nil
}

// serve runs srv on ln until the test ends.
func serve(t *testing.T, srv *http.Server, ln net.Listener) {
	t.Helper()
	srv.ErrorLog = quietLog()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// newUpstream starts an upstream serving h and an edge serving a Client for it, and returns the
// edge's address, the upstream's listener and the Client.
func newUpstream(t *testing.T, h http.Handler) (string, *countingListener, *Client) {
	t.Helper()
	up := &countingListener{Listener: listen(t)}
	serve(t, &http.Server{Handler: h}, up)
	c := New(Options{Network: "tcp", Address: up.Addr().String(), MaxConns: 64, ErrorHandler: failed})
	t.Cleanup(c.CloseIdle)
	edge := listen(t)
	serve(t, &http.Server{Handler: http.HandlerFunc(c.Serve)}, edge)
	return edge.Addr().String(), up, c
}

func edgeClient(t *testing.T) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

func get(t *testing.T, c *http.Client, method, url string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: body: %v", method, url, err)
	}
	return resp, string(b)
}

func TestKeepAliveReuse(t *testing.T) {
	edge, up, _ := newUpstream(t, demoapp.Handler(0, 0))
	c := edgeClient(t)
	get(t, c, http.MethodGet, "http://"+edge+"/") // dials the one connection the rest reuse
	base := up.n.Load()
	for i := 0; i < 200; i++ {
		resp, body := get(t, c, http.MethodGet, "http://"+edge+"/")
		if resp.StatusCode != 200 || body != "hello from demoapp\n" {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
	}
	if n := up.n.Load() - base; n != 0 {
		t.Errorf("upstream accepted %d new connections for 200 sequential requests, want 0 (keep-alive)", n)
	}
	resp, body := get(t, c, http.MethodHead, "http://"+edge+"/")
	if resp.StatusCode != 200 || body != "" {
		t.Errorf("HEAD: %d %q", resp.StatusCode, body)
	}
	resp, _ = get(t, c, http.MethodGet, "http://"+edge+"/")
	if resp.StatusCode != 200 || up.n.Load() != base {
		t.Errorf("after HEAD: %d, %d new upstream connections", resp.StatusCode, up.n.Load()-base)
	}
}

func TestHeadersChunkedTrailers(t *testing.T) {
	edge, _, _ := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Forwarded-For") == "" || r.Host != "127.0.0.1" && !strings.HasPrefix(r.Host, "127.0.0.1:") {
			http.Error(w, fmt.Sprintf("bad forwarding: host %q xff %q", r.Host, r.Header.Get("X-Forwarded-For")), 500)
			return
		}
		w.Header().Set("Trailer", "X-Sum")
		w.Header().Set("X-Up", "yes")
		f := w.(http.Flusher)
		for i := 0; i < 3; i++ {
			fmt.Fprintf(w, "part %d\n", i)
			f.Flush() // forces chunked encoding
		}
		w.Header().Set("X-Sum", "3")
	}))
	c := edgeClient(t)
	for i := 0; i < 3; i++ {
		resp, body := get(t, c, http.MethodGet, "http://"+edge+"/x?y=1")
		if resp.StatusCode != 200 || body != "part 0\npart 1\npart 2\n" || resp.Header.Get("X-Up") != "yes" || resp.Trailer.Get("X-Sum") != "3" {
			t.Fatalf("got %d %q header %v trailer %v", resp.StatusCode, body, resp.Header, resp.Trailer)
		}
	}
}

// A tenant that closes its keep-alive connections (it restarted, or its idle timeout is short) must
// not fail the next request: the client retries once on a new connection.
func TestStaleConnectionRetried(t *testing.T) {
	edge, up, _ := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	}))
	c := edgeClient(t)
	for round := 0; round < 5; round++ {
		// Warm several upstream connections, then have the tenant drop them all.
		var wg sync.WaitGroup
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := c.Get("http://" + edge + "/")
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
		wg.Wait()
		up.closeConns()
		resp, body := get(t, c, http.MethodGet, "http://"+edge+"/")
		if resp.StatusCode != 200 || body != "ok\n" {
			t.Fatalf("round %d after the tenant dropped its connections: %d %q", round, resp.StatusCode, body)
		}
	}
	if up.n.Load() < 2 {
		t.Errorf("upstream accepted %d connections; the test did not exercise reconnection", up.n.Load())
	}
}

func TestEarlyHints(t *testing.T) {
	edge, _, _ := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		fmt.Fprintln(w, "final")
	}))
	var got []int
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
		got = append(got, code)
		return nil
	}}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, "http://"+edge+"/", nil)
	resp, err := edgeClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "final\n" || len(got) != 1 || got[0] != 103 {
		t.Errorf("got %d %q, 1xx %v; want 200 \"final\\n\" and one 103", resp.StatusCode, b, got)
	}
}

// TestInformationalHopByHop: the fast path drops a 1xx answer's hop-by-hop fields, as it does the
// final answer's (RFC 9110 7.6.1; the ReverseProxy passes them on, golang/go#81319).
func TestInformationalHopByHop(t *testing.T) {
	edge, _, _ := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Link", "</style.css>; rel=preload")
		h.Set("Connection", "X-Nominated")
		h.Set("X-Nominated", "1")
		h.Set("Keep-Alive", "timeout=5")
		w.WriteHeader(http.StatusEarlyHints)
		clear(h)
		io.WriteString(w, "final")
	}))
	var got []textproto.MIMEHeader
	trace := &httptrace.ClientTrace{Got1xxResponse: func(_ int, h textproto.MIMEHeader) error {
		got = append(got, h)
		return nil
	}}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), http.MethodGet, "http://"+edge+"/", nil)
	resp, err := edgeClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	want := textproto.MIMEHeader{"Link": {"</style.css>; rel=preload"}}
	if len(got) != 1 || !reflect.DeepEqual(got[0], want) {
		t.Errorf("1xx answers %v, want one with %v alone", got, want)
	}
}

// Requests with bodies and protocol upgrades take the ReverseProxy.
func TestFallback(t *testing.T) {
	edge, _, _ := newUpstream(t, demoapp.Handler(0, 0))
	c := edgeClient(t)
	resp, err := c.Post("http://"+edge+"/echo", "text/plain", strings.NewReader("ping body"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ping body" {
		t.Errorf("POST /echo = %q", b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws://"+edge+"/ws", nil)
	if err != nil {
		t.Fatalf("websocket through the edge: %v", err)
	}
	defer ws.CloseNow()
	if err := ws.Write(ctx, websocket.MessageText, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := ws.Read(ctx); err != nil || string(msg) != "hi" {
		t.Errorf("websocket echo = %q, %v", msg, err)
	}
	_ = ws.Close(websocket.StatusNormalClosure, "")
	// And the fast path still works afterwards.
	if resp, body := get(t, c, http.MethodGet, "http://"+edge+"/"); resp.StatusCode != 200 || body != "hello from demoapp\n" {
		t.Errorf("GET after fallback: %d %q", resp.StatusCode, body)
	}
}

// A client that goes away mid-stream ends the upstream request too (the client does not drain an
// endless body), and the route keeps working.
func TestClientCancelMidStream(t *testing.T) {
	ended := make(chan struct{}, 1)
	edge, _, _ := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/stream" {
			fmt.Fprintln(w, "ok")
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for i := 0; ; i++ {
			if _, err := fmt.Fprintf(w, "data: %d\n\n", i); err != nil {
				break
			}
			f.Flush()
			select {
			case <-r.Context().Done():
				ended <- struct{}{}
				return
			case <-time.After(time.Millisecond):
			}
		}
		ended <- struct{}{}
	}))
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+edge+"/stream", nil)
	c := edgeClient(t)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first event: %q %v", line, err)
	}
	cancel()
	resp.Body.Close()
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the upstream stream did not end within 30s of the client going away")
	}
	if resp, body := get(t, c, http.MethodGet, "http://"+edge+"/"); resp.StatusCode != 200 || body != "ok\n" {
		t.Errorf("GET after a canceled stream: %d %q", resp.StatusCode, body)
	}
}

// TestClientGoneBeforeAnswer: a client that goes away while the upstream has not answered yet ends
// the upstream exchange too, once the watch's grace has passed (Conn.watch), and the route keeps
// working.
func TestClientGoneBeforeAnswer(t *testing.T) {
	got, ended := make(chan struct{}, 1), make(chan struct{}, 1)
	edge, _, _ := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/poll" {
			fmt.Fprintln(w, "ok")
			return
		}
		got <- struct{}{}
		<-r.Context().Done() // a long poll that never answers: the edge must hang up
		ended <- struct{}{}
	}))
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+edge+"/poll", nil)
	c := edgeClient(t)
	errc := make(chan error, 1)
	go func() {
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-got
	cancel()
	if err := <-errc; err == nil {
		t.Error("the canceled request got an answer")
	}
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the upstream exchange did not end within 30s of the client going away")
	}
	if resp, body := get(t, c, http.MethodGet, "http://"+edge+"/"); resp.StatusCode != 200 || body != "ok\n" {
		t.Errorf("GET after a canceled poll: %d %q", resp.StatusCode, body)
	}
}

// TestSlowerThanGrace: an exchange that outlasts the watch's grace, in its head or in its body, is
// not cut by it.
func TestSlowerThanGrace(t *testing.T) {
	edge, up, _ := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow-body" {
			w.Header().Set("Content-Length", "4")
			io.WriteString(w, "ab")
			w.(http.Flusher).Flush()
		}
		<-time.After(watchGrace + 50*time.Millisecond) // the tenant is slow; its slowness is what is tested
		if r.URL.Path == "/slow-body" {
			io.WriteString(w, "cd")
			return
		}
		io.WriteString(w, "late")
	}))
	c := edgeClient(t)
	for _, tc := range []struct{ path, want string }{{"/slow-head", "late"}, {"/slow-body", "abcd"}, {"/slow-head", "late"}} {
		if resp, body := get(t, c, http.MethodGet, "http://"+edge+tc.path); resp.StatusCode != 200 || body != tc.want {
			t.Errorf("GET %s: %d %q, want 200 %q", tc.path, resp.StatusCode, body, tc.want)
		}
	}
	if n := up.n.Load(); n != 1 {
		t.Errorf("the upstream accepted %d connections, want 1: a slow exchange must leave its connection reusable", n)
	}
}

// TestStreamHeadFlushed: an event stream's head reaches the client before its first event, as
// through the ReverseProxy.
func TestStreamHeadFlushed(t *testing.T) {
	first := make(chan struct{})
	edge, _, _ := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.(http.Flusher).Flush()
		select {
		case <-first:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: 1\n\n")
	}))
	resp, err := edgeClient(t).Get("http://" + edge + "/")
	close(first) // only once the head has arrived: Get returns with it
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "data: 1\n\n" {
		t.Errorf("got %d %q", resp.StatusCode, b)
	}
}

func TestConcurrent(t *testing.T) {
	edge, _, _ := newUpstream(t, demoapp.Handler(0, 0))
	c := edgeClient(t)
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				path := "/"
				if i%5 == 0 {
					path = "/bound"
				}
				resp, err := c.Get("http://" + edge + path)
				if err != nil {
					errs <- err
					return
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 || len(b) == 0 {
					errs <- fmt.Errorf("%s: %d %q %v", path, resp.StatusCode, b, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestUpstreamDown: a refused upstream goes to the ErrorHandler, on both paths, and nothing else
// is written.
func TestUpstreamDown(t *testing.T) {
	var mu sync.Mutex
	var errs []error
	c := New(Options{Network: "tcp", Address: "127.0.0.1:1", MaxConns: 4, // nothing listens on port 1
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
			w.WriteHeader(599)
		}})
	for _, r := range []*http.Request{
		httptest.NewRequest(http.MethodGet, "http://app.test/", nil),
		httptest.NewRequest(http.MethodPost, "http://app.test/", strings.NewReader("x")),
	} {
		w := httptest.NewRecorder()
		c.Serve(w, r)
		if w.Code != 599 || w.Body.Len() != 0 {
			t.Errorf("%s: answered %d %q, want the ErrorHandler's 599 alone", r.Method, w.Code, w.Body)
		}
	}
	if len(errs) != 2 {
		t.Errorf("ErrorHandler saw %v, want one error per request", errs)
	}
}

func TestForwardable(t *testing.T) {
	for _, tc := range []struct {
		r    *http.Request
		want bool
	}{
		{httptest.NewRequest(http.MethodGet, "http://app.test/", nil), true},
		{httptest.NewRequest(http.MethodHead, "http://app.test/", nil), true},
		{httptest.NewRequest(http.MethodOptions, "http://app.test/", nil), true},
		{httptest.NewRequest(http.MethodPost, "http://app.test/", strings.NewReader("x")), false},
		{httptest.NewRequest(http.MethodGet, "http://app.test/", strings.NewReader("x")), false},
		{withHeader(httptest.NewRequest(http.MethodGet, "http://app.test/ws", nil), "Upgrade", "websocket"), false},
		{withHeader(httptest.NewRequest(http.MethodGet, "http://app.test/", nil), "Expect", "100-continue"), false},
		{httptest.NewRequest(http.MethodGet, "http://[fe80::1%25eth0]:8080/", nil), false},
		{httptest.NewRequest(http.MethodGet, "http://[::1]:8080/", nil), true},
	} {
		if got := forwardable(tc.r); got != tc.want {
			t.Errorf("forwardable(%s %s, header %v) = %v, want %v", tc.r.Method, tc.r.URL, tc.r.Header, got, tc.want)
		}
	}
}

func withHeader(r *http.Request, k, v string) *http.Request {
	r.Header.Set(k, v)
	return r
}

func TestFlushEach(t *testing.T) {
	for _, tc := range []struct {
		ct     string
		length int64
		want   bool
	}{
		{"text/event-stream", 100, true},
		{"Text/Event-Stream; charset=utf-8", 100, true},
		{"text/plain", 100, false},
		{"text/plain", -1, true}, // unknown length: stream it
		{"", 0, false},
	} {
		if got := flushEach(tc.length, http.Header{"Content-Type": {tc.ct}}); got != tc.want {
			t.Errorf("flushEach(%q, length %d) = %v, want %v", tc.ct, tc.length, got, tc.want)
		}
	}
}
