package activator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// errorReader returns err, or io.EOF when err is nil.
type errorReader struct{ err error }

func (r errorReader) Read([]byte) (int, error) {
	if r.err == nil {
		return 0, io.EOF
	}
	return 0, r.err
}

// namedOpener opens each route's own fake backend.
type namedOpener map[string]*fakeBackend

func (o namedOpener) Open(r *registry.Route) (tenant.Backend, error) { return o[r.Name], nil }

// failingRoutes are FuzzAdmin's routes whose backing fails: a wake of "broken" fails (503), a sleep of
// "stuck" fails (502). "app" never fails.
var failingRoutes = map[string]bool{"broken": true, "stuck": true}

// adminRouteRE is a path the admin API routes to a route by name, as chi matches it: on the raw path
// when the URL has one.
var adminRouteRE = regexp.MustCompile(`^/routes/([^/]+)(/wake|/sleep)?$`)

// FuzzAdmin sends any request (method, target, header lines separated by "\n", body) that net/http
// can parse to the admin API of a Server with three routes, asleep or (with awake) with "app" and
// "stuck" awake, as a local client (Host: localhost unless the headers say otherwise). The handler
// must not panic; a foreign Host gets 421, a state-changing request a browser could send
// cross-site 403, and one whose body cannot be read whole 400; no answer is a 5xx but a 502 or 503
// for a route whose backing failed; an answer labelled JSON is valid JSON; a method its path does
// not take gets 405 with Allow and a JSON error naming both, and every 404 is a JSON error; and a
// request for a route by a name no route has gets 404 with a JSON error naming it.
func FuzzAdmin(f *testing.F) {
	f.Fuzz(func(t *testing.T, awake bool, method, target, header string, body []byte) {
		if len(method)+len(target)+len(header)+len(body) > 1024 {
			t.Skip("longer than any input this needs, and slow to minimize")
		}
		req, err := fuzzRequest(method, target, header, body)
		if err != nil {
			t.Skip("not a request net/http would hand a handler")
		}
		// A body that cannot be read whole (a Content-Length longer than what follows, a malformed
		// chunk) gets 400 from the guard once the request has passed its checks; see which this is,
		// and hand the handler the same bytes and error.
		read, bodyErr := io.ReadAll(req.Body)
		req.Body = io.NopCloser(io.MultiReader(bytes.NewReader(read), errorReader{bodyErr}))
		reg := prometheus.NewRegistry()
		s := New(Options{
			Opener: namedOpener{
				"app":    {},
				"broken": {wakeErr: errors.New("exited with code 1")},
				"stuck":  {sleepErr: errors.New("systemd: job failed")},
			},
			Logger:  slog.New(slog.DiscardHandler),
			Metrics: NewMetrics(reg),
			NewGate: func(*registry.Route) Gate { return passGate{} },
		})
		t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
		cfg := &registry.Config{}
		for _, name := range []string{"app", "broken", "stuck"} {
			cfg.Routes = append(cfg.Routes, testRoute(name))
		}
		if err := s.Apply(cfg); err != nil {
			t.Fatal(err)
		}
		if awake {
			for _, name := range []string{"app", "stuck"} {
				if err := s.Wake(context.Background(), name); err != nil {
					t.Fatalf("wake %s: %v", name, err)
				}
			}
		}

		rec := httptest.NewRecorder()
		s.AdminHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}), nil).ServeHTTP(rec, req)
		code, got := rec.Code, rec.Body.Bytes()
		what := req.Method + " " + req.RequestURI

		isJSON := strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json")
		var answer struct {
			Error  string
			Status struct{ Route string }
		}
		if isJSON {
			if err := json.Unmarshal(got, &answer); err != nil && !json.Valid(got) {
				t.Fatalf("%s: %d answer labelled JSON is not: %v\n%s", what, code, err, got)
			}
		}
		switch {
		case code == http.StatusBadGateway || code == http.StatusServiceUnavailable:
			if !failingRoutes[answer.Status.Route] {
				t.Errorf("%s: %d, but no backing failed (route %q): %s", what, code, answer.Status.Route, got)
			}
		case code >= 500:
			t.Errorf("%s: %d: %s", what, code, got)
		}

		// The guard: a request for a foreign Host gets 421, and a state-changing one that a browser could
		// send cross-site gets 403, whatever it asks for.
		refusal := 0
		switch {
		case !hostAllowed(req, nil):
			refusal = http.StatusMisdirectedRequest
		case !isRead(req.Method) && crossSite(req, false) != "":
			refusal = http.StatusForbidden
		case bodyErr != nil:
			refusal = http.StatusBadRequest
		}
		if refusal != 0 {
			if code != refusal {
				t.Errorf("%s (Host %q): %d, want %d from the guard: %s", what, req.Host, code, refusal, got)
			}
			return
		}

		// A method its path does not take gets 405 with Allow and a JSON error naming the method, the
		// path and the methods allowed; every 404 is a JSON error.
		switch allow := rec.Header().Get("Allow"); code {
		case http.StatusMethodNotAllowed:
			if allow == "" || !isJSON || !strings.HasPrefix(answer.Error, string([]rune(req.Method+" "+req.URL.Path+": "))) ||
				!strings.HasSuffix(answer.Error, "(allowed: "+allow+")") || slices.Contains(strings.Split(allow, ", "), req.Method) {
				t.Errorf("%s: 405 with Allow %q and %q, want Allow without the method and a JSON error naming both", what, allow, got)
			}
		case http.StatusNotFound:
			if !isJSON || answer.Error == "" {
				t.Errorf("%s: 404 %q, want a JSON error", what, got)
			}
		}

		path := req.URL.RawPath
		if path == "" {
			path = req.URL.Path
		}
		m := adminRouteRE.FindStringSubmatch(path)
		if m == nil {
			return
		}
		verb := http.MethodPost // wake and sleep
		if m[2] == "" {
			verb = http.MethodGet
		}
		if req.Method != verb {
			return
		}
		if name := m[1]; s.instance(name) == nil {
			want := "no such route: " + string([]rune(name)) // JSON writes each invalid byte as U+FFFD
			if code != http.StatusNotFound || !isJSON || answer.Error != want {
				t.Errorf("%s: %d %q, want 404 with error %q", what, code, got, want)
			}
		} else if code == http.StatusNotFound {
			t.Errorf("%s: 404 for route %q, which exists: %s", what, name, got)
		}
	})
}

// fuzzRequest parses the request FuzzAdmin sends, as net/http's server would read it off the wire.
func fuzzRequest(method, target, header string, body []byte) (*http.Request, error) {
	var b strings.Builder
	b.WriteString(method + " " + target + " HTTP/1.1\r\n")
	host := false
	for line := range strings.SplitSeq(header, "\n") {
		if line != "" {
			b.WriteString(line + "\r\n")
			host = host || len(line) >= 5 && strings.EqualFold(line[:5], "host:")
		}
	}
	if !host {
		b.WriteString("Host: localhost\r\n")
	}
	if len(body) > 0 {
		b.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\n")
	}
	b.WriteString("\r\n")
	b.Write(body)
	return http.ReadRequest(bufio.NewReader(strings.NewReader(b.String())))
}
