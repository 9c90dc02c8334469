package activator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/activator/activator/internal/registry"
)

// listServer is a Server over n fake routes.
func listServer(tb testing.TB, n int) *Server {
	tb.Helper()
	s := New(Options{
		Opener:  fakeProvider{&fakeBackend{}},
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		NewGate: func(*registry.Route) Gate { return passGate{} },
	})
	routes := make([]*registry.Route, n)
	for i := range routes {
		routes[i] = testRoute(fmt.Sprintf("r%d", i))
	}
	if err := s.Apply(&registry.Config{Routes: routes}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s
}

// writeRecorder records the largest single Write of a response body.
type writeRecorder struct {
	httptest.ResponseRecorder
	largest int
}

func (w *writeRecorder) Write(p []byte) (int, error) {
	w.largest = max(w.largest, len(p))
	return w.ResponseRecorder.Write(p)
}

// TestRoutesListStreams: GET /routes is the JSON writeJSON makes of Statuses, byte for byte, written a
// piece at a time: encoded whole, it was one 28 MB write at 100,000 routes, with 254 MB allocated
// behind it.
func TestRoutesListStreams(t *testing.T) {
	for _, n := range []int{0, 1, 3, 2000} {
		s := listServer(t, n)
		h := s.AdminHandler(nil, nil)
		w := &writeRecorder{ResponseRecorder: *httptest.NewRecorder()}
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://127.0.0.1/routes", nil))
		want := httptest.NewRecorder()
		writeJSON(want, http.StatusOK, s.Statuses())
		if w.Code != http.StatusOK || !bytes.Equal(w.Body.Bytes(), want.Body.Bytes()) {
			t.Fatalf("%d routes: GET /routes = %d\n%s\nwant 200\n%s", n, w.Code, w.Body, want.Body)
		}
		if ct := w.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("%d routes: Content-Type %q", n, ct)
		}
		if n == 2000 && (w.Body.Len() < 256<<10 || w.largest > 32<<10) {
			t.Errorf("%d routes: a body of %d bytes written in writes of up to %d, want none over 32 KiB", n, w.Body.Len(), w.largest)
		}
	}
}

// BenchmarkRoutesList: GET /routes over 100,000 routes.
func BenchmarkRoutesList(b *testing.B) {
	s := listServer(b, 100000)
	h := s.AdminHandler(nil, nil)
	r := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/routes", nil)
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(w, r)
	}
}

// TestRoutesListSelects: GET /routes answers only the routes its query selects (state=, route=), or
// only their names (names=true), in config order; a query it cannot follow is an error naming the
// parameter and the value, never the whole list.
func TestRoutesListSelects(t *testing.T) {
	s := listServer(t, 5)
	for _, name := range []string{"r1", "r3"} {
		if err := s.Wake(context.Background(), name); err != nil {
			t.Fatal(err)
		}
	}
	h := s.AdminHandler(nil, nil)
	get := func(query string) (int, []byte) {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://127.0.0.1/routes"+query, nil))
		return w.Code, w.Body.Bytes()
	}
	for _, c := range []struct {
		query string
		want  []string
	}{
		{"", []string{"r0", "r1", "r2", "r3", "r4"}},
		{"?state=awake", []string{"r1", "r3"}},
		{"?state=asleep", []string{"r0", "r2", "r4"}},
		{"?state=awake,asleep", []string{"r0", "r1", "r2", "r3", "r4"}},
		{"?state=awake&state=failed", []string{"r1", "r3"}},
		{"?state=waking,failed", nil},
		{"?route=r4,r0", []string{"r0", "r4"}},
		{"?route=r4&route=r1", []string{"r1", "r4"}},
		{"?route=r3&state=awake", []string{"r3"}},
		{"?route=r2&state=awake", nil},
		{"?names=false&state=awake", []string{"r1", "r3"}},
	} {
		code, body := get(c.query)
		var sts []Status
		if err := json.Unmarshal(body, &sts); code != http.StatusOK || err != nil {
			t.Fatalf("GET /routes%s = %d %s (%v), want 200 and a list", c.query, code, body, err)
		}
		var got []string
		for _, st := range sts {
			got = append(got, st.Route)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("GET /routes%s listed %v, want %v", c.query, got, c.want)
		}
	}
	for _, c := range []struct {
		query string
		want  []string
	}{
		{"?names=true", []string{"r0", "r1", "r2", "r3", "r4"}},
		{"?names=1&state=awake", []string{"r1", "r3"}},
		{"?names=true&route=r2&state=awake", []string{}},
	} {
		code, body := get(c.query)
		var got []string
		if err := json.Unmarshal(body, &got); code != http.StatusOK || err != nil || !slices.Equal(got, c.want) {
			t.Errorf("GET /routes%s = %d %s (%v), want 200 and the names %q", c.query, code, body, err, c.want)
		}
	}
	for _, c := range []struct {
		query string
		code  int
		error string
	}{
		{"?state=sleeping", 400, `GET /routes: state: "sleeping" is not a state (asleep, waking, awake, stopping, failed)`},
		{"?state=awake,Awake", 400, `GET /routes: state: "Awake" is not a state (asleep, waking, awake, stopping, failed)`},
		{"?state=", 400, "GET /routes: state: empty; want one or more of asleep, waking, awake, stopping, failed"},
		{"?route=r1,nope", 404, `GET /routes: route: no such route: "nope"`},
		{"?route=,", 400, "GET /routes: route: empty; want one or more route names"},
		{"?names=maybe", 400, `GET /routes: names: want true or false, got "maybe"`},
		{"?stat=awake", 400, `GET /routes: unknown parameter "stat" (known: state, route, names)`},
		// Two faults: the keys are read in order, so the same one is named each time (Go's map order
		// would pick either).
		{"?state=bogus&route=nope", 404, `GET /routes: route: no such route: "nope"`},
	} {
		for range 20 {
			code, body := get(c.query)
			var got struct{ Error string }
			if err := json.Unmarshal(body, &got); code != c.code || err != nil || got.Error != c.error {
				t.Errorf("GET /routes%s = %d %s, want %d with error %q", c.query, code, body, c.code, c.error)
				break
			}
		}
	}
}

// BenchmarkRoutesListAwake: GET /routes?state=awake over 100,000 routes, none awake, which is what an
// operator asks at that scale.
func BenchmarkRoutesListAwake(b *testing.B) {
	s := listServer(b, 100000)
	h := s.AdminHandler(nil, nil)
	r := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/routes?state=awake", nil)
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(w, r)
	}
}
