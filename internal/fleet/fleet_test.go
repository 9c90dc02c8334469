package fleet

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/activator/activator/internal/tenant"
)

// members builds a fleet from outcomes: "up", "timeout" (a retryable fault), "error" (a missing
// binary: terminal), "block" (waits for its ctx to end), "gate" (up once gate is closed) or
// "gated-timeout" (a retryable fault once gate is closed).
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
			case "gate", "gated-timeout":
				select {
				case <-gate:
				case <-ctx.Done():
					return ctx.Err()
				}
				if o == "gated-timeout" {
					return tenant.Retryable(errors.New("still booting after 1s"))
				}
				return nil
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

// TestQuorumLostIsPutOnTheTerminalMember: min_ready 4 of 5; c fails terminally (its allowance of one
// failure spent), then d times out and the quorum is lost. The culprit is c and the class terminal,
// whichever failed last: c fails every wake until someone fixes it. The error names d too. Found by an
// operator trial: the wake read "retryable", culprit d, and pointed at the wrong fix.
func TestQuorumLostIsPutOnTheTerminalMember(t *testing.T) {
	for _, serial := range []bool{false, true} {
		gate := make(chan struct{})
		ms := members(gate, "up", "up", "error", "gated-timeout", "up")
		r := Start(t.Context(), ms, Options{MinReady: 4, Serial: serial, OnSettled: func(i int, res Result) {
			if i == 2 {
				close(gate) // d times out only once c has failed
			}
		}})
		<-r.Done()
		var qe *QuorumError
		if !errors.As(r.Err(), &qe) {
			t.Fatalf("serial=%v: err %v", serial, r.Err())
		}
		if qe.Culprit.Name != "c" || tenant.ClassOf(r.Err()) != tenant.ClassTerminal {
			t.Errorf("serial=%v: culprit %q, class %q; want c, terminal", serial, qe.Culprit.Name, tenant.ClassOf(r.Err()))
		}
		if len(qe.Others) != 1 || qe.Others[0].Name != "d" || !strings.Contains(qe.Error(), `member "d" failed too, in phase start (retryable)`) {
			t.Errorf("serial=%v: others %+v, error %q; want d named, retryable", serial, qe.Others, qe.Error())
		}
	}
}

// TestOnSettledAsEachMemberSettles: a member's failure is told as it settles, not once the others
// have: c fails while d still waits for its gate. Found by an operator trial: a member's failure was
// logged only when the slowest member had settled, 14 s later.
func TestOnSettledAsEachMemberSettles(t *testing.T) {
	gate := make(chan struct{})
	settled := make(chan Result, 4)
	r := Start(t.Context(), members(gate, "up", "error", "gate"), Options{MinReady: 1, OnSettled: func(i int, res Result) { settled <- res }})
	got := map[string]Status{}
	for len(got) < 2 {
		res := <-settled
		got[res.Name] = res.Status
	}
	if got["a"] != Up || got["b"] != Error {
		t.Fatalf("settled before c: %v", got)
	}
	select {
	case <-r.Done():
		t.Fatal("the run is done while c waits for its gate")
	default:
	}
	close(gate)
	<-r.Done()
	if res := <-settled; res.Name != "c" || res.Status != Up {
		t.Fatalf("c settled as %+v", res)
	}
}
