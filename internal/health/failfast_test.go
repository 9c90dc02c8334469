package health_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/activator/activator/internal/health"
	"github.com/activator/activator/internal/registry"
)

// Steps of a script besides a status code.
const (
	drop = -1 // close the connection without answering: a connection error
	hang = -2 // answer nothing until the probe gives up: a probe timeout
)

// script answers the n-th probe as steps[n] says, repeating the last step after that, and counts
// probes.
func script(hits *atomic.Int64, steps ...int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n := int(hits.Add(1))
		answer(w, r, steps[min(n, len(steps))-1])
	}
}

// cycle answers the n-th probe with steps[n mod len(steps)], counts probes, and calls stop at the
// enough-th: the gate is given that many probes to fail fast, and must not.
func cycle(hits *atomic.Int64, enough int64, stop context.CancelFunc, steps ...int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n := hits.Add(1)
		if n == enough {
			stop()
		}
		answer(w, r, steps[int(n-1)%len(steps)])
	}
}

func answer(w http.ResponseWriter, r *http.Request, step int) {
	switch step {
	case drop:
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			c.Close()
		}
	case hang:
		<-r.Context().Done() // the probe closing its connection ends it
	default:
		w.WriteHeader(step)
	}
}

// TestWaitFailFast: FailFastAfter probes in a row refused with the same client error end the gate at
// once, with an error that names the path and the status; anything else in between starts the count
// again.
func TestWaitFailFast(t *testing.T) {
	tests := []struct {
		name       string
		failFast   int
		mod        func(*registry.Health)
		steps      []int
		wantProbes int64
		wantStatus string // as the message gives it
	}{
		{name: "404 from the first probe", failFast: 3, steps: []int{404}, wantProbes: 3, wantStatus: "404 Not Found"},
		{name: "404 once the tenant listens", failFast: 3, steps: []int{drop, 503, 404}, wantProbes: 5, wantStatus: "404 Not Found"},
		{name: "the count is the config's", failFast: 5, steps: []int{404}, wantProbes: 5, wantStatus: "404 Not Found"},
		{name: "one refusal is enough", failFast: 1, steps: []int{404}, wantProbes: 1, wantStatus: "404 Not Found"},
		{name: "a different 4xx starts its own count", failFast: 3, steps: []int{404, 404, 403}, wantProbes: 5, wantStatus: "403 Forbidden"},
		{name: "a 5xx in between", failFast: 3, steps: []int{404, 404, 503, 404}, wantProbes: 6, wantStatus: "404 Not Found"},
		{name: "a 429 in between", failFast: 3, steps: []int{404, 404, 429, 404}, wantProbes: 6, wantStatus: "404 Not Found"},
		{
			name: "a pass in between", failFast: 3, mod: func(h *registry.Health) { h.Passes = 2 },
			steps: []int{404, 404, 200, 404}, wantProbes: 6, wantStatus: "404 Not Found",
		},
		{
			name: "a redirect out of range in between", failFast: 3, mod: func(h *registry.Health) { h.MaxStatus = 299 },
			steps: []int{404, 404, 302, 404}, wantProbes: 6, wantStatus: "404 Not Found",
		},
		{name: "a connection error in between", failFast: 3, steps: []int{404, 404, drop, 404}, wantProbes: 6, wantStatus: "404 Not Found"},
		{
			// The probe timeout is short for the one probe that hangs; the 404s answer at once.
			name: "a timeout in between", failFast: 3, mod: func(h *registry.Health) { h.Timeout = 200 * time.Millisecond },
			steps: []int{404, 404, hang, 404}, wantProbes: 6, wantStatus: "404 Not Found",
		},
		{name: "400", failFast: 3, steps: []int{400}, wantProbes: 3, wantStatus: "400 Bad Request"},
		{name: "401", failFast: 3, steps: []int{401}, wantProbes: 3, wantStatus: "401 Unauthorized"},
		{name: "405", failFast: 3, steps: []int{405}, wantProbes: 3, wantStatus: "405 Method Not Allowed"},
		{name: "410", failFast: 3, steps: []int{410}, wantProbes: 3, wantStatus: "410 Gone"},
		{name: "a 4xx without a name", failFast: 3, steps: []int{499}, wantProbes: 3, wantStatus: "499"},
		{
			name: "404 outside a 5xx range", failFast: 3, mod: func(h *registry.Health) { h.MinStatus, h.MaxStatus = 500, 599 },
			steps: []int{404}, wantProbes: 3, wantStatus: "404 Not Found",
		},
	}
	waits := map[string]func(*health.Prober, context.Context) error{
		"Wait": func(p *health.Prober, ctx context.Context) error { return p.Wait(ctx, nil) },
		"WaitConn": func(p *health.Prober, ctx context.Context) error {
			c, err := p.WaitConn(ctx, nil)
			if c != nil {
				c.Close()
			}
			return err
		},
	}
	for wait, run := range waits {
		for _, tt := range tests {
			t.Run(wait+"/"+tt.name, func(t *testing.T) {
				var hits atomic.Int64
				up := tcpServer(t, script(&hits, tt.steps...))
				p := newGate(t, up, cfg(func(h *registry.Health) {
					h.FailFastAfter = tt.failFast
					if tt.mod != nil {
						tt.mod(h)
					}
				}))
				ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a bound, not an expectation
				defer cancel()
				err := run(p, ctx)
				if !errors.Is(err, health.ErrWrongPath) {
					t.Fatalf("%s() = %v after %d probes, want ErrWrongPath", wait, err, hits.Load())
				}
				want := fmt.Sprintf("health check GET /healthz answered %s %d times in a row: "+
					"the tenant is up but this path is wrong (set health.path)", tt.wantStatus, tt.failFast)
				if got := err.Error(); got != want {
					t.Errorf("error = %q, want %q", got, want)
				}
				if got := hits.Load(); got != tt.wantProbes {
					t.Errorf("gate failed after %d probes, want %d", got, tt.wantProbes)
				}
			})
		}
	}
}

// TestWaitNoFailFast: statuses that may pass when asked again, and client errors that do not repeat,
// never fail the gate fast. The server ends the wait itself after enough probes to have failed fast
// several times over.
func TestWaitNoFailFast(t *testing.T) {
	const failFast, enough = 3, 4 * 3
	tests := []struct {
		name  string
		steps []int
	}{
		{name: "429 Too Many Requests", steps: []int{429}},
		{name: "408 Request Timeout", steps: []int{408}},
		{name: "425 Too Early", steps: []int{425}},
		{name: "404 and 503 alternating", steps: []int{404, 503}},
		{name: "404 and 403 alternating", steps: []int{404, 403}},
		{name: "404 twice, then a connection error", steps: []int{404, 404, drop}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var hits atomic.Int64
			up := tcpServer(t, cycle(&hits, enough, cancel, tt.steps...))
			p := newGate(t, up, cfg(func(h *registry.Health) { h.FailFastAfter = failFast }))
			err := p.Wait(ctx, nil)
			var ge *health.GateError
			if !errors.As(err, &ge) || !errors.Is(err, context.Canceled) {
				t.Fatalf("Wait() = %v after %d probes, want a *GateError when the server stopped it", err, hits.Load())
			}
			if got := hits.Load(); got < enough {
				t.Errorf("gate ended after %d probes, want at least %d", got, enough)
			}
		})
	}
}

// TestWaitFailFastOff: FailFastAfter 0 (as in a Health built by hand) keeps probing a 404 until the
// budget ends, as before the rule.
func TestWaitFailFastOff(t *testing.T) {
	var hits atomic.Int64
	up := tcpServer(t, script(&hits, http.StatusNotFound))
	p := newGate(t, up, cfg(nil))
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	err := p.Wait(ctx, nil)
	var ge *health.GateError
	if !errors.As(err, &ge) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait() = %v, want a *GateError at the budget", err)
	}
	if ge.Last == nil || !strings.Contains(ge.Last.Error(), "GET /healthz: status 404, want 200-399") {
		t.Errorf("GateError.Last = %v, want the 404", ge.Last)
	}
	if got := hits.Load(); got <= registry.DefaultFailFastAfter {
		t.Errorf("gate ended after %d probes, want it to probe on past %d", got, registry.DefaultFailFastAfter)
	}
}

// TestWaitFailFastInRange: a 4xx that the route's status range accepts is a pass, not a refusal.
func TestWaitFailFastInRange(t *testing.T) {
	ranges := [][2]int{{200, 404}, {400, 499}, {404, 404}}
	for _, r := range ranges {
		t.Run(fmt.Sprintf("%d-%d", r[0], r[1]), func(t *testing.T) {
			var hits atomic.Int64
			up := tcpServer(t, script(&hits, http.StatusNotFound))
			p := newGate(t, up, cfg(func(h *registry.Health) {
				h.MinStatus, h.MaxStatus = r[0], r[1]
				h.FailFastAfter = 1
			}))
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a bound, not an expectation
			defer cancel()
			if err := p.Wait(ctx, nil); err != nil {
				t.Fatalf("Wait() = %v, want a pass", err)
			}
			if got := hits.Load(); got != 1 {
				t.Errorf("gate passed after %d probes, want 1", got)
			}
		})
	}
}
