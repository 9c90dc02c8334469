package upstream

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

// connEvents is an upstream server that reports its connections opening and closing.
type connEvents struct {
	addr           string
	opened, closed chan string // remote addresses; buffered generously
}

func newConnEvents(t *testing.T) *connEvents {
	t.Helper()
	ev := &connEvents{opened: make(chan string, 1024), closed: make(chan string, 1024)}
	ln := listen(t)
	ev.addr = ln.Addr().String()
	serve(t, &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }),
		ConnState: func(c net.Conn, s http.ConnState) {
			switch s {
			case http.StateNew:
				ev.opened <- c.RemoteAddr().String()
			case http.StateClosed:
				ev.closed <- c.RemoteAddr().String()
			}
		},
	}, ln)
	return ev
}

// getOK makes a GET through c and fails the test unless it answers 200 "ok".
func getOK(t *testing.T, c *Client) {
	t.Helper()
	w := httptest.NewRecorder()
	c.Serve(w, httptest.NewRequest(http.MethodGet, "http://app.test/", nil))
	if w.Code != http.StatusOK || w.Body.String() != "ok" {
		t.Fatalf("GET: %d %q", w.Code, w.Body)
	}
}

// idleCount reports the pool's idle connections and whether its reaper is armed.
func idleCount(p *pool) (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle), p.reaper != nil
}

// TestCloseIdle: CloseIdle closes every idle connection (the upstream sees each one closed) and
// stops the reaper, leaving no goroutine behind; a request after it dials a new connection and works.
func TestCloseIdle(t *testing.T) {
	ev := newConnEvents(t)
	before := goleak.IgnoreCurrent()
	c := New(Options{Network: "tcp", Address: ev.addr, MaxConns: 8, ErrorHandler: failed})
	// Four requests, as if at once: each takes a connection before any gives one back, so each dials.
	const n = 4
	var conns []*Conn
	for range n {
		conn, err := c.pool.conn(t.Context(), false)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
	}
	for _, conn := range conns {
		resp, err := c.pool.exchange(httptest.NewRequest(http.MethodGet, "http://app.test/", nil), &forwarding{}, conn, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	opened := map[string]bool{}
	for range n {
		opened[<-ev.opened] = true
	}
	if idle, armed := idleCount(c.pool); idle != n || !armed {
		t.Fatalf("before CloseIdle: %d idle connections, reaper armed %v; want %d and true", idle, armed, n)
	}

	c.CloseIdle()
	if idle, armed := idleCount(c.pool); idle != 0 || armed {
		t.Errorf("after CloseIdle: %d idle connections, reaper armed %v; want none", idle, armed)
	}
	for range n {
		if a := <-ev.closed; !opened[a] {
			t.Errorf("upstream saw %s closed, not one of the pooled connections", a)
		}
	}
	if len(c.pool.slots) != 0 {
		t.Errorf("%d connection slots still taken", len(c.pool.slots))
	}
	goleak.VerifyNone(t, before)

	// The Client stays usable: the next request dials anew.
	getOK(t, c)
	if a := <-ev.opened; opened[a] {
		t.Errorf("the request after CloseIdle went out on %s, an old connection", a)
	}
	c.CloseIdle()
	<-ev.closed
}

// TestCloseIdleNever: CloseIdle on a Client that never made a request does nothing and starts
// nothing.
func TestCloseIdleNever(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := New(Options{Network: "tcp", Address: "127.0.0.1:1", MaxConns: 1})
	c.CloseIdle()
	if idle, armed := idleCount(c.pool); idle != 0 || armed {
		t.Errorf("%d idle connections, reaper armed %v", idle, armed)
	}
}

// TestReaper: connections idle for idleTimeout are closed, and the reaper disarms once none is left.
// The connections are pipes adopted into the pool, so the test runs on synctest's clock.
func TestReaper(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(Options{Network: "tcp", Address: "127.0.0.1:1", MaxConns: 4})
		var peers []net.Conn
		for i := range 2 {
			if i > 0 {
				time.Sleep(time.Second)
			}
			a, b := net.Pipe()
			c.Adopt(a)
			peers = append(peers, b)
		}
		time.Sleep(c.pool.idleTimeout - time.Second/2) // the first is due, the second not yet
		synctest.Wait()
		if idle, armed := idleCount(c.pool); idle != 1 || !armed {
			t.Errorf("after the first's timeout: %d idle, reaper armed %v; want 1 and true", idle, armed)
		}
		if _, err := peers[0].Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("the first connection's peer read %v, want EOF (closed)", err)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if idle, armed := idleCount(c.pool); idle != 0 || armed {
			t.Errorf("after both timeouts: %d idle, reaper armed %v; want none", idle, armed)
		}
		if _, err := peers[1].Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("the second connection's peer read %v, want EOF (closed)", err)
		}
	})
}

// TestAdopt: a connection a probe made with Conn.Get is taken by the pool and carries the next
// request, with no new dial; one with unread bytes is closed instead, and OnUnasked told, as the pool
// tells it of a kept-alive connection that spoke unasked.
func TestAdopt(t *testing.T) {
	ev := newConnEvents(t)
	var unasked atomic.Int32
	c := New(Options{Network: "tcp", Address: ev.addr, MaxConns: 4, ErrorHandler: failed, OnUnasked: func() { unasked.Add(1) }})
	t.Cleanup(c.CloseIdle)
	probe := func() *Conn {
		nc, err := net.Dial("tcp", ev.addr)
		if err != nil {
			t.Fatal(err)
		}
		<-ev.opened
		conn := NewConn(nc)
		resp, _, err := conn.Get([]byte("GET /healthz HTTP/1.1\r\nHost: app.test\r\n\r\n"))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "ok" || !conn.Clean() {
			t.Fatalf("probe: %d %q, clean %v", resp.StatusCode, b, conn.Clean())
		}
		return conn
	}
	c.Adopt(probe())
	getOK(t, c)
	select {
	case a := <-ev.opened:
		t.Errorf("the request after Adopt dialed %s", a)
	default:
	}

	dirty := probe()
	dirty.br = bufio.NewReader(strings.NewReader("HTTP/1.1 200 OK\r\n")) // as if the tenant sent more
	if _, err := dirty.br.Peek(1); err != nil {
		t.Fatal(err)
	}
	c.Adopt(dirty)
	if idle, _ := idleCount(c.pool); idle != 1 {
		t.Errorf("%d idle connections after adopting one with unread bytes, want 1 (the first)", idle)
	}
	<-ev.closed
	if n := unasked.Load(); n != 1 {
		t.Errorf("OnUnasked called %d times, want 1: for the connection with unread bytes", n)
	}
}

// TestDialLimit: a burst of requests on a Client with no connections yet dials at most maxDials at
// once and never opens more than its cap; requests that find no token take connections handed back
// by the others. The dialer's Control hook holds every dial until maxDials are in flight, so a 33rd
// concurrent dial would be seen.
func TestDialLimit(t *testing.T) {
	ln := listen(t)
	var accepted sync.Map
	serve(t, &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		ConnState: func(c net.Conn, s http.ConnState) {
			if s == http.StateNew {
				accepted.Store(c.RemoteAddr().String(), true)
			}
		},
	}, ln)

	const conns, requests = 64, 300
	c := New(Options{Network: "tcp", Address: ln.Addr().String(), MaxConns: conns, ErrorHandler: failed})
	t.Cleanup(c.CloseIdle)
	var (
		mu       sync.Mutex
		inFlight int
		maxSeen  int
		full     = make(chan struct{})
		fullOnce sync.Once
		release  = make(chan struct{})
	)
	c.pool.dialer.Control = func(string, string, syscall.RawConn) error {
		mu.Lock()
		inFlight++
		maxSeen = max(maxSeen, inFlight)
		if inFlight == maxDials {
			fullOnce.Do(func() { close(full) }) // later dials, after the release, may reach it again
		}
		mu.Unlock()
		<-release
		mu.Lock()
		inFlight--
		mu.Unlock()
		return nil
	}
	var wg sync.WaitGroup
	for range requests {
		wg.Go(func() {
			w := httptest.NewRecorder()
			c.Serve(w, httptest.NewRequest(http.MethodGet, "http://app.test/", nil))
			if w.Code != http.StatusOK {
				t.Errorf("request: %d %q", w.Code, w.Body)
			}
		})
	}
	<-full
	close(release)
	wg.Wait()
	if maxSeen > maxDials {
		t.Errorf("%d dials in flight at once, want at most %d", maxSeen, maxDials)
	}
	n := 0
	accepted.Range(func(any, any) bool { n++; return true })
	if n > conns {
		t.Errorf("%d upstream connections opened, want at most %d", n, conns)
	}
	t.Logf("%d requests over %d connections", requests, n)
}

// TestImports: the upstream client knows nothing of the edge's state machine or of health probing
// (health imports upstream, not the other way round).
func TestImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/activator/activator/") && dep != "github.com/activator/activator/internal/upstream" {
			t.Errorf("internal/upstream depends on %s", dep)
		}
	}
}
