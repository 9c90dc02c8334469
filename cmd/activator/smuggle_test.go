package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/activator/activator/internal/testenv"
)

// hypercornApp is an ASGI app that answers with what it was asked: the HTTP version, the path and the
// X-Forwarded-For it was given.
const hypercornApp = `async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    h = dict((k.decode(), v.decode()) for k, v in scope["headers"])
    body = ("%s %s xff=%s" % (scope["http_version"], scope["path"], h.get("x-forwarded-for"))).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})
`

// TestH2CSmugglingStopped: a client's "Upgrade: h2c" is not passed to a tenant that would take it.
// Hypercorn (Debian's python3-hypercorn) upgrades on "Upgrade: h2c" with HTTP2-Settings, without
// asking for "Connection: HTTP2-Settings" as Go's h2c handler does. On 59746f8 it answered 101
// through the edge, and the edge relayed the connection from then on: an HTTP/2 request on it for
// /private/admin, outside the route's path_prefix, with "x-forwarded-for: 6.6.6.6", reached the
// tenant as such. Now the request is served as plain HTTP/1.1.
func TestH2CSmugglingStopped(t *testing.T) {
	h := pythonTenant(t, "hypercorn", hypercornApp, "/public", func(addr string) string {
		return fmt.Sprintf(`-m, hypercorn, --bind, %q, "app:app"`, addr)
	})
	if r := h.get("py.test", "/public/x"); r.code != http.StatusOK || r.body != "1.1 /public/x xff=127.0.0.1" {
		t.Fatalf("GET /public/x: %d %q", r.code, r.body)
	}

	c, err := net.Dial("tcp", h.edgeAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(patience)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "GET /public/x HTTP/1.1\r\nHost: py.test\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n"+
		"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the answer to the upgrade: %v", err)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		t.Fatalf("the edge relayed the tenant's 101; on that connection: %s", smuggle(t, c, br))
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(body) != "1.1 /public/x xff=127.0.0.1" {
		t.Errorf("GET /public/x with Upgrade: h2c: %d %q, want 200 %q", resp.StatusCode, body, "1.1 /public/x xff=127.0.0.1")
	}
}

// python is the interpreter the Python tenants run on: Debian's, where python3-hypercorn installs.
const python = "/usr/bin/python3"

// pythonTenant is a harness with one exec route, "py" (host py.test, path_prefix prefix, health
// probed at prefix + "/"), whose tenant is python running app.py (app) in a directory of its own with
// the arguments args gives for its listen address (YAML list items). It needs module importable.
func pythonTenant(t *testing.T, module, app, prefix string, args func(addr string) string) *harness {
	t.Helper()
	if err := exec.Command(python, "-c", "import "+module).Run(); err != nil {
		testenv.Missing(t, "%s cannot import %s (Debian: apt-get install python3-hypercorn): %v", python, module, err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "app.py"), []byte(app), 0o644); err != nil {
		t.Fatal(err)
	}
	up := freeLoopbackAddr(t)
	return newHarness(t, fmt.Sprintf(`routes:
  - name: py
    hosts: [py.test]
    path_prefix: %s
    backing: exec
    upstream: %s
    health: {path: %s/}
    exec:
      argv: [%s, %s]
      dir: %s
`, prefix, up, prefix, python, args(up), dir))
}

// wsgirefApp serves, on the port its first argument gives, what a WSGI app reads as the client's
// forwarding chain: the environ's HTTP_X_FORWARDED_FOR, into which Python's wsgiref merges every
// field whose name reads X_FORWARDED_FOR once its hyphens are underscores.
const wsgirefApp = `import sys
from wsgiref.simple_server import make_server, WSGIRequestHandler
class Quiet(WSGIRequestHandler):
    def log_message(self, *args): pass
def app(env, start):
    start("200 OK", [("Content-Type", "text/plain")])
    return [("xff=%s" % env.get("HTTP_X_FORWARDED_FOR")).encode()]
host, port = sys.argv[1].rsplit(":", 1)
make_server(host, int(port), app, handler_class=Quiet).serve_forever()
`

// TestForwardedAliasesDropped: a client's "X_Forwarded_For" never reaches a tenant, which may read
// it as X-Forwarded-For. On 990f9bc wsgiref's app read "6.6.6.6,127.0.0.1" for a GET (the fast path
// writes the client's fields before the edge's) and "127.0.0.1,6.6.6.6" for a POST.
func TestForwardedAliasesDropped(t *testing.T) {
	h := pythonTenant(t, "wsgiref", wsgirefApp, "", func(addr string) string { return fmt.Sprintf("app.py, %q", addr) })
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		var body io.Reader // none for the GET: it takes the fast path
		if method == http.MethodPost {
			body = strings.NewReader("a=b")
		}
		req := h.request(t.Context(), method, "py.test", "/", body)
		req.Header["X_Forwarded_For"] = []string{"6.6.6.6"}
		req.Header["X-Forwarded_for"] = []string{"6.6.6.7"}
		r, err := h.do(req)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		if r.code != http.StatusOK || r.body != "xff=127.0.0.1" {
			t.Errorf("%s with X_Forwarded_For: %d %q, want 200 %q", method, r.code, r.body, "xff=127.0.0.1")
		}
	}
}

// smuggle speaks HTTP/2 on c, a connection the tenant upgraded to h2c, and reports what the tenant
// answered to a request the edge would have routed elsewhere.
func smuggle(t *testing.T, c net.Conn, br *bufio.Reader) string {
	t.Helper()
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		return err.Error()
	}
	fr := http2.NewFramer(c, br)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(); err != nil {
		return err.Error()
	}
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", "py.test"}, {":path", "/private/admin"}, {"x-forwarded-for", "6.6.6.6"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: block.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
		return err.Error()
	}
	var answer []byte
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return fmt.Sprintf("%q, then %v", answer, err)
		}
		switch f := f.(type) {
		case *http2.DataFrame:
			if f.StreamID == 3 {
				answer = append(answer, f.Data()...)
				if f.StreamEnded() {
					return fmt.Sprintf("GET /private/admin with x-forwarded-for 6.6.6.6 was answered %q", answer)
				}
			}
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		}
	}
}
