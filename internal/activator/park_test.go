package activator

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/activator/activator/internal/registry"
)

// echoPath is a tenant that answers each request with its method, path, body length and body sha256,
// and counts the requests it got.
func echoPath(n *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		h := sha256.New()
		k, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%s %s %d %x", r.Method, r.URL.Path, k, h.Sum(nil))
	})
}

func echoed(method, path string, body []byte) string {
	return fmt.Sprintf("%s %s %d %x", method, path, len(body), sha256.Sum256(body))
}

// waitParked waits until the server has n requests parked (park.go), not yet handed back.
func (g *edgeRig) waitParked(t *testing.T, n int) {
	t.Helper()
	until(t, func() (bool, string) {
		g.s.parking.mu.Lock()
		got := g.s.parking.n
		g.s.parking.mu.Unlock()
		return got == n, fmt.Sprintf("parked = %d, want %d", got, n)
	})
}

// waitWatched waits until the Server's epoll watcher has n parked connections, and returns them.
func (g *edgeRig) waitWatched(t *testing.T, n int) []*parkedReq {
	t.Helper()
	var ps []*parkedReq
	h := g.s.hangups()
	until(t, func() (bool, string) {
		h.mu.Lock()
		ps = ps[:0]
		for _, p := range h.by {
			ps = append(ps, p)
		}
		h.mu.Unlock()
		return len(ps) == n, fmt.Sprintf("the epoll watcher has %d connections, want %d", len(ps), n)
	})
	return ps
}

// parkRig is an edge that parks every held request, over a route with buffered bodies whose tenant
// is echoPath(n). With ownWatch, parked requests watch their own connections (the watch goroutine)
// instead of the Server's epoll watcher.
func parkRig(t *testing.T, b *fakeBackend, n *atomic.Int64, ownWatch bool, mut func(*registry.Route)) *edgeRig {
	g := newRig(t, b, registry.EdgeLimits{}, echoPath(n), func(r *registry.Route) {
		r.RequestBuffering = true
		if mut != nil {
			mut(r)
		}
	}, 0) // every held request parks
	if ownWatch {
		g.s.hangOnce.Do(func() {}) // no hangups: Server.hangups returns nil
	}
	return g
}

// eachWatch runs f with each way a parked request notices its client leave.
func eachWatch(t *testing.T, f func(t *testing.T, ownWatch bool)) {
	t.Run("epoll", func(t *testing.T) { f(t, false) })
	t.Run("goroutine", func(t *testing.T) { f(t, true) })
}

// TestParkedRequestsAnswered holds requests of every shape that parks on a plain HTTP/1 edge while the
// wake is held back, checks that each was parked (its connection given back for the hold), then lets
// the wake finish: every one is answered by the tenant with its own method, path and body, framed
// for its method and version, and the connections stay usable as HTTP/1 keep-alive says.
func TestParkedRequestsAnswered(t *testing.T) {
	eachWatch(t, func(t *testing.T, ownWatch bool) {
		var got atomic.Int64
		b := &fakeBackend{wakeGate: make(chan struct{})}
		g := parkRig(t, b, &got, ownWatch, nil)
		big := bytes.Repeat([]byte("0123456789"), 1000)

		type held struct {
			name, method string
			raw          []byte
			late         []byte   // sent once every request is parked: the watch reads its first byte
			want         []string // the bodies of the answers, in order
			closed       bool     // the edge closes the connection after the last answer
		}
		cases := []held{
			{name: "GET, kept alive", method: "GET", raw: []byte("GET /a HTTP/1.1\r\nHost: app.test\r\n\r\n"), want: []string{echoed("GET", "/a", nil)}},
			{name: "POST with a body", method: "POST", raw: append([]byte(fmt.Sprintf("POST /up HTTP/1.1\r\nHost: app.test\r\nContent-Length: %d\r\n\r\n", len(big))), big...),
				want: []string{echoed("POST", "/up", big)}},
			// Without the framing record (no activator.Listener here) a chunked body is suspect: the answer
			// closes the connection (closingWriter), parked or not.
			{name: "chunked POST", method: "POST", raw: []byte("POST /chunked HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
				want: []string{echoed("POST", "/chunked", []byte("hello"))}, closed: true},
			{name: "HEAD", method: "HEAD", raw: []byte("HEAD /h HTTP/1.1\r\nHost: app.test\r\n\r\n"), want: []string{""}},
			{name: "HTTP/1.0", method: "GET", raw: []byte("GET /old HTTP/1.0\r\nHost: app.test\r\n\r\n"), want: []string{echoed("GET", "/old", nil)}, closed: true},
			{name: "Connection: close", method: "GET", raw: []byte("GET /bye HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n"), want: []string{echoed("GET", "/bye", nil)}, closed: true},
			// The second request arrives with the first: net/http has buffered it when the first parks.
			{name: "pipelined", method: "GET", raw: []byte("GET /one HTTP/1.1\r\nHost: app.test\r\n\r\nPOST /two HTTP/1.1\r\nHost: app.test\r\nContent-Length: 3\r\n\r\nabc"),
				want: []string{echoed("GET", "/one", nil), echoed("POST", "/two", []byte("abc"))}},
			{name: "sent while parked", method: "GET", raw: []byte("GET /first HTTP/1.1\r\nHost: app.test\r\n\r\n"),
				late: []byte("POST /late HTTP/1.1\r\nHost: app.test\r\nContent-Length: 3\r\n\r\nxyz"),
				want: []string{echoed("GET", "/first", nil), echoed("POST", "/late", []byte("xyz"))}},
		}
		conns := make([]*bufio.Reader, len(cases))
		raw := make([]interface{ Write([]byte) (int, error) }, len(cases))
		for i, c := range cases {
			cn := g.dial(t)
			if _, err := cn.Write(c.raw); err != nil {
				t.Fatal(err)
			}
			conns[i], raw[i] = bufio.NewReader(cn), cn
		}
		g.waitHeld(t, int64(len(cases)))
		g.waitParked(t, len(cases))
		if !ownWatch {
			g.waitWatched(t, len(cases))
		}
		for i, c := range cases {
			if c.late != nil {
				if _, err := raw[i].Write(c.late); err != nil {
					t.Fatal(err)
				}
			}
		}
		if n := got.Load(); n != 0 {
			t.Fatalf("the tenant got %d requests while asleep", n)
		}
		close(b.wakeGate)
		for i, c := range cases {
			for k, want := range c.want {
				method := c.method
				if k > 0 {
					method = "POST"
				}
				rep, err := readReply(conns[i], method)
				if err != nil {
					t.Fatalf("%s: answer %d: %v", c.name, k+1, err)
				}
				if rep.code != http.StatusOK || rep.body != want {
					t.Errorf("%s: answer %d = %d %q, want 200 %q", c.name, k+1, rep.code, rep.body, want)
				}
				if last := k == len(c.want)-1; last && rep.closed != c.closed {
					t.Errorf("%s: connection closed after the answer = %v, want %v", c.name, rep.closed, c.closed)
				}
				if c.method == "HEAD" && rep.h.Get("Content-Length") == "" {
					t.Errorf("%s: no Content-Length in the answer to HEAD: %v", c.name, rep.h)
				}
			}
			if c.closed {
				if _, err := conns[i].ReadByte(); err != io.EOF {
					t.Errorf("%s: the connection stayed open after its last answer (read: %v)", c.name, err)
				}
				continue
			}
			// The connection goes on as any kept-alive one: its next request goes through the edge.
			if _, err := raw[i].Write([]byte("GET /again HTTP/1.1\r\nHost: app.test\r\n\r\n")); err != nil {
				t.Fatal(err)
			}
			rep, err := readReply(conns[i], "GET")
			if err != nil || rep.code != http.StatusOK || rep.body != echoed("GET", "/again", nil) {
				t.Errorf("%s: next request on the connection: %v %d %q", c.name, err, rep.code, rep.body)
			}
		}
		g.waitParked(t, 0)
		if st := g.in.status(); st.Held != 0 || st.InFlight != 0 {
			t.Errorf("after the answers: held %d, in flight %d", st.Held, st.InFlight)
		}
	})
}

// TestParkedAgain: a kept-alive connection whose requests are parked one hold after another is
// parked itself each time, not wrapped once more in the last hold's hand-back.
func TestParkedAgain(t *testing.T) {
	var got atomic.Int64
	b := &fakeBackend{}
	g := parkRig(t, b, &got, false, nil)
	c := g.dial(t)
	br := bufio.NewReader(c)
	for i := range 4 {
		if err := g.s.Sleep(context.Background(), "app"); err != nil {
			t.Fatal(err)
		}
		gate := make(chan struct{})
		b.set(func(f *fakeBackend) { f.wakeGate = gate })
		path := fmt.Sprintf("/%d", i)
		if _, err := c.Write([]byte("GET " + path + " HTTP/1.1\r\nHost: app.test\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		for _, p := range g.waitWatched(t, 1) {
			if _, ok := p.conn.(*resumedConn); ok {
				t.Errorf("request %d: parked on the last hold's hand-back wrapper", i)
			}
		}
		close(gate)
		rep, err := readReply(br, "GET")
		if err != nil || rep.code != http.StatusOK || rep.body != echoed("GET", path, nil) {
			t.Fatalf("request %d: %v %d %q", i, err, rep.code, rep.body)
		}
	}
}

// TestParkedClientGone: a client that hangs up while its request is parked gives the hold up, as one
// held in net/http does, and the tenant never sees the request.
func TestParkedClientGone(t *testing.T) {
	eachWatch(t, func(t *testing.T, ownWatch bool) {
		var got atomic.Int64
		b := &fakeBackend{wakeGate: make(chan struct{})}
		g := parkRig(t, b, &got, ownWatch, nil)
		c := g.dial(t)
		if err := send(c, "GET /gone HTTP/1.1\nHost: app.test", nil); err != nil {
			t.Fatal(err)
		}
		g.waitParked(t, 1)
		c.Close()
		g.waitHeld(t, 0)
		g.waitParked(t, 0)
		close(b.wakeGate)
		if code, _, body := g.get(t, "/next", nil); code != http.StatusOK || body != echoed("GET", "/next", nil) {
			t.Fatalf("after the hang-up: %d %q", code, body)
		}
		if n := got.Load(); n != 1 {
			t.Fatalf("the tenant got %d requests, want 1 (the hung-up one never sent)", n)
		}
	})
}

// TestParkedHalfClosedGivenUp: a parked request whose client half-closes is given up as one held in
// net/http is (TestHeldClientGoneGetsNoFakeAnswer): the edge cannot tell the FIN from a departure. The
// client reads no answer, not a made-up one, and nothing stays held.
func TestParkedHalfClosedGivenUp(t *testing.T) {
	eachWatch(t, func(t *testing.T, ownWatch bool) {
		var got atomic.Int64
		b := &fakeBackend{wakeGate: make(chan struct{})}
		defer close(b.wakeGate)
		g := parkRig(t, b, &got, ownWatch, nil)
		c := g.dial(t)
		if err := send(c, "GET /half HTTP/1.1\nHost: app.test", nil); err != nil {
			t.Fatal(err)
		}
		g.waitParked(t, 1)
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		if got, err := io.ReadAll(c); len(got) != 0 {
			t.Errorf("the half-closed client read %q (%v), want no answer", got, err)
		}
		g.waitHeld(t, 0)
		g.waitParked(t, 0)
	})
}

// TestParkedErrors: a parked request whose hold ends without the tenant gets the edge's answer for
// it: 504 once hold.max_time is over, 503 with Retry-After when the activator shuts down.
func TestParkedErrors(t *testing.T) {
	eachWatch(t, func(t *testing.T, ownWatch bool) {
		t.Run("hold timeout", func(t *testing.T) {
			var got atomic.Int64
			g := parkRig(t, &fakeBackend{wakeGate: make(chan struct{})}, &got, ownWatch, func(r *registry.Route) { r.Hold.MaxTime = 50 * time.Millisecond })
			c := g.dial(t)
			if err := send(c, "GET / HTTP/1.1\nHost: app.test", nil); err != nil {
				t.Fatal(err)
			}
			rep, err := answer(c)
			if err != nil || rep.code != http.StatusGatewayTimeout {
				t.Fatalf("answer: %v %d %q, want 504", err, rep.code, rep.body)
			}
			g.waitParked(t, 0)
		})
		t.Run("shutdown", func(t *testing.T) {
			var got atomic.Int64
			g := parkRig(t, &fakeBackend{wakeGate: make(chan struct{})}, &got, ownWatch, nil)
			c := g.dial(t)
			if err := send(c, "GET / HTTP/1.1\nHost: app.test", nil); err != nil {
				t.Fatal(err)
			}
			g.waitParked(t, 1)
			done := make(chan error, 1)
			go func() { done <- g.s.Shutdown(context.Background()) }()
			rep, err := answer(c)
			if err != nil || rep.code != http.StatusServiceUnavailable || rep.h.Get("Retry-After") == "" {
				t.Fatalf("answer: %v %d %v %q, want 503 with Retry-After", err, rep.code, rep.h, rep.body)
			}
			if err := <-done; err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
		})
	})
}

// TestNotParked: what net/http could not carry across the hand-back holds in its own goroutine, as
// before: an Upgrade request, and a body that is streamed rather than buffered.
func TestNotParked(t *testing.T) {
	for _, tc := range []struct {
		name, head string
		body       []byte
		buffering  bool
	}{
		{"upgrade", "GET /ws HTTP/1.1\nHost: app.test\nConnection: Upgrade\nUpgrade: websocket", nil, true},
		{"streamed body", "POST /s HTTP/1.1\nHost: app.test\nContent-Length: 3", []byte("abc"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got atomic.Int64
			b := &fakeBackend{wakeGate: make(chan struct{})}
			g := parkRig(t, b, &got, false, func(r *registry.Route) { r.RequestBuffering = tc.buffering })
			c := g.dial(t)
			if err := send(c, tc.head, tc.body); err != nil {
				t.Fatal(err)
			}
			g.waitHeld(t, 1)
			g.waitParked(t, 0)
			close(b.wakeGate)
			rep, err := answer(c)
			method, path, _ := strings.Cut(tc.head, " ")
			path, _, _ = strings.Cut(path, " ")
			if err != nil || rep.code != http.StatusOK || rep.body != echoed(method, path, tc.body) {
				t.Fatalf("answer: %v %d %q", err, rep.code, rep.body)
			}
		})
	}
}

// BenchmarkHeldRequest is one request to a sleeping route through a real edge on loopback, its wake
// instant (a fake backend and gate): held in net/http, and parked, whose difference is what the
// hand-back costs an answer. The route is put back to sleep between requests, off the clock.
func BenchmarkHeldRequest(b *testing.B) {
	for _, bc := range []struct {
		name      string
		parkAbove int64
	}{{"net/http", -1}, {"parked", 0}} {
		b.Run(bc.name, func(b *testing.B) {
			var got atomic.Int64
			g := newRig(b, &fakeBackend{}, registry.EdgeLimits{}, echoPath(&got), func(r *registry.Route) { r.RequestBuffering = true }, bc.parkAbove)
			c, err := net.Dial("tcp", g.addr)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			req := []byte("GET /b HTTP/1.1\r\nHost: app.test\r\n\r\n")
			ctx := context.Background()
			for b.Loop() {
				b.StopTimer()
				if err := g.s.Sleep(ctx, "app"); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if _, err := c.Write(req); err != nil {
					b.Fatal(err)
				}
				rep, err := readReply(br, "GET")
				if err != nil || rep.code != http.StatusOK {
					b.Fatalf("%v %d %q", err, rep.code, rep.body)
				}
			}
		})
	}
}

// TestParkedDroppedUnanswered: a resumed connection that net/http closes before its handler ran (the
// resume server shutting down between reading the stand-in and serving it) still answers its parked
// request: 503 with Retry-After, counted, and no longer waited for by Shutdown.
func TestParkedDroppedUnanswered(t *testing.T) {
	s := &Server{}
	if !s.parking.add() {
		t.Fatal("parking closed")
	}
	edge, client := net.Pipe()
	defer client.Close()
	_, cancel := context.WithCancel(context.Background())
	var counted atomic.Int64
	p := &parkedReq{s: s, conn: edge, cancel: cancel, rt: &routed{count: func(code int) { counted.Store(int64(code)) }}}
	rc := &resumedConn{Conn: edge}
	rc.p.Store(p)
	closed := make(chan error, 1)
	go func() { closed <- rc.Close() }()
	rep, err := answer(client)
	if err != nil || rep.code != http.StatusServiceUnavailable || rep.h.Get("Retry-After") == "" || !rep.closed {
		t.Fatalf("answer: %v %d %v", err, rep.code, rep.h)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := counted.Load(); got != http.StatusServiceUnavailable {
		t.Errorf("counted %d, want 503", got)
	}
	if err := s.parking.wait(context.Background()); err != nil {
		t.Errorf("still waited for: %v", err)
	}
	if _, err := client.Write([]byte("x")); err == nil {
		t.Errorf("the connection is still open after Close")
	}
}
