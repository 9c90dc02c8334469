package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/activator/activator/internal/activator"
)

// stuckBMC is a BMC that takes every request and answers none until released, then answers 500: a
// board whose management controller hangs.
type stuckBMC struct {
	srv     *httptest.Server
	arrived chan struct{} // one value per request, as it comes in
	release chan struct{}

	mu       sync.Mutex // guards answered
	answered int
}

func newStuckBMC(t *testing.T) *stuckBMC {
	b := &stuckBMC{arrived: make(chan struct{}, 64), release: make(chan struct{})}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case b.arrived <- struct{}{}:
		default:
		}
		select {
		case <-b.release:
			http.Error(w, "BMC fault", http.StatusInternalServerError)
		case <-r.Context().Done():
		}
		b.mu.Lock()
		b.answered++
		b.mu.Unlock()
	}))
	t.Cleanup(func() {
		select {
		case <-b.release:
		default:
			close(b.release)
		}
		b.srv.Close()
	})
	return b
}

func (b *stuckBMC) answeredCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.answered
}

// TestStartupDoesNotWaitForBMCs: four routes whose BMCs hang. The edge and admin ports open and READY
// goes out before any BMC answers; the four host checks run at once, not one after another; each
// route whose check fails is marked with the reason, and the edge serves meanwhile.
func TestStartupDoesNotWaitForBMCs(t *testing.T) {
	bmcs := make([]*stuckBMC, 4) // one board each, as in a rack: routes sharing a BMC share its session
	for i := range bmcs {
		bmcs[i] = newStuckBMC(t)
	}
	t.Setenv("STARTUP_TEST_BMC_PW", "secret")
	var config strings.Builder
	config.WriteString("routes:\n")
	for i := range 4 {
		fmt.Fprintf(&config, `  - name: node%d
    hosts: [node%d.test]
    backing: redfish
    upstream: 127.0.0.1:9
    redfish: {endpoint: %q, username: node%d, password_env: STARTUP_TEST_BMC_PW, auth: basic}
`, i, i, bmcs[i].srv.URL, i)
	}
	s := startServed(t, config.String()) // returns once "activator listening" is logged

	for i, b := range bmcs {
		if n := b.answeredCount(); n != 0 {
			t.Fatalf("the activator listened only after %d requests to node%d's BMC had ended: start-up waited for the BMCs", n, i)
		}
	}
	// The edge answers now, while every BMC hangs: an unknown host gets its 404 from the edge itself.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if a := getFresh(ctx, s.edge, "unknown.test", "/"); a.err != nil || a.code != http.StatusNotFound {
		t.Fatalf("edge while the BMCs hang: status %d, err %v; want the edge's own 404", a.code, a.err)
	}
	deadline := time.After(time.Minute)
	for i, b := range bmcs {
		select {
		case <-b.arrived:
		case <-deadline:
			t.Fatalf("node%d's check never reached its BMC while the others hung: the checks run one at a time", i)
		}
	}
	for _, b := range bmcs {
		close(b.release)
	}
	for i := range 4 {
		route := fmt.Sprintf("node%d", i)
		s.waitStatus(route, "check_error set", func(st activator.Status) bool { return st.CheckError != "" })
		if st := s.status(route); !strings.Contains(st.CheckError, "500") && !strings.Contains(strings.ToLower(st.CheckError), "fault") {
			t.Errorf("%s check_error %q does not carry the BMC's answer", route, st.CheckError)
		}
	}
}
