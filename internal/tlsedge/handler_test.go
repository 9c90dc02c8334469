package tlsedge

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/activator/activator/internal/tlsedge/tlstest"
)

// TestHandler: challenges go to the hook and never further; plain requests for hosts served over TLS
// get 308 to https with their path and query; everything else reaches next untouched.
func TestHandler(t *testing.T) {
	ca := tlstest.NewCA(t)
	certs := loadCerts(t, ca, tlstest.Leaf{Label: "A", Names: []string{"a.test", "*.wild.test"}})
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "next") })
	// The hook answers one token, and passes the rest on, as certmagic's does.
	hook := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == ChallengePrefix+"token" {
				io.WriteString(w, "key-authorization")
				return
			}
			h.ServeHTTP(w, r)
		})
	}
	src := &fakeSource{}
	settings := Settings{Certs: certs, SourceHosts: []string{"acme.test"}, RedirectHTTP: true}
	on := New(settings, Options{Source: src, Challenge: hook, HTTPSPort: 8443}).Handler(next)
	std := New(settings, Options{Source: src, Challenge: hook, HTTPSPort: 443}).Handler(next)
	settings.RedirectHTTP = false
	off := New(settings, Options{Source: src, HTTPSPort: 8443}).Handler(next)

	tests := []struct {
		name     string
		h        http.Handler
		method   string
		target   string // the request target; its host is the Host header
		tls      bool
		body     string
		code     int
		location string // for 308
		answer   string // the body, for 200 and 404
		close    bool   // Connection: close
	}{
		{"exact host", on, "GET", "http://a.test/p/q?x=1&y=%20", false, "", 308, "https://a.test:8443/p/q?x=1&y=%20", "", false},
		{"escaped path kept", on, "GET", "http://a.test/a%2Fb%20c", false, "", 308, "https://a.test:8443/a%2Fb%20c", "", false},
		{"host with port and case", on, "GET", "http://A.Test:8080/", false, "", 308, "https://a.test:8443/", "", false},
		{"wildcard host", on, "GET", "http://x.wild.test/", false, "", 308, "https://x.wild.test:8443/", "", false},
		{"source host", on, "HEAD", "http://acme.test/", false, "", 308, "https://acme.test:8443/", "", false},
		{"port 443 left out", std, "GET", "http://a.test/p?q", false, "", 308, "https://a.test/p?q", "", false},
		{"a body: the connection closes", on, "POST", "http://a.test/form", false, "a=1", 308, "https://a.test:8443/form", "", true},
		{"host not served over TLS", on, "GET", "http://plain.test/", false, "", 200, "", "next", false},
		{"a wildcard's parent is not covered", on, "GET", "http://wild.test/", false, "", 200, "", "next", false},
		{"over TLS", on, "GET", "https://a.test/", true, "", 200, "", "next", false},
		{"redirect_http off", off, "GET", "http://a.test/", false, "", 200, "", "next", false},
		{"OPTIONS *", on, "OPTIONS", "*", false, "", 200, "", "next", false},
		{"a challenge, answered", on, "GET", "http://a.test" + ChallengePrefix + "token", false, "", 200, "", "key-authorization", false},
		{"a challenge for any host", on, "GET", "http://sleeping.test" + ChallengePrefix + "token", false, "", 200, "", "key-authorization", false},
		{"a challenge over TLS", on, "GET", "https://a.test" + ChallengePrefix + "token", true, "", 200, "", "key-authorization", false},
		{"an unknown token: 404, not next", on, "GET", "http://sleeping.test" + ChallengePrefix + "other", false, "", 404, "", "404 page not found\n", false},
		{"dot segments: still the hook", on, "GET", "http://sleeping.test/x/../.well-known/./acme-challenge/other", false, "", 404, "", "404 page not found\n", false},
		{"the bare prefix: still the hook", on, "GET", "http://sleeping.test/.well-known/acme-challenge", false, "", 404, "", "404 page not found\n", false},
		{"no hook: routed as any path", off, "GET", "http://sleeping.test" + ChallengePrefix + "token", false, "", 200, "", "next", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var body io.Reader
			if tt.body != "" {
				body = strings.NewReader(tt.body)
			}
			r := httptest.NewRequest(tt.method, tt.target, body)
			if tt.target == "*" {
				r.Host = "a.test"
			}
			if !tt.tls {
				r.TLS = nil
			} else if r.TLS == nil {
				r.TLS = &tls.ConnectionState{}
			}
			w := httptest.NewRecorder()
			tt.h.ServeHTTP(w, r)
			checkAnswer(t, w, tt.code, tt.location, tt.answer, tt.close)
		})
	}
}

// checkAnswer checks a recorded answer: its status, Location, body (unless answer is "") and whether
// it closes its connection.
func checkAnswer(t *testing.T, w *httptest.ResponseRecorder, code int, location, answer string, closes bool) {
	t.Helper()
	if w.Code != code {
		t.Fatalf("status %d, want %d; body %q", w.Code, code, w.Body)
	}
	if got := w.Header().Get("Location"); got != location {
		t.Errorf("Location %q, want %q", got, location)
	}
	if answer != "" && w.Body.String() != answer {
		t.Errorf("body %q, want %q", w.Body, answer)
	}
	if got := w.Header().Get("Connection") == "close"; got != closes {
		t.Errorf("Connection: close %v, want %v", got, closes)
	}
}

// TestRedirectFollowsReload: which hosts are redirected follows the settings in force.
func TestRedirectFollowsReload(t *testing.T) {
	ca := tlstest.NewCA(t)
	e := New(Settings{Certs: loadCerts(t, ca, tlstest.Leaf{Label: "A", Names: []string{"a.test"}}), RedirectHTTP: true}, Options{HTTPSPort: 443})
	h := e.Handler(http.NotFoundHandler())
	code := func(host string) int {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "http://"+host+"/", nil))
		return w.Code
	}
	if a, b := code("a.test"), code("b.test"); a != 308 || b != 404 {
		t.Fatalf("before the reload: a.test %d, b.test %d; want 308, 404", a, b)
	}
	e.Reload(Settings{Certs: loadCerts(t, ca, tlstest.Leaf{Label: "B", Names: []string{"b.test"}}), RedirectHTTP: true})
	if a, b := code("a.test"), code("b.test"); a != 404 || b != 308 {
		t.Errorf("after the reload: a.test %d, b.test %d; want 404, 308", a, b)
	}
	// A reload that drops listen_tls (and redirect_http with it) ends the redirects: the listener runs
	// on until a restart, but the config no longer asks for them (they went on, found with the real
	// binary).
	e.StopRedirect()
	if b := code("b.test"); b != 404 {
		t.Errorf("after StopRedirect: b.test %d, want 404", b)
	}
}
