package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	httppprof "net/http/pprof"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/backend/split"
	"github.com/activator/activator/internal/connlimit"
	"github.com/activator/activator/internal/health"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/sockdiag"
	"github.com/activator/activator/internal/tlsedge"
	"github.com/activator/activator/internal/warmloop"
)

// serveOptions is what `serve` and `demo` share.
type serveOptions struct {
	configPath string // "" when the config is embedded (demo)
	configData []byte // used when configPath is ""
	listen     string // overrides the config's listen
	admin      string // overrides the config's admin
	// activated maps each listener systemd passed in (socket activation: "edge", "edge-tls",
	// "admin") to its network ("tcp", "unix"), set once they are bound; a restart keeps these,
	// whatever the config says.
	activated map[string]string
	logger    *slog.Logger
	// pprof mounts net/http/pprof on the admin listener (off by default: profiles expose internals).
	pprof bool
	// onReady runs once both listeners are bound (demo prints its banner there).
	onReady func(edge, admin net.Addr)
	// loaded, when set, is told of every load of the config: the start-up one, and each reload,
	// applied (ok) or not (activator.Metrics.ConfigLoaded).
	loaded func(ok bool, at time.Time)
}

// noteLoad tells o.loaded, if set, of a load of the config.
func (o serveOptions) noteLoad(ok bool) {
	if o.loaded != nil {
		o.loaded(ok, time.Now())
	}
}

func cmdServe(args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "config file (YAML)")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	pprof := fs.Bool("pprof", false, "serve net/http/pprof under /debug/pprof/ on the admin listener")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *cfgPath == "" {
		fmt.Fprintln(os.Stderr, "activator serve: --config FILE is required")
		return 2
	}
	logger, err := newLogger(os.Stderr, *logFormat, *logLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "activator serve:", err)
		return 2
	}
	return serve(serveOptions{configPath: *cfgPath, logger: logger, pprof: *pprof})
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	o := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, o)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

func (o serveOptions) load(ld *registry.Reloader) (*registry.Config, error) {
	load := func() (*registry.Config, error) {
		if o.configPath == "" {
			return ld.Load(o.configData)
		}
		return ld.LoadFile(o.configPath)
	}
	cfg, err := load()
	if err == nil {
		err = checkWaitingPages(cfg) // waitpage.go: what the registry cannot check
	}
	if err != nil {
		return nil, err
	}
	return cfg, nil
}

// serve runs until SIGTERM/SIGINT and returns the exit code.
func serve(o serveOptions) int {
	log := o.logger
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	bk := newBackings(ctx, log, false)
	cfg, err := o.load(bk.loader)
	if err != nil {
		printConfigErrors(os.Stderr, o.configPath, err)
		return 1
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	tlsEdge, tlsSet, err := newTLSSide(cfg, log, reg) // nil without listen_tls (edgetls.go)
	if err != nil {
		printConfigErrors(os.Stderr, o.configPath, err)
		return 1
	}
	nofile := openFileLimit()
	edgeCap, capWarning := edgeConnCap(cfg, nofile)
	if capWarning != "" {
		log.Warn(capWarning)
	}
	edgeConns := newConnLimit(edgeCap, log, edgeCapMsg, "edge.max_conns")
	adminConns := newConnLimit(cfg.AdminAccess.MaxConns, log, adminCapMsg, "admin_max_conns")
	reg.MustRegister(connMetrics{"edge": edgeConns, "admin": adminConns})
	if err := bk.contain(ctx, cfg, reg); err != nil { // before anything spawns: kills an earlier run's tenants
		log.Error("cannot contain exec tenants", "err", err)
		return 1
	}
	// One Pacer for every route's health gate; closed on return, after srv.Shutdown has joined the
	// gates.
	pacer := health.NewPacer()
	checkSocketLookups(log)
	defer func() {
		if err := pacer.Close(); err != nil {
			log.Warn("health pacer close", "err", err)
		}
	}()
	metrics := activator.NewMetrics(reg)
	srv := activator.New(activator.Options{
		Opener:     bk.provider,
		Logger:     log,
		Metrics:    metrics,
		Pacer:      pacer,
		SpillFiles: spillFiles(nofile),
	})
	// The listeners bind first, so the ports open (and READY is sent) without waiting for any
	// backing; the routes' host checks run after READY, concurrently (liveCheck).
	edgeLn, tlsLn, adminLn, activated, err := listeners(cfg, o)
	o.activated = activated
	if err != nil {
		log.Error("cannot listen", "err", err)
		_ = srv.Shutdown(context.Background())
		return 1
	}
	o.loaded = metrics.ConfigLoaded
	if err := srv.Apply(cfg); err != nil {
		log.Error("cannot start routes", "err", err)
		edgeLn.Close()
		if tlsLn != nil {
			tlsLn.Close()
		}
		adminLn.Close()
		_ = srv.Shutdown(context.Background())
		return 1
	}
	o.noteLoad(true)
	releaseLoadGarbage()
	handler, ln := edgeParts(cfg, srv, edgeConns.Listener(edgeLn), limited(edgeConns, tlsLn), tlsEdge, tlsSet)
	edge, resume := newEdgeServers(handler, srv, cfg.Edge, log)
	edge.ConnState, resume.ConnState = edgeConns.ConnState, edgeConns.ResumedConnState // before watchEdge, which wraps it
	loops := eventLoops(cfg.Edge.EventLoops)
	if loops > 0 {
		if err := srv.EnableLoop(loops, loopLimits(cfg.Edge), edgeConns.ResumedConnState); err != nil {
			log.Error("cannot start the event loops (edge.event_loops)", "err", err)
			_ = srv.Shutdown(context.Background())
			return 1
		}
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "activator_event_loop_requests_total",
			Help: "Requests the edge's event loops answered themselves (edge.event_loops); the rest were net/http's.",
		}, func() float64 { return float64(srv.LoopServed()) }))
	}
	// The door lets the shutdown stop accepting, on both edge listeners, before it stops the edge.
	door := watchEdge(edge, ln)
	access := activator.NewAdminAccess(adminPolicy(cfg))
	for _, w := range adminWarnings(cfg, listenerAddr(adminLn.Addr())) {
		log.Warn(w)
	}
	adminHandler := srv.AdminHandler(metrics.Handler(reg), access)
	if o.pprof {
		pp := http.NewServeMux()
		pp.HandleFunc("/debug/pprof/", httppprof.Index)
		pp.HandleFunc("/debug/pprof/cmdline", httppprof.Cmdline)
		pp.HandleFunc("/debug/pprof/profile", httppprof.Profile)
		pp.HandleFunc("/debug/pprof/symbol", httppprof.Symbol)
		pp.HandleFunc("/debug/pprof/trace", httppprof.Trace)
		mux := http.NewServeMux()
		mux.Handle("/debug/pprof/", access.Guard(pp)) // profiles under the admin API's own checks
		mux.Handle("/", adminHandler)
		adminHandler = mux
	}
	admin := &http.Server{
		Handler:           adminHandler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       cfg.AdminAccess.KeepAliveTimeout, // without it an idle connection stayed for ever
		MaxHeaderBytes:    1 << 20,
		ConnState:         adminConns.ConnState,
	}
	adminLn = adminConns.Listener(adminLn)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return serveHTTP(edge, door) })
	g.Go(func() error { return serveHTTP(admin, adminLn) })
	g.Go(func() error { return watchdog(gctx) })
	g.Go(func() error { return tlsEdge.runACME(gctx) })
	applied := &graceTracker{srv: srv}
	applied.grace.Store(int64(cfg.ShutdownGrace))
	ap := tlsEdge.applier(adminApplier{applied, access})
	triggers := watchReloads(log, o) // before "activator listening" and READY: see reloadTriggers
	g.Go(reloader(gctx, log, o, bk, ap, cfg, triggers))
	log.Info("activator listening", listeningAttrs(edgeLn, tlsLn, adminLn, activated, cfg, loops)...)
	if _, err := daemon.SdNotify(false, daemon.SdNotifyReady); err != nil {
		log.Warn("sd_notify READY failed", "err", err)
	}
	if o.onReady != nil {
		o.onReady(edgeLn.Addr(), adminLn.Addr())
	}
	g.Go(func() error {
		liveCheck(gctx, log, bk.provider, tenants(cfg), srv.SetCheckError)
		releaseLoadGarbage() // the checks' garbage; the load's was released before serving
		return nil
	})

	<-gctx.Done()
	grace := time.Duration(applied.grace.Load())
	log.Info("shutting down", "shutdown_grace", grace)
	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
	shutdown(log, grace, door, edge, resume, admin, srv, bk.provider)
	stop()
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		log.Error("activator stopped", "err", err)
		return 1
	}
	return 0
}

// limited is l.Listener(ln), or nil for a nil ln (no listen_tls).
func limited(l *connlimit.Limit, ln net.Listener) net.Listener {
	if ln == nil {
		return nil
	}
	return l.Listener(ln)
}

// releaseLoadGarbage returns the memory a config load used to the OS at once. Parsing a large config
// (10,000 routes) peaks at several times the heap the routes keep, and the runtime would otherwise hold
// on to it for minutes; a one-off forced GC after a load costs a few milliseconds at 10,000 routes and
// about 0.25 s at 100,000 (measured, one CPU), against minutes of the parse's peak held. A reload calls it
// once the new config is in force and the host checks are done: one forced GC for the garbage of both.
func releaseLoadGarbage() { debug.FreeOSMemory() }

// newEdgeServer is the edge's http.Server, with the client limits of e. They are read once: a reload
// that changes edge.header_timeout, keepalive_timeout, send_timeout or max_header_bytes takes effect
// at the next start (the body and hold limits are the Server's, and follow reloads).
//
// There is deliberately no ReadTimeout: it would bound a whole upload, however steadily it arrives,
// and an unbuffered body is read only once its request has left a hold that can last minutes. The
// body's own limit is edge.body_timeout, per read, buffered or streamed (internal/activator).
func newEdgeServer(h http.Handler, e registry.EdgeLimits, log *slog.Logger) *http.Server {
	return &http.Server{
		// No router in front of the activator, which routes by Host and path prefix itself: one would
		// decide nothing and cost every held request a route context and a deeper parked stack.
		Handler:           h,
		ReadHeaderTimeout: e.HeaderTimeout,
		IdleTimeout:       e.KeepAliveTimeout,
		MaxHeaderBytes:    edgeMaxHeaderBytes(e.MaxHeaderBytes),
		Protocols:         edgeProtocols(),
		// edge.send_timeout for HTTP/2 connections (h2c, and TLS ones, which activator.Listener does
		// not wrap); the activator bounds each stream's answer itself, and over HTTP/1 the Listener's
		// connections keep it.
		HTTP2:       &http.HTTP2Config{WriteByteTimeout: e.SendTimeout},
		ErrorLog:    slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ConnContext: activator.ConnContext, // with activator.Listener: how each request was framed
	}
}

// What net/http's HTTP/1 server reads of a request beyond its MaxHeaderBytes before it answers 431:
// 4 KiB of "bufio slop" (initialReadLimitSize), plus, on a new connection, the 14 bytes it peeks at
// to tell an h2c preface ("PRI * HTTP/2.0") from HTTP/1, which the limit does not count.
const (
	goHeaderSlack = 4096
	h2cPeek       = len("PRI * HTTP/2.0")
)

// edgeMaxHeaderBytes is the http.Server.MaxHeaderBytes that makes edge.max_header_bytes the
// effective limit on a new connection: a request line and header of n bytes pass and n+1 get 431.
// On a kept-alive one, net/http lets up to 4 KiB more through: it does not count what it had
// already buffered of the request while waiting for it. The activator measures each parsed request
// against n as well (internal/activator), which holds the limit there, and below 4 KiB + 15 bytes,
// where net/http's floor of 1 stops this one. HTTP/2 counts a header list as its fields plus 32
// bytes each, against MaxHeaderBytes plus 320: stricter still. n 0 (hand-built configs) is
// net/http's default, 1 MiB.
func edgeMaxHeaderBytes(n int64) int {
	if n <= 0 {
		return 0
	}
	return int(max(n-goHeaderSlack-int64(h2cPeek), 1))
}

// eventLoops is how many event loops edge.event_loops asks for: left out (registry.EventLoopsAuto),
// one per CPU Go schedules the process on (GOMAXPROCS, which follows its CPU affinity and its cgroup's
// CPU quota), at most registry.MaxEventLoops. More loops than that gain nothing: each is a goroutine
// that wants a CPU of its own while the warm path is busy.
func eventLoops(n int) int {
	if n == registry.EventLoopsAuto {
		return min(runtime.GOMAXPROCS(0), registry.MaxEventLoops)
	}
	return n
}

// loopLimits are the event loops' client limits (edge.event_loops): the edge server's. The longest
// head a loop reads is at most 8 KiB: a request with a longer one goes back to net/http, which holds
// it to edge.max_header_bytes.
func loopLimits(e registry.EdgeLimits) warmloop.Limits {
	return warmloop.Limits{MaxHead: int(min(e.MaxHeaderBytes, 8<<10)), HeaderTimeout: e.HeaderTimeout,
		IdleTimeout: e.KeepAliveTimeout, SendTimeout: e.SendTimeout}
}

// newEdgeServers returns the edge's http.Server for h, and the one that serves the connections of
// requests parked while held once their hold is over (internal/activator/park.go): requests held on
// plain HTTP/1 connections give their connections back to srv for the hold. Both have the limits of e.
func newEdgeServers(h http.Handler, srv *activator.Server, e registry.EdgeLimits, log *slog.Logger) (edge, resume *http.Server) {
	edge = newEdgeServer(h, e, log)
	resume = newEdgeServer(nil, e, log)
	srv.EnableParking(resume, h)
	return edge, resume
}

func serveHTTP(s *http.Server, ln net.Listener) error {
	if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func edgeProtocols() *http.Protocols {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true) // h2c, prior knowledge, on the plain listener
	p.SetHTTP2(true)            // over TLS, by ALPN: listen_tls's connections (tlsedge.Listener)
	return &p
}

// edgeParts are the edge http.Server's handler and listener. The listener is the plain one (with the
// PROXY hook, then the activator's framing record, which must see plaintext), joined with the TLS
// listener when t is set (the record outside it, where its HTTP/1 connections are plaintext); the
// handler is srv, with t's challenges and redirects in front, and activator.WithTLS in front of those,
// which gives the TLS listener's HTTP/1 requests the r.TLS net/http cannot see through the record.
func edgeParts(cfg *registry.Config, srv *activator.Server, plain, rawTLS net.Listener, t *tlsSide, s tlsedge.Settings) (http.Handler, net.Listener) {
	ln := activator.Listener(proxyListener(plain, srv, onListen), cfg.Edge.SendTimeout)
	if t == nil {
		return srv, ln
	}
	tlsLn := t.bind(rawTLS, s, cfg, srv)
	return activator.WithTLS(t.edge.Handler(srv)), joinListeners(ln, activator.Listener(tlsLn, cfg.Edge.SendTimeout))
}

// listeningAttrs are the "activator listening" record's attributes; socket_activated names the
// listeners systemd passed in, when it passed any (their addresses are the socket units', whatever
// the config says), and event_loops is the count the edge started (eventLoops).
func listeningAttrs(edge, edgeTLS, admin net.Listener, activated map[string]string, cfg *registry.Config, loops int) []any {
	attrs := []any{"edge", edge.Addr().String()}
	if edgeTLS != nil {
		attrs = append(attrs, "edge_tls", edgeTLS.Addr().String())
	}
	attrs = append(attrs, "admin", admin.Addr().String(), "routes", len(cfg.Routes), "instances", len(cfg.Instances),
		"event_loops", loops)
	var names []string
	for _, n := range []string{"edge", "edge-tls", "admin"} {
		if activated[n] != "" {
			names = append(names, n)
		}
	}
	if len(names) > 0 {
		attrs = append(attrs, "socket_activated", strings.Join(names, ","))
	}
	return attrs
}

// listeners returns the edge's plain and TLS listeners and the admin listener: passed in by systemd
// socket activation (FileDescriptorName=edge, edge-tls and admin, see units/activator.socket and
// units/activator-admin.socket) when present, bound here otherwise. edgeTLS is nil without listen_tls
// (a descriptor named edge-tls is then closed). The admin address is host:port or unix:/path
// (listenAdmin). activated maps those that systemd passed in and that are used to their network.
func listeners(cfg *registry.Config, o serveOptions) (edge, edgeTLS, admin net.Listener, activated map[string]string, err error) {
	named, err := activation.ListenersWithNames()
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("systemd socket activation: %w", err)
	}
	first := func(name string) net.Listener {
		if l := named[name]; len(l) > 0 {
			return l[0]
		}
		return nil
	}
	edge, edgeTLS, admin = first("edge"), first("edge-tls"), first("admin")
	if edgeTLS != nil && cfg.ListenTLS == "" {
		edgeTLS.Close()
		edgeTLS = nil
	}
	activated = map[string]string{}
	for name, l := range map[string]net.Listener{"edge": edge, "edge-tls": edgeTLS, "admin": admin} {
		if l != nil {
			activated[name] = l.Addr().Network()
		}
	}
	edgeAddr, adminAddr := cfg.Listen, cfg.Admin
	if o.listen != "" {
		edgeAddr = o.listen
	}
	if o.admin != "" {
		adminAddr = o.admin
	}
	closeAll := func() {
		for _, l := range []net.Listener{edge, edgeTLS, admin} {
			if l != nil {
				l.Close()
			}
		}
	}
	if edge == nil {
		if edge, err = net.Listen("tcp", edgeAddr); err != nil {
			closeAll()
			return nil, nil, nil, nil, fmt.Errorf("edge: %w", err)
		}
	}
	if edgeTLS == nil && cfg.ListenTLS != "" {
		if edgeTLS, err = net.Listen("tcp", cfg.ListenTLS); err != nil {
			closeAll()
			return nil, nil, nil, nil, fmt.Errorf("listen_tls: %w", err)
		}
	}
	if admin == nil {
		if admin, err = listenAdmin(adminAddr, cfg.AdminAccess.Socket); err != nil {
			closeAll()
			return nil, nil, nil, nil, fmt.Errorf("admin: %w", err)
		}
	}
	return edge, edgeTLS, admin, activated, nil
}

// watchdog pings systemd's watchdog at half its interval while the activator runs (no-op otherwise).
func watchdog(ctx context.Context) error {
	every, err := daemon.SdWatchdogEnabled(false)
	if err != nil || every == 0 {
		return nil
	}
	t := time.NewTicker(every / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			_, _ = daemon.SdNotify(false, daemon.SdNotifyWatchdog)
		}
	}
}

// reloadTriggers are what the reloader waits on: SIGHUP, and a watch of the config file's directory.
// serve sets them up before it says it is listening (the log line, READY), so that a `systemctl
// reload` or a config manager's write right after the start is seen: set up by the reloader's own
// goroutine, which may run later, a SIGHUP could still have its default action (the process ends)
// and a write could go unseen.
type reloadTriggers struct {
	hup    chan os.Signal
	w      *fsnotify.Watcher     // nil when the file cannot be watched
	events <-chan fsnotify.Event // nil then
}

// watchReloads sets up the triggers for o's config file: nil without one (the demo's embedded
// config), when SIGHUP keeps its default action. A file that cannot be watched is logged; SIGHUP
// still reloads it.
func watchReloads(log *slog.Logger, o serveOptions) *reloadTriggers {
	if o.configPath == "" {
		return nil
	}
	tr := &reloadTriggers{hup: make(chan os.Signal, 1)}
	signal.Notify(tr.hup, syscall.SIGHUP)
	w, err := fsnotify.NewWatcher()
	if err != nil {
		log.Warn("config file watching disabled", "err", err)
		return tr
	}
	// Watch the directory: editors and config managers replace the file by rename.
	if err := w.Add(filepath.Dir(o.configPath)); err != nil {
		log.Warn("config file watching disabled", "err", err)
		w.Close()
		return tr
	}
	tr.w, tr.events = w, w.Events
	return tr
}

// close stops the triggers, once the shutdown has begun. SIGHUP is ignored from then on, not given
// back its default action: the shutdown runs for up to shutdown_grace, and a `systemctl reload`, a
// config manager or a logrotate hook racing it ended the process there and then (exit 129), its held
// requests unanswered and its tenants not put down (found by an operator trial).
func (tr *reloadTriggers) close(log *slog.Logger) {
	signal.Ignore(syscall.SIGHUP)
	if tr.w != nil {
		tr.w.Close()
	}
	log.Debug("reloads stopped for the shutdown", "sighup", "ignored until the process exits")
}

// reloader returns what reloads on tr's triggers, SIGHUP and changes of the config file (see
// reloadLoop for how bursts of them coalesce; newReload for what one reload does), until ctx ends,
// and then closes tr; with tr nil it only waits for that. running is the config serve started with.
// The certificate directories are watched before it returns, and so before "activator listening" and
// READY: armed in the returned function's goroutine, a renewal written right after the start could
// come before the watch and go unseen until the next SIGHUP (found as a flaky test,
// TestTLSRenewalThroughSymlinks, once the event loops' start changed the timing).
func reloader(ctx context.Context, log *slog.Logger, o serveOptions, bk *backings, srv applier, running *registry.Config, tr *reloadTriggers) func() error {
	if tr == nil {
		return func() error {
			<-ctx.Done()
			return nil
		}
	}
	w, events := tr.w, tr.events
	l := &reloadLoop{
		hup:    tr.hup,
		events: events,
		log:    log,
		file:   filepath.Base(o.configPath),
		settle: func() <-chan time.Time { return time.After(settleTime) },
		reload: newReload(ctx, log, o, bk, srv, running),
	}
	if w != nil {
		l.errs = w.Errors
	}
	if fw, ok := srv.(fileWatcher); ok && events != nil {
		watchCertDirs(l, w, fw, log)
	}
	return func() error {
		defer tr.close(log)
		l.run(ctx)
		return nil
	}
}

// fileWatcher is an applier whose config names more files that a change to should reload: the TLS
// edge's certificates and keys (tlsApplier).
type fileWatcher interface {
	watchedFiles() []string
}

// newReload returns one reload: it reads the config file, and applies the new config or, when it is
// bad, logs all its problems and keeps the old one in force. running is the config serve started with:
// a reload that changes a key read only at start-up (startOnly: the listeners' addresses, the edge
// server's own limits, ...) applies the rest and warns that the key keeps its value until a restart.
// Reloads run one at a time (reloadLoop).
func newReload(ctx context.Context, log *slog.Logger, o serveOptions, bk *backings, srv applier, running *registry.Config) func(trigger string) {
	// Only the start-up keys' values: holding running itself would keep its every route alive for the
	// process's life once a reload has replaced them.
	started := startOnly(running, o)
	return func(trigger string) {
		cfg, err := o.load(bk.loader)
		// The metric before the log line, which a reader (an operator, a test) may act on at once.
		if err != nil {
			o.noteLoad(false)
			errs := registry.Errors(err)
			log.Error("config reload rejected; the old config stays in force", "trigger", trigger, "problems", len(errs))
			for _, e := range errs {
				log.Error("config problem", "file", o.configPath, "err", e)
			}
			return
		}
		if err := srv.Apply(cfg); err != nil {
			o.noteLoad(false)
			log.Error("config reload failed; the old config stays in force", "trigger", trigger, "err", err)
			return
		}
		o.noteLoad(true)
		log.Info("config reloaded", "trigger", trigger, "routes", len(cfg.Routes), "instances", len(cfg.Instances), "decoded", bk.loader.Decoded())
		warnStartOnly(log, started, startOnly(cfg, o))
		liveCheck(ctx, log, bk.provider, tenants(cfg), srv.SetCheckError)
		// After the host checks, whose garbage goes back to the OS with the load's; cfg itself is
		// garbage by now but for the routes that changed.
		releaseLoadGarbage()
	}
}

// settleTime is how long the config file must go without events before it is reloaded: editors
// write in several steps.
const settleTime = 100 * time.Millisecond

// reloadLoop turns reload triggers into reloads, one at a time. A SIGHUP reloads at once; an event on
// the config file (re)starts the settle window, and the reload runs when it ends. Just before each
// reload, every trigger already pending (a SIGHUP, file events, an open settle window) is dropped: the
// reload reads the file as it is by then, so it covers them. A burst (an editor's write+rename, a
// SIGHUP sent while the file changes) thus costs one reload; a trigger that arrives once a reload has
// begun causes one more.
type reloadLoop struct {
	hup    <-chan os.Signal
	events <-chan fsnotify.Event // nil when the file is not watched
	// errs are the watcher's errors (nil when the file is not watched): drained, since an undrained
	// one stalls its events, and each reloads, since the events an overflow lost may have changed a file.
	errs   <-chan error
	log    *slog.Logger            // nil: the errors are not logged
	file   string                  // the config file's base name; events on other files are ignored
	settle func() <-chan time.Time // opens a settle window: the channel receives when it ends
	reload func(trigger string)    // one reload; the loop waits for it
	// others, when set, reports whether an event on another file than the config reloads (one in a
	// certificate's directory, watchCertDirs); afterReload, when set, runs after each reload.
	others      func(ev fsnotify.Event) bool
	afterReload func()
}

// run reloads until ctx ends.
func (l *reloadLoop) run(ctx context.Context) {
	var settled <-chan time.Time // the open settle window; nil when none is
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.hup:
			settled = nil
			l.drain()
			l.reloadNow("SIGHUP")
		case ev, ok := <-l.events:
			if !ok {
				l.events = nil
				continue
			}
			if l.touches(ev) {
				settled = l.settle()
			}
		case err, ok := <-l.errs:
			if !ok {
				l.errs = nil
				continue
			}
			if l.log != nil {
				l.log.Warn("file watch error; reloading in case a change was lost", "err", err)
			}
			settled = l.settle()
		case <-settled:
			settled = nil
			l.drain()
			l.reloadNow("file change")
		}
	}
}

func (l *reloadLoop) reloadNow(trigger string) {
	l.reload(trigger)
	if l.afterReload != nil {
		l.afterReload()
	}
}

// drain drops the triggers already pending.
func (l *reloadLoop) drain() {
	for {
		select {
		case <-l.hup:
		case _, ok := <-l.events:
			if !ok {
				l.events = nil
			}
		case _, ok := <-l.errs:
			if !ok {
				l.errs = nil
			}
		default:
			return
		}
	}
}

// touches reports whether ev may have changed the config file, or another file it names (others).
func (l *reloadLoop) touches(ev fsnotify.Event) bool {
	if filepath.Base(ev.Name) == l.file {
		return ev.Op&(fsnotify.Write|fsnotify.Create|fsnotify.Rename) != 0
	}
	return l.others != nil && l.others(ev)
}

// Host checks run this many at a time, each within checkBound: a route whose BMC or bus does not
// answer is marked failed after checkBound and delays no other route.
const (
	checkParallel = 16
	checkBound    = 10 * time.Second
)

// liveCheck runs each route's backing host checks (e.g. "this systemd cannot freeze units"), at most
// checkParallel at once, and reports each result to mark (nil: passed) and what fails to the log. The
// route still loads, and its wakes fail with the same message. It returns once every check has ended,
// within about checkBound per checkParallel routes.
func liveCheck(ctx context.Context, log *slog.Logger, p *split.Provider, routes []*registry.Route, mark func(route string, err error)) {
	var g errgroup.Group
	g.SetLimit(checkParallel)
	for _, r := range routes {
		g.Go(func() error {
			cctx, cancel := context.WithTimeout(ctx, checkBound)
			defer cancel()
			err := checkTenant(cctx, p, r)
			if err != nil {
				log.Error("route check failed", "route", r.Name, "err", err)
			}
			mark(r.Name, err)
			return nil
		})
	}
	_ = g.Wait()
}

// checkTenant runs r's live checks: its own, or each fleet member's (a member has settings of its own),
// all within ctx. A member's finding names it (activator.MemberCheckError): it holds until that member
// comes up, whatever the others do.
func checkTenant(ctx context.Context, p *split.Provider, r *registry.Route) error {
	if r.Fleet == nil {
		return p.Check(ctx, r)
	}
	var errs []error
	for _, m := range r.Fleet.Members {
		if err := p.Check(ctx, r.MemberRoute(m)); err != nil {
			errs = append(errs, &activator.MemberCheckError{Member: m.Name, Err: err})
		}
	}
	return errors.Join(errs...)
}

// tenants is every route and instance of cfg, routes first: what the live checks cover.
func tenants(cfg *registry.Config) []*registry.Route { return slices.Concat(cfg.Routes, cfg.Instances) }

func printConfigErrors(w io.Writer, path string, err error) {
	errs := registry.Errors(err)
	where := path
	if where == "" {
		where = "config"
	}
	fmt.Fprintf(w, "%s: %d problem%s:\n", where, len(errs), plural(len(errs)))
	for _, e := range errs {
		fmt.Fprintf(w, "  %s\n", strings.TrimSpace(e.Error()))
	}
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// checkSocketLookups warns at start when the kernel's socket lookups (internal/sockdiag) cannot be used
// here. Nothing breaks: the health gates and the check that no stranger holds a tenant's upstream dial
// instead, at the CPU and the time on every cold wake that the lookups save. The usual cause is a
// sandbox that leaves out AF_NETLINK (systemd's RestrictAddressFamilies=).
func checkSocketLookups(log *slog.Logger) {
	c, err := sockdiag.Open()
	if errors.Is(err, sockdiag.ErrUnsupported) {
		return // not Linux: nothing an operator can change
	}
	if err == nil {
		c.Close()
		if !sockdiag.Trusted(netip.AddrFrom4([4]byte{127, 0, 0, 1})) {
			err = errors.New("the kernel's TCP socket lookups do not find this process's own listener (a kernel without TCP socket diagnostics)")
		}
	}
	if err != nil {
		log.Warn("socket lookups unavailable: health gates and the foreign-listener check dial instead", "err", err,
			"hint", "a sandbox that restricts address families must allow AF_NETLINK (systemd: RestrictAddressFamilies=)")
	}
}
