// Package connlimit caps how many connections a server's listeners keep open at once, and makes room
// at the cap the way nginx does: by closing the connection that has waited longest without a request
// in progress, so that a flood of idle connections cannot lock out new clients. A connection may be
// closed for room while it is idle between keep-alive requests, or once it has been open freshGrace
// without getting through its first request's header (a silent or trickling client); never while its
// client has sent bytes the server has not read yet (a request on its way in). Only when no connection
// may be closed does a new one wait, accepted but unserved, until one closes or may be.
//
// The cap exists for the file descriptors: each connection takes one, from the same open-file limit
// the process needs for its upstream connections, its tenants' pipes and its admin API. Without a cap a
// flood of connections took every descriptor, accept4 failed with EMFILE on every listener, and nothing
// answered until the connections went away.
//
// A Limit counts at its listeners (Listener), below any TLS or PROXY-protocol layer, and learns which
// connections are idle from the http.Server's ConnState hook (ConnState), which every server serving
// those connections must call.
package connlimit

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// Stats is a Limit's counts at one moment.
type Stats struct {
	Open    int    // connections open (accepted at a listener, not yet closed)
	Max     int    // the cap
	Waiting int    // accepted connections waiting for room
	Closed  uint64 // idle connections closed to make room, since the Limit was made
}

// A Limit caps the connections open at once across the listeners it wraps. It is safe for concurrent
// use.
type Limit struct {
	max  int
	full func(Stats) // called when a connection arrives at the cap, at most once per fullEvery

	mu      sync.Mutex // guards the fields below
	room    sync.Cond  // signalled when a connection closes or becomes idle while someone waits
	open    int
	waiting int
	closed  uint64
	conns   map[net.Conn]*entry // by the connection the http.Server sees (ConnState's)
	idle    entry               // sentinel of the idle list (between requests), which runs oldest first
	fresh   entry               // sentinel of the fresh list (no request yet), which runs oldest first
	grace   time.Duration       // freshGrace, but for tests
	timer   *time.Timer         // wakes the waiting Accepts when the oldest fresh connection's grace ends
	warned  time.Time           // when full was last called
	onWait  func()              // for tests: called as an Accept begins to wait for room
}

// fullEvery is how often, at most, a Limit calls its full callback: once an operator has been told,
// telling them again on every connection of a flood would only flood the log.
const fullEvery = time.Minute

// freshGrace is how long a connection that has not sent a whole request header is kept at the cap
// before it may be closed for room. A client writes its request as soon as it has connected, but a
// busy server (or client) may not get to it at once: measured with a herd of 368 GETs on connections
// of their own at a cap of 328, up to 19 were closed for room between the accept and the client's first
// write, with no grace. A second is far more than that takes, and short against edge.header_timeout,
// which bounds the connections a flood of silent clients keeps.
const freshGrace = time.Second

// entry is one connection the http.Server told ConnState about.
type entry struct {
	c          net.Conn  // as the server sees it
	inner      net.Conn  // the connection the Limit counted, under c's layers; nil when not found
	since      time.Time // when it went on the fresh list
	prev, next *entry    // in the idle or the fresh list, while on one
}

// New returns a Limit of n connections (at least 1). full, which may be nil, is called when a
// connection arrives and finds n open, at most once a minute, with the Limit's counts then; it must
// not block.
func New(n int, full func(Stats)) *Limit {
	l := &Limit{max: max(n, 1), full: full, conns: make(map[net.Conn]*entry), grace: freshGrace} // grace > 0: admit would spin on an arriving connection
	l.room.L = &l.mu
	l.idle.prev, l.idle.next = &l.idle, &l.idle
	l.fresh.prev, l.fresh.next = &l.fresh, &l.fresh
	return l
}

// Stats returns the Limit's counts.
func (l *Limit) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.statsLocked()
}

func (l *Limit) statsLocked() Stats {
	return Stats{Open: l.open, Max: l.max, Waiting: l.waiting, Closed: l.closed}
}

// Listener returns ln counted against l. Its Accept returns a connection only when fewer than the cap
// are open, first closing a connection for room when the cap is reached (see the package comment), and
// else waiting for room with the new connection accepted (so up to one connection per listener is
// open beyond the cap, unserved). Closing the Listener ends such a wait; the connection waiting is closed.
func (l *Limit) Listener(ln net.Listener) net.Listener {
	return &listener{Listener: ln, l: l, done: make(chan struct{})}
}

type listener struct {
	net.Listener
	l    *Limit
	once sync.Once
	done chan struct{} // closed by Close
}

func (ln *listener) Accept() (net.Conn, error) {
	c, err := ln.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if !ln.l.admit(ln.done) {
		c.Close()
		return nil, net.ErrClosed
	}
	return &conn{Conn: c, l: ln.l}, nil
}

func (ln *listener) Close() error {
	ln.once.Do(func() {
		close(ln.done)
		ln.l.mu.Lock()
		ln.l.room.Broadcast()
		ln.l.mu.Unlock()
	})
	return ln.Listener.Close()
}

// admit takes a place for one new connection, making room or waiting for it; false when done closed
// first.
func (l *Limit) admit(done <-chan struct{}) bool {
	l.mu.Lock()
	var told *Stats
	for l.open >= l.max {
		if told == nil && l.full != nil && time.Since(l.warned) >= fullEvery {
			l.warned = time.Now()
			s := l.statsLocked()
			told = &s
			l.mu.Unlock()
			l.full(s)
			l.mu.Lock()
			continue
		}
		if e := l.closableLocked(); e != nil {
			if e.arriving() {
				// Its client has sent what the server has not read yet: a request on its way in, which
				// the server is only slow to start on (a herd arriving at the cap). It starts a new
				// grace, as if it had just connected: its request's header read, it is in a request and
				// off the lists; a header that stalls part way, and so stays fresh, may be closed after.
				l.freshLocked(e)
				continue
			}
			l.unlinkLocked(e)
			l.closed++
			l.mu.Unlock()
			e.evict()
			l.mu.Lock()
			continue // the close gave its place back, unless the connection was already closing
		}
		select {
		case <-done:
			l.mu.Unlock()
			return false
		default:
		}
		l.waiting++
		if l.onWait != nil {
			l.onWait()
		}
		l.room.Wait()
		l.waiting--
	}
	l.open++
	l.mu.Unlock()
	return true
}

// closableLocked returns the connection to close for room: the one idle longest, else the oldest fresh
// one past its grace; nil when there is none. When only fresh connections within their grace are left,
// it sets the timer to wake the waiting Accepts as the oldest one's ends.
func (l *Limit) closableLocked() *entry {
	if e := l.idle.next; e != &l.idle {
		return e
	}
	e := l.fresh.next
	if e == &l.fresh {
		return nil
	}
	left := l.grace - time.Since(e.since)
	if left <= 0 {
		return e
	}
	if l.timer == nil {
		l.timer = time.AfterFunc(left, func() {
			l.mu.Lock()
			l.room.Broadcast()
			l.mu.Unlock()
		})
	} else {
		l.timer.Reset(left)
	}
	return nil
}

// arriving reports whether e's client has sent bytes the server has not read yet (unreadBytes): a
// connection in StateNew with its request in the socket buffer is not idle, however it looks to
// ConnState, which sees a request only once its header has been read. Closing it would lose that
// request: measured with a herd of 368 GETs, each on its own connection, at a cap of 328, 40 were
// closed for room as they arrived, requests sent and unanswered.
func (e *entry) arriving() bool {
	sc, ok := e.inner.(*conn)
	if !ok {
		return false
	}
	n, err := unreadBytes(sc.Conn)
	return err == nil && n > 0
}

// evict closes e's connection to make room. It closes the counted connection under the server's
// layers, which gives its place back at once and never blocks (a *tls.Conn's Close first writes its
// close_notify alert, which a client that stopped reading could hold up for seconds); the server then
// sees its read fail and closes the rest.
func (e *entry) evict() {
	if e.inner != nil {
		e.inner.Close()
		return
	}
	e.c.Close()
}

// release gives a closed connection's place back.
func (l *Limit) release() {
	l.mu.Lock()
	l.open--
	if l.waiting > 0 {
		l.room.Signal()
	}
	l.mu.Unlock()
}

// ConnState is the http.Server ConnState hook through which l learns which of its connections are
// idle. Set it (or call it from the server's own hook) on every server that serves l's connections,
// including one that is handed connections hijacked from another.
func (l *Limit) ConnState(c net.Conn, s http.ConnState) { l.connState(c, s, false) }

// ResumedConnState is the ConnState hook for a server that is handed connections in the middle of a
// request (the edge's resume server, which serves a parked connection again with its held request
// first): such a connection is in a request from its StateNew on, and is not closed for room until it
// goes idle. Measured without it: a herd past the cap lost as many held requests as connections
// waited at the cap, each closed as it was handed back, before its answer.
func (l *Limit) ResumedConnState(c net.Conn, s http.ConnState) { l.connState(c, s, true) }

func (l *Limit) connState(c net.Conn, s http.ConnState, resumed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch s {
	case http.StateNew:
		e := &entry{c: c, inner: counted(c)}
		l.conns[c] = e
		if !resumed {
			l.freshLocked(e) // nothing read yet: it may be closed for room once its grace is over
		}
	case http.StateIdle:
		if e := l.conns[c]; e != nil {
			l.idleLocked(e)
		}
	case http.StateActive:
		if e := l.conns[c]; e != nil {
			l.unlinkLocked(e)
		}
	case http.StateHijacked, http.StateClosed:
		if e := l.conns[c]; e != nil {
			l.unlinkLocked(e)
			delete(l.conns, c)
		}
	}
}

// idleLocked puts e at the young end of the idle list, and lets a waiting Accept take it.
func (l *Limit) idleLocked(e *entry) {
	l.unlinkLocked(e)
	e.prev, e.next = l.idle.prev, &l.idle
	e.prev.next, l.idle.prev = e, e
	if l.waiting > 0 {
		l.room.Signal()
	}
}

// freshLocked puts e at the young end of the fresh list, its grace starting now.
func (l *Limit) freshLocked(e *entry) {
	l.unlinkLocked(e)
	e.since = time.Now()
	e.prev, e.next = l.fresh.prev, &l.fresh
	e.prev.next, l.fresh.prev = e, e
}

func (l *Limit) unlinkLocked(e *entry) {
	if e.next == nil {
		return
	}
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

// conn is a connection counted by its Limit until first closed.
type conn struct {
	net.Conn
	l    *Limit
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.l.release)
	return err
}

// NetConn returns the connection c counts, as *tls.Conn's does, for code that looks for the socket
// underneath (the edge's parking watches it with epoll). Closing what it returns bypasses the count:
// close c.
func (c *conn) NetConn() net.Conn { return c.Conn }

// CloseWrite half-closes the connection when the one counted can (a *net.TCPConn): net/http does that
// before it closes a connection it answered with "Connection: close", so that the client reads the
// answer rather than a reset.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// counted finds the *conn under c's layers: each of *tls.Conn and the other wrappers that say what
// they wrap with NetConn (or, as github.com/pires/go-proxyproto's Conn does, Raw). Nil when c is not
// one of ours, or is wrapped by something that does not say.
func counted(c net.Conn) net.Conn {
	for range 8 {
		switch x := c.(type) {
		case *conn:
			return x
		case interface{ NetConn() net.Conn }:
			c = x.NetConn()
		case interface{ Raw() net.Conn }:
			c = x.Raw()
		default:
			return nil
		}
	}
	return nil
}

// Rewire puts inner in place of the connection that c (one of a Limit's, or a layer over one: see
// counted) counts, and reports whether c was one. It is for a server that moves the socket elsewhere
// and back (the edge's event loop): the count, the Limit's room-making and c's layers above keep
// working on what stands in for it. The caller must keep c out of every server's ConnState while it
// rewires (a hijacked connection is), so that no Close for room races with it.
func Rewire(c net.Conn, inner net.Conn) bool {
	lc, ok := counted(c).(*conn)
	if !ok {
		return false
	}
	lc.Conn = inner
	return true
}

// Under returns the connection c counts when c is a Limit's own layer (what Listener returns), and
// false for any other connection.
func Under(c net.Conn) (net.Conn, bool) {
	if lc, ok := c.(*conn); ok {
		return lc.Conn, true
	}
	return nil, false
}
