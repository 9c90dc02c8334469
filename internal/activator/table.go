package activator

import (
	"net/netip"
	"strings"

	"github.com/activator/activator/internal/registry"
)

// table is an immutable routing table, swapped atomically on reload so lookups never lock.
type table struct {
	exact    map[string][]*routed // host -> routes, longest path prefix first
	wildcard map[string][]*routed // "example.com" for "*.example.com"
	order    []*instance          // config order, routes then instances, for status listings
	// edge is the config's edge limits, swapped with the routes: the request that loaded the table
	// reads them without another atomic load, and a reload's new values apply to the next request.
	edge registry.EdgeLimits
	// trusted is the config's trusted_proxies, swapped with the routes likewise (Server.TrustedProxy),
	// and proxy its proxy_protocol (Server.ProxyProtocol).
	trusted []netip.Prefix
	proxy   registry.ProxyProtocol
}

// routed is one route as the edge uses it.
type routed struct {
	prefix string
	in     *instance
	count  func(code int)
}

func buildTable(cfg *registry.Config, instances map[string]*instance) *table {
	// Sized up front: growing a map of 100,000 hosts rehashes it a dozen times on every reload.
	t := &table{exact: make(map[string][]*routed, len(cfg.Routes)), wildcard: map[string][]*routed{}, edge: cfg.Edge, trusted: cfg.TrustedProxies, proxy: cfg.ProxyProtocol,
		order: make([]*instance, 0, len(cfg.Routes)+len(cfg.Instances))}
	for _, r := range cfg.Routes {
		in := instances[r.Name]
		t.order = append(t.order, in)
		// The instance's route, not r: an unchanged route's instance has the one it was opened with
		// (equal to r), and the table then holds no string of cfg (see Server.Apply).
		r := in.route
		rt := &routed{prefix: r.PathPrefix, in: in, count: in.count}
		for _, h := range r.Hosts {
			m, key := t.exact, h
			if strings.HasPrefix(h, "*.") {
				m, key = t.wildcard, h[2:]
			}
			m[key] = insertByPrefix(m[key], rt)
		}
	}
	for _, r := range cfg.Instances { // listed, never routed
		t.order = append(t.order, instances[r.Name])
	}
	return t
}

func insertByPrefix(list []*routed, rt *routed) []*routed {
	list = append(list, rt)
	for i := len(list) - 1; i > 0 && len(list[i].prefix) > len(list[i-1].prefix); i-- {
		list[i], list[i-1] = list[i-1], list[i]
	}
	return list
}

// trusts reports whether peer is inside one of the trusted prefixes.
func (t *table) trusts(peer netip.Addr) bool {
	peer = peer.WithZone("").Unmap()
	for _, p := range t.trusted {
		if p.Contains(peer) {
			return true
		}
	}
	return false
}

// lookup finds the route for a Host header and path: an exact host beats a wildcard, a more specific
// wildcard beats a shorter one, and within a host the longest matching path prefix wins.
func (t *table) lookup(host, path string) *routed {
	host = normalizeHost(host)
	if rt := matchPrefix(t.exact[host], path); rt != nil {
		return rt
	}
	if len(t.wildcard) == 0 {
		return nil
	}
	for i := strings.IndexByte(host, '.'); i >= 0; {
		if rt := matchPrefix(t.wildcard[host[i+1:]], path); rt != nil {
			return rt
		}
		j := strings.IndexByte(host[i+1:], '.')
		if j < 0 {
			break
		}
		i += j + 1
	}
	return nil
}

func matchPrefix(list []*routed, path string) *routed {
	for _, rt := range list {
		if rt.prefix == "" {
			return rt
		}
		if strings.HasPrefix(path, rt.prefix) && (len(path) == len(rt.prefix) || path[len(rt.prefix)] == '/') {
			return rt
		}
	}
	return nil
}

// normalizeHost lower-cases and strips the port and a trailing dot, without allocating when the header
// is already in canonical form.
func normalizeHost(h string) string {
	if i := strings.LastIndexByte(h, ':'); i >= 0 && !strings.Contains(h[i:], "]") {
		h = h[:i]
	}
	h = strings.TrimSuffix(h, ".")
	for i := 0; i < len(h); i++ {
		if c := h[i]; c >= 'A' && c <= 'Z' {
			return asciiLower(h)
		}
	}
	return h
}

// asciiLower lower-cases ASCII letters only. strings.ToLower would fold Unicode too (the Kelvin sign
// K becomes k), so "\u212a.example.com" in an absolute-form target would match "k.example.com" while
// an ASCII filter in front of the edge sees a different name.
func asciiLower(h string) string {
	b := []byte(h)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
