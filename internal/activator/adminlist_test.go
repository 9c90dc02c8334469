package activator

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
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
