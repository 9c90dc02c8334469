package main

// The waiting page and Server-Timing against a real edge (issue 14 §1, §2): this test binary
// re-executed as `activator serve`, exec tenants that are this binary as the demo app, and a real
// Chromium (headless, through chromedp) as the person waiting. A tenant's start is held by
// DEMOAPP_HOLD_FILE until the test removes the file, so every step waits on an event, never a timer;
// only the no-JavaScript page's refresh (Retry-After, at least 1 s) runs on one.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/coder/websocket"

	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/browsertest"
)

const (
	pageBrowserTime = 3 * time.Minute  // the whole browser, every subtest included
	pageStepTime    = 60 * time.Second // one subtest
)

// pageBrowser starts one headless Chromium that resolves every *.test host to ip, the edge's.
func pageBrowser(t *testing.T, ip string) context.Context {
	t.Helper()
	return browsertest.Start(t, pageBrowserTime,
		chromedp.Flag("host-resolver-rules", "MAP *.test "+ip),
		chromedp.Flag("no-proxy-server", true))
}

// pageTab opens a tab bounded by pageStepTime; scripts false disables JavaScript in it.
func pageTab(t *testing.T, browser context.Context, scripts bool) context.Context {
	t.Helper()
	return browsertest.Tab(t, browser, pageStepTime, scripts)
}

// pageOpen navigates to url and checks that the edge answered 503 (the waiting or failure page).
func pageOpen(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	res := browsertest.Open(t, ctx, url)
	if cc := res.Headers["Cache-Control"]; cc != "no-store" {
		t.Errorf("Cache-Control %v, want no-store", cc)
	}
}

// pageLandsOnApp waits for the app's own answer (the demo app's text/plain body, which Chromium shows
// in a <pre>) at the URL first asked for.
func pageLandsOnApp(t *testing.T, ctx context.Context, body, uri string) {
	t.Helper()
	browsertest.Do(t, ctx, "wait for the app", chromedp.WaitVisible(chromedp.CSS("body > pre")))
	if got := browsertest.Run(t, ctx, "app text", chromedp.Text(chromedp.CSS("body > pre"))); strings.TrimSpace(got) != body {
		t.Errorf("the app says %q, want %q", got, body)
	}
	if loc := browsertest.Run(t, ctx, "location", chromedp.Location()); !strings.HasSuffix(loc, uri) {
		t.Errorf("the app was loaded at %s, want the URL first asked for, %s", loc, uri)
	}
}

func pagePhase(name string) chromedp.CSS {
	return chromedp.CSS(`#wp-phases li[data-phase="` + name + `"]`)
}

// holdFile makes a file whose existence holds a demo tenant's start (DEMOAPP_HOLD_FILE).
func holdFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "hold")
	hold(t, path)
	return path
}

func hold(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

func release(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}

func TestWaitingPageBrowser(t *testing.T) {
	browsertest.Path(t) // before starting anything
	slowHold, nojsHold := holdFile(t), holdFile(t)
	const secret = "fatal: cannot open /srv/tenant/config/prod.toml"
	slow := appRoute{Name: "slow", Env: map[string]string{"DEMOAPP_HOLD_FILE": slowHold, "DEMOAPP_BODY": "hello from slow"}}
	nojs := appRoute{Name: "nojs", Env: map[string]string{"DEMOAPP_HOLD_FILE": nojsHold, "DEMOAPP_BODY": "hello from nojs"}}
	broken := appRoute{Name: "broken", BackoffInitial: "1m", BackoffMax: "1m",
		Env: map[string]string{"DEMOAPP_EXIT_CODE": "3", "DEMOAPP_EXIT_MESSAGE": secret}}
	s := startServed(t, configYAML(t, slow, nojs, broken))
	colon := strings.LastIndexByte(s.edge, ':')
	ip, port := s.edge[:colon], s.edge[colon:]
	b := pageBrowser(t, ip)
	url := func(a appRoute, uri string) string { return "http://" + a.host() + port + uri }

	t.Run("the page follows the wake and lands on the app", func(t *testing.T) {
		ctx := pageTab(t, b, true)
		pageOpen(t, ctx, url(slow, "/cart?item=42"))
		// The tenant is spawned and its start held: the health phase comes over the stream or with
		// the page, and nothing else can end the wait.
		browsertest.Do(t, ctx, "health phase", chromedp.WaitVisible(pagePhase("health")))
		elapsed := browsertest.Run(t, ctx, "elapsed", chromedp.Text(chromedp.ID("wp-elapsed")))
		if !regexp.MustCompile(`^\d+(\.\d)? s elapsed$`).MatchString(elapsed) {
			t.Errorf("elapsed reads %q", elapsed)
		}
		first := s.status(slow.Name)
		release(t, slowHold)
		pageLandsOnApp(t, ctx, "hello from slow", "/cart?item=42")
		if st := s.status(slow.Name); st.LastWake == nil || first.CurrentWake != nil && st.LastWake.ID != first.CurrentWake.ID {
			t.Errorf("status %+v: want the one wake the page started", st.LastWake)
		}
	})

	t.Run("the second wake's bar runs against the first's time", func(t *testing.T) {
		if code, body := adminPost(t, http.DefaultClient, s.admin, "/routes/slow/sleep"); code != http.StatusOK {
			t.Fatalf("sleep: %d %s", code, body)
		}
		hold(t, slowHold)
		ctx := pageTab(t, b, true)
		pageOpen(t, ctx, url(slow, "/"))
		browsertest.Do(t, ctx, "health phase", chromedp.WaitVisible(pagePhase("health")))
		bar := browsertest.Run(t, ctx, "progress", chromedp.Evaluate[[]float64](
			`(b => [b.max, b.hasAttribute("value") || b.position === -1 ? 1 : 0])(document.getElementById("wp-bar"))`))
		if bar[0] <= 1 {
			t.Errorf("progress bar max %v: want the expected wake time in ms, from the first wake", bar[0])
		}
		if got := browsertest.Run(t, ctx, "expected", chromedp.Text(chromedp.ID("wp-expected"))); !strings.HasPrefix(got, "usually ready in about") &&
			got != "taking longer than usual" {
			t.Errorf("expected reads %q", got)
		}
		release(t, slowHold)
		pageLandsOnApp(t, ctx, "hello from slow", "/")
	})

	t.Run("a failed wake shows the short cause, the wake id and a retry button", func(t *testing.T) {
		ctx := pageTab(t, b, true)
		pageOpen(t, ctx, url(broken, "/orders"))
		browsertest.Do(t, ctx, "failure shown", chromedp.WaitVisible(chromedp.ID("wp-failed")), chromedp.WaitVisible(chromedp.ID("wp-retry")))
		s.waitStatus(broken.Name, "failed", func(st activator.Status) bool { return st.LastWake != nil && st.LastWake.Result == "failed" })
		last := s.status(broken.Name).LastWake
		checkPageFailure(t, ctx, broken.Name, last)
		// The retry button, during the backoff: the failure page again, for the same wake, and no new wake.
		browsertest.Do(t, ctx, "retry", chromedp.Click(chromedp.ID("wp-retry")))
		browsertest.Do(t, ctx, "failure page again", chromedp.WaitVisible(chromedp.ID("wp-retry")))
		checkPageFailure(t, ctx, broken.Name, last)
		if again := s.status(broken.Name).LastWake; again.ID != last.ID {
			t.Errorf("the retry during the backoff woke the tenant again (wake %s, then %s)", last.ID, again.ID)
		}
	})

	t.Run("without JavaScript the refresh lands on the app", func(t *testing.T) {
		ctx := pageTab(t, b, false)
		pageOpen(t, ctx, url(nojs, "/cart"))
		browsertest.Do(t, ctx, "waiting page", chromedp.WaitVisible(chromedp.ID("wp-waiting")))
		release(t, nojsHold)
		pageLandsOnApp(t, ctx, "hello from nojs", "/cart")
	})

	t.Run("without JavaScript the failure page", func(t *testing.T) {
		ctx := pageTab(t, b, false)
		pageOpen(t, ctx, url(broken, "/a?b=c"))
		browsertest.Do(t, ctx, "failure page", chromedp.WaitVisible(chromedp.ID("wp-failed")), chromedp.WaitVisible(chromedp.ID("wp-retry")))
		checkPageFailure(t, ctx, broken.Name, s.status(broken.Name).LastWake)
		if href := browsertest.Run(t, ctx, "retry link", chromedp.Evaluate[string](`document.getElementById("wp-retry").getAttribute("href")`)); href != "/a?b=c" {
			t.Errorf("retry link %q, want the URL first asked for", href)
		}
	})
}

// checkPageFailure checks the failure page: the short cause (the phase and the fault's class, never
// the tenant's output), the wake's id and a retry button.
func checkPageFailure(t *testing.T, ctx context.Context, route string, last *activator.WakeRecord) {
	t.Helper()
	cause := browsertest.Run(t, ctx, "cause", chromedp.Text(chromedp.ID("wp-cause")))
	if want := `route "` + route + `": wake failed in phase ` + last.FailedPhase + ` (` + last.Class + ` fault)`; cause != want {
		t.Errorf("cause reads %q, want %q", cause, want)
	}
	if id := browsertest.Run(t, ctx, "wake id", chromedp.Text(chromedp.ID("wp-wakeid"))); id != last.ID {
		t.Errorf("wake id reads %q, want %q", id, last.ID)
	}
	if text := browsertest.Run(t, ctx, "page text", chromedp.Text(chromedp.CSS("body"))); strings.Contains(text, "/srv/tenant") {
		t.Errorf("the failure page quotes the tenant's output: %q", text)
	}
}

// A held request's answer carries Server-Timing (the hold and each phase of the wake) and the wake's
// id; an answer from the awake tenant carries neither.
func TestServerTimingOnHeldResponses(t *testing.T) {
	held := holdFile(t)
	app := appRoute{Name: "timed", Env: map[string]string{"DEMOAPP_HOLD_FILE": held}}
	h := newHarness(t, configYAML(t, app))
	got := make(chan reply, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		defer cancel()
		r, err := h.do(h.request(ctx, http.MethodGet, app.host(), "/", nil))
		if err != nil {
			r.body = err.Error()
		}
		got <- r
	}()
	h.waitStatus(app.Name, "waking with one held", func(st activator.Status) bool { return st.Held == 1 })
	release(t, held)
	r := <-got
	if r.code != http.StatusOK {
		t.Fatalf("held request: %d %s", r.code, r.body)
	}
	last := h.status(app.Name).LastWake
	if id := r.header.Get("Activator-Wake-Id"); id != last.ID {
		t.Errorf("Activator-Wake-Id %q, want the wake's id %q", id, last.ID)
	}
	st := r.header.Get("Server-Timing")
	want := []string{"hold"}
	for _, p := range last.Phases {
		want = append(want, p.Name)
	}
	var names []string
	for e := range strings.SplitSeq(st, ", ") {
		if !regexp.MustCompile(`^[a-z_]+;dur=\d+\.\d$`).MatchString(e) {
			t.Errorf("Server-Timing entry %q", e)
		}
		names = append(names, e[:max(0, strings.IndexByte(e, ';'))])
	}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Errorf("Server-Timing %q: entries %v, want %v", st, names, want)
	}

	warm := h.get(app.host(), "/")
	if v, id := warm.header.Get("Server-Timing"), warm.header.Get("Activator-Wake-Id"); v != "" || id != "" {
		t.Errorf("warm answer: Server-Timing %q, Activator-Wake-Id %q; want neither", v, id)
	}
}

// A route's own template themes the page; one that does not execute is a config problem for
// `activator check`, naming the route and the file.
func TestWaitingPageTemplate(t *testing.T) {
	builtin, err := os.ReadFile("../../internal/waitpage/page.html")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	theme := filepath.Join(dir, "shop.html")
	themed := strings.Replace(string(builtin), "<main", `<p id="theme">the shop's own page</p><main`, 1)
	if err := os.WriteFile(theme, []byte(themed), 0o644); err != nil {
		t.Fatal(err)
	}
	held := holdFile(t)
	shop := appRoute{Name: "shop", Env: map[string]string{"DEMOAPP_HOLD_FILE": held}}
	h := newHarness(t, configYAML(t, shop)+"    waiting_page: {template: "+theme+"}\n")
	t.Cleanup(func() { release(t, held) })
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	req := h.request(ctx, http.MethodGet, shop.host(), "/", nil)
	req.Header.Set("Accept", "text/html")
	r, err := h.do(req)
	if err != nil {
		t.Fatal(err)
	}
	if r.code != http.StatusServiceUnavailable || !strings.Contains(r.body, `id="theme"`) {
		t.Errorf("navigation: %d, want 503 with the route's own page; body %q", r.code, r.body)
	}

	bad := filepath.Join(dir, "bad.html")
	if err := os.WriteFile(bad, []byte("<html>{{.Head}}{{.NoSuchField}}</html>"), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "activator.yaml")
	cfg := configYAML(t, appRoute{Name: "badpage"}) + "    waiting_page: {template: " + bad + "}\n"
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out := runMain(t, "check", "--config", path)
	if code != 1 || !strings.Contains(out, `route "badpage"`) || !strings.Contains(out, bad) || !strings.Contains(out, "NoSuchField") {
		t.Errorf("activator check: exit %d, output %q; want 1 naming the route, the file and the field", code, out)
	}
}

// wsHeaders are the handshake headers of WebSocket clients that list text/html in Accept: a client
// that copies a browser's navigation headers, and Java's HttpURLConnection default Accept (which
// WebSocket clients built on it send). None sends fetch metadata but the odd one, which claims a
// navigation outright; a WebSocket handshake is never one.
var wsHeaders = []struct {
	name   string
	header http.Header
}{
	{"accept text/html", http.Header{"Accept": {"text/html"}}},
	{"browser-like accept", http.Header{"Accept": {firefoxAccept}, "User-Agent": {"Mozilla/5.0"}}},
	{"java default accept", http.Header{"Accept": {"text/html, image/gif, image/jpeg, *; q=.2, */*; q=.2"}}},
	{"claims a navigation", http.Header{"Accept": {firefoxAccept}, "Sec-Fetch-Mode": {"navigate"}, "Sec-Fetch-Dest": {"document"}}},
}

const firefoxAccept = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"

// wsResult is what a WebSocket dial through the edge came to.
type wsResult struct {
	c    *websocket.Conn
	code int
	ct   string // the refusal's Content-Type
	ra   string // its Retry-After
	csp  string // its Content-Security-Policy: only internal/waitpage's pages have one
	body string // its first KiB
	err  error
}

// wsDial dials the demo app's /ws on app through the edge with header, in a goroutine; the result
// comes on the channel.
func wsDial(ctx context.Context, h *harness, app appRoute, header http.Header) <-chan wsResult {
	got := make(chan wsResult, 1)
	go func() {
		c, resp, err := websocket.Dial(ctx, "ws://"+h.edgeAddr+"/ws", &websocket.DialOptions{Host: app.host(), HTTPHeader: header})
		r := wsResult{c: c, err: err}
		if err != nil && resp != nil {
			r.code, r.ct, r.ra = resp.StatusCode, resp.Header.Get("Content-Type"), resp.Header.Get("Retry-After")
			r.csp = resp.Header.Get("Content-Security-Policy")
			if resp.Body != nil {
				b, _ := io.ReadAll(resp.Body)
				r.body = string(b)
			}
		}
		got <- r
	}()
	return got
}

func (r wsResult) String() string {
	if r.code == 0 {
		return fmt.Sprint(r.err)
	}
	return fmt.Sprintf("%d (Content-Type %q, Retry-After %q, the waiting page %v) %q", r.code, r.ct, r.ra, r.page(), r.body)
}

// page reports whether the answer was internal/waitpage's page (waiting or failed), whose
// Content-Security-Policy carries the nonce of its inline script, not the edge's error answer. (The
// page's body is past the first KiB that the WebSocket client keeps.)
func (r wsResult) page() bool { return strings.Contains(r.csp, "nonce-") }

// TestWebSocketNeverGetsTheWaitingPage: a WebSocket handshake to a sleeping route is held until the
// tenant is up and then upgraded, whatever its Accept and fetch metadata say; to a route whose wake
// fails it gets the edge's 503 with Retry-After. Found by an operator trial: a handshake with
// Accept: text/html and no fetch metadata got the HTML waiting page, which no WebSocket client can
// use, and the tenant's first socket failed.
func TestWebSocketNeverGetsTheWaitingPage(t *testing.T) {
	// One route for each client, its start held by its own file until the test sees the handshake held.
	apps, holds := make([]appRoute, len(wsHeaders)), make([]string, len(wsHeaders))
	for i := range wsHeaders {
		holds[i] = holdFile(t)
		apps[i] = appRoute{Name: fmt.Sprintf("sockets%d", i), Env: map[string]string{"DEMOAPP_HOLD_FILE": holds[i]}}
	}
	broken := appRoute{Name: "sockfail", BackoffInitial: "1m", BackoffMax: "1m",
		Env: map[string]string{"DEMOAPP_EXIT_CODE": "3"}}
	h := newHarness(t, configYAML(t, append(apps, broken)...))
	t.Cleanup(func() { // before the harness's shutdown: a failed subtest leaves no start held
		for _, f := range holds {
			_ = os.Remove(f)
		}
	})

	for i, tc := range wsHeaders {
		t.Run("held then upgraded: "+tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			defer cancel()
			app := apps[i]
			got := wsDial(ctx, h, app, tc.header)
			// Held: the route counts it, and nothing answers it while the tenant's start is held.
			tick := time.NewTicker(2 * time.Millisecond)
			defer tick.Stop()
			for st := h.status(app.Name); st.Held != 1; st = h.status(app.Name) {
				select {
				case r := <-got:
					t.Fatalf("the handshake was answered before the tenant was up: %s", r)
				case <-tick.C:
				case <-ctx.Done():
					t.Fatalf("the handshake was never held; status %+v", st)
				}
			}
			release(t, holds[i])
			r := <-got
			if r.err != nil {
				t.Fatalf("handshake held for the wake: %s; want it upgraded once the tenant is up", r)
			}
			defer r.c.CloseNow()
			msg := "hello " + tc.name
			if err := r.c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
				t.Fatalf("write: %v", err)
			}
			if _, b, err := r.c.Read(ctx); err != nil || string(b) != msg {
				t.Fatalf("echo %q, %v; want %q", b, err, msg)
			}
			_ = r.c.Close(websocket.StatusNormalClosure, "bye")
		})
	}

	for i, tc := range wsHeaders {
		// The first wakes the broken tenant and is held until the wake fails; the rest come during the
		// failure backoff. Each gets the edge's 503, never the page.
		t.Run("failed wake: "+tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			defer cancel()
			r := <-wsDial(ctx, h, broken, tc.header)
			if r.err == nil {
				r.c.CloseNow()
				t.Fatal("upgraded by a tenant that cannot start")
			}
			if r.code != http.StatusServiceUnavailable || r.ra == "" || r.page() {
				t.Errorf("handshake %d: %s; want 503 with Retry-After, not the waiting page", i, r)
			}
		})
	}
	if n := len(h.spawns(broken.Name)); n != 1 {
		t.Errorf("the broken tenant was spawned %d times, want 1 (the rest inside its backoff)", n)
	}
}
