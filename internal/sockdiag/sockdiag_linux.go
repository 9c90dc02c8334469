package sockdiag

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"
)

// Conn looks up TCP listeners through NETLINK_SOCK_DIAG: a request for the socket a packet to the
// address would reach (the kernel's inet_diag "exact" lookup: established sockets first, then
// listeners, wildcard and dual-stack ones included), answered with that socket or ENOENT. A Conn is
// one netlink socket, used by one goroutine at a time.
type Conn struct{ fd int }

const (
	nlmsgHdrLen    = 16 // struct nlmsghdr
	inetDiagReqLen = 56 // struct inet_diag_req_v2
)

// Open returns a Conn; its owner closes it.
func Open() (*Conn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	return &Conn{fd: fd}, nil
}

// Close releases the netlink socket.
func (c *Conn) Close() error { return unix.Close(c.fd) }

// lookupRequest is the sock_diag request for the TCP socket at at.
func lookupRequest(at netip.AddrPort) (req [nlmsgHdrLen + inetDiagReqLen]byte) {
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req))) // nlmsg_len
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST)
	r := req[nlmsgHdrLen:]
	r[0] = unix.AF_INET
	if at.Addr().Is6() && !at.Addr().Is4In6() {
		r[0] = unix.AF_INET6
	}
	r[1] = unix.IPPROTO_TCP
	ne.PutUint32(r[4:], ^uint32(0)) // idiag_states: any
	id := r[8:]                     // struct inet_diag_sockid
	binary.BigEndian.PutUint16(id[0:], at.Port())
	if a := at.Addr().Unmap(); a.Is4() {
		b := a.As4()
		copy(id[4:], b[:])
	} else {
		b := a.As16()
		copy(id[4:], b[:])
	}
	ne.PutUint32(id[40:], ^uint32(0)) // idiag_cookie: INET_DIAG_NOCOOKIE
	ne.PutUint32(id[44:], ^uint32(0))
	return req
}

// Listening reports whether a TCP socket listens at at (see Conn for which sockets count).
func (c *Conn) Listening(at netip.AddrPort) (bool, error) {
	req := lookupRequest(at)
	if err := unix.Sendto(c.fd, req[:], 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return false, os.NewSyscallError("sendto", err)
	}
	var buf [512]byte
	n, _, err := unix.Recvfrom(c.fd, buf[:], 0)
	if err != nil {
		return false, os.NewSyscallError("recvfrom", err)
	}
	if n < nlmsgHdrLen+4 {
		return false, os.NewSyscallError("recvfrom", unix.EBADMSG)
	}
	switch binary.NativeEndian.Uint16(buf[4:]) {
	case unix.SOCK_DIAG_BY_FAMILY:
		return true, nil
	case unix.NLMSG_ERROR:
		errno := unix.Errno(-int32(binary.NativeEndian.Uint32(buf[nlmsgHdrLen:])))
		if errno == unix.ENOENT {
			return false, nil
		}
		return false, os.NewSyscallError("sock_diag", errno)
	}
	return false, os.NewSyscallError("sock_diag", unix.EBADMSG)
}

// listenOwn listens on addr at a port the kernel picks, with bare syscalls (no netpoller: nothing is
// ever accepted), and returns the address and how to close it.
func listenOwn(addr netip.Addr) (netip.AddrPort, func(), error) {
	addr = addr.Unmap()
	var sa unix.Sockaddr
	family := unix.AF_INET
	if addr.Is4() {
		sa = &unix.SockaddrInet4{Addr: addr.As4()}
	} else {
		family = unix.AF_INET6
		sa = &unix.SockaddrInet6{Addr: addr.As16()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return netip.AddrPort{}, nil, os.NewSyscallError("socket", err)
	}
	closeFD := func() { unix.Close(fd) }
	if err := unix.Bind(fd, sa); err != nil {
		closeFD()
		return netip.AddrPort{}, nil, os.NewSyscallError("bind", err)
	}
	if err := unix.Listen(fd, 1); err != nil {
		closeFD()
		return netip.AddrPort{}, nil, os.NewSyscallError("listen", err)
	}
	got, err := unix.Getsockname(fd)
	if err != nil {
		closeFD()
		return netip.AddrPort{}, nil, os.NewSyscallError("getsockname", err)
	}
	switch a := got.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(addr, uint16(a.Port)), closeFD, nil
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(addr, uint16(a.Port)), closeFD, nil
	}
	closeFD()
	return netip.AddrPort{}, nil, fmt.Errorf("getsockname: address of type %T", got)
}
