// Command loopedge is the warm path's yardstick, not a product: an HTTP/1.1 keep-alive reverse proxy in
// Go with the shape of HAProxy's and nginx's, an event loop per thread on epoll, doing the per-request
// work the activator's edge does on its fast path. `go run ./bench` measures it beside the activator
// and the peers (warm.go), so that the figure the warm targets ask for (the activator at HAProxy's
// req/s) can be read against what a Go program of that shape reaches on the same box.
//
// Per request it does what the activator's fast path does, in kind: it parses the request head (request
// line, each field, the Host), finds the route by Host in a map, writes the upstream request with the
// hop-by-hop and forwarding fields left out and X-Forwarded-For, X-Forwarded-Host, X-Forwarded-Proto and
// Forwarded added, parses the answer's head (status, Content-Length, hop-by-hop fields dropped),
// counts the request in flight under the route's mutex, and observes its latency in a Prometheus
// histogram. What it does not do, and an edge must: check a request's framing and fields strictly,
// bound heads and times, answer errors, chunked bodies, request bodies, upgrades, HTTP/2, TLS,
// holds. Anything it does not understand closes the connection (wrk counts it as an error, which the
// report shows).
//
// Each loop owns its connections: a client's, and the upstream connection paired with it (made with a
// blocking connect on the client's first request, which a keep-alive benchmark pays once per
// connection). A loop reads a socket once when epoll says it is readable and writes each answer with
// one write: the two reads and two writes per request HAProxy makes, where Go's netpoller and net/http
// make about four reads (docs/benchmarks.md, session 24 and 31).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address to listen on (IPv4 loopback)")
	upstream := flag.String("upstream", "", "the app's address (IPv4)")
	host := flag.String("host", "", "the route's Host; empty: any")
	loops := flag.Int("loops", 1, "event loops (threads), each with its own SO_REUSEPORT listener")
	flag.Parse()
	la, err1 := netip.ParseAddrPort(*listen)
	ua, err2 := netip.ParseAddrPort(*upstream)
	if err1 != nil || err2 != nil || !la.Addr().Is4() || !ua.Addr().Is4() || *loops < 1 || *loops > 64 {
		fmt.Fprintln(os.Stderr, "loopedge: -listen and -upstream must be IPv4 address:port, -loops 1..64")
		os.Exit(2)
	}
	rt := &route{up: ua, hist: prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "loopedge_request_seconds", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)})}
	for range *loops {
		l, err := newLoop(la, rt, *host)
		if err != nil {
			fmt.Fprintln(os.Stderr, "loopedge:", err)
			os.Exit(1)
		}
		go l.run()
	}
	select {}
}

// route is the one route: its upstream, its requests in flight and its metrics.
type route struct {
	up       netip.AddrPort
	mu       sync.Mutex
	inflight int
	last     time.Time
	hist     prometheus.Histogram
}

type conn struct {
	fd    int
	peer  string // the client's IP, for the forwarding fields
	up    *conn  // a client's upstream connection; nil until its first request
	owner *conn  // an upstream connection's client
	in    []byte // bytes read and not yet used
	out   []byte // the request or answer being built
	start time.Time
	left  int  // an upstream connection's answer body bytes still to come
	head  bool // an upstream connection waits for its answer's head
	busy  bool // a client's request is in flight
	close bool // a client asked for its connection to be closed after the answer
}

type loop struct {
	ep, lfd int
	rt      *route
	host    string
	conns   map[int]*conn
	rb      []byte
}

func newLoop(la netip.AddrPort, rt *route, host string) (*loop, error) {
	lfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	_ = unix.SetsockoptInt(lfd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	_ = unix.SetsockoptInt(lfd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	if err := unix.Bind(lfd, &unix.SockaddrInet4{Port: int(la.Port()), Addr: la.Addr().As4()}); err != nil {
		return nil, fmt.Errorf("bind %s: %w", la, err)
	}
	if err := unix.Listen(lfd, 4096); err != nil {
		return nil, err
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	l := &loop{ep: ep, lfd: lfd, rt: rt, host: host, conns: map[int]*conn{}, rb: make([]byte, 64<<10)}
	return l, l.watch(lfd)
}

func (l *loop) watch(fd int) error {
	return unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: int32(fd)})
}

func (l *loop) run() {
	runtime.LockOSThread()
	evs := make([]unix.EpollEvent, 256)
	for {
		n, err := unix.EpollWait(l.ep, evs, -1)
		if err != nil {
			continue // EINTR
		}
		for i := range n {
			fd := int(evs[i].Fd)
			if fd == l.lfd {
				l.accept()
				continue
			}
			if c := l.conns[fd]; c != nil {
				l.readable(c)
			}
		}
	}
}

func (l *loop) accept() {
	for range 1024 {
		fd, sa, err := unix.Accept4(l.lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if err != nil {
			return
		}
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		peer := ""
		if a, ok := sa.(*unix.SockaddrInet4); ok {
			peer = netip.AddrFrom4(a.Addr).String()
		}
		c := &conn{fd: fd, peer: peer}
		l.conns[fd] = c
		if l.watch(fd) != nil {
			l.drop(c)
		}
	}
}

// drop closes a client connection and its upstream one (either may be passed).
func (l *loop) drop(c *conn) {
	if c.owner != nil {
		c = c.owner
	}
	l.done(c)
	for _, x := range []*conn{c, c.up} {
		if x != nil && l.conns[x.fd] == x {
			delete(l.conns, x.fd)
			unix.Close(x.fd)
		}
	}
}

func (l *loop) readable(c *conn) {
	n, err := unix.Read(c.fd, l.rb)
	if err == unix.EAGAIN || err == unix.EINTR {
		return
	}
	if n <= 0 || err != nil {
		l.drop(c)
		return
	}
	if c.owner == nil {
		c.in = append(c.in, l.rb[:n]...)
		l.request(c)
	} else {
		l.answer(c, l.rb[:n])
	}
}

var (
	crlf2 = []byte("\r\n\r\n")
	// Request fields not passed on: hop-by-hop, and the forwarding fields the edge sets itself.
	dropped = [][]byte{[]byte("connection"), []byte("keep-alive"), []byte("proxy-connection"), []byte("te"),
		[]byte("trailer"), []byte("transfer-encoding"), []byte("upgrade"), []byte("x-forwarded-for"),
		[]byte("x-forwarded-host"), []byte("x-forwarded-proto"), []byte("forwarded"), []byte("host")}
)

// request handles a client's bytes: once a whole head is in, it is sent upstream.
func (l *loop) request(c *conn) {
	end := bytes.Index(c.in, crlf2)
	if end < 0 {
		if len(c.in) > 64<<10 {
			l.drop(c)
		}
		return
	}
	if c.busy {
		l.drop(c) // a pipelined request: not handled here
		return
	}
	head := c.in[:end+2]
	nl := bytes.IndexByte(head, '\n')
	line := head[:max(nl-1, 0)]
	sp1, sp2 := bytes.IndexByte(line, ' '), bytes.LastIndexByte(line, ' ')
	if nl < 1 || sp1 <= 0 || sp2 <= sp1 || string(line[sp2+1:]) != "HTTP/1.1" {
		l.drop(c)
		return
	}
	out := append(c.out[:0], line[:sp2]...)
	out = append(out, " HTTP/1.1\r\n"...)
	var host []byte
	for rest := head[nl+1:]; len(rest) > 0; {
		e := bytes.IndexByte(rest, '\n')
		if e < 1 || rest[e-1] != '\r' {
			l.drop(c)
			return
		}
		f := rest[:e-1]
		rest = rest[e+1:]
		colon := bytes.IndexByte(f, ':')
		if colon <= 0 || bytes.ContainsAny(f[:colon], " \t") {
			l.drop(c)
			return
		}
		name, value := f[:colon], bytes.TrimSpace(f[colon+1:])
		if bytes.EqualFold(name, []byte("host")) {
			host = value
		}
		if bytes.EqualFold(name, []byte("connection")) && bytes.EqualFold(value, []byte("close")) {
			c.close = true
		}
		if bytes.EqualFold(name, []byte("content-length")) && string(value) != "0" {
			l.drop(c) // a body: not handled here
			return
		}
		if isDropped(name) {
			continue
		}
		out = append(out, f...)
		out = append(out, "\r\n"...)
	}
	if host == nil || (l.host != "" && string(host) != l.host) {
		l.drop(c)
		return
	}
	out = append(out, "Host: "...)
	out = append(out, host...)
	out = append(out, "\r\nX-Forwarded-For: "...)
	out = append(out, c.peer...)
	out = append(out, "\r\nX-Forwarded-Host: "...)
	out = append(out, host...)
	out = append(out, "\r\nX-Forwarded-Proto: http\r\nForwarded: for="...)
	out = append(out, c.peer...)
	out = append(out, ";host=\""...)
	out = append(out, host...)
	out = append(out, "\";proto=http\r\n\r\n"...)
	c.out = out
	c.in = c.in[:copy(c.in, c.in[end+4:])]

	if c.up == nil && !l.dial(c) {
		return
	}
	rt := l.rt
	c.start, c.busy = time.Now(), true
	rt.mu.Lock()
	rt.inflight++
	rt.mu.Unlock()
	c.up.head, c.up.in = true, c.up.in[:0]
	if !writeAll(c.up.fd, out) {
		l.drop(c)
	}
}

func isDropped(name []byte) bool {
	for _, d := range dropped {
		if bytes.EqualFold(name, d) {
			return true
		}
	}
	return false
}

// dial makes c's upstream connection.
func (l *loop) dial(c *conn) bool {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		l.drop(c)
		return false
	}
	if err := unix.Connect(fd, &unix.SockaddrInet4{Port: int(l.rt.up.Port()), Addr: l.rt.up.Addr().As4()}); err != nil {
		unix.Close(fd)
		l.drop(c)
		return false
	}
	_ = unix.SetNonblock(fd, true)
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	c.up = &conn{fd: fd, owner: c}
	l.conns[fd] = c.up
	if l.watch(fd) != nil {
		l.drop(c)
		return false
	}
	return true
}

// answer handles an upstream connection's bytes: the answer's head, rewritten, then its body, each
// written to the client as it comes.
func (l *loop) answer(u *conn, b []byte) {
	c := u.owner
	if !u.head {
		if len(b) > u.left {
			l.drop(c) // more than the answer: not handled here
			return
		}
		u.left -= len(b)
		if !writeAll(c.fd, b) {
			l.drop(c)
			return
		}
		if u.left == 0 {
			l.finish(c)
		}
		return
	}
	u.in = append(u.in, b...)
	end := bytes.Index(u.in, crlf2)
	if end < 0 {
		if len(u.in) > 64<<10 {
			l.drop(c)
		}
		return
	}
	head := u.in[:end+2]
	nl := bytes.IndexByte(head, '\n')
	if nl < 12 || !bytes.HasPrefix(head, []byte("HTTP/1.1 ")) {
		l.drop(c)
		return
	}
	if _, err := strconv.Atoi(string(head[9:12])); err != nil {
		l.drop(c)
		return
	}
	out := append(c.out[:0], head[:nl+1]...)
	length := -1
	for rest := head[nl+1:]; len(rest) > 0; {
		e := bytes.IndexByte(rest, '\n')
		if e < 1 {
			break
		}
		f := rest[:e-1]
		rest = rest[e+1:]
		colon := bytes.IndexByte(f, ':')
		if colon <= 0 {
			continue
		}
		name, value := f[:colon], bytes.TrimSpace(f[colon+1:])
		switch {
		case bytes.EqualFold(name, []byte("content-length")):
			n, err := strconv.Atoi(string(value))
			if err != nil || n < 0 {
				l.drop(c)
				return
			}
			length = n
		case bytes.EqualFold(name, []byte("connection")), bytes.EqualFold(name, []byte("keep-alive")),
			bytes.EqualFold(name, []byte("transfer-encoding")):
			continue
		}
		out = append(out, f...)
		out = append(out, "\r\n"...)
	}
	body := u.in[end+4:]
	if length < 0 || len(body) > length {
		l.drop(c) // no length, or more than the answer: not handled here
		return
	}
	out = append(append(out, "\r\n"...), body...)
	c.out = out
	u.head, u.left = false, length-len(body)
	if !writeAll(c.fd, out) {
		l.drop(c)
		return
	}
	if u.left == 0 {
		l.finish(c)
	}
}

// finish ends c's request once its answer is written: the connection stays for the next one unless
// the client asked for it to be closed.
func (l *loop) finish(c *conn) {
	l.done(c)
	if c.close {
		l.drop(c)
	}
}

// done ends c's request, if one is in flight: out of flight, its latency observed.
func (l *loop) done(c *conn) {
	if !c.busy {
		return
	}
	c.busy = false
	rt := l.rt
	now := time.Now()
	rt.mu.Lock()
	rt.inflight--
	rt.last = now
	rt.mu.Unlock()
	rt.hist.Observe(now.Sub(c.start).Seconds())
}

// writeAll writes b with one write, as the sockets' buffers take a small answer whole; a short write
// is a failure here (an edge would wait for the socket to drain).
func writeAll(fd int, b []byte) bool {
	for {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n == len(b)
	}
}
