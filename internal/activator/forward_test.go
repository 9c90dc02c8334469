package activator

import (
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/activator/activator/internal/registry"
)

// seen is what an upstream received.
type seen struct {
	host, uri string
	header    http.Header
}

// TestForwardMatchesReverseProxy: the fast path (forward) and the ReverseProxy it stands in for send
// the upstream the same request and the client the same answer, hop-by-hop fields, forwarding
// fields, trailers and informational answers included.
func TestForwardMatchesReverseProxy(t *testing.T) {
	var (
		mu  sync.Mutex
		got []seen
	)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, seen{r.Host, r.RequestURI, r.Header.Clone()})
		mu.Unlock()
		h := w.Header()
		h.Set("Link", "</a.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		h.Del("Link")
		h.Set("Connection", "X-Drop")
		h.Set("X-Drop", "1")
		h.Set("Keep-Alive", "timeout=5")
		h.Set("X-Keep", "1")
		h.Set("Trailer", "X-Sum")
		h.Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusTeapot)
		io.WriteString(w, "hello")
		h.Set("X-Sum", "42")
	}))
	t.Cleanup(upstream.Close)
	_, in := newTestServer(t, &fakeBackend{}, passGate{}, func(r *registry.Route) {
		r.Upstream.Address = upstream.Listener.Addr().String()
	})

	request := func() *http.Request {
		r := httptest.NewRequest(http.MethodGet, "http://app.test/p/a%2Fb?q=1&r=2", nil)
		r.RemoteAddr = "192.0.2.1:1234"
		h := r.Header
		h.Set("User-Agent", "test/1")
		h.Set("Connection", "X-Hop")
		h.Set("X-Hop", "1")
		h.Set("Keep-Alive", "300")
		h.Set("Te", "trailers, deflate")
		h.Set("Proxy-Authorization", "Basic c2VjcmV0")
		h.Set("X-Forwarded-For", "203.0.113.9")
		h.Set("X-Forwarded-Host", "spoofed.example")
		h.Set("Forwarded", "for=203.0.113.9")
		h.Set("Content-Length", "0")
		h.Add("X-Multi", "a")
		h.Add("X-Multi", "b")
		return r
	}
	type answer struct {
		code     int
		header   http.Header
		body     string
		trailer  http.Header
		informal []int
	}
	run := func(serve func(w http.ResponseWriter, r *http.Request)) answer {
		w := &recorder1xx{ResponseRecorder: httptest.NewRecorder()}
		serve(w, request())
		res := w.Result()
		b, _ := io.ReadAll(res.Body)
		res.Header.Del("Date")
		return answer{res.StatusCode, res.Header, string(b), res.Trailer, w.codes}
	}
	fast := run(func(w http.ResponseWriter, r *http.Request) {
		if !in.forward(w, r) {
			t.Fatal("forward refused a bodyless GET")
		}
	})
	slow := run(in.reverseProxy().ServeHTTP)

	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("upstream saw %d requests, want 2", len(got))
	}
	if !reflect.DeepEqual(got[0], got[1]) {
		t.Errorf("upstream saw\nforward:      %+v\nReverseProxy: %+v", got[0], got[1])
	}
	if xff := got[0].header.Get("X-Forwarded-For"); xff != "192.0.2.1" {
		t.Errorf("X-Forwarded-For = %q, want the client's address only", xff)
	}
	for _, k := range []string{"X-Hop", "Keep-Alive", "Proxy-Authorization", "Forwarded", "Connection"} {
		if v := got[0].header.Get(k); v != "" {
			t.Errorf("upstream got hop-by-hop or client forwarding field %s: %q", k, v)
		}
	}
	if !reflect.DeepEqual(fast, slow) {
		t.Errorf("client got\nforward:      %+v\nReverseProxy: %+v", fast, slow)
	}
	if fast.code != http.StatusTeapot || fast.body != "hello" || fast.trailer.Get("X-Sum") != "42" ||
		fast.header.Get("X-Drop") != "" || fast.header.Get("X-Keep") != "1" || !reflect.DeepEqual(fast.informal, []int{103}) {
		t.Errorf("forward's answer %+v: want 418 \"hello\", trailer X-Sum, X-Drop dropped, X-Keep kept, one 103", fast)
	}
}

// recorder1xx records informational status codes, which httptest.ResponseRecorder does not keep.
type recorder1xx struct {
	*httptest.ResponseRecorder
	codes []int
}

func (r *recorder1xx) WriteHeader(code int) {
	if code >= 100 && code < 200 {
		r.codes = append(r.codes, code)
		return
	}
	r.ResponseRecorder.WriteHeader(code)
}

// TestForwardUpstreamDown: a refused upstream is answered by writeError (502 naming the route), the
// same as through the ReverseProxy; requests forward cannot carry are left to the ReverseProxy.
func TestForwardUpstreamDown(t *testing.T) {
	_, in := newTestServer(t, &fakeBackend{}, passGate{}, func(r *registry.Route) {
		r.Upstream.Address = "127.0.0.1:1" // nothing listens on port 1
	})
	fast, slow := httptest.NewRecorder(), httptest.NewRecorder()
	if !in.forward(fast, httptest.NewRequest(http.MethodGet, "http://app.test/", nil)) {
		t.Fatal("forward refused a bodyless GET")
	}
	in.reverseProxy().ServeHTTP(slow, httptest.NewRequest(http.MethodGet, "http://app.test/", nil))
	if fast.Code != http.StatusBadGateway || fast.Code != slow.Code || fast.Body.String() != slow.Body.String() {
		t.Errorf("forward answered %d %q; ReverseProxy %d %q", fast.Code, fast.Body, slow.Code, slow.Body)
	}
	for _, r := range []*http.Request{
		httptest.NewRequest(http.MethodPost, "http://app.test/", strings.NewReader("x")),
		func() *http.Request {
			r := httptest.NewRequest(http.MethodGet, "http://app.test/ws", nil)
			r.Header.Set("Upgrade", "websocket")
			return r
		}(),
	} {
		if in.forward(httptest.NewRecorder(), r) {
			t.Errorf("forward took %s %s with Upgrade %q", r.Method, r.URL, r.Header.Get("Upgrade"))
		}
	}
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
		resp := &http.Response{Header: http.Header{"Content-Type": {tc.ct}}, ContentLength: tc.length}
		if got := flushEach(resp); got != tc.want {
			t.Errorf("flushEach(%q, length %d) = %v, want %v", tc.ct, tc.length, got, tc.want)
		}
	}
}
