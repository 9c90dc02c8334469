package main

// The waiting page and Server-Timing against a real edge (issue 14 §1, §2): this test binary
// re-executed as `activator serve`, exec tenants that are this binary as the demo app, and a real
// Chromium (headless, through chromedp) as the person waiting. A tenant's start is held by
// DEMOAPP_HOLD_FILE until the test removes the file, so every step waits on an event, never a timer;
// only the no-JavaScript page's refresh (Retry-After, at least 1 s) runs on one.

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

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
