package main

// The activator's shutdown on SIGTERM: the order in which the edge, the routes, the backings and the
// admin API stop, and the edge listener that lets the edge stop accepting without losing a request.

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/backend/split"
	"github.com/activator/activator/internal/registry"
)

// shutdown stops the activator within grace, in this order:
//
//  1. The edge stops accepting (door.stop). Under socket activation systemd keeps the listening
//     socket, so new connections wait in its backlog for the next activator. Keep-alive ends: every
//     answer from now on closes its connection. Connections already accepted get a moment
//     (firstRequestWait) to send their first request.
//  2. The drain (srv.Shutdown), while the edge's http.Server shuts down alongside: no wake starts;
//     requests to awake tenants are still served, and those that would wait for a wake get 503 with
//     Retry-After; each route's tenant is put down by its backing's Close (exec children: their stop
//     signal, then stop_grace) as soon as the route has nothing held or in flight. When only a reserve
//     of the grace is left, held requests get 503 with Retry-After and the remaining routes are closed
//     too.
//  3. When the grace is over, the connections of requests still in flight are closed: the one cut a
//     bounded stop cannot avoid, logged with its count. The same goes for the connections of requests
//     that were parked while held, which the resume server serves (internal/activator/park.go).
//  4. The backings' shared resources are released (the unit backing's D-Bus connections), then the
//     admin API stops.
//
// The edge's shutdown and the drain run together under one deadline: http.Server.Shutdown waits for
// every handler, held ones included, and only the drain can answer those.
func shutdown(log *slog.Logger, grace time.Duration, door *edgeDoor, edge, resume, admin *http.Server, srv *activator.Server, p *split.Provider) {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	door.stop()
	edge.SetKeepAlivesEnabled(false)
	resume.SetKeepAlivesEnabled(false)
	door.waitFirstRequests(firstRequestWait(grace))

	edgeDone := make(chan error, 1)
	go func() { edgeDone <- edge.Shutdown(ctx) }()
	if err := srv.Shutdown(ctx); err != nil {
		log.Warn("route shutdown did not finish within the shutdown grace", "err", err)
	}
	if err := <-edgeDone; err != nil {
		inflight := 0
		for _, st := range srv.Statuses() {
			inflight += st.InFlight
		}
		if inflight > 0 {
			log.Warn("shutdown grace over: closing the connections of requests still in flight", "requests", inflight, "shutdown_grace", grace)
		}
		_ = edge.Close() // with none in flight, what is left is answered connections not yet seen idle
	}
	// The parked requests' connections, answered after their hold (srv.Shutdown has handed every one
	// back), are the resume server's.
	if err := resume.Shutdown(ctx); err != nil {
		_ = resume.Close()
	}
	if err := p.Close(); err != nil {
		log.Warn("backing shutdown", "err", err)
	}
	if err := admin.Shutdown(ctx); err != nil {
		_ = admin.Close()
	}
}

// firstRequestWait bounds how long a shutdown waits for connections already accepted to send their
// first request: a tenth of the grace, at most a second. A client that connected and sends nothing
// meanwhile is not waited for longer.
func firstRequestWait(grace time.Duration) time.Duration { return min(time.Second, grace/10) }

// edgeDoor is the edge's listener as the shutdown needs it. stop ends accepting without shutting the
// http.Server down: under socket activation that leaves new connections in systemd's backlog.
// http.Server.Shutdown, called next, closes a connection without an answer when it has read that
// connection's first request but not yet handed it to the handler as the shutdown begins (net/http's
// conn.serve checks for a shutdown between the two), so the door also watches which connections it
// accepted have not had a request reach the handler yet: through the server's ConnState, ConnContext
// and Handler.
type edgeDoor struct {
	net.Listener
	stopOnce  sync.Once
	stopped   chan struct{} // closed by stop
	closeOnce sync.Once
	closed    chan struct{} // closed by Close
	parkOnce  sync.Once
	// parked is closed when Accept, after stop, first waits for Close: the server has taken in every
	// connection accepted before (ConnState StateNew), and comes back for no more.
	parked chan struct{}

	fresh sync.Map     // net.Conn -> struct{}: accepted, no request handled yet
	nNew  atomic.Int64 // entries in fresh
	mu    sync.Mutex   // guards emptied
	// emptied is made by waitFirstRequests and closed when the last fresh connection has had a request
	// handled or gone; nil while nobody waits.
	emptied chan struct{}
}

// watchEdge returns ln as an edgeDoor that watches edge's connections (it wraps edge's ConnState,
// ConnContext and Handler, so call it once edge is otherwise set up); serve edge on it.
func watchEdge(edge *http.Server, ln net.Listener) *edgeDoor {
	d := &edgeDoor{Listener: ln, stopped: make(chan struct{}), closed: make(chan struct{}), parked: make(chan struct{})}
	prevState := edge.ConnState
	edge.ConnState = func(c net.Conn, s http.ConnState) {
		d.connState(c, s)
		if prevState != nil {
			prevState(c, s)
		}
	}
	prevContext := edge.ConnContext
	edge.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if prevContext != nil {
			ctx = prevContext(ctx, c)
		}
		return context.WithValue(ctx, doorConnKey{}, c)
	}
	next := edge.Handler
	edge.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d.nNew.Load() > 0 {
			if c, ok := r.Context().Value(doorConnKey{}).(net.Conn); ok {
				d.handled(c)
			}
		}
		next.ServeHTTP(w, r)
	})
	return d
}

// doorConnKey is the request context key of the connection a request came on (watchEdge).
type doorConnKey struct{}

// Accept accepts until stop; after it, it blocks until Close (the http.Server's, once it shuts down, so
// that Serve then ends without an error).
func (d *edgeDoor) Accept() (net.Conn, error) {
	c, err := d.Listener.Accept()
	if err == nil {
		return c, nil
	}
	select {
	case <-d.stopped:
		d.parkOnce.Do(func() { close(d.parked) })
		<-d.closed
		return nil, net.ErrClosed
	default:
		return nil, err
	}
}

// stop ends accepting: the listener is closed (under socket activation systemd keeps the socket).
func (d *edgeDoor) stop() {
	d.stopOnce.Do(func() {
		close(d.stopped)
		_ = d.Listener.Close()
	})
}

// Close stops the door for good; Accept returns net.ErrClosed.
func (d *edgeDoor) Close() error {
	d.closeOnce.Do(func() { close(d.closed) })
	d.stop()
	return nil
}

// connState notes a connection accepted (StateNew), or gone without a request handled.
func (d *edgeDoor) connState(c net.Conn, s http.ConnState) {
	switch s {
	case http.StateNew:
		d.fresh.Store(c, struct{}{})
		d.nNew.Add(1)
	case http.StateClosed, http.StateHijacked:
		d.handled(c)
	}
}

// handled notes that c is no longer fresh: a request of it reached the handler, or it is gone. (Not
// StateActive: net/http reports it before its check for a shutdown, which may still drop the request.)
func (d *edgeDoor) handled(c net.Conn) {
	// A miss, for every later request on a keep-alive connection, takes no lock.
	if _, ok := d.fresh.LoadAndDelete(c); ok && d.nNew.Add(-1) == 0 {
		d.mu.Lock()
		if d.emptied != nil {
			close(d.emptied)
			d.emptied = nil
		}
		d.mu.Unlock()
	}
}

// waitFirstRequests returns, after stop, once every connection accepted has had a request reach the
// handler or closed, or after at most wait. It first waits for the server to have taken in the last
// connection accepted (parked): one Accept returned just before stop is not registered yet.
func (d *edgeDoor) waitFirstRequests(wait time.Duration) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-d.parked:
	case <-t.C:
		return
	}
	d.mu.Lock()
	if d.nNew.Load() == 0 {
		d.mu.Unlock()
		return
	}
	emptied := make(chan struct{})
	d.emptied = emptied
	d.mu.Unlock()
	select {
	case <-emptied:
	case <-t.C:
	}
}

// applier applies a config and records its routes' host checks: the reloader's view of the
// activator.
type applier interface {
	Apply(cfg *registry.Config) error
	SetCheckError(route string, err error)
}

// graceTracker applies configs to srv and keeps the shutdown_grace of the one last applied, which is
// the one shutdown honours.
type graceTracker struct {
	srv   *activator.Server
	grace atomic.Int64 // a time.Duration
}

func (a *graceTracker) SetCheckError(route string, err error) { a.srv.SetCheckError(route, err) }

func (a *graceTracker) Apply(cfg *registry.Config) error {
	if err := a.srv.Apply(cfg); err != nil {
		return err
	}
	a.grace.Store(int64(cfg.ShutdownGrace))
	return nil
}
