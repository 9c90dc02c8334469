package activator

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
)

// TestClientFieldsBelievedFromProxiesOnly: fields in which proxies describe the client (True-Client-IP,
// X-Real-IP, X-Forwarded-Ssl, …) reach the tenant from a trusted proxy only. The tenant is a chi
// router with middleware.RealIP, which takes True-Client-IP, then X-Real-IP, before X-Forwarded-For
// (chi has since deprecated it for that, but tenants built on it are deployed):
// on 8e3579a a client's "True-Client-IP: 6.6.6.6" became its RemoteAddr, on the fast path (GET) and
// through the ReverseProxy (POST) alike. Now it learns the client the edge saw, and a trusted
// proxy's field is still believed. On both paths: the loop hands back every request with such a field,
// and serves those without.
func TestClientFieldsBelievedFromProxiesOnly(t *testing.T) {
	e := newForwardingEdge(t)
	seen := make(chan string, 1)
	app := chi.NewRouter()
	//lint:ignore SA1019 the tenant under test is one that believes these fields, as RealIP's users do
	app.Use(middleware.RealIP)
	app.HandleFunc("/*", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		seen <- fmt.Sprintf("remote=%s ssl=%q", r.RemoteAddr, r.Header.Get("X-Forwarded-Ssl"))
	})
	tenant := httptest.NewServer(app)
	t.Cleanup(tenant.Close)
	e.route.Upstream.Address = tenant.Listener.Addr().String()
	e.apply(t, "127.0.0.1/32")

	for _, tc := range []struct {
		name, source, fields, want string
	}{
		{"client", "127.0.0.2", "True-Client-IP: 6.6.6.6\r\nX-Real-IP: 6.6.6.7\r\nX-Forwarded-Ssl: on\r\n", `remote=127.0.0.2 ssl=""`},
		{"client, X-Real-IP alone", "127.0.0.2", "X-Real-IP: 6.6.6.7\r\n", `remote=127.0.0.2 ssl=""`},
		{"trusted proxy", "127.0.0.1", "True-Client-IP: 203.0.113.9\r\nX-Forwarded-Ssl: on\r\n", `remote=203.0.113.9 ssl="on"`},
		{"client, no such field", "127.0.0.2", "", `remote=127.0.0.2 ssl=""`},
		{"trusted proxy, no such field", "127.0.0.1", "", `remote=127.0.0.1 ssl=""`},
	} {
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			for _, p := range edgePaths {
				t.Run(p.name+" "+method+" "+tc.name, func(t *testing.T) {
					rc := e.both.conn(t, p, tc.source)
					c := rc.c
					body := ""
					if method == http.MethodPost {
						body = "Content-Length: 2\r\n\r\nhi"
					} else {
						body = "\r\n"
					}
					if _, err := io.WriteString(c, method+" / HTTP/1.1\r\nHost: app.test\r\n"+tc.fields+body); err != nil {
						t.Fatal(err)
					}
					resp, err := http.ReadResponse(rc.br, nil)
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						t.Fatalf("status %d", resp.StatusCode)
					}
					if got := <-seen; got != tc.want {
						t.Errorf("the tenant saw %s, want %s", got, tc.want)
					}
				})
			}
		}
	}
}
