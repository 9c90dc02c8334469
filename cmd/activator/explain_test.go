package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/activator/activator/internal/activator"
)

// TestExplainAndLiveWake drives a real `activator serve` with the CLI as an operator would: a wake that
// succeeds and one that fails, shown live (plain lines: the output is no terminal), then explained;
// and a sleep that had to kill its tenant, explained with its note.
func TestExplainAndLiveWake(t *testing.T) {
	good := appRoute{Name: "good"}
	bad := appRoute{Name: "bad", BackoffInitial: "20ms", BackoffMax: "40ms",
		Env: map[string]string{"DEMOAPP_EXIT_CODE": "3", "DEMOAPP_EXIT_MESSAGE": "demo: no database"}}
	stubborn := appRoute{Name: "stubborn", StopGrace: "200ms", Env: map[string]string{"DEMOAPP_IGNORE_TERM": "1"}}
	s := startServed(t, configYAML(t, good, bad, stubborn))

	code, out := runMain(t, "wake", "good", "--admin", s.admin)
	if code != 0 {
		t.Fatalf("wake good: exit %d:\n%s", code, out)
	}
	// One plain line per phase, in order, then the result.
	var phaseLines []string
	for l := range strings.Lines(out) {
		if strings.HasPrefix(l, "  +") {
			phaseLines = append(phaseLines, strings.Fields(l)[1])
		}
	}
	if strings.Join(phaseLines, ",") != "spawn,health" {
		t.Errorf("wake good: phase lines %v, want spawn,health (one each); output:\n%s", phaseLines, out)
	}
	if strings.Contains(out, "\r") {
		t.Errorf("wake good: a progress line (\\r) on a non-terminal:\n%q", out)
	}
	if !strings.Contains(out, "good: awake") {
		t.Errorf("wake good: no result line; output:\n%s", out)
	}

	code, out = runMain(t, "wake", "bad", "--admin", s.admin)
	if code != 1 || !strings.Contains(out, "demo: no database") || !strings.Contains(out, "wake failed in phase health") {
		t.Errorf("wake bad: exit %d, output:\n%s\nwant exit 1 and the cause", code, out)
	}

	if code, out := runMain(t, "sleep", "good", "--admin", s.admin); code != 0 {
		t.Fatalf("sleep good: exit %d:\n%s", code, out)
	}

	code, out = runMain(t, "explain", "good", "--admin", s.admin)
	for _, want := range []string{"wake  trigger admin  result ok", "\n  +", "spawn", "health", "(budget 30s)", "sleep  reason admin  result ok"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("explain good: exit %d, want %q in:\n%s", code, want, out)
		}
	}
	code, out = runMain(t, "explain", "bad", "--admin", s.admin)
	for _, want := range []string{"result failed", "failed in health", "error: ", "output:\n    demo: no database"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("explain bad: exit %d, want %q in:\n%s", code, want, out)
		}
	}

	code, out = runMain(t, "explain", "good", "--admin", s.admin, "--json", "--last", "1")
	var evs []activator.Event
	if err := json.Unmarshal([]byte(out), &evs); code != 0 || err != nil || len(evs) != 1 || evs[0].Kind != activator.EventSleep {
		t.Errorf("explain --json --last 1: exit %d, %v, events %+v; want the one sleep", code, err, evs)
	}

	if code, out := runMain(t, "explain", "nope", "--admin", s.admin); code != 1 || !strings.Contains(out, "no such route: nope") {
		t.Errorf("explain nope: exit %d, output:\n%s\nwant 1 naming the route", code, out)
	}

	// A tenant that ignores its stop signal is killed after stop_grace; the sleep's record says so.
	if code, out := runMain(t, "wake", "stubborn", "--admin", s.admin); code != 0 {
		t.Fatalf("wake stubborn: exit %d:\n%s", code, out)
	}
	if code, out := runMain(t, "sleep", "stubborn", "--admin", s.admin); code != 0 {
		t.Fatalf("sleep stubborn: exit %d:\n%s", code, out)
	}
	code, out = runMain(t, "explain", "stubborn", "--admin", s.admin, "--last", "1")
	if want := "sleep  reason admin  result ok, forced"; code != 0 || !strings.Contains(out, want) ||
		!strings.Contains(out, "\n  note: still running 200ms (stop_grace) after SIGTERM: killed (SIGKILL)\n") {
		t.Errorf("explain stubborn: exit %d, output:\n%s\nwant the sleep, forced, with a note of the SIGKILL", code, out)
	}
	if got := scrape(t, s.admin, `activator_sleeps_forced_total{route="stubborn"}`, `activator_sleeps_forced_total{route="good"}`); got[`activator_sleeps_forced_total{route="stubborn"}`] != 1 ||
		got[`activator_sleeps_forced_total{route="good"}`] != 0 {
		t.Errorf("activator_sleeps_forced_total %v, want 1 for stubborn and 0 for good", got)
	}
	if code, out := runMain(t, "explain", "good", "--admin", s.admin, "--last", "0"); code != 2 || !strings.Contains(out, "--last") {
		t.Errorf("explain --last 0: exit %d, output:\n%s\nwant 2 naming --last", code, out)
	}
}

// TestStatusWatchAndNames: --watch redraws the table (separator lines when the output is no terminal)
// until --count refreshes are done; --names lists the routes for shell completion.
func TestStatusWatchAndNames(t *testing.T) {
	s := startServed(t, configYAML(t, appRoute{Name: "one"}, appRoute{Name: "two"}))
	code, out := runMain(t, "status", "--admin", s.admin, "--watch", "--interval", "10ms", "--count", "2")
	if code != 0 || strings.Count(out, "ROUTE") != 2 || strings.Count(out, "\n-- ") != 1 || strings.Contains(out, "\x1b[") {
		t.Errorf("status --watch --count 2: exit %d, output:\n%s\nwant two tables, one separator line, no ANSI", code, out)
	}
	if code, out := runMain(t, "status", "--admin", s.admin, "--names"); code != 0 || out != "one\ntwo\n" {
		t.Errorf("status --names: exit %d, output %q, want \"one\\ntwo\\n\"", code, out)
	}
}

// TestStatusSelects: `activator status` lists only the routes named (before, between or after the
// flags) and in the --state given, as the admin API selects them; a route that does not exist or a
// state that is not one fails with the admin API's reason.
func TestStatusSelects(t *testing.T) {
	s := startServed(t, configYAML(t, appRoute{Name: "one"}, appRoute{Name: "two"}, appRoute{Name: "three"}))
	if code, out := runMain(t, "wake", "two", "--admin", s.admin); code != 0 {
		t.Fatalf("wake two: exit %d:\n%s", code, out)
	}
	routesIn := func(out string) []string {
		var names []string
		for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
			names = append(names, strings.Fields(line)[0])
		}
		return names
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--state", "awake"}, []string{"two"}},
		{[]string{"--state", "asleep"}, []string{"one", "three"}},
		{[]string{"three", "--state", "asleep,awake", "one"}, []string{"one", "three"}},
		{[]string{"three", "two"}, []string{"two", "three"}},
	} {
		code, out := runMain(t, append([]string{"status", "--admin", s.admin}, c.args...)...)
		if got := routesIn(out); code != 0 || !slices.Equal(got, c.want) {
			t.Errorf("status %v: exit %d, routes %v, want %v:\n%s", c.args, code, got, c.want, out)
		}
	}
	if code, out := runMain(t, "status", "--admin", s.admin, "--names", "--state", "asleep"); code != 0 || out != "one\nthree\n" {
		t.Errorf("status --names --state asleep: exit %d, output %q, want \"one\\nthree\\n\"", code, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"nope"}, `activator status: GET /routes: route: no such route: "nope"`},
		{[]string{"--state", "up"}, `activator status: GET /routes: state: "up" is not a state (asleep, waking, awake, stopping, failed)`},
	} {
		if code, out := runMain(t, append([]string{"status", "--admin", s.admin}, c.args...)...); code != 1 || strings.TrimSpace(out) != c.want {
			t.Errorf("status %v: exit %d, output %q, want 1 and %q", c.args, code, out, c.want)
		}
	}
}
