package unit

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/activator/activator/internal/backend/backendtest"
	"github.com/activator/activator/internal/systemdtest"
	"github.com/activator/activator/internal/tenant"
)

// A unit whose start a failed Condition*= skips: systemd finishes the start job "done" and leaves the
// unit inactive with Result=success, having run nothing. A failed Assert*= fails the job with result
// "assert". Either way the wake fails, once (one start job: no retry), in the phase every start job's
// outcome fails in (Wake returns once the job is queued, and its outcome ends the Life that the health
// gate watches), and its error names the setting that failed. Before, the skip read "unit … stopped
// (ActiveState=inactive SubState=dead Result=success)", naming nothing.
func TestStartCheckFailed(t *testing.T) {
	m := systemdtest.Start(t)
	cases := []struct {
		name  string
		unit  []string
		job   string // the start job's result: "" for "done" (the unit is then found inactive)
		want  string
		class tenant.Class
	}{
		{"condition", []string{"ConditionPathExists=/nonexistent"}, "",
			"start skipped: condition ConditionPathExists=/nonexistent failed", tenant.ClassRetryable},
		{"negated_condition", []string{"ConditionPathExists=!/"}, "",
			"start skipped: condition ConditionPathExists=!/ failed", tenant.ClassRetryable},
		{"triggering_conditions", []string{"ConditionPathExists=|/nonexistent-a"}, "",
			"start skipped: no triggering condition held: ConditionPathExists=|/nonexistent-a", tenant.ClassRetryable},
		// With two plain conditions, which one failed is lost when the manager unloads the unit (nothing
		// references it) as soon as the job is over: both are named as candidates, not one guessed.
		{"one_of_two_conditions", []string{"ConditionPathExists=/", "ConditionPathExists=!/"}, "",
			"start skipped: one of the conditions ", tenant.ClassRetryable},
		{"assert", []string{"AssertPathExists=/nonexistent"}, "assert",
			"start refused: assert AssertPathExists=/nonexistent failed", tenant.ClassRetryable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, proxy := proxiedDemo(t, m, SleepStop, systemdtest.Demo{Unit: c.unit})
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			defer cancel()
			var log phaseLog
			life, err := f.b.Wake(ctx, &log)
			if err != nil {
				t.Fatalf("Wake: %v, want the start job queued (its outcome ends the Life)", err)
			}
			if got := strings.Join(log.phases, " "); got != tenant.PhaseStart {
				t.Errorf("wake phases %q, want %q", got, tenant.PhaseStart)
			}
			err = waitLife(t, life)
			if serr := f.b.settle(ctx); serr != nil {
				t.Fatal(serr)
			}
			t.Logf("the wake failed with: %v", err)
			for _, want := range []string{f.unit, c.want, "Result=success"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if strings.Contains(err.Error(), "stopped") {
				t.Errorf("error %q says the unit stopped: it never ran", err)
			}
			switch c.job {
			case "":
				if _, ok := errors.AsType[*ExitError](err); !ok {
					t.Errorf("error %T, want an *ExitError (the start job was done)", err)
				}
			default:
				if je, ok := errors.AsType[*JobError](err); !ok || je.Result != c.job {
					t.Errorf("error %v, want a *JobError with job result %q", err, c.job)
				}
			}
			backendtest.WantClass(t, err, c.class)
			if n := proxy.Calls("StartUnit"); n != 1 {
				t.Errorf("%d StartUnit calls, want 1 (the failure is not retried)", n)
			}
			if st := m.ActiveState(t, f.unit); st != "inactive" {
				t.Errorf("unit %s after the failed wake, want inactive", st)
			}
		})
	}
}

// A condition that fails, then holds, then fails again: each wake reports the check of its own start.
// A unit that passed its conditions and later died says it stopped, naming no condition.
func TestStartConditionChanges(t *testing.T) {
	m := systemdtest.Start(t)
	flag := filepath.Join(t.TempDir(), "flag")
	f := newFixture(t, m, newProvider(t), SleepStop, systemdtest.Demo{Unit: []string{"ConditionPathExists=" + flag}})
	want := "start skipped: condition ConditionPathExists=" + flag + " failed"

	if err := wakeOutcome(t, f.b); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("wake without %s: %v, want it to say %q", flag, err, want)
	}
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	life := f.wake(t)
	f.m.Kill(t, f.unit, "main", syscall.SIGKILL)
	err := waitLife(t, life)
	if _, ok := errors.AsType[*ExitError](err); !ok || !strings.Contains(err.Error(), "stopped") || strings.Contains(err.Error(), "condition") {
		t.Fatalf("a killed unit whose condition held: %v, want an *ExitError saying it stopped, naming no condition", err)
	}
	if err := f.b.settle(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(flag); err != nil {
		t.Fatal(err)
	}
	if err := wakeOutcome(t, f.b); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("wake after %s was removed: %v, want it to say %q", flag, err, want)
	}
}

// A unit that something else keeps loaded (here a target ordered after it) keeps the state of each of
// its checks after the job: the one that failed is named among several.
func TestStartConditionNamedWhileLoaded(t *testing.T) {
	m := systemdtest.Start(t)
	f := newFixture(t, m, newProvider(t), SleepStop, systemdtest.Demo{Unit: []string{"ConditionPathExists=/", "ConditionPathExists=!/"}})
	pin := uniq("pin") + ".target"
	m.WriteUnit(t, pin, "[Unit]\nAfter="+f.unit+"\n")
	m.StartUnit(t, pin)
	err := wakeOutcome(t, f.b)
	want := "start skipped: condition ConditionPathExists=!/ failed"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("wake = %v, want it to say %q", err, want)
	}
}

// describeFailed names what failed from the states the manager gave, or else what must have failed.
func TestDescribeFailed(t *testing.T) {
	c := func(param string, trigger bool, state int32) Check {
		return Check{Type: "ConditionPathExists", Trigger: trigger, Parameter: param, State: state}
	}
	cases := []struct {
		name   string
		checks []Check
		want   string
	}{
		{"marked", []Check{c("/a", false, 1), c("/b", false, -1)}, "condition ConditionPathExists=/b failed"},
		{"two marked", []Check{c("/a", false, -1), c("/b", false, -1)}, "conditions ConditionPathExists=/a, ConditionPathExists=/b failed"},
		{"triggers marked", []Check{c("/a", true, -1), c("/b", true, -1), c("/c", false, 1)},
			"no triggering condition held: ConditionPathExists=|/a, ConditionPathExists=|/b"},
		{"lone, reloaded", []Check{c("/a", false, 0)}, "condition ConditionPathExists=/a failed"},
		{"triggers only, reloaded", []Check{c("/a", true, 0), c("/b", true, 0)},
			"no triggering condition held: ConditionPathExists=|/a, ConditionPathExists=|/b"},
		{"ambiguous, reloaded", []Check{c("/a", false, 0), c("/b", true, 0)},
			"one of the conditions ConditionPathExists=/a, ConditionPathExists=|/b failed; the manager unloaded the unit before saying which"},
		{"none", nil, "a condition failed"},
	}
	for _, tc := range cases {
		if got := describeFailed("condition", tc.checks); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
	neg := Check{Type: "AssertPathExists", Trigger: true, Negate: true, Parameter: "/x"}
	if got, want := neg.String(), "AssertPathExists=|!/x"; got != want {
		t.Errorf("Check.String() = %q, want %q", got, want)
	}
}
