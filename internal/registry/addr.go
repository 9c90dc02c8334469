package registry

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// The addresses a config names: its routes' upstreams, their health.host, and the activator's own
// listen and admin addresses, which no upstream may be.

// dnsLabelRE is one label of a host name as resolvers take it: letters, digits, '-' and '_' (Compose
// and Kubernetes service names), neither first nor last a '-', at most 63 characters. Matched lower
// case.
var dnsLabelRE = regexp.MustCompile(`^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$`)

// checkPort checks the port of a host:port: a number in 1-65535.
func checkPort(port string) (int, error) {
	if port == "" || strings.Trim(port, "0123456789") != "" {
		return 0, fmt.Errorf("port %q is not a number (1-65535)", port)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %s is out of range 1-65535", port)
	}
	return n, nil
}

// checkAddrHost checks the host of a host:port: an IP address (an IPv6 one possibly with a zone) or a
// DNS name. A host that only an IP address could be (a colon, or a last label of digits alone, which no
// top-level domain is) but is not one is reported as a bad IP address, not as a name.
func checkAddrHost(h string) error {
	if _, err := netip.ParseAddr(h); err == nil {
		return nil
	}
	name := strings.TrimSuffix(strings.ToLower(h), ".")
	last := name[strings.LastIndexByte(name, '.')+1:]
	if strings.Contains(h, ":") || last != "" && strings.Trim(last, "0123456789") == "" {
		return fmt.Errorf("%q is not a valid IP address", h)
	}
	ok := name != "" && len(name) <= 253
	for _, lab := range strings.Split(name, ".") {
		ok = ok && dnsLabelRE.MatchString(lab)
	}
	if !ok {
		return fmt.Errorf("host %q is neither an IP address nor a DNS name", h)
	}
	return nil
}

// checkHealthHost checks a health.host: what a Host header carries, a host or host:port.
func checkHealthHost(s string) error {
	switch {
	case strings.Contains(s, "://"):
		return fmt.Errorf("%q: leave the scheme out (a Host header: host or host:port)", s)
	case strings.ContainsAny(s, "/?#"):
		return fmt.Errorf("%q: leave the path out (set it in health.path)", s)
	}
	if a, err := netip.ParseAddr(s); err == nil && a.Is6() {
		return fmt.Errorf("%q: write an IPv6 address in brackets, as in [%s]", s, s)
	}
	host := s
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		host = s[1 : len(s)-1] // a bracketed IPv6 address without a port
	} else if h, port, err := net.SplitHostPort(s); err == nil {
		if _, err := checkPort(port); err != nil {
			return fmt.Errorf("%q: %w", s, err)
		}
		host = h
	}
	if err := checkAddrHost(host); err != nil {
		return fmt.Errorf("%q: %w", s, err)
	}
	return nil
}

// ownAddr is one of the activator's own addresses, the edge's (listen) or the admin API's, as far as an
// upstream could name it.
type ownAddr struct {
	key  string // "listen" or "admin"
	addr string // as configured
	unix string // the socket path of a unix: address; the fields below are then unset
	host string // lower case, without a trailing dot; "" for every local address
	ip   netip.Addr
	port int
}

// anyHost reports whether a listens on every local address (0.0.0.0, ::, or no host).
func (a ownAddr) anyHost() bool { return a.host == "" || a.ip.IsValid() && a.ip.IsUnspecified() }

// parseOwnAddr checks addr, the value of key (listen or admin), and returns it for comparing upstreams
// with. A unix:/path is taken only when unixOK; forms lists the forms the key takes, for the hint.
func parseOwnAddr(key, addr string, unixOK bool, forms string) (ownAddr, error) {
	a := ownAddr{key: key, addr: addr}
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		switch {
		case !unixOK:
			return a, fmt.Errorf("%q: the edge listens on TCP only %s", addr, forms)
		case p == "":
			return a, fmt.Errorf("%q names no socket path %s", addr, forms)
		}
		a.unix = p
		return a, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return a, fmt.Errorf("%q is not an address to listen on %s", addr, forms)
	}
	if port == "0" {
		return a, fmt.Errorf("%q needs a fixed port", addr)
	}
	if a.port, err = checkPort(port); err != nil {
		return a, fmt.Errorf("%q: %w", addr, err)
	}
	if host != "" {
		if err := checkAddrHost(host); err != nil {
			return a, fmt.Errorf("%q: %w", addr, err)
		}
	}
	a.host, a.ip = normalHost(host)
	return a, nil
}

// normalHost is host lower case without a trailing dot, and its IP address (an IPv4-mapped IPv6
// address as IPv4) when it is one.
func normalHost(host string) (string, netip.Addr) {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host, netip.Addr{}
	}
	return host, ip.Unmap()
}

// local reports whether a host (normalised) is certainly this host: a loopback or unspecified IP
// address, or localhost.
func local(host string, ip netip.Addr) bool {
	if ip.IsValid() {
		return ip.IsLoopback() || ip.IsUnspecified()
	}
	return host == "localhost"
}

// sameHost reports whether two hosts (normalised) name the same address as far as the config tells:
// the same name or IP address, or localhost and 127.0.0.1 or ::1.
func sameHost(h1 string, ip1 netip.Addr, h2 string, ip2 netip.Addr) bool {
	if ip1.IsValid() && ip2.IsValid() {
		return ip1 == ip2
	}
	isLocalhost := func(h string, ip netip.Addr) bool {
		return h == "localhost" || ip == netip.AddrFrom4([4]byte{127, 0, 0, 1}) || ip == netip.IPv6Loopback()
	}
	if h1 == "localhost" || h2 == "localhost" {
		return isLocalhost(h1, ip1) && isLocalhost(h2, ip2)
	}
	return h1 == h2
}

// names reports whether u is a: the same socket path, or the same port on a host a listens on.
func (a ownAddr) names(u Upstream) bool {
	if u.Network == "unix" || a.unix != "" {
		return u.Network == "unix" && filepath.Clean(a.unix) == filepath.Clean(u.Address)
	}
	h, p, err := net.SplitHostPort(u.Address)
	if err != nil {
		return false
	}
	port, err := checkPort(p)
	if err != nil || port != a.port {
		return false
	}
	host, ip := normalHost(h)
	if a.anyHost() {
		return local(host, ip)
	}
	return sameHost(a.host, a.ip, host, ip)
}

// overlaps reports whether a and b cannot both be bound: the same socket path, or the same port on the
// same host or on every host.
func (a ownAddr) overlaps(b ownAddr) bool {
	if a.unix != "" || b.unix != "" {
		return filepath.Clean(a.unix) == filepath.Clean(b.unix)
	}
	if a.port != b.port {
		return false
	}
	return a.anyHost() || b.anyHost() || sameHost(a.host, a.ip, b.host, b.ip)
}
