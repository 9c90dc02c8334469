package main

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/netutil"
)

// capAdmin limits the admin listener ln to max connections open at once (admin_max_conns): more
// wait in the kernel's accept queue until one closes, as netutil.LimitListener does. The admin API's
// connections take file descriptors from the limit the edge's connections need too, and on a
// loopback address any local process, a tenant included, can open them: without a cap, idle admin
// connections alone once took every descriptor and the edge stopped accepting. A warning is logged
// when the cap is reached, at most once a minute, so that an operator whose CLI hangs learns why.
func capAdmin(ln net.Listener, max int, log *slog.Logger) net.Listener {
	return netutil.LimitListener(&admitCounter{Listener: ln, max: max, log: log}, max)
}

// adminCapMsg is the warning logged when the admin listener reaches admin_max_conns.
const adminCapMsg = "the admin API is at its connection cap (admin_max_conns): more connections wait until one closes"

// admitCounter counts the connections its Accept returned that are still open; LimitListener,
// around it, only calls Accept while fewer than max are.
type admitCounter struct {
	net.Listener
	max    int
	log    *slog.Logger
	open   atomic.Int64
	warned atomic.Int64 // when the last warning was logged, in Unix nanoseconds
}

func (l *admitCounter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if n := l.open.Add(1); n >= int64(l.max) {
		now, last := time.Now().UnixNano(), l.warned.Load()
		if now-last >= int64(time.Minute) && l.warned.CompareAndSwap(last, now) {
			l.log.Warn(adminCapMsg, "open", n, "admin_max_conns", l.max)
		}
	}
	return &countedConn{Conn: c, open: &l.open}, nil
}

// countedConn takes itself off its listener's count when first closed.
type countedConn struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.open.Add(-1) })
	return err
}
