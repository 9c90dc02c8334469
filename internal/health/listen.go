package health

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/activator/activator/internal/sockdiag"
)

// While a gate waits for a tenant on a loopback TCP address, most of its probes are refused: nothing
// listens yet. A refused connect costs tens of microseconds of CPU (a socket, a SYN through the
// loopback stack, the RST, the close) every FastPause, on the host where the tenant is starting. So
// once its first probe is refused, the gate asks the kernel before each dial whether anything listens
// there (listenSource: package sockdiag's lookup, a few microseconds) and counts a probe as refused
// without dialing when nothing does. (The first probe dials at once: a tenant whose socket the
// activator holds, listen_fds, answers it, and its gate opens no lookups.) A real dial still goes
// out at least every forceDial; one that reaches a listener the lookup does not see (a NAT rule, a
// socket-lookup program) turns the lookups off for the Prober.

// forceDial is the longest time a gate goes without a real dial while the lookups find nothing.
const forceDial = 2 * time.Millisecond

// listenSource answers whether anything listens at a TCP address of this host; *sockdiag.Conn is the
// real one.
type listenSource interface {
	sockdiag.Lookup
	Close() error
}

func newListenSource() (listenSource, error) {
	c, err := sockdiag.Open()
	if err != nil {
		return nil, err
	}
	return c, nil
}

// listenState is what a Prober knows of its lookups. The zero value looks nothing up.
type listenState struct {
	at      netip.AddrPort // the loopback address to look up; invalid: none
	refused error          // a probe's error for a dial refused there, as probeConn words it
	open    func() (listenSource, error)
	checked atomic.Bool // the source found a listener it was shown: it sees this host's listeners
	off     atomic.Bool // the lookups cannot be trusted here: every probe dials
}

// listenCheck is one gate's use of the Prober's lookups. A nil *listenCheck looks nothing up.
type listenCheck struct {
	st       *listenState
	src      listenSource
	lastDial time.Time
	forced   bool // the attempt under way dials although the lookup found nothing
}

// openCheck returns the lookups for one gate, or nil: the upstream is not a loopback TCP address, the
// lookups are off, or this host cannot do them. The first gate of a Prober first checks that the
// source finds a listener it knows is there (a kernel without TCP socket diagnostics answers every
// lookup "not found").
func (st *listenState) openCheck() *listenCheck {
	if !st.at.IsValid() || st.open == nil || st.off.Load() {
		return nil
	}
	src, err := st.open()
	if err != nil {
		st.off.Store(true)
		return nil
	}
	if !st.checked.Load() {
		if !sockdiag.SeesListeners(src, st.at.Addr()) {
			src.Close()
			st.off.Store(true)
			return nil
		}
		st.checked.Store(true)
	}
	return &listenCheck{st: st, src: src}
}

// skip reports whether the attempt at now can count as refused without dialing: the lookup found
// nothing listening and a real dial went out within forceDial. A failed lookup ends the lookups for
// this gate.
func (l *listenCheck) skip(now time.Time) bool {
	if l == nil || l.src == nil {
		return false
	}
	up, err := l.src.Listening(l.st.at)
	switch {
	case err != nil:
		l.src.Close()
		l.src = nil
		return false
	case up:
		l.forced = false
		return false
	case now.Sub(l.lastDial) < forceDial:
		return true
	}
	l.forced = true
	return false
}

// dialed records a real probe made at now and its result. A forced dial that was not refused while
// the lookup still finds nothing listening means the lookups miss this tenant: they are turned off for
// the Prober.
func (l *listenCheck) dialed(now time.Time, err error) {
	if l == nil || l.src == nil {
		return
	}
	l.lastDial = now
	if !l.forced || errors.Is(err, syscall.ECONNREFUSED) {
		return
	}
	if up, lerr := l.src.Listening(l.st.at); lerr == nil && !up {
		l.st.off.Store(true)
		l.src.Close()
		l.src = nil
	}
}

// dialedAt records that a real probe went out at now before the lookups were opened (the gate's
// first, which dials without a lookup).
func (l *listenCheck) dialedAt(now time.Time) {
	if l != nil {
		l.lastDial = now
	}
}

// close releases the gate's lookups.
func (l *listenCheck) close() {
	if l != nil && l.src != nil {
		l.src.Close()
	}
}

// refusedAt is the error a dial to at that is refused returns.
func refusedAt(at netip.AddrPort) error {
	return &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(at), Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
}
