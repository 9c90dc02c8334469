package connlimit

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
)

// patience bounds every wait of these tests, so that a failing one ends; none is a timing assertion.
const patience = 30 * time.Second

// served is an http.Server on loopback behind a Limit.
type served struct {
	addr  string
	limit *Limit
	ln    net.Listener
	reads chan int      // how many bytes each read of a served connection got, while there is room
	idled chan struct{} // a value each time a connection goes idle (after the Limit knows), while there is room
	done  chan error    // Serve's result
}

// readsListener accepts connections that tell reads how much each of their reads got.
type readsListener struct {
	net.Listener
	reads chan<- int
}

func (l *readsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &readsConn{TCPConn: c.(*net.TCPConn), reads: l.reads}, nil
}

// readsConn is a *net.TCPConn (its SyscallConn kept, for unreadBytes) that tells reads what it read.
type readsConn struct {
	*net.TCPConn
	reads chan<- int
}

func (c *readsConn) Read(b []byte) (int, error) {
	n, err := c.TCPConn.Read(b)
	if n > 0 {
		select {
		case c.reads <- n:
		default: // nobody is counting
		}
	}
	return n, err
}

func serve(t *testing.T, n int, full func(Stats), h http.Handler) *served {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(n, full)
	s := &served{addr: raw.Addr().String(), limit: l, reads: make(chan int, 1024), idled: make(chan struct{}, 1024), done: make(chan error, 1)}
	s.ln = l.Listener(&readsListener{Listener: raw, reads: s.reads})
	srv := &http.Server{Handler: h, ConnState: func(c net.Conn, st http.ConnState) {
		l.ConnState(c, st)
		if st == http.StateIdle {
			select {
			case s.idled <- struct{}{}:
			default: // nobody is counting
			}
		}
	}}
	go func() { s.done <- srv.Serve(s.ln) }()
	t.Cleanup(func() {
		srv.Close()
		<-s.done
	})
	return s
}

// client is one connection to a served.
type client struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dial(t *testing.T, s *served) *client {
	t.Helper()
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{t: t, c: c, br: bufio.NewReader(c)}
}

func (c *client) send(path string) {
	c.t.Helper()
	if _, err := io.WriteString(c.c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		c.t.Fatalf("GET %s: %v", path, err)
	}
}

// answer reads one answer and returns its body.
func (c *client) answer() string {
	c.t.Helper()
	_ = c.c.SetReadDeadline(time.Now().Add(patience))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		c.t.Fatalf("reading an answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return string(b)
}

func (c *client) get(path string) string { c.t.Helper(); c.send(path); return c.answer() }

// closedByServer reports whether the server closed c: a read gets EOF (or a reset) within patience.
func (c *client) closedByServer() bool {
	c.t.Helper()
	_ = c.c.SetReadDeadline(time.Now().Add(patience))
	_, err := c.br.ReadByte()
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// waits returns a channel that gets a value each time an Accept of s begins to wait for room.
func waits(s *served) <-chan struct{} {
	ch := make(chan struct{}, 8)
	s.limit.mu.Lock()
	s.limit.onWait = func() { ch <- struct{}{} }
	s.limit.mu.Unlock()
	return ch
}

// wait fails t unless ch gets a value within patience.
func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(patience):
		t.Fatalf("%s: not within %v", what, patience)
	}
}

func ok(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok "+r.URL.Path) }

// At the cap, a new connection is served after the connection idle longest is closed; the younger
// idle ones stay.
func TestIdleClosedForRoom(t *testing.T) {
	s := serve(t, 3, nil, http.HandlerFunc(ok))
	cs := []*client{dial(t, s), dial(t, s), dial(t, s)}
	// Each answer reaches its client before its server goroutine reports the connection idle: wait for
	// that, or the order the Limit sees may not be the order of the answers.
	for _, c := range cs {
		c.get("/")
		wait(t, s.idled, "the connection going idle")
	}
	cs[0].get("/again") // cs[0] is now the youngest idle: cs[1] is the oldest
	wait(t, s.idled, "the connection going idle again")
	if got := dial(t, s).get("/new"); got != "ok /new" {
		t.Fatalf("a fourth connection at a cap of 3 got %q, want it served", got)
	}
	if !cs[1].closedByServer() {
		t.Fatal("the connection idle longest was not closed for room")
	}
	for _, i := range []int{0, 2} {
		if got := cs[i].get("/still"); got != "ok /still" {
			t.Fatalf("connection %d: %q after another was closed for room", i, got)
		}
	}
	if st := s.limit.Stats(); st.Open != 3 || st.Closed != 1 {
		t.Fatalf("stats %+v, want 3 open and 1 closed for room", st)
	}
}

// A connection accepted that has not sent a whole request header yet (a silent client, or one
// trickling its header) may be closed for room as an idle one may, once its grace is over (none here).
func TestSilentClosedForRoom(t *testing.T) {
	for _, sent := range []string{"", "GET / HTTP/1.1\r\nHost: x\r\nX-Half: "} {
		s := serve(t, 1, nil, http.HandlerFunc(ok))
		setGrace(s, 0)
		slow := dial(t, s) // accepted before the next, which then finds it open and not yet in a request
		if _, err := io.WriteString(slow.c, sent); err != nil {
			t.Fatal(err)
		}
		readAll(t, s, len(sent)) // else the half header is a request on its way in, which is not closed
		if got := dial(t, s).get("/"); got != "ok /" {
			t.Fatalf("after %q: got %q", sent, got)
		}
		if !slow.closedByServer() {
			t.Fatalf("the connection that had sent %q was not closed for room", sent)
		}
	}
}

// readAll waits until s's server has read n bytes (what its one client sent), from the start.
func readAll(t *testing.T, s *served, n int) {
	t.Helper()
	deadline := time.After(patience)
	for got := 0; got < n; {
		select {
		case k := <-s.reads:
			got += k
		case <-deadline:
			t.Fatalf("the server read %d of the %d bytes sent, in %v", got, n, patience)
		}
	}
}

// When every connection is in a request, a new one waits, unserved, until one goes idle (and is then
// closed for it) or closes; a hijacked connection counts until it closes.
func TestWaitsWhileAllBusy(t *testing.T) {
	release, release2 := make(chan struct{}), make(chan struct{})
	entered := make(chan string, 2)
	hijacked := make(chan net.Conn, 1)
	s := serve(t, 2, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/block":
			entered <- r.URL.Path
			<-release
		case "/block2":
			entered <- r.URL.Path
			<-release2
		case "/hijack":
			c, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			hijacked <- c
			return
		}
		ok(w, r)
	}))
	busy, taken := dial(t, s), dial(t, s)
	busy.send("/block")
	<-entered
	taken.send("/hijack")
	hc := <-hijacked
	waited := waits(s)
	waiter := dial(t, s)
	waiter.send("/w")
	wait(t, waited, "the third connection waiting")

	close(release) // busy's request ends: it goes idle, and is closed for the waiter
	if got := busy.answer(); got != "ok /block" {
		t.Fatalf("busy: %q", got)
	}
	if got := waiter.answer(); got != "ok /w" {
		t.Fatalf("waiter: %q", got)
	}
	if !busy.closedByServer() {
		t.Fatal("busy, idle after its answer, was not closed for the waiter")
	}

	// Now the waiter is idle and the hijacked connection is out of the server's hands: a new
	// connection takes the waiter's place; while it is in a request, one more waits for the hijacked
	// connection to close.
	third := dial(t, s)
	third.send("/block2")
	<-entered
	if !waiter.closedByServer() {
		t.Fatal("the waiter, idle, was not closed for a third connection")
	}
	fourth := dial(t, s)
	fourth.send("/4")
	wait(t, waited, "a connection waiting behind a busy one and a hijacked one")
	hc.Close()
	if got := fourth.answer(); got != "ok /4" {
		t.Fatalf("fourth: %q", got)
	}
	close(release2)
	if got := third.answer(); got != "ok /block2" {
		t.Fatalf("third: %q", got)
	}
	if st := s.limit.Stats(); st.Open > 2 {
		t.Fatalf("stats %+v: more open than the cap", st)
	}
}

// Closing the listener ends a wait for room and closes the connection that waited.
func TestCloseEndsWait(t *testing.T) {
	release, entered := make(chan struct{}), make(chan struct{})
	defer close(release)
	s := serve(t, 1, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { close(entered); <-release }))
	dial(t, s).send("/block")
	<-entered
	waited := waits(s)
	waiter := dial(t, s)
	wait(t, waited, "the second connection waiting")
	s.ln.Close()
	select {
	case err := <-s.done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Serve returned %v, want net.ErrClosed", err)
		}
		s.done <- err // for the cleanup
	case <-time.After(patience):
		t.Fatal("Serve did not return after its listener closed")
	}
	if !waiter.closedByServer() {
		t.Fatal("the waiting connection was not closed with the listener")
	}
}

// The full callback is told once, with the cap reached, however many connections then arrive.
func TestFullToldOnce(t *testing.T) {
	var mu sync.Mutex
	var told []Stats
	s := serve(t, 1, func(st Stats) { mu.Lock(); told = append(told, st); mu.Unlock() }, http.HandlerFunc(ok))
	for range 3 {
		dial(t, s).get("/")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(told) != 1 || told[0].Open != 1 || told[0].Max != 1 {
		t.Fatalf("told %+v, want once with 1 open of 1", told)
	}
}

// counted finds the Limit's connection under a *tls.Conn, so that closing for room does not write a
// close_notify alert to a client that may not read it.
func TestCountedUnderTLS(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	c := &conn{Conn: a, l: New(1, nil)}
	if got := counted(tls.Server(c, &tls.Config{})); got != c {
		t.Fatalf("counted under tls.Server: %v, want the Limit's conn", got)
	}
	if got := counted(a); got != nil {
		t.Fatalf("counted of a connection not the Limit's: %v, want nil", got)
	}
}

// An HTTP/2 connection (h2c, prior knowledge, as the edge serves it) may be closed for room once it
// has no stream open, and not while one is: net/http's HTTP/2 server reports its connections' states
// to the same ConnState hook.
func TestHTTP2IdleClosedForRoom(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	l := New(2, nil)
	entered, release := make(chan struct{}), make(chan struct{})
	srv := &http.Server{ConnState: l.ConnState, Protocols: &protos, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			close(entered)
			<-release
		}
		io.WriteString(w, r.Proto)
	})}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l.Listener(raw)) }()
	t.Cleanup(func() { srv.Close(); <-done })

	// h2 returns an HTTP/2-only client, and a channel closed when its connection is closed by the
	// server (its read loop, always reading, gets EOF).
	h2 := func() (*http.Client, <-chan struct{}) {
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		gone := make(chan struct{})
		tr := &http.Transport{Protocols: &p, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &eofConn{Conn: c, gone: gone}, nil
		}}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: patience}, gone
	}
	try := func(c *http.Client, path string) string { // the body, or the error's text
		resp, err := c.Get("http://" + raw.Addr().String() + path)
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}

	// busy goes idle first, then idle does: were busy's stream not seen, busy would be the one
	// idle longest.
	busy, busyGone := h2()
	idle, idleGone := h2()
	for _, c := range []*http.Client{busy, idle} {
		if got := try(c, "/"); got != "HTTP/2.0" {
			t.Fatalf("the h2c client got %q, want HTTP/2.0", got)
		}
	}
	busyAnswer := make(chan string, 1)
	go func() { busyAnswer <- try(busy, "/block") }()
	wait(t, entered, "the busy stream reaching its handler")

	if got := dial(t, &served{addr: raw.Addr().String()}).get("/new"); got != "HTTP/1.1" {
		t.Fatalf("a third connection at a cap of 2: %q", got)
	}
	wait(t, idleGone, "the idle HTTP/2 connection closed for room")
	close(release)
	select {
	case got := <-busyAnswer:
		if got != "HTTP/2.0" {
			t.Fatalf("the busy stream got %q", got)
		}
	case <-busyGone:
		t.Fatal("the HTTP/2 connection with a stream open was closed for room")
	case <-time.After(patience):
		t.Fatal("the busy stream got no answer")
	}
	if st := l.Stats(); st.Closed != 1 {
		t.Fatalf("stats %+v, want 1 closed for room", st)
	}
}

// eofConn closes gone when a read of the connection fails.
type eofConn struct {
	net.Conn
	once sync.Once
	gone chan struct{}
}

func (c *eofConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		c.once.Do(func() { close(c.gone) })
	}
	return n, err
}

// setGrace sets s's Limit's grace for fresh connections.
func setGrace(s *served, d time.Duration) {
	s.limit.mu.Lock()
	s.limit.grace = d
	s.limit.mu.Unlock()
}

// A connection that has sent nothing yet is kept for its grace: a new one at the cap waits, and is
// served when the first closes, which is not counted as closed for room.
func TestFreshKeptForItsGrace(t *testing.T) {
	s := serve(t, 1, nil, http.HandlerFunc(ok))
	setGrace(s, time.Hour)
	waited := waits(s)
	silent := dial(t, s) // StateNew before the next Accept: net/http sets it in its accept loop
	next := dial(t, s)
	next.send("/next")
	wait(t, waited, "a connection at the cap waiting while the other is within its grace")
	if st := s.limit.Stats(); st.Closed != 0 || st.Waiting != 1 {
		t.Fatalf("stats %+v, want none closed for room and one waiting", st)
	}
	silent.c.Close()
	if got := next.answer(); got != "ok /next" {
		t.Fatalf("after the silent one closed: %q", got)
	}
	if st := s.limit.Stats(); st.Closed != 0 {
		t.Fatalf("stats %+v, want none closed for room", st)
	}
}

// Once its grace is over, a connection that has sent nothing is closed for the one waiting.
func TestFreshClosedAfterItsGrace(t *testing.T) {
	s := serve(t, 1, nil, http.HandlerFunc(ok))
	setGrace(s, 50*time.Millisecond)
	silent := dial(t, s)
	if got := dial(t, s).get("/next"); got != "ok /next" {
		t.Fatalf("got %q", got)
	}
	if !silent.closedByServer() {
		t.Fatal("the silent connection was not closed for room after its grace")
	}
	if st := s.limit.Stats(); st.Closed != 1 {
		t.Fatalf("stats %+v, want one closed for room", st)
	}
}

// capped is a Limit of one connection, with a grace of a millisecond for fresh ones, over a loopback
// listener the test accepts from itself (playing the server, which reports states by hand), and one
// connection accepted.
type capped struct {
	l      *Limit
	ln     net.Listener
	addr   string
	waited chan struct{}
	client net.Conn // the client side of c
	c      net.Conn // accepted
}

func newCapped(t *testing.T) *capped {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	k := &capped{l: New(1, nil), addr: raw.Addr().String(), waited: make(chan struct{}, 1)}
	k.l.grace = time.Millisecond // short, not 0: an arriving connection starts its grace again
	k.l.onWait = func() {
		select {
		case k.waited <- struct{}{}:
		default: // the grace's timer wakes the wait again and again
		}
	}
	k.ln = k.l.Listener(raw)
	t.Cleanup(func() { k.ln.Close() })
	if k.client, err = net.Dial("tcp", k.addr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.client.Close() })
	if k.c, err = k.ln.Accept(); err != nil {
		t.Fatal(err)
	}
	return k
}

// second dials a second connection and accepts it in the background: it arrives on the channel
// returned once the Limit has made room (nil if Accept failed).
func (k *capped) second(t *testing.T) <-chan net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", k.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		c2, err := k.ln.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c2
	}()
	return accepted
}

// closedForRoom waits for the second connection to be accepted and checks that the first was closed
// for it.
func (k *capped) closedForRoom(t *testing.T, accepted <-chan net.Conn) {
	t.Helper()
	select {
	case c2 := <-accepted:
		if c2 != nil {
			c2.Close()
		}
	case <-time.After(patience):
		t.Fatal("the second connection was not accepted once the first was idle")
	}
	_ = k.client.SetReadDeadline(time.Now().Add(patience))
	if _, err := k.client.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the first connection, idle, was not closed for room: %v", err)
	}
	if st := k.l.Stats(); st.Closed != 1 {
		t.Fatalf("stats %+v, want one closed for room", st)
	}
}

// A connection handed to a server in the middle of a request (ResumedConnState: a parked one handed
// back) is in that request from its StateNew, and is not closed for room until it is idle.
func TestResumedNotClosedForRoom(t *testing.T) {
	k := newCapped(t)
	k.l.ResumedConnState(k.c, http.StateNew)
	accepted := k.second(t)
	wait(t, k.waited, "the second connection waiting")
	if st := k.l.Stats(); st.Closed != 0 {
		t.Fatalf("stats %+v: the resumed connection was closed for room", st)
	}
	k.l.ResumedConnState(k.c, http.StateActive)
	k.l.ResumedConnState(k.c, http.StateIdle)
	k.closedForRoom(t, accepted)
}

// A connection whose client has sent a request the server has not read yet is not closed for room,
// grace or not: it is a request on its way in, and starts its grace again each time it is found so.
// It may be closed once it is idle after its answer, or, if what it sent turns out to be a header
// stalled part way (read, and still no request), once that new grace is over. The server is played by
// the test, which accepts and reports states itself, so that the request stays unread.
func TestArrivingNotClosedForRoom(t *testing.T) {
	for _, answered := range []bool{true, false} {
		k := newCapped(t)
		k.l.ConnState(k.c, http.StateNew)
		const req = "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
		if _, err := io.WriteString(k.client, req); err != nil {
			t.Fatal(err)
		}
		for i := 0; ; i++ { // loopback delivers within the write; bounded all the same
			if n, err := unreadBytes(k.c.(*conn).Conn); err != nil {
				t.Fatal(err)
			} else if n == len(req) {
				break
			}
			if i == 1e6 {
				t.Fatal("the request never reached the server's socket")
			}
			runtime.Gosched()
		}
		accepted := k.second(t)
		wait(t, k.waited, "the second connection waiting")
		wait(t, k.waited, "the second connection waiting again, after the first's new grace") // the timer's
		if st := k.l.Stats(); st.Closed != 0 {
			t.Fatalf("stats %+v: the connection with its request unread was closed for room", st)
		}
		if _, err := io.ReadFull(k.c, make([]byte, len(req))); err != nil {
			t.Fatal(err)
		}
		if answered {
			k.l.ConnState(k.c, http.StateActive)
			k.l.ConnState(k.c, http.StateIdle)
		}
		k.closedForRoom(t, accepted)
	}
}
