package warmloop

// The loops: one epoll instance and one goroutine each, serving the client connections the edge
// hands over (Take) and the upstream connections their requests use.
//
// Per request a loop reads the client's socket once epoll says it is readable, writes the upstream
// request with one write, reads the answer once epoll says it has come, and writes it with one write:
// two reads and two writes, where net/http and Go's netpoller make about four reads and wake two
// goroutines (docs/benchmarks.md, sessions 24 and 31). A kept upstream connection is also peeked at
// before it carries the request, as the fast path peeks (upstream): a system call that takes no byte,
// which keeps bytes a tenant sent unasked from being read as another client's answer. Everything a loop does not do itself goes back to
// the edge's net/http servers, through Edge: a request outside Parse's subset, a route that is not
// awake, an answer that is not plain, a failed exchange. The loop never writes an error of its own:
// net/http's path writes them all, so both paths answer alike.
//
// All of a loop's state belongs to its goroutine. Other goroutines reach it through its inbox (post),
// which an eventfd wakes.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/activator/activator/internal/upstream"
)

// Target is one route's upstream as the edge gives it for a request (Edge.Begin): the loop keeps idle
// upstream connections per Target, so a Target must stay the same value for as long as its upstream
// does (the edge makes one per instance).
type Target interface {
	// Sockaddr is the upstream's address: an IP and port, or a Unix socket's path.
	Sockaddr() unix.Sockaddr
	// ResponseTimeout bounds the wait for the answer's head once the request is sent; 0: none.
	ResponseTimeout() time.Duration
	// End ends a request Begin admitted: status is the answer's, which the loop gave the client
	// whole, or cut short when the client's connection was closed after the answer's head came;
	// StatusClientClosed for a connection closed before that; 0 for a request the loop did not answer
	// (it went back to the edge, which answers and counts it).
	End(status int)
	// Unasked is told of an idle upstream connection closed for bytes no request asked for.
	Unasked()
}

// Owner is the edge's side of one client connection the loop serves.
type Owner interface {
	// Idle says the connection waits for its next request (true) or has one in progress (false): the
	// edge's connection cap may close an idle one for room (through Group.Close).
	Idle(idle bool)
	// Closed says the loop has closed the connection.
	Closed()
}

// Edge is what a Group asks of the edge. Its methods are called on a loop's goroutine and must not
// block.
type Edge interface {
	// Begin decides whether the loop serves req itself: it returns the request's Target, with the
	// request counted in flight and an upstream slot taken, or nil to hand the connection back.
	Begin(req *Request) Target
	// HandBack has net/http serve the connection again: fd (the edge now owns it), with pending, the
	// bytes the loop read and did not serve, read first.
	HandBack(fd int, owner Owner, pending []byte)
	// Finish has net/http finish an exchange the loop began and will not end: t's request (begun,
	// not yet ended) went upstream on upFD, whose answer so far is answer; timedOut says its
	// ResponseTimeout passed with no whole head, err that the exchange failed (and upFD is -1). The
	// client's connection fd (the edge now owns both) is to be served again after it, its request's
	// head first, then pending.
	Finish(x *Handover)
}

// Handover is an exchange the loop hands to net/http to finish (Edge.Finish).
type Handover struct {
	FD       int    // the client's connection
	Owner    Owner  // the client connection's owner
	Head     []byte // the request's head, as the client sent it
	Pending  []byte // what the client sent after it
	Target   Target // the request's target, begun and not ended
	UpFD     int    // the upstream connection, the request sent on it
	Answer   []byte // the answer's bytes read so far
	TimedOut bool   // the target's ResponseTimeout passed before the answer's head was whole
	// Err is the exchange's failure before the answer's head was whole (UpFD is then -1): net/http
	// answers it as the failure of an exchange of its own, and does not send the request again.
	Err error
}

// Limits are the edge's client limits the loops keep, as net/http keeps them for its connections.
type Limits struct {
	MaxHead       int           // the longest request head the loop reads before handing back
	HeaderTimeout time.Duration // from a request's first byte to its whole head; 0: none
	IdleTimeout   time.Duration // a keep-alive connection's wait for its next request; 0: none
	SendTimeout   time.Duration // a client that takes less than 16 KiB of its answer in it; 0: none
	// UpstreamIdleTimeout is how long an upstream connection stays idle before it is closed; 0:
	// upstream.IdleTimeout, the pool's.
	UpstreamIdleTimeout time.Duration
}

// A Group is the edge's loops. Its methods are safe for concurrent use.
type Group struct {
	loops  []*loop
	served atomic.Uint64 // requests the loops answered themselves
	mu     sync.Mutex
	next   int
	done   bool
}

// New starts n loops (at least 1) serving for edge.
func New(n int, edge Edge, lim Limits) (*Group, error) {
	g := &Group{}
	for range max(n, 1) {
		l, err := newLoop(edge, lim, &g.served)
		if err != nil {
			g.Close()
			return nil, err
		}
		g.loops = append(g.loops, l)
		go l.run()
	}
	return g, nil
}

// Take gives the loops client connection fd (a non-blocking TCP socket, which the Group owns from now
// on), from the IP peer (as the forwarding fields give it), with pending, bytes read from it that no
// request has used, first. It reports false, owning nothing, once the Group is closed.
func (g *Group) Take(fd int, peer string, owner Owner, pending []byte) bool {
	g.mu.Lock()
	if g.done {
		g.mu.Unlock()
		return false
	}
	l := g.loops[g.next%len(g.loops)]
	g.next++
	g.mu.Unlock()
	c := &client{fd: fd, peer: peer, owner: owner, in: append(make([]byte, 0, 4096), pending...)}
	return l.post(func() { l.take(c) })
}

// Served is how many requests the loops have answered themselves.
func (g *Group) Served() uint64 { return g.served.Load() }

// Drop closes the idle upstream connections of t in every loop: its tenant has gone to sleep or
// died, or its route is gone.
func (g *Group) Drop(t Target) {
	for _, l := range g.loops {
		l.post(func() { l.dropUpstream(t) })
	}
}

// Close stops the loops: they close every connection they serve (in-flight requests end unanswered;
// call Drain first to finish them) and their threads end.
func (g *Group) Close() {
	g.mu.Lock()
	g.done = true
	g.mu.Unlock()
	for _, l := range g.loops {
		l.post(func() { l.closeAll() })
	}
}

// Drain closes the idle client connections and has the busy ones closed once their answers are out,
// and takes no more; done is closed once no client connection is left.
func (g *Group) Drain() (done <-chan struct{}) {
	g.mu.Lock()
	g.done = true
	g.mu.Unlock()
	all := make(chan struct{})
	var wg sync.WaitGroup
	for _, l := range g.loops {
		wg.Add(1)
		if !l.post(func() { l.drain(wg.Done) }) {
			wg.Done()
		}
	}
	go func() { wg.Wait(); close(all) }()
	return all
}

// CloseConn closes a client connection the loops serve, by its owner (the edge's cap making room).
func (g *Group) CloseConn(owner Owner) {
	for _, l := range g.loops {
		l.post(func() { l.closeOwned(owner) })
	}
}

// client is a client connection a loop serves.
type client struct {
	fd    int
	id    int32 // in the socket's epoll events, with fd (newID)
	peer  string
	owner Owner
	in    []byte // read, not yet served
	out   []byte // to write, when the socket took less
	// outLoop: out is in the loop's buffer (l.ob), as readUp made it; it is copied if the socket
	// does not take it all, since the loop's next answer is made there.
	outLoop bool
	req     Request
	n       int // length of req's head in in, while it is in progress
	t       Target
	up      *upconn
	ans     Answer
	// When the client's deadline falls: its head's (a request begun), its idle one, or the stalled
	// write's; zero for none. The response's is on the upconn.
	deadline time.Time
	stalled  bool // deadline is the stalled write's (sendPiece)
	took     int  // bytes the socket took since it was set
	busy     bool // a request is in progress
	unread   bool // epoll said readable while busy: read once idle
	closing  bool // close once the answer is out (draining)
	gone     bool // closed or handed back
}

// upconn is an upstream connection.
type upconn struct {
	fd       int
	id       int32 // in the socket's epoll events, with fd (newID)
	t        Target
	c        *client // the client whose request it carries; nil while idle
	in       []byte
	out      []byte // the request's rest, when the socket took less
	reused   bool   // carried a request before: a failure before the answer is retried on a new one
	started  bool   // some of the answer has arrived
	deadline time.Time
	unread   bool // epoll said readable while the client's socket was full: read once it drains
	gone     bool
}

type loop struct {
	served *atomic.Uint64
	edge   Edge
	lim    Limits
	ep     int
	epf    *os.File        // ep, in Go's netpoller: the loop waits for its readiness there (run)
	raw    syscall.RawConn // epf's
	evfd   int
	mu     sync.Mutex // guards inbox and closed
	inbox  []func()
	closed bool
	// The loop goroutine's own, below.
	clients map[int]*client
	ups     map[int]*upconn
	idle    map[Target][]*upconn
	rb      []byte
	// ob and ub are where an answer for a client and a request for an upstream are made, the
	// loop's for whichever it serves next: a client or an upstream connection whose socket does not
	// take it all keeps a copy of the rest. Buffers of each connection's own, emptied by reslicing
	// as the socket took them, were made again for every request: about 500 bytes a request, a
	// garbage collection every half second at 14k requests a second (pinned c16), each 1.5 to 2.6
	// ms of wall clock on the one CPU the pinned benchmark gives the activator.
	ob, ub   []byte
	draining func() // called once no client is left, while draining
	lastID   int32
}

func newLoop(edge Edge, lim Limits, served *atomic.Uint64) (*loop, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	evfd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(ep)
		return nil, err
	}
	if lim.UpstreamIdleTimeout <= 0 {
		lim.UpstreamIdleTimeout = upstream.IdleTimeout
	}
	l := &loop{edge: edge, lim: lim, served: served, ep: ep, evfd: evfd, clients: map[int]*client{}, ups: map[int]*upconn{},
		idle: map[Target][]*upconn{}, rb: make([]byte, 64<<10)}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, evfd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(evfd)}); err != nil {
		unix.Close(ep)
		unix.Close(evfd)
		return nil, err
	}
	// An epoll fd is itself pollable: it is readable while events are ready. In Go's netpoller the
	// loop waits as any goroutine waits for a socket, without a thread of its own blocked in
	// epoll_wait: such a thread holds its P in a system call, and on a busy CPU the runtime's monitor
	// wakes every 20 µs to take it back (measured: 2.6 nanosleeps a request, and the hand-offs).
	if err := unix.SetNonblock(ep, true); err != nil {
		unix.Close(ep)
		unix.Close(evfd)
		return nil, err
	}
	l.epf = os.NewFile(uintptr(ep), "warmloop epoll")
	raw, err := l.epf.SyscallConn()
	if err != nil {
		l.epf.Close()
		unix.Close(evfd)
		return nil, err
	}
	l.raw = raw
	return l, nil
}

// newID returns an id for a socket's epoll events: a number reused for another socket within one
// batch of events (closed, then another opened) does not take the old one's events.
func (l *loop) newID() int32 {
	l.lastID++
	return l.lastID
}

// post runs f on the loop's goroutine; false once the loop has ended.
func (l *loop) post(f func()) bool {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return false
	}
	wake := len(l.inbox) == 0
	l.inbox = append(l.inbox, f)
	l.mu.Unlock()
	if wake {
		one := [8]byte{1}
		_, _ = unix.Write(l.evfd, one[:])
	}
	return true
}

// sendPiece is how much of an answer a client must take within SendTimeout once its socket is full,
// for the clock to start again: the piece by which the edge's framing layer bounds net/http's writes
// (activator's sendChunk). Restarted at every byte taken, the clock let a client that takes a few
// bytes at a time keep its connection, and its route's upstream slot, for as long as it trickled.
const sendPiece = 16 << 10

// tick is how often a loop looks for deadlines passed: the timeouts it keeps are seconds long, and
// a quarter of a second late is within what net/http keeps too.
const tick = 250 * time.Millisecond

func (l *loop) run() {
	evs := make([]unix.EpollEvent, 256)
	next := time.Now().Add(tick)
	var (
		n       int
		waitErr error
		set     time.Time // the read deadline in force on epf; zero: none
	)
	// collect takes the events ready now, without waiting: the wait is Go's netpoller's, on the
	// epoll fd's own readiness (RawConn.Read calls collect again once it is readable).
	collect := func(fd uintptr) bool {
		n, waitErr = rawEpollReady(int(fd), evs)
		return n > 0 || waitErr != nil && !errors.Is(waitErr, unix.EINTR)
	}
	for {
		// The tick's deadline, while there are connections whose timeouts it keeps.
		want := time.Time{}
		if len(l.clients) > 0 {
			want = next
		}
		if !want.Equal(set) {
			_ = l.epf.SetReadDeadline(want)
			set = want
		}
		n, waitErr = 0, nil
		if err := l.raw.Read(collect); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			panic("warmloop: waiting on epoll: " + err.Error()) // the epoll fd closed under the loop: a bug
		}
		if waitErr != nil && !errors.Is(waitErr, unix.EINTR) {
			panic("warmloop: epoll_wait: " + waitErr.Error()) // EBADF or EFAULT: a bug, not a condition
		}
		for i := range max(n, 0) {
			ev := evs[i]
			fd := int(ev.Fd)
			// The id tells a socket from an earlier one closed in this batch that had its number.
			if fd == l.evfd {
				if !l.inboxRun() {
					return
				}
			} else if c := l.clients[fd]; c != nil && c.id == ev.Pad {
				l.clientEvent(c, ev.Events)
			} else if u := l.ups[fd]; u != nil && u.id == ev.Pad {
				l.upEvent(u, ev.Events)
			}
		}
		if now := time.Now(); !now.Before(next) {
			next = now.Add(tick)
			l.expire(now)
		}
	}
}

// inboxRun runs what was posted; false when the loop has ended (closeAll).
func (l *loop) inboxRun() bool {
	var b [8]byte
	_, _ = unix.Read(l.evfd, b[:])
	l.mu.Lock()
	in := l.inbox
	l.inbox = nil
	l.mu.Unlock()
	for _, f := range in {
		f()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.closed
}

const (
	clientEvents = unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET
	upEvents     = unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET
)

func (l *loop) take(c *client) {
	if l.draining != nil {
		l.handBack(c, c.in) // taken as the drain began: net/http's shutdown closes it
		return
	}
	c.id = l.newID()
	if err := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, c.fd, &unix.EpollEvent{Events: clientEvents, Fd: int32(c.fd), Pad: c.id}); err != nil {
		l.handBack(c, c.in)
		return
	}
	l.clients[c.fd] = c
	c.owner.Idle(len(c.in) == 0)
	l.idleDeadline(c)
	l.serve(c)
	// Bytes may have come between the edge's last read and epoll's registration: edge-triggered,
	// epoll reports only what comes after, so look once.
	if !c.gone && !c.busy {
		l.readClient(c)
	}
}

func (l *loop) idleDeadline(c *client) {
	c.deadline, c.stalled = time.Time{}, false
	if l.lim.IdleTimeout > 0 {
		c.deadline = time.Now().Add(l.lim.IdleTimeout)
	}
}

func (l *loop) clientEvent(c *client, ev uint32) {
	if ev&unix.EPOLLOUT != 0 && len(c.out) > 0 {
		l.flushClient(c)
		if c.gone {
			return
		}
	}
	if ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		if c.busy {
			if ev&(unix.EPOLLHUP|unix.EPOLLERR) != 0 || ev&unix.EPOLLRDHUP != 0 && idleState(c.fd) == idleClosed {
				// Gone, or a FIN with no byte before it unread (idleState peeks one): net/http's
				// background read, which reads one byte, takes either for the client's departure
				// and gives the request up.
				l.closeClient(c)
				return
			}
			c.unread = true // the next request: read once this one is answered
			return
		}
		l.readClient(c)
		if ev&unix.EPOLLRDHUP != 0 && !c.gone {
			// The FIN came with what was just read, and no other edge will say so: readClient stops
			// at a read that did not fill its room. Read on to the end of the stream (a partial head
			// goes back to net/http, nothing closes), or, with a request begun, take it as net/http's
			// background read takes a FIN: the client left, unless more bytes came before it.
			switch {
			case !c.busy:
				l.readClient(c)
			case idleState(c.fd) == idleClosed:
				l.closeClient(c)
			default:
				c.unread = true
			}
		}
	}
}

// readClient reads what the client sent, until the socket has no more, and serves it.
func (l *loop) readClient(c *client) {
	for !c.gone {
		if len(c.in) >= l.lim.MaxHead {
			l.handBack(c, c.in) // a head longer than the loop reads: net/http's limits answer it
			return
		}
		if cap(c.in)-len(c.in) < 1024 {
			c.in = append(c.in, make([]byte, 4096)...)[:len(c.in)]
		}
		room := c.in[len(c.in):cap(c.in)][:min(cap(c.in)-len(c.in), l.lim.MaxHead-len(c.in))]
		n, err := rawRead(c.fd, room)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return
		case err != nil || n == 0:
			if len(c.in) > 0 {
				l.handBack(c, c.in) // a half-close after a partial request: net/http decides
				return
			}
			l.closeClient(c)
			return
		}
		c.in = c.in[:len(c.in)+n]
		if len(c.in) == n && l.lim.HeaderTimeout > 0 {
			c.deadline, c.stalled = time.Now().Add(l.lim.HeaderTimeout), false // a request has begun
		}
		// A head is whole only once a line ends: a read that brought no '\n' cannot complete one, and
		// parsing c.in from its start again at each read made a client sending a byte at a time cost
		// the square of its head (8 KiB: 32 million byte checks).
		if bytes.IndexByte(c.in[len(c.in)-n:], '\n') >= 0 {
			l.serve(c)
		}
		if c.busy {
			// What else came is read once the answer is out. A read that did not fill its room
			// emptied the socket: what comes after it raises another edge (clientEvent notes it), so
			// only a full one leaves bytes behind. Not reading to EAGAIN saves a read a request.
			c.unread = c.unread || n == len(room)
			return
		}
		if n < len(room) {
			return // emptied, as above: the rest of the head raises another edge
		}
	}
}

// serve begins the request at the start of c.in, if it is whole.
func (l *loop) serve(c *client) {
	if len(c.in) == 0 || c.gone || c.busy {
		return
	}
	res, n := Parse(c.in, l.lim.MaxHead, &c.req)
	switch res {
	case More:
		if l.lim.HeaderTimeout > 0 && c.deadline.IsZero() {
			c.deadline = time.Now().Add(l.lim.HeaderTimeout)
		}
		return
	case HandBack:
		l.handBack(c, c.in)
		return
	}
	t := l.edge.Begin(&c.req)
	if t == nil {
		l.handBack(c, c.in)
		return
	}
	c.busy, c.t, c.n, c.deadline, c.stalled = true, t, n, time.Time{}, false
	c.owner.Idle(false)
	c.ans.Reset()
	l.send(c, l.upstream(c, t, false))
}

// upstream returns an upstream connection to t for c: an idle one, unless fresh, or a new one
// (connecting). nil when none could be opened.
//
// An idle connection is looked at first, as the fast path looks (upstream.Conn.idle): bytes that came
// on it since its last answer, which the loop has not read yet (their event waits behind others),
// would otherwise be read as c's answer. One that spoke is closed and t told; one the tenant closed
// is closed.
func (l *loop) upstream(c *client, t Target, fresh bool) *upconn {
	if !fresh {
		for list := l.idle[t]; len(list) > 0; list = l.idle[t] {
			u := list[len(list)-1]
			if st := idleState(u.fd); st != idleQuiet {
				if st == idleSpoke {
					t.Unasked()
				}
				l.closeUp(u)
				continue
			}
			list[len(list)-1] = nil // the backing array must not keep it
			if len(list) == 1 {
				delete(l.idle, t) // an empty list must not keep t, and its instance, alive
			} else {
				l.idle[t] = list[:len(list)-1]
			}
			u.c, u.in, u.started = c, u.in[:0], false // answered let a large one go
			return u
		}
	}
	sa := t.Sockaddr()
	family := unix.AF_INET
	switch sa.(type) {
	case *unix.SockaddrInet6:
		family = unix.AF_INET6
	case *unix.SockaddrUnix:
		family = unix.AF_UNIX
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	if family != unix.AF_UNIX {
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	}
	if err := unix.Connect(fd, sa); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		unix.Close(fd)
		return nil
	}
	u := &upconn{fd: fd, id: l.newID(), t: t, c: c, in: make([]byte, 0, 4096)}
	if err := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: upEvents, Fd: int32(fd), Pad: u.id}); err != nil {
		unix.Close(fd)
		return nil
	}
	l.ups[fd] = u
	return u
}

// send writes c's request to u. A connect in progress takes the bytes when epoll says it is writable.
func (l *loop) send(c *client, u *upconn) {
	if u == nil {
		l.giveUp(c)
		return
	}
	c.up = u
	l.ub = AppendUpstreamHead(l.ub[:0], &c.req, c.peer)
	u.out = l.ub
	if d := c.t.ResponseTimeout(); d > 0 {
		u.deadline = time.Now().Add(d)
	} else {
		u.deadline = time.Time{}
	}
	l.flushUp(u)
	if len(u.out) > 0 {
		u.out = slices.Clone(u.out) // the rest, for EPOLLOUT: l.ub serves the loop's next request
	}
}

// flushUp writes what u still has to send.
func (l *loop) flushUp(u *upconn) {
	for len(u.out) > 0 {
		n, err := rawWrite(u.fd, u.out)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.ENOTCONN):
			return // connecting, or the socket is full: EPOLLOUT goes on
		case err != nil:
			l.upFailed(u, fmt.Errorf("warmloop: writing the request upstream: %w", err))
			return
		}
		u.out = u.out[n:]
	}
}

func (l *loop) upEvent(u *upconn, ev uint32) {
	if ev&unix.EPOLLOUT != 0 && len(u.out) > 0 {
		l.flushUp(u)
		if u.gone {
			return
		}
	}
	if ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) == 0 {
		return
	}
	if u.c == nil {
		// Idle: bytes no request asked for, or the tenant closed it.
		if l.readUnasked(u) {
			u.t.Unasked()
		}
		l.closeUp(u)
		return
	}
	if len(u.c.out) > 0 {
		u.unread = true // the client has not taken the last bytes: read once it has
		return
	}
	l.readUp(u)
}

// What an idle upstream connection's tenant did since its last answer (idleState).
const (
	idleQuiet  = iota // nothing: it can carry a request
	idleClosed        // closed it, or the socket failed
	idleSpoke         // sent bytes no request asked for
)

// idleState asks the kernel, without waiting or taking anything, what came on the idle connection
// fd: one byte peeked. It serves for a busy client's connection too (clientEvent), whose peer sent
// nothing more (idleQuiet), its next request (idleSpoke), or its FIN (idleClosed).
func idleState(fd int) int {
	var b [1]byte
	n, err := rawPeek(fd, &b)
	switch {
	case errors.Is(err, unix.EAGAIN):
		return idleQuiet
	case err == nil && n > 0:
		return idleSpoke
	}
	return idleClosed
}

// readUnasked reports whether an idle connection had bytes to read (not only its close).
func (l *loop) readUnasked(u *upconn) bool {
	n, _ := rawRead(u.fd, l.rb[:1])
	return n > 0
}

// readUp reads the answer on u and passes it to the client.
func (l *loop) readUp(u *upconn) {
	c := u.c
	for !u.gone && c != nil && len(c.out) == 0 {
		n, err := rawRead(u.fd, l.rb)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return
		case err != nil:
			l.upFailed(u, fmt.Errorf("warmloop: reading the answer: %w", err))
			return
		case n == 0:
			l.upFailed(u, io.EOF)
			return
		}
		got := l.rb[:n]
		if !c.ans.Started() {
			u.in = append(u.in, got...) // kept whole until the head is through: Finish needs it all
		}
		u.started = true
		out, st := c.ans.Feed(l.ob[:0], got, time.Now())
		l.ob = out
		c.out, c.outLoop = out, true
		switch st {
		case AnswerNotPlain:
			l.finish(c, u, false)
			return
		case AnswerDone:
			l.served.Add(1) // before the client can see the answer
			extra := c.ans.Extra()
			l.flushClient(c)
			if c.gone {
				// The write failed: closeClient has ended the request and closed u. Ending it again
				// through its cleared target was a nil-interface panic that took the activator down
				// (TestClientGoneAsTheAnswerEnds).
				return
			}
			l.answered(c, u, extra > 0)
			return
		}
		if len(c.out) > 0 {
			l.flushClient(c)
		}
	}
	if !u.gone && c != nil && len(c.out) > 0 {
		u.unread = true // edge-triggered: read the rest once the client has taken this
	}
}

// flushClient writes what c still has to be sent.
func (l *loop) flushClient(c *client) {
	for len(c.out) > 0 && !c.gone {
		n, err := rawWrite(c.fd, c.out)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			if l.lim.SendTimeout > 0 && c.deadline.IsZero() {
				c.deadline, c.stalled, c.took = time.Now().Add(l.lim.SendTimeout), true, 0
			}
			if c.outLoop {
				c.out, c.outLoop = slices.Clone(c.out), false // the rest, for EPOLLOUT: l.ob serves the next answer
			}
			return
		case err != nil:
			l.closeClient(c)
			return
		}
		c.out = c.out[n:]
		if c.stalled {
			if c.took += n; c.took >= sendPiece {
				c.deadline, c.stalled = time.Time{}, false // it took a piece: the stall's clock starts again
			}
		}
	}
	if len(c.out) == 0 {
		c.out, c.outLoop = nil, false
		if c.up != nil && c.up.unread {
			c.up.unread = false
			l.readUp(c.up)
		} else if !c.busy {
			l.afterAnswer(c)
		}
	}
}

// answered ends c's request, its answer given whole to c.out; u goes back to idle unless it sent
// bytes past the answer (closed, the target told), was closed, or still has part of the request to
// write (a tenant that answered before the whole request was written: what is left would go out on
// the idle connection, or be lost under the next request's head, and desync it).
func (l *loop) answered(c *client, u *upconn, extra bool) {
	if c.gone || c.t == nil {
		l.closeUp(u) // ended already (closeClient): nothing to end twice, and u is closed
		return
	}
	c.t.End(c.ans.Status())
	t := c.t
	c.t, c.up, c.busy = nil, nil, false
	c.in = c.in[:copy(c.in, c.in[c.n:])]
	c.n = 0
	switch {
	case extra:
		t.Unasked()
		l.closeUp(u)
	case u.gone || len(u.out) > 0:
		l.closeUp(u)
	default:
		// Idle until its deadline (expire closes it then), as the upstream pool's are: taken last in,
		// first out, the oldest would otherwise stay open for ever, an fd and a tenant's worker each.
		u.c, u.reused, u.deadline = nil, true, time.Now().Add(l.lim.UpstreamIdleTimeout)
		u.in = keepSmall(u.in) // a large head's copy is not kept while idle
		l.idle[t] = append(l.idle[t], u)
	}
	if len(c.out) == 0 {
		l.afterAnswer(c)
	}
}

// afterAnswer readies c for its next request, once its last answer is out.
func (l *loop) afterAnswer(c *client) {
	if c.gone || c.busy {
		return
	}
	if c.closing {
		l.closeClient(c)
		return
	}
	c.owner.Idle(len(c.in) == 0)
	l.idleDeadline(c)
	if len(c.in) > 0 {
		l.serve(c) // pipelined
	}
	if !c.gone && !c.busy && c.unread {
		c.unread = false
		l.readClient(c)
	}
}

// upFailed handles u failing with err (a write or read error, or io.EOF for its close) while it
// carries a request, as the fast path (upstream's pool) handles its own exchange failing: a kept
// connection that failed before any byte of the answer came is tried again, once, on a new one (the
// tenant closed it meanwhile). Any other failure ends the exchange, and the request is not sent
// again: the tenant may have acted on it. Before the answer's head was whole, net/http answers the
// failure as its own (Finish, with the error); after, the client's connection is closed, as net/http
// aborts it, with the answer cut short or not begun.
func (l *loop) upFailed(u *upconn, err error) {
	c, reused, started := u.c, u.reused, u.started
	l.closeUp(u)
	switch {
	case c == nil || c.gone:
	case c.ans.Status() != 0:
		l.closeClient(c) // a cut answer must not pass for a whole one
	case reused && !started:
		l.send(c, l.upstream(c, c.t, true))
	default:
		if started && errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF // a head cut short, as http.ReadResponse reports it
		}
		l.failed(c, err)
	}
}

// giveUp hands c's begun request back to net/http, which serves it as its own: nothing of it has gone
// upstream.
func (l *loop) giveUp(c *client) {
	t := c.t
	c.t, c.busy = nil, false
	t.End(0)
	l.handBack(c, c.in)
}

// failed hands c's exchange, which failed with err before the answer's head was whole, to net/http to
// answer (Edge.Finish).
func (l *loop) failed(c *client, err error) {
	x := &Handover{FD: c.fd, Owner: c.owner, Head: append([]byte(nil), c.in[:c.n]...),
		Pending: append([]byte(nil), c.in[c.n:]...), Target: c.t, UpFD: -1, Err: err}
	l.forgetClient(c)
	l.edge.Finish(x)
}

// finish hands c's exchange on u to net/http (Edge.Finish).
func (l *loop) finish(c *client, u *upconn, timedOut bool) {
	x := &Handover{FD: c.fd, Owner: c.owner, Head: append([]byte(nil), c.in[:c.n]...),
		Pending: append([]byte(nil), c.in[c.n:]...), Target: c.t, UpFD: u.fd, Answer: u.in, TimedOut: timedOut}
	l.forgetUp(u)
	l.forgetClient(c)
	l.edge.Finish(x)
}

// handBack gives c to net/http with pending first.
func (l *loop) handBack(c *client, pending []byte) {
	p := append([]byte(nil), pending...)
	l.forgetClient(c)
	l.edge.HandBack(c.fd, c.owner, p)
}

// forgetClient takes c out of the loop without closing its socket.
func (l *loop) forgetClient(c *client) {
	if c.gone {
		return
	}
	c.gone = true
	if l.clients[c.fd] == c {
		delete(l.clients, c.fd)
		_ = unix.EpollCtl(l.ep, unix.EPOLL_CTL_DEL, c.fd, nil)
	}
	l.maybeDrained()
}

// closeClient closes c, and its request's upstream connection if one is in progress.
func (l *loop) closeClient(c *client) {
	if c.gone {
		return
	}
	if u := c.up; u != nil {
		l.closeUp(u)
	}
	if c.t != nil {
		// Counted as net/http counts a request it aborts: by its answer's status once the head
		// came, else as one whose client left.
		st := c.ans.Status()
		if st == 0 {
			st = StatusClientClosed
		}
		c.t.End(st)
		c.t = nil
	}
	l.forgetClient(c)
	unix.Close(c.fd)
	c.owner.Closed()
}

func (l *loop) forgetUp(u *upconn) {
	if u.gone {
		return
	}
	u.gone = true
	if l.ups[u.fd] == u {
		delete(l.ups, u.fd)
		_ = unix.EpollCtl(l.ep, unix.EPOLL_CTL_DEL, u.fd, nil)
	}
	if u.c == nil {
		list := l.idle[u.t]
		for i, x := range list {
			if x == u {
				l.idle[u.t] = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(l.idle[u.t]) == 0 {
			delete(l.idle, u.t)
		}
	} else if u.c.up == u {
		u.c.up = nil
	}
}

func (l *loop) closeUp(u *upconn) {
	if u.gone {
		return
	}
	l.forgetUp(u)
	unix.Close(u.fd)
}

func (l *loop) dropUpstream(t Target) {
	for _, u := range append([]*upconn(nil), l.idle[t]...) {
		l.closeUp(u)
	}
}

func (l *loop) closeOwned(owner Owner) {
	for _, c := range l.clients {
		if c.owner == owner {
			l.closeClient(c)
			return
		}
	}
}

// expire acts on the deadlines passed by now.
func (l *loop) expire(now time.Time) {
	for _, c := range l.clients {
		// The bound is on the whole head, as the fast path's (upstream.Conn's headBy): a tenant that
		// sends a status line and stops must not hold the client for ever.
		if u := c.up; u != nil && c.ans.Status() == 0 && !u.deadline.IsZero() && now.After(u.deadline) {
			l.finish(c, u, true) // net/http answers the 504, as for its own exchanges
			continue
		}
		if !c.deadline.IsZero() && now.After(c.deadline) {
			l.closeClient(c) // idle, a head too slow, or a client that stopped reading
		}
	}
	for t := range l.idle {
		// Oldest first in each list; closeUp takes each out of it (and the key with the last).
		for list := l.idle[t]; len(list) > 0 && now.After(list[0].deadline); list = l.idle[t] {
			l.closeUp(list[0])
		}
	}
}

func (l *loop) drain(done func()) {
	l.draining = done
	for _, c := range l.clients {
		if c.busy || len(c.out) > 0 {
			c.closing = true
			continue
		}
		l.closeClient(c)
	}
	l.maybeDrained()
}

func (l *loop) maybeDrained() {
	if l.draining != nil && len(l.clients) == 0 {
		f := l.draining
		l.draining = func() {}
		f()
	}
}

func (l *loop) closeAll() {
	for _, c := range l.clients {
		l.closeClient(c)
	}
	for _, u := range l.ups {
		l.closeUp(u)
	}
	l.mu.Lock()
	l.closed = true
	l.inbox = nil
	l.mu.Unlock()
	unix.Close(l.evfd)
	l.epf.Close()
}

// Sockaddr returns the socket address of an upstream: "tcp" and an IP:port, or "unix" and a path; nil
// for any other (a host name, which the loop does not resolve: its thread must not block).
func Sockaddr(network, address string) unix.Sockaddr {
	switch network {
	case "unix":
		return &unix.SockaddrUnix{Name: address}
	case "tcp", "tcp4", "tcp6", "":
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return nil
		}
		if a := ap.Addr(); a.Is4() || a.Is4In6() {
			return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: a.Unmap().As4()}
		} else if a.Zone() == "" {
			return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: a.As16()}
		}
	}
	return nil
}
