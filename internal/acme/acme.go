// Package acme obtains and renews the edge's certificates over ACME (RFC 8555) with certmagic, for
// exactly the hosts the config names (issue #16, §2). A Manager manages them in the background from
// Run and SetHosts, and GetCertificate obtains one during the first handshake for a configured host
// whose background order has not finished.
//
// No other name ever causes an order, a storage read or a storage write: GetCertificate,
// HTTPChallengeHandler and certmagic's on-demand decision each look the name up in the map of
// configured hosts first, and refuse what is not there.
//
// The package knows certificates and nothing of routes or tenants. It never calls into the edge:
// an ACME challenge, an order and a renewal never wake a sleeping tenant. HTTPChallengeHandler
// answers every /.well-known/acme-challenge/ request for a managed host itself (the token, or 404)
// and never passes one on.
//
// Certificates, their keys and the ACME account live in the storage directory (tls.acme.storage,
// see New). What storage holds is served without asking the CA: a handshake, and Run's management,
// look in memory, then in storage, and order only when neither has the certificate. A CA that is
// down therefore leaves every stored certificate in service until it expires; a failed order or
// renewal is logged and retried with backoff, never fatal. Renewals run in Run only, never in a
// handshake. OCSP staples are fetched, kept in storage and stapled (certmagic's default, kept on).
package acme

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/caddyserver/certmagic"
	"github.com/mholt/acmez/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/activator/activator/internal/privdir"
	"github.com/activator/activator/internal/registry"
)

// ErrNotManaged is what GetCertificate returns for a server name that is not a managed host (or
// for a hello without one). Nothing was read or ordered; the caller may answer with a certificate
// from files instead.
var ErrNotManaged = errors.New("acme: not a managed host")

// challengePath is where ACME HTTP-01 tokens are served (RFC 8555 §8.3).
const challengePath = "/.well-known/acme-challenge/"

// Options are what New needs: the tls.acme block, the hosts, and the edge's listeners.
type Options struct {
	// ACME is tls.acme: the CA's directory, the account's email, storage and the CA's roots.
	ACME *registry.ACME
	// Hosts are the exact hosts to hold certificates for (registry.Config.ExactHosts). Wildcards
	// are skipped: they need a DNS challenge, which is not configured here.
	Hosts []string
	// HTTPAddr is the edge's plain listener (listen), whose handler is wrapped in
	// HTTPChallengeHandler, and TLSAddr its TLS listener (listen_tls), which takes certificates
	// from GetCertificate; host:port each, "" to disable HTTP-01 or TLS-ALPN-01. certmagic binds a
	// challenge port itself when nothing listens on it; pointed at the edge's own listeners, it
	// finds them bound and relies on them instead. The CA itself always connects to ports 80 and
	// 443: these listeners must be reachable there (directly or forwarded).
	HTTPAddr, TLSAddr string
	// Registerer, when set, gets the Manager's metrics: activator_tls_acme_failures_total. (The
	// certificates' expiry is the edge's, through CertificateExpiries.)
	Registerer prometheus.Registerer
}

// Manager holds the certificates of the managed hosts. Its methods are safe for concurrent use.
type Manager struct {
	log      *slog.Logger
	cache    *certmagic.Cache
	issuer   *certmagic.ACMEIssuer
	onDemand *certmagic.Config // handshakes for what memory lacks: storage, then an order gated by decide

	mu sync.RWMutex // guards the fields below
	// managed is the config of background management and renewals (OnDemand nil).
	managed *certmagic.Config
	// hosts are the managed hosts, each with the cancel of its background management (nil until
	// Run manages it).
	hosts map[string]context.CancelFunc
	// ctx is Run's context, nil before Run; management started by SetHosts derives from it.
	ctx context.Context
	// failures are the failed attempts of each managed host (metrics.go). A host removed loses them.
	failures map[string]hostFailures
}

// New builds a Manager for opts.Hosts. It reads the CA roots file and creates the storage
// directory, and contacts no CA. It starts certmagic's maintenance goroutine, which only Run stops
// (when Run's context ends): a Manager is always Run, with a context already ended when no
// background management is wanted. log may be nil (no logs).
//
// Storage is opts.ACME.Storage when set, else $STATE_DIRECTORY/acme (systemd's StateDirectory=,
// the first when it lists several), else $XDG_DATA_HOME/activator/acme, else
// ~/.local/share/activator/acme.
func New(opts Options, log *slog.Logger) (*Manager, error) {
	if opts.ACME == nil {
		return nil, errors.New("acme: no tls.acme")
	}
	roots, err := loadRoots(opts.ACME.CARoot)
	if err != nil {
		return nil, err
	}
	template, err := issuerTemplate(opts, roots)
	if err != nil {
		return nil, err
	}
	dir, err := storageDir(opts.ACME.Storage, os.Getenv)
	if err != nil {
		return nil, err
	}
	// Private, as the keys in it: made 0700, and refused when someone other than this user and root
	// could change it or a step of the path to it (and so swap a certificate or read a key).
	if err := privdir.Make(dir); err != nil {
		return nil, fmt.Errorf("tls.acme.storage: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("acme_ca", opts.ACME.CA)
	m := &Manager{log: log, hosts: map[string]context.CancelFunc{}, failures: map[string]hostFailures{}}
	zl := zap.New(slogCore{h: log.Handler()})
	m.cache = certmagic.NewCache(certmagic.CacheOptions{GetConfigForCert: m.configFor, Logger: zl})
	base := certmagic.Config{
		Storage:        &certmagic.FileStorage{Path: dir},
		Logger:         zl,
		OnEvent:        m.onEvent,
		ShouldEmitFunc: func(event string) bool { return event == "cert_obtained" || event == "cert_failed" },
	}
	managed := certmagic.New(m.cache, base)
	template.Logger = zl
	m.issuer = certmagic.NewACMEIssuer(managed, template)
	managed.Issuers = []certmagic.Issuer{m.issuer}
	base.Issuers = managed.Issuers
	base.OnDemand = &certmagic.OnDemandConfig{DecisionFunc: m.decide}
	m.onDemand = certmagic.New(m.cache, base)
	m.mu.Lock()
	m.managed = managed
	m.mu.Unlock()
	log.Info("acme storage", "dir", dir)
	m.SetHosts(opts.Hosts)
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(failureMetrics{m}); err != nil {
			m.cache.Stop()
			return nil, fmt.Errorf("acme: metrics: %w", err)
		}
	}
	return m, nil
}

// issuerTemplate is the ACME issuer's settings: the CA, the account, and the challenge ports.
func issuerTemplate(opts Options, roots *x509.CertPool) (certmagic.ACMEIssuer, error) {
	httpHost, httpPort, err := splitPort("listen", opts.HTTPAddr)
	if err != nil {
		return certmagic.ACMEIssuer{}, err
	}
	tlsHost, tlsPort, err := splitPort("listen_tls", opts.TLSAddr)
	if err != nil {
		return certmagic.ACMEIssuer{}, err
	}
	t := certmagic.ACMEIssuer{
		CA:    opts.ACME.CA,
		Email: opts.ACME.Email,
		// Using ACME at all accepts the CA's subscriber agreement; nobody is there to be asked.
		Agreed:                  true,
		TrustedRoots:            roots,
		DisableHTTPChallenge:    httpPort == 0,
		DisableTLSALPNChallenge: tlsPort == 0,
		AltHTTPPort:             httpPort,
		AltTLSALPNPort:          tlsPort,
	}
	// certmagic has one listen host for both solvers: the listeners' host when they share one (or
	// there is one), else any address, which finds either listener bound as well.
	switch {
	case httpPort == 0:
		t.ListenHost = tlsHost
	case tlsPort == 0 || httpHost == tlsHost:
		t.ListenHost = httpHost
	}
	return t, nil
}

// splitPort is addr's host and port; "" is no listener (port 0).
func splitPort(key, addr string) (string, int, error) {
	if addr == "" {
		return "", 0, nil
	}
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("acme: %s %q: %w", key, addr, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port <= 0 || port > 65535 {
		return "", 0, fmt.Errorf("acme: %s %q: not a port number", key, addr)
	}
	return host, port, nil
}

// Run manages every host in the background until ctx ends: it loads each certificate from storage,
// orders one when storage has none, and renews when one is due (at start, then on certmagic's
// maintenance pass every 10 minutes: in the last third of a certificate's life, or when the CA's
// renewal information says so); hosts SetHosts adds are managed likewise. It contacts the CA only
// for what storage lacks or what is due; failures are logged and retried with backoff, and never
// end Run. When ctx ends, Run cancels that work (certmagic's goroutines observe it; they are not
// joined), stops the maintenance pass, and returns nil. Certificates in memory stay served by
// GetCertificate after Run returns. Run is called once, after the edge's listeners are bound:
// certmagic would otherwise find a challenge port free and bind it itself.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	if m.ctx != nil {
		m.mu.Unlock()
		return errors.New("acme: Run called twice")
	}
	m.ctx = ctx
	start := m.startLocked(hostNames(m.hosts))
	m.mu.Unlock()
	m.manage(start)

	<-ctx.Done()
	m.mu.Lock()
	for h, cancel := range m.hosts {
		if cancel != nil {
			cancel()
			m.hosts[h] = nil
		}
	}
	m.mu.Unlock()
	m.cache.Stop()
	return nil
}

// SetHosts replaces the managed hosts, as on a reload. A host added is managed at once when Run is
// running (and at Run otherwise). A host removed stops being managed: its background management is
// cancelled, its certificate leaves memory and is neither served nor renewed (the files stay in
// storage). SetHosts does not block on the CA or on storage.
func (m *Manager) SetHosts(hosts []string) {
	want := map[string]bool{}
	for _, h := range hosts {
		h = strings.ToLower(h)
		switch {
		case strings.HasPrefix(h, "*."):
			m.log.Warn("no ACME certificate for a wildcard host: it needs a DNS challenge, or a certificate from files", "host", h)
		case !certmagic.SubjectQualifiesForCert(h):
			m.log.Warn("no ACME certificate for this host: not a name a certificate can carry", "host", h)
		default:
			want[h] = true
		}
	}
	var gone []certmagic.SubjectIssuer
	var added []string
	m.mu.Lock()
	for h, cancel := range m.hosts {
		if !want[h] {
			if cancel != nil {
				cancel()
			}
			delete(m.hosts, h)
			delete(m.failures, h)
			gone = append(gone, certmagic.SubjectIssuer{Subject: h})
		}
	}
	for h := range want {
		if _, ok := m.hosts[h]; !ok {
			m.hosts[h] = nil
			added = append(added, h)
		}
	}
	start := m.startLocked(added)
	n := len(m.hosts)
	m.mu.Unlock()
	if len(added)+len(gone) > 0 {
		m.log.Info("acme hosts", "hosts", n, "added", len(added), "removed", len(gone))
	}
	// certmagic is called outside m.mu: its cache calls back into configFor under its own lock.
	m.cache.RemoveManaged(gone)
	m.manage(start)
}

// hostStart is one host's background management to start, with the context that ends it.
type hostStart struct {
	host string
	ctx  context.Context
}

// startLocked gives each of hosts a context of its own under Run's, when Run is running.
func (m *Manager) startLocked(hosts []string) []hostStart {
	if m.ctx == nil || m.ctx.Err() != nil {
		return nil
	}
	out := make([]hostStart, 0, len(hosts))
	for _, h := range hosts {
		ctx, cancel := context.WithCancel(m.ctx)
		m.hosts[h] = cancel
		out = append(out, hostStart{host: h, ctx: ctx})
	}
	return out
}

// manage hands each host to certmagic's background management.
func (m *Manager) manage(start []hostStart) {
	m.mu.RLock()
	managed := m.managed
	m.mu.RUnlock()
	for _, s := range start {
		if err := managed.ManageAsync(s.ctx, []string{s.host}); err != nil {
			m.log.Error("managing certificate", "host", s.host, "error", err)
		}
	}
}

func hostNames(hosts map[string]context.CancelFunc) []string {
	out := make([]string, 0, len(hosts))
	for h := range hosts {
		out = append(out, h)
	}
	return out
}

// managedHost reports whether name is a managed host: one map lookup, no I/O.
func (m *Manager) managedHost(name string) bool {
	m.mu.RLock()
	_, ok := m.hosts[name]
	m.mu.RUnlock()
	return ok
}

// decide is certmagic's on-demand decision: an order only for a managed host.
func (m *Manager) decide(_ context.Context, name string) error {
	if !m.managedHost(name) {
		return ErrNotManaged
	}
	return nil
}

// configFor is the cache's config for renewing and stapling cert: the background one, while one of
// its names is managed. A certificate whose host was removed gets none, so it is not renewed even
// if an order finished after the removal.
func (m *Manager) configFor(cert certmagic.Certificate) (*certmagic.Config, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, n := range cert.Names {
		if _, ok := m.hosts[n]; ok {
			return m.managed, nil
		}
	}
	return nil, fmt.Errorf("%w: %v", ErrNotManaged, cert.Names)
}

// onEvent logs what an operator needs to see of orders: each certificate obtained, each failure.
func (m *Manager) onEvent(_ context.Context, event string, data map[string]any) error {
	host, _ := data["identifier"].(string)
	renewal, _ := data["renewal"].(bool)
	switch event {
	case "cert_obtained":
		m.attempted(strings.ToLower(host), renewal, false)
		m.log.Info("certificate obtained", "host", data["identifier"], "renewal", data["renewal"])
	case "cert_failed":
		m.attempted(strings.ToLower(host), renewal, true)
		m.log.Error("certificate order failed", "host", data["identifier"], "renewal", data["renewal"], "error", data["error"])
	}
	return nil
}

// GetCertificate is the TLS listener's tls.Config.GetCertificate. For a managed host it returns
// the certificate from memory; else from storage; else it obtains one within hello's context
// (waiting for the background order when one is running). It never renews: renewals are Run's. For
// TLS-ALPN-01 the tls.Config must list "acme-tls/1" in NextProtos: a hello that offers only that
// protocol for a managed host then gets the challenge certificate. Any other name (unknown, a
// wildcard, none) gets ErrNotManaged at once, without touching storage or the CA.
func (m *Manager) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	name := strings.ToLower(hello.ServerName)
	m.mu.RLock()
	_, ok := m.hosts[name]
	managed := m.managed
	m.mu.RUnlock()
	if !ok {
		return nil, ErrNotManaged
	}
	challenge := len(hello.SupportedProtos) == 1 && hello.SupportedProtos[0] == acmez.ACMETLS1Protocol
	if challenge || len(m.cache.AllMatchingCertificates(name)) > 0 {
		return managed.GetCertificate(hello)
	}
	// Loaded by the background config, a certificate from storage is served as it is: loaded by
	// the on-demand one, a due certificate would be renewed from the handshake, on a context of
	// certmagic's own that outlives Run.
	ctx := hello.Context()
	if ctx == nil {
		ctx = context.Background() // a hello not made by crypto/tls
	}
	if _, err := managed.CacheManagedCertificate(ctx, name); err == nil {
		return managed.GetCertificate(hello)
	}
	return m.onDemand.GetCertificate(hello)
}

// HTTPChallengeHandler wraps the plain listener's handler: it answers HTTP-01 requests
// (/.well-known/acme-challenge/…) for managed hosts, with the token of a challenge in progress or
// 404, and passes every other request, including those paths for other hosts, to next.
func (m *Manager) HTTPChallengeHandler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, challengePath) || !m.managedHost(strings.ToLower(hostOnly(r.Host))) {
			next.ServeHTTP(w, r)
			return
		}
		if !m.issuer.HandleHTTPChallenge(w, r) {
			http.NotFound(w, r)
		}
	})
}

// hostOnly is hostport without its port.
func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}
