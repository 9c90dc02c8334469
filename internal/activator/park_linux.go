package activator

import (
	"errors"
	"net"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// hangups notices parked clients hanging up with one epoll instance and one goroutine for all of
// them, where a watch goroutine each would cost a stack each (2–4 KiB, a herd of 100,000 times). Each
// parked connection's socket is registered for EPOLLRDHUP (the client's FIN) with EPOLLONESHOT;
// EPOLLHUP and EPOLLERR (a reset) come without asking. EPOLLIN is not asked for: bytes the client
// sends meanwhile stay in the socket for the resume server to read. The epoll descriptor itself
// is read through the netpoller (os.File's RawConn), so the goroutine is parked, holding no thread,
// until some parked client hangs up.
//
// Each registration carries an id of its own, not the descriptor's number: a descriptor closed and
// reused by a later parked connection cannot be mistaken for the one an event was queued for.
type hangups struct {
	ep   *os.File
	fd   int // ep's descriptor, open until close, which comes after every add
	rc   syscall.RawConn
	done chan struct{} // closed when run returns

	mu   sync.Mutex // guards the fields below, and each registered parkedReq's gone
	next uint64
	by   map[uint64]*parkedReq
	peak int // the most entries by has had since it was made
}

// newHangups returns the watcher, or nil where it cannot be had (each parked request then watches
// its own connection: parkedReq.watch).
func newHangups() *hangups {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil
	}
	f := os.NewFile(uintptr(fd), "park-hangups")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil
	}
	h := &hangups{ep: f, fd: fd, rc: rc, done: make(chan struct{}), by: map[uint64]*parkedReq{}}
	go h.run()
	return h
}

// socketOf returns the RawConn of the socket under c, through the edge's own wrappers (the framing
// record, a parked connection served again, the connection cap's count: each says what it wraps with
// NetConn) and a PROXY header's connection, or false.
func socketOf(c net.Conn) (syscall.RawConn, bool) {
	for range 8 {
		switch x := c.(type) {
		case syscall.Conn:
			rc, err := x.SyscallConn()
			return rc, err == nil
		case interface{ Raw() net.Conn }: // github.com/pires/go-proxyproto's Conn
			c = x.Raw()
		case interface{ NetConn() net.Conn }:
			c = x.NetConn()
		default:
			return nil, false
		}
	}
	return nil, false
}

// add registers p's connection, or reports false when it cannot be watched here.
func (h *hangups) add(p *parkedReq) bool {
	if h == nil {
		return false
	}
	rc, ok := socketOf(p.conn)
	if !ok {
		return false
	}
	h.mu.Lock()
	h.next++
	id := h.next
	h.by[id] = p
	h.peak = max(h.peak, len(h.by))
	h.mu.Unlock()
	ev := unix.EpollEvent{Events: unix.EPOLLRDHUP | unix.EPOLLONESHOT, Fd: int32(uint32(id)), Pad: int32(uint32(id >> 32))}
	var err error
	cerr := rc.Control(func(fd uintptr) {
		err = unix.EpollCtl(h.fd, unix.EPOLL_CTL_ADD, int(fd), &ev)
		if errors.Is(err, unix.EEXIST) {
			// Parked before on this keep-alive connection, and still registered (remove leaves it):
			// re-armed under the new id.
			err = unix.EpollCtl(h.fd, unix.EPOLL_CTL_MOD, int(fd), &ev)
		}
	})
	if cerr != nil || err != nil {
		h.mu.Lock()
		delete(h.by, id)
		h.mu.Unlock()
		return false
	}
	p.hangupID, p.sock = id, rc
	return true
}

// remove ends the watch of p's connection and reports whether the client hung up meanwhile. The
// socket stays registered (EPOLL_CTL_DEL would be one more syscall on every parked request's answer):
// its one-shot event, should the client hang up later, finds its id gone and is passed over, and the
// kernel drops the registration when the socket is closed.
func (h *hangups) remove(p *parkedReq) (gone bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.by, p.hangupID)
	if len(h.by) == 0 && h.peak > 1024 {
		h.by, h.peak = map[uint64]*parkedReq{}, 0 // a map does not shrink: a herd's is let go
	}
	return p.gone
}

// run gives up the hold of each parked request whose client hung up, until close.
func (h *hangups) run() {
	defer close(h.done)
	evs := make([]unix.EpollEvent, 128)
	var gone []*parkedReq
	// Read returns only once the descriptor is closed: the function never reports done.
	_ = h.rc.Read(func(fd uintptr) bool {
		// Drained every time: the netpoller reports the descriptor's readiness edge-triggered.
		for {
			n, err := unix.EpollWait(int(fd), evs, 0)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil || n <= 0 {
				break
			}
			h.mu.Lock()
			for _, ev := range evs[:n] {
				if p := h.by[uint64(uint32(ev.Fd))|uint64(uint32(ev.Pad))<<32]; p != nil && !p.gone {
					p.gone = true
					gone = append(gone, p)
				}
			}
			h.mu.Unlock()
			for i, p := range gone {
				p.cancel() // the hold gives up (acquireFor sees its ctx end); hold() closes the connection
				gone[i] = nil
			}
			gone = gone[:0]
			if n < len(evs) {
				break
			}
		}
		return false // wait for the next readiness
	})
}

// close stops run and releases the epoll descriptor.
func (h *hangups) close() {
	if h == nil {
		return
	}
	h.ep.Close()
	<-h.done
}
