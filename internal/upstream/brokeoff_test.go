package upstream

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/activator/activator/internal/testenv"
)

// TestBrokenOffAnswerIsLogged: a tenant that dies mid-body (a head promising 100,000 bytes, 70 of
// them, then the connection closed) leaves its client with a closed connection, which is all the
// client can be told; the operator's log says so, with the route's attributes, on both paths. Found
// with the real binary: a GET left no line at all, a POST a plain stdlib line without the route, even
// with --log-format json.
func TestBrokenOffAnswerIsLogged(t *testing.T) {
	addr := rawUpstream(t, func(c net.Conn, _ int) {
		defer c.Close()
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"+strings.Repeat("x", 70))
	})
	var logs testenv.SyncBuffer
	c := New(Options{Network: "tcp", Address: addr, MaxConns: 4, ErrorHandler: failed,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil)).With("route", "crash")})
	t.Cleanup(c.CloseIdle)
	edge := httptest.NewUnstartedServer(http.HandlerFunc(c.Serve))
	edge.Config.ErrorLog = quietLog()
	edge.Start()
	defer edge.Close()
	for _, method := range []string{http.MethodGet, http.MethodPost} { // the fast path, the ReverseProxy
		before := strings.Count(logs.String(), "\n")
		var body io.Reader
		if method == http.MethodPost {
			body = strings.NewReader("body")
		}
		req, err := http.NewRequest(method, edge.URL+"/crash", body)
		if err != nil {
			t.Fatal(err)
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil {
				t.Errorf("%s: the client read a whole body of a broken-off answer", method)
			}
		}
		lines := strings.Split(strings.TrimSpace(logs.String()), "\n")[before:]
		if len(lines) == 0 || !strings.Contains(lines[0], `"route":"crash"`) || !strings.Contains(lines[0], `"level":"WARN"`) {
			t.Errorf("%s: log lines %q, want a WARN line with the route", method, lines)
		}
	}
}
