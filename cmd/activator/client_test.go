package main

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/activator/activator/internal/activator"
)

// TestPrintStatus: the status table shows each route's last wake with its phases, and how long
// letting a herd go took when the wake released more than one held request.
func TestPrintStatus(t *testing.T) {
	now := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	wake := func(released int) *activator.WakeRecord {
		return &activator.WakeRecord{
			Result: activator.ResultOK, Started: now.Add(-3 * time.Second), Duration: 5700 * time.Microsecond,
			Phases:   []activator.PhaseRecord{{Name: "spawn", Duration: 1200 * time.Microsecond}, {Name: "health", Duration: 4500 * time.Microsecond}},
			Released: released, ReleaseSpread: 2500 * time.Microsecond,
		}
	}
	var out bytes.Buffer
	printStatus(&out, []activator.Status{
		{Route: "herd", Backing: "exec", State: "awake", Since: now, LastWake: wake(1000)},
		{Route: "one", Backing: "exec", State: "awake", Since: now, LastWake: wake(1)},
		{Route: "never", Backing: "unit", State: "asleep", Since: now, LastError: "unit x.service: start job result \"failed\""},
		{Route: "cold", Backing: "unit", State: "awake", Since: now, LastWake: wake(1), LastSleepError: `route "cold": sleep (idle) failed; the tenant may still run: freeze: not supported`},
		{Route: "held", Backing: "unit", State: "failed", Since: now, LastError: "wake failed", CheckError: "127.0.0.1:8080 is held by pid 42 (nginx)"},
	}, now, statusNoteMax)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 6 {
		t.Fatalf("got %d lines, want a header and 5 routes:\n%s", len(lines), out.String())
	}
	if !strings.Contains(lines[4], "awake, sleep failed") || !strings.Contains(lines[4], "sleep (idle) failed; the tenant may still run") {
		t.Errorf("the line %q of a route whose sleep failed does not say so", lines[4])
	}
	if !strings.Contains(lines[5], "host check failed: 127.0.0.1:8080 is held by pid 42 (nginx); wake failed") {
		t.Errorf("the line %q of a route whose host check failed does not say so", lines[5])
	}
	for _, want := range []string{"ok 5.7ms (3s ago)", "spawn=1.2ms health=4.5ms", "released=1000/2.5ms"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("herd line %q lacks %q", lines[1], want)
		}
	}
	if strings.Contains(lines[2], "released=") {
		t.Errorf("a wake that released one request shows a release: %q", lines[2])
	}
	if !strings.Contains(lines[3], `start job result "failed"`) {
		t.Errorf("the failed route's line %q does not carry its last error", lines[3])
	}
}

// TestOneRouteAtATime: a verb given two routes (or check given a stray argument) is a usage error
// (exit 2) before it talks to anything; before, `activator wake a b` woke a alone and exited 0.
// explain's --last is bounded by what a route keeps, and status refuses flags it would ignore or
// that would poll without end.
func TestOneRouteAtATime(t *testing.T) {
	admin := "--admin=127.0.0.1:1" // nothing listens: a call would fail with 1, not 2
	cases := []struct {
		name string
		run  func() int
	}{
		{"wake a b", func() int { return cmdWake([]string{"a", "b", admin}) }},
		{"wake a --admin … b", func() int { return cmdWake([]string{"a", admin, "b"}) }},
		{"sleep a b", func() int { return cmdAct("sleep", []string{"a", "b", admin}) }},
		{"explain a b", func() int { return cmdExplain([]string{"a", "b", admin}) }},
		{"explain --last 51", func() int { return cmdExplain([]string{"a", "--last", "51", admin}) }},
		{"check --config x extra", func() int { return cmdCheck([]string{"--config", "x.yaml", "extra"}) }},
		{"status --watch --count -1", func() int { return cmdStatus([]string{"--watch", "--count", "-1", admin}) }},
		{"status --watch --interval 1ns", func() int { return cmdStatus([]string{"--watch", "--interval", "1ns", admin}) }},
		{"status --count 3 without --watch", func() int { return cmdStatus([]string{"--count", "3", admin}) }},
		{"status --names --json", func() int { return cmdStatus([]string{"--names", "--json", admin}) }},
		{"status --state ''", func() int { return cmdStatus([]string{"--state", "", admin}) }},
	}
	for _, c := range cases {
		if code := c.run(); code != 2 {
			t.Errorf("%s: exit %d, want 2 (usage)", c.name, code)
		}
	}
}

// TestAnswersAreScrubbed: what the CLI prints of an answer carries no terminal control sequence a
// tenant wrote (its output tail is in a failed wake's error): found with a tenant whose exit message
// cleared the operator's screen, set the terminal's title and overwrote a line through `activator
// wake` and `activator explain`. Newlines and tabs stay.
func TestAnswersAreScrubbed(t *testing.T) {
	body := []byte(`[{"route":"esc","last_wake":{"error":"boom \u001b[31mRED\u001b[0m \u001b]0;pwned\u0007 \u001b[2J cleared\rOVER\nline\ttab \u009b1m","notes":["\u001b[2J"]}}]`)
	var sts []activator.Status
	if err := decodeAnswer(body, &sts); err != nil {
		t.Fatal(err)
	}
	got := sts[0].LastWake.Error + sts[0].LastWake.Notes[0]
	if strings.ContainsFunc(got, unsafeRune) {
		t.Errorf("decoded answer still has control characters: %q", got)
	}
	for _, want := range []string{`\x1b[31mRED`, `\x07`, `cleared\x0dOVER`, "\nline\ttab", `\u009b1m`} {
		if !strings.Contains(got, want) {
			t.Errorf("decoded answer %q lacks %q", got, want)
		}
	}
}

// TestStatusNoteCut: a NOTE longer than statusNoteMax is cut on a character, not a byte, and the
// table says that it cut one and how to see it whole; --wide (noteMax 0) prints it whole. Before,
// a note was cut at its 97th byte, which split a multi-byte character (a tenant's stderr in another
// script, a "…" of our own) into invalid UTF-8, and nothing said the note was not all there.
func TestStatusNoteCut(t *testing.T) {
	now := time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)
	long := "wake failed: exit status 12: " + strings.Repeat("ошибка ", 30) + "THE-END"
	st := []activator.Status{{Route: "ru", Backing: "exec", State: "failed", Since: now, LastError: long}}

	var out bytes.Buffer
	printStatus(&out, st, now, statusNoteMax)
	text := out.String()
	if !utf8.ValidString(text) {
		t.Errorf("the table is not valid UTF-8: a character was cut in two:\n%q", text)
	}
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) != 3 {
		t.Fatalf("got %d lines, want a header, the route and a line saying a note was cut:\n%s", len(lines), text)
	}
	row := lines[1]
	note := row[strings.Index(row, "wake failed"):]
	if n := utf8.RuneCountInString(note); n != statusNoteMax || !strings.HasSuffix(note, "…") {
		t.Errorf("the cut note is %d characters, want %d ending in …: %q", n, statusNoteMax, note)
	}
	if !strings.Contains(lines[2], "--wide") {
		t.Errorf("nothing says the note was cut and how to see it whole: %q", lines[2])
	}

	out.Reset()
	printStatus(&out, st, now, 0)
	if !strings.Contains(out.String(), "THE-END") || strings.Contains(out.String(), "--wide") {
		t.Errorf("with --wide the note is not whole, or a cut is reported:\n%s", out.String())
	}
}

// TestStatusRunningOutside: a route asleep while its tenant runs all the same (a unit started by hand:
// running_outside) says so in its state and its note, ahead of older notes.
func TestStatusRunningOutside(t *testing.T) {
	now := time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)
	var out bytes.Buffer
	printStatus(&out, []activator.Status{{Route: "svc", Backing: "unit", State: "asleep", Since: now,
		RunningOutside: "unit app.service is active, started outside the activator", LastError: "an old failure"}}, now, 0)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], "asleep, running outside") ||
		!strings.Contains(lines[1], "unit app.service is active, started outside the activator; an old failure") {
		t.Errorf("the table does not say the tenant runs outside:\n%s", out.String())
	}
	// The backing's warning (tenant.Warner) leads the note, awake or not.
	out.Reset()
	printStatus(&out, []activator.Status{{Route: "node", Backing: "redfish", State: "awake", Since: now,
		Warning: "the BMC rejected the credentials"}}, now, 0)
	if !strings.Contains(out.String(), "the BMC rejected the credentials") {
		t.Errorf("the table does not show the backing's warning:\n%s", out.String())
	}
}

// TestCheckProblemsOnePerMember: a fleet's finding, one per member joined, is listed by check as one
// problem per member (found by an operator trial: "1 problem found", then three lines, the last two
// not indented).
func TestCheckProblemsOnePerMember(t *testing.T) {
	err := errors.Join(
		&activator.MemberCheckError{Member: "b", Err: errors.New(`route "pool.b": redfish: credentials rejected`)},
		&activator.MemberCheckError{Member: "c", Err: errors.New(`route "pool.c": redfish: credentials rejected`)})
	got := routeProblems(err)
	want := []string{`route "pool.b": redfish: credentials rejected`, `route "pool.c": redfish: credentials rejected`}
	if !slices.Equal(got, want) {
		t.Fatalf("routeProblems = %q, want %q", got, want)
	}
	if got := routeProblems(errors.New("one")); !slices.Equal(got, []string{"one"}) {
		t.Fatalf("routeProblems(one) = %q", got)
	}
	if got := routeProblems(nil); got != nil {
		t.Fatalf("routeProblems(nil) = %q", got)
	}
}

// TestStatusNoteOfAWakeSleptSince: a wake's notes say what it found and did, and the NOTE shows them
// while they are the route's latest word: while it wakes, is awake, or when the wake itself left it
// asleep or failed. Once a route has gone to sleep after a wake that woke it, they are history
// (`activator explain`): a fleet's handover showed "the tenant runs on" on a route asleep since (found
// by an operator trial).
func TestStatusNoteOfAWakeSleptSince(t *testing.T) {
	now := time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC)
	handover := &activator.WakeRecord{Trigger: "reload", Result: activator.ResultAdopted, Outcome: activator.OutcomeSucceeded,
		Started: now.Add(-2 * time.Hour), Notes: []string{"the replaced instance handed the tenant over, running"}}
	members := func(ready bool) []activator.MemberStatus {
		return []activator.MemberStatus{{Name: "a", Ready: ready}, {Name: "b", Ready: ready}, {Name: "c", Ready: ready}}
	}
	for _, c := range []struct {
		name      string
		st        activator.Status
		want, not string
	}{
		{"asleep since the handover", activator.Status{State: "asleep", LastWake: handover, Members: members(false), MinReady: 2},
			"fleet 0/3 ready (min_ready 2)", "handed the tenant over"},
		{"awake since the handover", activator.Status{State: "awake", LastWake: handover, Members: members(true), MinReady: 2},
			"handed the tenant over, running; fleet 3/3 ready (min_ready 2)", ""},
		{"asleep by the handover", activator.Status{State: "asleep", LastWake: &activator.WakeRecord{Result: activator.ResultAdoptAsleep,
			Outcome: activator.OutcomeSucceeded, Notes: []string{"the tenant the replaced instance kept running ended before the handover"}}},
			"ended before the handover", ""},
		{"asleep after a failed wake (a reload since)", activator.Status{State: "asleep", LastWake: &activator.WakeRecord{Result: activator.ResultFailed,
			Outcome: activator.OutcomeFailed, Notes: []string{"wake failed: node-1 will be powered off should it come on within 1m0s"}}},
			"will be powered off", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.st.Route, c.st.Backing, c.st.Since = "pool", "redfish", now
			var out bytes.Buffer
			printStatus(&out, []activator.Status{c.st}, now, 0)
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			if len(lines) != 2 {
				t.Fatalf("got %d lines, want a header and a route:\n%s", len(lines), out.String())
			}
			if !strings.Contains(lines[1], c.want) {
				t.Errorf("the line %q does not say %q", lines[1], c.want)
			}
			if c.not != "" && strings.Contains(lines[1], c.not) {
				t.Errorf("the line %q says %q, a note of the wake the route has slept since", lines[1], c.not)
			}
		})
	}
}
