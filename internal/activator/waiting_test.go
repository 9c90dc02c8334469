package activator

// The waiting page at the edge (waiting.go): who gets it, that it starts the wake without holding, the
// failure page during the backoff, the event stream and its cap, and the template check at Apply. The
// browser tests against a real edge and a real tenant are cmd/activator's (waitpage_test.go).

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
	"github.com/activator/activator/internal/waitpage"
)

// navigation is a browser's navigation to path on host.
func navigation(host, path string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "http://"+host+path, nil)
	r.Header.Set("Accept", "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8")
	r.Header.Set("Sec-Fetch-Mode", "navigate")
	r.Header.Set("Sec-Fetch-Dest", "document")
	r.Header.Set("Sec-Fetch-Site", "none")
	return r
}

// signalBackend is a fakeBackend that tells when its Wake was called.
type signalBackend struct {
	*fakeBackend
	woke chan struct{} // one receive per Wake
}

func (b signalBackend) Wake(ctx context.Context, t tenant.Tracker) (*tenant.Life, error) {
	b.woke <- struct{}{}
	return b.fakeBackend.Wake(ctx, t)
}

type backendOpener struct{ b tenant.Backend }

func (o backendOpener) Open(*registry.Route) (tenant.Backend, error) { return o.b, nil }

// newPageServer is a Server over route "app" (host app.test) with backend b, its upstream up.
func newPageServer(t *testing.T, b tenant.Backend, up string, mut ...func(*registry.Route)) (*Server, *instance) {
	t.Helper()
	r := testRoute("app")
	r.Upstream = registry.Upstream{Network: "tcp", Address: up}
	for _, m := range mut {
		m(r)
	}
	s := New(Options{
		Opener:  backendOpener{b},
		Logger:  slog.New(slog.DiscardHandler),
		NewGate: func(*registry.Route) Gate { return passGate{} },
	})
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{r}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s, s.instance("app")
}

// appUpstream is a loopback tenant answering "app" on every path.
func appUpstream(t *testing.T) string {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Server-Timing", "db;dur=1.5")
		_, _ = io.WriteString(w, "app")
	}))
	t.Cleanup(ts.Close)
	return ts.Listener.Addr().String()
}

func TestWaitingPageStartsTheWakeWithoutHolding(t *testing.T) {
	b := signalBackend{&fakeBackend{wakeGate: make(chan struct{})}, make(chan struct{}, 4)}
	s, in := newPageServer(t, b, appUpstream(t))

	w := httptest.NewRecorder()
	s.ServeHTTP(w, navigation("app.test", "/cart?item=42"))
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503 with the waiting page; body %q", w.Code, w.Body)
	}
	for k, want := range map[string]string{"Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-store"} {
		if got := w.Header().Get(k); got != want {
			t.Errorf("%s: %q, want %q", k, got, want)
		}
	}
	if w.Header().Get("Retry-After") == "" {
		t.Error("no Retry-After")
	}
	body := w.Body.String()
	if !strings.Contains(body, `id="wp-waiting"`) || !strings.Contains(body, waitpage.EventsPath) {
		t.Errorf("body is not the waiting page with its event stream: %q", body)
	}
	<-b.woke // the page's request started the wake, and was not held for it
	if st := in.status(); st.State != "waking" || st.Held != 0 {
		t.Fatalf("status %+v, want waking with nothing held", st)
	}

	// A second navigation joins the same wake; a fetch is held as before.
	w = httptest.NewRecorder()
	s.ServeHTTP(w, navigation("app.test", "/"))
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("second navigation: status %d, want 503", w.Code)
	}
	fetched := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "http://app.test/api", nil)
		r.Header.Set("Accept", "application/json")
		r.Header.Set("Sec-Fetch-Mode", "cors")
		s.ServeHTTP(w, r)
		fetched <- w
	}()
	close(b.wakeGate)
	if w := <-fetched; w.Code != http.StatusOK || w.Body.String() != "app" {
		t.Fatalf("held fetch: status %d body %q, want 200 app", w.Code, w.Body)
	}
	if n := b.wakes.Load(); n != 1 {
		t.Errorf("%d wakes, want 1", n)
	}

	// Awake: the navigation gets the app.
	w = httptest.NewRecorder()
	s.ServeHTTP(w, navigation("app.test", "/cart?item=42"))
	if w.Code != http.StatusOK || w.Body.String() != "app" {
		t.Fatalf("navigation once awake: status %d body %q, want the app", w.Code, w.Body)
	}
}

func TestWaitingPageOffHoldsBrowsers(t *testing.T) {
	b := signalBackend{&fakeBackend{wakeGate: make(chan struct{})}, make(chan struct{}, 4)}
	s, _ := newPageServer(t, b, appUpstream(t), func(r *registry.Route) { r.WaitingPage.Off = true })
	got := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, navigation("app.test", "/"))
		got <- w
	}()
	<-b.woke
	close(b.wakeGate)
	if w := <-got; w.Code != http.StatusOK || w.Body.String() != "app" {
		t.Fatalf("status %d body %q: want the navigation held and served the app", w.Code, w.Body)
	}
}

func TestFailurePageDuringBackoff(t *testing.T) {
	const secret = "cannot open /srv/tenant/secret.toml"
	for _, detailed := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "detailed_errors"}[detailed], func(t *testing.T) {
			fb := &fakeBackend{wakeErr: errors.New(secret)}
			s, in := newPageServer(t, fb, appUpstream(t), func(r *registry.Route) { r.DetailedErrors = detailed })
			if err := in.wakeNow(context.Background()); err == nil {
				t.Fatal("wake succeeded, want it to fail")
			}
			id := in.status().LastWake.ID
			w := httptest.NewRecorder()
			s.ServeHTTP(w, navigation("app.test", "/orders"))
			if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
				t.Fatalf("status %d Retry-After %q, want 503 with Retry-After", w.Code, w.Header().Get("Retry-After"))
			}
			body := w.Body.String()
			for _, want := range []string{`id="wp-failed"`, id, "wake failed in phase spawn", `href="/orders"`} {
				if !strings.Contains(body, want) {
					t.Errorf("failure page does not contain %q: %s", want, body)
				}
			}
			if got := strings.Contains(body, "/srv/tenant"); got != detailed {
				t.Errorf("failure page quotes the tenant's error: %v, want %v", got, detailed)
			}
			if n := fb.wakes.Load(); n != 1 {
				t.Errorf("%d wakes, want 1: the failure page must not wake during the backoff", n)
			}
		})
	}
}

// readEvents reads SSE event names from body until it ends.
func readEvents(t *testing.T, body io.Reader) (names []string, data []string) {
	t.Helper()
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "event: "); ok {
			names = append(names, v)
		}
		if v, ok := strings.CutPrefix(line, "data: "); ok {
			data = append(data, v)
		}
	}
	return names, data
}

// pageEventsURL finds the page's event stream URL in a waiting page.
func pageEventsURL(t *testing.T, page string) string {
	t.Helper()
	i := strings.Index(page, waitpage.EventsPath)
	if i < 0 {
		t.Fatalf("no %s in the page", waitpage.EventsPath)
	}
	end := strings.IndexAny(page[i:], `"<`)
	return strings.ReplaceAll(page[i:i+end], `\u0026`, "&")
}

func TestWakeEventsFollowTheWake(t *testing.T) {
	b := signalBackend{&fakeBackend{wakeGate: make(chan struct{})}, make(chan struct{}, 4)}
	s, _ := newPageServer(t, b, appUpstream(t))
	edge := httptest.NewServer(s)
	t.Cleanup(edge.Close)

	// Nothing has woken: the stream has no wake to follow, and starts none.
	resp, err := http.Get(edge.URL + waitpage.EventsPath + "?path=%2F")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("events before any wake: status %d, want 404", resp.StatusCode)
	}
	if n := b.wakes.Load(); n != 0 {
		t.Fatalf("the event stream woke the route (%d wakes)", n)
	}

	w := httptest.NewRecorder()
	s.ServeHTTP(w, navigation("app.test", "/"))
	<-b.woke
	u := pageEventsURL(t, w.Body.String())
	req, _ := http.NewRequest(http.MethodGet, edge.URL+u, nil)
	req.Host = "app.test"
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
		t.Fatalf("events: status %d, Content-Type %q", resp.StatusCode, ct)
	}
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil || first != "event: phase\n" {
		t.Fatalf("first line %q (%v), want the phase event", first, err)
	}
	close(b.wakeGate)
	names, data := readEvents(t, br)
	if len(names) == 0 || names[len(names)-1] != "ready" {
		t.Fatalf("events %v, want them to end with ready", names)
	}
	last := data[len(data)-1]
	for _, want := range []string{`"spawn"`, `"health"`, `"wake_id":"`} {
		if !strings.Contains(last, want) {
			t.Errorf("ready event %s does not contain %s", last, want)
		}
	}
}

func TestWakeEventsOnlyForTheHostsRoute(t *testing.T) {
	b := &fakeBackend{}
	s, in := newPageServer(t, b, appUpstream(t))
	if err := in.wakeNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"other.test", "app.test.evil"} {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://"+host+waitpage.EventsPath+"?path=%2F", nil))
		if w.Code != http.StatusNotFound {
			t.Errorf("events on host %s: status %d, want 404", host, w.Code)
		}
	}
}

func TestWakeEventsCapped(t *testing.T) {
	b := signalBackend{&fakeBackend{wakeGate: make(chan struct{})}, make(chan struct{}, 4)}
	s, in := newPageServer(t, b, appUpstream(t), func(r *registry.Route) { r.Hold.MaxRequests = 2 })
	t.Cleanup(func() { close(b.wakeGate) })
	edge := httptest.NewServer(s)
	t.Cleanup(edge.Close)
	w := httptest.NewRecorder()
	s.ServeHTTP(w, navigation("app.test", "/"))
	<-b.woke
	u := edge.URL + pageEventsURL(t, w.Body.String())
	open := func() *http.Response {
		req, _ := http.NewRequest(http.MethodGet, u, nil)
		req.Host = "app.test"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	for i := range 2 {
		if resp := open(); resp.StatusCode != http.StatusOK {
			t.Fatalf("stream %d: status %d, want 200", i, resp.StatusCode)
		}
	}
	resp := open()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("stream over the cap: status %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if n := in.pages.streams.Load(); n != 2 {
		t.Errorf("%d streams counted, want 2", n)
	}
}

func TestWaitingPageTemplateCheckedAtApply(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "shop.html")
	if err := os.WriteFile(bad, []byte("<html>{{.Nope}}</html>"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := New(Options{Opener: fakeProvider{&fakeBackend{}}, NewGate: func(*registry.Route) Gate { return passGate{} }})
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	good, shop := testRoute("good"), testRoute("shop")
	shop.WaitingPage.Template = bad
	err := s.Apply(&registry.Config{Routes: []*registry.Route{good, shop}})
	if err == nil {
		t.Fatal("Apply accepted a template with an unknown field")
	}
	for _, want := range []string{`route "shop"`, bad, "waiting_page"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if s.instance("good") != nil {
		t.Error("Apply failed but the config was applied")
	}
}

// TestWaitingPagesShareATemplate: routes that name one template file share its Page, read and checked
// once per Apply. Made once per route, a template took about 5 ms and 1.5 MB of garbage each
// (BenchmarkNew), so a reload of 1,000 routes naming one branded page spent 5 s on it, and each
// route kept a parsed copy.
func TestWaitingPagesShareATemplate(t *testing.T) {
	page := filepath.Join(t.TempDir(), "brand.html")
	src := `<!doctype html><html><head>{{.Head}}<title>{{.Route}}</title></head><body>{{.Route}}<script nonce="{{.Nonce}}">{{.Script}}</script></body></html>`
	if err := os.WriteFile(page, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	s := New(Options{Opener: fakeProvider{&fakeBackend{}}, NewGate: func(*registry.Route) Gate { return passGate{} }})
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	a, b, c := testRoute("a"), testRoute("b"), testRoute("c")
	a.WaitingPage.Template, b.WaitingPage.Template = page, page
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{a, b, c}}); err != nil {
		t.Fatal(err)
	}
	pa, pb, pc := s.instance("a").pages.page.Load(), s.instance("b").pages.page.Load(), s.instance("c").pages.page.Load()
	if pa == nil || pb == nil || pc == nil {
		t.Fatalf("pages %p %p %p: want all three", pa, pb, pc)
	}
	if pa != pb {
		t.Errorf("routes a and b name one template but got two Pages (%p, %p)", pa, pb)
	}
	if pa == pc {
		t.Error("route c, without a template, got the template's Page")
	}
}

func TestWaitingPageEventsURLKeepsToTheRoute(t *testing.T) {
	b := signalBackend{&fakeBackend{wakeGate: make(chan struct{})}, make(chan struct{}, 4)}
	s, _ := newPageServer(t, b, appUpstream(t), func(r *registry.Route) { r.PathPrefix = "/shop" })
	t.Cleanup(func() { close(b.wakeGate) })
	w := httptest.NewRecorder()
	s.ServeHTTP(w, navigation("app.test", "/shop/cart"))
	<-b.woke
	u, err := url.Parse(pageEventsURL(t, w.Body.String()))
	if err != nil {
		t.Fatal(err)
	}
	if got := u.Query().Get("path"); got != "/shop" {
		t.Errorf("events URL %s: path %q, want the route's prefix /shop", u, got)
	}
	if u.Query().Get("wake") == "" {
		t.Errorf("events URL %s names no wake", u)
	}
}

// A request the edge answers with an error, not the waiting page (a fetch that accepts HTML), gets an
// error page people can read: the text wraps, with the short cause and the wake id.
func TestErrorPageForPeopleWraps(t *testing.T) {
	fb := &fakeBackend{wakeErr: errors.New("cannot open /srv/tenant/secret.toml")}
	s, in := newPageServer(t, fb, appUpstream(t))
	if err := in.wakeNow(context.Background()); err == nil {
		t.Fatal("wake succeeded, want it to fail")
	}
	r := httptest.NewRequest(http.MethodGet, "http://app.test/", nil)
	r.Header.Set("Accept", "text/html")
	r.Header.Set("Sec-Fetch-Mode", "cors")
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	body := w.Body.String()
	for _, want := range []string{"white-space:pre-wrap", "overflow-wrap:anywhere", `name="viewport"`, "wake failed in phase spawn",
		"<code>" + in.status().LastWake.ID + "</code>"} {
		if !strings.Contains(body, want) {
			t.Errorf("error page %q does not contain %q", body, want)
		}
	}
	if strings.Contains(body, "<pre>") || strings.Contains(body, "/srv/tenant") {
		t.Errorf("error page %q: want no <pre> and no tenant output", body)
	}
}

// TestWakeEventsNeedAPageAndSurviveAReload: a route with waiting_page off has no event stream (it
// told anyone its wakes' ids and phases), and a reload that gives the route a new instance keeps the
// stream of its last wake ("or its last one"): before, it answered 404 "no wake to follow".
func TestWakeEventsNeedAPageAndSurviveAReload(t *testing.T) {
	events := func(s *Server) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://app.test"+waitpage.EventsPath+"?path=%2F", nil))
		return w
	}
	off, in := newPageServer(t, &fakeBackend{}, appUpstream(t), func(r *registry.Route) { r.WaitingPage.Off = true })
	if err := in.wakeNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	if w := events(off); w.Code != http.StatusNotFound {
		t.Errorf("events of a route without a page: %d %q, want 404", w.Code, w.Body)
	}

	s, in := newPageServer(t, &fakeBackend{}, appUpstream(t))
	if err := in.wakeNow(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := testRoute("app")
	r.Upstream = in.route.Upstream
	r.Idle = 2 * time.Minute // a change that gives the route a new instance
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{r}}); err != nil {
		t.Fatal(err)
	}
	if s.instance("app") == in {
		t.Fatal("the reload kept the instance; the test needs a new one")
	}
	if w := events(s); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "event: ready") {
		t.Errorf("events after a reload: %d %q, want 200 with the last wake's ready", w.Code, w.Body)
	}
}
