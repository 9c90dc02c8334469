package waitpage

import (
	"bytes"
	"crypto/rand"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

var (
	//go:embed page.html
	builtinHTML string
	//go:embed page.css
	builtinCSS string
	//go:embed page.js
	builtinJS string
)

// maxTemplateBytes bounds a route's template file: a waiting page is a few kilobytes.
const maxTemplateBytes = 256 << 10

// maxPageBytes bounds what a template renders: 1.3 KB of nested {{define}}/{{template}} doubling 18
// times rendered 16 MB for every browser request to a sleeping route (found with the real binary).
const maxPageBytes = 1 << 20

// errPageTooLarge is a template whose page renders past maxPageBytes.
var errPageTooLarge = fmt.Errorf("renders more than %d KiB", maxPageBytes>>10)

// capped is a bytes.Buffer that refuses to grow past maxPageBytes: the template's execution stops at
// the first write over it.
type capped struct{ bytes.Buffer }

func (c *capped) Write(p []byte) (int, error) {
	if c.Len()+len(p) > maxPageBytes {
		return 0, errPageTooLarge
	}
	return c.Buffer.Write(p)
}

// View is what the edge knows about a wake when it answers a browser with a page.
type View struct {
	Route    string
	WakeID   string
	Phase    string   // the current phase, "" before the first
	Phases   []string // every phase begun so far, oldest first; nil: just Phase, if any
	Cause    string   // Failed only: the short client message (the tenant's output only with the route's detailed_errors)
	Elapsed  time.Duration
	Expected time.Duration // the route's History.Expected; 0: no estimate, the bar is indeterminate
	// RetryAfter is the Retry-After sent, rounded up to whole seconds, at least 1 s: on the waiting
	// page also the no-JavaScript refresh interval and the script's fallback delay; on the failure
	// page the route's failure backoff.
	RetryAfter time.Duration
	// EventsURL is where the page's script opens its EventSource, on the same origin (the
	// Content-Security-Policy allows nothing else): EventsPath plus what the edge needs to find the
	// wake. "" leaves the page without live updates: it reloads after RetryAfter.
	EventsURL string
}

// Data is what a page template is executed with. The built-in template (page.html) shows how each
// field is used; a route's own template gets the same data and must include Head in its <head> and
// Script in a <script nonce="{{.Nonce}}"> (New checks both). Style, the built-in CSS, is there for
// templates that only want to change the words; a template with its own CSS puts it in a
// <style nonce="{{.Nonce}}">. The script finds its elements by id and skips those it does not find:
// wp-waiting and wp-failed (the two states' sections, toggled with the hidden attribute), wp-phases
// (a list it fills with <li data-phase="…">), wp-bar (a <progress>), wp-elapsed, wp-expected,
// wp-cause, wp-wakeid, wp-retry-after.
type Data struct {
	State  string // "waiting" or "failed"
	Failed bool
	Route  string
	WakeID string
	Phase  string
	Phases []string
	Cause  string

	Elapsed, Expected, RetryAfter time.Duration
	ElapsedMS, ExpectedMS         int64
	ElapsedText, ExpectedText     string // "1.5 s elapsed", "usually ready in about 3.0 s" ("" without an estimate)
	RetrySeconds                  int    // RetryAfter in whole seconds, as sent in Retry-After

	URL       string // the request's own URL (path and query), for the retry link
	EventsURL string
	Nonce     string // the response's CSP nonce, for the page's <script> and <style>

	Head   template.HTML // charset, viewport, robots, and on the waiting page the <noscript> refresh
	Style  template.CSS  // the built-in style sheet
	Script template.JS   // the page's script, with this response's settings
}

// Page renders the waiting and failure pages from one template. It is immutable once made by New and
// safe for concurrent use.
type Page struct {
	name    string             // the template's file, "" for the built-in page
	tmpl    *template.Template // the route's template, or the built-in one
	builtin *template.Template // the fallback when a route's template fails at run time
}

// New loads the page template at templatePath ("" is the built-in page) and checks it by executing
// it for both states against sample data. Its error names the file and lists every problem found:
// unreadable or too large, a parse error (with its line), an execution error, a missing Head or
// Script.
func New(templatePath string) (*Page, error) {
	builtin := builtinTemplate()
	p := &Page{name: templatePath, tmpl: builtin, builtin: builtin}
	if templatePath == "" {
		return p, nil
	}
	src, err := readTemplate(templatePath)
	if err != nil {
		return nil, fmt.Errorf("waiting page template %s: %w", templatePath, err)
	}
	t, err := template.New(filepath.Base(templatePath)).Parse(src)
	if err != nil {
		return nil, fmt.Errorf("waiting page template %s: %w", templatePath, err)
	}
	p.tmpl = t
	if err := p.check(); err != nil {
		return nil, fmt.Errorf("waiting page template %s: %w", templatePath, err)
	}
	return p, nil
}

// builtinTemplate is the built-in page's template, parsed once: a template is safe to execute from
// many goroutines, and every Page falls back to it.
var builtinTemplate = sync.OnceValue(func() *template.Template {
	return template.Must(template.New("page.html").Parse(builtinHTML))
})

// Templates loads the route templates of one config, one load or reload: each file is read, parsed and
// checked once, however many routes name it, and its Page (which holds nothing of a route's) or its
// error is shared by them. A template was made afresh for each route, twice per reload, at about
// 5.5 ms and 1.5 MB of garbage each (0.7 ms and 94 KB since scriptIn: BenchmarkNew): a reload of
// 1,000 routes naming one branded page took 5.8 s. A new Templates for each load reads
// the files again, so an edited template takes effect at the next reload. The zero value is ready;
// it is not safe for concurrent use.
type Templates struct {
	loaded map[string]loadedPage
}

type loadedPage struct {
	p   *Page
	err error
}

// Load is New(templatePath), made once per path.
func (ts *Templates) Load(templatePath string) (*Page, error) {
	if l, ok := ts.loaded[templatePath]; ok {
		return l.p, l.err
	}
	p, err := New(templatePath)
	if ts.loaded == nil {
		ts.loaded = make(map[string]loadedPage)
	}
	ts.loaded[templatePath] = loadedPage{p, err}
	return p, err
}

func readTemplate(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", withoutPath(err)
	}
	defer f.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(io.LimitReader(f, maxTemplateBytes+1)); err != nil {
		return "", withoutPath(err)
	}
	if b.Len() > maxTemplateBytes {
		return "", fmt.Errorf("larger than %d KiB", maxTemplateBytes>>10)
	}
	return b.String(), nil
}

// withoutPath drops the path from a file error: the caller's message names the file already.
func withoutPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// check executes the template for both states against sample data and reports every problem.
func (p *Page) check() error {
	var errs []error
	for _, failed := range []bool{false, true} {
		v := View{
			Route: "sample", WakeID: "w-sample", Phase: "health", Phases: []string{"start", "health"},
			Elapsed: 1500 * time.Millisecond, Expected: 3 * time.Second, RetryAfter: 2 * time.Second,
			EventsURL: EventsPath + "?wake=w-sample",
		}
		state := "waiting"
		if failed {
			state, v.Cause = "failed", `route "sample": wake failed in phase health`
		}
		d := p.data(v, "/sample?x=1", "sampleNonce0123456789abcdef", failed)
		var out capped
		if err := p.tmpl.Execute(&out, d); err != nil {
			errs = append(errs, fmt.Errorf("the %s page: %w", state, err))
			continue
		}
		page := out.String()
		if !strings.Contains(page, string(d.Head)) {
			errs = append(errs, fmt.Errorf("the %s page does not include {{.Head}} (charset, viewport and the no-JavaScript refresh) unescaped; put it in <head>", state))
		}
		if !scriptIn(page, string(d.Script), d.Nonce) {
			errs = append(errs, fmt.Errorf(`the %s page does not include {{.Script}} in a <script nonce="{{.Nonce}}"> element; without it the page never follows the wake`, state))
		}
	}
	return errors.Join(errs...)
}

// scriptIn reports whether page holds script as the text of a <script> element with the given nonce:
// whether `<script\b[^>]*\bnonce="NONCE"[^>]*>\s*SCRIPT` matches it (FuzzScriptIn holds the two
// alike). Compiled as that pattern, with the page's script (some 3.6 KB) quoted in it, the check's
// regexp was 70% of a template's load.
func scriptIn(page, script, nonce string) bool {
	attr := `nonce="` + nonce + `"`
	for off := 0; off <= len(page); {
		i := strings.Index(page[off:], script)
		if i < 0 {
			return false
		}
		at := off + i
		before := strings.TrimRight(page[:at], "\t\n\f\r ") // RE2's \s
		if strings.HasSuffix(before, ">") {
			before = before[:len(before)-1]
			// The tag may open at any "<script" with no '>' after it: an earlier one spans a later one's.
			for open := strings.LastIndex(before, "<script"); open >= 0; open = strings.LastIndex(before[:open], "<script") {
				tag := before[open+len("<script"):]
				if strings.Contains(tag, ">") {
					break
				}
				if tag != "" && !isWordByte(tag[0]) && hasAttr(tag, attr) {
					return true
				}
			}
		}
		off = at + 1
	}
	return false
}

// hasAttr reports whether tag holds attr after a byte that is not a word byte (RE2's \b before it).
func hasAttr(tag, attr string) bool {
	for off := 0; ; {
		i := strings.Index(tag[off:], attr)
		if i < 0 {
			return false
		}
		if at := off + i; at > 0 && !isWordByte(tag[at-1]) {
			return true
		}
		off += i + 1
	}
}

// isWordByte is RE2's \w: an ASCII letter, digit or underscore.
func isWordByte(c byte) bool {
	return c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// Waiting answers r with the waiting page: 503, Retry-After, Cache-Control: no-store and the page's
// Content-Security-Policy. The response is always written; the error is a route template's failure
// (the built-in page was sent instead), for the log.
func (p *Page) Waiting(w http.ResponseWriter, r *http.Request, v View) error {
	return p.write(w, r, v, false)
}

// Failed answers r with the failure page: 503, Retry-After (the route's backoff), the short cause, the
// wake id and a link that loads r's URL again. It does not reload by itself. The response is always
// written; the error is a route template's failure (the built-in page was sent instead), for the log.
func (p *Page) Failed(w http.ResponseWriter, r *http.Request, v View) error {
	return p.write(w, r, v, true)
}

func (p *Page) write(w http.ResponseWriter, r *http.Request, v View, failed bool) error {
	d := p.data(v, r.URL.RequestURI(), rand.Text(), failed)
	var body capped
	err := p.tmpl.Execute(&body, d)
	if err != nil {
		err = fmt.Errorf("waiting page template %s: %w", p.name, err)
		body.Reset()
		if berr := p.builtin.Execute(&body, d); berr != nil {
			panic(fmt.Sprintf("waitpage: built-in page failed: %v", berr)) // it is checked by the tests
		}
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Retry-After", strconv.Itoa(d.RetrySeconds))
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Security-Policy", csp(d.Nonce))
	h.Set("Content-Length", strconv.Itoa(body.Len()))
	w.WriteHeader(http.StatusServiceUnavailable)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body.Bytes())
	}
	return err
}

// csp allows the page's own inline script and style (by nonce), its event stream on the same origin,
// and nothing else: no external script, style, font, image or frame, no <base>, and framing only by
// the same origin (an app may frame its own routes).
func csp(nonce string) string {
	n := "'nonce-" + nonce + "'"
	return "default-src 'none'; script-src " + n + "; style-src " + n +
		"; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'self'; frame-ancestors 'self'"
}

// pageConfig is the script's settings, embedded as JSON in Data.Script.
type pageConfig struct {
	State        string   `json:"state"`
	Events       string   `json:"events"`
	ElapsedMS    int64    `json:"elapsed_ms"`
	ExpectedMS   int64    `json:"expected_ms"`
	RetryAfterMS int64    `json:"retry_after_ms"`
	Phases       []string `json:"phases"`
}

// data builds the template's data for v; uri is the request's own URL, nonce the response's.
func (p *Page) data(v View, uri, nonce string, failed bool) Data {
	retry := max(1, int(math.Ceil(v.RetryAfter.Seconds())))
	phases := v.Phases
	if phases == nil && v.Phase != "" {
		phases = []string{v.Phase}
	}
	if phases == nil {
		phases = []string{}
	}
	state := "waiting"
	if failed {
		state = "failed"
	}
	d := Data{
		State: state, Failed: failed,
		Route: v.Route, WakeID: v.WakeID, Phase: v.Phase, Phases: phases, Cause: v.Cause,
		Elapsed: v.Elapsed, Expected: v.Expected, RetryAfter: time.Duration(retry) * time.Second,
		ElapsedMS: v.Elapsed.Milliseconds(), ExpectedMS: v.Expected.Milliseconds(),
		ElapsedText: seconds(v.Elapsed) + " elapsed", RetrySeconds: retry,
		URL: sameOrigin(uri), EventsURL: v.EventsURL, Nonce: nonce,
		Style: template.CSS(builtinCSS),
	}
	if v.Expected > 0 {
		d.ExpectedText = "usually ready in about " + seconds(v.Expected)
	}
	head := `<meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">` +
		`<meta name="robots" content="noindex">`
	if !failed {
		head += `<noscript><meta http-equiv="refresh" content="` + strconv.Itoa(retry) + `"></noscript>`
	}
	d.Head = template.HTML(head)
	cfg, err := json.Marshal(pageConfig{ // json.Marshal escapes <, > and &: the JSON cannot end the <script>
		State: state, Events: v.EventsURL, ElapsedMS: d.ElapsedMS, ExpectedMS: d.ExpectedMS,
		RetryAfterMS: int64(retry) * 1000, Phases: phases,
	})
	if err != nil {
		panic(fmt.Sprintf("waitpage: page config: %v", err)) // strings and numbers always marshal
	}
	d.Script = template.JS(builtinJS + "(" + string(cfg) + ");")
	return d
}

// sameOrigin makes a request URI safe to use as a link back to itself: a path that starts with "//"
// would be read as another host's URL, so it gets a "/." in front, which resolves to the same path.
func sameOrigin(uri string) string {
	if !strings.HasPrefix(uri, "/") {
		return "/"
	}
	if strings.HasPrefix(uri, "//") || strings.HasPrefix(uri, `/\`) {
		return "/." + uri
	}
	return uri
}

// seconds formats d for people: "0.4 s", "1.5 s", "12 s".
func seconds(d time.Duration) string {
	if d < 10*time.Second {
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + " s"
	}
	return strconv.Itoa(int(d.Round(time.Second).Seconds())) + " s"
}
