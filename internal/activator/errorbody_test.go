package activator

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/activator/activator/internal/registry"
)

// A failed wake's body names the phase and the wake's id, never the cause (a tenant's output quotes
// paths and config names), unless the route has detailed_errors; the admin status keeps the cause.
func TestWakeErrorBodyHidesCause(t *testing.T) {
	const secret = "/etc/app/secret.toml"
	cause := errors.New("exited with code 3: cannot open " + secret)
	for _, detailed := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "detailed_errors"}[detailed], func(t *testing.T) {
			s, in := newTestServer(t, &fakeBackend{wakeErr: cause}, passGate{},
				func(r *registry.Route) { r.DetailedErrors = detailed })
			addr := edgeListen(t, s, true)
			resp, text := exchange(t, addr, "GET / HTTP/1.1\r\nHost: app.test\r\n\r\n")
			st := in.status()
			if st.LastWake == nil || st.LastWake.ID == "" {
				t.Fatalf("status last_wake %+v: want a wake id", st.LastWake)
			}
			id := st.LastWake.ID
			if !strings.Contains(st.LastError, secret) || !strings.Contains(st.LastWake.Error, secret) {
				t.Errorf("status last_error %q, last_wake.error %q: want the whole cause", st.LastError, st.LastWake.Error)
			}
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
				t.Errorf("status %d Retry-After %q, want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
			}
			if !strings.Contains(text, "phase spawn") || !strings.Contains(text, id) {
				t.Errorf("body %q: want phase spawn and wake id %s", text, id)
			}
			if got := strings.Contains(text, secret); got != detailed {
				t.Errorf("body %q quotes the cause: %v, want %v", text, got, detailed)
			}

			// In the backoff, as JSON.
			resp, text = exchange(t, addr, "GET / HTTP/1.1\r\nHost: app.test\r\nAccept: application/json\r\n\r\n")
			var body struct {
				Error  string `json:"error"`
				Phase  string `json:"phase"`
				WakeID string `json:"wake_id"`
				Retry  int    `json:"retry_after_seconds"`
			}
			if err := json.Unmarshal([]byte(text), &body); err != nil {
				t.Fatalf("JSON body %q: %v", text, err)
			}
			if resp.StatusCode != http.StatusServiceUnavailable || body.Phase != "spawn" || body.WakeID != id || body.Retry <= 0 {
				t.Errorf("backoff: status %d body %+v, want 503, phase spawn, wake_id %s, retry_after_seconds", resp.StatusCode, body, id)
			}
			if got := strings.Contains(body.Error, secret); got != detailed {
				t.Errorf("backoff: error %q quotes the cause: %v, want %v", body.Error, got, detailed)
			}
		})
	}
}
