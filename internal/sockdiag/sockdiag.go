// Package sockdiag asks the kernel whether a TCP socket listens at an address of this host. A lookup
// is one netlink request and its answer, a few microseconds, and sends nothing to the address: a dial
// that is refused costs a socket, a SYN and its RST through the loopback stack and, from Go, a turn
// through the netpoller (a loopback connect reports EINPROGRESS first), which here was 80–190 µs on
// the path of every cold wake.
//
// A lookup sees only this host's sockets (this network namespace's), and not a listener that a packet
// reaches through a NAT rule or a socket-lookup program; a kernel without TCP socket diagnostics
// answers every lookup "not found". Callers that act on "not found" check first that the lookups see a
// listener they know is there (SeesListeners, or Trusted, its answer for this process's kernel), and
// use them only for loopback addresses.
package sockdiag

import (
	"errors"
	"net/netip"
	"sync"
)

// ErrUnsupported is Open's error where the platform has no lookup (anything but Linux).
var ErrUnsupported = errors.New("no listener lookup on this platform")

// A Lookup answers whether anything listens at a TCP address of this host. *Conn is the real one.
type Lookup interface {
	Listening(at netip.AddrPort) (bool, error)
}

// SeesListeners reports whether l, asked about a listener of this process's own on the loopback
// address addr (made for the question, on a port the kernel picks, and closed after), finds it: false
// on a kernel whose lookups find nothing, or when no such listener can be made.
func SeesListeners(l Lookup, addr netip.Addr) bool {
	at, closeListener, err := listenOwn(addr)
	if err != nil {
		return false
	}
	defer closeListener()
	up, err := l.Listening(at)
	return err == nil && up
}

// Trusted reports whether this kernel's lookups see a listener of this process's own on the loopback
// address of addr's family (127.0.0.1 or ::1): SeesListeners with a Conn of its own, asked once per
// family and process and remembered, since the answer is the kernel's and does not change while the
// process runs. It is for callers that look up once per event (a wake), where asking each time would
// double a lookup's cost. A kernel that cannot say stays untrusted, and its callers dial.
func Trusted(addr netip.Addr) bool {
	if addr.Unmap().Is4() {
		return trusted4()
	}
	return trusted6()
}

// trusted4 and trusted6 are Trusted's memos: the second package-level memo of internal/ (see
// docs/architecture.md), a fact about the kernel, computed once and never changed.
var (
	trusted4 = sync.OnceValue(func() bool { return seesOwn(netip.AddrFrom4([4]byte{127, 0, 0, 1})) })
	trusted6 = sync.OnceValue(func() bool { return seesOwn(netip.IPv6Loopback()) })
)

func seesOwn(addr netip.Addr) bool {
	c, err := Open()
	if err != nil {
		return false
	}
	defer c.Close()
	return SeesListeners(c, addr)
}
