package redfishtest

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/schemas"
	"go.uber.org/goleak"
)

func newServer(t *testing.T, o Options) *Server {
	t.Helper()
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// tlsClient trusts only the simulator's certificate.
func tlsClient(t *testing.T, s *Server) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(s.CertificatePEM()) {
		t.Fatal("CertificatePEM holds no certificate")
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig.RootCAs = pool
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// waitState polls the simulator until the system reaches want, bounded by a deadline.
func waitState(t *testing.T, s *Server, id, want string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for s.PowerState(id) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s never reached %s (is %s)", id, want, s.PowerState(id))
		}
		select {
		case <-time.After(5 * time.Millisecond):
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		}
	}
}

// TestGofishCannotTell drives the simulator with gofish, the way the backend does: session and basic
// auth, plain HTTP and TLS.
func TestGofishCannotTell(t *testing.T) {
	for _, c := range []struct {
		name  string
		tls   bool
		basic bool
	}{{"http-session", false, false}, {"http-basic", false, true}, {"https-session", true, false}, {"https-basic", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			s := newServer(t, Options{TLS: c.tls, Username: "admin", Password: "pa55word!", Systems: []System{
				{ID: "437XR1138R2", Name: "web-1", TransitionDelay: 10 * time.Millisecond}}})
			cfg := gofish.ClientConfig{Endpoint: s.URL, Username: "admin", Password: "pa55word!", BasicAuth: c.basic}
			if c.tls {
				cfg.HTTPClient = tlsClient(t, s)
				cfg.NoModifyTransport = true
			}
			api, err := gofish.ConnectContext(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.Sessions(); got != map[bool]int{true: 0, false: 1}[c.basic] {
				t.Fatalf("open sessions = %d", got)
			}
			systems, err := api.Service.Systems()
			if err != nil {
				t.Fatal(err)
			}
			if len(systems) != 1 || systems[0].ID != "437XR1138R2" || systems[0].Name != "web-1" || systems[0].PowerState != schemas.OffPowerState {
				t.Fatalf("systems = %+v", systems)
			}
			types, err := systems[0].GetSupportedResetTypes()
			if err != nil || len(types) != len(DefaultResetTypes()) {
				t.Fatalf("reset types = %v, %v", types, err)
			}
			if _, err := systems[0].Reset(schemas.OnResetType); err != nil {
				t.Fatal(err)
			}
			waitState(t, s, "437XR1138R2", On)
			sys, err := schemas.GetObject[schemas.ComputerSystem](api, systems[0].ODataID)
			if err != nil || sys.PowerState != schemas.OnPowerState {
				t.Fatalf("after Reset On: %v, %v", sys, err)
			}
			if _, err := sys.Reset("Bogus"); err == nil {
				t.Fatal("gofish allowed a reset type the system does not advertise")
			}
			api.Logout()
			if got := s.Sessions(); got != 0 {
				t.Fatalf("sessions after Logout = %d, want 0", got)
			}
			if got := s.Resets("437XR1138R2"); !slices.Equal(got, []string{"On"}) {
				t.Fatalf("Resets = %v", got)
			}
		})
	}
}

func TestAuthErrors(t *testing.T) {
	s := newServer(t, Options{Username: "admin", Password: "right"})
	_, err := gofish.ConnectContext(t.Context(), gofish.ClientConfig{Endpoint: s.URL, Username: "admin", Password: "wrong"})
	var re *schemas.Error
	if !errors.As(err, &re) || re.HTTPReturnedStatusCode != 401 {
		t.Fatalf("session with a wrong password: %v, want a 401", err)
	}
	api, err := gofish.ConnectContext(t.Context(), gofish.ClientConfig{Endpoint: s.URL, Username: "admin", Password: "wrong", BasicAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.Service.Systems(); err == nil {
		t.Fatal("basic auth with a wrong password read the systems")
	}
	// Anonymous: the service root is public, nothing else is.
	resp, err := http.Get(s.URL + "/redfish/v1/Systems")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("anonymous GET Systems = %d, want 401", resp.StatusCode)
	}
	resp, err = http.Get(s.URL + "/redfish/v1/Systems/nope")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("anonymous GET of a missing system = %d, want 401 before 404", resp.StatusCode)
	}
}

func TestFaults(t *testing.T) {
	s := newServer(t, Options{})
	s.Inject(Fault{Status: 500, Count: 2})
	s.Inject(Fault{Status: 429, RetryAfter: 1500 * time.Millisecond})
	s.Inject(Fault{Drop: true})
	get := func() (*http.Response, error) { return http.Get(s.URL + "/redfish/v1/Systems/node-1") }
	for i, want := range []int{500, 500, 429} {
		resp, err := get()
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("request %d: status %d, want %d", i, resp.StatusCode, want)
		}
		if want == 429 && resp.Header.Get("Retry-After") != "2" {
			t.Fatalf("Retry-After = %q, want 2", resp.Header.Get("Retry-After"))
		}
	}
	if _, err := get(); err == nil {
		t.Fatal("the dropped request got an answer")
	}
	resp, err := get()
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("after the faults: status %d", resp.StatusCode)
	}
	reqs := s.Requests()
	if len(reqs) != 5 || reqs[3].Status != 0 || reqs[4].Status != 200 {
		t.Fatalf("requests = %+v", reqs)
	}
}

func TestNodeServiceFollowsPower(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s, err := New(Options{Systems: []System{{ID: "n1", ServiceAddr: "127.0.0.1:0", TransitionDelay: 5 * time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	url := "http://" + s.ServiceAddr("n1") + "/"
	serving := func() bool {
		resp, err := c.Get(url)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == 200 && string(b) == "hello from n1\n"
	}
	if serving() {
		t.Fatal("the node service answers while the node is Off")
	}
	post := func(rt string) {
		resp, err := http.Post(s.URL+"/redfish/v1/Systems/n1/Actions/ComputerSystem.Reset", "application/json",
			stringsReader(`{"ResetType":"`+rt+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 204 {
			t.Fatalf("Reset %s: status %d", rt, resp.StatusCode)
		}
	}
	post("On")
	waitState(t, s, "n1", On)
	if !serving() {
		t.Fatal("the node service does not answer while the node is On")
	}
	post("GracefulShutdown")
	waitState(t, s, "n1", Off)
	if serving() {
		t.Fatal("the node service answers after GracefulShutdown")
	}
	s.SetIgnoreGraceful("n1", true)
	if err := s.SetPowerState("n1", On); err != nil {
		t.Fatal(err)
	}
	post("GracefulShutdown")
	if s.PowerState("n1") != On {
		t.Fatal("an ignored GracefulShutdown changed the power state")
	}
	post("ForceOff")
	if s.PowerState("n1") != Off {
		t.Fatal("ForceOff did not power off at once")
	}
	s.SetNeverPowersOn("n1", true)
	post("On")
	if s.PowerState("n1") != Off {
		t.Fatal("a node that never powers on did")
	}
	if got := s.Resets("n1"); !slices.Equal(got, []string{"On", "GracefulShutdown", "GracefulShutdown", "ForceOff", "On"}) {
		t.Fatalf("Resets = %v", got)
	}
	s.Close()
}

func TestContextCancelsGofish(t *testing.T) {
	s := newServer(t, Options{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := gofish.ConnectContext(ctx, gofish.ClientConfig{Endpoint: s.URL}); !errors.Is(err, context.Canceled) {
		t.Fatalf("ConnectContext with a canceled context: %v", err)
	}
}

func stringsReader(s string) io.Reader { return strings.NewReader(s) }

// postReset POSTs a Reset and checks it was accepted.
func postReset(t *testing.T, s *Server, id, rt string) {
	t.Helper()
	resp, err := http.Post(s.URL+"/redfish/v1/Systems/"+id+"/Actions/ComputerSystem.Reset", "application/json",
		stringsReader(`{"ResetType":"`+rt+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 204 {
		t.Fatalf("Reset %s: status %d", rt, resp.StatusCode)
	}
}

// waitChanged waits, through Changed, for the system to reach want.
func waitChanged(t *testing.T, s *Server, id, want string) {
	t.Helper()
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for {
		ch := s.Changed()
		if s.PowerState(id) == want {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("%s never reached %s (is %s)", id, want, s.PowerState(id))
		}
	}
}

func TestHoldResets(t *testing.T) {
	s := newServer(t, Options{Systems: []System{{ID: "n1", TransitionDelay: 5 * time.Millisecond}}})
	release := s.HoldResets("n1")
	postReset(t, s, "n1", "On")
	if got := s.PowerState("n1"); got != Off {
		t.Fatalf("PowerState with the Reset held = %s, want Off", got)
	}
	if got := s.Resets("n1"); !slices.Equal(got, []string{"On"}) {
		t.Fatalf("Resets = %v, want the held [On]", got)
	}
	release()
	if got := s.PowerState("n1"); got != PoweringOn {
		t.Fatalf("PowerState right after release = %s, want PoweringOn", got)
	}
	waitChanged(t, s, "n1", On)
	release() // idempotent
	postReset(t, s, "n1", "ForceOff")
	if got := s.PowerState("n1"); got != Off {
		t.Fatalf("after release, ForceOff left %s, want Off at once", got)
	}
}

func TestStuckPoweringOn(t *testing.T) {
	s := newServer(t, Options{Systems: []System{{ID: "n1"}}})
	s.SetStuckPoweringOn("n1", true)
	postReset(t, s, "n1", "On")
	if got := s.PowerState("n1"); got != PoweringOn {
		t.Fatalf("PowerState = %s, want PoweringOn (stuck)", got)
	}
	postReset(t, s, "n1", "GracefulShutdown")
	if got := s.PowerState("n1"); got != Off {
		t.Fatalf("GracefulShutdown of a stuck node left %s, want Off", got)
	}
	s.SetStuckPoweringOn("n1", false)
	postReset(t, s, "n1", "On")
	if got := s.PowerState("n1"); got != On {
		t.Fatalf("unstuck: PowerState = %s, want On", got)
	}
}

func TestSetPassword(t *testing.T) {
	s := newServer(t, Options{Username: "admin", Password: "old-pass"})
	api, err := gofish.ConnectContext(t.Context(), gofish.ClientConfig{Endpoint: s.URL, Username: "admin", Password: "old-pass"})
	if err != nil {
		t.Fatal(err)
	}
	s.SetPassword("new-pass")
	if n := s.Sessions(); n != 0 {
		t.Fatalf("%d sessions survived the password change", n)
	}
	if _, err := api.Service.Systems(); err == nil {
		t.Fatal("the old session still reads the systems")
	}
	get := func(pass string) int {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, s.URL+"/redfish/v1/Systems", nil)
		req.SetBasicAuth("admin", pass)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get("old-pass"); got != 401 {
		t.Fatalf("basic auth with the old password: %d, want 401", got)
	}
	if got := get("new-pass"); got != 200 {
		t.Fatalf("basic auth with the new password: %d, want 200", got)
	}
	if n := s.FailedLogins(); n != 1 {
		t.Fatalf("FailedLogins = %d, want 1 (the old password over basic auth; the rejected session is none)", n)
	}
	if _, err := gofish.ConnectContext(t.Context(), gofish.ClientConfig{Endpoint: s.URL, Username: "admin", Password: "old-pass"}); err == nil {
		t.Fatal("a session with the old password was created")
	}
	if n := s.FailedLogins(); n != 2 {
		t.Fatalf("FailedLogins = %d, want 2 after a session refused", n)
	}
}

func TestConnectionsCountsHandshakes(t *testing.T) {
	s := newServer(t, Options{TLS: true})
	tr := &http.Transport{} // trusts only the system roots: the self-signed certificate fails
	defer tr.CloseIdleConnections()
	if _, err := (&http.Client{Transport: tr}).Get(s.URL + "/redfish/v1/"); err == nil {
		t.Fatal("an untrusting client got through")
	}
	if n, r := s.Connections(), len(s.Requests()); n != 1 || r != 0 {
		t.Fatalf("connections %d, requests %d; want 1 and 0", n, r)
	}
	c := tlsClient(t, s)
	for range 3 {
		resp, err := c.Get(s.URL + "/redfish/v1/")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if n := s.Connections(); n != 2 {
		t.Fatalf("connections = %d, want 2 (three requests on one kept-alive connection)", n)
	}
}
