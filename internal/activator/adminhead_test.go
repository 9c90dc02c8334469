package activator

import (
	"encoding/json"
	"io"
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

// TestAdminWrongMethod: a method an admin path does not take gets 405 with the Allow header listing
// the methods it does take, and a JSON error naming the method, the path and those methods, as every
// other admin error is JSON naming what was asked and what was wrong. It was 405 with an empty body
// (an operator trial: `curl -X POST /routes` said nothing of why). A path no method reaches is 404,
// whatever the method, with the same shape. Over a real listener, as the CLI meets it.
func TestAdminWrongMethod(t *testing.T) {
	s, _ := newTestServer(t, &fakeBackend{}, passGate{})
	srv := httptest.NewServer(s.AdminHandler(nil, nil))
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		method, path string
		code         int
		allow        string // the Allow header; "" for a 404
		error        string // the JSON error
	}{
		{"POST", "/routes", 405, "GET, HEAD", "POST /routes: method not allowed (allowed: GET, HEAD)"},
		{"DELETE", "/routes/app", 405, "GET, HEAD", "DELETE /routes/app: method not allowed (allowed: GET, HEAD)"},
		{"GET", "/routes/app/wake", 405, "POST", "GET /routes/app/wake: method not allowed (allowed: POST)"},
		{"PUT", "/routes/app/sleep", 405, "POST", "PUT /routes/app/sleep: method not allowed (allowed: POST)"},
		{"POST", "/routes/app/wakes", 405, "GET, HEAD", "POST /routes/app/wakes: method not allowed (allowed: GET, HEAD)"},
		{"PATCH", "/healthz", 405, "GET, HEAD", "PATCH /healthz: method not allowed (allowed: GET, HEAD)"},
		{"OPTIONS", "/routes", 405, "GET, HEAD", "OPTIONS /routes: method not allowed (allowed: GET, HEAD)"},
		{"GET", "/routes/no-such-route/wake", 405, "POST", "GET /routes/no-such-route/wake: method not allowed (allowed: POST)"},
		{"BREW", "/routes", 405, "GET, HEAD", "BREW /routes: method not allowed (allowed: GET, HEAD)"}, // a method chi does not know
		{"GET", "/nope", 404, "", "GET /nope: no such admin path"},
		{"POST", "/nope", 404, "", "POST /nope: no such admin path"},
		{"BREW", "/nope", 404, "", "BREW /nope: no such admin path"},
		{"GET", "/routes/app/wake/extra", 404, "", "GET /routes/app/wake/extra: no such admin path"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, srv.URL+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set(CSRFHeader, "1")
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			var body struct{ Error string }
			if resp.StatusCode != tc.code || resp.Header.Get("Content-Type") != "application/json" ||
				json.Unmarshal(b, &body) != nil || body.Error != tc.error {
				t.Errorf("%d %s %q, want %d application/json with error %q", resp.StatusCode, resp.Header.Get("Content-Type"), b, tc.code, tc.error)
			}
			if got := strings.Join(resp.Header.Values("Allow"), ", "); got != tc.allow {
				t.Errorf("Allow %q, want %q", got, tc.allow)
			}
		})
	}
	// HEAD gets the same status and Allow, without the body.
	req, _ := http.NewRequest(http.MethodHead, srv.URL+"/routes/app/wake", nil)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
		t.Errorf("HEAD /routes/app/wake: %d, Allow %q; want 405 with Allow: POST", resp.StatusCode, resp.Header.Get("Allow"))
	}
}
