// Package tlsedge owns the edge's TLS termination: the certificates from files and how a hello picks
// one, the server's tls.Config, a listener that bounds the handshakes it runs, and the plain listener's
// redirect to https. It knows nothing of routes or tenants: the edge's handler is passed in, and another
// certificate source (ACME) plugs in through the one-method Source.
package tlsedge

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// ACMETLS1 is the ALPN protocol of the TLS-ALPN-01 challenge (RFC 8737).
const ACMETLS1 = "acme-tls/1"

// Source is a certificate source besides the files: the ACME manager. Its GetCertificate is asked for
// a hello that names one of Settings.SourceHosts that no certificate file carries, and for every
// TLS-ALPN-01 challenge hello (one offering ALPN acme-tls/1 and nothing else), whatever its name. It is
// called from many handshakes at once, within each one's timeout. What it returns is final: its error
// fails the handshake (no file certificate, carrying another name, would do instead).
type Source interface {
	GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error)
}

// Settings are what one config gives the edge; Reload puts a new one in force.
type Settings struct {
	// Certs are the certificates from files (LoadCerts); nil or empty when only a Source serves.
	Certs *Certs
	// SourceHosts are the names the Source serves: the config's exact hosts when ACME is on. Ignored
	// without a Source.
	SourceHosts []string
	// RedirectHTTP has plain-HTTP requests for a host served over TLS answered with 308 (redirect_http).
	RedirectHTTP bool
}

// settings are Settings as lookups use them.
type settings struct {
	certs       *Certs
	sourceHosts map[string]bool
	redirect    bool
}

// Edge chooses the certificate of each hello, from the Settings in force, and answers the plain
// listener's redirects (Handler). Its methods are safe for concurrent use.
type Edge struct {
	src       Source                          // nil: files only; set at New, never changed
	challenge func(http.Handler) http.Handler // nil without ACME
	port      string                          // ":8443" in a redirect's Location; "" for 443
	now       atomic.Pointer[settings]        // swapped by Reload; every lookup loads it once
	config    *tls.Config
}

// Options are an Edge's fixed parts: they do not change on reload.
type Options struct {
	// Source, when set, serves the hellos for Settings.SourceHosts and TLS-ALPN-01 challenges.
	Source Source
	// Challenge, when set, wraps the handler of ACME HTTP-01 challenge requests (paths under
	// ChallengePrefix, on either listener): it answers those it has a challenge for and passes the rest
	// on, which then get 404 (Handler). nil without ACME.
	Challenge func(http.Handler) http.Handler
	// HTTPSPort is the TLS listener's port, for the redirects' Location (443 is left out).
	HTTPSPort int
	// Registerer, when set, gets the edge's metrics (activator_tls_certificate_expiry_timestamp_seconds:
	// the certificates in force, files and, when Source is Expiring, ACME's).
	Registerer prometheus.Registerer
}

// New returns an Edge serving s.
func New(s Settings, o Options) *Edge {
	e := &Edge{src: o.Source, challenge: o.Challenge}
	if o.HTTPSPort != 443 {
		e.port = fmt.Sprintf(":%d", o.HTTPSPort)
	}
	e.Reload(s)
	protos := []string{"h2", "http/1.1"}
	if e.src != nil {
		protos = append(protos, ACMETLS1) // last: a client offering h2 too is no challenge
	}
	e.config = &tls.Config{
		MinVersion: tls.VersionTLS12,
		// CipherSuites unset: Go's defaults, which it orders itself (and TLS 1.3's are not configurable).
		NextProtos:     protos,
		GetCertificate: e.getCertificate,
		// Session tickets are on, with keys Go makes itself and rotates: a new one every 24 hours, each
		// accepted for 7 days (crypto/tls ticketKeyRotation, ticketKeyLifetime). They live in this
		// Config, so every connection must share it, and a restart starts afresh (full handshakes).
		SessionTicketsDisabled: false,
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(certMetrics{e})
	}
	return e
}

// Reload puts s in force for the hellos and requests from now on. A handshake already under way, and
// every connection established, keeps the certificate it was given.
func (e *Edge) Reload(s Settings) {
	n := &settings{certs: s.Certs, redirect: s.RedirectHTTP}
	if e.src != nil && len(s.SourceHosts) > 0 {
		n.sourceHosts = make(map[string]bool, len(s.SourceHosts))
		for _, h := range s.SourceHosts {
			n.sourceHosts[hostName(h)] = true
		}
	}
	e.now.Store(n)
}

// StopRedirect ends the plain listener's redirects, keeping the certificates in force: for a reload
// that drops listen_tls, whose listener runs on until a restart. An operator who removed redirect_http
// with it still got every plain request redirected (found with the real binary).
func (e *Edge) StopRedirect() {
	cur := e.now.Load()
	n := *cur
	n.redirect = false
	e.now.Store(&n)
}

// TLSConfig is the server's tls.Config: TLS 1.2 and later, Go's cipher suites, ALPN h2 and http/1.1
// (and acme-tls/1 with a Source), session tickets on, and the certificate chosen per hello from the
// Settings in force. Serve every connection with this one Config, uncopied: Go's session ticket keys
// live in it.
func (e *Edge) TLSConfig() *tls.Config { return e.config }

// getCertificate chooses a hello's certificate: a TLS-ALPN-01 challenge goes to the Source; then the
// file whose names carry the SNI (exact before wildcard); then the Source for its hosts; then the
// first file's certificate, for a hello without a name or with one nothing serves.
func (e *Edge) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if e.src != nil && isChallenge(hello) {
		return e.src.GetCertificate(hello)
	}
	s := e.now.Load()
	name := hostName(hello.ServerName)
	if c := s.certs.match(name); c != nil {
		return c, nil
	}
	if s.sourceHosts[name] {
		return e.src.GetCertificate(hello)
	}
	if c := s.certs.Default(); c != nil {
		return c, nil
	}
	return nil, fmt.Errorf("no certificate for %q: no file carries it, and there is no default", hello.ServerName)
}

// isChallenge reports whether hello is a TLS-ALPN-01 validation: it offers acme-tls/1 alone (RFC 8737
// §3).
func isChallenge(hello *tls.ClientHelloInfo) bool {
	return len(hello.SupportedProtos) == 1 && hello.SupportedProtos[0] == ACMETLS1
}
