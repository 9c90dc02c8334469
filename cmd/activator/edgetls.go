package main

// The edge's TLS side (docs/tls.md), wired from internal/tlsedge: the listen_tls listener and its
// certificates, the plain listener's redirect, and what check reports about them. Two hook points wait
// for other packages: newACME (internal/acme) and proxyListener (internal/trust).

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/activator/activator/internal/acme"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tlsedge"
	"github.com/activator/activator/internal/trust"
)

// acmeHooks are what the ACME manager (internal/acme) gives the edge. Every field may be nil.
type acmeHooks struct {
	// source serves the certificates of the config's exact hosts (tlsedge.Options.Source).
	source tlsedge.Source
	// challenge wraps the handler of HTTP-01 challenge requests (tlsedge.Options.Challenge).
	challenge func(http.Handler) http.Handler
	// setHosts is given the exact hosts of each config a reload applies.
	setHosts func(hosts []string)
	// run manages the certificates until ctx ends; serve runs it beside the listeners and joins it.
	run func(ctx context.Context) error
}

// newACME builds the ACME manager (internal/acme) for cfg.ExactHosts() when cfg.TLS.ACME is set, and
// returns its hooks; without ACME it returns none. The manager contacts no CA until serve runs it,
// after the listeners are bound: the challenges must find the edge listening. Its metrics go to reg.
func newACME(cfg *registry.Config, log *slog.Logger, reg prometheus.Registerer) (acmeHooks, error) {
	if cfg.TLS.ACME == nil {
		return acmeHooks{}, nil
	}
	m, err := acme.New(acme.Options{ACME: cfg.TLS.ACME, Hosts: cfg.ExactHosts(), HTTPAddr: cfg.Listen, TLSAddr: cfg.ListenTLS, Registerer: reg}, log)
	if err != nil {
		if !strings.HasPrefix(err.Error(), "tls.acme") { // most name their key already
			err = fmt.Errorf("tls.acme: %w", err)
		}
		return acmeHooks{}, err
	}
	return acmeHooks{source: m, challenge: m.HTTPChallengeHandler, setHosts: m.SetHosts, run: m.Run}, nil
}

var _ tlsedge.Source = (*acme.Manager)(nil)

// proxyPolicy is where the edge's listeners read the PROXY protocol's settings from, per accepted
// connection: the running config's (activator.Server), so a reload's values apply to the next connection.
type proxyPolicy interface {
	TrustedProxy(peer netip.Addr) bool
	ProxyProtocol() registry.ProxyProtocol
}

// proxyListener wraps a raw edge listener, below TLS and the activator's framing record, in the PROXY
// protocol (internal/trust): while the running config asks for it on that listener (on reads which
// flag of proxy_protocol), trusted peers must send the header and others may not; while it does not,
// connections are served as they are. Both are read for each connection as it is accepted, so a
// reload that turns proxy_protocol on or off, or changes trusted_proxies, applies to the connections
// accepted after it; one accepted before keeps what it was accepted with.
func proxyListener(ln net.Listener, p proxyPolicy, on func(registry.ProxyProtocol) bool) net.Listener {
	return trust.Wrap(ln, func() bool { return on(p.ProxyProtocol()) }, p.TrustedProxy)
}

// onListen and onListenTLS pick proxy_protocol's flag for the plain and the TLS listener.
func onListen(pp registry.ProxyProtocol) bool    { return pp.Listen }
func onListenTLS(pp registry.ProxyProtocol) bool { return pp.ListenTLS }

// tlsSide is the edge's TLS side in one serve, set up when listen_tls is: its certificates and
// redirects (edge), the ACME hooks, and the listener that runs its handshakes.
type tlsSide struct {
	edge *tlsedge.Edge
	acme acmeHooks
	log  *slog.Logger
	reg  prometheus.Registerer // the edge's metrics go there (bind)
	mu   sync.Mutex            // guards files
	// files are the certificate and key files of the settings in force (watchedFiles).
	files []string
}

// tlsSettings loads what cfg gives the TLS edge: the certificate files (each problem a
// *tlsedge.CertError, all joined), the ACME hosts and the redirect. The warnings are the files' and
// tlsWarnings'.
func tlsSettings(cfg *registry.Config, acme acmeHooks) (tlsedge.Settings, []string, error) {
	certs, warnings, err := tlsedge.LoadCerts(cfg.TLS.Certificates, time.Now())
	if err != nil {
		return tlsedge.Settings{}, nil, err
	}
	s := tlsedge.Settings{Certs: certs, RedirectHTTP: cfg.RedirectHTTP}
	if acme.source != nil {
		s.SourceHosts = acmeHosts(cfg, certs)
	}
	return s, append(warnings, tlsWarnings(cfg, certs)...), nil
}

// acmeHosts are the hosts ACME gets certificates for: the config's exact hosts, less IP addresses
// (a hello to one carries no server name, so its certificate would never be chosen, and the redirect
// pointed at a handshake that could only fail) and less those a certificate file carries (the file
// wins every hello for them). Found with the real binary and pebble: both were ordered, for nothing.
func acmeHosts(cfg *registry.Config, certs *tlsedge.Certs) []string {
	var out []string
	for _, h := range cfg.ExactHosts() {
		if _, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil || certs.Covers(h) {
			continue
		}
		out = append(out, h)
	}
	return out
}

// tlsWarnings are what is wrong, though servable, in how cfg's hosts get certificates: a wildcard host
// no file carries. Its hellos get the default certificate, which does not carry it either.
func tlsWarnings(cfg *registry.Config, certs *tlsedge.Certs) []string {
	var out []string
	for _, r := range cfg.Routes {
		for _, h := range r.Hosts {
			if strings.HasPrefix(h, "*.") && !certs.Covers(h) {
				out = append(out, fmt.Sprintf("route %s: %s needs a certificate from files or a DNS challenge: ACME here uses HTTP-01/TLS-ALPN-01, which cannot prove a wildcard", r.Name, h))
			}
		}
	}
	return out
}

// newTLSSide loads cfg's TLS settings and sets up ACME when cfg has listen_tls; it returns nil when
// not. The errors are the certificate files' (joined, for printConfigErrors) or the ACME manager's. The
// metrics of the certificates served and of ACME's failures go to reg.
func newTLSSide(cfg *registry.Config, log *slog.Logger, reg prometheus.Registerer) (*tlsSide, tlsedge.Settings, error) {
	if cfg.ListenTLS == "" {
		return nil, tlsedge.Settings{}, nil
	}
	acme, err := newACME(cfg, log, reg)
	if err != nil {
		return nil, tlsedge.Settings{}, err
	}
	s, warnings, err := tlsSettings(cfg, acme)
	if err != nil {
		return nil, tlsedge.Settings{}, err
	}
	if acme.setHosts != nil {
		acme.setHosts(s.SourceHosts) // the hosts ACME serves (acmeHosts), before Run orders any
	}
	for _, w := range warnings {
		log.Warn(w)
	}
	return &tlsSide{acme: acme, log: log, reg: reg, files: cleanPaths(s.Certs.Files())}, s, nil
}

// bind puts the TLS side on its raw listener (bound for listen_tls, or passed in by systemd): it builds
// the edge for the listener's port and returns the listener that runs the handshakes.
func (t *tlsSide) bind(raw net.Listener, s tlsedge.Settings, cfg *registry.Config, pp proxyPolicy) *tlsedge.Listener {
	port := 443
	if a, ok := raw.Addr().(*net.TCPAddr); ok {
		port = a.Port
	}
	t.edge = tlsedge.New(s, tlsedge.Options{Source: t.acme.source, Challenge: t.acme.challenge, HTTPSPort: port, Registerer: t.reg})
	lim := tlsedge.Limits{Timeout: cfg.Edge.TLSHandshakeTimeout, Max: cfg.Edge.MaxTLSHandshakes}
	return tlsedge.NewListener(proxyListener(raw, pp, onListenTLS), t.edge.TLSConfig(), lim, t.log)
}

// runACME runs the ACME manager until ctx ends; it returns at once without one.
func (t *tlsSide) runACME(ctx context.Context) error {
	if t == nil || t.acme.run == nil {
		return nil
	}
	return t.acme.run(ctx)
}

// watchedFiles are the certificate and key files in force: a change to one reloads, as one to the
// config does.
func (t *tlsSide) watchedFiles() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.files
}

func cleanPaths(ps []string) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = filepath.Clean(p)
	}
	return out
}

// tlsApplier reads each reloaded config's certificate files, applies the config, and then puts the
// certificates in force and gives ACME the config's hosts. A file that cannot be served fails the
// reload before anything is applied: the old config and certificates stay in force. A config without
// listen_tls (a reload cannot close the TLS listener; newReload warns) leaves the TLS settings as they
// are. The handshake limits and ACME's settings are set at start-up.
type tlsApplier struct {
	applier
	tls *tlsSide
}

var _ fileWatcher = tlsApplier{}

// applier is a, with t's certificates reloaded beside each config; a itself without a TLS side.
func (t *tlsSide) applier(a applier) applier {
	if t == nil {
		return a
	}
	return tlsApplier{a, t}
}

func (a tlsApplier) watchedFiles() []string { return a.tls.watchedFiles() }

func (a tlsApplier) Apply(cfg *registry.Config) error {
	if cfg.ListenTLS == "" {
		// The TLS listener runs on until a restart (the reload warns), with its certificates; a
		// redirect to it would outlive the config that asked for it.
		if err := a.applier.Apply(cfg); err != nil {
			return err
		}
		a.tls.edge.StopRedirect()
		return nil
	}
	s, warnings, err := tlsSettings(cfg, a.tls.acme)
	if err != nil {
		return err
	}
	if err := a.applier.Apply(cfg); err != nil {
		return err
	}
	a.tls.edge.Reload(s)
	if a.tls.acme.setHosts != nil {
		a.tls.acme.setHosts(s.SourceHosts)
	}
	a.tls.mu.Lock()
	a.tls.files = cleanPaths(s.Certs.Files())
	a.tls.mu.Unlock()
	for _, w := range warnings {
		a.tls.log.Warn(w)
	}
	return nil
}

// checkTLS is check's part for the TLS edge: every certificate file's problem, and the warnings serve
// would log. Nothing without listen_tls.
func checkTLS(cfg *registry.Config) (problems, warnings []string) {
	if cfg.ListenTLS == "" {
		return nil, nil
	}
	certs, warnings, err := tlsedge.LoadCerts(cfg.TLS.Certificates, time.Now())
	for _, e := range registry.Errors(err) {
		problems = append(problems, e.Error())
	}
	// What acme.New would refuse at serve (ca_root, storage): check passed configs serve refused.
	acmeProblems, acmeWarnings := acme.Check(acme.Options{ACME: cfg.TLS.ACME, Hosts: cfg.ExactHosts(), HTTPAddr: cfg.Listen, TLSAddr: cfg.ListenTLS})
	for _, e := range acmeProblems {
		problems = append(problems, e.Error())
	}
	return problems, append(append(warnings, acmeWarnings...), tlsWarnings(cfg, certs)...)
}

// joinedListener is two listeners as one: the edge's plain and TLS listeners behind one http.Server and
// one edgeDoor, which thus stop together. Accept returns the next connection of either; each has a
// goroutine of its own blocked in its Accept, and Close closes both and waits for those.
type joinedListener struct {
	lns   [2]net.Listener
	conns chan net.Conn
	errs  chan error
	done  chan struct{} // closed by Close
	once  sync.Once
	wg    sync.WaitGroup
}

func joinListeners(a, b net.Listener) *joinedListener {
	j := &joinedListener{lns: [2]net.Listener{a, b}, conns: make(chan net.Conn), errs: make(chan error), done: make(chan struct{})}
	for _, ln := range j.lns {
		j.wg.Add(1)
		go j.accept(ln)
	}
	return j
}

// accept hands ln's connections and errors to Accept until Close; ln's closing ends it too.
func (j *joinedListener) accept(ln net.Listener) {
	defer j.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			select {
			case j.errs <- err: // one at a time: net/http backs off on a temporary one before it asks again
			case <-j.done:
				return
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		select {
		case j.conns <- c:
		case <-j.done:
			_ = c.Close()
			return
		}
	}
}

func (j *joinedListener) Accept() (net.Conn, error) {
	select {
	case c := <-j.conns:
		return c, nil
	case err := <-j.errs:
		return nil, err
	case <-j.done:
		return nil, net.ErrClosed
	}
}

// Close closes both listeners and returns once their goroutines have ended.
func (j *joinedListener) Close() error {
	var err error
	j.once.Do(func() {
		close(j.done)
		err = errors.Join(j.lns[0].Close(), j.lns[1].Close())
		j.wg.Wait()
	})
	return err
}

// Addr is the plain listener's address.
func (j *joinedListener) Addr() net.Addr { return j.lns[0].Addr() }

// certDirs watches the certificate files' directories for the reload loop (watchCertDirs). Any change
// in one reloads: a renewal replaces the files by rename, a Kubernetes secret volume swaps a "..data"
// symlink that the files resolve through, and certbot's live/ directory holds symlinks into archive/;
// all of them replaced the served files without a reload when only the files' own names counted
// (found with the real binary). A reload that finds the same files changes nothing.
//
// A directory can also go and come back (a deploy that removes it and writes it anew, or moves a new
// one in): its watch ends with it. So each directory's parent is watched too, and while the directory
// is missing, its nearest ancestor that exists: the directory's (or an ancestor's) coming back re-arms
// the watches at once and reloads. Found with the real binary: a directory made after the reload of
// its removal went unwatched until the next SIGHUP. It is used by the reload loop's goroutine only.
type certDirs struct {
	w   *fsnotify.Watcher
	fw  fileWatcher
	log *slog.Logger
}

// watchCertDirs has l reload on changes in fw's files' directories, watched with w (the config
// file's watcher), and re-arms the watches after each reload, which may name other files.
func watchCertDirs(l *reloadLoop, w *fsnotify.Watcher, fw fileWatcher, log *slog.Logger) {
	c := &certDirs{w: w, fw: fw, log: log}
	c.arm()
	l.others = c.touches
	l.afterReload = c.arm
}

// dirs are the directories of the files in force, each once.
func (c *certDirs) dirs() []string {
	var out []string
	for _, f := range c.fw.watchedFiles() {
		if d := filepath.Dir(f); !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// touches reports whether ev reloads: a change in a certificate's directory, or one of the directory
// itself or of an ancestor (removed, made, moved), which also re-arms the watches.
func (c *certDirs) touches(ev fsnotify.Event) bool {
	if ev.Op&(fsnotify.Write|fsnotify.Create|fsnotify.Rename|fsnotify.Remove) == 0 {
		return false
	}
	name := filepath.Clean(ev.Name)
	dirs := c.dirs()
	if slices.Contains(dirs, filepath.Dir(name)) {
		return true
	}
	if !slices.ContainsFunc(dirs, func(d string) bool { return d == name || isUnder(d, name) }) {
		return false
	}
	c.arm()
	return true
}

// arm watches every certificate directory, and its parent; for a directory that is missing, its
// nearest ancestor that exists. Watching a path already watched changes nothing.
func (c *certDirs) arm() {
	for _, d := range c.dirs() {
		if err := c.armDir(d); err != nil {
			c.log.Warn("certificate directory watching disabled; SIGHUP reloads it", "dir", d, "err", err)
		}
	}
}

// armDir watches d's nearest existing ancestor, then each directory below it down to d, as long as
// they exist. Each is looked for only once its parent is watched: one made in between is then an event,
// and none goes unseen, as with `mkdir -p` racing the watches.
func (c *certDirs) armDir(d string) error {
	p := filepath.Dir(d)
	for {
		err := c.w.Add(p)
		if err == nil {
			break
		}
		up := filepath.Dir(p)
		if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) || up == p {
			return fmt.Errorf("%s: %w", p, err)
		}
		p = up // missing (maybe gone since): its parent will see it come back
	}
	for p != d {
		rel, err := filepath.Rel(p, d)
		if err != nil {
			return err
		}
		first, _, _ := strings.Cut(rel, string(filepath.Separator))
		next := filepath.Join(p, first)
		if fi, err := os.Stat(next); err != nil || !fi.IsDir() {
			return nil // not there (yet): its parent, watched, will tell when it is
		}
		if err := c.w.Add(next); err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
				return nil // gone again: its parent saw that too
			}
			return fmt.Errorf("%s: %w", next, err)
		}
		p = next
	}
	return nil
}

// isUnder reports whether path p is below dir.
func isUnder(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}
