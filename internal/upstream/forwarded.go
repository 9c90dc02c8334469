package upstream

// The forwarding fields: what the edge tells the upstream about the client (see the package doc).
// One function decides them for both paths, so the two send the same.

import (
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"strings"
)

// forwarding is what one request's upstream is told about its client.
type forwarding struct {
	peer  string // the peer's IP as r.RemoteAddr has it; "" when it has none (a Unix socket)
	host  string // r.Host
	proto string // this hop's scheme: "http" or "https"
	// A trusted peer's own fields, lines as it sent them, blank ones left out; nil for any other peer.
	xff, xfh, xfp, fwd []string

	trusted func(netip.Addr) bool // the Client's TrustedProxy; nil trusts no one
	asked   bool                  // trusted has been asked about the peer; its answer is in proxy
	proxy   bool                  // the peer is a trusted proxy
}

// newForwarding decides r's forwarding fields. trusted (nil trusts no one) is asked only when r
// carries a forwarding field (or, later, through believed, a clientField): a peer that sends none
// gets the same fields either way.
func newForwarding(r *http.Request, trusted func(netip.Addr) bool) forwarding {
	f := forwarding{host: r.Host, proto: "http", trusted: trusted}
	if r.TLS != nil {
		f.proto = "https"
	}
	ip, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return f
	}
	f.peer = ip
	h := r.Header
	if h["X-Forwarded-For"] == nil && h["X-Forwarded-Host"] == nil && h["X-Forwarded-Proto"] == nil && h["Forwarded"] == nil {
		return f
	}
	if !f.believed() {
		return f
	}
	f.xff, f.xfh = nonBlank(h["X-Forwarded-For"]), nonBlank(h["X-Forwarded-Host"])
	f.xfp, f.fwd = nonBlank(h["X-Forwarded-Proto"]), nonBlank(h["Forwarded"])
	return f
}

// believed reports whether the peer is a trusted proxy, whose clientFields are passed on. trusted is
// asked at most once a request.
func (f *forwarding) believed() bool {
	if !f.asked {
		f.asked = true
		a, err := netip.ParseAddr(f.peer)
		f.proxy = err == nil && f.trusted != nil && f.trusted(a.WithZone("").Unmap())
	}
	return f.proxy
}

// clientField reports the fields (canonical keys) other than the four the edge sets in which proxies
// and CDNs describe the client: its address, scheme, port or path prefix. From a peer that is not a
// trusted proxy they are dropped on both paths, as Traefik drops its own set: tenants and their
// frameworks read them (chi's RealIP takes True-Client-IP, then X-Real-IP, before X-Forwarded-For;
// Rack takes X-Forwarded-Ssl: on for HTTPS before X-Forwarded-Proto), and a client's own would be
// believed. Measured on 8e3579a with a chi tenant behind the edge: "True-Client-IP: 6.6.6.6" became
// the request's RemoteAddr. A trusted proxy's pass as it sent them.
func clientField(k string) bool {
	switch k {
	case "X-Real-Ip", "True-Client-Ip", "X-Client-Ip", "Cf-Connecting-Ip", "Fastly-Client-Ip", "X-Cluster-Client-Ip",
		"X-Forwarded", "Forwarded-For", "X-Original-Forwarded-For",
		"X-Forwarded-Ssl", "X-Forwarded-Scheme", "Front-End-Https", "X-Url-Scheme",
		"X-Forwarded-Port", "X-Forwarded-Server", "X-Forwarded-Prefix":
		return true
	}
	return false
}

// fields calls add for each forwarding field of the upstream's request, once per line, in a fixed
// order: X-Forwarded-For (none without a peer address), X-Forwarded-Host, X-Forwarded-Proto,
// Forwarded.
func (f *forwarding) fields(add func(name, value string)) {
	f.xForwarded(add)
	add("Forwarded", string(f.appendForwarded(make([]byte, 0, 64))))
}

// xForwarded calls add for each X-Forwarded-* line of fields, in its order.
func (f *forwarding) xForwarded(add func(name, value string)) {
	if f.peer != "" {
		if len(f.xff) == 0 {
			add("X-Forwarded-For", f.peer)
		} else {
			add("X-Forwarded-For", strings.Join(f.xff, ", ")+", "+f.peer)
		}
	}
	eachOrOwn("X-Forwarded-Host", f.xfh, f.host, add)
	eachOrOwn("X-Forwarded-Proto", f.xfp, f.proto, add)
}

// setFields sets the forwarding fields in h, the ReverseProxy's outgoing header (which Rewrite mode
// has cleared of the client's).
func (f *forwarding) setFields(h http.Header) {
	f.fields(func(name, value string) { h[name] = append(h[name], value) })
}

// appendForwarded appends the Forwarded value (RFC 7239) to b. A trusted proxy's own is passed on
// with an element for=<peer> after it. That element has no host or proto: they would describe the
// request from the proxy to the edge (often plain HTTP, to an internal name), and a tenant reading
// the last element would take them for its client's. Otherwise it says what the X-Forwarded-* fields
// say: one element per address X-Forwarded-For names, the first (where readers of Forwarded look)
// with the host and proto.
//
// The edge sets Forwarded for every peer, trusted or not, although today's tenants may read only
// X-Forwarded-*: a client's own Forwarded is never passed on from an untrusted peer, so a tenant (or
// a framework, such as Spring's, that prefers Forwarded when present) reading either form learns the
// same client, and none can be told a forged one. Both paths build it here, so they stay alike; the
// fast path appends it straight into its write buffer.
func (f *forwarding) appendForwarded(b []byte) []byte {
	if len(f.fwd) > 0 {
		for _, line := range f.fwd {
			b = append(append(b, line...), ", "...)
		}
		b = append(b, "for="...)
		return appendNode(b, f.peer)
	}
	first := true
	for _, line := range f.xff {
		for item := range strings.SplitSeq(line, ",") {
			if item = textproto.TrimString(item); item != "" {
				b = f.appendElement(b, item, first)
				first = false
			}
		}
	}
	return f.appendElement(b, f.peer, first)
}

// appendElement appends one Forwarded element for node ("" for none); the first one carries the
// host and proto the X-Forwarded-* fields pass on.
func (f *forwarding) appendElement(b []byte, node string, first bool) []byte {
	if !first {
		return appendNode(append(b, ", for="...), node)
	}
	if node != "" {
		b = append(appendNode(append(b, "for="...), node), ';')
	}
	if host := firstItem(f.xfh, f.host); host != "" {
		b = append(appendValue(append(b, "host="...), host), ';')
	}
	return appendValue(append(b, "proto="...), firstItem(f.xfp, f.proto))
}

// appendNode appends a Forwarded node: an IPv6 address bracketed and quoted ("[2001:db8::1]"), as RFC
// 7239 section 6 asks; an IPv4 address, "unknown" or another token as it is; anything else (an
// address with a port, a proxy's odd entry) quoted.
func appendNode(b []byte, node string) []byte {
	if a, err := netip.ParseAddr(node); err == nil && a.Is6() {
		b = append(b, `"[`...)
		b = append(b, node...)
		return append(b, `]"`...)
	}
	return appendValue(b, node)
}

// appendValue appends v as a Forwarded value: a token as it is, else a quoted-string.
func appendValue(b []byte, v string) []byte {
	if isToken(v) {
		return append(b, v...)
	}
	b = append(b, '"')
	for i := 0; i < len(v); i++ {
		if v[i] == '"' || v[i] == '\\' {
			b = append(b, '\\')
		}
		b = append(b, v[i])
	}
	return append(b, '"')
}

// isToken reports whether v is a non-empty token (RFC 9110 5.6.2).
func isToken(v string) bool {
	if v == "" {
		return false
	}
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// nonBlank returns lines without the blank ones: lines itself when it has none, else a copy (the
// request's header is not written).
func nonBlank(lines []string) []string {
	for i, l := range lines {
		if textproto.TrimString(l) == "" {
			out := lines[:i:i] // full: the first append copies
			for _, l := range lines[i+1:] {
				if textproto.TrimString(l) != "" {
					out = append(out, l)
				}
			}
			return out
		}
	}
	return lines
}

// eachOrOwn calls add with name for each of theirs, a trusted proxy's lines, or else once with the
// edge's own value.
func eachOrOwn(name string, theirs []string, own string, add func(name, value string)) {
	if len(theirs) == 0 {
		add(name, own)
		return
	}
	for _, v := range theirs {
		add(name, v)
	}
}

// firstItem returns the first item of the comma-separated lines, or own when there is none.
func firstItem(lines []string, own string) string {
	if len(lines) == 0 {
		return own
	}
	item, _, _ := strings.Cut(lines[0], ",")
	if item = textproto.TrimString(item); item != "" {
		return item
	}
	return own
}
