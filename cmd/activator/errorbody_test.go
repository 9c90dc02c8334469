package main

import (
	"net/http"
	"strings"
	"testing"
)

// A tenant that prints a path to stderr and exits: an anonymous client's 503 names the failed phase and
// the wake id, never the tenant's output, unless the route has detailed_errors; the admin API keeps the
// output tail either way.
func TestErrorBodyHidesTenantOutput(t *testing.T) {
	const msg = "fatal: cannot open /srv/tenant/config/prod.toml"
	for _, detailed := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "detailed_errors"}[detailed], func(t *testing.T) {
			app := appRoute{
				Name: "leaky", BackoffInitial: "1m", BackoffMax: "1m",
				Env:            map[string]string{"DEMOAPP_EXIT_CODE": "3", "DEMOAPP_EXIT_MESSAGE": msg},
				DetailedErrors: detailed,
			}
			h := newHarness(t, configYAML(t, app))
			r := h.get(app.host(), "/")
			st := h.status(app.Name)
			if st.LastWake == nil || st.LastWake.ID == "" {
				t.Fatalf("status %+v: want a last wake with a wake_id", st)
			}
			if r.code != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
				t.Errorf("status %d Retry-After %q, want 503 with Retry-After; body %q", r.code, r.header.Get("Retry-After"), r.body)
			}
			for _, want := range []string{"phase " + st.LastWake.FailedPhase, st.LastWake.ID} {
				if !strings.Contains(r.body, want) {
					t.Errorf("body %q does not contain %q", r.body, want)
				}
			}
			if got := strings.Contains(r.body, "/srv/tenant"); got != detailed {
				t.Errorf("body %q quotes the tenant's output: %v, want %v", r.body, got, detailed)
			}
			if !strings.Contains(st.LastWake.Error, msg) || !strings.Contains(st.LastError, msg) {
				t.Errorf("admin status last_wake.error %q, last_error %q: want the tenant's output %q",
					st.LastWake.Error, st.LastError, msg)
			}
		})
	}
}
