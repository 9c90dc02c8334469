package waitpage

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/activator/activator/internal/browsertest"
)

// The browser tests drive a real Chromium (Debian's chromium package) against an edge stand-in that
// answers as the edge will: a browser navigation to the sleeping route gets the waiting page, the page's
// stream follows a wake the test scripts step by step, and once the test marks the tenant up the
// route serves the app's own page. Nothing waits on a timer but the no-JavaScript page's refresh
// (RetryAfter, 1 s); every wait is bounded by the subtest's deadline.
//
// WAITPAGE_SCREENSHOTS=1 writes the screenshots of docs/waiting-page.md into docs/img/.

const (
	appText     = "hello from the app"
	browserTime = 90 * time.Second // the whole browser, every subtest included
	stepTime    = 25 * time.Second // one subtest
	testCause   = `route "shop": wake failed in phase health`
)

// standIn is the edge for one sleeping route, "shop".
type standIn struct {
	page *Page

	mu    sync.Mutex // guards the fields below
	wake  *Progress
	up    bool // the tenant is ready: the route serves the app
	pages map[string]int
}

func newStandIn(t *testing.T, wakeID string) (*standIn, string) {
	t.Helper()
	s := &standIn{page: builtin(t), pages: map[string]int{}}
	s.newWake(wakeID)
	ts := httptest.NewServer(s)
	t.Cleanup(func() {
		ts.CloseClientConnections() // event streams the browser still holds
		ts.Close()
	})
	return s, ts.URL
}

// newWake starts wake id, begun 3.5 s ago and expected to take 8 s, in its first phase.
func (s *standIn) newWake(id string) *Progress {
	p := NewProgress(id, time.Now().Add(-3500*time.Millisecond), 8*time.Second)
	p.Phase("start")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wake, s.up = p, false
	return p
}

func (s *standIn) current() *Progress {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.wake
}

// ready marks the tenant up and then ends the wake, so that the reload the ready event causes finds
// the app.
func (s *standIn) ready() {
	s.mu.Lock()
	s.up = true
	p := s.wake
	s.mu.Unlock()
	p.Ready()
}

func (s *standIn) served(kind string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pages[kind]
}

func (s *standIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == EventsPath {
		s.mu.Lock()
		s.pages["events"]++
		s.mu.Unlock()
		Events(w, r, s.current())
		return
	}
	s.mu.Lock()
	up, wake := s.up, s.wake
	kind := "other"
	switch {
	case up:
		kind = "app"
	case Wanted(r):
		kind = "page"
	}
	s.pages[kind]++
	s.mu.Unlock()

	switch kind {
	case "app":
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, "<!doctype html><title>shop</title><h1 id=\"app\">%s</h1><p id=\"path\">%s</p>\n", appText, r.URL.RequestURI())
		return
	case "other": // the favicon; the edge would hold it
		http.NotFound(w, r)
		return
	}
	ev, _ := wake.Watch()
	v := View{Route: "shop", WakeID: ev.WakeID, Phase: ev.Phase, Phases: ev.Phases, Elapsed: ev.Elapsed,
		Expected: ev.Expected, RetryAfter: time.Second, EventsURL: EventsPath + "?wake=" + ev.WakeID}
	write := s.page.Waiting
	if ev.State == Failed {
		v.Cause, v.RetryAfter, write = ev.Cause, ev.RetryAfter, s.page.Failed
	}
	if err := write(w, r, v); err != nil {
		panic(err) // the built-in page does not fail
	}
}

// browser starts one headless Chromium for the test, closed at cleanup.
func browser(t *testing.T) context.Context {
	t.Helper()
	return browsertest.Start(t, browserTime, chromedp.Flag("hide-scrollbars", true))
}

// tab opens a new tab bounded by stepTime; scripts false disables JavaScript in it.
func tab(t *testing.T, browser context.Context, scripts bool) context.Context {
	t.Helper()
	return browsertest.Tab(t, browser, stepTime, scripts)
}

// open navigates to url and checks that the answer is the route's page, 503.
func open(t *testing.T, ctx context.Context, url string) { t.Helper(); browsertest.Open(t, ctx, url) }

// landsOnApp waits for the app's own page and checks it is the URL first asked for.
func landsOnApp(t *testing.T, ctx context.Context, path string) {
	t.Helper()
	browsertest.Do(t, ctx, "wait for the app's page", chromedp.WaitVisible(chromedp.ID("app")))
	if got := browsertest.Run(t, ctx, "app text", chromedp.Text(chromedp.ID("app"))); got != appText {
		t.Errorf("app page says %q, want %q", got, appText)
	}
	if got := browsertest.Run(t, ctx, "app path", chromedp.Text(chromedp.ID("path"))); got != path {
		t.Errorf("the app was loaded at %q, want the URL first asked for, %q", got, path)
	}
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if os.Getenv("WAITPAGE_SCREENSHOTS") != "1" {
		return
	}
	png := browsertest.Run(t, ctx, "screenshot", chromedp.FullScreenshot(100))
	path := filepath.Join("..", "..", "docs", "img", "waitpage-"+name+".png")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", path)
}

func phaseItem(name string) chromedp.CSS {
	return chromedp.CSS(`#wp-phases li[data-phase="` + name + `"]`)
}

func TestBrowser(t *testing.T) {
	b := browser(t)

	t.Run("wake follows and lands on the app", func(t *testing.T) {
		s, base := newStandIn(t, "w-3f9a2c")
		ctx := tab(t, b, true)
		open(t, ctx, base+"/cart?item=42")
		browsertest.Do(t, ctx, "first phase", chromedp.WaitVisible(phaseItem("start")))

		s.current().Phase("health") // only the event stream can bring this one
		browsertest.Do(t, ctx, "phase from the stream", chromedp.WaitVisible(phaseItem("health")))
		bar := browsertest.Run(t, ctx, "progress", chromedp.Evaluate[[]float64](
			`(b => [b.max, b.value, b.hasAttribute("value") ? 1 : 0])(document.getElementById("wp-bar"))`))
		if bar[0] != 8000 || bar[1] <= 0 || bar[2] != 1 {
			t.Errorf("progress bar max %v, value %v, determinate %v; want 8000, above 0, determinate", bar[0], bar[1], bar[2])
		}
		elapsed := browsertest.Run(t, ctx, "elapsed", chromedp.Text(chromedp.ID("wp-elapsed")))
		if !regexp.MustCompile(`^\d+\.\d s elapsed$`).MatchString(elapsed) {
			t.Errorf("elapsed reads %q, want like \"3.6 s elapsed\"", elapsed)
		}
		if got := browsertest.Run(t, ctx, "expected", chromedp.Text(chromedp.ID("wp-expected"))); got != "usually ready in about 8.0 s" {
			t.Errorf("expected reads %q", got)
		}
		screenshot(t, ctx, "waiting")

		s.ready()
		landsOnApp(t, ctx, "/cart?item=42")
		if n := s.served("page"); n != 1 {
			t.Errorf("the waiting page was served %d times, want once: the stream, not reloads, followed the wake", n)
		}
	})

	t.Run("failed wake", func(t *testing.T) {
		s, base := newStandIn(t, "w-5d01e7")
		ctx := tab(t, b, true)
		open(t, ctx, base+"/")
		browsertest.Do(t, ctx, "first phase", chromedp.WaitVisible(phaseItem("start")))
		s.current().Phase("health")
		s.current().Fail(testCause, 2*time.Second)

		browsertest.Do(t, ctx, "failure shown in place", chromedp.WaitVisible(chromedp.ID("wp-failed")), chromedp.WaitNotVisible(chromedp.ID("wp-waiting")))
		checkFailure(t, ctx, "w-5d01e7")
		if title := browsertest.Run(t, ctx, "title", chromedp.Title()); title != "shop could not start" {
			t.Errorf("title %q, want %q", title, "shop could not start")
		}
		screenshot(t, ctx, "failed")

		// The route's backoff is over and the next wake succeeds: the retry button brings the app.
		s.newWake("w-77b410")
		s.ready()
		browsertest.Do(t, ctx, "retry", chromedp.Click(chromedp.ID("wp-retry")))
		landsOnApp(t, ctx, "/")
	})

	t.Run("failure page after a failed wake wraps a long cause", func(t *testing.T) {
		s, base := newStandIn(t, "w-9c2e11")
		long := `route "` + strings.Repeat("storefront_eu_west_", 12) + `": wake failed in phase health`
		s.current().Fail(long, 3*time.Second)
		ctx := tab(t, b, true)
		open(t, ctx, base+"/orders")
		browsertest.Do(t, ctx, "failure page", chromedp.WaitVisible(chromedp.ID("wp-failed")), chromedp.WaitVisible(chromedp.ID("wp-retry")))
		if got := browsertest.Run(t, ctx, "cause", chromedp.Text(chromedp.ID("wp-cause"))); got != long {
			t.Errorf("cause reads %q, want %q", got, long)
		}
		overflow := browsertest.Run(t, ctx, "overflow", chromedp.Evaluate[[]float64](
			`[document.documentElement.scrollWidth, window.innerWidth, document.getElementById("wp-cause").scrollWidth, document.getElementById("wp-cause").clientWidth]`))
		if overflow[0] > overflow[1] || overflow[2] > overflow[3] {
			t.Errorf("the long cause overflows: page %v wide in a %v window, cause %v in %v", overflow[0], overflow[1], overflow[2], overflow[3])
		}
		screenshot(t, ctx, "failed-long")
	})

	t.Run("without JavaScript the refresh lands on the app", func(t *testing.T) {
		s, base := newStandIn(t, "w-0a6b3d")
		ctx := tab(t, b, false)
		open(t, ctx, base+"/cart")
		browsertest.Do(t, ctx, "waiting page", chromedp.WaitVisible(phaseItem("start")), chromedp.WaitVisible(chromedp.ID("wp-waiting")))
		screenshot(t, ctx, "nojs")
		s.ready()
		landsOnApp(t, ctx, "/cart")
		if n := s.served("events"); n != 0 {
			t.Errorf("%d event streams opened with JavaScript disabled, want none", n)
		}
		if n := s.served("page"); n < 1 {
			t.Errorf("waiting page served %d times", n)
		}
	})

	t.Run("without JavaScript the failure page and its retry link", func(t *testing.T) {
		s, base := newStandIn(t, "w-e41f80")
		s.current().Fail(testCause, 3*time.Second)
		ctx := tab(t, b, false)
		open(t, ctx, base+"/a/b?c=d")
		browsertest.Do(t, ctx, "failure page", chromedp.WaitVisible(chromedp.ID("wp-failed")))
		checkFailure(t, ctx, "w-e41f80")
		s.newWake("w-1c2d3e")
		s.ready()
		browsertest.Do(t, ctx, "retry", chromedp.Click(chromedp.ID("wp-retry")))
		landsOnApp(t, ctx, "/a/b?c=d")
	})
}

// checkFailure checks the failure state: the short cause, the wake id and a visible retry button.
func checkFailure(t *testing.T, ctx context.Context, wakeID string) {
	t.Helper()
	browsertest.Do(t, ctx, "retry button", chromedp.WaitVisible(chromedp.ID("wp-retry")))
	if got := browsertest.Run(t, ctx, "cause", chromedp.Text(chromedp.ID("wp-cause"))); got != testCause {
		t.Errorf("cause reads %q, want %q", got, testCause)
	}
	if got := browsertest.Run(t, ctx, "wake id", chromedp.Text(chromedp.ID("wp-wakeid"))); got != wakeID {
		t.Errorf("wake id reads %q, want %q", got, wakeID)
	}
	if got := browsertest.Run(t, ctx, "retry", chromedp.Text(chromedp.ID("wp-retry"))); !strings.Contains(got, "Try again") {
		t.Errorf("retry button reads %q", got)
	}
}
