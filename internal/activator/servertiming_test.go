package activator

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/activator/activator/internal/registry"
)

func TestTimingToken(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"spawn", "spawn"},
		{"power_on", "power_on"},
		{"qmp/restore", "qmp/restore"},
		{"a b;c=d,e\"f", "a_b_c_d_e_f"},
		{"9lives", "p9lives"},
		{"", "phase"},
		{"héllo", "h__llo"},
	} {
		if got := timingToken(c.in); got != c.want {
			t.Errorf("timingToken(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestTimingEntries(t *testing.T) {
	got := timingEntries([]PhaseRecord{{Name: "spawn", Duration: 2040100 * time.Microsecond}, {Name: "health", Duration: 12500 * time.Microsecond}})
	if want := "spawn;dur=2040.1, health;dur=12.5"; got != want {
		t.Errorf("timingEntries = %q, want %q", got, want)
	}
	if got := serverTiming(2041300*time.Microsecond, "spawn;dur=1.0"); got != "hold;dur=2041.3, spawn;dur=1.0" {
		t.Errorf("serverTiming = %q", got)
	}
	if got := serverTiming(1500*time.Microsecond, ""); got != "hold;dur=1.5" {
		t.Errorf("serverTiming without phases = %q", got)
	}
}

// serverTimingRE is one Server-Timing entry as the edge writes it.
var serverTimingRE = regexp.MustCompile(`^[A-Za-z*][!#$%&'*+\-.^_` + "`" + `|~0-9A-Za-z:/]*;dur=\d+\.\d$`)

func TestHeldResponseCarriesServerTiming(t *testing.T) {
	b := signalBackend{&fakeBackend{wakeGate: make(chan struct{})}, make(chan struct{}, 4)}
	s, in := newPageServer(t, b, appUpstream(t))
	w := heldAnswer(s, b)
	if w.Code != http.StatusOK {
		t.Fatalf("status %d", w.Code)
	}
	id := in.status().LastWake.ID
	if h := w.Header().Get(wakeIDHeader); h != id {
		t.Errorf("%s: %q, want the wake's id %q", wakeIDHeader, h, id)
	}
	values := w.Header().Values("Server-Timing")
	if len(values) != 2 || !slices.Contains(values, "db;dur=1.5") {
		t.Fatalf("Server-Timing %q: want the tenant's entry and the edge's", values)
	}
	edge := values[0]
	if edge == "db;dur=1.5" {
		edge = values[1]
	}
	var names []string
	for e := range strings.SplitSeq(edge, ", ") {
		if !serverTimingRE.MatchString(e) {
			t.Errorf("entry %q is not token;dur=ms.d", e)
		}
		names = append(names, e[:strings.IndexByte(e, ';')])
	}
	if want := []string{"hold", "spawn", "health"}; strings.Join(names, ",") != strings.Join(want, ",") {
		t.Errorf("Server-Timing entries %v, want %v", names, want)
	}

	// The warm path: nothing added.
	w = httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://app.test/", nil))
	if v := w.Header().Values("Server-Timing"); len(v) != 1 || w.Header().Get(wakeIDHeader) != "" {
		t.Errorf("warm response: Server-Timing %q, %s %q; want only the tenant's, no wake id", v, wakeIDHeader, w.Header().Get(wakeIDHeader))
	}
}

// heldAnswer sends one GET to the sleeping route, which holds it while b's wake waits on its gate,
// opens the gate once the request started the wake, and returns the answer.
func heldAnswer(s *Server, b signalBackend) *httptest.ResponseRecorder {
	got := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://app.test/", nil))
		got <- w
	}()
	<-b.woke // the request started the wake: it is held
	close(b.wakeGate)
	return <-got
}

var errTest = errors.New("the tenant exploded")

func TestHeldFailureCarriesWakeID(t *testing.T) {
	b := signalBackend{&fakeBackend{wakeGate: make(chan struct{}), wakeErr: errTest}, make(chan struct{}, 4)}
	s, in := newPageServer(t, b, appUpstream(t))
	w := heldAnswer(s, b)
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", w.Code)
	}
	if h, id := w.Header().Get(wakeIDHeader), in.status().LastWake.ID; h != id {
		t.Errorf("%s %q, want %q", wakeIDHeader, h, id)
	}
	if v := w.Header().Get("Server-Timing"); !strings.HasPrefix(v, "hold;dur=") || !strings.Contains(v, "spawn;dur=") {
		t.Errorf("Server-Timing %q, want hold and the failed wake's phases", v)
	}
}

// TestHeldBusyCarriesServerTiming: a held request that finds no upstream slot once released (the one
// slot taken, until its hold budget runs out) is answered 503 with its Server-Timing and wake id, as
// any answer to a held request is, although the writer is built only after the slot wait.
func TestHeldBusyCarriesServerTiming(t *testing.T) {
	b := signalBackend{&fakeBackend{wakeGate: make(chan struct{})}, make(chan struct{}, 4)}
	s, in := newPageServer(t, b, appUpstream(t), func(r *registry.Route) {
		r.MaxUpstreamConns = 1
		r.Hold.MaxTime = 200 * time.Millisecond // the released request's whole budget for a slot
	})
	done, err := in.admit(context.Background(), nil) // the only slot, kept until the end
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	w := heldAnswer(s, b)
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), ErrUpstreamBusy.Error()) {
		t.Fatalf("status %d %q, want 503 saying %q", w.Code, w.Body, ErrUpstreamBusy)
	}
	if h, id := w.Header().Get(wakeIDHeader), in.status().LastWake.ID; h != id || id == "" {
		t.Errorf("%s %q, want the wake's id %q", wakeIDHeader, h, id)
	}
	if v := w.Header().Get("Server-Timing"); !strings.HasPrefix(v, "hold;dur=") || !strings.Contains(v, "spawn;dur=") {
		t.Errorf("Server-Timing %q, want hold and the wake's phases", v)
	}
}
