package main

import (
	"context"
	"io"
	"net/http"
	"testing"
)

// TestUnaskedAnswerReachesNoClient: a tenant that writes a second answer after its first, on a
// connection the edge keeps alive (the demo app's /twice: a framework writing its error page after the
// handler's answer), never has it passed to a client. On 0ccfdf5 the next request on the route, from
// any client, got that 500 as its answer, and with a tenant that goes on serving the connection each
// client after it got the answer meant for the client before. The edge now closes such a connection
// unused and logs why, once for the burst.
func TestUnaskedAnswerReachesNoClient(t *testing.T) {
	app := appRoute{Name: "twice"}
	h := newHarness(t, configYAML(t, app))
	if r := h.get(app.host(), "/twice"); r.code != http.StatusOK || r.body != "the answer\n" {
		t.Fatalf("GET /twice: %d %q, want 200 %q", r.code, r.body, "the answer\n")
	}
	// Straight to the tenant, past the edge: /twice writes its second answer on the connection the
	// edge's pool holds idle, and /twice/release answers once that write has returned.
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+h.status(app.Name).Upstream+"/twice/release", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("release: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "released\n" {
		t.Fatalf("release: %d %q", resp.StatusCode, body)
	}
	for i := range 3 {
		if r := h.get(app.host(), "/"); r.code != http.StatusOK || r.body != "hello from demoapp\n" {
			t.Fatalf("GET / #%d after the tenant's unasked answer: %d %q, want 200 %q", i+1, r.code, r.body, "hello from demoapp\n")
		}
	}
	recs := h.rec.waitFor(t, 1, "the tenant sent bytes no request asked for; closed that upstream connection unused", "route", app.Name)
	if got := recs[0].attrs["connections"]; got != "1" {
		t.Errorf("the warning counts %v connections, want 1", got)
	}
}

// TestUnaskedAfterTheProbe: a tenant that writes a second answer right behind its health probe's
// answer, in the same write, has the probe's connection closed, not handed to the first released
// request, and the log says so as for any connection closed for unasked bytes (docs/security.md).
// The gate's probe used to close such a connection without a word.
func TestUnaskedAfterTheProbe(t *testing.T) {
	app := appRoute{Name: "glued", HealthPath: "/glued"}
	h := newHarness(t, configYAML(t, app))
	if r := h.get(app.host(), "/"); r.code != http.StatusOK || r.body != "hello from demoapp\n" {
		t.Fatalf("GET / (the wake's request): %d %q, want 200 %q", r.code, r.body, "hello from demoapp\n")
	}
	recs := h.rec.waitFor(t, 1, "the tenant sent bytes no request asked for; closed that upstream connection unused", "route", app.Name)
	if got := recs[0].attrs["connections"]; got != "1" {
		t.Errorf("the warning counts %v connections, want 1", got)
	}
}
