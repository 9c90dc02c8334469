package fleet

import (
	"context"
	"errors"
	"os/exec"
	"testing"
	"time"

	"github.com/activator/activator/internal/tenant"
)

// members builds a fleet from outcomes: "up", "timeout" (a retryable fault), "error" (a missing
// binary: terminal), "block" (waits for its ctx to end) or "gate" (up once gate is closed).
func members(gate <-chan struct{}, outcomes ...string) []Member {
	ms := make([]Member, len(outcomes))
	for i, o := range outcomes {
		ms[i] = Member{Name: string(rune('a' + i)), Phase: func() string { return "start" }, Wake: func(ctx context.Context) error {
			switch o {
			case "up":
				return nil
			case "timeout":
				return tenant.Retryable(errors.New("still booting after 1s"))
			case "error":
				return exec.ErrNotFound
			case "gate":
				select {
				case <-gate:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			<-ctx.Done()
			return ctx.Err()
		}}
	}
	return ms
}

func TestRollupSameSerialAndParallel(t *testing.T) {
	for _, serial := range []bool{false, true} {
		r := Start(t.Context(), members(nil, "up", "up", "timeout", "up", "error"), Options{MinReady: 3, Serial: serial})
		<-r.Done()
		if err := r.Err(); err != nil {
			t.Fatalf("serial=%v: %v", serial, err)
		}
		if got := Rollup(r.Results()); got != "up, up, timeout, up, error" {
			t.Fatalf("serial=%v: rollup %q", serial, got)
		}
		res := r.Results()
		if res[2].Class != tenant.ClassRetryable || res[4].Class != tenant.ClassTerminal {
			t.Fatalf("serial=%v: classes %q %q", serial, res[2].Class, res[4].Class)
		}
	}
}

func TestQuorumDecidesBeforeStragglers(t *testing.T) {
	gate := make(chan struct{})
	r := Start(t.Context(), members(gate, "up", "up", "gate"), Options{MinReady: 2})
	<-r.Decided()
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	if got := Rollup(r.Results()); got != "up, up, waking" {
		t.Fatalf("at quorum: %q", got)
	}
	close(gate)
	<-r.Done()
	if got := Rollup(r.Results()); got != "up, up, up" {
		t.Fatalf("settled: %q", got)
	}
}

func TestFastFailNamesCulpritAndCancelsSurvivors(t *testing.T) {
	for _, serial := range []bool{false, true} {
		// All four needed: the misconfigured member loses the quorum at once.
		r := Start(t.Context(), members(nil, "up", "error", "block", "block"), Options{Serial: serial})
		<-r.Decided()
		var qe *QuorumError
		if !errors.As(r.Err(), &qe) || qe.Culprit.Name != "b" || qe.Culprit.Status != Error || qe.Culprit.Phase != "start" {
			t.Fatalf("serial=%v: err %v", serial, r.Err())
		}
		if tenant.ClassOf(r.Err()) != tenant.ClassTerminal {
			t.Fatalf("serial=%v: class %q", serial, tenant.ClassOf(r.Err()))
		}
		<-r.Done()
		res := r.Results()
		for _, c := range res[2:] {
			if c.Status != Cancelled || c.CancelledBy != "b" {
				t.Fatalf("serial=%v: survivor %+v", serial, c)
			}
		}
		// Serial members never started have reached no phase; parallel ones had.
		if want := map[bool]string{false: "start", true: ""}[serial]; res[3].Phase != want {
			t.Fatalf("serial=%v: survivor phase %q, want %q", serial, res[3].Phase, want)
		}
	}
}

func TestCancelledWakeHasNoCulprit(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	r := Start(ctx, members(nil, "up", "block"), Options{})
	cancel()
	<-r.Done()
	if !errors.Is(r.Err(), ErrCancelled) {
		t.Fatalf("err %v", r.Err())
	}
	if res := r.Results()[1]; res.Status != Cancelled || res.CancelledBy != "" {
		t.Fatalf("%+v", res)
	}
}

func TestDeadlineIsATimeout(t *testing.T) {
	ctx, cancel := context.WithDeadline(t.Context(), deadlinePast())
	defer cancel()
	r := Start(ctx, members(nil, "block", "up"), Options{MinReady: 2})
	<-r.Done()
	var qe *QuorumError
	if !errors.As(r.Err(), &qe) || qe.Culprit.Status != Timeout || qe.Culprit.Class != tenant.ClassRetryable {
		t.Fatalf("err %v", r.Err())
	}
}

func deadlinePast() time.Time { return time.Unix(1, 0) }
