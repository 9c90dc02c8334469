package activator

// The waiting page at the edge (issue 14 §1, docs/waiting-page.md): a browser navigation to a route
// that is not awake gets internal/waitpage's page at once, and starts the wake without being held;
// the page follows that wake on the event stream, which the edge serves on every host.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/waitpage"
)

// maxEventStreams bounds the event streams open at once across all routes, on top of each route's
// hold.max_requests: a stream is a connection held open for minutes, and anyone may open one.
const maxEventStreams = 4096

// routePage is a route's waiting page and what it needs. A changed route's new instance shares its
// predecessor's (Apply), so the expected wake time survives a reload.
type routePage struct {
	page atomic.Pointer[waitpage.Page] // nil: waiting_page off; set by every Apply
	// times is the route's successful wakes, for the page's expected time: made by the first, since
	// most routes of a large config never wake.
	times   atomic.Pointer[waitpage.History]
	streams atomic.Int64 // event streams open on the route
}

// expected is the wake time the route's waiting page promises (waitpage.History.Expected): 0 before
// its first successful wake.
func (p *routePage) expected() time.Duration {
	if h := p.times.Load(); h != nil {
		return h.Expected()
	}
	return 0
}

// addWake adds a successful wake's duration to the route's history.
func (p *routePage) addWake(d time.Duration) {
	h := p.times.Load()
	if h == nil {
		p.times.CompareAndSwap(nil, &waitpage.History{}) // the instances sharing p may race here
		h = p.times.Load()
	}
	h.Add(d)
}

// waitingPagesLocked builds the waiting page of every route in cfg: nil for a route with waiting_page
// off, the built-in page (made once per Server) or the route's own template, which is read and checked
// here, on every Apply, once for all the routes that name it. The error names every route whose
// template fails, and the file.
func (s *Server) waitingPagesLocked(cfg *registry.Config) (map[string]*waitpage.Page, error) {
	pages := make(map[string]*waitpage.Page, len(cfg.Routes))
	var errs []error
	var own waitpage.Templates // a file many routes name is read and checked once
	for _, r := range cfg.Routes {
		switch {
		case r.WaitingPage.Off:
			pages[r.Name] = nil
		case r.WaitingPage.Template == "":
			if s.builtinPage == nil {
				p, err := waitpage.New("")
				if err != nil {
					return nil, err // the built-in page is checked by waitpage's tests
				}
				s.builtinPage = p
			}
			pages[r.Name] = s.builtinPage
		default:
			p, err := own.Load(r.WaitingPage.Template)
			if err != nil {
				errs = append(errs, fmt.Errorf("route %q: waiting_page: %w", r.Name, err))
				continue
			}
			pages[r.Name] = p
		}
	}
	return pages, errors.Join(errs...)
}

// followLocked gives a new wake the Progress its waiting pages follow, expected to take as long as the
// route's recent wakes.
func (in *instance) followLocked(att *attempt) {
	t := att.rec // not shared yet: the wake goroutine has not started
	t.progress = waitpage.NewProgress(t.rec.ID, t.rec.Started, in.pages.expected())
}

// endProgressLocked tells the pages following att how it ended: failed, with the short client message
// and the backoff, or ready (an adopt that found nothing running counts as ready: the page reloads and
// its next request wakes the tenant). A successful wake's duration joins the route's history.
func (in *instance) endProgressLocked(att *attempt, out wakeOutcome) {
	var we *WakeError
	if errors.As(att.err, &we) {
		att.rec.progress.Fail(clientMessage(we), we.RetryAfter)
		return
	}
	if out.rec.Result == ResultOK {
		in.pages.addWake(out.rec.Duration)
	}
	att.rec.progress.Ready()
}

// serveWaiting answers r, a browser navigation (waitpage.Wanted), when the route is not awake: with the
// failure page during the failure backoff (the short client message, never the cause unless the route
// has detailed_errors), else with the waiting page, starting the wake when none runs. The wake does not
// wait for r, which is answered at once and holds nothing. It reports false when r is to be held as
// before: the route's page is off, or the route is awake after all, stopping, retiring, closed or
// draining.
func (in *instance) serveWaiting(w http.ResponseWriter, r *http.Request) bool {
	page := in.pages.page.Load()
	if page == nil {
		return false
	}
	v := waitpage.View{Route: in.route.Name}
	failed := false
	in.mu.Lock()
	switch {
	case in.closed || in.retiring || in.draining() || in.state == Awake || in.state == Stopping,
		in.state == Failed && in.now().Before(in.until) && in.lastAtt == nil: // no failed wake to show
		in.mu.Unlock()
		return false
	case in.state == Failed && in.now().Before(in.until):
		failed = true
		v.RetryAfter = in.until.Sub(in.now())
	case in.state != Waking:
		in.beginWakeLocked(triggerRequest)
	}
	att := in.wake
	if failed {
		att = in.lastAtt
	}
	in.mu.Unlock()

	ev, _ := att.rec.progress.Watch()
	v.WakeID, v.Phase, v.Phases, v.Elapsed, v.Expected = ev.WakeID, ev.Phase, ev.Phases, ev.Elapsed, ev.Expected
	var err error
	if failed {
		v.Cause = ev.Cause
		err = page.Failed(w, r, v)
	} else {
		v.RetryAfter = refreshAfter(ev.Elapsed, ev.Expected)
		v.EventsURL = eventsURL(in.route.PathPrefix, ev.WakeID)
		err = page.Waiting(w, r, v)
	}
	if err != nil {
		in.logger().Warn("the waiting page's template failed; the built-in page was sent", "err", err)
	}
	return true
}

// refreshAfter is the waiting page's Retry-After, the no-JavaScript refresh: what is left of the
// expected wake, between 1 and 5 s; 2 s without an estimate.
func refreshAfter(elapsed, expected time.Duration) time.Duration {
	if expected <= 0 {
		return 2 * time.Second
	}
	return min(max(expected-elapsed, time.Second), 5*time.Second)
}

// eventsURL is where a route's waiting page opens its event stream: the reserved path, the route's
// path prefix (which, with the Host, finds the route again) and the wake.
func eventsURL(prefix, wakeID string) string {
	if prefix == "" {
		prefix = "/"
	}
	return waitpage.EventsPath + "?path=" + url.QueryEscape(prefix) + "&wake=" + url.QueryEscape(wakeID)
}

// serveEvents answers the waiting page's event stream (waitpage.EventsPath, on every host, before
// routing by path): the wake in progress, or the last one, of the route that serves the Host at the
// query's path. It wakes nothing: before a route's first wake, and on a route without a waiting page,
// it answers 404. Streams are capped by the
// route's hold.max_requests and by maxEventStreams (503 with Retry-After past either), and end when
// the wake does, when the client goes, after waitpage's own limits, or at Shutdown's cut.
func (s *Server) serveEvents(w http.ResponseWriter, r *http.Request, t *table) {
	path := r.URL.Query().Get("path")
	if path == "" || path[0] != '/' {
		path = "/"
	}
	rt := t.lookup(r.Host, path)
	if rt == nil {
		writeError(w, r, fmt.Errorf("%w %q", ErrUnknownHost, hostOnly(r.Host)))
		s.opts.Metrics.requestCounter(unknownRoute)(http.StatusNotFound)
		return
	}
	sw := &statusWriter{ResponseWriter: w}
	defer func() { rt.count(sw.statusCode()) }()
	in := rt.in
	in.mu.Lock()
	att := in.wake
	if att == nil {
		att = in.lastAtt // a reload's new instance has the old one's last wake, not its wake
	}
	in.mu.Unlock()
	// A route without a page has no stream either: it would tell anyone its wakes' ids and phases.
	if att == nil || in.pages.page.Load() == nil {
		sw.Header().Set("Cache-Control", "no-store")
		http.Error(sw, "no wake to follow", http.StatusNotFound)
		return
	}
	n, all := in.pages.streams.Add(1), s.streams.Add(1)
	defer in.pages.streams.Add(-1)
	defer s.streams.Add(-1)
	if n > int64(max(1, in.route.Hold.MaxRequests)) || all > maxEventStreams {
		writeError(sw, r, fmt.Errorf("%w: too many wake event streams are open", ErrHoldFull))
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(s.root, cancel)() // Shutdown's cut ends the streams
	waitpage.Events(sw, r.WithContext(ctx), att.rec.progress)
}
