package activator

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/activator/activator/internal/registry"
)

// table is an immutable routing table, swapped atomically on reload so lookups never lock.
type table struct {
	exact    map[string][]*routed // host -> routes, longest path prefix first
	wildcard map[string][]*routed // "example.com" for "*.example.com"
	order    []*instance          // config order, for status listings
}

// routed is one route as the edge uses it.
type routed struct {
	prefix string
	in     *instance
	proxy  *httputil.ReverseProxy
	count  func(code int)
}

func buildTable(cfg *registry.Config, instances map[string]*instance) *table {
	t := &table{exact: map[string][]*routed{}, wildcard: map[string][]*routed{}}
	for _, r := range cfg.Routes {
		in := instances[r.Name]
		t.order = append(t.order, in)
		rt := &routed{prefix: r.PathPrefix, in: in, proxy: in.proxy, count: in.count}
		for _, h := range r.Hosts {
			m, key := t.exact, h
			if strings.HasPrefix(h, "*.") {
				m, key = t.wildcard, h[2:]
			}
			m[key] = insertByPrefix(m[key], rt)
		}
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
			return strings.ToLower(h)
		}
	}
	return h
}

// bufferPool lends the proxy its copy buffers.
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v := b.p.Get(); v != nil {
		return *(v.(*[]byte))
	}
	return make([]byte, 32<<10)
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }

var sharedBuffers = &bufferPool{}

// newProxy builds the route's reverse proxy: Rewrite (not the deprecated Director), X-Forwarded-*
// headers, the original Host passed through, a transport dialing the route's upstream (TCP or unix
// socket) with a keep-alive pool sized for a busy tenant, and errors mapped in one place.
func newProxy(r *registry.Route) *httputil.ReverseProxy {
	up := r.Upstream
	target := &url.URL{Scheme: "http", Host: up.Address}
	if up.Network == "unix" {
		target.Host = "unix"
	}
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, up.Network, up.Address)
		},
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
		WriteBufferSize:       32 << 10,
		ReadBufferSize:        32 << 10,
	}
	name := r.Name
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.SetXForwarded()
			pr.Out.Host = pr.In.Host
		},
		Transport:  tr,
		BufferPool: sharedBuffers,
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			if errors.Is(err, context.Canceled) && req.Context().Err() != nil {
				return // the client went away; there is nobody to answer
			}
			writeError(w, req, &UpstreamError{Route: name, Err: err})
		},
	}
}
