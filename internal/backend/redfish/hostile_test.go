package redfish

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/activator/activator/internal/backend/redfish/redfishtest"
)

// A BMC is input like any other: these answers no honest BMC gives must cost the activator neither
// its credentials, its memory, nor every route on the endpoint for a year.

// elsewhere is another host's server, which must never be asked anything.
func elsewhere(t *testing.T) (addr string, asked *atomic.Int64) {
	t.Helper()
	asked = &atomic.Int64{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		http.Error(w, "not a BMC", http.StatusTeapot)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), asked
}

// TestHostileLinkOffEndpoint: gofish joins the endpoint and a path the BMC gave, so a member link of
// "@other:port/x" made the request, session token and all, go to another host. Refused, terminal.
func TestHostileLinkOffEndpoint(t *testing.T) {
	other, asked := elsewhere(t)
	e := newEnv(t, envConfig{})
	e.sim.Inject(redfishtest.Fault{Method: http.MethodGet, PathSuffix: "/Systems", Count: 100, Answer: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"Members":[{"@odata.id":"@%s/redfish/v1/Systems/node-1"}]}`, other)
	}})
	_, err := e.wake(t)
	if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "not the endpoint") {
		t.Fatalf("Wake = %v, want ErrRejected naming a request aimed off the endpoint", err)
	}
	if n := asked.Load(); n != 0 {
		t.Fatalf("the other host was asked %d times", n)
	}
}

// TestHostileRedirect: a redirect to another host is not followed (Go would carry X-Auth-Token there,
// and on a 307 the login body with the password).
func TestHostileRedirect(t *testing.T) {
	other, asked := elsewhere(t)
	e := newEnv(t, envConfig{})
	e.sim.Inject(redfishtest.Fault{Method: http.MethodGet, PathSuffix: "/Systems", Count: 100, Answer: func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://"+other+r.URL.Path, http.StatusTemporaryRedirect)
	}})
	_, err := e.wake(t)
	if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "redirect") {
		t.Fatalf("Wake = %v, want ErrRejected naming the redirect", err)
	}
	if n := asked.Load(); n != 0 {
		t.Fatalf("the other host was asked %d times", n)
	}
}

// TestHostileSystemsList: a Systems collection of more members than any BMC has is refused before one
// member is read. gofish's own reader decoded 3 MB of empty members into 2.9 GB of structs.
func TestHostileSystemsList(t *testing.T) {
	e := newEnv(t, envConfig{})
	members := strings.Repeat(`{"@odata.id":"/redfish/v1/Systems/x"},`, 300)
	e.sim.Inject(redfishtest.Fault{Method: http.MethodGet, PathSuffix: "/Systems", Count: 100, Answer: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"Members":[%s{}]}`, members)
	}})
	_, err := e.wake(t)
	if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), fmt.Sprintf("over %d systems", maxSystems)) {
		t.Fatalf("Wake = %v, want ErrRejected for a list of over %d systems", err, maxSystems)
	}
	for _, r := range e.sim.Requests() {
		if strings.HasSuffix(r.Path, "/Systems/x") {
			t.Fatalf("a member of the refused list was read: %+v", r)
		}
	}
}

// TestHostileAnswerSize: an answer over maxAnswer bytes fails its call instead of being read whole.
func TestHostileAnswerSize(t *testing.T) {
	e := newEnv(t, envConfig{})
	e.sim.Inject(redfishtest.Fault{Method: http.MethodGet, PathSuffix: "/Systems", Count: 100, Answer: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"Members":[],"Padding":"%s"}`, strings.Repeat("x", maxAnswer))
	}})
	_, err := e.wake(t)
	if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), fmt.Sprintf("over %d bytes", maxAnswer)) {
		t.Fatalf("Wake = %v, want ErrRejected for an answer over %d bytes", err, maxAnswer)
	}
}

// TestHostileRetryAfter: a Retry-After of a year holds the endpoint for maxRetryAfter, not a year: the
// hold stops every wake and sleep of every route on the BMC at once.
func TestHostileRetryAfter(t *testing.T) {
	for _, v := range []string{"31536000", "99999999999999999", "Fri, 31 Dec 9999 23:59:59 GMT"} {
		t.Run(v, func(t *testing.T) {
			tt := &throttleTransport{live: &liveness{}, gate: &throttleGate{}, floor: time.Second, next: roundTripFunc(func(*http.Request) (*http.Response, error) {
				return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{"Retry-After": {v}}, Body: http.NoBody}, nil
			})}
			tt.origin = mustURL(t, "https://bmc.example")
			req, _ := http.NewRequest(http.MethodGet, "https://bmc.example/redfish/v1/Systems", nil)
			_, err := tt.RoundTrip(req)
			var te *throttledError
			if !errors.As(err, &te) || te.retryAfter <= 0 || te.retryAfter > maxRetryAfter {
				t.Fatalf("RoundTrip = %v (Retry-After %v), want a throttle of at most %v", err, te, maxRetryAfter)
			}
		})
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestHostileSessionWithoutToken: a session login answered without X-Auth-Token fails. It counted as
// a login: every call then went out unauthenticated, got 401 and logged in again, each leaving a
// session on the BMC until its table was full.
func TestHostileSessionWithoutToken(t *testing.T) {
	e := newEnv(t, envConfig{yaml: "auth: session\n"})
	e.sim.Inject(redfishtest.Fault{Method: http.MethodPost, PathSuffix: "/Sessions", Count: 100, Answer: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/redfish/v1/SessionService/Sessions/1")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"@odata.id":"/redfish/v1/SessionService/Sessions/1","Id":"1"}`)
	}})
	_, err := e.wake(t)
	if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "without a session token") {
		t.Fatalf("Wake = %v, want ErrRejected for a session without a token", err)
	}
}

// TestClip: what a BMC names (a system's Id, a power state) reaches messages cut to 128 bytes, on a
// character.
func TestClip(t *testing.T) {
	if got := clip("node-1"); got != "node-1" {
		t.Fatalf("clip(short) = %q", got)
	}
	long := strings.Repeat("é", 100) // 200 bytes: a cut at 128 falls inside none
	if got := clip(long); len(got) > 128+3 || !strings.HasSuffix(got, "...") || !utf8.ValidString(got) {
		t.Fatalf("clip(long) = %q (%d bytes), want at most 128 bytes of it, valid UTF-8, then ...", got, len(got))
	}
}

// TestResetWithoutTarget: a system that offers no Reset action fails the wake as a configuration
// error, naming it. gofish POSTed the Reset to the endpoint itself, and whatever came back was filed as
// a failed or ambiguous Reset (retried, then undone).
func TestResetWithoutTarget(t *testing.T) {
	e := newEnv(t, envConfig{})
	e.sim.Inject(redfishtest.Fault{Method: http.MethodGet, PathSuffix: "/Systems/node-1", Count: 100, Answer: func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"@odata.id":"/redfish/v1/Systems/node-1","@odata.type":"#ComputerSystem.v1_20_0.ComputerSystem","Id":"node-1","Name":"node-1","PowerState":"Off"}`)
	}})
	_, err := e.wake(t)
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "offers no Reset action") {
		t.Fatalf("Wake = %v, want ErrConfig naming the missing Reset action", err)
	}
	for _, r := range e.sim.Requests() {
		if r.Method == http.MethodPost && !strings.HasSuffix(r.Path, "/Sessions") {
			t.Fatalf("a Reset went out anyway: %+v", r)
		}
	}
}
