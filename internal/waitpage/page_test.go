package waitpage

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func builtin(t *testing.T) *Page {
	t.Helper()
	p, err := New("")
	if err != nil {
		t.Fatalf("New(\"\"): %v", err)
	}
	return p
}

func navigation(target string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, target, nil)
	r.Header.Set("Accept", chromeAccept)
	r.Header.Set("Sec-Fetch-Mode", "navigate")
	return r
}

var nonceRE = regexp.MustCompile(`script-src 'nonce-([A-Za-z0-9]+)'`)

func TestWaitingHeaders(t *testing.T) {
	p := builtin(t)
	v := View{Route: "shop", WakeID: "w-42", Phase: "start", Elapsed: 1200 * time.Millisecond,
		Expected: 3 * time.Second, RetryAfter: 1500 * time.Millisecond, EventsURL: EventsPath + "?wake=w-42"}
	var nonces []string
	for range 2 {
		rec := httptest.NewRecorder()
		if err := p.Waiting(rec, navigation("http://shop.test/cart?x=1"), v); err != nil {
			t.Fatalf("Waiting: %v", err)
		}
		res, body := rec.Result(), rec.Body.String()
		for key, want := range map[string]string{
			"Content-Type":           "text/html; charset=utf-8",
			"Cache-Control":          "no-store",
			"Retry-After":            "2",
			"X-Content-Type-Options": "nosniff",
		} {
			if got := res.Header.Get(key); got != want {
				t.Errorf("%s = %q, want %q", key, got, want)
			}
		}
		if res.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("status = %d, want 503", res.StatusCode)
		}
		cspHeader := res.Header.Get("Content-Security-Policy")
		m := nonceRE.FindStringSubmatch(cspHeader)
		if m == nil {
			t.Fatalf("Content-Security-Policy %q has no script nonce", cspHeader)
		}
		nonce := m[1]
		nonces = append(nonces, nonce)
		for _, want := range []string{"default-src 'none'", "style-src 'nonce-" + nonce + "'", "connect-src 'self'", "base-uri 'none'"} {
			if !strings.Contains(cspHeader, want) {
				t.Errorf("Content-Security-Policy %q lacks %q", cspHeader, want)
			}
		}
		for _, want := range []string{
			`<noscript><meta http-equiv="refresh" content="2"></noscript>`,
			`<script nonce="` + nonce + `">`,
			`<style nonce="` + nonce + `">`,
			`<li data-phase="start">start</li>`,
			`max="3000" value="1200"`,
			`1.2 s elapsed`, `usually ready in about 3.0 s`,
			`"events":"/.activator/wake-events?wake=w-42"`,
			`href="/cart?x=1"`,
			`w-42`,
		} {
			if !strings.Contains(body, want) {
				t.Errorf("waiting page lacks %q:\n%s", want, body)
			}
		}
		if strings.Contains(body, "http://") || strings.Contains(body, "https://") || strings.Contains(body, " src=") {
			t.Errorf("waiting page refers to something outside itself:\n%s", body)
		}
	}
	if nonces[0] == nonces[1] {
		t.Errorf("two responses share the nonce %q", nonces[0])
	}
}

func TestWaitingWithoutEstimate(t *testing.T) {
	rec := httptest.NewRecorder()
	_ = builtin(t).Waiting(rec, navigation("http://shop.test/"), View{Route: "shop"})
	body := rec.Body.String()
	if got := rec.Header().Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After without RetryAfter = %q, want the minimum, 1", got)
	}
	if !strings.Contains(body, `<progress id="wp-bar" aria-label="Wake progress"></progress>`) {
		t.Errorf("without an estimate the bar should be indeterminate (no max, no value):\n%s", body)
	}
	if !strings.Contains(body, `<span id="wp-expected"></span>`) {
		t.Errorf("without an estimate the page promises a time:\n%s", body)
	}
}

func TestFailedPage(t *testing.T) {
	rec := httptest.NewRecorder()
	v := View{Route: "shop", WakeID: "w-7", Phase: "health", Cause: `route "shop": wake failed in phase health`,
		RetryAfter: 4 * time.Second}
	if err := builtin(t).Failed(rec, navigation("http://shop.test/a/b"), v); err != nil {
		t.Fatal(err)
	}
	res, body := rec.Result(), rec.Body.String()
	if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") != "4" ||
		res.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("status %d, Retry-After %q, Cache-Control %q; want 503, 4, no-store",
			res.StatusCode, res.Header.Get("Retry-After"), res.Header.Get("Cache-Control"))
	}
	for _, want := range []string{
		`route &#34;shop&#34;: wake failed in phase health`, `<code id="wp-wakeid">w-7</code>`,
		`<a class="button" id="wp-retry" href="/a/b">Try again</a>`, `<section id="wp-waiting" hidden>`,
		`A new attempt is possible in 4 s.`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("failure page lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, `http-equiv="refresh"`) {
		t.Errorf("the failure page reloads by itself:\n%s", body)
	}
}

// TestEscaping: whatever the edge passes (a cause, a route, a phase set by a backing, the URL) is text
// on the page and data in the script, never markup.
func TestEscaping(t *testing.T) {
	evil := `</script><script>alert(1)</script>`
	v := View{Route: evil, WakeID: evil, Phase: evil, Cause: evil, EventsURL: EventsPath + "?wake=" + evil}
	for name, write := range map[string]func(*Page, http.ResponseWriter, *http.Request, View) error{
		"waiting": (*Page).Waiting, "failed": (*Page).Failed,
	} {
		rec := httptest.NewRecorder()
		_ = write(builtin(t), rec, navigation("http://shop.test/x?q=%3Cscript%3E"), v)
		body := rec.Body.String()
		if n := strings.Count(body, "<script"); n != 1 {
			t.Errorf("%s page: %d <script elements, want only its own:\n%s", name, n, body)
		}
		if strings.Contains(body, "alert(1)</script>") {
			t.Errorf("%s page carries the injected script:\n%s", name, body)
		}
	}
}

func TestSameOrigin(t *testing.T) {
	for in, want := range map[string]string{
		"/":               "/",
		"/a?b=c":          "/a?b=c",
		"//evil.test/x":   "/.//evil.test/x",
		`/\evil.test`:     `/./\evil.test`,
		"*":               "/",
		"http://x.test/y": "/",
	} {
		if got := sameOrigin(in); got != want {
			t.Errorf("sameOrigin(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestHeadHasNoBody(t *testing.T) {
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodHead, "http://shop.test/", nil)
	_ = builtin(t).Waiting(rec, r, View{Route: "shop"})
	if rec.Code != http.StatusServiceUnavailable || rec.Body.Len() != 0 {
		t.Errorf("HEAD: status %d, %d body bytes; want 503 and none", rec.Code, rec.Body.Len())
	}
}

// goodTemplate is a route's own page: its words, the built-in style, the required Head and Script.
const goodTemplate = `<!doctype html><html><head>{{.Head}}<title>{{.Route}}</title><style nonce="{{.Nonce}}">{{.Style}}</style></head>
<body><main><h1>{{if .Failed}}Sorry, {{.Route}} is down: {{.Cause}}{{else}}Brewing {{.Route}}{{end}}</h1>
<ol id="wp-phases">{{range .Phases}}<li>{{.}}</li>{{end}}</ol><code id="wp-wakeid">{{.WakeID}}</code></main>
<script nonce="{{.Nonce}}">{{.Script}}</script></body></html>`

func writeTemplate(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "theme.html")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestCustomTemplate(t *testing.T) {
	p, err := New(writeTemplate(t, goodTemplate))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	rec := httptest.NewRecorder()
	if err := p.Waiting(rec, navigation("http://shop.test/"), View{Route: "shop", Phase: "start", WakeID: "w-1"}); err != nil {
		t.Fatal(err)
	}
	body := rec.Body.String()
	nonce := nonceRE.FindStringSubmatch(rec.Header().Get("Content-Security-Policy"))[1]
	for _, want := range []string{"Brewing shop", "<li>start</li>", `<script nonce="` + nonce + `">`, `http-equiv="refresh"`} {
		if !strings.Contains(body, want) {
			t.Errorf("custom page lacks %q:\n%s", want, body)
		}
	}
	rec = httptest.NewRecorder()
	_ = p.Failed(rec, navigation("http://shop.test/"), View{Route: "shop", Cause: "<b>no</b>"})
	if body := rec.Body.String(); !strings.Contains(body, "Sorry, shop is down: &lt;b&gt;no&lt;/b&gt;") {
		t.Errorf("custom failure page:\n%s", body)
	}
}

// TestCustomTemplateFailsAtRunTime: a template that passed its check but fails on other data is
// replaced by the built-in page, and the error says which template.
func TestCustomTemplateFailsAtRunTime(t *testing.T) {
	path := writeTemplate(t, strings.Replace(goodTemplate, "<title>", "<title>{{index .Phases 1}}", 1))
	p, err := New(path)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	rec := httptest.NewRecorder()
	err = p.Waiting(rec, navigation("http://shop.test/"), View{Route: "shop", Phase: "start"})
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("Waiting error = %v, want one naming %s", err, path)
	}
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "Starting <span class=\"route\">shop</span>") {
		t.Errorf("fallback: status %d, body:\n%s", rec.Code, rec.Body.String())
	}
}

func TestTemplateErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "absent.html")
	for _, tc := range []struct {
		name string
		path string // "" writes text to a temporary file
		text string
		want []string
	}{
		{"missing file", missing, "", []string{missing + ": no such file or directory"}},
		{"directory", t.TempDir(), "", []string{": is a directory"}},
		{"parse error", "", "<html>\n{{.Head}}\n{{if .Failed}}\n", []string{"template: theme.html:4: unexpected EOF"}},
		{"unknown field", "", strings.Replace(goodTemplate, "{{.Route}}</title>", "{{.Tenant}}</title>", 1),
			[]string{"the waiting page", "the failed page", "can't evaluate field Tenant"}},
		{"no head", "", strings.Replace(goodTemplate, "{{.Head}}", "", 1),
			[]string{"waiting page does not include {{.Head}}", "failed page does not include {{.Head}}"}},
		{"head escaped", "", strings.Replace(goodTemplate, "{{.Head}}", "<title>{{.Head}}</title>", 1),
			[]string{"does not include {{.Head}}"}},
		{"no script", "", strings.Replace(goodTemplate, "{{.Script}}", "", 1),
			[]string{"does not include {{.Script}}"}},
		{"script without nonce", "", strings.Replace(goodTemplate, `<script nonce="{{.Nonce}}">`, "<script>", 1),
			[]string{`in a <script nonce="{{.Nonce}}">`}},
		{"too large", "", goodTemplate + strings.Repeat(" ", maxTemplateBytes), []string{"larger than 256 KiB"}},
		// 1.3 KB that doubles 18 times: 16 MB a request before the cap (found with the real binary).
		{"renders too much", "", strings.Replace(goodTemplate, "<title>", "<title>"+doubling(18), 1),
			[]string{"the waiting page: ", "renders more than 1024 KiB"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.path
			if path == "" {
				path = writeTemplate(t, tc.text)
			}
			p, err := New(path)
			if err == nil {
				t.Fatalf("New(%s) = %v, nil; want an error", path, p)
			}
			msg := err.Error()
			for _, want := range append([]string{"waiting page template " + path + ": "}, tc.want...) {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q lacks %q", msg, want)
				}
			}
		})
	}
}

// doubling is a template that defines d0 as "xx…" and each dN as two dN-1, and renders d<levels>:
// 2^levels times a short text.
func doubling(levels int) string {
	var b strings.Builder
	b.WriteString(`{{define "d0"}}0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef{{end}}`)
	for i := 1; i <= levels; i++ {
		fmt.Fprintf(&b, `{{define "d%d"}}{{template "d%d"}}{{template "d%d"}}{{end}}`, i, i-1, i-1)
	}
	fmt.Fprintf(&b, `{{template "d%d"}}`, levels)
	return b.String()
}

// TestTemplatesLoadEachFileOnce: Templates reads, parses and checks a file once, however many routes
// name it, and gives each the same Page, or the same error; another path is loaded on its own.
func TestTemplatesLoadEachFileOnce(t *testing.T) {
	good, bad := writeTemplate(t, goodTemplate), writeTemplate(t, "<html>{{.Nope}}</html>")
	var ts Templates
	p1, err := ts.Load(good)
	if err != nil {
		t.Fatal(err)
	}
	_, err1 := ts.Load(bad)
	if err1 == nil {
		t.Fatal("a template with an unknown field loaded")
	}
	// Both files gone: a second Load of either path must not read it again.
	if err := os.Remove(good); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(bad); err != nil {
		t.Fatal(err)
	}
	p2, err := ts.Load(good)
	if err != nil || p2 != p1 {
		t.Errorf("second Load of %s: %p, %v; want the first Page %p", good, p2, err, p1)
	}
	if _, err2 := ts.Load(bad); err2 != err1 {
		t.Errorf("second Load of %s: %v; want the first error %v", bad, err2, err1)
	}
	var fresh Templates // the next load reads the files again
	if _, err := fresh.Load(good); err == nil || !strings.Contains(err.Error(), good) {
		t.Errorf("a new Templates after the file was removed: %v; want an error naming %s", err, good)
	}
}

// BenchmarkNew is one route template's load and check (a 0.5 KB file): what Templates saves for each
// further route that names the same file.
func BenchmarkNew(b *testing.B) {
	path := filepath.Join(b.TempDir(), "theme.html")
	if err := os.WriteFile(path, []byte(goodTemplate), 0o600); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := New(path); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzScriptIn holds scriptIn to the pattern it stands for.
func FuzzScriptIn(f *testing.F) {
	f.Add(`<script nonce="n">s()</script>`, "s()", "n")
	f.Add(`<script type="module" nonce="n" async>`+"\n s()", "s()", "n")
	f.Add(`<script data-nonce="n">s()`, "s()", "n")
	f.Add(`<scriptx nonce="n">s()`, "s()", "n")
	f.Add(`<script nonce="n" <scripts>s()`, "s()", "n")
	f.Add(`<script nonce="n">x</script> s()`, "s()", "n")
	f.Add(`<script nonce="m">s()<script nonce="n">s()`, "s()", "n")
	f.Fuzz(func(t *testing.T, page, script, nonce string) {
		if len(page) > 512 || len(script) > 64 || len(nonce) > 32 {
			return
		}
		re, err := regexp.Compile(`<script\b[^>]*\bnonce="` + regexp.QuoteMeta(nonce) + `"[^>]*>\s*` + regexp.QuoteMeta(script))
		if err != nil {
			return
		}
		if got, want := scriptIn(page, script, nonce), re.MatchString(page); got != want {
			t.Errorf("scriptIn(%q, %q, %q) = %v, the pattern says %v", page, script, nonce, got, want)
		}
	})
}
