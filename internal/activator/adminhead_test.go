package activator

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestAdminHeadAndUnknownPaths: HEAD is answered like GET without a body on every GET route (it was
// 405 everywhere but /metrics), and an unknown path gets the JSON error the rest of the API gives,
// not net/http's plain "404 page not found".
func TestAdminHeadAndUnknownPaths(t *testing.T) {
	s, _ := newTestServer(t, &fakeBackend{}, passGate{})
	h := s.AdminHandler(nil, nil)
	for _, path := range []string{"/healthz", "/routes", "/routes/app", "/routes/app/wakes"} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodHead, "http://127.0.0.1"+path, nil))
		if w.Code != http.StatusOK {
			t.Errorf("HEAD %s = %d, want 200", path, w.Code)
		}
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://127.0.0.1/nope", nil))
	var body struct{ Error string }
	if w.Code != http.StatusNotFound || json.Unmarshal(w.Body.Bytes(), &body) != nil || !strings.Contains(body.Error, "/nope") {
		t.Errorf("GET /nope = %d %q, want 404 with a JSON error naming the path", w.Code, w.Body)
	}
}
