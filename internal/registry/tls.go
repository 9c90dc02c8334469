package registry

// The edge's TLS and what it trusts from a proxy in front of it: listen_tls, tls:, redirect_http,
// trusted_proxies and proxy_protocol (issue #16). Load checks their shape; the files they name are read
// by the edge at start-up and on reload (and by `activator check`), not here.

import (
	"fmt"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Defaults of the TLS listener's limits.
const (
	// DefaultTLSHandshakeTimeout bounds one TLS handshake, from accept to its end.
	DefaultTLSHandshakeTimeout = 10 * time.Second
	// DefaultMaxTLSHandshakes is how many handshakes may be in flight at once; more connections wait
	// unaccepted, so a flood of hellos costs a bounded number of goroutines and never starves held
	// requests of CPU beyond that.
	DefaultMaxTLSHandshakes = 256
	// DefaultACMECA is Let's Encrypt's production directory.
	DefaultACMECA = "https://acme-v02.api.letsencrypt.org/directory"
)

// TLS is the tls: block: certificates from files, and ACME.
type TLS struct {
	// Certificates are served by SNI: each for the names it carries (exact or wildcard), the first
	// also for a hello without a name it covers, when ACME does not cover it.
	Certificates []CertFile
	// ACME, when set, obtains and renews certificates for every exact host of the config.
	ACME *ACME
}

// CertFile is one certificate and its key, PEM files (a chain after the leaf, as servers take it).
type CertFile struct {
	CertFile string
	KeyFile  string
}

// ACME is tls.acme: where certificates come from and where they are kept.
type ACME struct {
	Email string // the account's contact, optional
	CA    string // the ACME directory URL (default DefaultACMECA)
	// Storage is the directory certificates, keys and the account live in; "" for
	// $STATE_DIRECTORY/acme under systemd, else the user's data directory (resolved at start-up).
	Storage string
	// CARoot is a PEM file of root certificates to trust for the CA's own TLS (a test CA such as
	// pebble); "" trusts the system's roots.
	CARoot string
}

// ProxyProtocol says which edge listeners expect the PROXY protocol (v1 or v2) header.
type ProxyProtocol struct {
	Listen    bool // on listen
	ListenTLS bool // on listen_tls
}

type tlsKeys struct {
	Certificates []struct {
		CertFile string `yaml:"cert_file"`
		KeyFile  string `yaml:"key_file"`
	} `yaml:"certificates"`
	ACME *struct {
		Email   string `yaml:"email"`
		CA      string `yaml:"ca"`
		Storage string `yaml:"storage"`
		CARoot  string `yaml:"ca_root"`
	} `yaml:"acme"`
}

type proxyProtocolKeys struct {
	Listen    bool `yaml:"listen"`
	ListenTLS bool `yaml:"listen_tls"`
}

// checkListenTLS checks listen_tls against listen and admin (own, as checkAddrs returned them) and
// returns own with it added: no upstream may be it either.
func (c topCheck) checkListenTLS(addr string, own []ownAddr) []ownAddr {
	if addr == "" {
		return own
	}
	a, err := parseOwnAddr("listen_tls", addr, false, listenForms)
	if err != nil {
		c.add("listen_tls", "%v", err)
		return own
	}
	for _, o := range own {
		if a.overlaps(o) {
			c.add("listen_tls", "%s is also the %s address (%s: %s)", addr, map[string]string{"listen": "edge's plain", "admin": "admin API's"}[o.key], o.key, o.addr)
			return own
		}
	}
	return append(own, a)
}

// checkTLS checks the tls: block and redirect_http against listen_tls.
func (c topCheck) checkTLS(listenTLS string, redirect bool, k tlsKeys) TLS {
	var t TLS
	for i, cf := range k.Certificates {
		key := fmt.Sprintf("tls.certificates[%d]", i)
		for _, f := range [...]struct{ name, v string }{{"cert_file", cf.CertFile}, {"key_file", cf.KeyFile}} {
			switch {
			case f.v == "":
				c.add(key+"."+f.name, "missing: a certificate needs cert_file and key_file (PEM files)")
			case !filepath.IsAbs(f.v):
				c.add(key+"."+f.name, "%q is not an absolute path", f.v)
			}
		}
		t.Certificates = append(t.Certificates, CertFile{CertFile: cf.CertFile, KeyFile: cf.KeyFile})
	}
	acme := c.node("tls", "acme")
	switch {
	case k.ACME != nil:
		t.ACME = c.checkACME(k.ACME.Email, k.ACME.CA, k.ACME.Storage, k.ACME.CARoot)
	case acme != nil && acme.Kind == yaml.ScalarNode && acme.Tag == "!!null":
		// Decoded, `acme:` with no value is no ACME at all: often a block whose keys were commented
		// out. Turning on a CA's orders (and its subscriber agreement) wants it said: {}.
		c.add("tls.acme", "set with no value: write acme: {} for ACME with every default (Let's Encrypt, no contact email, the default storage), or give its keys (email, ca, storage, ca_root)")
	}
	// A tls.acme that is there but wrong has its own problem: "needs tls.acme" beside it misleads.
	has := len(t.Certificates) > 0 || t.ACME != nil || acme != nil
	switch {
	case listenTLS != "" && !has:
		c.add("listen_tls", "needs certificates: tls.certificates (files) or tls.acme")
	case listenTLS == "" && has:
		c.add("tls", "set, but there is no listen_tls to serve it on (as in listen_tls: 0.0.0.0:443)")
	}
	if redirect && listenTLS == "" {
		c.add("redirect_http", "needs listen_tls: plain HTTP can only be redirected to an HTTPS listener")
	}
	return t
}

// node is the value of the key at path in the document (each a mapping key), aliases followed; nil
// when a key is not there.
func (c topCheck) node(path ...string) *yaml.Node {
	n := c.doc
	if n != nil && n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	for _, key := range path {
		if n == nil || n.Kind != yaml.MappingNode {
			return nil
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				next = n.Content[i+1]
			}
		}
		n = next
		if n != nil && n.Kind == yaml.AliasNode {
			n = n.Alias
		}
	}
	return n
}

func (c topCheck) checkACME(email, ca, storage, root string) *ACME {
	a := &ACME{Email: email, CA: ca, Storage: storage, CARoot: root}
	if a.CA == "" {
		a.CA = DefaultACMECA
	} else if u, err := url.Parse(a.CA); err != nil || u.Scheme != "https" || u.Host == "" {
		c.add("tls.acme.ca", "%q is not an https URL of an ACME directory (as in %s)", ca, DefaultACMECA)
	}
	if email != "" && (!strings.Contains(email, "@") || strings.ContainsAny(email, " \t<>")) {
		c.add("tls.acme.email", "%q is not an email address", email)
	}
	for _, f := range [...]struct{ key, v string }{{"tls.acme.storage", storage}, {"tls.acme.ca_root", root}} {
		if f.v != "" && !filepath.IsAbs(f.v) {
			c.add(f.key, "%q is not an absolute path", f.v)
		}
	}
	return a
}

// checkProxies checks trusted_proxies (CIDRs or addresses, an address being its own /32 or /128)
// and proxy_protocol, which takes the header only from them.
func (c topCheck) checkProxies(list []string, pp proxyProtocolKeys, listenTLS string) ([]netip.Prefix, ProxyProtocol) {
	var out []netip.Prefix
	for i, s := range list {
		p, err := parseTrusted(strings.TrimSpace(s))
		if err != nil {
			c.add(fmt.Sprintf("trusted_proxies[%d]", i), "%q is neither a CIDR (10.0.0.0/8) nor an IP address", s)
			continue
		}
		out = append(out, p)
	}
	if (pp.Listen || pp.ListenTLS) && len(list) == 0 {
		c.add("proxy_protocol", "needs trusted_proxies: the PROXY header is taken only from those peers")
	}
	if pp.ListenTLS && listenTLS == "" {
		c.add("proxy_protocol.listen_tls", "there is no listen_tls")
	}
	return out, ProxyProtocol(pp)
}

func parseTrusted(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
}

// ExactHosts returns the config's exact hosts (no wildcards), each once, routes in file order: those ACME
// may obtain certificates for.
func (c *Config) ExactHosts() []string {
	seen := map[string]bool{}
	var out []string
	for _, r := range c.Routes {
		for _, h := range r.Hosts {
			if !strings.HasPrefix(h, "*.") && !seen[h] {
				seen[h] = true
				out = append(out, h)
			}
		}
	}
	return out
}
