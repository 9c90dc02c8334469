//go:build !linux

package sockdiag

import "net/netip"

// Conn is Linux's lookup; elsewhere Open fails with ErrUnsupported.
type Conn struct{}

// Open returns ErrUnsupported: the lookup is Linux's sock_diag.
func Open() (*Conn, error) { return nil, ErrUnsupported }

// Close does nothing.
func (c *Conn) Close() error { return nil }

// Listening fails with ErrUnsupported.
func (c *Conn) Listening(netip.AddrPort) (bool, error) { return false, ErrUnsupported }

func listenOwn(netip.Addr) (netip.AddrPort, func(), error) {
	return netip.AddrPort{}, nil, ErrUnsupported
}
