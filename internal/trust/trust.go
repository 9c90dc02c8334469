// Package trust owns the PROXY protocol (v1 and v2) on the edge's listeners, with
// github.com/pires/go-proxyproto: which peers must send the header, which may not, and how long the
// edge waits for it.
//
// The policy is the one HAProxy applies with "tcp-request connection expect-proxy layer4 if
// { src -f trusted }": the header is accepted only from trusted peers, and from them it is required,
// never guessed at, as the PROXY protocol's specification asks of a receiver. (The specification would
// go further and not share the port with direct clients at all: go-proxyproto's
// TrustProxyHeaderFromRanges, which drops every untrusted connection. The edge's listeners serve
// clients directly too, so it does not.)
//   - A connection from a trusted proxy must open with a PROXY header, v1 or v2 (go-proxyproto's
//     REQUIRE). Its RemoteAddr is then the header's source, the client's. A LOCAL header (the proxy's
//     own health check) keeps the proxy's address, as does a v1 "UNKNOWN" one. A header naming other
//     than TCP over IPv4 or IPv6 is refused. A connection without a header is closed unserved: its
//     first read fails.
//   - A connection from any other peer is served as it is, with its own address: a client may reach
//     the listener directly. A PROXY header from it is refused (REJECT): its first read fails and the
//     connection is closed unanswered, so a client cannot claim another's address by sending one.
//     nginx's "listen … proxy_protocol" instead requires the header from every peer (and its realip
//     module decides whose address to believe); that would lock out the direct clients a listener
//     shared with a load balancer also serves.
//
// The header is read on the connection's first Read (or RemoteAddr, LocalAddr), in the goroutine
// that serves it, not in Accept: a silent peer holds up only its own connection, for at most
// HeaderTimeout, and never the accept loop.
//
// Whether a listener expects the header at all is asked per accepted connection too, so a reload can
// turn the PROXY protocol on or off without rebinding: a connection accepted while it is off is the
// raw one, served as it is whoever sends it, for its whole life.
package trust

import (
	"errors"
	"net"
	"net/netip"
	"time"

	proxyproto "github.com/pires/go-proxyproto"
)

// HeaderTimeout bounds the wait for a connection's PROXY header (from a trusted peer), and for the
// first bytes that show whether one is coming (from any other). A proxy sends the header with its
// first packet. A trusted peer still silent after it is closed; any other is then served as it is.
// An earlier read deadline the server sets (its ReadHeaderTimeout) ends the wait sooner.
const HeaderTimeout = 5 * time.Second

// errNotTCP refuses a PROXY header whose addresses are not TCP over IPv4 or IPv6.
var errNotTCP = errors.New("trust: the PROXY header names other than TCP over IPv4 or IPv6")

// Wrap returns ln with the PROXY protocol while on reports true: a connection from a peer that
// trusted (the peer's IP, no zone, IPv4 unmapped) reports must open with a PROXY header, and has the
// header's source as its RemoteAddr; a connection from any other peer may not send one (see the
// package doc). While on reports false, Accept returns ln's connections as they are. on and trusted
// are asked once per accepted connection, in Accept, so they may follow reloads; they must be fast
// and safe for concurrent use. A peer without an IP address (a Unix socket's) is not trusted.
//
// Closing the returned listener closes ln. Wrap the raw listener, below TLS and anything else that
// reads the connection's bytes: the header precedes them.
func Wrap(ln net.Listener, on func() bool, trusted func(peer netip.Addr) bool) net.Listener {
	return wrap(ln, on, trusted, HeaderTimeout)
}

// wrap is Wrap with the header's timeout (tests shorten it).
func wrap(ln net.Listener, on func() bool, trusted func(peer netip.Addr) bool, timeout time.Duration) net.Listener {
	return &proxyproto.Listener{
		Listener: ln,
		ConnPolicy: func(o proxyproto.ConnPolicyOptions) (proxyproto.Policy, error) {
			if !on() {
				return proxyproto.SKIP, nil // the raw connection, unwrapped (go-proxyproto's Listener)
			}
			if a, ok := peerIP(o.Upstream); ok && trusted(a) {
				return proxyproto.REQUIRE, nil
			}
			return proxyproto.REJECT, nil
		},
		ValidateHeader:    tcpOnly,
		ReadHeaderTimeout: timeout,
	}
}

// peerIP returns addr's IP, without a zone and with IPv4 unmapped.
func peerIP(addr net.Addr) (netip.Addr, bool) {
	var ap netip.AddrPort
	switch a := addr.(type) {
	case *net.TCPAddr:
		ap = a.AddrPort()
	default:
		if addr == nil {
			return netip.Addr{}, false
		}
		var err error
		if ap, err = netip.ParseAddrPort(addr.String()); err != nil {
			return netip.Addr{}, false
		}
	}
	if !ap.Addr().IsValid() {
		return netip.Addr{}, false
	}
	return ap.Addr().WithZone("").Unmap(), true
}

// tcpOnly refuses a PROXY header with the PROXY command and addresses that are not TCP over IPv4 or
// IPv6: the edge serves TCP, and a Unix path or UDP address as a client's would be a proxy's mistake.
// LOCAL and UNSPEC headers carry no address and pass.
func tcpOnly(h *proxyproto.Header) error {
	tp := h.TransportProtocol
	if h.Command.IsLocal() || tp.IsUnspec() || tp.IsStream() && (tp.IsIPv4() || tp.IsIPv6()) {
		return nil
	}
	return errNotTCP
}
