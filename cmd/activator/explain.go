package main

// `activator explain`: a route's recent wakes and sleeps as a timeline, from GET /routes/{name}/wakes.

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/registry"
)

func cmdExplain(args []string) int {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	client := adminFlags(fs)
	last := fs.Int("last", 10, fmt.Sprintf("show the last N wakes and sleeps (the route keeps %d)", activator.HistorySize))
	asJSON := fs.Bool("json", false, "print the raw JSON (oldest first)")
	route, code := routeArg("explain", fs, args)
	if code != 0 {
		return code
	}
	if *last < 1 || *last > activator.HistorySize {
		fmt.Fprintf(os.Stderr, "activator explain: --last must be from 1 to %d (what the route keeps), got %d\n", activator.HistorySize, *last)
		return 2
	}
	c, err := client()
	if err != nil {
		fmt.Fprintln(os.Stderr, "activator explain:", err)
		return 2
	}
	body, code, err := c.call(http.MethodGet, "/routes/"+url.PathEscape(route)+"/wakes?last="+strconv.Itoa(*last), 10*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, "activator explain:", err)
		return 1
	}
	if code != http.StatusOK {
		fmt.Fprintf(os.Stderr, "activator explain %s: %s\n", route, answerError(body, code))
		return 1
	}
	if *asJSON {
		os.Stdout.Write(body)
		return 0
	}
	var evs []activator.Event
	if err := decodeAnswer(body, &evs); err != nil {
		fmt.Fprintln(os.Stderr, "activator explain: bad answer from the admin API:", err)
		return 1
	}
	if len(evs) == 0 {
		fmt.Printf("%s: no wakes or sleeps yet\n", route)
	} else {
		printTimeline(os.Stdout, evs)
	}
	printFiltered(os.Stdout, c, route)
	return 0
}

// printFiltered adds what the route's ignore: filtered since it started (from GET /routes/{name});
// nothing for a route without ignore:, or when the status cannot be read.
func printFiltered(w io.Writer, c *adminClient, route string) {
	body, code, err := c.call(http.MethodGet, "/routes/"+url.PathEscape(route), 10*time.Second)
	if err != nil || code != http.StatusOK {
		return
	}
	var st activator.Status
	if decodeAnswer(body, &st) != nil || st.Filtered == nil {
		return
	}
	fmt.Fprintf(w, "\nfiltered by ignore: since the route started: %d refused (tenant asleep, not woken), %d served (awake, idle clock untouched)\n",
		st.Filtered.Refused, st.Filtered.Served)
}

// routeArg parses fs from args, taking the route before, between or after the flags. A code other
// than 0 is the exit code: the flags were bad, the route is missing or no route can have its name
// (registry.CheckName: checked here, before any request), or more than one argument is left.
func routeArg(verb string, fs *flag.FlagSet, args []string) (string, int) {
	var routes []string
	for rest := args; ; { // flag.Parse stops at the first argument that is not a flag
		if err := fs.Parse(rest); err != nil {
			return "", 2
		}
		if fs.NArg() == 0 {
			break
		}
		routes, rest = append(routes, fs.Arg(0)), fs.Args()[1:]
	}
	switch {
	case len(routes) == 0 || routes[0] == "":
		fmt.Fprintf(os.Stderr, "activator %s: ROUTE is required\n", verb)
		return "", 2
	case len(routes) > 1:
		// Silently acting on the first of two routes left the operator believing both were done.
		fmt.Fprintf(os.Stderr, "activator %s: one ROUTE at a time; unexpected %q\n", verb, routes[1:])
		return "", 2
	}
	if err := registry.CheckName(routes[0]); err != nil {
		// Sent as it was, ../healthz went as /routes/..%2Fhealthz and came back escaped in a 404.
		fmt.Fprintf(os.Stderr, "activator %s: %v\n", verb, err)
		return "", 2
	}
	return routes[0], 0
}

// answerError is the error an admin API answer of code carries, or the code.
func answerError(body []byte, code int) string {
	var e struct{ Error string }
	if decodeAnswer(body, &e) == nil && e.Error != "" {
		return e.Error
	}
	return fmt.Sprintf("admin API answered %d", code)
}

// printTimeline prints events, oldest first, one block each: the time, kind, trigger or reason, result
// and duration; then a wake's phases (start from the wake's start, duration, budget), its notes (a
// sleep's too), the error and the output tail.
func printTimeline(w io.Writer, evs []activator.Event) {
	for i, ev := range evs {
		if i > 0 {
			fmt.Fprintln(w)
		}
		switch {
		case ev.Wake != nil:
			printWake(w, ev.Wake)
		case ev.Sleep != nil:
			printSleep(w, ev.Sleep)
		}
	}
}

func printWake(w io.Writer, r *activator.WakeRecord) {
	result := r.Result
	if r.FailedPhase != "" {
		result += " in " + r.FailedPhase
	}
	fmt.Fprintf(w, "%s  wake  trigger %s  result %s  %s", stamp(r.Started), r.Trigger, result, short(r.Duration))
	if r.Budget > 0 {
		fmt.Fprintf(w, "  (budget %s)", r.Budget)
	}
	fmt.Fprintf(w, "  wake_id %s\n", r.ID)
	printWakeBody(w, r, "  ")
}

// printWakeBody prints what a wake record holds below its headline, each line after indent: the
// outcome and culprit, the requirements' wakes as a tree, the fleet's members, the phases, the herd,
// the notes and the failure.
func printWakeBody(w io.Writer, r *activator.WakeRecord, indent string) {
	if r.Outcome != "" && (r.Outcome != activator.OutcomeSucceeded || len(r.Requires)+len(r.Members) > 0) {
		line := "outcome " + r.Outcome
		switch {
		case r.Culprit != nil:
			line += "  culprit " + r.Culprit.String()
		case r.CancelledBy != "":
			line += "  by " + r.CancelledBy
		}
		fmt.Fprintf(w, "%s%s\n", indent, line)
	}
	for _, q := range r.Requires {
		printRequired(w, q, indent)
	}
	for _, m := range r.Members {
		printMember(w, m, indent)
	}
	for _, p := range r.Phases {
		fmt.Fprintln(w, indent+strings.TrimPrefix(phaseLine(p), "  "))
	}
	if r.Joined > 0 || r.Released > 1 { // a herd: how long letting it go took
		fmt.Fprintf(w, "%sjoined %d, released %d in %s\n", indent, r.Joined, r.Released, short(r.ReleaseSpread))
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "%snote: %s\n", indent, n)
	}
	printFailureAt(w, indent, r.Error, r.OutputTail)
}

// printRequired prints one requirement's part in a wake: its own wake, nested, or that it was awake.
func printRequired(w io.Writer, q activator.RequiredWake, indent string) {
	if q.Wake == nil {
		fmt.Fprintf(w, "%srequires %s: %s\n", indent, q.Instance, q.State)
		return
	}
	r := q.Wake
	result := r.Result
	if r.FailedPhase != "" {
		result += " in " + r.FailedPhase
	}
	fmt.Fprintf(w, "%srequires %s: %s, result %s  %s  wake_id %s\n", indent, q.Instance, q.State, result, short(r.Duration), r.ID)
	printWakeBody(w, r, indent+"  ")
}

// printMember prints one fleet member's row and its phases.
func printMember(w io.Writer, m activator.MemberRecord, indent string) {
	line := fmt.Sprintf("%smember %s (%s): %s", indent, m.Name, m.Upstream, m.Status)
	if m.Class != "" {
		line += ", " + m.Class
	}
	if m.Phase != "" && m.Status != "up" {
		line += " in " + m.Phase
	}
	if m.CancelledBy != "" {
		line += ", cancelled because " + m.CancelledBy + " failed"
	}
	fmt.Fprintln(w, line)
	for _, p := range m.Phases {
		fmt.Fprintln(w, indent+"  "+strings.TrimPrefix(phaseLine(p), "  "))
	}
	for _, n := range m.Notes {
		fmt.Fprintf(w, "%s  note: %s\n", indent, n)
	}
	printFailureAt(w, indent+"  ", m.Error, "")
}

func printSleep(w io.Writer, r *activator.SleepRecord) {
	result := r.Result
	if r.Forced {
		result += ", forced" // the notes below say what was forced
	}
	fmt.Fprintf(w, "%s  sleep  reason %s  result %s  %s\n", stamp(r.Started), r.Reason, result, short(r.Duration))
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
	printFailure(w, r.Error, r.OutputTail)
}

// printFailure prints an event's error without the output tail it quotes, then the tail, indented.
func printFailure(w io.Writer, msg, tail string) { printFailureAt(w, "  ", msg, tail) }

func printFailureAt(w io.Writer, indent, msg, tail string) {
	if msg == "" {
		return
	}
	if tail != "" {
		msg = strings.Replace(msg, ": "+tail, "", 1)
	}
	fmt.Fprintf(w, "%serror: %s\n", indent, msg)
	if tail != "" {
		fmt.Fprintf(w, "%soutput:\n", indent)
		for l := range strings.Lines(tail) {
			fmt.Fprintf(w, "%s  %s\n", indent, strings.TrimRight(l, "\n"))
		}
	}
}

// phaseLine is one phase as explain and wake print it: "  +120ms   health   35ms  (budget 20s)".
func phaseLine(p activator.PhaseRecord) string {
	s := fmt.Sprintf("  %-9s %-13s %s", "+"+short(p.Start), p.Name, short(p.Duration))
	if p.Budget > 0 {
		s += fmt.Sprintf("  (budget %s)", p.Budget)
	}
	return s
}

func stamp(t time.Time) string { return t.Local().Format("2006-01-02 15:04:05.000") }

// short rounds d for reading: to the millisecond from 10ms on, else to 10µs.
func short(d time.Duration) string {
	if d >= 10*time.Millisecond {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(10 * time.Microsecond).String()
}
