package activator

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestBackoffBodyAgreesWithRetryAfter: a request refused during a backoff is told the same wait in
// its body as in Retry-After, rounded up. With 1.48 s left the body said "next attempt in 1s" beside
// "Retry-After: 2", and under half a second "0s".
func TestBackoffBodyAgreesWithRetryAfter(t *testing.T) {
	cases := []struct {
		left         time.Duration
		header, body string
	}{
		{1480 * time.Millisecond, "2", "next attempt in 2s"},
		{300 * time.Millisecond, "1", "next attempt in 1s"},
		{2 * time.Second, "2", "next attempt in 2s"},
	}
	for _, c := range cases {
		err := &BackoffError{Route: "app", RetryAfter: c.left, Last: &WakeError{Route: "app", Phase: "health", Err: errors.New("x")}}
		w := httptest.NewRecorder()
		writeError(w, httptest.NewRequest("GET", "http://app.test/", nil), err)
		if got := w.Header().Get("Retry-After"); got != c.header {
			t.Errorf("%v left: Retry-After %q, want %q", c.left, got, c.header)
		}
		if body := w.Body.String(); !strings.Contains(body, c.body) {
			t.Errorf("%v left: body %q, want it to say %q", c.left, body, c.body)
		}
	}
}

// TestWakeClearsTheHostCheck: a host check that failed at start-up (a BMC's password, since corrected)
// stops showing in the route's status once the route wakes; before, it stayed there, misleading,
// until a reload.
func TestWakeClearsTheHostCheck(t *testing.T) {
	s, in := newTestServer(t, &fakeBackend{}, passGate{})
	s.SetCheckError("app", errors.New("credentials rejected"))
	if st := in.status(); st.CheckError == "" {
		t.Fatal("the check error is not in the status")
	}
	if err := s.Wake(t.Context(), "app"); err != nil {
		t.Fatal(err)
	}
	if st := in.status(); st.CheckError != "" {
		t.Errorf("after a good wake the status still says %q", st.CheckError)
	}
}

// TestTenantGoneClearsAFailedSleep: a sleep that failed leaves the tenant running, and the status
// says so until a sleep succeeds; a tenant that then dies on its own takes that with it. Before, a
// guest killed after a failed sleep showed asleep with "sleep (admin) failed; the tenant may still
// run" beside it.
func TestTenantGoneClearsAFailedSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{}
		s, in := newTestServer(t, b, passGate{})
		if err := s.Wake(t.Context(), "app"); err != nil {
			t.Fatal(err)
		}
		b.set(func(f *fakeBackend) { f.sleepErr = errors.New("BMC says no") })
		if err := s.Sleep(t.Context(), "app"); err == nil {
			t.Fatal("the sleep did not fail")
		}
		if err := s.Wake(t.Context(), "app"); err != nil { // the take-back
			t.Fatal(err)
		}
		if st := in.status(); st.LastSleepError == "" {
			t.Fatal("the failed sleep is not in the status")
		}
		b.set(func(f *fakeBackend) { f.life.End(errors.New("killed")) })
		synctest.Wait() // the watch notices
		if st := in.status(); st.State != Asleep.String() || st.LastSleepError != "" {
			t.Errorf("after the tenant died: %s, last_sleep_error %q; want asleep and none", st.State, st.LastSleepError)
		}
	})
}

// TestDependentAnswerNamesItself: a route whose wake failed because its requirement backs off is
// answered with its own failure (phase requires), not its requirement's ("route \"mid\": the last
// wake failed in phase health"), which named an internal instance on the public route's page.
func TestDependentAnswerNamesItself(t *testing.T) {
	inner := &BackoffError{Route: "mid", RetryAfter: time.Second, Last: &WakeError{Route: "mid", Phase: "health", Err: errors.New("x")}}
	err := &WakeError{Route: "app2", Phase: "requires", Err: &RequirementError{Instance: "mid", Err: inner}}
	if got := clientMessage(err); !strings.Contains(got, `route "app2": wake failed in phase requires`) || strings.Contains(got, `"mid"`) {
		t.Errorf("clientMessage = %q, want the dependent's own failure", got)
	}
}
