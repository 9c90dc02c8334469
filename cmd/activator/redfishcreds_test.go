package main

// A redfish route whose BMC rejects the password, through a real `activator serve` and the simulated
// BMC of package redfishtest: what the held requests get, what the route's status says, and how many
// failed logins the BMC counts.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/backend/redfish/redfishtest"
)

// jsonAnswer is one answer of the edge to a client that asks for JSON.
type jsonAnswer struct {
	code       int
	retryAfter string
	wakeID     string
	phase      string
	err        error
}

// getJSON sends GET / for host with Accept: application/json over a connection of its own.
func getJSON(ctx context.Context, addr, host string) jsonAnswer {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", nil)
	if err != nil {
		return jsonAnswer{err: err}
	}
	req.Host = host
	req.Header.Set("Accept", "application/json")
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return jsonAnswer{err: err}
	}
	defer resp.Body.Close()
	a := jsonAnswer{code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode == http.StatusOK {
		a.err = err
		return a
	}
	var b struct {
		WakeID string `json:"wake_id"`
		Phase  string `json:"phase"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		a.err = fmt.Errorf("answer %d %q: %w", resp.StatusCode, body, err)
	}
	a.wakeID, a.phase = b.WakeID, b.Phase
	return a
}

// TestRejectedBMCPasswordHoldsWakesBack: the password file of a redfish route holds a password the BMC
// rejects, and requests keep coming, each after the route's (short) backoff: every one of them woke
// the route, and each wake logged in and was refused, one failed login at the BMC per wake, which
// locks the BMC account. Now the BMC is asked once (by the host check at start-up): the held requests
// get the failed wake's 503 with Retry-After at once, the route's status warns naming the BMC and the
// password file, and the BMC counts one failed login however many wakes. Once the file holds the
// right password, the next request wakes the node.
func TestRejectedBMCPasswordHoldsWakesBack(t *testing.T) {
	t.Parallel()
	bmc, err := redfishtest.New(redfishtest.Options{Username: "admin", Password: "right",
		Systems: []redfishtest.System{{ID: "node-1", ServiceAddr: "127.0.0.1:0"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bmc.Close)
	pw := filepath.Join(t.TempDir(), "bmc.pw")
	if err := os.WriteFile(pw, []byte("wrong\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServed(t, fmt.Sprintf(`routes:
  - name: metal
    hosts: [metal.test]
    backing: redfish
    upstream: %q
    health: {path: /, interval: 20ms}
    idle: 10m
    wake_budget: 30s
    sleep_budget: 10s
    backoff: {initial: 10ms, max: 10ms}
    redfish: {endpoint: %q, username: admin, password_file: %q, poll_interval: 20ms}
`, bmc.ServiceAddr("node-1"), bmc.URL, pw))
	s.waitStatus("metal", "the host check's finding", func(st activator.Status) bool { return st.CheckError != "" })
	if n := bmc.FailedLogins(); n != 1 {
		t.Fatalf("%d failed logins after the host check, want 1", n)
	}

	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	const wakes = 10
	seen := map[string]bool{} // the failed wakes the answers named
	for i := 0; len(seen) < wakes && i < 100*wakes; i++ {
		a := getJSON(ctx, s.edge, "metal.test")
		if a.err != nil || a.code != http.StatusServiceUnavailable || a.retryAfter == "" || a.phase != "reset" || a.wakeID == "" {
			t.Fatalf("request %d: %d Retry-After %q phase %q wake %q (%v), want 503 with Retry-After from a wake failed in phase reset",
				i, a.code, a.retryAfter, a.phase, a.wakeID, a.err)
		}
		seen[a.wakeID] = true
	}
	if len(seen) < wakes {
		t.Fatalf("the requests saw %d failed wakes, want %d", len(seen), wakes)
	}
	if n := bmc.FailedLogins(); n != 1 {
		t.Fatalf("%d failed logins at the BMC after %d wakes with a rejected password, want 1 (the host check's)", n, len(seen))
	}
	st := s.status("metal")
	for _, want := range []string{"rejected the credentials", bmc.URL, pw} {
		if !strings.Contains(st.Warning, want) {
			t.Errorf("warning %q does not say %q", st.Warning, want)
		}
	}
	if st.LastWake == nil || !strings.Contains(st.LastWake.Error, "not sent") || !strings.Contains(st.LastWake.Error, pw) {
		t.Errorf("the last wake's record %+v, want its error to say the login was not sent, naming the password file", st.LastWake)
	}

	if err := os.WriteFile(pw, []byte("right\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var a jsonAnswer
	for i := 0; i < 1000; i++ { // past the backoff of the last failed wake
		if a = getJSON(ctx, s.edge, "metal.test"); a.code != http.StatusServiceUnavailable || a.err != nil {
			break
		}
	}
	if a.err != nil || a.code != http.StatusOK {
		t.Fatalf("once the file holds the right password: %d (%v), want 200", a.code, a.err)
	}
	if n := bmc.FailedLogins(); n != 1 {
		t.Fatalf("%d failed logins, want still 1", n)
	}
	if st := s.status("metal"); st.Warning != "" {
		t.Errorf("warning %q once the route woke, want none", st.Warning)
	}
	stopServed(t, s)
}
