package upstream

import (
	"bufio"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// headUpstream answers every request with a head of size bytes of header fields (with size < 0,
// fields without end, until the connection goes) and, if that ever ends, a body "ok".
func headUpstream(t *testing.T, size int) string {
	t.Helper()
	field := "X-Filler: " + strings.Repeat("a", 1000) + "\r\n"
	return rawUpstream(t, func(c net.Conn, _ int) {
		defer c.Close()
		br := bufio.NewReader(c)
		for {
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			if _, err := c.Write([]byte("HTTP/1.1 200 OK\r\n")); err != nil {
				return
			}
			for n := 0; size < 0 || n+len(field) <= size; n += len(field) {
				if _, err := c.Write([]byte(field)); err != nil {
					return
				}
			}
			if _, err := c.Write([]byte("Content-Length: 2\r\n\r\nok")); err != nil {
				return
			}
		}
	})
}

// TestAnswerHeadBounded: an answer head past maxAnswerHead is a failed exchange (the ErrorHandler's 502)
// on both paths, and one below it passes on both. On cbc5176 the fast path read an endless head into
// memory until it ran out: by hand, one request to a tenant that writes header fields without end took
// the activator from 20 MB to 2 GB of RSS in 8 s, every route on the edge with it once the OOM
// killer came. http.Transport stops at its MaxResponseHeaderBytes, nginx at proxy_buffer_size.
func TestAnswerHeadBounded(t *testing.T) {
	tests := []struct {
		name string
		size int // of header fields; < 0: without end
		code int
		body string
	}{
		{"without end", -1, http.StatusBadGateway, "upstream failed\n"},
		{"past the bound", maxAnswerHead + 64<<10, http.StatusBadGateway, "upstream failed\n"},
		{"half the bound", maxAnswerHead / 2, http.StatusOK, "ok"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := headUpstream(t, tt.size)
			fast, slow := newEdges(t, addr)
			for _, p := range []struct {
				name string
				h    http.HandlerFunc
			}{{"fast path", fast}, {"ReverseProxy", slow}} {
				w := httptest.NewRecorder()
				p.h(w, httptest.NewRequest(http.MethodGet, "http://app.test/", nil))
				if w.Code != tt.code || w.Body.String() != tt.body {
					t.Errorf("%s: %d %.40q, want %d %q", p.name, w.Code, w.Body.String(), tt.code, tt.body)
				}
			}
		})
	}
}
