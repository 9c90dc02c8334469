// Package activator owns the edge: it routes each request by Host and path prefix to a route's
// instance, holds the request while the instance wakes (exactly one wake however many requests arrive),
// releases every held request together once the health gate passes, proxies, and puts the instance back
// to sleep when its idle window passes with nothing in flight.
//
// It declares the Backend it needs (backend.go) and never imports a backend: internal/backend/split
// provides them, and cmd/activator wires everything.
package activator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/activator/activator/internal/health"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// Options configure a Server.
type Options struct {
	Opener  tenant.Opener
	Logger  *slog.Logger
	Metrics *Metrics // nil records nothing
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
	// Pacer times the default health gates' fast pauses (health.Pacer). The caller owns it: it
	// outlives the Server, and the caller closes it after Shutdown has returned. nil: the gates pause
	// on timers, up to a millisecond late in an idle process.
	Pacer *health.Pacer
	// NewGate builds a route's health gate (tests); default health.New with Pacer.
	NewGate func(r *registry.Route) Gate
}

// Server is the activator: the edge handler, the instances and the admin operations. Create it with
// New, give it a config with Apply (again on every reload), serve ServeHTTP on the edge listener and
// Admin on the admin listener, and call Shutdown once at exit.
type Server struct {
	opts Options
	root context.Context
	stop context.CancelFunc
	log  *slog.Logger

	table atomic.Pointer[table] // the routing table requests read without locking

	mu        sync.Mutex // guards the fields below; held across Apply so reloads do not interleave
	instances map[string]*instance
	retiring  []*instance
	closed    bool
}

// New returns a Server whose wakes live until Shutdown.
func New(opts Options) *Server {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.NewGate == nil {
		opts.NewGate = func(r *registry.Route) Gate {
			return health.New(r.Upstream, r.Health, health.WithPacer(opts.Pacer))
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	root, stop := context.WithCancel(context.Background())
	s := &Server{opts: opts, root: root, stop: stop, log: opts.Logger, instances: map[string]*instance{}}
	s.table.Store(&table{})
	return s
}

// Apply makes cfg the running configuration. Unchanged routes keep their instance (and their awake
// tenant). A changed route gets a new instance whose first wake waits until the old one has retired;
// the old one finishes its in-flight and held requests, sleeps, and closes. Removed routes retire the
// same way. Held requests are never dropped. If a backend cannot be opened, nothing changes and the
// error names the route.
func (s *Server) Apply(cfg *registry.Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	next := make(map[string]*instance, len(cfg.Routes))
	var opened []*instance
	for _, r := range cfg.Routes {
		if old, ok := s.instances[r.Name]; ok && reflect.DeepEqual(old.route, r) {
			next[r.Name] = old
			continue
		}
		b, err := s.opts.Opener.Open(r)
		if err != nil {
			for _, in := range opened {
				in.teardown()
			}
			return err
		}
		in := newInstance(s.root, r, b, s.log, s.opts.Metrics, s.opts.Now, func() Gate { return s.opts.NewGate(r) })
		if old, ok := s.instances[r.Name]; ok {
			in.after = old.retired
		}
		next[r.Name] = in
		opened = append(opened, in)
	}
	for name, old := range s.instances {
		if next[name] != old {
			s.retiring = append(s.retiring, old)
			old.retire() // it deletes the route's metric series once it has retired, unless next[name] holds them
			if next[name] == nil {
				s.log.Info("route removed", "route", name)
			} else {
				s.log.Info("route changed", "route", name)
			}
		}
	}
	s.instances = next
	s.table.Store(buildTable(cfg, next))
	for _, in := range opened {
		in.start()
	}
	s.pruneRetiredLocked()
	return nil
}

func (s *Server) pruneRetiredLocked() {
	s.retiring = slices.DeleteFunc(s.retiring, func(in *instance) bool {
		select {
		case <-in.retired:
			in.wg.Wait()
			return true
		default:
			return false
		}
	})
}

// Shutdown stops every instance and joins its goroutines. Wakes in progress are canceled; held
// requests are answered 503; backends' Close decides what happens to running tenants (exec children are
// killed, systemd units are left to systemd). ctx bounds the wait.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	all := make([]*instance, 0, len(s.instances)+len(s.retiring))
	for _, in := range s.instances {
		all = append(all, in)
	}
	all = append(all, s.retiring...)
	s.mu.Unlock()
	s.stop()
	done := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		for _, in := range all {
			wg.Add(1)
			go func() { defer wg.Done(); in.shutdown() }()
		}
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("shutdown: %w", ctx.Err())
	}
}

// ServeHTTP is the edge: route, hold, proxy.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rt := s.table.Load().lookup(r.Host, r.URL.Path)
	if rt == nil {
		writeError(w, r, fmt.Errorf("%w %q", ErrUnknownHost, hostOnly(r.Host)))
		s.opts.Metrics.requestCounter("_unknown")(http.StatusNotFound)
		return
	}
	sw := &statusWriter{ResponseWriter: w}
	defer func() { rt.count(sw.statusCode()) }()
	release, err := rt.in.acquire(r.Context(), triggerRequest)
	if err != nil {
		sw.fail(r, err)
		return
	}
	defer release()
	done, err := rt.in.admit(r.Context())
	if err != nil {
		sw.fail(r, err) // admit fails only when the client went away
		return
	}
	defer done()
	rt.in.client().Serve(sw, r)
}

// Wake wakes the named route and waits for the result (admin API).
func (s *Server) Wake(ctx context.Context, route string) error {
	in := s.instance(route)
	if in == nil {
		return fmt.Errorf("%w: %q", errNoRoute, route)
	}
	return in.wakeNow(ctx)
}

// Sleep puts the named route to sleep and waits until it is asleep (admin API).
func (s *Server) Sleep(ctx context.Context, route string) error {
	in := s.instance(route)
	if in == nil {
		return fmt.Errorf("%w: %q", errNoRoute, route)
	}
	return in.sleepNow(ctx, ReasonAdmin)
}

// Statuses reports every route, in config order.
func (s *Server) Statuses() []Status {
	t := s.table.Load()
	out := make([]Status, 0, len(t.order))
	for _, in := range t.order {
		out = append(out, in.status())
	}
	return out
}

var errNoRoute = errors.New("no such route")

func (s *Server) instance(name string) *instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.instances[name]
}

// statusWriter records the status code. It unwraps for http.ResponseController, so flushing and the
// hijack that WebSocket upgrades need reach the real writer.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 || w.code < 200 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// fail answers r with err (writeError), unless the client went away (r's context ended): then nobody
// is there to read an answer, and only the metrics see one, 499. It is the edge's one "client went
// away" check, for the hold, the upstream slot and the upstream exchange alike.
func (w *statusWriter) fail(r *http.Request, err error) {
	if r.Context().Err() != nil {
		w.code = 499
		return
	}
	writeError(w, r, err)
}

func (w *statusWriter) statusCode() int {
	if w.code == 0 {
		return http.StatusOK
	}
	return w.code
}

func hostOnly(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		return host
	}
	return strings.TrimSuffix(h, ".")
}
