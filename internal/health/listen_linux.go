package health

import (
	"encoding/binary"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"
)

// sockDiag looks up TCP listeners through NETLINK_SOCK_DIAG: a request for the socket a packet to the
// address would reach (the kernel's inet_diag "exact" lookup: established sockets first, then
// listeners, wildcard and dual-stack ones included), answered with that socket or ENOENT.
type sockDiag struct{ fd int }

const (
	nlmsgHdrLen    = 16 // struct nlmsghdr
	inetDiagReqLen = 56 // struct inet_diag_req_v2
)

func newListenSource() (listenSource, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	return &sockDiag{fd: fd}, nil
}

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

func (s *sockDiag) listening(at netip.AddrPort) (bool, error) {
	req := lookupRequest(at)
	return s.lookup(req[:])
}

func (s *sockDiag) lookup(req []byte) (bool, error) {
	if err := unix.Sendto(s.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return false, os.NewSyscallError("sendto", err)
	}
	var buf [512]byte
	n, _, err := unix.Recvfrom(s.fd, buf[:], 0)
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

func (s *sockDiag) close() error { return unix.Close(s.fd) }
