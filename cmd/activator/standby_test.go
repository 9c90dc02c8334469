package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestStandbyThroughTheEdge: an exec route with standby: true, driven through a real `activator serve`
// as an operator would. check says what the standby costs; a standby waits from start-up, so the first
// wake uses it too; after a sleep a held POST is answered by a tenant exec'd in the next standby (its
// pid), its body intact; explain says each wake used the standby; and nothing of the route outlives
// the activator.
func TestStandbyThroughTheEdge(t *testing.T) {
	for _, listen := range []string{"env", "listen_fds"} {
		t.Run(listen, func(t *testing.T) {
			cfg := configYAML(t, appRoute{Name: "sb", Listen: listen, Standby: true})
			path := filepath.Join(t.TempDir(), "check.yaml")
			if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
				t.Fatal(err)
			}
			if code, out := runMain(t, "check", "--config", path); code != 0 || !strings.Contains(out, `note: route "sb": standby: `) {
				t.Errorf("check: exit %d, want 0 and a note on the standby:\n%s", code, out)
			}

			s := startServed(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			defer cancel()
			post := func(body string) string {
				t.Helper()
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.edge+"/echo", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				req.Host = "sb.test"
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				if err != nil || resp.StatusCode != http.StatusOK {
					t.Fatalf("POST /echo: %d %q %v", resp.StatusCode, b, err)
				}
				return string(b)
			}
			// Before any request: the standby of the route's first wake, started with the route.
			s.logs.waitFor(t, s.exited, "standby started")
			sb := s.logs.matching("standby started")
			if len(sb) != 1 {
				t.Fatalf("at start-up, %d \"standby started\" records, want 1", len(sb))
			}
			pid := int(sb[0]["pid"].(float64))
			if got := post("first"); got != "first" {
				t.Fatalf("first POST echoed %q", got)
			}
			if got := getFresh(ctx, s.edge, "sb.test", "/pid"); strings.TrimSpace(got.body) != strconv.Itoa(pid) {
				t.Errorf("the tenant of the first wake is pid %q, want the start-up standby's %d", got.body, pid)
			}
			code, out := runMain(t, "explain", "sb", "--admin", s.admin)
			if code != 0 || !strings.Contains(out, "released the standby started with the route (pid "+strconv.Itoa(pid)+")") {
				t.Errorf("explain of the first wake: exit %d, want its note on the standby:\n%s", code, out)
			}
			if code, out := runMain(t, "sleep", "sb", "--admin", s.admin); code != 0 {
				t.Fatalf("sleep: exit %d:\n%s", code, out)
			}
			sb = s.logs.matching("standby started")
			if len(sb) != 2 {
				t.Fatalf("after the sleep, %d \"standby started\" records, want 2", len(sb))
			}
			pid = int(sb[1]["pid"].(float64))

			body := strings.Repeat("held body ", 1000)
			if got := post(body); got != body {
				t.Fatalf("the held POST's body came back as %d bytes, want %d", len(got), len(body))
			}
			if got := getFresh(ctx, s.edge, "sb.test", "/pid"); strings.TrimSpace(got.body) != strconv.Itoa(pid) {
				t.Errorf("the woken tenant is pid %q, want the standby's %d", got.body, pid)
			}
			code, out = runMain(t, "explain", "sb", "--admin", s.admin)
			if code != 0 || !strings.Contains(out, "released the standby started at the last sleep (pid "+strconv.Itoa(pid)+")") {
				t.Errorf("explain: exit %d, want the wake's note on the standby:\n%s", code, out)
			}

			// A second standby, waiting when the activator stops: it goes with it.
			if code, out := runMain(t, "sleep", "sb", "--admin", s.admin); code != 0 {
				t.Fatalf("sleep: exit %d:\n%s", code, out)
			}
			sb = s.logs.matching("standby started")
			if len(sb) != 3 {
				t.Fatalf("after the second sleep, %d \"standby started\" records, want 3", len(sb))
			}
			s.sigterm()
			s.wait()
			waitGone(t, int(sb[2]["pid"].(float64)))
		})
	}
}
