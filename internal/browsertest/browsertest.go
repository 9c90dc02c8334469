// Package browsertest drives Debian's headless Chromium through chromedp for the browser tests (the
// waiting page in internal/waitpage, and at a real edge in cmd/activator): finding the browser (a
// missing one skips, or fails under ACTIVATOR_INTEGRATION=required), one browser per test, tabs with
// or without JavaScript, and actions that fail the test with what they were doing.
package browsertest

import (
	"context"
	"net/http"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/activator/activator/internal/testenv"
)

// Path finds Chromium on PATH, or calls testenv.Missing.
func Path(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless_shell"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	testenv.Missing(t, "no Chromium found on PATH (Debian: apt-get install chromium)")
	return ""
}

// Start starts one headless Chromium (960x640, no sandbox: the tests run as root) for at most budget,
// closed at cleanup; extra adds command-line flags.
func Start(t testing.TB, budget time.Duration, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	path := Path(t)
	root, cancelRoot := context.WithTimeout(context.Background(), budget)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.WindowSize(960, 640),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(root, append(opts, extra...)...)
	ctx, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		_ = chromedp.Cancel(ctx)
		cancelBrowser()
		cancelAlloc()
		cancelRoot()
	})
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting %s: %v", path, err)
	}
	return ctx
}

// Tab opens a new tab of browser, bounded by step and closed at cleanup; scripts false disables
// JavaScript in it.
func Tab(t testing.TB, browser context.Context, step time.Duration, scripts bool) context.Context {
	t.Helper()
	bounded, cancel := context.WithTimeout(browser, step)
	ctx, cancelTab := chromedp.NewContext(bounded)
	t.Cleanup(func() {
		cancelTab()
		cancel()
	})
	err := chromedp.Do(ctx, func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := cdp.Call(ctx, t, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: !scripts})
		return chromedp.Void{}, err
	})
	if err != nil {
		t.Fatalf("new tab: %v", err)
	}
	return ctx
}

// Run runs a, failing t with what on error.
func Run[T any](t testing.TB, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// Do runs steps, failing t with what on error.
func Do(t testing.TB, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// Open navigates to url and checks that the answer is 503, the waiting or failure page's status. It
// returns the response for further checks.
func Open(t testing.TB, ctx context.Context, url string) *network.Response {
	t.Helper()
	res := Run(t, ctx, "navigate to "+url, chromedp.NavigateResponse(url))
	if res.Status != http.StatusServiceUnavailable {
		t.Fatalf("navigate to %s: status %d, want 503", url, res.Status)
	}
	return res
}
