package upstream

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// strayUpstream is a raw HTTP/1.1 upstream whose first answer on its first connection is first
// (written whole, in one write); on a signal (stray) it then writes late bytes that no request asked
// for, or, with none, closes that connection. Every other request, on that connection or any other,
// is answered 200 "ok".
type strayUpstream struct {
	addr  string
	first string
	late  string
	stray chan struct{} // closed by the test: write late now
	sent  chan struct{} // closed once late is written
	conns chan struct{} // one value per connection accepted
}

func newStrayUpstream(t *testing.T, first, late string) *strayUpstream {
	t.Helper()
	u := &strayUpstream{first: first, late: late, stray: make(chan struct{}), sent: make(chan struct{}), conns: make(chan struct{}, 16)}
	u.addr = rawUpstream(t, func(c net.Conn, n int) {
		u.conns <- struct{}{}
		u.serveConn(c, n == 0)
	})
	return u
}

func (u *strayUpstream) serveConn(c net.Conn, first bool) {
	br := bufio.NewReader(c)
	for {
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		if first {
			first = false
			if _, err := c.Write([]byte(u.first)); err != nil {
				return
			}
			<-u.stray
			if u.late == "" {
				c.Close()
				close(u.sent)
				return
			}
			_, err := c.Write([]byte(u.late))
			close(u.sent)
			if err != nil {
				return
			}
			continue
		}
		if _, err := c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")); err != nil {
			return
		}
	}
}

// TestUnaskedBytesNeverAnswer: bytes an upstream sends with no request pending on the connection are
// never taken for the answer to the next request. Before the fix, a kept-alive connection went back to
// the pool with them in its socket (its reader's buffer was clean), and the next request on it, from
// any client, got them as its answer: here "forged", and from then on each client the answer to the
// client before it. nginx, HAProxy and http.Transport close an upstream connection that speaks while
// idle; so does the pool, before it writes a request on a kept-alive connection, and it tells
// OnUnasked. A connection the upstream closed while idle is dropped too, without a word: that is an
// upstream's own idle timeout.
func TestUnaskedBytesNeverAnswer(t *testing.T) {
	const forged = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged"
	body := strings.Repeat("b", 20000) // past the reader's buffer: the body is read straight from the socket
	tests := []struct {
		name      string
		first     string // the first answer, written whole
		firstBody string
		late      string // written after the first answer was taken; none: the connection is closed
		unasked   int    // OnUnasked calls
	}{
		{
			name:      "a second answer written late", // a framework's error page after the handler's answer
			first:     "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
			firstBody: "ok",
			late:      forged,
			unasked:   1,
		},
		{
			name:      "a body longer than its Content-Length", // the surplus stays in the socket
			first:     fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s%s", len(body), body, forged),
			firstBody: body,
			late:      "HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nforged2",
			unasked:   1,
		},
		{
			name:      "a body longer than its Content-Length, the surplus late",
			first:     fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body),
			firstBody: body,
			late:      forged,
			unasked:   1,
		},
		{
			name:      "a second answer in the same write", // buffered with the first: found at its end
			first:     "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + forged,
			firstBody: "ok",
			late:      "HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nforged2",
			unasked:   1,
		},
		{
			name:      "closed while idle",
			first:     "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
			firstBody: "ok",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := newStrayUpstream(t, tt.first, tt.late)
			var unasked atomic.Int64
			c := New(Options{Network: "tcp", Address: u.addr, MaxConns: 4, ErrorHandler: failed, OnUnasked: func() { unasked.Add(1) }})
			t.Cleanup(c.CloseIdle)
			get := func() (int, string) {
				w := httptest.NewRecorder()
				c.Serve(w, httptest.NewRequest(http.MethodGet, "http://app.test/", nil))
				return w.Code, w.Body.String()
			}
			if code, got := get(); code != http.StatusOK || got != tt.firstBody {
				t.Fatalf("first GET: %d, %d bytes %.20q; want 200 with the first answer's body", code, len(got), got)
			}
			close(u.stray)
			<-u.sent // on loopback the late bytes are in the pool's socket once the write has returned
			for i := range 3 {
				if code, got := get(); code != http.StatusOK || got != "ok" {
					t.Fatalf("GET %d after the unasked bytes: %d %q, want 200 \"ok\"", i+2, code, got)
				}
			}
			if n := len(u.conns); n != 2 {
				t.Errorf("the upstream saw %d connections, want 2: the spoiled one dropped, one new kept", n)
			}
			if n := unasked.Load(); n != int64(tt.unasked) {
				t.Errorf("OnUnasked called %d times, want %d", n, tt.unasked)
			}
		})
	}
}

// TestIdleCheckAllocatesNothing: the look at a kept-alive connection before each request on it
// allocates nothing. Made per call, SyscallConn's value and the closure given to Control cost three
// allocations a request on the warm path (31 to 34 in BenchmarkServeHTTP).
func TestIdleCheckAllocatesNothing(t *testing.T) {
	ln := listen(t)
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := NewConn(nc)
	defer c.Close()
	peer := <-accepted
	if peer == nil {
		t.Fatal("accept failed")
	}
	defer peer.Close()
	if st := c.idle(); st != idleQuiet {
		t.Fatalf("idle() on a silent connection = %d, want idleQuiet", st)
	}
	if n := testing.AllocsPerRun(100, func() { c.idle() }); n != 0 {
		t.Errorf("idle() allocates %.0f times a call, want 0", n)
	}
	if _, err := peer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if st := c.idle(); st != idleSpoke {
		t.Errorf("idle() with a byte waiting = %d, want idleSpoke", st)
	}
}
