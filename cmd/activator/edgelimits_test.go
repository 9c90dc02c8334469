package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tlsedge/tlstest"
)

// TestHeaderLimit: edge.max_header_bytes is the effective limit of the edge's http.Server: a request
// line and header of exactly that many bytes pass (to an unknown host here: 404, nothing woken), one
// byte more gets 431. With the key left out, the default 32 KiB applies.
func TestHeaderLimit(t *testing.T) {
	app := appRoute{Name: "hdr"}
	for _, tc := range []struct {
		name  string
		edge  string
		limit int
	}{
		{"configured", "edge:\n  max_header_bytes: 8KiB\n", 8 << 10},
		{"default", "", 32 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.edge+configYAML(t, app))
			for _, size := range []int{tc.limit, tc.limit + 1} {
				code := rawStatus(t, h.edgeAddr, headerOfSize(t, size))
				want := http.StatusNotFound
				if size > tc.limit {
					want = http.StatusRequestHeaderFieldsTooLarge
				}
				if code != want {
					t.Errorf("a %d-byte header with max_header_bytes %d: %d, want %d", size, tc.limit, code, want)
				}
			}
			// On a kept-alive connection too, one byte over is refused.
			c := dialEdge(t, h.edgeAddr)
			if code := exchange(t, c, headerOfSize(t, 100)); code != http.StatusNotFound {
				t.Fatalf("a small request: %d, want 404", code)
			}
			if code := exchange(t, c, headerOfSize(t, tc.limit+1)); code != http.StatusRequestHeaderFieldsTooLarge {
				t.Errorf("a %d-byte header on a kept-alive connection: %d, want 431", tc.limit+1, code)
			}
			if spawns := h.spawns(app.Name); len(spawns) != 0 {
				t.Fatalf("spawns = %v, want none", spawns)
			}
		})
	}
}

// headerOfSize is a GET to an unknown host whose request line and header, final CRLF included, are
// exactly size bytes.
func headerOfSize(t *testing.T, size int) []byte {
	t.Helper()
	const start, end = "GET / HTTP/1.1\r\nHost: nobody.test\r\nX-Pad: ", "\r\n\r\n"
	pad := size - len(start) - len(end)
	if pad < 1 {
		t.Fatalf("size %d too small", size)
	}
	return []byte(start + strings.Repeat("p", pad) + end)
}

// rawStatus sends req on a new connection to addr and returns the answer's status.
func rawStatus(t *testing.T, addr string, req []byte) int {
	t.Helper()
	return exchange(t, dialEdge(t, addr), req)
}

// dialEdge opens a connection to addr, closed at cleanup, that gives up after patience.
func dialEdge(t *testing.T, addr string) *bufConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(patience))
	return &bufConn{Conn: c, r: bufio.NewReader(c)}
}

// bufConn is a client connection with the reader its answers are parsed from.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

// exchange sends req on c and returns the status of the answer, whose body it reads.
func exchange(t *testing.T, c *bufConn, req []byte) int {
	t.Helper()
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestBodiesSurviveColdWake: request bodies sent to a sleeping route reach the woken tenant intact:
// a 10 MiB body with a Content-Length (buffered: spilled to edge.body_buffer_dir, as it is over
// edge.body_memory) and a chunked upload, on the default buffered route and on one with
// request_buffering off. The tenant echoes each body; the test compares sha256 sums.
func TestBodiesSurviveColdWake(t *testing.T) {
	dir := t.TempDir()
	buffered := appRoute{Name: "buffered", Env: map[string]string{"DEMOAPP_START_DELAY": "300ms"}}
	streamed := appRoute{Name: "streamed", Env: map[string]string{"DEMOAPP_START_DELAY": "300ms"}}
	cfg := "edge:\n  body_buffer_dir: " + dir + "\nroutes:\n" + buffered.yaml(t) +
		strings.Replace(streamed.yaml(t), "    backing: exec\n", "    backing: exec\n    request_buffering: false\n", 1)
	h := newHarness(t, cfg)

	big := make([]byte, 10<<20)
	_, _ = rand.Read(big)
	chunk := make([]byte, 1<<20)
	_, _ = rand.Read(chunk)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	type upload struct {
		host    string
		sent    []byte
		chunked bool
		err     error
	}
	var ups []*upload
	for _, app := range []appRoute{buffered, streamed} {
		ups = append(ups, &upload{host: app.host(), sent: big}, &upload{host: app.host(), sent: chunk, chunked: true})
	}
	var wg sync.WaitGroup
	for _, u := range ups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var body io.Reader = bytes.NewReader(u.sent)
			if u.chunked {
				body = io.MultiReader(body) // no length known: sent chunked
			}
			req := h.request(ctx, http.MethodPost, u.host, "/echo", body)
			if u.chunked {
				req.ContentLength = -1
			}
			resp, err := h.client.Do(req)
			if err != nil {
				u.err = err
				return
			}
			defer resp.Body.Close()
			sum := sha256.New()
			n, err := io.Copy(sum, resp.Body)
			switch {
			case err != nil:
				u.err = err
			case resp.StatusCode != http.StatusOK:
				u.err = fmt.Errorf("status %d", resp.StatusCode)
			case n != int64(len(u.sent)) || string(sum.Sum(nil)) != string(sha256Of(u.sent)):
				u.err = fmt.Errorf("echoed %d bytes whose sha256 differs from the %d sent", n, len(u.sent))
			}
		}()
	}
	wg.Wait()
	for _, u := range ups {
		if u.err != nil {
			t.Errorf("%s, chunked %v, %d bytes: %v", u.host, u.chunked, len(u.sent), u.err)
		}
	}
	for _, app := range []appRoute{buffered, streamed} {
		if spawns := h.spawns(app.Name); len(spawns) != 1 {
			t.Errorf("route %s: spawns = %v, want one cold wake", app.Name, spawns)
		}
	}
	if left, err := os.ReadDir(dir); err != nil || len(left) != 0 {
		t.Errorf("body_buffer_dir holds %v (%v), want nothing left", left, err)
	}
}

func sha256Of(b []byte) []byte {
	s := sha256.Sum256(b)
	return s[:]
}

// TestSlowClientsClosed: on both listeners, the plain one and listen_tls (its handshake done), a
// connection that sends part of a header and then nothing is closed unanswered once
// edge.header_timeout has passed, and wakes nothing; a kept-alive connection that goes quiet after
// an answer is closed once edge.keepalive_timeout has passed. The test waits for the server's close,
// bounded by patience: it never times the server.
func TestSlowClientsClosed(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	app := appRoute{Name: "slowpoke"}
	files := ca.Write(t, t.TempDir(), "s", tlstest.Leaf{Label: "S", Names: []string{app.host()}})
	tlsAddr := freeLoopbackAddr(t)
	s := startServed(t, tlsTop(tlsAddr, []registry.CertFile{files}, "edge:\n  header_timeout: 300ms\n  keepalive_timeout: 300ms\n")+configYAML(t, app))
	listeners := []struct {
		name string
		dial func(t *testing.T) net.Conn
	}{
		{"plain", func(t *testing.T) net.Conn {
			c, err := net.Dial("tcp", s.edge)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}},
		{"TLS", func(t *testing.T) net.Conn {
			c, err := tls.Dial("tcp", tlsAddr, &tls.Config{RootCAs: ca.Pool(), ServerName: app.host(), NextProtos: []string{"http/1.1"}})
			if err != nil {
				t.Fatal(err)
			}
			return c
		}},
	}
	// closedUnanswered reads c until the server closes it and reports what it sent first.
	closedUnanswered := func(t *testing.T, c net.Conn) []byte {
		t.Helper()
		_ = c.SetDeadline(time.Now().Add(patience))
		got, err := io.ReadAll(c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the connection was still open after %v", patience)
		}
		return got
	}
	for _, ln := range listeners {
		t.Run(ln.name+": a header that stops", func(t *testing.T) {
			c := ln.dial(t)
			defer c.Close()
			if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+app.host()+"\r\nX-Slow: "); err != nil {
				t.Fatal(err)
			}
			if got := closedUnanswered(t, c); len(got) != 0 {
				t.Errorf("closed after %q, want no answer", got)
			}
		})
		t.Run(ln.name+": an idle kept-alive connection", func(t *testing.T) {
			c := ln.dial(t)
			defer c.Close()
			if code := exchange(t, &bufConn{Conn: c, r: bufio.NewReader(c)}, []byte("GET / HTTP/1.1\r\nHost: nobody.test\r\n\r\n")); code != http.StatusNotFound {
				t.Fatalf("a request for no route: %d, want 404", code)
			}
			if got := closedUnanswered(t, c); len(got) != 0 {
				t.Errorf("closed after %q, want nothing more", got)
			}
		})
	}
	if st := s.status(app.Name); st.State != "asleep" || len(s.events(app.Name)) != 0 {
		t.Errorf("after the slow clients: %s with %d events, want asleep and untouched", st.State, len(s.events(app.Name)))
	}
}
