package main

import (
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/activator/activator/internal/registry"
)

// TestEventLoopsOnByDefault: the real binary starts the event loops without being asked, one per CPU
// it may use (as GOMAXPROCS counts them, which the test binary shares), says how many in "activator
// listening", and serves a keep-alive connection's warm GETs on them, which
// activator_event_loop_requests_total counts; edge.event_loops: 0 turns them off, and the counter is
// not there.
func TestEventLoopsOnByDefault(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, top string
		loops     int
	}{
		{"default", "", min(runtime.GOMAXPROCS(0), registry.MaxEventLoops)},
		{"off", "edge: {event_loops: 0}\n", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			app := appRoute{Name: "loops" + c.name}
			s := startServed(t, c.top+configYAML(t, app))
			if recs := s.logs.matching("activator listening"); len(recs) != 1 || recs[0]["event_loops"] != float64(c.loops) {
				t.Errorf(`"activator listening" records %v, want one with event_loops %d`, recs, c.loops)
			}
			// One connection: the first GET wakes the route, net/http answers it and hands the
			// connection to a loop, which answers the rest.
			client := &http.Client{Timeout: patience, Transport: &http.Transport{MaxConnsPerHost: 1}}
			defer client.CloseIdleConnections()
			for i := range 4 {
				req, _ := http.NewRequest(http.MethodGet, "http://"+s.edge+"/", nil)
				req.Host = app.host()
				resp, err := client.Do(req)
				if err != nil {
					t.Fatalf("GET %d: %v", i, err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("GET %d: %d", i, resp.StatusCode)
				}
			}
			const series = "activator_event_loop_requests_total"
			if c.loops == 0 {
				if body := metricsText(t, s.admin); strings.Contains(body, series) {
					t.Errorf("/metrics has %s with the loops off", series)
				}
				return
			}
			if n := scrape(t, s.admin, series)[series]; n < 1 {
				t.Errorf("%s = %v after four GETs on one connection, want the loops to have answered some", series, n)
			}
		})
	}
}

// metricsText is the admin API's /metrics at admin.
func metricsText(t *testing.T, admin string) string {
	t.Helper()
	resp, err := (&http.Client{Timeout: patience}).Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	return string(body)
}
