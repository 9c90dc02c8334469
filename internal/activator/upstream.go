package activator

// The instance's side of its upstream: the client it builds once, the connections it hands over, and
// the idle ones it drops when the tenant is gone.

import (
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/upstream"
)

// upstreamConns is the route's max_upstream_conns: the requests it proxies at once. The instance
// admits requests to the proxy up to it (see instance.admit); the upstream client is capped at it too,
// as a backstop.
//
// Why a cap at all: a herd released at once would otherwise open one upstream connection per held
// request, and 10,000 held requests would become 10,000 dials to a tenant that has just started, and
// as many file descriptors (on top of the 10,000 client sockets). The cost: more concurrent
// long-lived requests (SSE streams, WebSockets) than the cap queue until one ends.
func upstreamConns(r *registry.Route) int {
	if r.MaxUpstreamConns > 0 {
		return r.MaxUpstreamConns
	}
	return registry.DefaultMaxUpstreamConns
}

// client returns the route's upstream client, building it on first use: most routes of a large
// config never wake, and need none. It is kept for the instance's life, so its connection pool
// survives reloads.
func (in *instance) client() *upstream.Client { return in.lazyClient(&in.up, in.route) }

// lazyClient returns the upstream client in slot, building one to r's upstream if slot is empty. The
// instance's own client and each fleet member's are built this way, answering failures as the
// instance does, with the route's response_timeout and the running edge.tunnel_timeout; of two racing
// first calls, one client is kept.
func (in *instance) lazyClient(slot *atomic.Pointer[upstream.Client], r *registry.Route) *upstream.Client {
	if c := slot.Load(); c != nil {
		return c
	}
	u := &unaskedLog{in: in, upstream: r.Upstream.Address}
	f := &failedLog{in: in}
	tl := &tunnelLog{in: in}
	slot.CompareAndSwap(nil, upstream.New(upstream.Options{
		Network:       r.Upstream.Network,
		Address:       r.Upstream.Address,
		MaxConns:      upstreamConns(r),
		TrustedProxy:  in.trusted,
		ErrorHandler:  f.answer,
		OnUnasked:     u.note,
		TunnelTimeout: in.tunnel,
		OnTunnelOpen:  in.series.tunnelOpened,
		OnTunnelEnd:   tl.ended,
		Logger:        in.logger(),
		// The route's, not r's: a fleet member's route carries its upstream alone.
		ResponseTimeout: in.route.ResponseTimeout,
	}))
	return slot.Load()
}

// unaskedEvery is how often, at most, a route logs the upstream connections it closed for bytes no
// request asked for: a tenant with that bug has it on every answer, and a line each would flood the log.
const unaskedEvery = time.Minute

// throttle lets a log line through for the first of a kind of event at once, then at most one per
// every, each saying how many events there were since the line before: what a tenant or a client can
// cause on every request must not flood the log (and the disk under it).
type throttle struct {
	mu     sync.Mutex // guards the fields below
	n      int        // events since the last line
	logged time.Time  // when the last line was written; zero: never
}

// note counts an event at now and reports whether to write a line for it, and for how many events.
func (t *throttle) note(now time.Time, every time.Duration) (n int, write bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n++
	if !t.logged.IsZero() && now.Sub(t.logged) < every {
		return 0, false
	}
	n, t.n, t.logged = t.n, 0, now
	return n, true
}

// unaskedLog reports the upstream connections one client closed because the tenant sent bytes on them
// with no request pending (upstream.Options.OnUnasked): the first at once, then at most one line per
// unaskedEvery, each with the count since the line before.
type unaskedLog struct {
	in       *instance
	upstream string // the address, which tells fleet members apart
	throttle
}

func (u *unaskedLog) note() {
	n, write := u.throttle.note(u.in.now(), unaskedEvery)
	if !write {
		return
	}
	u.in.logger().Warn("the tenant sent bytes no request asked for; closed that upstream connection unused",
		"upstream", u.upstream, "connections", n,
		"cause", "a body longer than its Content-Length, or a write after the answer (a second answer, an error page)",
		"why", "read as the next request's answer, they would have gone to another client")
}

// tunnelEvery is how often, at most, an upstream client (a route's, or a fleet member's) logs the
// upgraded connections it closed for passing no byte for edge.tunnel_timeout: a client can open
// sockets by the thousand and leave them silent.
const tunnelEvery = time.Minute

// tunnelLog hears how each upgraded connection (WebSocket) of one upstream client ended
// (upstream.Options.OnTunnelEnd): it counts each in activator_tunnels_closed_total by reason, and
// reports those the edge closed for silence at INFO: it is the bound doing its job, not a fault. The
// first at once, then at most one line per tunnelEvery, each with the count since the line before.
type tunnelLog struct {
	in *instance
	throttle
}

func (l *tunnelLog) ended(e upstream.TunnelEnd) {
	l.in.series.tunnelEnded(e.Why)
	if e.Why != upstream.TunnelIdle {
		return
	}
	n, write := l.throttle.note(l.in.now(), tunnelEvery)
	if !write {
		return
	}
	l.in.logger().Info("closed an upgraded connection (a WebSocket) that passed no byte either way for edge.tunnel_timeout",
		"tunnel_timeout", e.Bound, "open", e.Open, "connections", n)
}

// outOfFilesMsg is logged for a request answered 503 because its upstream connection could not be
// opened for want of a file descriptor.
const outOfFilesMsg = "the activator is out of file descriptors"

// failedEvery is how often, at most, one upstream client logs the requests whose exchange with the
// tenant failed: a tenant that resets a path does so for every client that asks for it, and one line
// each, with the client's path in it, let anyone fill the disk (found by an operator trial: 300 requests
// for an 8 KB path, 2.4 MB of log).
const failedEvery = 10 * time.Second

// maxLoggedPath bounds the request path a failure's log line quotes.
const maxLoggedPath = 256

// failedLog is one upstream client's ErrorHandler: upstreamFailed, its log lines throttled.
type failedLog struct {
	in *instance
	throttle
}

func (f *failedLog) answer(w http.ResponseWriter, r *http.Request, err error) {
	f.in.upstreamFailedLog(w, r, err, &f.throttle)
}

// upstreamFailed answers a request whose upstream exchange failed, on either path of the client; its
// log line is not throttled (fleet.go's own failure, no member ready, is rare and short).
func (in *instance) upstreamFailed(w http.ResponseWriter, r *http.Request, err error) {
	in.upstreamFailedLog(w, r, err, nil)
}

// upstreamFailedLog is upstreamFailed with its log lines throttled by t (nil: none).
func (in *instance) upstreamFailedLog(w http.ResponseWriter, r *http.Request, err error, t *throttle) {
	sw, ok := w.(*statusWriter)
	if !ok {
		sw = &statusWriter{ResponseWriter: w} // only a test calls the client with another writer
	}
	ue := &UpstreamError{Route: in.route.Name, Err: err}
	logged := func() (n int, write bool) {
		if t == nil {
			return 1, true
		}
		return t.note(in.now(), failedEvery)
	}
	path := r.URL.Path
	if len(path) > maxLoggedPath {
		path = path[:maxLoggedPath] + "…"
	}
	switch code, _ := statusFor(ue); {
	case r.Context().Err() != nil: // the client left: nothing failed that it will see
	case code == http.StatusBadGateway:
		// The client is told the failure's class alone (clientMessage); the whole error is logged.
		if n, write := logged(); write {
			in.logger().Warn("upstream failed", "method", r.Method, "path", path, "err", err, "failures", n)
		}
	case errors.Is(err, upstream.ErrResponseTimeout):
		if n, write := logged(); write {
			in.logger().Warn("the tenant did not begin its answer in time; answered 504 and closed that connection",
				"method", r.Method, "path", path, "response_timeout", in.route.ResponseTimeout, "failures", n,
				"fix", "a tenant that is slow on purpose (a report, a model's unstreamed answer) needs a longer response_timeout; one that hangs, a look at its own log")
		}
	case outOfFiles(err):
		in.logger().Warn(outOfFilesMsg, "method", r.Method, "path", path, "err", err,
			"fix", "raise the open-file limit (LimitNOFILE= in the unit), or lower edge.max_conns to leave more of it for upstream connections")
	}
	sw.fail(r, ue)
}

// adoptUpstream gives the route's upstream client an open connection to the tenant (see ConnGate).
func (in *instance) adoptUpstream(c net.Conn) { in.client().Adopt(c) }

// dropUpstream closes the route's idle upstream connections and stops their reaper: called when the
// tenant sleeps, dies on its own, or the instance retires, so no socket to a dead tenant lingers. It
// builds nothing: a route that never proxied has nothing to drop.
func (in *instance) dropUpstream() {
	if c := in.up.Load(); c != nil {
		c.CloseIdle()
	}
	if lt := in.loopT.Load(); lt != nil && lt.g != nil {
		lt.g.Drop(lt)
	}
	if in.fleet != nil {
		in.fleet.dropUpstream()
	}
}

// serve proxies r to the tenant, or to the least busy ready member of a fleet.
func (in *instance) serve(w http.ResponseWriter, r *http.Request) {
	if in.fleet != nil {
		in.fleet.serve(w, r)
		return
	}
	in.client().Serve(w, r)
}
