package tlsedge

import (
	"net/http"
	"path"
	"strings"
)

// ChallengePrefix is the path under which ACME HTTP-01 challenges are fetched (RFC 8555 §8.3).
const ChallengePrefix = "/.well-known/acme-challenge/"

// Handler returns the edge's handler in front of next (the activator), for both listeners. In order:
//
//  1. With Options.Challenge, a request whose path is under ChallengePrefix goes to that handler, and
//     never to next: what it does not answer gets 404. A challenge, or a probe of its path, thus never
//     wakes a tenant, nor is it redirected.
//  2. With redirect_http, a plain-HTTP request for a host served over TLS (a certificate file carries
//     it, or it is one of Settings.SourceHosts) gets 308 to the same path and query over https, on the
//     TLS listener's port (left out when 443). 308 keeps the method and body; a request that has a
//     body has its connection closed after the answer, since the body is not read (and the
//     activator's checks of its framing do not run).
//  3. Everything else goes to next, as it would without TLS.
func (e *Edge) Handler(next http.Handler) http.Handler {
	var challenge http.Handler
	if e.challenge != nil {
		challenge = e.challenge(http.NotFoundHandler())
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if challenge != nil && isChallengePath(r.URL.Path) {
			challenge.ServeHTTP(w, r)
			return
		}
		if r.TLS == nil && e.redirect(w, r) {
			return
		}
		next.ServeHTTP(w, r)
	})
}

// isChallengePath reports whether p (a decoded path) is under ChallengePrefix, dot segments resolved.
func isChallengePath(p string) bool {
	if strings.HasPrefix(p, ChallengePrefix) {
		return true
	}
	if !strings.Contains(p, "acme-challenge") {
		return false // the warm path: no allocation
	}
	c := path.Clean(p)
	return c+"/" == ChallengePrefix || strings.HasPrefix(c, ChallengePrefix)
}

// redirect answers r with 308 to https when the settings in force ask for it, and reports whether it
// did.
func (e *Edge) redirect(w http.ResponseWriter, r *http.Request) bool {
	s := e.now.Load()
	if !s.redirect {
		return false
	}
	host := hostName(r.Host)
	if strings.Contains(host, "*") || s.certs.match(host) == nil && !s.sourceHosts[host] {
		return false
	}
	p := r.URL.EscapedPath()
	switch {
	case p == "*": // OPTIONS *: about the server, not a resource to move
		return false
	case p == "" || p[0] != '/':
		p = "/" + p
	}
	target := "https://" + host + e.port + p
	if r.URL.RawQuery != "" {
		target += "?" + r.URL.RawQuery
	}
	if r.ProtoMajor == 1 && (r.ContentLength != 0 || len(r.TransferEncoding) > 0) {
		w.Header().Set("Connection", "close")
	}
	http.Redirect(w, r, target, http.StatusPermanentRedirect)
	return true
}
